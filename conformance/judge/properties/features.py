"""spec/features.md: logit softcapping (SOFTCAP), ALiBi (ALIBI) and the returned log-sum-exp
(LSE), each on its own and together with masks, bias, causal calls, GQA and each other.

Every problem is drawn as for the dense properties and then given the features the kernel
claims; the definition (reference_bound, lse_bound) includes them, with the score errors
of TOL-4 and the log-sum-exp bound of TOL-5.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.sizes import Dims, refit
from ...draw.strategies import draw_dims, draw_problem
from ..assertions import assert_matches_reference, assert_shape, assert_within_bound, first_index
from ..bounds import lse_bound, observed_weights_bound
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import needs, register
from ._helpers import draw_softcap, with_claimed_features

SOFTCAP_MAGNITUDES = (1.0, 3.0, 10.0)  # q and k entries: scores from ~1 to ~100 * sqrt(E)


def _unequal_dims(data: st.DataObject, kernel: KernelUnderTest) -> Dims:
    """Dims with Lq != Lk either way round: where the ALiBi anchors differ.  Drawn dims
    that already differ are kept, so an anchor keeps the key count its cost was set for
    (43146 query rows on 3 keys must not become 800 keys)."""
    dims = draw_dims(data, kernel, min_queries=1, min_keys=1)
    if dims.n_queries != dims.n_keys:
        return dims
    shift = data.draw(st.sampled_from([1, -1, 3, -3]), label="Lk - Lq")
    n_keys = dims.n_queries + shift if dims.n_queries + shift >= 1 else dims.n_queries - shift
    return replace(dims, n_keys=n_keys)


def _alibi_applies(builtin: bool) -> Callable[[KernelDeclaration], str | None]:
    def applies(declaration: KernelDeclaration) -> str | None:
        reason = needs("alibi")(declaration)
        if reason is None and declaration.alibi_builtin_slopes != builtin:
            return (
                "the kernel computes its own slopes (ALIBI-3)"
                if not builtin
                else "the kernel takes its slopes as an argument"
            )
        return reason

    return applies


@register("softcap-matches-reference", "SOFTCAP-1", applies=needs("softcap"))
def softcap_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Scores capped to c tanh(x / c) after scaling and before bias, ALiBi and mask: with
    large scores against caps from 1 to 50, masks, bias, causal calls and GQA, the output
    is within TOL-2 (with TOL-4) of the definition; capping before scaling, a bias or a
    -inf mask inside the tanh, or no cap at all, are outside it."""
    dims = draw_dims(data, kernel)
    magnitude = data.draw(st.sampled_from(SOFTCAP_MAGNITUDES), label="magnitude")
    problem = draw_problem(data, kernel, dims=dims, magnitude=magnitude)
    assert_matches_reference(
        kernel, with_claimed_features(data, kernel, problem, dims, softcap=True)
    )


@register("softcap-bounds-logits", "SOFTCAP-3", applies=needs("softcap"))
def softcap_bounds_logits(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With scores up to ~1e4 and no bias, every weight of a row is at most e^(2c) times
    any other (checked through V = I, with the TOL-2 slack): a kernel that ignores the
    cap, or applies it to some key blocks only, concentrates the row on one key."""
    dims = draw_dims(data, kernel, min_queries=1, min_keys=2, gqa=False, weights=True)
    dtype = kernel.widest_dtype
    magnitude = 40.0 if dtype != "float16" else 20.0
    problem = draw_problem(
        data,
        kernel,
        dims=dims,
        dtype=dtype,
        magnitude=magnitude,
        mask="never",
        bias="never",
        causal="never",
        scale="never",
    )
    cap = draw_softcap(data)
    problem = problem.with_(softcap=cap)
    weights = kernel.observed_weights(problem)
    tolerance = np.asarray(observed_weights_bound(problem, kernel.declaration)[1])
    heaviest = np.max(weights - tolerance, axis=-1)
    lightest = np.min(weights + tolerance, axis=-1)
    broken = ~(heaviest <= math.exp(2 * cap) * lightest)
    if broken.any():
        at = first_index(broken)
        row = weights[at]
        raise PropertyFailure(
            f"row {at} has weights from {float(np.min(row)):.3g} to {float(np.max(row)):.3g}, a "
            f"ratio beyond e^(2c) = {math.exp(2 * cap):.3g} for softcap c = {cap:g} even after "
            f"the TOL-2 slack: capped scores lie in [-c, c] [SOFTCAP-3]",
            problem,
            kernel,
            shows_weights=True,
        )


@register("alibi-matches-reference", "ALIBI-2", applies=_alibi_applies(builtin=False))
def alibi_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The ALiBi bias -m_h |i + d - j| with d the offset of the declared causal alignment,
    slopes per query head ((Hq,) or per batch element): Lq != Lk both ways, causal or not,
    with masks, bias, GQA and softcap; a distance from the wrong corner, a positive sign,
    slopes read per key/value head or scaled with the scores are outside TOL-2."""
    dims = _unequal_dims(data, kernel)
    problem = draw_problem(data, kernel, dims=dims)
    assert_matches_reference(kernel, with_claimed_features(data, kernel, problem, dims, alibi=True))


@register("alibi-standard-slopes", "ALIBI-3", applies=_alibi_applies(builtin=True))
def alibi_standard_slopes(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A kernel that computes its own slopes uses Press et al.'s: 2^(-8(h+1)/H) for H a
    power of two, interleaved otherwise; checked against the definition with those slopes
    for 1 to 12 query heads, Lq != Lk."""
    dims = _unequal_dims(data, kernel)
    dims = replace(dims, n_kv_heads=data.draw(st.integers(1, 12), label="Hkv"), groups=1)
    problem = draw_problem(data, kernel, dims=dims)
    assert_matches_reference(kernel, with_claimed_features(data, kernel, problem, dims, alibi=True))


def _lse_applies(declaration: KernelDeclaration) -> str | None:
    return needs("returns_lse")(declaration)


def draw_lse_problem(data: st.DataObject, kernel: KernelUnderTest, **options: Any) -> Problem:
    dims = draw_dims(data, kernel, **options)
    return with_claimed_features(data, kernel, draw_problem(data, kernel, dims=dims), dims)


def assert_lse_matches(
    kernel: KernelUnderTest, problem: Problem, lse: np.ndarray, what: str = "lse"
) -> None:
    """The kernel's log-sum-exp has shape (..., Hq, Lq) (LSE-3) and lies within TOL-5 of
    LSE-1; -inf where no key is visible (LSE-2, compared exactly: TOL-3)."""
    _, bound = lse_bound(problem, kernel.declaration)
    expected = np.asarray(bound.lse)
    assert_shape(lse, expected.shape, what, problem, kernel)
    assert_within_bound(
        lse, expected, np.asarray(bound.lse_tolerance), what, problem, kernel, clause="TOL-5"
    )


@register("lse-matches-reference", "LSE-1", applies=_lse_applies)
def lse_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The returned log-sum-exp is log sum_j e^(s_ij) in base e over the final scores
    (scaled, capped, biased, with ALiBi), shape (..., Hq, Lq), within TOL-5; the output
    beside it is within TOL-2.  Base 2, the unscaled maximum or scores without the bias
    are outside TOL-5."""
    problem = draw_lse_problem(data, kernel)
    out, lse, _ = kernel.output_with_lse(problem)
    assert_lse_matches(kernel, problem, lse)
    assert_matches_reference(kernel, problem, out)


@register("lse-dtype", "LSE-3", applies=_lse_applies)
def lse_dtype(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The log-sum-exp comes in the accumulation precision: float32 for float16, bfloat16
    and float32 inputs, float64 for float64 inputs (rounding it to float16 would cost
    more than TOL-2 allows the whole output)."""
    problem = draw_lse_problem(data, kernel, min_queries=1, min_keys=1)
    _, _, dtype = kernel.output_with_lse(problem)
    wanted = "float64" if problem.dtype == "float64" else "float32"
    if dtype != wanted:
        raise PropertyFailure(
            f"lse.dtype={dtype} for {problem.dtype} inputs, but should be "
            f"{wanted}, the accumulation precision [LSE-3]",
            problem,
            kernel,
        )


def _empty_row_problem(data: st.DataObject, kernel: KernelUnderTest) -> Problem:
    """A problem with rows that see no key, by whatever the kernel takes: a blank mask
    row, bottom-right causal with Lq > Lk, an all -inf bias row, or no keys at all."""
    decl = kernel.declaration
    ways = ["no keys"] if decl.empty_sizes else []  # else SDPA-5.2 is waived
    if decl.mask:
        ways.append("blank mask row")
    if decl.causal and decl.causal_alignment == "bottom_right":
        ways.append("bottom-right Lq > Lk")
    if decl.bias and not decl.bias_shares_mask_argument:
        ways.append("-inf bias row")
    way = data.draw(st.sampled_from(ways or ["no keys"]), label="empty rows by")
    dims = draw_dims(data, kernel, min_queries=1)
    if way == "no keys":
        dims = replace(dims, n_keys=0)
    elif way == "bottom-right Lq > Lk":
        dims = refit(
            replace(dims, n_queries=dims.n_keys + data.draw(st.integers(1, 3), label="Lq - Lk"))
        )
    problem = draw_problem(
        data,
        kernel,
        dims=dims,
        mask="never",
        bias="never",
        causal="always" if way == "bottom-right Lq > Lk" else "never",
    )
    row = data.draw(st.integers(0, dims.n_queries - 1), label="empty row")
    if way == "blank mask row":
        mask = np.ones(dims.scores_shape, dtype=bool)
        mask[..., row, :] = False
        problem = problem.with_(mask=mask)
    elif way == "-inf bias row":
        bias = np.zeros(dims.scores_shape)
        bias[..., row, :] = -np.inf
        problem = problem.with_(bias=bias)
    return with_claimed_features(data, kernel, problem, dims)


@register("lse-empty-rows", "LSE-2", applies=_lse_applies)
def lse_empty_rows(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A row with no visible key (blank mask row, -inf bias row, bottom-right Lq > Lk, or
    Lk = 0) has log-sum-exp exactly -inf: not +inf (FlashAttention's unsplit forward), not
    a finite fill, not NaN."""
    problem = _empty_row_problem(data, kernel)
    _, lse, _ = kernel.output_with_lse(problem)
    _, bound = lse_bound(problem, kernel.declaration)
    expected = np.asarray(bound.lse)
    assert_shape(lse, expected.shape, "lse", problem, kernel)
    empty = expected == -np.inf
    wrong = empty & ~(lse == -np.inf)
    if wrong.any():
        at = first_index(wrong)
        raise PropertyFailure(
            f"lse{at} = {float(lse[at])!r}, but row {at[-1]} sees no key, so it should be "
            f"-inf, the log of an empty sum; {int(wrong.sum())} of {int(empty.sum())} such "
            f"rows differ [LSE-2]",
            problem,
            kernel,
        )


def _columns(a: np.ndarray | None, keys: slice) -> np.ndarray | None:
    """The key columns ``keys`` of a mask or bias (unchanged where the key axis broadcasts)."""
    return a if a is None or a.shape[-1] == 1 else a[..., keys]


@register("lse-split-combine", "LSE-1", applies=_lse_applies)
def lse_split_combine(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Two calls on the keys split in two (flash-decoding's split-KV), combined by their
    log-sum-exps, lse = log(e^lA + e^lB) and out = (e^lA oA + e^lB oB) / (e^lA + e^lB),
    equal the full call's definition within the bounds of the parts; a part in which a
    row sees no key must drop out (lse -inf), not dominate (+inf) or poison it (NaN)."""
    decl = kernel.declaration
    dims = draw_dims(data, kernel, min_keys=1)
    problem = draw_problem(data, kernel, dims=dims, causal="never")
    problem = with_claimed_features(data, kernel, problem, dims, alibi=False)
    split = data.draw(st.integers(0, dims.n_keys), label="split at")
    parts = []
    for keys in (slice(0, split), slice(split, dims.n_keys)):
        part = problem.with_(
            k=problem.k[..., keys, :],
            v=problem.v[..., keys, :],
            mask=_columns(problem.mask, keys),
            bias=_columns(problem.bias, keys),
        )
        out, lse, _ = kernel.output_with_lse(part)
        bound, lse_part = lse_bound(part, decl)
        parts.append(
            (out, lse, np.asarray(bound.out_tolerance), np.asarray(lse_part.lse_tolerance))
        )
    (out_a, lse_a, tau_a, tl_a), (out_b, lse_b, tau_b, tl_b) = parts
    with np.errstate(invalid="ignore", over="ignore"):
        lse = np.logaddexp(lse_a, lse_b)
        share = np.exp(lse_a - lse)[..., None]  # e^lA / (e^lA + e^lB); NaN if lse is NaN
        out = share * out_a + (1 - share) * out_b
    full, full_lse = lse_bound(problem, decl)
    # |lse error| <= tA + tB (logaddexp is 1-Lipschitz); the share moves by at most
    # t min(1/4, wA wB e^(2t)) with t = tA + tB (mean value theorem on the logistic)
    t = np.where(np.isfinite(lse_a) & np.isfinite(lse_b), tl_a + tl_b, 0.0)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        moved = t * np.minimum(0.25, share * (1 - share) * np.exp(2 * t))
        spread = np.abs(out_a - out_b) + tau_a + tau_b
        tolerance = share * tau_a + (1 - share) * tau_b + np.nan_to_num(moved * spread)
    assert_within_bound(
        lse,
        np.asarray(full_lse.lse),
        tl_a + tl_b,
        f"log-sum-exp combined from keys [0, {split}) and [{split}, {dims.n_keys})",
        problem,
        kernel,
        clause="LSE-1 with TOL-5",
    )
    rows = np.asarray(full.attends)[..., None] & np.ones_like(out, dtype=bool)
    assert_within_bound(
        np.where(rows, out, 0.0),
        np.where(rows, np.asarray(full.out), 0.0),
        np.where(rows, tolerance, 0.0),
        "out combined by the log-sum-exps",
        problem,
        kernel,
        clause="LSE-1 with TOL-2",
    )
