"""Catalogue entries for the bugs that live only at realistic scale (SDPA-7.3, TOL-2).

Each kernel is exact (within TOL-2) on every small problem — Lq, Lk <= 24, E, Ev <= 16,
up to 3 heads per group, up to 3 batch elements (tests/catalogue/test_scale.py checks
it) — and its witness is a realistic input on which it is visibly wrong: a second key
block, a ragged tail, a second split-KV chunk, a head dim of 59 or 80, 2**15 programs,
a GQA group of 8, a decode step over 300 keys, 6 batch elements with their own padding,
4097 keys, a float16 query row padded with finfo.min.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnspec.conformance.call.problem import Problem
from attnspec.conformance.draw.input_features import scores_shape

from . import bugs_paths as paths
from . import bugs_tiling as tiling
from .entry import BuggyKernel, witness


def long_keys(
    n_keys: int,
    *,
    n_queries: int = 6,
    head_dim: int = 16,
    value_dim: int = 16,
    batch: tuple[int, ...] = (1,),
    heads: tuple[int, int] = (2, 2),
    dtype: str = "float32",
    **options: Any,
) -> Problem:
    """A few queries (cheap to check) against ``n_keys`` keys, float32 by default."""
    return witness(
        n_keys=n_keys,
        n_queries=n_queries,
        head_dim=head_dim,
        value_dim=value_dim,
        batch=batch,
        heads=heads,
        dtype=dtype,
        **options,
    )


def square_causal(n: int) -> Problem:
    """Lq = Lk = n with is_causal: enough rows and keys for several blocks."""
    return long_keys(n, n_queries=n, heads=(1, 1), head_dim=8, value_dim=8, is_causal=True)


def per_element_padding(w: Problem, seed: int = 5) -> Problem:
    """``w`` with a key-padding mask (*batch, 1, 1, Lk) of a different length per batch
    element, as a batch of sequences of unequal length is padded."""
    batch, n_keys = w.q.shape[:-3], w.k.shape[-2]
    lengths = np.random.default_rng(seed).integers(1, n_keys + 1, size=batch)
    mask = np.arange(n_keys) < lengths[..., None, None, None]
    return w.with_(mask=mask)


def padded_float16_rows(w: Problem) -> Problem:
    """``w`` in float16 with query row 0 of every head a padding row, as a padded query of
    a padded batch gets from an HF-style additive mask: finfo(float16).min on every key.
    Other rows are unpadded."""
    bias = np.zeros(scores_shape(w))
    bias[..., 0, :] = float(np.finfo(np.float16).min)
    return w.with_(bias=bias, dtype="float16")


def entry(name: str, fn: Callable[..., Any], catches: str, w: Problem) -> BuggyKernel:
    """A scale bug, caught by ``catches`` in the quick profile (its realistic strata, or
    the anchor problems of conformance/draw/anchors.py)."""
    return BuggyKernel(name, fn, catches, witness=w)


W = long_keys
SCALE_CATALOGUE: list[BuggyKernel] = [
    # key blocks of 64 and their tails
    entry(
        "tiled-duplicates-key-tail", tiling.tiled_duplicates_key_tail, "matches-reference", W(100)
    ),
    entry("tiled-drops-key-tail", tiling.tiled_drops_key_tail, "matches-reference", W(100)),
    entry(
        "tiled-accumulator-not-rescaled",
        tiling.tiled_accumulator_not_rescaled,
        "matches-reference",
        W(200),
    ),
    entry(
        "exp2-rescale-without-log2e", tiling.exp2_rescale_without_log2e, "key-permutation", W(200)
    ),
    # split-KV chunks of 256 keys
    entry(
        "split-kv-merge-ignores-chunk-max",
        tiling.split_kv_merge_ignores_chunk_max,
        "matches-reference",
        W(1025, magnitude=2.0),
    ),
    entry(
        "split-kv-merge-forgets-chunk-sum",
        tiling.split_kv_merge_forgets_chunk_sum,
        "matches-reference",
        W(1025),
    ),
    entry(
        "split-kv-floor-chunk-length",
        tiling.split_kv_floor_chunk_length,
        "key-permutation",
        W(1023),
    ),
    # causal block skipping and masking
    entry(
        "causal-skip-uses-top-left-limit",
        tiling.causal_skip_uses_top_left_limit,
        "decode-consistency",
        W(300, n_queries=1, is_causal=True),
    ),
    entry(
        "causal-masks-last-key-block-only",
        tiling.causal_masks_last_key_block_only,
        "causal-zeros",
        square_causal(100),
    ),
    entry(
        "causal-tail-query-block-misaligned",
        tiling.causal_tail_query_block_misaligned,
        "matches-reference",
        square_causal(200),
    ),
    # head-dim vector tails
    entry(
        "head-dim-tail-dropped",
        paths.head_dim_tail_dropped,
        "matches-reference",
        W(16, head_dim=59),
    ),
    entry(
        "value-dim-tail-unwritten",
        paths.value_dim_tail_unwritten,
        "matches-reference",
        W(16, value_dim=80),
    ),
    # programs, heads, dispatch on the shapes
    entry(
        "program-index-int16",
        paths.program_index_int16,
        "matches-reference",
        W(4, n_queries=4100, heads=(8, 8), head_dim=4, value_dim=4),
    ),
    # gqa-mapping (SDPA-6.1) draws groups of 2-3 in quick; matches-reference meets the
    # Llama 3 70B anchor's groups of 8 on 8 key/value heads on every seed
    entry(
        "gqa-large-group-modulo",
        paths.gqa_large_group_modulo,
        "matches-reference",
        W(64, heads=(16, 2)),
    ),
    entry(
        "decode-path-ignores-mask",
        paths.decode_path_ignores_mask,
        "mask-polarity",
        per_element_padding(W(300, n_queries=1, batch=(3,))),
    ),
    entry(
        "large-batch-mask-from-first-element",
        paths.large_batch_mask_from_first_element,
        "matches-reference",
        per_element_padding(W(40, batch=(6,))),
    ),
    entry(
        "kv-buffer-truncates-at-2048",
        paths.kv_buffer_truncates_at_2048,
        "matches-reference",
        W(4097, n_queries=2),
    ),
    # extreme values
    entry(
        "padding-bias-read-as-mask",
        paths.padding_bias_read_as_mask,
        "matches-reference",
        padded_float16_rows(W(40)),
    ),
]
