"""The realistic-scale half of the catalogue (CONF-1, TOL-2), checked without the suite.

(a) Every bug of ``catalogue.scale`` is exact — within TOL-2 of the definition, bit for
    bit where it is not finite (SDPA-7.3, TOL-2, TOL-3) — on a seeded grid of small
    problems: Lq, Lk <= 24, E, Ev <= 16, up to 3 key/value heads and 3 heads per
    group, up to 3 batch elements, every dtype, masks with empty rows and NaN behind
    them, biases with -inf and finite padding entries, causal, explicit scales.  So a
    suite that draws only small problems cannot catch them: they need the realistic
    sizes their witnesses have (tests/catalogue/test_caught.py::test_bug_is_real).
(b) The correct tiled and split-KV kernels of ``catalogue.correct`` agree with the
    definition within TOL-2 at realistic sizes: 1023/1024/1025 and 4097 keys, head dims
    59, 111 and 256, a GQA group of 8, decode (Lq = 1), in float16, float32 and float64.

The bounds come from ``attnspec.conformance.judge.bounds.reference_bound`` (TOL-2 as the
reference computes it), never from a formula copied here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from attnspec.backends import Backend
from attnspec.conformance import declaration_of
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.judge.bounds import reference_bound
from attnspec.conformance.judge.kernel import KernelUnderTest
from catalogue.buggy import CATALOGUE
from catalogue.correct import split_kv_attention, tiled_attention, tiled_attention_bottom_right
from catalogue.entry import BuggyKernel
from catalogue.scale import SCALE_CATALOGUE
from catalogue.witness import difference_outside_tol2

DTYPES = ("float16", "float32", "float64")
SMALL_PROBLEMS = 160
FLOAT16_MIN = float(np.finfo(np.float16).min)


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.astype(dtype).astype(np.float64)


def _small_mask(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A random mask of a shape that broadcasts to ``shape``, sometimes with empty rows."""
    *batch, n_heads, n_queries, n_keys = shape
    kind = rng.integers(3)
    if kind == 0:  # per batch element and head
        mask_shape = shape
    elif kind == 1:  # key padding, per batch element
        mask_shape = (*batch, 1, 1, n_keys)
    else:  # shared by the batch
        mask_shape = (n_heads, n_queries, n_keys)
    mask = rng.random(mask_shape) < 0.7
    if n_queries and mask_shape[-2] == n_queries and rng.random() < 0.5:
        mask[..., 0, :] = False  # an empty row (SDPA-5.1)
    return mask


def _small_bias(
    rng: np.random.Generator, shape: tuple[int, ...], *, finite_padding: bool
) -> np.ndarray:
    """N(0, 3) scores bias with some keys padded: -inf (excluded, SDPA-3.3) or, with
    ``finite_padding``, a large finite value (-1e4, finfo(float16).min) that leaves the
    key a weight of ~0.  Key 0 is never padded, so a row the causal rule leaves a key
    keeps an unpadded one: a row with only finitely padded keys is a value extreme
    (a realistic-scale trigger), not a small problem."""
    bias = rng.standard_normal(shape[-2:]) * 3.0
    if shape[-1] > 1 and rng.random() < 0.5:
        padded = rng.random(shape[-1]) < 0.3
        padded[0] = False
        fills = [-np.inf, -1e4, FLOAT16_MIN] if finite_padding else [-np.inf]
        bias[:, padded] = rng.choice(fills)
    return bias


def small_problem(rng: np.random.Generator) -> Problem:
    """A random problem inside the small envelope, values rounded to its dtype."""
    batch = () if rng.random() < 0.3 else (int(rng.integers(1, 4)),)
    n_kv, group = (int(n) for n in rng.integers(1, 4, size=2))
    n_q, n_k = (
        int(n) for n in rng.choice([0, 1, 2, 7, 16, 23, 24, *rng.integers(0, 25, 3)], size=2)
    )
    e, ev = (int(n) for n in rng.integers(1, 17, size=2))
    dtype = str(rng.choice(DTYPES))
    magnitude = float(rng.choice([0.1, 1.0, 3.0]))
    q = rng.standard_normal((*batch, n_kv * group, n_q, e)) * magnitude
    k = rng.standard_normal((*batch, n_kv, n_k, e)) * magnitude
    v = rng.standard_normal((*batch, n_kv, n_k, ev))
    scores_shape = (*batch, n_kv * group, n_q, n_k)
    mask = _small_mask(rng, scores_shape) if rng.random() < 0.5 else None
    if mask is not None and n_k and rng.random() < 0.3:
        mask = np.array(np.broadcast_to(mask, scores_shape))
        mask[..., 0] = False  # key 0 masked for every query, its values NaN (SDPA-8.2)
        v[..., 0, :] = np.nan
    return Problem(
        q=_rounded(q, dtype),
        k=_rounded(k, dtype),
        v=_rounded(v, dtype),
        dtype=dtype,
        mask=mask,
        bias=(
            _rounded(_small_bias(rng, scores_shape, finite_padding=mask is None), dtype)
            if rng.random() < 0.5
            else None
        ),
        is_causal=bool(rng.random() < 0.4),
        scale=float(rng.choice([0.5, -0.75, 0.0])) if rng.random() < 0.2 else None,
    )


@pytest.fixture(scope="module")
def small_problems() -> list[Problem]:
    rng = np.random.default_rng(7)
    return [small_problem(rng) for _ in range(SMALL_PROBLEMS)]


@pytest.fixture(scope="module")
def small_bounds() -> dict[tuple[int, str], Any]:
    """TOL-2 bounds by (problem index, causal alignment), computed once for every bug."""
    return {}


def test_small_problems_cover_the_envelope(small_problems: list[Problem]) -> None:
    """The grid reaches the envelope's corners, or exactness there would be untested."""
    assert max(p.q.shape[-2] for p in small_problems) == 24
    assert max(p.k.shape[-2] for p in small_problems) == 24
    assert max(p.q.shape[-1] for p in small_problems) == 16
    assert max(p.q.shape[-3] // p.k.shape[-3] for p in small_problems) == 3
    assert {p.dtype for p in small_problems} == set(DTYPES)
    assert any(p.is_causal and p.mask is not None and p.bias is not None for p in small_problems)


def _beyond_the_small_envelope(w: Problem) -> list[str]:
    """What makes a witness realistic: a size past the small grid's, or a value extreme."""
    batch = np.broadcast_shapes(w.q.shape[:-3], w.k.shape[:-3], w.v.shape[:-3])
    found = [
        name
        for name, size, small in (
            ("Lq", w.q.shape[-2], 24),
            ("Lk", w.k.shape[-2], 24),
            ("E", w.q.shape[-1], 16),
            ("Ev", w.v.shape[-1], 16),
            ("group", w.q.shape[-3] // w.k.shape[-3], 3),
            ("batch", math.prod(batch), 3),
        )
        if size > small
    ]
    if w.bias is not None and w.mask is None and (w.bias == FLOAT16_MIN).all(axis=-1).any():
        found.append("a row padded entirely with finfo.min")
    return found


def test_scale_catalogue_is_large_with_realistic_witnesses() -> None:
    """CONF-1: at least 15 scale bugs, each with a witness outside the small
    envelope that the exactness test below covers."""
    assert len(SCALE_CATALOGUE) >= 15
    small = [bug.name for bug in SCALE_CATALOGUE if not _beyond_the_small_envelope(bug.witness)]
    assert not small, f"witnesses inside the small envelope: {small}"


@pytest.mark.parametrize("bug", SCALE_CATALOGUE, ids=lambda bug: bug.name)
def test_scale_bug_is_exact_on_small_problems(
    bug: BuggyKernel,
    small_problems: list[Problem],
    small_bounds: dict[tuple[int, str], Any],
) -> None:
    """SDPA-7.3/TOL-2: the bug cannot show below realistic sizes — each of 160 small
    problems is within TOL-2 of the definition (non-finite outputs bit for bit)."""
    kernel = KernelUnderTest(bug.fn, Backend("numpy"))
    alignment = kernel.declaration.causal_alignment
    for index, problem in enumerate(small_problems):
        if (index, alignment) not in small_bounds:
            small_bounds[index, alignment] = reference_bound(problem, kernel.declaration)
        bound = small_bounds[index, alignment]
        difference = difference_outside_tol2(
            kernel.output(problem), np.asarray(bound.out), np.asarray(bound.out_tolerance)
        )
        assert difference is None, f"{bug.name} on {problem.describe()}: {difference}"


# The catalogue's small-scale versions of the same bugs (key blocks of 3, query blocks of
# 4, h % Hkv for every group): if the grid is exact for the scale bugs, it is not blind.
SMALL_ANALOGUES = (
    "online-softmax-drops-tail",
    "online-softmax-no-rescale",
    "query-tail-block-skipped",
    "gqa-h-mod-Hkv",
)


@pytest.mark.parametrize("name", SMALL_ANALOGUES)
def test_small_problems_catch_the_small_scale_analogues(
    name: str,
    small_problems: list[Problem],
    small_bounds: dict[tuple[int, str], Any],
) -> None:
    """SDPA-7.3: the same grid finds the tiling and head-mapping bugs when their block
    sizes or thresholds are small, so its silence on the scale bugs means exactness."""
    bug = next(b for b in CATALOGUE if b.name == name)
    kernel = KernelUnderTest(bug.fn, Backend("numpy"))
    alignment = kernel.declaration.causal_alignment
    found = 0
    for index, problem in enumerate(small_problems):
        if (index, alignment) not in small_bounds:
            small_bounds[index, alignment] = reference_bound(problem, kernel.declaration)
        bound = small_bounds[index, alignment]
        found += (
            difference_outside_tol2(
                kernel.output(problem), np.asarray(bound.out), np.asarray(bound.out_tolerance)
            )
            is not None
        )
    assert found >= 10, f"{name} differs from the definition on only {found} small problems"


# --- correct tiled and split-KV kernels at realistic sizes ------------------------------


def _realistic(
    rng: np.random.Generator,
    dtype: str,
    *,
    n_queries: int,
    n_keys: int,
    head_dim: int,
    value_dim: int,
    heads: tuple[int, int],
    batch: tuple[int, ...],
    is_causal: bool = False,
    padded: bool = False,
) -> Problem:
    """Random values at a realistic size; ``padded`` adds per-batch key padding as a
    boolean mask and an additive -1e4 bias on further keys (HF-style)."""
    n_q_heads, n_kv_heads = heads
    q = rng.standard_normal((*batch, n_q_heads, n_queries, head_dim))
    k = rng.standard_normal((*batch, n_kv_heads, n_keys, head_dim))
    v = rng.standard_normal((*batch, n_kv_heads, n_keys, value_dim))
    mask = bias = None
    if padded:
        lengths = rng.integers(n_keys // 2, n_keys + 1, size=batch)
        mask = np.arange(n_keys) < lengths[..., None, None, None]
        bias = np.where(
            rng.random((n_queries, n_keys)) < 0.1, -1e4, rng.standard_normal((n_queries, n_keys))
        )
    return Problem(
        q=_rounded(q, dtype),
        k=_rounded(k, dtype),
        v=_rounded(v, dtype),
        dtype=dtype,
        mask=mask,
        bias=None if bias is None else _rounded(bias, dtype),
        is_causal=is_causal,
    )


# (why the entries look alike: a table of named shapes, each read as a whole)
REALISTIC: dict[str, dict[str, Any]] = {
    "Lk1023-E59-padded": dict(
        n_queries=20, n_keys=1023, head_dim=59, value_dim=24, heads=(2, 2), batch=(2,), padded=True
    ),
    "Lk1024-E111-causal": dict(
        n_queries=70,
        n_keys=1024,
        head_dim=111,
        value_dim=32,
        heads=(2, 1),
        batch=(1,),
        is_causal=True,
    ),
    "Lk1025-E256-gqa8": dict(
        n_queries=9, n_keys=1025, head_dim=256, value_dim=16, heads=(8, 1), batch=(1,)
    ),
    "decode-Lk4097-gqa8-causal": dict(
        n_queries=1,
        n_keys=4097,
        head_dim=128,
        value_dim=64,
        heads=(8, 1),
        batch=(2,),
        is_causal=True,
        padded=True,
    ),
    "113x203-causal": dict(
        n_queries=113,
        n_keys=203,
        head_dim=80,
        value_dim=80,
        heads=(3, 3),
        batch=(1,),
        is_causal=True,
    ),
}
TILED_KERNELS: list[Callable[..., Any]] = [
    tiled_attention,
    tiled_attention_bottom_right,
    split_kv_attention,
]


def _realistic_cases() -> Iterator[Any]:
    for name in REALISTIC:
        for dtype in DTYPES:
            yield pytest.param(name, dtype, id=f"{name}-{dtype}")


@pytest.mark.parametrize(("case", "dtype"), list(_realistic_cases()))
def test_tiled_and_split_kv_kernels_conform_at_realistic_sizes(case: str, dtype: str) -> None:
    """SDPA-7.3/TOL-2, SDPA-4.1/4.2, SDPA-6.1: at sizes that take several query blocks,
    several key blocks with a ragged tail, several split-KV chunks, wide and odd head
    dims and GQA groups of 8, every correct tiled and split-KV kernel is within TOL-2
    of the definition (in its declared causal alignment)."""
    problem = _realistic(np.random.default_rng(11), dtype, **REALISTIC[case])
    bounds: dict[str, Any] = {}
    for fn in TILED_KERNELS:
        kernel = KernelUnderTest(fn, Backend("numpy"))
        alignment = declaration_of(fn).causal_alignment
        if alignment not in bounds:
            bounds[alignment] = reference_bound(problem, kernel.declaration)
        bound = bounds[alignment]
        difference = difference_outside_tol2(
            kernel.output(problem), np.asarray(bound.out), np.asarray(bound.out_tolerance)
        )
        assert difference is None, f"{fn.__name__} on {problem.describe()}: {difference}"
