"""Hypothesis's constants without the local ones, so that what a seed draws depends on the
seed, the profile and the kernel's declaration only (CONF-8).

Hypothesis (6.131 on) draws, in 5 % of its integer, bytes and string choices and 15 % of
its float ones, a constant instead of a random value: from its own fixed list
(``GLOBAL_CONSTANTS``: 0.5, 2^31 - 1, ...) or from those it collects from the source of
every *local* module imported in the drawing process, any module outside site-packages and
the standard library that is not a test file (``HypothesisProvider._maybe_draw_constant``,
``providers._get_local_constants``).  So a ``--seed`` drew according to which modules
happened to be imported: attnspec's own when installed editable (not from a wheel), the
user's, in the suite those a pytest-xdist worker's other tests imported (a values seed is
an integer of [0, 2^32): any integer literal of 100 or more qualifies).  A catalogue bug
caught at the 12th example with only its own modules imported was missed over 39 in a
whole-suite run.

Hypothesis has no setting for it, and a backend of our own (``settings(backend=...)``)
would change how its engine generates and shrinks, so each of the runner's Hypothesis runs
(:func:`no_local_constants`) replaces, while it runs, the function that collects local
constants by one that finds none, and the cache of the constants each choice permits by
one of its own (entries computed with local constants must not leak in, nor ours out into
the user's own Hypothesis tests).  The global constants stay: they are the same in every
process of one Hypothesis version, and part of how it finds bugs.  Both are module globals
of Hypothesis: a Hypothesis test run meanwhile in another thread of the process would draw
no local constants either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis.internal.conjecture import providers

# Hypothesis's names; a version before 6.131 has neither and draws no local constants
_COLLECT, _PERMITTED = "_get_local_constants", "CONSTANTS_CACHE"
_REPLACEMENTS: dict[str, Any] = {}
if hasattr(providers, _COLLECT) and hasattr(providers, _PERMITTED):
    from hypothesis.internal.cache import LRUCache
    from hypothesis.internal.constants_ast import Constants

    _NONE = Constants()
    _REPLACEMENTS = {_COLLECT: lambda: _NONE, _PERMITTED: LRUCache(1024)}


@contextmanager
def no_local_constants() -> Iterator[None]:
    """Hypothesis draws no local constants while this is entered (the module's
    docstring); it draws as before once left."""
    saved = {name: getattr(providers, name) for name in _REPLACEMENTS}
    for name, replacement in _REPLACEMENTS.items():
        setattr(providers, name, replacement)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(providers, name, original)
