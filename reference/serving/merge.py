"""Merging two attention states (spec/serving.md, MERGE-1 … MERGE-4).

A state is an output ``o (..., H, L, Ev)`` with its log-sum-exp ``lse (..., H, L)``
(LSE-1).  Two states over disjoint key sets merge into the state over their union; a state
with ``lse = -inf`` saw no key and contributes nothing, whatever its output holds.
"""

from __future__ import annotations

import math
from types import ModuleType

from .._array import Array
from .._checks import check_choice, namespace_of, require_real_floating
from ..sdpa import compute_dtype

CALL = "merge_attention_states(o_a, lse_a, o_b, lse_b)"
LSE_BASES = ("e", "2")


def check_states(o_a: Array, lse_a: Array, o_b: Array, lse_b: Array, call: str) -> ModuleType:
    xp = namespace_of(call, o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b)
    require_real_floating(xp, call, "MERGE-1", o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b)
    if o_a.ndim < 1 or tuple(o_a.shape) != tuple(o_b.shape):
        raise ValueError(
            f"o_a.shape={tuple(o_a.shape)}, o_b.shape={tuple(o_b.shape)}, but should be one "
            f"shape (..., H, L, Ev) [MERGE-1, {call}]"
        )
    if o_a.dtype != o_b.dtype:
        raise TypeError(
            f"o_a.dtype={o_a.dtype}, o_b.dtype={o_b.dtype}, but should be the same "
            f"[MERGE-1, {call}]"
        )
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(lse.shape) != tuple(o_a.shape[:-1]):
            raise ValueError(
                f"{name}.shape={tuple(lse.shape)}, but should be the output's shape without "
                f"its last axis, {tuple(o_a.shape[:-1])} (..., H, L) [MERGE-2, {call}]"
            )
    return xp


def merge_attention_states(
    o_a: Array, lse_a: Array, o_b: Array, lse_b: Array, *, lse_base: str = "e"
) -> tuple[Array, Array]:
    """The merged state ``(o, lse)`` of MERGE-1: ``lse = log(e^lse_a + e^lse_b)`` and
    ``o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b``.

    ``o`` is in the outputs' dtype, ``lse`` in the accumulation dtype (LSE-3).  A state
    with ``lse = -inf`` contributes nothing (its ``o`` is never read, NaN included), and two
    such states give ``o = 0``, ``lse = -inf`` (MERGE-3).  ``lse_base="2"`` takes and returns
    base-2 log-sum-exps (MERGE-2).
    """
    xp = check_states(o_a, lse_a, o_b, lse_b, CALL)
    check_choice("lse_base", lse_base, LSE_BASES, CALL, "MERGE-2")
    work = compute_dtype(xp, o_a.dtype)
    to_natural = math.log(2.0) if lse_base == "2" else 1.0
    la = xp.astype(lse_a, work) * to_natural
    lb = xp.astype(lse_b, work) * to_natural
    top = xp.maximum(la, lb)
    empty = top == -xp.inf
    # Shift by the larger log-sum-exp (no overflow); by 0 where both are -inf, so that
    # -inf - (-inf) is never formed (MERGE-3).
    shift = xp.where(empty, xp.zeros_like(top), top)
    wa, wb = xp.exp(la - shift), xp.exp(lb - shift)
    total = wa + wb
    lse = xp.where(empty, top, shift + xp.log(xp.where(empty, xp.ones_like(total), total)))
    zeros = xp.zeros_like(xp.astype(o_a, work))
    # A part that saw no key is left out, not multiplied by 0: 0 * NaN is NaN.
    part_a = xp.where((la == -xp.inf)[..., None], zeros, xp.astype(o_a, work))
    part_b = xp.where((lb == -xp.inf)[..., None], zeros, xp.astype(o_b, work))
    safe_total = xp.where(empty, xp.ones_like(total), total)[..., None]
    out = (wa[..., None] * part_a + wb[..., None] * part_b) / safe_total
    return xp.astype(out, o_a.dtype), lse / to_natural
