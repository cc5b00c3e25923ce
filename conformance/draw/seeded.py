"""Draws answered from a seed outside any Hypothesis test (:class:`SeededDraws`), and the
pools of one run built from them (:class:`ShapePool`, see :mod:`.shape_pool`): the same
members in every worker process, whatever order the properties run in."""

from __future__ import annotations

import copy
import functools
import random
import zlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # imported where drawn: a kernel's own process imports this module too
    from hypothesis import strategies as st

T = TypeVar("T", bound=Hashable)


@functools.cache
def _seeded_provider() -> Any:
    """Hypothesis's generator, less its habit of answering 1 in 20 number draws with a
    constant found in the source of the modules imported so far: which those are depends
    on what the process has done, and a seeded draw must not (every worker, and every
    point of a run, must draw the same pool members and tied options)."""
    from hypothesis.internal.conjecture.providers import HypothesisProvider

    class WithoutSourceConstants(HypothesisProvider):
        def _maybe_draw_constant(self, *args: Any, **kwargs: Any) -> None:
            return None

    return WithoutSourceConstants


class SeededDraws:
    """Stands in for Hypothesis's ``data`` while a pool member is drawn: the same draws,
    answered by Hypothesis's own generator outside any test, from a seeded random source,
    or (``seed`` None) each the simplest choice, as in the first example Hypothesis runs.
    The drawing code sees it and does not pool again."""

    def __init__(self, seed: int | None) -> None:
        # Hypothesis's engine, not its public API: tests/conformance/test_shape_pool.py pins it
        from hypothesis.internal.conjecture.choice import ChoiceTemplate
        from hypothesis.internal.conjecture.data import ConjectureData

        self._data = (
            ConjectureData.for_choices([ChoiceTemplate("simplest", count=None)])
            if seed is None
            else ConjectureData(random=random.Random(seed), provider=_seeded_provider())
        )

    def draw(self, strategy: st.SearchStrategy[Any], label: str | None = None) -> Any:
        from hypothesis.control import BuildContext

        # a context of its own: some strategies record what they build in the current one
        with BuildContext(self._data, wrapped_test=self.draw):
            return self._data.draw(strategy)


@dataclass
class ShapePool:
    """The pools of one run (see :mod:`.shape_pool`); ``seed`` is the run's (None:
    derandomised).  Members are cached per process: computing them again gives the same
    ones."""

    seed: int | None
    # sorted pools by (key, count); the members made so far by key, in seed order
    _members: dict[tuple[Hashable, ...], list[Any]] = field(default_factory=dict)
    _made: dict[tuple[Hashable, ...], list[Any]] = field(default_factory=dict)
    # the seeded answers of tied draws by their key: the same key always draws the same
    # value, and a run makes ~13k tied draws of ~1k keys
    _tied: dict[str, Any] = field(default_factory=dict)

    def tied(self, key: str, strategy: st.SearchStrategy[Any], label: str) -> Any:
        """The seeded draw of ``strategy`` fixed by ``key`` (a copy: callers may change it)."""
        if key not in self._tied:
            self._tied[key] = SeededDraws(zlib.crc32(key.encode())).draw(strategy, label)
        return copy.deepcopy(self._tied[key])

    def members(
        self,
        key: tuple[Hashable, ...],
        make: Callable[[Any], T],
        size: Callable[[T], Any],
        count: int,
    ) -> list[T]:
        """The (up to) ``count`` distinct values that ``make(draws)`` gives for the first
        ``count`` seeded draws, sorted by ``size``; ``key`` names everything ``make``
        depends on besides the draws.  A larger ``count`` keeps a smaller one's members."""
        pool = self._members.get((*key, count))
        if pool is None:
            made = self._made.setdefault(key, [])
            # member i comes from seed i whatever ``count``: a larger pool holds a smaller
            # one's members (a nesting profile's larger stratum reuses their compilations)
            while len(made) < count:
                i = len(made)
                # the simplest member first: a stratum's first example, as Hypothesis runs it
                seeded = None if i == 0 else zlib.crc32(f"{self.seed}:{key!r}:{i}".encode())
                made.append(make(SeededDraws(seeded)))
            pool = sorted(dict.fromkeys(made[:count]), key=lambda m: (size(m), repr(m)))
            self._members[(*key, count)] = pool
        return pool
