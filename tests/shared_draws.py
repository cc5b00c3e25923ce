"""Examples drawn once for kernels declared alike: a Hypothesis property's passing run on
one kernel, replayed on the others (issue 33).

Why: tests/catalogue/test_correct_pass.py runs every property on kernels that declare the
same claims on the same backend (six plain ones with bias and GQA, four bottom-right
ones, two returning weights), and a property draws its examples from the declaration and
the backend only, so each of those kernels was drawn the same problems; drawing them
(Hypothesis's engine and the strategies) was ~60 % of a small example's time.

Why the verdict is the same: Hypothesis's engine picks each example from its seed and
from what the test function drew and how it ended on the examples before (passed, an
overrun, an assumption not met), never from what the kernel returned.  So a kernel that
draws the same values and ends each example the same way as a kernel that passed is run
on exactly the recorded examples, in order, and passes.  :func:`replay_passes` calls the
property's own check on the recorded draws, in the recorded stratum; it says True only
where every draw asks for the strategy recorded at its place (the same object, or one of
the same repr: a check that chose what to draw from the kernel's outputs would ask for
another) and every example ended as recorded (the same number of draws, the same ending).
Any other outcome (a failure, another strategy asked for, a different ending, a draw more
or less) says False, and the
caller runs the property as before, which gives the verdict it always gave, failure
found and shrunk by Hypothesis.  The premise (the same draws whatever the kernel's
outputs) is checked in test_correct_pass.py by drawing two such kernels in full.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from hypothesis.errors import UnsatisfiedAssumption

from attnspec.conformance.draw import sizes
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registration import Property
from attnspec.conformance.judge.verdict import PASSED, Verdict
from attnspec.conformance.run.property_runner import PROFILES, run_property

IMMUTABLE = (bytes, bool, int, float, str, type(None))
RETURNED = "returned"  # how an example ended when the check returned


def _kept(value: Any) -> Any:
    """``value``, copied unless immutable: a check may change what it was given."""
    return value if isinstance(value, IMMUTABLE) else copy.deepcopy(value)


@dataclass(frozen=True)
class Example:
    """One call of a property's check: its draws in order, each the strategy asked for and
    the value it gave, and how it ended (RETURNED, or the name of what it raised:
    Hypothesis's StopTest on an overrun, UnsatisfiedAssumption)."""

    draws: tuple[tuple[Any, Any], ...]
    ended: str


class _RecordedConjecture:
    """Hypothesis's ConjectureData (``data.conjecture_data``), its draws recorded."""

    def __init__(self, conjecture: Any, draws: list[tuple[Any, Any]]) -> None:
        self._conjecture = conjecture
        self._draws = draws

    def draw(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        value = self._conjecture.draw(strategy, *args, **kwargs)
        self._draws.append((strategy, _kept(value)))
        return value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conjecture, name)


class _RecordingDraws:
    """The runner's ``data``, every draw's value recorded (through ``draw`` and through
    ``conjecture_data.draw``, as small_values draws)."""

    def __init__(self, data: Any) -> None:
        self._data = data
        self.draws: list[tuple[Any, Any]] = []
        self.conjecture_data = _RecordedConjecture(data.conjecture_data, self.draws)

    def draw(self, strategy: Any, label: Any = None) -> Any:
        value = self._data.draw(strategy, label)
        self.draws.append((strategy, _kept(value)))
        return value


class _Overrun(BaseException):
    """A draw past the recorded ones, where the recorded example overran (StopTest, also
    a BaseException, so that no check's ``except Exception`` takes it)."""


class _AskedOtherwise(BaseException):
    """A draw of another strategy than the recorded one at that place: the check chose what
    to draw from something that differs between the kernels (their outputs), so the
    recorded values are not what this kernel's own run would draw."""


class _ReplayedDraws:
    """Stands in for ``data``: each draw answers the next recorded value, where it asks for
    the strategy recorded there (the same object, or one written the same)."""

    def __init__(self, draws: tuple[tuple[Any, Any], ...]) -> None:
        self._draws: Iterator[tuple[Any, Any]] = iter(draws)
        self.left = len(draws)
        self.conjecture_data = self

    def draw(self, strategy: Any, label: Any = None, **_: Any) -> Any:
        if not self.left:
            raise _Overrun
        self.left -= 1
        recorded, value = next(self._draws)
        if strategy is not recorded and repr(strategy) != repr(recorded):
            raise _AskedOtherwise
        return _kept(value)


def recorded_run(
    prop: Property, kernel: KernelUnderTest, **run: Any
) -> tuple[Verdict, list[Example] | None]:
    """``run_property(prop, kernel, **run)`` and the examples its check was called on
    (None where the run did not pass, or for a fixed property: nothing to replay)."""
    if prop.kind != "hypothesis":  # a fixed property draws nothing through Hypothesis
        return run_property(prop, kernel, **run), None
    examples: list[Example] = []
    check = prop.check

    def recording(kernel: KernelUnderTest, data: Any) -> None:
        recorder = _RecordingDraws(data)
        ended = RETURNED
        try:
            check(kernel, recorder)
        except BaseException as exc:
            ended = type(exc).__name__
            raise
        finally:
            examples.append(Example(tuple(recorder.draws), ended))

    verdict = run_property(replace(prop, check=recording), kernel, **run)
    if verdict.status != PASSED:
        return verdict, None
    return verdict, examples


def replay_passes(
    prop: Property,
    kernel: KernelUnderTest,
    examples: list[Example],
    *,
    profile: str,
    limits: SizeLimits | None = None,
) -> bool:
    """Whether ``prop``'s check on ``kernel``, called on each recorded example in turn in
    the profile's one stratum, ends every one as recorded (see the module's docstring);
    False at the first that does not, or where the profile has more than one stratum."""
    limits = limits or SizeLimits()
    strata = PROFILES[profile].strata(limits, prop.draws)
    if len(strata) != 1 or strata[0].realistic:
        return False
    kernel.notes.clear()
    with sizes.drawing(strata[0], limits):
        for example in examples:
            replayed = _ReplayedDraws(example.draws)
            try:
                prop.check(kernel, replayed)
            except _Overrun:
                ended = "StopTest"
            except _AskedOtherwise:
                return False  # drawn otherwise: the kernel's own run decides
            except UnsatisfiedAssumption:
                ended = UnsatisfiedAssumption.__name__
            except Exception:
                return False  # a failure: the full run finds it, and shrinks it
            else:
                ended = RETURNED if replayed.left == 0 else "draws left"
            if ended != example.ended:
                return False
    return True
