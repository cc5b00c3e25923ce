"""The realistic strata's normal values answered from memory where a draw repeats
(conformance/draw/repeated_normals.py, issue 33): the same values and the same generator
state after them as the generator's own draw, so every example is the one drawn without
it (CONF-8: the same seed draws the same inputs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from attnspec.backends import Backend
from attnspec.conformance.draw.repeated_normals import (
    MIN_ELEMENTS,
    REPEATED_NORMALS,
    RepeatedNormals,
)
from attnspec.conformance.draw.strategies import random_values
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.reference import scaled_dot_product_attention

# (seed, shape) of each array drawn, then a few draws of other kinds from the same
# generator: repeats of one start, shapes sharing a start, arrays too large to keep
DRAWS = [
    (0, (2, 3, 64, 32)),
    (0, (2, 3, 64, 32)),
    (1, (1, 4, 100, 48)),
    (0, (2, 3, 64, 32)),
    (0, (1, 1, 8, 8)),  # below MIN_ELEMENTS: drawn every time
    (0, (3, 2, 64, 32)),
    (1, (1, 4, 100, 48)),
    (2, (1, 1, 512, 128)),  # larger than half the memo below: never kept
    (2, (1, 1, 512, 128)),
    (0, (3, 2, 64, 32)),
    (1, (1, 4, 100, 48)),
    (0, (2, 3, 64, 32)),
]


def _draws(standard_normal: object, generator: type = np.random.PCG64) -> list[object]:
    """Each draw of DRAWS from a fresh generator of its seed: q, k and v in turn, then a
    mask, an integer and the generator's state (what a later draw starts from)."""
    results: list[object] = []
    for seed, shape in DRAWS:
        rng = np.random.Generator(generator(seed))
        for _ in range(3):
            values = standard_normal(rng, shape)  # type: ignore[operator]
            results.append(np.array(values, copy=True))
        results += [rng.random((4, 7)) < 0.5, int(rng.integers(1 << 30))]
        results.append(repr(rng.bit_generator.state))
    return results


def _same(first: list[object], second: list[object]) -> bool:
    return len(first) == len(second) and all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for a, b in zip(first, second, strict=True)
    )


def test_a_repeated_draw_gives_the_generators_values_and_state() -> None:
    """CONF-8: every array, and every draw after it, is the generator's own, whether the
    draw was answered from memory or not; repeats are answered once kept (the second
    time a draw is seen), with least recently used values dropped past the memo's size."""
    memo = RepeatedNormals(max_bytes=2**20)
    plain = _draws(lambda rng, shape: rng.standard_normal(shape))
    assert _same(_draws(memo.standard_normal), plain)
    assert memo.hits > 0
    assert memo.held <= memo.max_bytes
    assert all(values.size >= MIN_ELEMENTS for values, _ in memo.kept.values())
    assert _same(_draws(memo.standard_normal), plain)  # a second pass, from memory


def test_other_bit_generators_are_drawn_every_time() -> None:
    """CONF-8: a generator on another bit generator is drawn from as it is (its state is
    not PCG64's): nothing kept, the same values."""
    memo = RepeatedNormals()
    plain = _draws(lambda rng, shape: rng.standard_normal(shape), np.random.MT19937)
    assert _same(_draws(memo.standard_normal, np.random.MT19937), plain)
    assert not memo.kept and memo.hits == 0


class _KeepsItsInput:
    """A draw target whose rounding hands back the very array it was given (float64 on a
    library that shares NumPy's memory): what random_values must not pass on when that
    array is a remembered draw."""

    def rounded(self, a: np.ndarray, dtype: str) -> np.ndarray:
        return a


@pytest.mark.parametrize("target", ["numpy, float16", "rounding that keeps its input"])
@pytest.mark.parametrize("magnitude", [1.0, 3.0])
def test_random_values_gives_its_caller_an_array_of_its_own(magnitude: float, target: str) -> None:
    """CONF-8: a realistic draw answered from memory is the array the generator gives,
    scaled and rounded as before, and writable by the caller without changing what a
    later draw gets (a property may write into its problem's arrays), whatever the
    target's rounding returns."""
    if target == "numpy, float16":
        kernel: Any = KernelUnderTest(scaled_dot_product_attention, Backend("numpy"))
        dtype = "float16"
    else:
        kernel, dtype = _KeepsItsInput(), "float64"
    shape = (1, 2, 64, 64)
    expected = (np.random.default_rng(5).standard_normal(shape) * magnitude).astype(dtype)
    hits = REPEATED_NORMALS.hits
    # a NumPy generator (not a ValueGenerator): drawn as in a realistic stratum
    drawn = [
        random_values(kernel, np.random.default_rng(5), shape, dtype, magnitude) for _ in range(3)
    ]
    assert REPEATED_NORMALS.hits > hits  # the third from memory
    for values in drawn:
        assert np.array_equal(values, expected.astype(np.float64))
        values[...] = np.nan  # the caller's own
