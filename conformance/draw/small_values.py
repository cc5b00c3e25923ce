"""Normal-like array values that Hypothesis draws element by element, so that they shrink.

In the small stratum an array takes its values from one Hypothesis draw of bytes, each
byte an index into :data:`VALUE_TABLE`.  The table holds the 256 quantiles of N(0, 1) at
probabilities (i + 1/2) / 256, so a generated array (uniform random bytes) is
normal-like, except that the quantile nearest each of :data:`SIMPLE_VALUES` is replaced
by that value (moving it by at most half the spacing of the quantiles there) and put
first: byte 0 is 0.0, then 1, -1, 0.5, -0.5, 2, ..., then the other quantiles by
increasing magnitude.  Hypothesis shrinks bytes towards 0 (and equal bytes together), so a
failing example shrinks towards arrays of zeros with the few simple values the failure
needs, which its reproduction shows as zeros and a few assignments.

An array of up to :data:`DRAWN_ELEMENTS` (256) elements draws a byte per element.  A
larger one draws 256 bytes and repeats them, each further block of 256 elements through
a permutation of the byte values (from the seeded NumPy generator; 0 stays 0), so that no
two blocks, heads or batch elements are copies of each other.  Its values depend on its
bytes, and are all zeros when they are: Hypothesis keeps them random while it shrinks the
sizes (zeroing them would lose the failure), and when the sizes drop to 256 elements or
fewer it replays the recorded bytes, the first ones used, so the smaller example still
has random values and still fails.  (Bytes a large array left unused would be zeroed
first, and every smaller example would start from zeros and pass.)

Why 256: a few hundred values (one head of 16 queries of 16 channels) is more than any
counterexample a person reads value by value, yet 94 % of the small stratum's arrays fit
(median 28 elements, in a quick check of the reference); and it bounds an example's
draws: at most 257 bytes an array, of the 8 KiB of choices Hypothesis allows an example.
Realistic strata keep the seeded generator (``strategies.random_values``): their arrays
are large and not read value by value.
"""

from __future__ import annotations

import functools
import math
import statistics
import zlib
from typing import Any

import numpy as np
from hypothesis import strategies as st

DRAWN_ELEMENTS = 256
#: what a failing example's values shrink to, simplest first (bytes 0, 1, 2, ...)
SIMPLE_VALUES = (0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.5, -1.5, 0.25, -0.25, 0.75, -0.75)


def _value_table() -> np.ndarray:
    """SIMPLE_VALUES, each in place of its nearest quantile, then the other quantiles of
    N(0, 1) by increasing magnitude (a positive one before its negative twin)."""
    normal = statistics.NormalDist()
    quantiles = [normal.inv_cdf((i + 0.5) / 256) for i in range(256)]
    rest = sorted(quantiles, key=lambda z: (abs(z), z < 0))
    for simple in SIMPLE_VALUES:
        rest.remove(min(rest, key=lambda z: abs(z - simple)))
    table = np.array([*SIMPLE_VALUES, *rest])
    table.flags.writeable = False
    return table


VALUE_TABLE = _value_table()


@functools.cache
def _array_bytes(at_least: int) -> st.SearchStrategy[bytes]:
    """``st.binary(min_size=at_least, max_size=DRAWN_ELEMENTS)``, made once per size: the
    same strategy, so the same bytes (making one cost ~18 us, and every array of the small
    stratum draws one; issue 33)."""
    return st.binary(min_size=at_least, max_size=DRAWN_ELEMENTS)


class ValueGenerator(np.random.Generator):
    """A NumPy generator seeded by a drawn integer (the same stream as
    ``np.random.default_rng(seed)``) that keeps the Hypothesis ``data`` it was drawn from,
    for :meth:`drawn_normal`."""

    def __init__(self, data: Any, seed: int) -> None:
        super().__init__(np.random.PCG64(seed))
        self.data = data
        self._arrays = 0

    def _draw_bytes(self, strategy: st.SearchStrategy[bytes]) -> bytes:
        """One array's bytes, under a span label of its own (the array's index here).
        Hypothesis's generator also runs examples made by copying a span over another of
        the same label; copying one array's bytes over another's repeats an example's
        sizes, mask and options, and such repeats crowded out new structures (16.0 distinct
        ones in 20 examples with one label, 17.9 with these, 17.6 with seeded values).
        ``conjecture_data`` is st.data()'s own engine object (semi-public); stand-ins for
        ``data`` (shape pools, tests) draw through their ``draw``."""
        self._arrays += 1
        conjecture = getattr(self.data, "conjecture_data", None)
        if conjecture is None:
            drawn: bytes = self.data.draw(strategy, label="values")
            return drawn
        label = zlib.crc32(f"attnspec array values {self._arrays}".encode())
        drawn = conjecture.draw(strategy, label=label)
        return drawn

    def drawn_normal(self, shape: tuple[int, ...]) -> np.ndarray:
        """Normal-like float64 values of ``shape`` whose bytes Hypothesis draws (see the
        module's docstring): a new array."""
        size = math.prod(shape)
        # at most 256 bytes whatever the size: bytes recorded for a larger array still fit
        # a smaller one (the first ones used), so shrinking the sizes keeps them
        at_least = min(size, DRAWN_ELEMENTS)
        drawn = self._draw_bytes(_array_bytes(at_least))
        indices = np.frombuffer(drawn, dtype=np.uint8)[:size]
        if size > DRAWN_ELEMENTS:
            blocks = math.ceil(size / DRAWN_ELEMENTS)
            relabel = np.zeros((blocks, 256), dtype=np.uint8)
            relabel[0] = np.arange(256)
            relabel[1:, 1:] = self.permuted(np.tile(np.arange(1, 256), (blocks - 1, 1)), axis=1)
            indices = relabel[np.arange(size) // DRAWN_ELEMENTS, np.resize(indices, size)]
        return VALUE_TABLE[indices].reshape(shape)
