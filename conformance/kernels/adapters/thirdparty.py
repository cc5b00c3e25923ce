"""Third-party PyTorch kernels in the spec's convention: local-attention (a sparse sliding
window), performer-pytorch (FAVOR+), pytorch-fast-transformers (elu + 1), and the GPU
kernels flash-attn and xformers (checked only where CUDA is).

Each adapter builds the library's module with its default scale (1/sqrt(E)) and calls it
on spec-layout arrays; the declaration says which family of properties applies.
"""

from __future__ import annotations

from typing import Any

from ...call.layouts import from_blhd
from ...claims.declaration import declare
from ...claims.family_claims import LinearClaim, SparseClaim
from .flash_attn3 import HALF_DTYPES, flash_attention_row

LOCAL_WINDOW = 4
PERFORMER_FEATURES = 64


def _local_attention(q: Any, k: Any, v: Any) -> Any:
    from local_attention import LocalAttention

    # causal + exact_windowsize: key j is seen by query i iff 0 <= i - j <= window_size
    # (look_backward=1 window); autopad lets any length through
    layer = LocalAttention(
        window_size=LOCAL_WINDOW, causal=True, look_backward=1, exact_windowsize=True, autopad=True
    )
    return layer(q, k, v)


local_attention = declare(
    _local_attention,
    scale=False,
    causal=False,
    mask=False,
    batch_ndim=1,
    equal_lengths=True,
    sparse=SparseClaim("sliding_window", {"left": LOCAL_WINDOW, "right": 0}, causal=True),
)
local_attention.__name__ = local_attention.__qualname__ = "local_attention"


def _performer(q: Any, k: Any, v: Any, seed: int = 0) -> Any:
    import torch
    from performer_pytorch import FastAttention

    # the projection is drawn when the module is built: building it under the seed is
    # the redraw (one draw per seed), as performer's redraw_projection_matrix does
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = FastAttention(dim_heads=q.shape[-1], nb_features=PERFORMER_FEATURES)
    return layer.to(q.device, q.dtype)(q, k, v)


performer_favor = declare(
    _performer,
    scale=False,
    causal=False,
    mask=False,
    batch_ndim=1,
    empty_sizes=False,
    linear=LinearClaim("favor+", num_features=PERFORMER_FEATURES, seed_keyword="seed"),
)
performer_favor.__name__ = performer_favor.__qualname__ = "performer_favor"


def _fast_transformers(q: Any, k: Any, v: Any) -> Any:
    from fast_transformers.attention import LinearAttention
    from fast_transformers.masking import FullMask, LengthMask

    # fast-transformers takes (N, L, H, E) and masks objects; no mask here
    n, _, lq, _ = q.shape
    lk = k.shape[-2]
    layer = LinearAttention(q.shape[-1])
    out = layer(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        FullMask(lq, lk),
        LengthMask(q.new_full((n,), lq, dtype=int)),
        LengthMask(q.new_full((n,), lk, dtype=int)),
    )
    return out.transpose(1, 2)


fast_transformers_linear = declare(
    _fast_transformers,
    scale=False,
    causal=False,
    mask=False,
    batch_ndim=1,
    linear=LinearClaim("elu+1", eps=1e-6),
)
fast_transformers_linear.__name__ = fast_transformers_linear.__qualname__ = (
    "fast_transformers_linear"
)


def _flash(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    from flash_attn import flash_attn_func

    return flash_attn_func(q, k, v, **kwargs)


flash_attn_func = flash_attention_row(_flash, dtypes=HALF_DTYPES)
flash_attn_func.__name__ = flash_attn_func.__qualname__ = "flash_attn_func"


def _xformers(q: Any, k: Any, v: Any, bias: Any = None, scale: float | None = None) -> Any:
    from xformers.ops import memory_efficient_attention

    return memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)


xformers_memory_efficient = from_blhd(
    declare(_xformers, mask=False, causal=False, bias=True, batch_ndim=1)
)
xformers_memory_efficient.__name__ = xformers_memory_efficient.__qualname__ = (
    "xformers_memory_efficient"
)
