"""Hypothesis's bytes choices made without its bookkeeping per byte: the same bytes.

Every array of the small stratum takes its values from one bytes choice of up to 256 bytes
(conformance/draw/small_values.py), and Hypothesis's own generator
(``HypothesisProvider.draw_bytes``) makes such a choice a byte at a time through
``utils.many``: per byte, a continue-or-stop boolean that goes through
``ConjectureData.draw_boolean`` (pooled constraints, checks, a forced value while below
the minimum size) and then one ``random.randbytes(1)``.  None of those booleans is
recorded (``observe=False``): what they leave is the bytes and the state of the provider's
``random``.  That bookkeeping was ~5 % of a property run of the catalogue's correct
kernels (issue 33).  :func:`quick_draw_bytes` makes the same calls of the provider's
``random`` in the same order (a ``random()`` against the same continue probability where
``many`` draws an unforced boolean, a ``randbytes(1)`` per byte; the bytes below the
minimum size, which no boolean precedes, as one ``getrandbits`` of as many 32-bit words),
so it returns the same bytes and leaves ``random`` in the same state: the same examples,
shrinks and verdicts.

:func:`quick_bytes` puts it in place of Hypothesis's method while one of the runner's
Hypothesis runs runs (as ``hypothesis_constants.no_local_constants`` swaps its names), and
only where it agrees with the installed Hypothesis: :func:`agrees_with_hypothesis`
compares the two, once per process, on a few sizes and seeds (bytes and the ``random``
state after); a Hypothesis that draws bytes otherwise (or lacks a name used here) keeps its
own method: slower, the same examples.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from random import Random
from typing import Any

from hypothesis.internal.conjecture import providers

from .hypothesis_constants import no_local_constants

try:  # private names of Hypothesis (checked against 6.170): none is needed to run
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.internal.conjecture.utils import _calc_p_continue
except ImportError:  # pragma: no cover - another Hypothesis: its own method is used
    ConjectureData = None  # type: ignore[assignment,misc]
    _calc_p_continue = None  # type: ignore[assignment]

_PROVIDER = getattr(providers, "HypothesisProvider", None)
_OWN = getattr(_PROVIDER, "draw_bytes", None)
# the sizes the check compares: the small stratum's (1 to 256 bytes of at most 256; 256 of
# 256 for a larger array), an empty minimum, a minimum near the maximum (often stopped by
# it) and exact sizes
_CHECKED_SIZES = ((0, 256), (1, 256), (7, 256), (28, 256), (62, 64), (0, 8), (5, 5), (16, 16))


@functools.cache
def _continue_probability(min_size: int, max_size: int) -> float:
    """``utils.many``'s continue probability for a bytes choice of ``min_size`` to
    ``max_size`` bytes, with the average size HypothesisProvider.draw_bytes asks for (a
    numerical search: computed once per sizes, as ``many`` computes it on every choice)."""
    average_size = min(max(min_size * 2, min_size + 5), 0.5 * (min_size + max_size))
    return float(_calc_p_continue(average_size - min_size, max_size - min_size))


def quick_draw_bytes(self: Any, min_size: int = 0, max_size: int = 8 * 1024) -> bytes:
    """``HypothesisProvider.draw_bytes(min_size, max_size)``: the same bytes, from the same
    calls of the provider's ``random`` (the module's docstring).  The first ``min_size``
    bytes are drawn with no boolean (``many`` forces those to continue), then each further
    byte after a ``random() < p`` that says continue, none past ``max_size`` (forced stop);
    a probability of 0 or 1 decides without ``random``, as the provider's draw_boolean."""
    constant = self._maybe_draw_constant("bytes", {"min_size": min_size, "max_size": max_size})
    if constant is not None:
        return constant  # type: ignore[no-any-return]
    randbytes = self._random.randbytes
    drawn = _first_bytes(self._random, min_size)
    if min_size == max_size:
        return bytes(drawn)
    p = _continue_probability(min_size, max_size)
    if p <= 0:
        return bytes(drawn)
    random = self._random.random
    for _ in range(max_size - min_size):
        if p < 1 and not random() < p:
            break
        drawn += randbytes(1)
    return bytes(drawn)


def _first_bytes(random: Random, count: int) -> bytearray:
    """``count`` calls of ``random.randbytes(1)`` in one: each is ``getrandbits(8)``, the top
    byte of the generator's next 32-bit word, and ``getrandbits(32 * count)`` is the next
    ``count`` words, the first in the lowest bits; so the same bytes and the same state
    after (~2 us for 28 bytes, not ~15: a small array's bytes, issue 33)."""
    if count == 0:
        return bytearray()
    return bytearray(random.getrandbits(32 * count).to_bytes(4 * count, "little")[3::4])


def _drawn_by(method: Any, seed: int) -> tuple[list[bytes], Any]:
    """The bytes ``method`` draws, as a fresh ConjectureData's provider from ``Random(seed)``,
    for each of _CHECKED_SIZES in turn, and the state it leaves that ``Random`` in."""
    random = Random(seed)
    data = ConjectureData(random=random)
    try:
        drawn = [method(data.provider, *sizes) for sizes in _CHECKED_SIZES for _ in range(4)]
        return drawn, random.getstate()
    finally:
        data.freeze()


@functools.cache
def agrees_with_hypothesis() -> bool:
    """Whether :func:`quick_draw_bytes` draws what the installed Hypothesis's own method
    draws and leaves its ``random`` as it does, on _CHECKED_SIZES from two seeds (once per
    process, ~2 ms; False where a name it needs is missing)."""
    if _OWN is None or ConjectureData is None or _calc_p_continue is None:
        return False
    try:
        with no_local_constants():  # as the runs draw (and no scan of the local modules)
            return all(_drawn_by(quick_draw_bytes, s) == _drawn_by(_OWN, s) for s in (0, 1))
    except Exception:  # another Hypothesis's internals: its own method is used
        return False


@contextmanager
def quick_bytes() -> Iterator[None]:
    """HypothesisProvider.draw_bytes is :func:`quick_draw_bytes` while this is entered,
    where the two agree (:func:`agrees_with_hypothesis`); Hypothesis's own once left."""
    if not agrees_with_hypothesis():
        yield
        return
    saved = _PROVIDER.__dict__["draw_bytes"]
    _PROVIDER.draw_bytes = quick_draw_bytes  # type: ignore[union-attr]
    try:
        yield
    finally:
        _PROVIDER.draw_bytes = saved  # type: ignore[union-attr]
