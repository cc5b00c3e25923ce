"""What a seed draws depends on the seed, the profile and the kernel's declaration only
(CONF-8: a larger profile draws, with the same seed, exactly the examples a smaller one
drew, in whatever process draws them; docs/checking-your-kernel.md, "Profiles, sizes,
seeds and time").  Hypothesis also draws, now and then, a constant found in the source of
any "local" module the drawing process has imported (attnspec itself when installed
editable, the user's modules, other tests' imports); the runner draws without those.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers
from hypothesis.internal.conjecture.providers import AVAILABLE_PROVIDERS
from hypothesis.internal.constants_ast import Constants, is_local_module_file
from hypothesis.version import __version_info__
from support import reference_sdpa

from attnspec.backends import Backend
from attnspec.conformance.draw.strategies import draw_rng
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registration import Property
from attnspec.conformance.run.hypothesis_constants import (
    LOCAL_CONSTANTS_SINCE,
    no_local_constants,
    replacements,
)
from attnspec.conformance.run.property_runner import PROFILES, Profile, run_property

# The local module's name; its constants are integers of [0, 2^32), as values seeds are
LOCAL_SEEDS = "seeded_draws_29"
# Values seeds per example: Hypothesis draws a constant in 5 % of integer choices, a local
# one in about half of those; with 64 an example, before the fix, the two runs of each of
# seeds 29-34 differed within their first 4 examples (16 missed it on seed 31 over 20)
SEEDS_PER_EXAMPLE = 64
# A backend Hypothesis ships that ignores the seed
URANDOM = "hypothesis-urandom"


Draws = Callable[[], list[tuple[int, ...]]]


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> Draws:
    """What the runner draws with seed 29: the values seeds of each example of a property
    that only records them (``draw_rng``, as the properties draw them; the first value each
    gives stands for it), 10 examples of the small stratum."""
    monkeypatch.setitem(PROFILES, "values-seeds", Profile(10))
    seen: list[tuple[int, ...]] = []

    def record(kernel: KernelUnderTest, data: st.DataObject) -> None:
        seen.append(tuple(int(draw_rng(data).integers(2**62)) for _ in range(SEEDS_PER_EXAMPLE)))

    prop = Property("values-seeds", "CONF-8", "hypothesis", record, lambda declaration: None)
    kernel = KernelUnderTest(reference_sdpa, Backend("numpy"))

    def drawn() -> list[tuple[int, ...]]:
        seen.clear()
        run_property(prop, kernel, profile="values-seeds", seed=29)
        return list(seen)

    return drawn


def _import_local_module(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module outside site-packages and the standard library, not a test file, full of
    integers a values seed can be: what Hypothesis counts as local code."""
    path = directory / f"{LOCAL_SEEDS}.py"
    path.write_text(f"SEEDS = ({', '.join(str(1_000_003 * n) for n in range(1, 600))})\n")
    spec = importlib.util.spec_from_file_location(LOCAL_SEEDS, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert is_local_module_file(str(path)), path  # else the test below proves nothing
    monkeypatch.setitem(sys.modules, LOCAL_SEEDS, module)


def test_a_seeds_draws_do_not_depend_on_the_local_modules_imported(
    draws: Draws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-8: the same seed draws the same values seeds before and after a local module
    with integer constants of its own is imported (they differed before the runner drew
    without local constants)."""
    before = draws()
    _import_local_module(tmp_path, monkeypatch)
    assert draws() == before


def test_a_seeds_draws_do_not_depend_on_the_users_hypothesis_profile(draws: Draws) -> None:
    """CONF-8: a Hypothesis profile the user loaded (in a conftest, under the pytest plugin
    or the API) that picks another backend leaves the draws alone: the runner's settings
    name Hypothesis's own (before, they inherited the profile's: "hypothesis-urandom" drew
    from os.urandom, whatever the seed)."""
    if URANDOM not in AVAILABLE_PROVIDERS:
        pytest.skip(f"this Hypothesis has no {URANDOM!r} backend to load a profile with")
    before, profile = draws(), settings.get_current_profile_name()
    settings.register_profile("draws29-urandom", backend=URANDOM)
    settings.load_profile("draws29-urandom")
    try:
        assert draws() == before
    finally:
        settings.load_profile(profile)


def test_hypothesis_is_left_as_it_was() -> None:
    """CONF-8: once the runner's Hypothesis run ends, Hypothesis collects local constants
    again, from its own cache: the user's own Hypothesis tests draw as they would have."""
    before = providers._get_local_constants, providers.CONSTANTS_CACHE
    with no_local_constants():
        assert providers._get_local_constants() == Constants()
    assert (providers._get_local_constants, providers.CONSTANTS_CACHE) == before


def test_hypothesis_without_the_replaced_internals_warns() -> None:
    """CONF-8: a Hypothesis that draws local constants (6.131 on) but has renamed the two
    private names the runner replaces gets a RuntimeWarning saying that a seed may draw
    differently in another process, not silently module-dependent draws; one before 6.131,
    which draws none, gets no warning."""
    renamed = ModuleType(providers.__name__)  # neither name
    with pytest.warns(RuntimeWarning, match="may draw differently in another process"):
        assert replacements(renamed, (6, 171, 0)) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replacements(renamed, (6, 130, 9)) == {}


def test_the_installed_hypothesis_has_the_replaced_internals() -> None:
    """CONF-8: the Hypothesis installed here, if it draws local constants, has both names
    the runner replaces (a release that renames them fails here, in the project's CI,
    before a user meets the warning)."""
    if __version_info__[:2] < LOCAL_CONSTANTS_SINCE:
        pytest.skip(f"Hypothesis {__version_info__} draws no local constants: nothing replaced")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(replacements(providers, __version_info__)) == {
            "_get_local_constants",
            "CONSTANTS_CACHE",
        }
