"""Adapters that let the suite check kernels written for other layouts or argument names.

The suite calls a kernel the spec's way (SDPA-1.1): ``fn(q, k, v, *, mask=None,
is_causal=False, scale=None)`` with ``q (..., Hq, Lq, E)``, ``k (..., Hkv, Lk, E)``,
``v (..., Hkv, Lk, Ev)``.  JAX, Keras, Flax and FlashAttention put the sequence axis
before the heads, ``(..., L, H, E)`` ("blhd"; FlashAttention calls it ``(B, S, H, D)``,
JAX ``(B, T, N, H)``).  Rather than rewrite such a kernel, wrap it::

    from attnspec.conformance.call.layouts import from_blhd, pad_head_dims, rename_arguments
    spec_kernel = from_blhd(pad_head_dims(jax.nn.dot_product_attention), gqa=True)
    flash = from_blhd(rename_arguments(flash_attn_func, is_causal="causal",
                                       scale="softmax_scale"))

JAX (and FlashAttention 2) also need ``E == Ev``; :func:`pad_head_dims` lifts that by
exact zero padding (and an exact power-of-two rescaling of q that keeps the kernel's own
default scale right).  The wrappers work on any Array API library (they transpose with the
namespace of the inputs) and carry a declaration: the wrapped kernel's own (attached,
known or read off its signature), updated by the claims given.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import array_api_compat
import numpy as np

from ...backends import Backend
from ...reference._checks import check_choice, namespace_of, require_ndim_at_least
from ..claims.declaration import ATTRIBUTE, declaration_of, infer_declaration, known_declaration

LAYOUTS = ("bhld", "blhd", "packed")
# the recurrences' keywords (REC-1.1, REC-2.2, REC-3.3) besides the dense ones
RECURRENT_KEYWORDS = ("g", "beta", "initial_state", "cu_seqlens", "chunk_size")
SPEC_KEYWORDS = ("mask", "bias", "is_causal", "scale", *RECURRENT_KEYWORDS)
CACHE_KEYWORDS = ("k", "v")  # arrays passed by keyword that are laid out like q, k, v
# a recurrence's per-token gate and beta: (..., H, T) or, a gate per key channel, (..., H, T, dk)
TOKEN_KEYWORDS = ("g", "beta")
PACKED_HEAD_COUNTS = ("q_num_heads", "kv_num_heads")  # ONNX's attributes, as keywords


def _swap_heads_and_length(xp: Any, x: Any) -> Any:
    n = x.ndim
    return xp.permute_dims(x, (*range(n - 3), n - 2, n - 3, n - 1))


def _tokens_first(xp: Any, x: Any, q_ndim: int) -> Any:
    """A per-token keyword (TOKEN_KEYWORDS) with its tokens before its heads: ``(..., H, T)``
    -> ``(..., T, H)``, ``(..., H, T, dk)`` -> ``(..., T, H, dk)``."""
    if x.ndim == q_ndim - 1:
        return xp.permute_dims(x, (*range(x.ndim - 2), x.ndim - 1, x.ndim - 2))
    return _swap_heads_and_length(xp, x)


def _packed_heads(xp: Any, x: Any) -> Any:
    """``(..., H, L, d)`` -> ``(..., L, H * d)``: ONNX's 3-D inputs."""
    swapped = _swap_heads_and_length(xp, x)
    return xp.reshape(swapped, (*swapped.shape[:-2], swapped.shape[-2] * swapped.shape[-1]))


def _unpacked_heads(xp: Any, x: Any, width: int, heads: int) -> Any:
    """``(..., L, H * width)`` -> ``(..., H, L, width)`` (``heads`` where ``width`` is 0)."""
    heads = x.shape[-1] // width if width else heads
    return _swap_heads_and_length(xp, xp.reshape(x, (*x.shape[:-1], heads, width)))


def _describe(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


# What a layout wrapper does on each call: (xp, q, k, v, args, kwargs) -> the result.
Relayout = Callable[[Any, Any, Any, Any, tuple[Any, ...], dict[str, Any]], Any]


def _relaid(
    fn: Callable[..., Any], wrapper: str, claims: dict[str, Any], relayout: Relayout
) -> Callable[..., Any]:
    """``fn`` behind ``relayout``, named ``wrapper(fn)`` (so a report never presents the
    wrapper as the raw kernel) and declared as ``fn`` updated by ``claims``."""
    declaration = declaration_of(fn, **claims)
    call = f"{wrapper}({_describe(fn)})(q, k, v)"

    @functools.wraps(fn)
    def spec_layout(q: Any, k: Any, v: Any, /, *args: Any, **kwargs: Any) -> Any:
        xp = namespace_of(call, q=q, k=k, v=v)
        require_ndim_at_least(call, "SDPA-1.1", 3, "(..., H, L, E)", q=q, k=k, v=v)
        return relayout(xp, q, k, v, args, kwargs)

    spec_layout.__name__ = f"{wrapper}({getattr(fn, '__name__', 'kernel')})"
    spec_layout.__qualname__ = f"{wrapper}({_describe(fn)})"
    setattr(spec_layout, ATTRIBUTE, declaration)
    return spec_layout


def _first_result(result: Any, relaid: Callable[[Any], Any]) -> Any:
    """``result`` with its output (``result`` itself, or its first element) relaid; the
    rest of a tuple (weights, a final state) is already in the spec's layout."""
    if isinstance(result, (tuple, list)):
        return (relaid(result[0]), *result[1:])
    return relaid(result)


def from_blhd(fn: Callable[..., Any], /, **claims: Any) -> Callable[..., Any]:
    """Wrap a kernel taking and returning ``(..., L, H, E)`` arrays into the spec's layout.

    The wrapper transposes q, k and v to ``(..., L, H, E)``, calls ``fn`` with every
    other argument unchanged, and transposes the output back to ``(..., Hq, Lq, Ev)``.
    Masks and biases keep the spec's ``(..., H, Lq, Lk)`` layout (the one JAX uses too);
    when ``fn`` returns a tuple ``(out, weights, ...)`` only ``out`` is transposed.  A
    recurrence's gate and beta become ``(..., T, H)`` (``(..., T, H, dk)`` per key
    channel), as flash-linear-attention takes them.  ``claims`` update the wrapped
    kernel's declaration (e.g. ``gqa=True``).
    """

    def relayout(xp: Any, q: Any, k: Any, v: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
        # a KV-cache call's new keys and values (KVCACHE-1) follow the layout too
        kwargs = {
            name: _swap_heads_and_length(xp, a) if name in CACHE_KEYWORDS else a
            for name, a in kwargs.items()
        }
        for name in TOKEN_KEYWORDS:
            if kwargs.get(name) is not None:
                kwargs[name] = _tokens_first(xp, kwargs[name], q.ndim)
        result = fn(*(_swap_heads_and_length(xp, a) for a in (q, k, v)), *args, **kwargs)
        return _first_result(result, lambda out: _swap_heads_and_length(xp, out))

    return _relaid(fn, "from_blhd", claims, relayout)


def from_packed(fn: Callable[..., Any], /, **claims: Any) -> Callable[..., Any]:
    """Wrap a kernel taking ONNX's 3-D inputs into the spec's layout: q, k and v as
    ``(..., L, H * E)`` with the head counts as keywords ``q_num_heads`` and
    ``kv_num_heads`` (the attributes of ONNX's ``Attention`` and ``LinearAttention``), a
    recurrence's per-head gate and beta as ``(..., T, H)`` and a per-key-channel gate as
    ``(..., T, H * dk)``; the output ``(..., L, Ho * Ev)`` is unpacked (Ho from its width),
    anything else it returns (a final state, weights) is passed back as it is.
    """

    def relayout(xp: Any, q: Any, k: Any, v: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
        for name in TOKEN_KEYWORDS:
            a = kwargs.get(name)
            if a is not None:
                laid = _tokens_first(xp, a, q.ndim)
                kwargs[name] = (
                    laid
                    if a.ndim < q.ndim
                    else xp.reshape(laid, (*laid.shape[:-2], laid.shape[-2] * laid.shape[-1]))
                )
        kwargs.update(zip(PACKED_HEAD_COUNTS, (q.shape[-3], k.shape[-3]), strict=True))
        result = fn(*(_packed_heads(xp, a) for a in (q, k, v)), *args, **kwargs)
        return _first_result(result, lambda out: _unpacked_heads(xp, out, v.shape[-1], q.shape[-3]))

    spec_layout = _relaid(fn, "from_packed", claims, relayout)
    try:  # the signature the suite binds: without the head counts the wrapper passes
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return spec_layout
    kept = [p for n, p in signature.parameters.items() if n not in PACKED_HEAD_COUNTS]
    spec_layout.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    return spec_layout


def from_layout(fn: Callable[..., Any], layout: str, /, **claims: Any) -> Callable[..., Any]:
    """``fn`` adapted from ``layout`` ("bhld": the spec's own, "blhd": see :func:`from_blhd`,
    "packed": see :func:`from_packed`).

    With "bhld" and no claims, ``fn`` itself is returned.
    """
    check_choice("layout", layout, LAYOUTS, "from_layout(fn, layout)", "SDPA-1.1")
    if layout == "blhd":
        return from_blhd(fn, **claims)
    if layout == "packed":
        return from_packed(fn, **claims)
    if not claims:
        return fn

    @functools.wraps(fn)
    def declared(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    setattr(declared, ATTRIBUTE, declaration_of(fn, **claims))
    return declared


def padding_plan(head_dim: int, value_dim: int, scale_given: bool) -> tuple[int, int]:
    """(width, q_factor) for :func:`pad_head_dims`: the head dim q, k and v get, and the
    power of two q is multiplied by.

    * ``E == Ev`` or ``E == 0``: nothing changes, ``(E, 1)``.
    * ``Ev < E``: v gets zero columns up to ``E``.
    * ``Ev > E`` with an explicit scale: q and k get zero columns up to ``Ev`` (zeros add
      exact zeros to every score; an explicit scale does not depend on the width).
    * ``Ev > E`` without a scale: the kernel's default scale would be ``1/sqrt(width)``, not
      ``1/sqrt(E)``.  The width is ``P = E * 4**n >= Ev`` and q is multiplied by ``2**n``:
      ``(2**n q) . k / sqrt(P) = q . k / sqrt(E)``, and multiplying by a power of two is
      exact, so the kernel computes the scores it would for ``E``, with its own default
      scale and without being passed a ``scale`` it may not take.
    """
    if head_dim == 0 or value_dim <= head_dim:
        return max(head_dim, value_dim), 1
    if scale_given:
        return value_dim, 1
    doublings = 0
    while head_dim * 4**doublings < value_dim:
        doublings += 1
    return head_dim * 4**doublings, 2**doublings


def describe_padding(head_dim: int, value_dim: int, scale_given: bool) -> str:
    """What :func:`pad_head_dims` passes the kernel, for the "inputs:" line ("" if nothing)."""
    width, factor = padding_plan(head_dim, value_dim, scale_given)
    if width == head_dim == value_dim or head_dim == 0:
        return ""
    padded = "v" if value_dim < head_dim else ("q, k" if width == value_dim else "q, k, v")
    text = f"equal_head_dims: the kernel got {padded} zero-padded to {width} columns"
    if factor != 1:
        text += (
            f" and q times {factor}, so its default scale 1/sqrt({width}) gives 1/sqrt({head_dim})"
        )
    return text + f"; its output cut to Ev={value_dim}"


def pad_head_dims(fn: Callable[..., Any], /, **claims: Any) -> Callable[..., Any]:
    """Wrap a kernel that needs ``E == Ev`` (JAX's ``dot_product_attention``, FlashAttention 2)
    so it accepts any ``E`` and ``Ev`` (SDPA-1.1), by exact zero padding (see
    :func:`padding_plan`); the output's extra columns (exactly 0: sums of weights times 0)
    are cut off.  The wrapper never passes a keyword the caller did not, so a kernel without
    a ``scale`` parameter works too.  Works on spec-layout arrays and BLHD ones alike (only
    the last axis is touched).
    """
    return _padded(fn, None, claims)


def pad_head_dims_on_host(
    fn: Callable[..., Any], backend: Backend, /, **claims: Any
) -> Callable[..., Any]:
    """:func:`pad_head_dims` with the padding, the power-of-two factor and the output's cut
    done on host copies (:meth:`Backend.on_host`): the kernel gets the same arrays, but no
    device operation runs, which on a backend that compiles per shape (JAX) would compile
    once more for every shape the suite pads (KernelUnderTest pads so on such a backend)."""
    return _padded(fn, backend, claims)


def _padded(
    fn: Callable[..., Any], host: Backend | None, claims: dict[str, Any]
) -> Callable[..., Any]:
    """``fn`` padded as :func:`pad_head_dims` says, on the host of ``host`` if given."""
    declaration = declaration_of(fn, **claims)
    call = f"pad_head_dims({_describe(fn)})(q, k, v)"

    def on_host(a: Any, op: Callable[[np.ndarray], np.ndarray]) -> Any | None:
        # None: done on the device (no host backend, or not a floating array it has)
        if host is None or not host.is_array(a) or host.dtype_name(a) is None:
            return None
        return host.on_host(a, op)

    def zero_columns(xp: Any, a: Any, width: int) -> Any:
        if a.shape[-1] == width:
            return a
        missing = (*a.shape[:-1], width - a.shape[-1])
        padded = on_host(a, lambda h: np.concatenate([h, np.zeros(missing, h.dtype)], axis=-1))
        if padded is not None:
            return padded
        zeros = xp.zeros(missing, dtype=a.dtype, device=array_api_compat.device(a))
        return xp.concat([a, zeros], axis=-1)

    def overflows(xp: Any, q: Any, scaled: Any) -> bool:
        if host is not None and host.is_array(q):
            before, after = host.to_numpy(q), host.to_numpy(scaled)
            return bool(np.any(np.isinf(after) & ~np.isinf(before)))
        return bool(xp.any(xp.isinf(scaled) & ~xp.isinf(q)))

    def first_columns(result: Any, n: int) -> Any:
        cut = on_host(result, lambda h: h[..., :n])
        return result[..., :n] if cut is None else cut

    @functools.wraps(fn)
    def padded(q: Any, k: Any, v: Any, /, *args: Any, **kwargs: Any) -> Any:
        xp = namespace_of(call, q=q, k=k, v=v)
        head_dim, value_dim = q.shape[-1], v.shape[-1]
        width, factor = padding_plan(head_dim, value_dim, kwargs.get("scale") is not None)
        if width == head_dim == value_dim or head_dim == 0:  # E = 0 is the kernel's to reject
            return fn(q, k, v, *args, **kwargs)
        if factor != 1:
            scaled = on_host(q, lambda h: h * factor)
            scaled = q * factor if scaled is None else scaled
            if overflows(xp, q, scaled):
                raise ValueError(
                    f"q times {factor} overflows {q.dtype}, so the padding to {width} columns "
                    f"cannot keep the default scale 1/sqrt({head_dim}) exact [{call}]"
                )
            q = scaled
        result = fn(
            zero_columns(xp, q, width),
            zero_columns(xp, k, width),
            zero_columns(xp, v, width),
            *args,
            **kwargs,
        )
        if isinstance(result, (tuple, list)):  # (out, weights, ...): weights need no cut
            return (first_columns(result[0], value_dim), *result[1:])
        return first_columns(result, value_dim)

    padded.__name__ = f"pad_head_dims({getattr(fn, '__name__', 'kernel')})"
    padded.__qualname__ = f"pad_head_dims({_describe(fn)})"
    setattr(padded, ATTRIBUTE, declaration)
    return padded


def _renamed_signature(
    fn: Callable[..., Any], kernel_names: dict[str, str]
) -> inspect.Signature | None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins may have no signature: nothing to rename or check
    parameters = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for spec_name, kernel_name in kernel_names.items():
        if kernel_name not in parameters and not takes_any:
            raise ValueError(
                f"{spec_name}={kernel_name!r}, but {_describe(fn)} has no parameter "
                f"{kernel_name!r}; it takes {', '.join(parameters)} "
                f"[rename_arguments(fn, {spec_name}=...)]"
            )
    to_spec = {kernel: spec for spec, kernel in kernel_names.items()}
    try:
        return signature.replace(
            parameters=[p.replace(name=to_spec.get(p.name, p.name)) for p in parameters.values()]
        )
    except ValueError as exc:
        raise ValueError(
            f"renaming {kernel_names} gives {_describe(fn)} two parameters of one name ({exc}) "
            f"[rename_arguments(fn, ...)]"
        ) from None


def rename_arguments(fn: Callable[..., Any], /, **kernel_names: str) -> Callable[..., Any]:
    """Wrap ``fn`` so the suite's keywords reach it under the kernel's own names.

    Keys are the spec's keywords (``mask``, ``bias``, ``is_causal``, ``scale``), values
    the kernel's, e.g. ``rename_arguments(flash_attn_func, is_causal="causal",
    scale="softmax_scale")``.  The wrapper's signature shows the spec's names, so the
    declaration is read off it as for any kernel (an attached or known declaration of
    ``fn`` is kept, with its keywords renamed).
    """
    call = "rename_arguments(fn, ...)"
    for spec_name, kernel_name in kernel_names.items():
        check_choice("keyword", spec_name, SPEC_KEYWORDS, call, "SDPA-1.1")
        if not isinstance(kernel_name, str) or not kernel_name.isidentifier():
            raise TypeError(
                f"{spec_name}={kernel_name!r}, but should be the kernel's parameter name "
                f"(a str) [{call}]"
            )
    signature = _renamed_signature(fn, kernel_names)

    @functools.wraps(fn)
    def renamed(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{kernel_names.get(name, name): value for name, value in kwargs.items()})

    del renamed.__wrapped__  # the signature is the renamed one below, not fn's
    renamed.__name__ = f"rename_arguments({getattr(fn, '__name__', 'kernel')})"
    renamed.__qualname__ = f"rename_arguments({_describe(fn)})"
    if signature is not None:
        renamed.__signature__ = signature  # type: ignore[attr-defined]
    declaration = getattr(fn, ATTRIBUTE, None) or known_declaration(fn)
    if declaration is None:
        declaration = infer_declaration(renamed)
    else:
        # A declared keyword that was renamed is now reached by its spec name.
        to_spec = {kernel: spec for spec, kernel in kernel_names.items()}
        declaration = declaration_of(
            fn,
            mask_keyword=to_spec.get(declaration.mask_keyword, declaration.mask_keyword),
            bias_keyword=to_spec.get(declaration.bias_keyword, declaration.bias_keyword),
        )
    setattr(renamed, ATTRIBUTE, declaration)
    return renamed
