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

Both names are private, and the dependency on Hypothesis has no upper bound, so a release
may rename them.  Where a Hypothesis of 6.131 or later lacks either, importing this module
warns once (:func:`replacements`): the checks still run and their verdicts still hold, but a
``--seed`` may draw differently in another process, which the user must learn before
relying on a reproduction.  A warning rather than an error, because refusing to check would
withhold valid verdicts for a loss of reproducibility alone; rather than an upper bound,
because Hypothesis renames internals in minor releases too (tests/conformance/
test_draws_depend_on_seed.py runs the warning, and fails on the installed Hypothesis where
it would warn).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from hypothesis.internal.conjecture import providers
from hypothesis.version import __version_info__

# Hypothesis's names; a version before 6.131 has neither and draws no local constants
_COLLECT, _PERMITTED = "_get_local_constants", "CONSTANTS_CACHE"
LOCAL_CONSTANTS_SINCE = (6, 131)


def replacements(module: ModuleType, version: tuple[int, ...]) -> dict[str, Any]:
    """What :func:`no_local_constants` swaps into Hypothesis's ``module`` (its providers,
    of Hypothesis ``version``): nothing where it has neither name, and then, on a version
    that draws local constants, a RuntimeWarning that draws may depend on the modules
    imported (the module's docstring says why not an error)."""
    if hasattr(module, _COLLECT) and hasattr(module, _PERMITTED):
        from hypothesis.internal.cache import LRUCache
        from hypothesis.internal.constants_ast import Constants

        none = Constants()
        return {_COLLECT: lambda: none, _PERMITTED: LRUCache(1024)}
    if tuple(version[:2]) >= LOCAL_CONSTANTS_SINCE:
        warnings.warn(
            f"Hypothesis {'.'.join(map(str, version))} has no {module.__name__}.{_COLLECT} "
            f"and {_PERMITTED}, which attnspec replaces so that its draws ignore constants "
            "in the source of imported local modules: a --seed may draw differently in "
            "another process (CONF-8) until attnspec supports this Hypothesis, or with "
            "hypothesis<6.131 or a version that has them",
            RuntimeWarning,
            stacklevel=2,
        )
    return {}


_REPLACEMENTS = replacements(providers, __version_info__)


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
