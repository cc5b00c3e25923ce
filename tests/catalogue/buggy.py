"""The catalogue of buggy kernels: one realistic bug each, and the property that catches it.

Every entry names the property (by its stable id) whose clause the bug violates most
directly, and carries a witness (a suite :class:`Problem`): one concrete input on which
the bug shows against the reference, checked without the conformance suite
(``catalogue.witness``), so a test can tell "the suite caught it" from "there was nothing to catch".
"""

from __future__ import annotations

import numpy as np

from attnspec.conformance.call.problem import Problem
from attnspec.conformance.draw.input_features import scores_shape

from . import bugs_plumbing as plumbing
from . import bugs_scores as sc
from . import bugs_softmax as sm
from .bugs_state import STATE_CATALOGUE
from .entry import BuggyKernel, witness
from .features_catalogue import FEATURE_CATALOGUE
from .scale import SCALE_CATALOGUE

__all__ = ["CATALOGUE", "BuggyKernel", "witness"]


def random_mask(w: Problem, density: float = 0.6, seed: int = 1) -> Problem:
    """``w`` with a random per-head mask of the full scores shape."""
    return w.with_(mask=np.random.default_rng(seed).random(scores_shape(w)) < density)


def first_row_masked(w: Problem) -> Problem:
    """``w`` with a mask that excludes every key of query 0 (an empty row) and no other."""
    mask = np.ones(scores_shape(w), dtype=bool)
    mask[..., 0, :] = False
    return w.with_(mask=mask)


def first_key_masked(
    w: Problem, *, k_fill: float | None = None, v_fill: float | None = None
) -> Problem:
    """``w`` with key 0 masked for every query, its k and/or v row overwritten."""
    mask = np.ones(scores_shape(w), dtype=bool)
    mask[..., 0] = False
    k, v = w.k.copy(), w.v.copy()
    if k_fill is not None:
        k[..., 0, :] = k_fill
    if v_fill is not None:
        v[..., 0, :] = v_fill
    return w.with_(mask=mask, k=k, v=v)


def _large_first_pair(w: Problem, value: float) -> Problem:
    """``w`` with query 0 and key 0 set to ``value`` in every feature: score E*value**2*scale."""
    q, k = w.q.copy(), w.k.copy()
    q[..., 0, :] = value
    k[..., 0, :] = value
    return w.with_(q=q, k=k)


def _keys_per_outer_element(w: Problem) -> Problem:
    """``w`` with k and v of batch (B1, 1): one key/value set per outer batch element,
    broadcast over the inner one (SDPA-1.2)."""
    return w.with_(k=w.k[:, :1].copy(), v=w.v[:, :1].copy())


def _peaked_long_row(n_keys: int = 1025, gap: float = 8.0) -> Problem:
    """One float16 query over ``n_keys`` keys: key 0 scores ``gap`` (E = 16, scale 1/4),
    every other key 0, so they hold (n_keys - 1) e^-gap of the row's weight (0.34)."""
    rng = np.random.default_rng(3)
    q = np.zeros((1, 1, 16))
    q[..., 0] = 1.0
    k = rng.standard_normal((1, n_keys, 16))
    k[..., 0] = 0.0
    k[0, 0, 0] = gap * 4
    return Problem(q=q, k=k, v=rng.standard_normal((1, n_keys, 16)), dtype="float16")


def _nan_query(w: Problem) -> Problem:
    q = w.q.copy()
    q[..., 0, 1, 2] = np.nan
    return w.with_(q=q)


def _large_masked_bias(w: Problem) -> Problem:
    w = random_mask(w)
    rng = np.random.default_rng(2)
    return w.with_(bias=np.where(w.mask, rng.standard_normal(scores_shape(w)), 3e4))


def _big_masked_key(w: Problem) -> Problem:
    w = w.with_(q=np.abs(w.q))
    return first_key_masked(w, k_fill=2000.0)


W = witness
# (why the entries look alike: a table, one bug an entry, with its witness beside it)
CATALOGUE: list[BuggyKernel] = [
    # scale (SDPA-2)
    BuggyKernel("scale-one-over-E", sc.scale_one_over_e, "default-scale"),
    BuggyKernel("scale-one-over-sqrt-Ev", sc.scale_one_over_sqrt_ev, "default-scale"),
    BuggyKernel("scale-squared", sc.scale_squared, "explicit-scale"),
    BuggyKernel(
        "explicit-scale-ignored", sc.explicit_scale_ignored, "explicit-scale", witness=W(scale=2.0)
    ),
    BuggyKernel(
        "scale-0-means-default", sc.scale_zero_means_default, "explicit-scale", witness=W(scale=0.0)
    ),
    BuggyKernel("missing-scale", sc.missing_scale, "score-variance"),
    # mask and bias (SDPA-3)
    BuggyKernel(
        "inverted-mask-polarity",
        sc.inverted_mask_polarity,
        "mask-polarity",
        witness=random_mask(W()),
    ),
    BuggyKernel(
        "mask-ignores-head-broadcast",
        sc.mask_ignores_head_broadcast,
        "mask-broadcast",
        witness=random_mask(W()),
    ),
    BuggyKernel(
        "causal-ignored-with-mask",
        sc.causal_ignored_with_mask,
        "mask-and-causal",
        witness=random_mask(W(is_causal=True)),
    ),
    BuggyKernel(
        "additive-mask-minus-1e4",
        sc.additive_mask_minus_1e4,
        "mask-wins-over-bias",
        witness=_large_masked_bias(W()),
    ),
    BuggyKernel(
        "max-includes-masked-keys",
        sc.max_includes_masked_keys,
        "masked-values-ignored",
        witness=_big_masked_key(W()),
    ),
    BuggyKernel(
        "bias-before-scaling",
        sc.bias_before_scaling,
        "bias-semantics",
        witness=W(bias=np.random.default_rng(3).standard_normal((5, 7)) * 3),
    ),
    BuggyKernel(
        "logits-soft-capped",
        sc.logits_soft_capped,
        "bias-shift-invariance",
        witness=W(magnitude=5.0),
    ),
    # causal (SDPA-4)
    BuggyKernel("causal-j-lt-i", sc.causal_strict, "causal-alignment", witness=W(is_causal=True)),
    BuggyKernel(
        "causal-j-le-i-plus-1", sc.causal_one_ahead, "causal-zeros", witness=W(is_causal=True)
    ),
    BuggyKernel(
        "top-left-declared-bottom-right",
        sc.top_left_declared_bottom_right,
        "causal-alignment",
        witness=W(is_causal=True),
    ),
    BuggyKernel(
        "bottom-right-declared-top-left",
        sc.bottom_right_declared_top_left,
        "causal-alignment",
        witness=W(is_causal=True),
    ),
    BuggyKernel(
        "decode-step-top-left",
        sc.decode_step_top_left,
        "decode-consistency",
        witness=W(is_causal=True, n_queries=1),
    ),
    # heads (SDPA-6)
    BuggyKernel("gqa-h-mod-Hkv", sc.gqa_modulo_mapping, "gqa-mapping", witness=W(heads=(4, 2))),
    BuggyKernel(
        "gqa-accepts-indivisible-heads",
        sc.gqa_accepts_indivisible_heads,
        "gqa-rejects-bad-heads",
        witness=W(heads=(3, 2)),
    ),
    # softmax and weighted sum (SDPA-7)
    BuggyKernel("softmax-over-queries", sm.softmax_over_query_axis, "rows-sum-to-one"),
    BuggyKernel(
        "mask-after-softmax", sm.mask_after_softmax, "rows-sum-to-one", witness=random_mask(W())
    ),
    BuggyKernel(
        "no-max-subtraction",
        sm.no_max_subtraction,
        "large-logits",
        witness=_large_first_pair(W(), 30.0),
    ),
    BuggyKernel("online-softmax-drops-tail", sm.online_softmax_drops_tail, "matches-reference"),
    BuggyKernel("online-softmax-no-rescale", sm.online_softmax_no_rescale, "key-permutation"),
    BuggyKernel("eps-in-denominator", sm.eps_in_denominator, "matches-reference"),
    BuggyKernel("top-8-weights", sm.top_k_weights, "matches-reference", witness=W(n_keys=12)),
    BuggyKernel("float64-in-float32", sm.float64_computed_in_float32, "matches-reference"),
    BuggyKernel(
        "row-sum-accumulated-in-float16",
        sm.row_sum_accumulated_in_float16,
        "long-peaked-rows",
        witness=_peaked_long_row(),
    ),
    BuggyKernel("values-cached-in-float16", sm.values_cached_in_float16, "matches-reference"),
    BuggyKernel("values-cached-in-int8", sm.values_cached_in_int8, "value-linearity"),
    BuggyKernel(
        "missing-final-normalisation", sm.missing_final_normalisation, "output-in-value-hull"
    ),
    BuggyKernel(
        "batch-and-heads-transposed", sm.batch_and_heads_transposed, "batch-head-independence"
    ),
    BuggyKernel("query-tail-block-skipped", sm.query_tail_block_skipped, "query-permutation"),
    # empty rows and no keys (SDPA-5)
    BuggyKernel(
        "finite-fill-minus-1e9",
        sm.finite_fill_minus_1e9,
        "empty-rows-zero",
        witness=first_row_masked(W()),
    ),
    BuggyKernel(
        "finite-fill-jax-style",
        sm.finite_fill_jax_style,
        "empty-rows-zero",
        witness=first_row_masked(W()),
    ),
    BuggyKernel(
        "nan-on-empty-rows", sm.nan_on_empty_rows, "empty-rows-zero", witness=first_row_masked(W())
    ),
    BuggyKernel("no-keys-gives-nan", sm.no_keys_gives_nan, "no-keys-zero", witness=W(n_keys=0)),
    # non-finite values (SDPA-8)
    BuggyKernel(
        "nan-leaks-through-matmul",
        sm.nan_leaks_through_matmul,
        "masked-nonfinite-ignored",
        witness=first_key_masked(W(), v_fill=np.nan),
    ),
    BuggyKernel(
        "nan-inputs-sanitised", sm.nan_inputs_sanitised, "nan-propagates", witness=_nan_query(W())
    ),
    # plumbing (SDPA-1, SDPA-7.5)
    BuggyKernel(
        "dtype-not-preserved",
        plumbing.dtype_not_preserved,
        "output-shape-dtype",
        witness=W(dtype="float16"),
    ),
    BuggyKernel(
        "value-dim-must-equal-head-dim", plumbing.value_dim_must_equal_head_dim, "value-head-dim"
    ),
    BuggyKernel(
        "tail-keys-kept-in-float16",
        plumbing.tail_keys_kept_in_float16,
        "matches-reference",
        witness=W(n_keys=33),
    ),
    BuggyKernel("scales-q-in-place", plumbing.scales_q_in_place, "inputs-unmodified"),
    BuggyKernel("random-key-order", plumbing.random_key_order, "deterministic"),
    BuggyKernel(
        "strides-ignored", plumbing.strides_ignored, "layout-independence", strided_witness=True
    ),
    BuggyKernel(
        "empty-batch-crashes", plumbing.empty_batch_crashes, "empty-sizes", witness=W(batch=(0,))
    ),
    BuggyKernel(
        "batch-paired-by-flat-index",
        plumbing.batch_paired_by_flat_index,
        "batch-broadcast",
        witness=_keys_per_outer_element(W(batch=(2, 2))),
    ),
    BuggyKernel(
        "torch-bfloat16-left-in-float32",
        plumbing.torch_bfloat16_left_in_float32,
        "output-shape-dtype",
        backend="torch",
        witness=W(dtype="bfloat16"),
    ),
    BuggyKernel(
        "torch-float16-scores-overflow",
        plumbing.torch_scores_in_input_dtype,
        "large-logits",
        backend="torch",
        witness=_large_first_pair(W(dtype="float16"), 200.0),
    ),
    # realistic scale: exact on small problems, wrong at the witness's size (CONF-1)
    *SCALE_CATALOGUE,
    # spec/features.md and dropout (DROP-2): entries with their own evidence
    *FEATURE_CATALOGUE,
    # state between calls (SDPA-7.8): entries with their own evidence
    *STATE_CATALOGUE,
]
