"""Realistic strata's normal values, remembered by the generator state they are drawn from.

Why: every property starts each stratum with Hypothesis's simplest example, whose values
seed is the smallest, so the first example of a stratum draws the same q, k and v values
in every property that draws a problem there.  In a quick check of the NumPy reference,
898 of the 2187 realistic ``standard_normal`` draws (212 of 287 million values, 2.1 of the
2.9 CPU-s they took) repeated an earlier draw (issue 33).

The memo is exact: ``Generator.standard_normal(shape)`` is a function of the bit
generator's state and the shape, and leaves the bit generator in a state that is a
function of the same two; a repeated draw returns the values the first one drew and puts
the generator in the state that draw left it in, so every later draw from it (masks,
shuffles, the next array) is what it would have been.  Only PCG64 generators (those of
``default_rng`` and :class:`~.small_values.ValueGenerator`) are remembered.  A draw is kept
the second time its (state, shape) is seen, not the first: most draws are never repeated,
and keeping them would push the repeated ones out.  Kept values are read-only, so a caller
that wrote into them would fail loudly instead of changing a later draw.  At most
:data:`MAX_BYTES` of values are kept, least recently used first out.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import numpy as np

# the realistic strata's arrays that repeat in a quick check fit (two of 24 MiB among them)
MAX_BYTES = 64 * 2**20
# smaller draws cost less than looking them up
MIN_ELEMENTS = 4096
# the (state, shape) pairs seen once, remembered to know a repeat: a key each
MAX_SEEN = 16384


class RepeatedNormals:
    """``rng.standard_normal(shape)``, a repeat answered from memory (see the module doc)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.seen: OrderedDict[Hashable, None] = OrderedDict()
        self.kept: OrderedDict[Hashable, tuple[np.ndarray, Any]] = OrderedDict()
        self.held = 0
        self.hits = 0

    def standard_normal(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """N(0, 1) float64 values of ``shape`` from ``rng``, as ``rng.standard_normal(shape)``
        draws them; read-only where remembered."""
        bit_generator = rng.bit_generator
        size = math.prod(shape)
        if type(bit_generator) is not np.random.PCG64 or not (
            MIN_ELEMENTS <= size and 8 * size <= self.max_bytes // 2
        ):
            return rng.standard_normal(shape)
        state = bit_generator.state
        inner = state["state"]
        key = (inner["state"], inner["inc"], state["has_uint32"], state["uinteger"], shape)
        found = self.kept.get(key)
        if found is not None:
            self.kept.move_to_end(key)
            self.hits += 1
            values, after = found
            bit_generator.state = after
            return values
        values = rng.standard_normal(shape)
        if key in self.seen:
            del self.seen[key]
            self._keep(key, values, bit_generator.state)
        else:
            self.seen[key] = None
            if len(self.seen) > MAX_SEEN:
                self.seen.popitem(last=False)
        return values

    def _keep(self, key: Hashable, values: np.ndarray, after: Any) -> None:
        values.flags.writeable = False
        self.kept[key] = (values, after)
        self.held += values.nbytes
        while self.held > self.max_bytes:
            _, (dropped, _) = self.kept.popitem(last=False)
            self.held -= dropped.nbytes


#: the memo of this process's draws (a judging worker's, or the check's own in-process)
REPEATED_NORMALS = RepeatedNormals()
