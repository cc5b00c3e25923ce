"""PyTorch's ``scaled_dot_product_attention`` pinned to one of its backends.

``torch.nn.functional.scaled_dot_product_attention`` dispatches between backends (on the
CPU: a FlashAttention-style kernel and the "math" composite) by input; checking it as is
tests whichever backend each input reaches.  These wrappers pin one backend so each can
be checked on its own:

    attnspec check attnspec.conformance.kernels.torch_sdpa:sdpa_math --backend torch
    attnspec check attnspec.conformance.kernels.torch_sdpa:sdpa_flash --backend torch

The flash backend accepts only 4-d inputs with E == Ev, so ``sdpa_flash`` flattens the batch
dims into one and pads head dims (``layouts.pad_head_dims``, with the scale 1/sqrt(E) passed
where E < Ev: :func:`scale_for_padding`): exact reshapes and zero columns, so the numbers
tested are the kernel's own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from ..call.layouts import pad_head_dims
from ..claims.declaration import declare, torch_sdpa_declaration


def _sdpa_with_backend(backend: str, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, backend)):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


def sdpa_on(
    backend: str,
    name: str,
    module: str = __name__,
    claims: dict[str, Any] | None = None,
    doc: str = "",
) -> Callable[..., Any]:
    """PyTorch SDPA pinned to ``SDPBackend.<backend>``, with torch's own signature, declared
    with ``claims`` (default: what torch documents, ``torch_sdpa_declaration``), named
    ``module.name`` (where it is defined, so that it loads and pickles by that name)."""

    def kernel(
        q: Any,
        k: Any,
        v: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        return _sdpa_with_backend(
            backend,
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__module__ = module
    kernel.__doc__ = doc or f"PyTorch SDPA restricted to its {backend} backend."
    return declare(kernel, **(torch_sdpa_declaration() if claims is None else claims))


sdpa_math = sdpa_on("MATH", "sdpa_math")


def one_batch_dim(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` (torch's signature, 4-d inputs only) for any number of batch dims: q, k, v
    and the mask broadcast and flattened into one batch dim, the output's restored (exact
    reshapes)."""

    @functools.wraps(kernel)
    def flattened(q: Any, k: Any, v: Any, /, attn_mask: Any = None, **options: Any) -> Any:
        import torch

        batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])

        def flat(x: Any, tail: tuple[int, ...]) -> Any:
            return x.expand(*batch, *tail).reshape(math.prod(batch), *tail)

        n_heads, n_queries, n_keys = q.shape[-3], q.shape[-2], k.shape[-2]
        mask = None if attn_mask is None else flat(attn_mask, (n_heads, n_queries, n_keys))
        out = kernel(
            flat(q, tuple(q.shape[-3:])),
            flat(k, tuple(k.shape[-3:])),
            flat(v, tuple(v.shape[-3:])),
            attn_mask=mask,
            **options,
        )
        return out.reshape(*batch, *out.shape[-3:])

    return flattened


def scale_for_padding(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` (padded by :func:`pad_head_dims`) given ``scale=1/sqrt(E)`` when the
    caller passes none and ``Ev > E``: the padding then adds zero columns to q and k up to
    Ev and leaves q as it is.  Without a scale it multiplies q by a power of two for the
    kernel's default scale at a wider head dim (4**n E), which carries q . k up to 2**n
    times past what the caller's inputs reach: a masked key whose score is within SDPA-8.1's
    precondition then overflowed to inf in the flash kernel, and inf - inf gave NaN rows
    (docs/divergences.md#torch-masked-overflow, measured 2026-12-06)."""

    @functools.wraps(kernel)
    def scaled(q: Any, k: Any, v: Any, /, *args: Any, **options: Any) -> Any:
        if options.get("scale") is None and v.shape[-1] > q.shape[-1] > 0:
            options["scale"] = 1 / math.sqrt(q.shape[-1])
        return kernel(q, k, v, *args, **options)

    return scaled


sdpa_flash = scale_for_padding(
    pad_head_dims(one_batch_dim(sdpa_on("FLASH_ATTENTION", "sdpa_flash")))
)
sdpa_flash.__doc__ = "PyTorch SDPA restricted to its flash backend (any batch dims, E and Ev)."
sdpa_flash.__qualname__ = sdpa_flash.__name__ = "sdpa_flash"
