"""SDPA-7.8 (issue 29): what ``many-calls`` catches on each profile, as its module states.

The quick profile's run of the catalogue (test_caught.py) catches a kernel wrong on every
50th call and, as a strict expected miss, not one wrong after 3000 calls; here: the number
of calls the quick profile makes of one kernel (the figure the stated probabilities rest
on), the default profile catching a kernel wrong after 700 calls (fewer than its 800), and
the thorough profile's count passing 3000 (its run takes too long for a test).
"""

from __future__ import annotations

from typing import Any

from support import recording

from attnspec.backends import Backend
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.properties.repeated_calls import CALLS_PER_SMALL_EXAMPLE
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED
from attnspec.conformance.run.property_runner import PROFILES, run_property
from catalogue.bugs_state import AFTER_CALLS, counting, fresh

CALLS: list[Any] = []
counted_reference = recording(CALLS)  # the reference, noting each call in CALLS


def test_quick_profile_makes_the_calls_the_property_states() -> None:
    """SDPA-7.8: on the quick profile many-calls calls the kernel at least
    CALLS_PER_SMALL_EXAMPLE x (small examples) = 160 times, and the reference passes."""
    CALLS.clear()
    verdict = run_property(
        all_properties()["many-calls"], KernelUnderTest(counted_reference, Backend("numpy"))
    )
    assert verdict.status == PASSED, verdict.detail
    assert len(CALLS) >= CALLS_PER_SMALL_EXAMPLE * PROFILES["quick"].small == 160


wrong_after_700_calls = counting(
    "wrong_after_700_calls", "Right for its first 700 calls, wrong from then on.", lambda n: n > 700
)


def test_default_profile_catches_a_kernel_wrong_after_700_calls() -> None:
    """SDPA-7.8: the default profile's 800 calls of many-calls pass the 700th call of a
    fresh kernel, so a kernel wrong from its 701st call on fails it; the thorough profile's
    8000 pass the 3000th (wrong_after_3000_calls, a known miss of quick and default)."""
    assert CALLS_PER_SMALL_EXAMPLE * PROFILES["default"].small == 800
    assert CALLS_PER_SMALL_EXAMPLE * PROFILES["thorough"].small > AFTER_CALLS
    fresh(wrong_after_700_calls)
    verdict = run_property(
        all_properties()["many-calls"],
        KernelUnderTest(wrong_after_700_calls, Backend("numpy")),
        profile="default",
        shrink=False,
    )
    assert verdict.status == FAILED, verdict.detail
