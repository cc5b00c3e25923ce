"""The values realistic strata draw besides N(0, 1), where real kernels break.

q/k: outlier channels (a few channels 20-100x larger, as in LLM activations) and scores
near float16's largest finite value.  Bias: ALiBi-like position biases and padding given
as an additive bias of -1e4, -1e9 or the dtype's most negative finite value, per batch
element.  Masks: per-batch-element padding, whole rows and batch elements included.
The builders are plain NumPy; the runner's stratum decides when they are drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from .sizes import LENGTHS, Dims, current

if TYPE_CHECKING:
    from ..call.problem import Problem
    from .target import DrawTarget

QK_KINDS = ("normal", "outlier channels", "large scores")
OUTLIER_FACTORS = (20.0, 50.0, 100.0)
# Largest |scaled score| of the "large scores" values: near float16's 65504, so a kernel
# that holds (unscaled) scores in float16 overflows (SDPA-7.2, SDPA-7.4).
LARGE_SCORES = (3e4, 6e4)
BIAS_KINDS = ("normal", "alibi", "padding")
MASK_KINDS = ("all", "padding", "random", "window", "causal")
WINDOW_SIDES = (0, 1, 3, 16, 63, 64, 128, 256)
LARGEST_FINITE = {
    "float16": 65504.0,
    "bfloat16": (2 - 2.0**-7) * 2.0**127,
    "float32": float(np.finfo(np.float32).max),
    "float64": float(np.finfo(np.float64).max),
}
# Every fill in every dtype: TOL-2 charges each key's score error by that key's own weight,
# so a padded key costs the bound nothing (spec/tolerance.md).  A fill beyond the dtype's
# range rounds to -inf, a masked key (-1e9 in float16).
FILLS = ("-1e4", "-1e9", "finfo.min")
# Option combinations every profile tries on every property that draws the options (where
# the kernel claims them), each as a stratum of its own: the corners real kernels get
# wrong, e.g. PyTorch 2.13's CPU flash kernel gives NaN rows for is_causal with scale 0.
COMBINATIONS: tuple[tuple[str, dict[str, object]], ...] = (
    ("causal with scale 0", {"causal": True, "scale": 0.0}),
    ("causal with a negative scale, GQA", {"causal": True, "scale": -0.75, "gqa": True}),
    (
        "padded batch of 128 heads, scale 0",
        {"mask": "padding", "scale": 0.0, "shape": "batched", "batch_heads": 128},
    ),
    ("padding bias with causal, GQA", {"bias": "padding", "causal": True, "gqa": True}),
    ("ALiBi bias in decode, GQA", {"bias": "alibi", "shape": "decode", "gqa": True}),
)


def fill_value(name: str, dtype: str) -> float:
    """The additive padding value ``name`` in ``dtype``: -inf where it is beyond the
    dtype's range (-1e9 in float16), as rounding it gives."""
    value = -LARGEST_FINITE[dtype] if name == "finfo.min" else float(name)
    return value if abs(value) <= LARGEST_FINITE[dtype] else -math.inf


def with_score_magnitude(kernel: DrawTarget, problem: Problem, limit: float) -> Problem:
    """q and k rescaled so that max |alpha| A_ij is about ``limit`` (SDPA-7.4 inputs).

    max|q| = max|k| = sqrt(limit / (|alpha| E)) bounds every product, partial sum and score
    by ``limit`` while keeping q and k of one size, so neither overflows its dtype.
    """
    if not np.any(problem.q) or not np.any(problem.k) or problem.scale == 0:
        return problem  # no score to make large
    head_dim = problem.q.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if problem.scale is None else abs(problem.scale)
    target = math.sqrt(limit / (scale * head_dim))
    q = problem.q * (target / np.max(np.abs(problem.q)))
    k = problem.k * (target / np.max(np.abs(problem.k)))
    return problem.with_(q=kernel.rounded(q, problem.dtype), k=kernel.rounded(k, problem.dtype))


def with_outlier_channels(
    kernel: DrawTarget,
    problem: Problem,
    rng: np.random.Generator,
    factor: float,
) -> Problem:
    """q and k with 1-3 of their channels (the same in both) ``factor`` times larger."""
    head_dim = problem.q.shape[-1]
    if head_dim == 0:
        return problem
    channels = rng.choice(head_dim, size=min(head_dim, int(rng.integers(1, 4))), replace=False)
    gain = np.ones(head_dim)
    gain[channels] = factor
    return problem.with_(
        q=kernel.rounded(problem.q * gain, problem.dtype),
        k=kernel.rounded(problem.k * gain, problem.dtype),
    )


def draw_qk_kind(data: st.DataObject) -> str:
    return data.draw(st.sampled_from(QK_KINDS), label="q/k values")


def with_qk_values(
    data: st.DataObject,
    kernel: DrawTarget,
    rng: np.random.Generator,
    problem: Problem,
    kind: str,
) -> Problem:
    """``problem`` with q/k values of ``kind``: outlier channels, or scores near float16's
    limit (q and k rescaled together); "normal" leaves it unchanged."""
    if kind == "outlier channels":
        factor = data.draw(st.sampled_from(OUTLIER_FACTORS), label="outlier factor")
        return with_outlier_channels(kernel, problem, rng, factor)
    if kind == "large scores":
        limit = data.draw(st.sampled_from(LARGE_SCORES), label="largest score")
        return with_score_magnitude(kernel, problem, limit)
    return problem


def alibi(dims: Dims) -> np.ndarray:
    """ALiBi-like biases -m_h |i + Lk - Lq - j| of shape (Hq, Lq, Lk), slopes
    m_h = 2^(-8 (h + 1) / Hq) (the last query aligned with the last key)."""
    heads = dims.n_q_heads
    slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / max(heads, 1))
    rows = np.arange(dims.n_queries)[:, None] + (dims.n_keys - dims.n_queries)
    distance = np.abs(rows - np.arange(dims.n_keys)[None, :])
    bias: np.ndarray = -slopes[:, None, None] * distance
    return bias


def draw_padding(data: st.DataObject, rng: np.random.Generator, dims: Dims) -> np.ndarray:
    """Kept positions of a padded batch, (*batch, 1, Lq or 1, Lk): each batch element
    keeps its own number of keys (0 included: a batch element padded entirely), and
    with queries padded too, rows past its number of queries keep no key."""
    n_keys, n_queries = dims.n_keys, dims.n_queries
    elements = math.prod(dims.batch)
    choices = [0, n_keys, *[n for n in LENGTHS if n < n_keys], *range(1, min(n_keys, 4))]
    kept_keys = rng.choice(choices, size=elements)
    padded_element = current().stratum.option("padded element") or data.draw(
        st.booleans(), label="a batch element padded entirely"
    )
    if elements and padded_element:
        kept_keys[rng.integers(elements)] = 0
    keys = np.arange(n_keys)[None, :] < kept_keys[:, None]  # (elements, Lk)
    kept = keys[:, None, None, :]
    if n_queries and data.draw(st.booleans(), label="queries padded too"):
        kept_queries = rng.integers(0, n_queries + 1, size=elements)
        rows = np.arange(n_queries)[None, :] < kept_queries[:, None]
        kept = kept & rows[:, None, :, None]
    return kept.reshape((*dims.batch, 1, kept.shape[-2], n_keys))


def draw_window(data: st.DataObject, sides: Sequence[int] = WINDOW_SIDES) -> tuple[int, int]:
    """(left, right) extents of a band mask."""
    return (
        data.draw(st.sampled_from(tuple(sides)), label="left"),
        data.draw(st.sampled_from(tuple(sides)), label="right"),
    )


def draw_bias_values(
    data: st.DataObject,
    kernel: DrawTarget,
    rng: np.random.Generator,
    dims: Dims,
    dtype: str,
    kind: str,
) -> np.ndarray:
    """A realistic bias of ``kind`` ("alibi" or "padding"), rounded to ``dtype``."""
    if kind == "alibi":
        return kernel.rounded(alibi(dims), dtype)
    kept = draw_padding(data, rng, dims)
    fill = fill_value(
        current().stratum.option("fill") or data.draw(st.sampled_from(FILLS), label="padding fill"),
        dtype,
    )
    inside: float | np.ndarray = 0.0
    if data.draw(st.booleans(), label="ALiBi inside the padding"):
        inside = alibi(dims)
    bias = np.where(kept, inside, fill)
    return kernel.rounded(bias, dtype)
