"""The score features of spec/features.md: logit softcapping (SOFTCAP), ALiBi (ALIBI), the
log-sum-exp (LSE), and dropout applied with an explicit keep mask (DROP-2 … DROP-5).

Each takes or returns arrays in the grouped layout of :class:`~.grouped.GroupedInputs`
(``(*batch, Hkv, G, Lq, ·)``), so the dense reference, the varlen and KV-cache references
and the tolerance model share one implementation.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import array_api_compat

from ._array import Array
from ._checks import check_size, real_number, require_broadcastable_to
from .grouped import GroupedInputs
from .masks import creation_namespace


def check_softcap(softcap: Any, call: str) -> float | None:
    """``softcap`` as a float, or None (no capping); SOFTCAP-2."""
    if softcap is None:
        return None
    value = real_number("softcap", softcap, "None or a real number > 0", "SOFTCAP-2", call)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"softcap={softcap!r}, but should be a finite number > 0 (None for "
            f"no capping) [SOFTCAP-2, {call}]"
        )
    return value


def softcapped(xp: ModuleType, scaled: Array, softcap: float) -> Array:
    """cap * tanh(x / cap) of the scaled dot products (SOFTCAP-1)."""
    return softcap * xp.tanh(scaled / softcap)


def alibi_slopes(
    n_heads: int,
    *,
    xp: ModuleType | None = None,
    device: Any = None,
    dtype: Any = None,
) -> Array:
    """The standard ALiBi slopes of ALIBI-3 for ``n_heads`` heads, shape ``(n_heads,)``.

    For H a power of two, head h (0-based) gets 2^(-8(h+1)/H); otherwise the slopes of the
    largest power of two P < H, followed by every other slope of 2P (Press et al. 2022).
    Default dtype float32 (the dtype FlashAttention takes slopes in).
    """
    call = "alibi_slopes(n_heads)"
    n_heads = check_size("n_heads", n_heads, call, minimum=1)
    xp, device = creation_namespace(xp, device)
    values = _press_slopes(n_heads)
    return xp.asarray(values, dtype=xp.float32 if dtype is None else dtype, device=device)


def _press_slopes(n_heads: int) -> list[float]:
    power = 1 << (n_heads.bit_length() - 1)  # largest power of two <= n_heads
    slopes = [2.0 ** (-8.0 * (h + 1) / power) for h in range(power)]
    if power < n_heads:
        doubled = [2.0 ** (-8.0 * (h + 1) / (2 * power)) for h in range(2 * power)]
        slopes += doubled[0::2][: n_heads - power]
    return slopes


def alibi_distance(
    xp: ModuleType, n_queries: int, n_keys: int, offset: int, device: Any, dtype: Any
) -> Array:
    """|i + offset - j| as an ``(Lq, Lk)`` array: the ALiBi distance of ALIBI-2."""
    rows = xp.arange(n_queries, device=device)[:, None]
    cols = xp.arange(n_keys, device=device)[None, :]
    return xp.astype(xp.abs(rows + offset - cols), dtype)


def grouped_slopes(problem: GroupedInputs, alibi_slopes: Array, call: str) -> Array:
    """``alibi_slopes`` (ALIBI-1) checked and laid out as ``(*batch, Hkv, G, 1, 1)`` in the
    computation dtype, so that ``-slopes * distance`` is the grouped ALiBi bias.

    ``alibi_slopes`` has one slope per query head, shape ``(..., Hq)`` broadcasting
    against the batch shape (FlashAttention: ``(Hq,)`` or ``(B, Hq)``).
    """
    xp = problem.xp
    *batch, n_kv_heads, groups, _, _ = problem.q.shape
    if not xp.isdtype(alibi_slopes.dtype, "real floating"):
        raise TypeError(
            f"alibi_slopes.dtype={alibi_slopes.dtype}, but should be a real "
            f"floating dtype [ALIBI-1, {call}]"
        )
    n_heads = n_kv_heads * groups
    if alibi_slopes.ndim < 1:
        raise ValueError(
            f"alibi_slopes.shape={tuple(alibi_slopes.shape)}, but should be "
            f"(..., {n_heads}): one slope per query head [ALIBI-1, {call}]"
        )
    if alibi_slopes.shape[-1] != n_heads:
        raise ValueError(
            f"alibi_slopes.shape={tuple(alibi_slopes.shape)}, but its last axis "
            f"should have one slope per query head ({n_heads}) [ALIBI-1, {call}]"
        )
    require_broadcastable_to(
        "alibi_slopes", tuple(alibi_slopes.shape), (*batch, n_heads), call, "ALIBI-1"
    )
    return xp.reshape(
        xp.broadcast_to(xp.astype(alibi_slopes, problem.q.dtype), (*batch, n_heads)),
        (*batch, n_kv_heads, groups, 1, 1),
    )


def grouped_alibi(problem: GroupedInputs, alibi_slopes: Array, offset: int, call: str) -> Array:
    """The ALiBi bias a_ij = -m_h |i + offset - j| (ALIBI-2) in the grouped layout, for
    the slopes of :func:`grouped_slopes`."""
    slopes = grouped_slopes(problem, alibi_slopes, call)
    n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
    device = array_api_compat.device(problem.q)
    distance = alibi_distance(problem.xp, n_queries, n_keys, offset, device, problem.q.dtype)
    return -slopes * distance


def log_sum_exp(xp: ModuleType, scores: Array, allowed: Array) -> Array:
    """log sum_{j in S(i)} exp(s_ij) over the key axis; -inf where S(i) is empty (LSE-1,
    LSE-2).  ``scores`` hold -inf at disallowed keys (``allowed_scores``)."""
    if scores.shape[-1] == 0:
        return xp.full(
            scores.shape[:-1], -xp.inf, dtype=scores.dtype, device=array_api_compat.device(scores)
        )
    row_max = xp.max(scores, axis=-1)
    attends = xp.any(allowed, axis=-1)
    shift = xp.where(attends, row_max, xp.zeros_like(row_max))
    exps = xp.where(allowed, xp.exp(scores - shift[..., None]), xp.zeros_like(scores))
    total = xp.sum(exps, axis=-1)
    safe = xp.where(attends, total, xp.ones_like(total))
    return xp.where(attends, shift + xp.log(safe), xp.full_like(total, -xp.inf))


def check_dropout_p(dropout_p: Any, call: str) -> float:
    """``dropout_p`` as a float in [0, 1) (DROP-2)."""
    value = real_number("dropout_p", dropout_p, "a real number in [0, 1)", "DROP-2", call)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"dropout_p={dropout_p!r}, but should be in [0, 1) [DROP-2, {call}]")
    return value


def dropped_weights(
    problem: GroupedInputs,
    weights: Array,
    dropout_p: float,
    keep: Array,
    call: str,
) -> Array:
    """``weights * keep / (1 - p)`` (DROP-2): kept weights rescaled, dropped ones 0, no
    renormalisation.  ``keep`` is boolean, broadcasting to ``(..., Hq, Lq, Lk)``; the
    reference draws nothing itself, so it stays deterministic."""
    xp = problem.xp
    if keep is None:
        if dropout_p > 0:
            raise ValueError(
                f"dropout_p={dropout_p!r} needs dropout_keep=, the boolean keep mask: the "
                f"reference draws no random numbers [DROP-2, {call}]"
            )
        return weights
    if keep.dtype != xp.bool:
        raise TypeError(
            f"dropout_keep.dtype={keep.dtype}, but should be bool (True = kept) [DROP-2, {call}]"
        )
    *grouped, n_queries, n_keys = weights.shape
    n_heads = grouped[-1] * grouped[-2]
    scores_shape = (*grouped[:-2], n_heads, n_queries, n_keys)
    require_broadcastable_to("dropout_keep", tuple(keep.shape), scores_shape, call, "DROP-2")
    kept = xp.reshape(xp.broadcast_to(keep, scores_shape), weights.shape)
    scaled = weights / (1.0 - dropout_p)
    return xp.where(kept, scaled, xp.zeros_like(weights))
