"""Catalogue entries for the feature bugs (spec/features.md, DROP-2 … DROP-4).

Each entry names the property that must catch the bug and carries its own evidence that
the bug is real, computed from the reference and plain NumPy on a fixed input, not by the
property: an output or log-sum-exp outside its bound, a wrong dtype, indicators with the
wrong frequency or shared where they must be independent, a seed that reproduces nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnspec.backends import Backend
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.judge.bounds import lse_bound, reference_bound
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.packed_calls import (
    Batch,
    CacheCall,
    Padding,
    call_kv_cache,
    call_varlen,
    varlen_arguments,
)
from attnspec.reference import append_to_cache, kv_cache_attention, varlen_attention

from . import bugs_features as bugs
from . import packed_kernels as packed
from .feature_blocks import press_slopes

Evidence = Callable[[KernelUnderTest], str | None]


@dataclass(frozen=True)
class FeatureBug:
    """A catalogue entry like ``BuggyKernel``, with evidence instead of a dense witness."""

    name: str
    fn: Callable[..., Any]
    catches: str
    evidence: Evidence
    backend: str = "numpy"
    witness: None = None
    known_miss: str = ""

    def observed_difference(self) -> str | None:
        return self.evidence(KernelUnderTest(self.fn, Backend(self.backend)))


def _problem(
    seed: int = 0,
    *,
    heads: tuple[int, int] = (4, 2),
    n_queries: int = 5,
    n_keys: int = 7,
    magnitude: float = 1.0,
    dtype: str = "float64",
    **fields: Any,
) -> Problem:
    rng = np.random.default_rng(seed)
    n_q, n_kv = heads
    return Problem(
        q=rng.standard_normal((2, n_q, n_queries, 6)) * magnitude,
        k=rng.standard_normal((2, n_kv, n_keys, 6)) * magnitude,
        v=rng.standard_normal((2, n_kv, n_keys, 3)),
        dtype=dtype,
        **fields,
    )


def _outside(
    actual: np.ndarray, expected: np.ndarray, tolerance: np.ndarray, what: str
) -> str | None:
    if actual.shape != expected.shape:
        return f"{what} has shape {actual.shape}, the definition's is {expected.shape}"
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    with np.errstate(invalid="ignore"):
        bad = ~same & ~(np.abs(actual - expected) <= tolerance)
    if not bad.any():
        return None
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    return (
        f"{what}{at} = {float(actual[at])!r}, the definition's is {float(expected[at])!r} "
        f"(bound {float(tolerance[at]):.3g})"
    )


def out_differs(problem: Problem) -> Evidence:
    """Evidence: the output departs from the definition (with features) beyond TOL-2."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        bound = reference_bound(problem, kernel.declaration)
        return _outside(
            kernel.output(problem), np.asarray(bound.out), np.asarray(bound.out_tolerance), "out"
        )

    return evidence


def lse_differs(problem: Problem) -> Evidence:
    """Evidence: the log-sum-exp departs from LSE-1 beyond TOL-5, or is not float32."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        _, lse, dtype = kernel.output_with_lse(problem)
        wanted = "float64" if problem.dtype == "float64" else "float32"
        if dtype != wanted:
            return f"lse.dtype={dtype} for {problem.dtype} inputs"
        _, bound = lse_bound(problem, kernel.declaration)
        return _outside(lse, np.asarray(bound.lse), np.asarray(bound.lse_tolerance), "lse")

    return evidence


def _observed(kernel: KernelUnderTest, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """q = 0, V = I, (2, 4, 64, 64): the output (kept, rescaled weights) and its support."""
    q = np.zeros((2, 4, 64, 4))
    problem = Problem(
        q=q,
        k=q,
        v=np.broadcast_to(np.eye(64), (2, 4, 64, 64)).copy(),
        dtype="float64",
        dropout_p=p,
        seed=seed,
    )
    out = kernel.output(problem)
    return out, out > 0


def kept_values_wrong(kernel: KernelUnderTest) -> str | None:
    """Evidence: kept entries are not 1/(Lk (1 - p)) (the uniform weight, rescaled)."""
    out, kept = _observed(kernel, 0.3, 1)
    values = np.unique(np.round(out[kept], 12))
    want = 1 / (64 * 0.7)
    if values.size == 1 and math.isclose(values[0], want, rel_tol=1e-9):
        return None
    return f"kept entries take the values {values[:4]}, DROP-2 gives only {want:.6g}"


def kept_fraction_wrong(kernel: KernelUnderTest) -> str | None:
    """Evidence: the kept fraction of 32768 indicators is far from 1 - p = 0.7."""
    _, kept = _observed(kernel, 0.3, 2)
    return (
        None
        if abs(kept.mean() - 0.7) < 0.05
        else (f"kept {kept.mean():.3f} of {kept.size} weights with p = 0.3")
    )


def shared_indicators(axis: int) -> Evidence:
    """Evidence: indicators along ``axis`` are identical, which independent ones of 64
    entries each are with probability (0.7^2 + 0.3^2)^64 < 1e-12."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        _, kept = _observed(kernel, 0.3, 3)
        first, second = np.take(kept, 0, axis=axis), np.take(kept, 1, axis=axis)
        return (
            f"indicators 0 and 1 along axis {axis} are identical"
            if np.array_equal(first, second)
            else None
        )

    return evidence


def values_dropped_apart(kernel: KernelUnderTest) -> str | None:
    """Evidence: with V = [I | G] the general columns are not the identity columns' kept
    weights times G (an indicator per output element, not per weight)."""
    q = np.zeros((1, 2, 16, 4))
    general = np.random.default_rng(5).standard_normal((1, 2, 16, 3))
    v = np.concatenate([np.broadcast_to(np.eye(16), (1, 2, 16, 16)), general], axis=-1)
    problem = Problem(q=q, k=q, v=v, dtype="float64", dropout_p=0.5, seed=6)
    out = kernel.output(problem)
    expected = out[..., :16] @ general
    worst = float(np.max(np.abs(out[..., 16:] - expected)))
    return None if worst < 1e-12 else f"value columns off the kept weights by {worst:.3g}"


def seed_ignored(kernel: KernelUnderTest) -> str | None:
    """Evidence: two calls with the same seed draw different indicators."""
    first, second = (_observed(kernel, 0.3, 4)[1] for _ in range(2))
    return None if np.array_equal(first, second) else "the same seed gave different masks"


def _sequences(lengths: list[tuple[int, int]], seed: int = 7) -> list[Problem]:
    """Causal float64 sequences of the given (Lq, Lk), Hq = 4 reading Hkv = 2."""
    rng = np.random.default_rng(seed)
    return [
        Problem(
            q=rng.standard_normal((4, n_q, 6)),
            k=rng.standard_normal((2, n_k, 6)),
            v=rng.standard_normal((2, n_k, 3)),
            dtype="float64",
            is_causal=True,
            softcap=5.0,
        )
        for n_q, n_k in lengths
    ]


def _close(got: np.ndarray, want: np.ndarray, what: str) -> str | None:
    same = np.isclose(got, want, rtol=1e-9, atol=1e-12) | (got == want)
    if got.shape != want.shape:
        return f"{what} has shape {got.shape}, the reference's {want.shape}"
    if same.all():
        return None
    at = tuple(int(i) for i in np.argwhere(~same)[0])
    return f"{what}{at} = {float(got[at])!r}, the reference's is {float(want[at])!r}"


VARLEN_BATCH = Batch(_sequences([(3, 5), (0, 2), (4, 3), (2, 0), (5, 6)]))


def varlen_differs_on(batch: Batch, padding: Padding | None = None) -> Evidence:
    """Evidence on ``batch`` (its sequences' masks flattened, VARLEN-6; ``padding`` tokens
    past the offsets, VARLEN-5): the packed output differs from reference.varlen_attention
    (float64) on the arrays the kernel was given, or the kernel accepts offsets the
    reference rejects."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        (q, k, v), keywords = varlen_arguments(kernel, batch, padding=padding)
        out, lse = call_varlen(kernel, batch, padding)
        want, want_lse = varlen_attention(
            q,
            k,
            v,
            keywords["cu_seqlens_q"],
            keywords["cu_seqlens_k"],
            mask=keywords.get("custom_mask"),
            sinks=keywords.get(kernel.declaration.sinks_keyword),
            is_causal=True,
            causal_alignment="bottom_right",
            softcap=5.0,
            return_lse=True,
        )
        return _close(out, want, "out") or _close(lse, want_lse, "lse")

    return evidence


varlen_differs = varlen_differs_on(VARLEN_BATCH)
VARLEN_MASKED = Batch(
    [
        s.with_(mask=np.random.default_rng(b).random((s.q.shape[-2], s.k.shape[-2])) < 0.6)
        for b, s in enumerate(VARLEN_BATCH.sequences)
    ]
)


def varlen_accepts_bad_offsets(kernel: KernelUnderTest) -> str | None:
    """Evidence: offsets past the packed tokens, which the reference rejects, give a result."""
    batch = VARLEN_BATCH
    bad = np.array([0, 3, 3, 7, 9, 20], np.int32)
    keys = np.concatenate([[0], np.cumsum([s.k.shape[-2] for s in batch.sequences])])
    args, keywords = varlen_arguments(kernel, batch, offsets=(bad, keys.astype(np.int32)))
    try:
        kernel.call_raw(args, keywords)
    except ValueError:
        return None
    return f"cu_seqlens_q={bad.tolist()} for 14 tokens gave a result; the reference raises"


CACHE_BATCH = Batch(
    _sequences([(2, 5), (2, 2), (2, 7)], seed=8),
    cache=CacheCall(
        lengths=[3, 0, 5],
        n_new=2,
        capacity=8,
        block_size=2,
        table=np.array([[5, 0, 7, 2], [1, 9, 3, 6], [8, 4, 10, 11]]),
        n_blocks=13,
        stale_seed=3,
    ),
)


def cache_differs(kernel: KernelUnderTest, batch: Batch = CACHE_BATCH) -> str | None:
    """Evidence: the output or the appended cache differs from reference.kv_cache_attention
    and reference.append_to_cache (float64), on ``batch`` (its left padding, window and
    chunk passed to both, KVCACHE-6)."""
    if not kernel.declaration.kv_cache_paged:
        batch = Batch(
            batch.sequences,
            cache=CacheCall(lengths=[3, 0, 5], n_new=2, capacity=8, stale_seed=3),
            sinks=batch.sinks,
        )
    out, lse, after, before = call_kv_cache(kernel, batch)
    options = dict(k=before["k"], v=before["v"], block_table=before.get("block_table"))
    cache = batch.kv_cache
    sinks = None if batch.sinks is None else batch.sinks.astype(np.float32)
    want, want_lse = kv_cache_attention(
        before["q"],
        before["k_cache"],
        before["v_cache"],
        before["cache_seqlens"],
        is_causal=True,
        softcap=5.0,
        cache_leftpad=before.get("cache_leftpad"),
        window=cache.window or (None, None),
        attention_chunk=cache.chunk,
        n_sink_tokens=cache.sink_tokens or 0,
        sinks=sinks,
        return_lse=True,
        **options,
    )
    caches = append_to_cache(
        before["k_cache"], before["v_cache"], before["cache_seqlens"], **options
    )
    return (
        _close(out, want, "out")
        or _close(lse, want_lse, "lse")
        or _close(after["k_cache"], caches[0], "k_cache after the call")
    )


# KVCACHE-6: CACHE_BATCH's cache with left padding 1, 0, 2 (each element attends
# cache_seqlens[b] - cache_leftpad[b] + 2 keys), and with a window of 1 key to the left (a
# window that reaches no padding would hide a kernel reading the padding, so apart)
CACHE_LEFTPAD_BATCH = Batch(
    _sequences([(2, 4), (2, 2), (2, 5)], seed=8),
    cache=replace(CACHE_BATCH.kv_cache, starts=[1, 0, 2]),
)
CACHE_WINDOW_BATCH = Batch(
    CACHE_BATCH.sequences, cache=replace(CACHE_BATCH.kv_cache, window=(1, None))
)
# SINK-4: that window with 2 sink tokens, which it has moved past in the last element
CACHE_SINK_TOKENS_BATCH = Batch(
    CACHE_BATCH.sequences, cache=replace(CACHE_WINDOW_BATCH.kv_cache, sink_tokens=2)
)


# SINK-6: sink logits (Hq = 4) near the scores, in a packed and a cache call
SINKS = np.array([0.5, -1.0, 1.5, 0.0])
VARLEN_SINKS = replace(VARLEN_BATCH, sinks=SINKS)
CACHE_SINKS = replace(CACHE_BATCH, sinks=SINKS)


def sinks_differ(kernel: KernelUnderTest) -> str | None:
    """Evidence: :func:`cache_differs` on CACHE_SINKS."""
    return cache_differs(kernel, CACHE_SINKS)


def leftpad_differs(kernel: KernelUnderTest) -> str | None:
    """Evidence: :func:`cache_differs` on CACHE_LEFTPAD_BATCH."""
    return cache_differs(kernel, CACHE_LEFTPAD_BATCH)


def window_differs(kernel: KernelUnderTest) -> str | None:
    """Evidence: :func:`cache_differs` on CACHE_WINDOW_BATCH."""
    return cache_differs(kernel, CACHE_WINDOW_BATCH)


def sink_tokens_differ(kernel: KernelUnderTest) -> str | None:
    """Evidence: :func:`cache_differs` on CACHE_SINK_TOKENS_BATCH."""
    return cache_differs(kernel, CACHE_SINK_TOKENS_BATCH)


def stale_changes_output(kernel: KernelUnderTest, magnitude: float = 30.0) -> str | None:
    """Evidence: stale cache values of ``magnitude`` (NaN: every stale value NaN) change
    the output bits."""
    loud = Batch(CACHE_BATCH.sequences, cache=replace(CACHE_BATCH.cache, stale_magnitude=magnitude))
    first, again = call_kv_cache(kernel, CACHE_BATCH)[0], call_kv_cache(kernel, loud)[0]
    same = np.array_equal(first, again, equal_nan=True)
    return None if same else f"stale values of magnitude {magnitude} changed the output"


def nan_stale_changes_output(kernel: KernelUnderTest) -> str | None:
    """Evidence: NaN in every stale cache position changes the output (KVCACHE-7)."""
    return stale_changes_output(kernel, math.nan)


def _masked(problem: Problem) -> Problem:
    mask = np.random.default_rng(9).random((*problem.q.shape[:-1], problem.k.shape[-2])) < 0.5
    mask[..., 0] = True
    return problem.with_(mask=mask)


SLOPES = press_slopes(4).astype(np.float64)
FEATURE_CATALOGUE: list[FeatureBug] = [
    FeatureBug(
        "softcap-before-scale",
        bugs.softcap_before_scale,
        "softcap-matches-reference",
        out_differs(_problem(magnitude=3.0, softcap=2.0)),
    ),
    FeatureBug(
        "softcap-bias-inside",
        bugs.softcap_bias_inside,
        "softcap-matches-reference",
        out_differs(
            _problem(softcap=1.0, bias=np.random.default_rng(5).standard_normal((2, 4, 5, 7)) * 3)
        ),
    ),
    FeatureBug(
        "softcap-mask-inside",
        bugs.softcap_mask_inside,
        "softcap-matches-reference",
        out_differs(_masked(_problem(magnitude=3.0, softcap=1.0))),
    ),
    FeatureBug(
        "softcap-ignored",
        bugs.softcap_ignored,
        "softcap-bounds-logits",
        out_differs(_problem(magnitude=3.0, softcap=2.0)),
    ),
    FeatureBug(
        "alibi-wrong-corner",
        bugs.alibi_wrong_corner,
        "alibi-matches-reference",
        out_differs(_problem(alibi_slopes=SLOPES, n_queries=3, n_keys=7)),
    ),
    FeatureBug(
        "alibi-positive-sign",
        bugs.alibi_positive_sign,
        "alibi-matches-reference",
        out_differs(_problem(alibi_slopes=SLOPES)),
    ),
    FeatureBug(
        "alibi-kv-head-slopes",
        bugs.alibi_kv_head_slopes,
        "alibi-matches-reference",
        out_differs(_problem(alibi_slopes=SLOPES)),
    ),
    FeatureBug(
        "alibi-scaled",
        bugs.alibi_scaled,
        "alibi-matches-reference",
        out_differs(_problem(alibi_slopes=SLOPES)),
    ),
    FeatureBug(
        "alibi-naive-slopes",
        bugs.alibi_naive_slopes,
        "alibi-standard-slopes",
        out_differs(_problem(heads=(6, 6), alibi_slopes=press_slopes(6).astype(np.float64))),
    ),
    FeatureBug("lse-base-two", bugs.lse_base_two, "lse-matches-reference", lse_differs(_problem())),
    FeatureBug(
        "lse-unscaled-max",
        bugs.lse_unscaled_max,
        "lse-matches-reference",
        lse_differs(_problem(magnitude=2.0)),
    ),
    FeatureBug(
        "lse-plus-inf-empty",
        bugs.lse_plus_inf_empty,
        "lse-empty-rows",
        lse_differs(_problem(n_keys=0)),
    ),
    FeatureBug(
        "lse-zero-empty", bugs.lse_zero_empty, "lse-empty-rows", lse_differs(_problem(n_keys=0))
    ),
    FeatureBug(
        "lse-input-dtype", bugs.lse_input_dtype, "lse-dtype", lse_differs(_problem(dtype="float16"))
    ),
    FeatureBug(
        "lse-without-softcap",
        bugs.lse_without_softcap,
        "lse-matches-reference",
        lse_differs(_problem(magnitude=3.0, softcap=1.0)),
    ),
    FeatureBug(
        "dropout-no-rescale", bugs.dropout_no_rescale, "dropout-rescaling", kept_values_wrong
    ),
    FeatureBug(
        "dropout-times-keep-probability",
        bugs.dropout_times_keep_probability,
        "dropout-unbiased",
        kept_values_wrong,
    ),
    FeatureBug(
        "dropout-renormalised", bugs.dropout_renormalised, "dropout-rescaling", kept_values_wrong
    ),
    FeatureBug(
        "dropout-keeps-with-p",
        bugs.dropout_keeps_with_p,
        "dropout-kept-fraction",
        kept_fraction_wrong,
    ),
    FeatureBug(
        "dropout-shared-by-heads",
        bugs.dropout_shared_by_heads,
        "dropout-independence",
        shared_indicators(axis=1),
    ),
    FeatureBug(
        "dropout-per-key", bugs.dropout_per_key, "dropout-independence", shared_indicators(axis=2)
    ),
    FeatureBug("dropout-ignores-seed", bugs.dropout_ignores_seed, "dropout-seed", seed_ignored),
    FeatureBug(
        "dropout-after-values",
        bugs.dropout_after_values,
        "dropout-general-values",
        values_dropped_apart,
    ),
    FeatureBug(
        "dropout-zero-means-default",
        bugs.dropout_zero_means_default,
        "dropout-zero",
        out_differs(_problem(dropout_p=0.0, seed=3)),
    ),
    FeatureBug(
        "lse-plus-inf-without-keys",
        bugs.lse_plus_inf_without_keys,
        "lse-split-combine",
        lse_differs(_problem(n_keys=0)),
    ),
    FeatureBug(
        "varlen-global-alignment",
        packed.varlen_global_alignment,
        "varlen-matches-reference",
        varlen_differs,
    ),
    FeatureBug(
        "varlen-sees-previous-key",
        packed.varlen_sees_previous_key,
        "varlen-isolation",
        varlen_differs,
    ),
    FeatureBug(
        "varlen-empty-keys-nan",
        packed.varlen_empty_keys_nan,
        "varlen-empty-sequences",
        varlen_differs,
    ),
    FeatureBug(
        "varlen-padding-rows-nan",
        packed.varlen_padding_rows_nan,
        "varlen-padding",
        varlen_differs_on(VARLEN_BATCH, Padding(2, 2, math.nan)),
    ),
    FeatureBug(
        "varlen-keys-to-the-end",
        packed.varlen_keys_to_the_end,
        "varlen-padding",
        varlen_differs_on(VARLEN_BATCH, Padding(2, 2, math.nan)),
    ),
    FeatureBug(
        "varlen-mask-at-query-offset",
        packed.varlen_mask_at_query_offset,
        "varlen-matches-reference",
        varlen_differs_on(VARLEN_MASKED),
    ),
    FeatureBug(
        "varlen-sinks-ignored",
        packed.varlen_sinks_ignored,
        "varlen-matches-reference",
        varlen_differs_on(VARLEN_SINKS),
    ),
    FeatureBug(
        "varlen-unchecked-offsets",
        packed.varlen_unchecked_offsets,
        "varlen-rejects-bad-offsets",
        varlen_accepts_bad_offsets,
    ),
    FeatureBug(
        "kv-cache-reads-one-more",
        packed.kv_cache_reads_one_more,
        "kv-cache-matches-reference",
        cache_differs,
    ),
    FeatureBug(
        "kv-cache-top-left", packed.kv_cache_top_left, "kv-cache-matches-reference", cache_differs
    ),
    FeatureBug(
        "kv-cache-ignores-leftpad",
        packed.kv_cache_ignores_leftpad,
        "kv-cache-matches-reference",
        leftpad_differs,
    ),
    FeatureBug(
        "kv-cache-window-top-left",
        packed.kv_cache_window_top_left,
        "kv-cache-matches-reference",
        window_differs,
    ),
    FeatureBug(
        "kv-cache-writes-one-late",
        packed.kv_cache_writes_one_late,
        "kv-cache-append",
        cache_differs,
    ),
    FeatureBug(
        "kv-cache-stale-max",
        packed.kv_cache_stale_max,
        "kv-cache-stale-positions",
        stale_changes_output,
    ),
    FeatureBug(
        "kv-cache-values-over-capacity",
        packed.kv_cache_values_over_capacity,
        "kv-cache-nan-past-length",
        nan_stale_changes_output,
    ),
    FeatureBug(
        "kv-cache-sink-in-numerator",
        packed.kv_cache_sink_in_numerator,
        "kv-cache-matches-reference",
        sinks_differ,
    ),
    FeatureBug(
        "kv-cache-sink-tokens-windowed",
        packed.kv_cache_sink_tokens_windowed,
        "kv-cache-matches-reference",
        sink_tokens_differ,
    ),
    FeatureBug(
        "kv-cache-ignores-table", packed.kv_cache_ignores_table, "kv-cache-paged", cache_differs
    ),
]
