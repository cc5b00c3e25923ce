"""Merges of attention states (MERGE-1 … MERGE-4) as serving stacks write them, in NumPy:
three correct formulations and the bugs that real merges had.

Every function is ``fn(o_a, lse_a, o_b, lse_b) -> (o, lse)`` with outputs in their dtype and
log-sum-exps in float32 (float64 for float64 outputs), computed in that precision, and
declares its base and layouts (``MergeClaim``).
"""

from __future__ import annotations

import numpy as np

from attnspec.conformance import MergeClaim, declare

from .entry import CaughtBug

Array = np.ndarray


def _work(o: Array) -> type:
    return np.float64 if o.dtype == np.float64 else np.float32


def _weights(lse_a: Array, lse_b: Array, *, guard: bool = True) -> tuple[Array, Array, Array]:
    """e^(lse_x - max) and the merged lse; with ``guard`` the max is 0 where both parts
    are empty, as vLLM's CUDA merge returns early there (MERGE-3)."""
    top = np.maximum(lse_a, lse_b)
    empty = top == -np.inf
    if guard:
        top = np.where(empty, 0, top).astype(lse_a.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        w_a, w_b = np.exp(lse_a - top), np.exp(lse_b - top)
        lse = top + np.log(w_a + w_b)
    if guard:
        lse = np.where(empty, -np.inf, lse).astype(lse_a.dtype)
    return w_a, w_b, lse


def _combine(o_a: Array, w_a: Array, o_b: Array, w_b: Array, *, skip_empty: bool = True) -> Array:
    """(w_a o_a + w_b o_b) / (w_a + w_b) in the lse's precision; with ``skip_empty`` a
    part of weight 0 is left out rather than multiplied (0 * NaN is NaN)."""
    work = w_a.dtype
    parts = []
    for o, w in ((o_a, w_a), (o_b, w_b)):
        o = o.astype(work)
        if skip_empty:
            o = np.where((w == 0)[..., None], 0, o)
        parts.append(w[..., None] * o)
    total = (w_a + w_b)[..., None]
    with np.errstate(invalid="ignore"):
        return (parts[0] + parts[1]) / np.where(total == 0, 1, total)


@declare(merge=MergeClaim())
def merge_max_shift(o_a: Array, lse_a: Array, o_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """FlashInfer's and vLLM's merge: shift by the larger log-sum-exp, guard empty states."""
    w_a, w_b, lse = _weights(lse_a, lse_b)
    return _combine(o_a, w_a, o_b, w_b).astype(o_a.dtype), lse


@declare(merge=MergeClaim())
def merge_lse_first(o_a: Array, lse_a: Array, o_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """The merged log-sum-exp first (logaddexp), then each part's weight e^(lse_x - lse)."""
    with np.errstate(invalid="ignore"):
        lse = np.logaddexp(lse_a, lse_b).astype(lse_a.dtype)
    empty = lse == -np.inf
    safe = np.where(empty, 0, lse).astype(lse.dtype)
    w_a, w_b = np.exp(lse_a - safe), np.exp(lse_b - safe)
    w_a, w_b = np.where(empty, 0, w_a), np.where(empty, 0, w_b)
    parts = [
        np.where((w == 0)[..., None], 0, o.astype(_work(o_a))) for o, w in ((o_a, w_a), (o_b, w_b))
    ]
    out = w_a[..., None] * parts[0] + w_b[..., None] * parts[1]
    return out.astype(o_a.dtype), lse


def _exp2_merge(o_a: Array, lse_a: Array, o_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """Two states merged with exp2 and log2: right for base-2 log-sum-exps (FlashInfer's),
    wrong for natural ones (:func:`merge_in_base_two`)."""
    top = np.maximum(lse_a, lse_b)
    empty = top == -np.inf
    top = np.where(empty, 0, top).astype(lse_a.dtype)
    w_a, w_b = np.exp2(lse_a - top), np.exp2(lse_b - top)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, top + np.log2(w_a + w_b)).astype(lse_a.dtype)
    return _combine(o_a, w_a, o_b, w_b).astype(o_a.dtype), lse


@declare(merge=MergeClaim(base="2", out_layout="lhd", lse_layout="lh"))
def merge_flashinfer_layout(
    o_a: Array, lse_a: Array, o_b: Array, lse_b: Array
) -> tuple[Array, Array]:
    """FlashInfer's conventions: states ``[seq_len, num_heads, head_dim]`` with base-2
    log-sum-exps ``[seq_len, num_heads]``, merged with exp2."""
    return _exp2_merge(o_a, lse_a, o_b, lse_b)


CORRECT = (merge_max_shift, merge_lse_first, merge_flashinfer_layout)


@declare(merge=MergeClaim())
def merge_without_max_shift(
    o_a: Array, lse_a: Array, o_b: Array, lse_b: Array
) -> tuple[Array, Array]:
    """Bug: e^lse_a and e^lse_b taken as they are, which overflows float32 past 88."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        w_a, w_b = np.exp(lse_a), np.exp(lse_b)
        out = _combine(o_a, w_a, o_b, w_b)
        return out.astype(o_a.dtype), np.log(w_a + w_b).astype(lse_a.dtype)


@declare(merge=MergeClaim())
def merge_in_base_two(o_a: Array, lse_a: Array, o_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """Bug: natural log-sum-exps weighted with exp2 (a base-2 kernel fed natural ones)."""
    return _exp2_merge(o_a, lse_a, o_b, lse_b)


@declare(merge=MergeClaim())
def merge_swapped_weights(
    o_a: Array, lse_a: Array, o_b: Array, lse_b: Array
) -> tuple[Array, Array]:
    """Bug: each part weighted by the other's share."""
    w_a, w_b, lse = _weights(lse_a, lse_b)
    return _combine(o_a, w_b, o_b, w_a).astype(o_a.dtype), lse


@declare(merge=MergeClaim())
def merge_nan_when_both_empty(
    o_a: Array, lse_a: Array, o_b: Array, lse_b: Array
) -> tuple[Array, Array]:
    """Bug: no guard for two empty parts: -inf - (-inf) is NaN (vllm-project/vllm #27491,
    flashinfer-ai/flashinfer #4051)."""
    w_a, w_b, lse = _weights(lse_a, lse_b, guard=False)
    return _combine(o_a, w_a, o_b, w_b).astype(o_a.dtype), lse


@declare(merge=MergeClaim())
def merge_reads_empty_outputs(
    o_a: Array, lse_a: Array, o_b: Array, lse_b: Array
) -> tuple[Array, Array]:
    """Bug: an empty part's output multiplied by its weight 0 instead of left out, so NaN
    in a part that saw no key reaches the result."""
    w_a, w_b, lse = _weights(lse_a, lse_b)
    return _combine(o_a, w_a, o_b, w_b, skip_empty=False).astype(o_a.dtype), lse


BUGS = (
    CaughtBug(merge_without_max_shift, "merge-matches-reference"),
    CaughtBug(merge_in_base_two, "merge-matches-reference"),
    CaughtBug(merge_swapped_weights, "merge-matches-reference"),
    CaughtBug(merge_nan_when_both_empty, "merge-empty-states"),
    CaughtBug(merge_reads_empty_outputs, "merge-empty-states"),
)
