"""A small problem's values are drawn by Hypothesis a byte per element
(conformance/element_values.py), so that a failure of matches-reference (SDPA-7.3) shrinks
to zeros and a few simple values, shown as short literals in its reproduction."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import pytest
from support import verdict_of

import attnspec
from attnspec.backends import Backend
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.draw import sizes
from attnspec.conformance.draw.small_values import (
    DRAWN_ELEMENTS,
    SIMPLE_VALUES,
    VALUE_TABLE,
    ValueGenerator,
)
from attnspec.conformance.draw.strategies import random_values
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.reproduce import snippet
from attnspec.conformance.judge.verdict import FAILED, Verdict


class GivenBytes:
    """Stands in for Hypothesis's ``data``: every draw answers ``drawn``."""

    def __init__(self, drawn: bytes) -> None:
        self.drawn = drawn

    def draw(self, strategy: Any, label: str | None = None) -> bytes:
        return self.drawn


class NoDraws:
    """Stands in for Hypothesis's ``data`` where nothing may be drawn."""

    def draw(self, strategy: Any, label: str | None = None) -> bytes:
        raise AssertionError(f"drew {label}")


def test_value_table_is_normal_with_simple_values_first() -> None:
    """SDPA-7.3: generated values are normal-like: the table, sorted, is the 256 quantiles
    of N(0, 1) at (i + 1/2) / 256, each within half the quantiles' spacing there (a simple
    value stands in for its nearest quantile); byte 0 is 0.0, the simple values come
    first, then the other quantiles by increasing magnitude."""
    normal = statistics.NormalDist()
    quantiles = np.array([normal.inv_cdf((i + 0.5) / 256) for i in range(256)])
    assert np.all(np.abs(np.sort(VALUE_TABLE) - quantiles) <= np.gradient(quantiles) / 2)
    assert VALUE_TABLE[0] == 0.0
    assert tuple(VALUE_TABLE[: len(SIMPLE_VALUES)]) == SIMPLE_VALUES
    assert np.all(np.diff(np.abs(VALUE_TABLE[len(SIMPLE_VALUES) :])) >= 0)


def test_a_small_array_takes_a_byte_per_element() -> None:
    """SDPA-7.3: up to 256 elements, element i is VALUE_TABLE[byte i] (bytes past the
    array's size are left unused)."""
    drawn = bytes(range(7, 7 + 30))
    values = ValueGenerator(GivenBytes(drawn), 0).drawn_normal((2, 3, 4))
    np.testing.assert_array_equal(values.ravel(), VALUE_TABLE[list(drawn[:24])])


def test_a_large_array_repeats_its_bytes_through_permutations() -> None:
    """SDPA-7.3: past 256 elements each further block of 256 reuses the bytes through a
    permutation of the byte values that keeps 0: zero bytes give zeros everywhere (so
    Hypothesis keeps the bytes of a failing large example random while it shrinks its
    sizes), other bytes give blocks that are no copies of each other."""
    size = 3 * DRAWN_ELEMENTS + 10
    zeros = ValueGenerator(GivenBytes(bytes(DRAWN_ELEMENTS)), 5).drawn_normal((size,))
    assert not zeros.any()
    drawn = bytes(np.random.default_rng(1).integers(1, 256, DRAWN_ELEMENTS, dtype=np.uint8))
    values = ValueGenerator(GivenBytes(drawn), 5).drawn_normal((size,))
    np.testing.assert_array_equal(values[:DRAWN_ELEMENTS], VALUE_TABLE[list(drawn)])
    blocks = [values[i : i + 10] for i in range(0, size, DRAWN_ELEMENTS)]
    assert all(block.all() for block in blocks)
    assert len({block.tobytes() for block in blocks}) == len(blocks)


def clips_queries(q, k, v, *, mask=None, is_causal=False, scale=None):
    """Quantises q to a fixed range of +-1.2 (int8-style with a fixed scale): a query
    element beyond it saturates."""
    return attnspec.scaled_dot_product_attention(
        np.clip(q, -1.2, 1.2), k, v, mask=mask, is_causal=is_causal, scale=scale
    )


def ignores_last_key(q, k, v, *, mask=None, is_causal=False, scale=None):
    """Drops the last key of every row (an off-by-one loop bound) when there are two."""
    if k.shape[-2] < 2:
        return attnspec.scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=is_causal, scale=scale
        )
    mask = None if mask is None else mask[..., :-1]
    return attnspec.scaled_dot_product_attention(
        q, k[..., :-1, :], v[..., :-1, :], mask=mask, is_causal=is_causal, scale=scale
    )


def input_lines(reproduction: str) -> list[str]:
    """The lines of a reproduction snippet that rebuild the problem: its literals and the
    assignments of a sparse array's nonzero values."""
    lines = reproduction.splitlines()
    start = lines.index("problem = Problem(")
    end = next(i for i, line in enumerate(lines) if line.startswith("    extra="))
    while lines[end + 1].startswith("problem."):
        end += 1
    return lines[start : end + 1]


def rebuilt_problem(reproduction: str) -> Problem:
    """The problem a reproduction snippet rebuilds."""
    scope: dict[str, Any] = {"np": np, "Problem": Problem, "nan": np.nan, "inf": np.inf}
    exec("\n".join(input_lines(reproduction)), scope)
    problem: Problem = scope["problem"]
    return problem


@pytest.fixture(scope="module")
def shrunk() -> dict[str, tuple[Verdict, Problem]]:
    """matches-reference's shrunk failure of each kernel (quick profile, derandomised)."""
    verdicts = {
        fn.__name__: verdict_of("matches-reference", fn) for fn in (clips_queries, ignores_last_key)
    }
    return {
        name: (verdict, rebuilt_problem(verdict.reproduction)) for name, verdict in verdicts.items()
    }


@pytest.mark.parametrize("name", ["clips_queries", "ignores_last_key"])
def test_a_failure_shrinks_to_zeros_and_few_values(
    shrunk: dict[str, tuple[Verdict, Problem]], name: str
) -> None:
    """SDPA-7.3: the shrunk counterexample's q, k and v are mostly zeros with at most two
    other values each (seeded normal values were all distinct), and the reproduction
    rebuilds them in short lines: zeros and an assignment per nonzero value."""
    verdict, problem = shrunk[name]
    assert verdict.status == FAILED
    values = np.concatenate([a.ravel() for a in (problem.q, problem.k, problem.v)])
    assert np.mean(values == 0) >= 0.5
    for a in (problem.q, problem.k, problem.v):
        assert len(set(a.ravel().tolist()) - {0.0}) <= 2
    source = input_lines(verdict.reproduction)
    assert all(len(line) < 100 for line in source)
    assert sum(line.startswith("problem.") for line in source) <= 6


def test_a_structural_failure_shrinks_to_simple_values(
    shrunk: dict[str, tuple[Verdict, Problem]],
) -> None:
    """SDPA-7.3: a bug that any nonzero values show (a dropped key) shrinks to values of
    SIMPLE_VALUES only (0, 1, -1, 0.5, ...), in a few elements."""
    _, problem = shrunk["ignores_last_key"]
    values = np.concatenate([a.ravel() for a in (problem.q, problem.k, problem.v)])
    assert set(values.tolist()) <= set(SIMPLE_VALUES)
    assert values.size <= 12


def test_a_shrunk_failure_is_reproducible(shrunk: dict[str, tuple[Verdict, Problem]]) -> None:
    """SDPA-7.3: a derandomised run finds and shrinks to the same counterexample again."""
    again = verdict_of("matches-reference", ignores_last_key)
    assert again.reproduction == shrunk["ignores_last_key"][0].reproduction


def test_a_sparse_input_is_rebuilt_exactly() -> None:
    """SDPA-7.3: the reproduction's zeros-and-assignments form rebuilds every value bit for
    bit: nonzero values, NaN, and -0.0 (an array holding one keeps its literal)."""
    q = np.zeros((1, 3, 4))
    q[0, 2, 1], q[0, 0, 3] = 1.2197265625, -np.inf
    k = np.zeros((1, 5, 4))
    k[0, 4, 0] = np.nan
    v = np.zeros((1, 5, 2))
    v[0, 1, 1] = -0.0
    problem = Problem(q=q, k=k, v=v, dtype="float16", bias=np.full((3, 5), 0.5))
    kernel = KernelUnderTest(ignores_last_key, Backend("numpy"))
    reproduction = snippet(problem, kernel)
    rebuilt = rebuilt_problem(reproduction)
    for name in ("q", "k", "v", "bias"):
        expected, got = getattr(problem, name), getattr(rebuilt, name)
        assert got.tobytes() == expected.tobytes() and got.shape == expected.shape
    source = "\n".join(input_lines(reproduction))
    assert "q=np.zeros((1, 3, 4)" in source and "v=np.array(" in source
    assert "bias=np.full((3, 5), 0.5" in source


def test_realistic_strata_keep_the_seeded_generator() -> None:
    """SDPA-7.3: a realistic stratum's values are the seeded generator's normal values (as
    np.random.default_rng(seed) gives them), drawing nothing from Hypothesis; the small
    stratum's come from the drawn bytes."""
    kernel = KernelUnderTest(ignores_last_key, Backend("numpy"))
    with sizes.drawing(sizes.Stratum("realistic", 1, max_cost=10**6)):
        values = random_values(kernel, ValueGenerator(NoDraws(), 7), (3, 4), "float64")
    np.testing.assert_array_equal(values, np.random.default_rng(7).standard_normal((3, 4)))
    drawn = bytes(range(1, 13))
    small = random_values(kernel, ValueGenerator(GivenBytes(drawn), 7), (3, 4), "float64")
    np.testing.assert_array_equal(small.ravel(), VALUE_TABLE[list(drawn)])
