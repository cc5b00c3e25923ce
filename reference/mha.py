"""Multi-head attention (MHA-1) and cross-attention (MHA-2) on top of the dense reference.

The attention itself is :func:`scaled_dot_product_attention`; this module only adds the
projections, the head split and the concatenation that MHA-1 defines around it.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

from ._array import Array
from ._checks import (
    check_size,
    namespace_of,
    require_broadcastable_to,
    require_ndim_at_least,
    require_real_floating,
)
from .attention import scaled_dot_product_attention
from .options import DenseOptions, filled, shows_options
from .sdpa import compute_dtype

if TYPE_CHECKING:
    from typing import Unpack

CALL = "multi_head_attention(x, y, ...)"


def _head_width(name: str, w: Any, rows: int, rows_are: str, heads: int, cols_are: str) -> int:
    """Check ``w`` is ``(rows, heads * width)`` with width >= 1 and return the width."""
    if w.ndim != 2 or w.shape[0] != rows or w.shape[1] % heads or w.shape[1] == 0:
        raise ValueError(
            f"{name}.shape={tuple(w.shape)}, but should be ({rows}, {cols_are}) with "
            f"{rows} = {rows_are} and the columns a positive multiple of {heads} heads "
            f"[MHA-1, {CALL}]"
        )
    return int(w.shape[1]) // heads


def _split_heads(xp: ModuleType, a: Any, heads: int) -> Any:
    """``(..., L, heads * width) -> (..., heads, L, width)``; head h = columns h*w:(h+1)*w."""
    *lead, length, columns = a.shape
    a = xp.reshape(a, (*lead, length, heads, columns // heads))
    n = len(lead)
    return xp.permute_dims(a, (*range(n), n + 1, n, n + 2))


def _merge_heads(xp: ModuleType, a: Any) -> Any:
    """``(..., heads, L, width) -> (..., L, heads * width)``: the heads side by side."""
    *lead, heads, length, width = a.shape
    n = len(lead)
    a = xp.permute_dims(a, (*range(n), n + 1, n, n + 2))
    return xp.reshape(a, (*lead, length, heads * width))


class _Weights(TypedDict):
    """The projections W_Q, W_K, W_V, W_O of MHA-1 (required)."""

    w_q: Array
    w_k: Array
    w_v: Array
    w_o: Array


class _Biases(TypedDict, total=False):
    """Their biases (None: no bias)."""

    b_q: Array
    b_k: Array
    b_v: Array
    b_o: Array


class _NumHeads(TypedDict):
    num_heads: int


class _Heads(_NumHeads, total=False):
    num_kv_heads: int | None


class MhaOptions(_Weights, _Biases, _Heads, DenseOptions, total=False):
    """``multi_head_attention``'s keywords: the weights and num_heads are required."""

    return_weights: bool


@shows_options(MhaOptions)
def multi_head_attention(x: Array, y: Array = None, **given: Unpack[MhaOptions]) -> Any:
    """Multi-head attention of Vaswani et al. 2017, with grouped key/value heads.

    ``x (..., Lq, d_model)`` gives the queries and ``y (..., Lk, d_kv)`` (default ``x``:
    self-attention; otherwise cross-attention, MHA-2) the keys and values:
    ``Q = x W_Q + b_Q``, ``K = y W_K + b_K``, ``V = y W_V + b_V``, with
    ``W_Q (d_model, Hq*E)``, ``W_K (d_kv, Hkv*E)``, ``W_V (d_kv, Hkv*Ev)``,
    ``W_O (Hq*Ev, d_out)``; head h takes columns ``h*E:(h+1)*E``; each head is attended
    by the reference SDPA (mask, bias, causal and scale as there, shaped against
    ``(..., Hq, Lq, Lk)``); the heads are concatenated and multiplied by ``W_O`` (+ b_O).
    ``num_kv_heads`` defaults to ``num_heads``.  Returns ``(..., Lq, d_out)`` in x's
    dtype, and with ``return_weights=True`` also the weights ``(..., Hq, Lq, Lk)``.
    Half precision is computed in float32 throughout (SDPA-7.2).
    """
    y = x if y is None else y
    options = filled(MhaOptions, given)
    weights: dict[str, Array] = {**filled(_Weights, options)}
    biases: dict[str, Array] = {**filled(_Biases, options)}
    w_q, w_k, w_v, w_o = weights.values()
    b_q, b_k, b_v, b_o = biases.values()
    xp = namespace_of(
        CALL, x=x, y=y, **weights, **biases, mask=options["mask"], bias=options["bias"]
    )
    operands = {"x": x, "y": y, **weights, **{n: b for n, b in biases.items() if b is not None}}
    require_real_floating(xp, CALL, "MHA-1", **operands)
    if any(a.dtype != x.dtype for a in operands.values()):
        described = ", ".join(f"{n}.dtype={a.dtype}" for n, a in operands.items())
        raise TypeError(f"{described}, but should all be the same [MHA-1, {CALL}]")
    require_ndim_at_least(CALL, "MHA-1", 2, "(..., length, features)", x=x, y=y)
    num_heads = check_size("num_heads", options["num_heads"], CALL, minimum=1)
    num_kv_heads = options["num_kv_heads"]
    if num_kv_heads is None:
        num_kv_heads = num_heads
    num_kv_heads = check_size("num_kv_heads", num_kv_heads, CALL, minimum=1)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads={num_heads}, num_kv_heads={num_kv_heads}, but num_heads should be a "
            f"whole multiple of num_kv_heads [SDPA-6.2, {CALL}]"
        )

    d_model, d_kv = x.shape[-1], y.shape[-1]
    head_dim = _head_width("w_q", w_q, d_model, "x.shape[-1]", num_heads, "num_heads * E")
    _head_width("w_k", w_k, d_kv, "y.shape[-1]", num_kv_heads, "num_kv_heads * E")
    if w_k.shape[1] != num_kv_heads * head_dim:
        raise ValueError(
            f"w_k.shape={tuple(w_k.shape)}, but should be ({d_kv}, {num_kv_heads * head_dim}): "
            f"keys have the queries' head dim E={head_dim} [MHA-1, {CALL}]"
        )
    value_dim = _head_width("w_v", w_v, d_kv, "y.shape[-1]", num_kv_heads, "num_kv_heads * Ev")
    if w_o.ndim != 2 or w_o.shape[0] != num_heads * value_dim:
        raise ValueError(
            f"w_o.shape={tuple(w_o.shape)}, but should be ({num_heads * value_dim}, d_out): "
            f"{num_heads} heads of Ev={value_dim} values [MHA-1, {CALL}]"
        )
    for w, (b_name, b) in zip(weights.values(), biases.items(), strict=True):
        if b is not None:
            require_broadcastable_to(b_name, tuple(b.shape), (w.shape[1],), CALL, "MHA-1")

    work = compute_dtype(xp, x.dtype)

    def project(a: Any, w: Any, b: Any) -> Any:
        out = xp.matmul(xp.astype(a, work), xp.astype(w, work))
        return out if b is None else out + xp.astype(b, work)

    q = _split_heads(xp, project(x, w_q, b_q), num_heads)
    k = _split_heads(xp, project(y, w_k, b_k), num_kv_heads)
    v = _split_heads(xp, project(y, w_v, b_v), num_kv_heads)
    return_weights = options["return_weights"]
    attended = scaled_dot_product_attention(
        q, k, v, **filled(DenseOptions, options), return_weights=return_weights
    )
    per_head, p = attended if return_weights else (attended, None)
    out = xp.astype(project(_merge_heads(xp, per_head), w_o, b_o), x.dtype)
    return (out, xp.astype(p, x.dtype)) if return_weights else out
