"""Examples drawn once for kernels declared alike: a Hypothesis property's passing run on
one kernel, replayed on the others (issue 33).

Why: several tests run a property on kernels that declare the same claims on the same
backend, with the same profile, seed and size limits (tests/catalogue/test_correct_pass.py:
six plain ones with bias and GQA, four bottom-right ones, two returning weights; the
reference and an independent formulation in test_semantics.py, test_sparse_properties.py,
the two recurrences in test_recurrent_conformance.py), and a property draws its examples
from the declaration, the backend and the run's settings only, so each of those kernels
was drawn the same problems; drawing them (Hypothesis's engine and the strategies) was
~60 % of a small example's time.

Why the verdict is the same: a property's run is one Hypothesis run per part of each
stratum of the profile, in order (property_runner._run_strata), and Hypothesis's engine
picks each example of a run from its seed and from what the test function drew and how
it ended on the examples before it in that run (passed, an overrun, an assumption not
met), never from what the kernel returned.  So a kernel that draws the same values and
ends each example the same way as a kernel that passed is run on exactly the recorded
examples, in order, each in its stratum, and passes.  :func:`replayed_verdict` calls the
property's own check on the recorded draws of each example in turn, under the stratum
(and limits) it was drawn in; it gives a verdict only where every draw asks for the
strategy recorded at its place, through the same door (``data.draw`` with the same
label, or the engine's ``conjecture_data.draw`` with the same arguments) — the same
object, or one of the same repr: a check that chose what to draw from the kernel's
outputs would ask for another — and every example ended as recorded (the same number of
draws, the same ending).  Any other outcome (a failure, another strategy asked for, a
different ending, a draw more or less) gives None, and the caller runs the property as
before, which gives the verdict it always gave, failure found and shrunk by Hypothesis.
A recording is replayed only on a run drawn from the same things (:func:`drawn_from`:
the property, the declaration but its extra keywords, the backend and the dtypes checked,
the profile's strata, the seed and the limits), never from a shape pool (a backend that
compiles per shape: its pools are not replayed).  The premise (the same draws whatever
the kernel's outputs) is checked in test_correct_pass.py by drawing two such kernels in
full; ATTNSPEC_AUDIT_REPLAYS=1 runs every replayed property on its own too and asserts
that it drew what was replayed and passed (how every use was checked once).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from hypothesis.errors import UnsatisfiedAssumption

from attnspec.conformance.draw import sizes
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registration import Property
from attnspec.conformance.judge.verdict import PASSED, Verdict
from attnspec.conformance.run.property_runner import PROFILES, declared_clause, run_property

IMMUTABLE = (bytes, bool, int, float, str, type(None))
RETURNED = "returned"  # how an example ended when the check returned
UNSATISFIED = UnsatisfiedAssumption.__name__
AUDIT = os.environ.get("ATTNSPEC_AUDIT_REPLAYS") == "1"


def _kept(value: Any) -> Any:
    """``value``, copied unless immutable: a check may change what it was given."""
    return value if isinstance(value, IMMUTABLE) else copy.deepcopy(value)


# A draw: the strategy asked for, through which door (("data", label) or ("engine", the
# positional and keyword arguments)), and the value it gave.
Draw = tuple[Any, tuple[Any, ...], Any]


@dataclass(frozen=True)
class Example:
    """One call of a property's check: what it was drawn from (the stratum and limits of
    its Hypothesis run), whether its ``data`` offered the engine's ``conjecture_data`` (a
    stratum drawing all but its sizes from a seeded source does not), its draws in order,
    and how it ended (RETURNED, or the name of what it raised: Hypothesis's StopTest on an
    overrun, UnsatisfiedAssumption)."""

    drawing: sizes.Drawing
    engine: bool
    draws: tuple[Draw, ...]
    ended: str


@dataclass(frozen=True)
class Recording:
    """A passing run's examples, in order, and what it was drawn from (:func:`drawn_from`)."""

    drawn_from: tuple[Any, ...]
    examples: tuple[Example, ...]


def drawn_from(
    prop: Property,
    kernel: KernelUnderTest,
    *,
    profile: str,
    seed: int | None = None,
    limits: SizeLimits | None = None,
) -> tuple[Any, ...]:
    """What ``prop``'s examples on ``kernel`` are drawn from: the property, the declaration
    (but its extra keywords, which only the calls pass on: no draw reads them), the
    backend (its device, dtypes and whether it compiles per shape), the dtypes checked, the
    profile's strata, the seed and the size limits."""
    backend = kernel.backend
    # a copy with no extra keywords, not dataclasses.replace: that validates every field
    # again (~90 us, on every verdict asked of SharedDraws); the same repr
    declaration = copy.copy(kernel.declaration)
    object.__setattr__(declaration, "extra_kwargs", {})
    return (
        prop.id,
        prop.draws,
        prop.draws_as,
        repr(declaration),
        backend.name,
        str(getattr(backend, "device", "")),
        repr(backend.dtype_names),
        backend.compiles_per_shape,
        kernel.dtypes,
        profile,
        repr(PROFILES[profile]),
        seed,
        repr(limits or SizeLimits()),
    )


class _RecordedConjecture:
    """Hypothesis's ConjectureData (``data.conjecture_data``), its draws recorded."""

    def __init__(self, conjecture: Any, draws: list[Draw]) -> None:
        self._conjecture = conjecture
        self._draws = draws

    def draw(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        value = self._conjecture.draw(strategy, *args, **kwargs)
        door = ("engine", args, tuple(sorted(kwargs.items())))
        self._draws.append((strategy, door, _kept(value)))
        return value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conjecture, name)


class _RecordingDraws:
    """The runner's ``data``, every draw recorded (through ``draw`` and, where ``data``
    offers it, through ``conjecture_data.draw``, as small_values draws)."""

    def __init__(self, data: Any) -> None:
        self._data = data
        self.draws: list[Draw] = []
        conjecture = getattr(data, "conjecture_data", None)
        self.engine = conjecture is not None
        if self.engine:
            self.conjecture_data = _RecordedConjecture(conjecture, self.draws)

    def draw(self, strategy: Any, label: Any = None) -> Any:
        value = self._data.draw(strategy, label)
        self.draws.append((strategy, ("data", label), _kept(value)))
        return value


class _Overrun(BaseException):
    """A draw past the recorded ones, where the recorded example overran (StopTest, also
    a BaseException, so that no check's ``except Exception`` takes it)."""


class _AskedOtherwise(BaseException):
    """A draw of another strategy than the recorded one at that place (or through another
    door): the check chose what to draw from something that differs between the kernels
    (their outputs), so the recorded values are not what this kernel's own run would draw."""


class _ReplayedConjecture:
    """Stands in for ``data.conjecture_data``: its draws answered from the replay."""

    def __init__(self, replay: _ReplayedDraws) -> None:
        self._replay = replay

    def draw(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        return self._replay.next(strategy, ("engine", args, tuple(sorted(kwargs.items()))))


class _ReplayedDraws:
    """Stands in for ``data``: each draw answers the next recorded value, where it asks for
    the strategy recorded there (the same object, or one written the same) through the
    same door (``conjecture_data`` offered only where the recorded ``data`` offered it)."""

    def __init__(self, example: Example) -> None:
        self._draws: Iterator[Draw] = iter(example.draws)
        self.left = len(example.draws)
        if example.engine:
            self.conjecture_data = _ReplayedConjecture(self)

    def next(self, strategy: Any, door: tuple[Any, ...]) -> Any:
        if not self.left:
            raise _Overrun
        self.left -= 1
        recorded, recorded_door, value = next(self._draws)
        if door != recorded_door or (strategy is not recorded and repr(strategy) != repr(recorded)):
            raise _AskedOtherwise
        return _kept(value)

    def draw(self, strategy: Any, label: Any = None) -> Any:
        return self.next(strategy, ("data", label))


def recorded_run(
    prop: Property,
    kernel: KernelUnderTest,
    *,
    profile: str,
    seed: int | None = None,
    limits: SizeLimits | None = None,
    shrink: bool = True,
) -> tuple[Verdict, Recording | None]:
    """``run_property(prop, kernel, ...)`` and the examples its check was called on, each
    with the stratum it was drawn in (None where the run did not pass, or for a fixed
    property: nothing to replay)."""
    run = {"profile": profile, "seed": seed, "limits": limits, "shrink": shrink}
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
            drawn = tuple(recorder.draws)
            examples.append(Example(sizes.current(), recorder.engine, drawn, ended))

    verdict = run_property(replace(prop, check=recording), kernel, **run)
    if verdict.status != PASSED:
        return verdict, None
    key = drawn_from(prop, kernel, profile=profile, seed=seed, limits=limits)
    return verdict, Recording(key, tuple(examples))


def _replays(prop: Property, kernel: KernelUnderTest, example: Example) -> bool:
    """Whether ``prop``'s check on ``kernel``, called on ``example``'s draws in its stratum,
    ends as it ended when recorded."""
    drawing = example.drawing
    replayed = _ReplayedDraws(example)
    with sizes.drawing(drawing.stratum, drawing.limits, drawing.pool):
        try:
            prop.check(kernel, replayed)
        except _Overrun:
            ended = "StopTest"
        except _AskedOtherwise:
            return False  # drawn otherwise: the kernel's own run decides
        except UnsatisfiedAssumption:
            ended = UNSATISFIED
        except Exception:
            return False  # a failure: the full run finds it, and shrinks it
        else:
            ended = RETURNED if replayed.left == 0 else "draws left"
    return ended == example.ended


def replayed_verdict(
    prop: Property,
    kernel: KernelUnderTest,
    recording: Recording,
    *,
    profile: str,
    seed: int | None = None,
    limits: SizeLimits | None = None,
) -> Verdict | None:
    """The verdict of ``prop`` on ``kernel`` (PASSED) where its check, called on each
    recorded example in turn in the stratum it was drawn in, ends every one as recorded
    (see the module's docstring); None where the run is not drawn from what the recording
    was, where a property the kernel does not claim or waives would not run, where an
    example was drawn from a shape pool, or at the first example that does not replay."""
    if recording.drawn_from != drawn_from(prop, kernel, profile=profile, seed=seed, limits=limits):
        return None
    declaration = kernel.declaration
    if prop.clause in declaration.waivers() or prop.not_applicable(declaration, kernel.backend):
        return None  # run_property says so at once
    if any(example.drawing.pool is not None for example in recording.examples):
        return None
    kernel.notes.clear()
    for example in recording.examples:
        if not _replays(prop, kernel, example):
            return None
    return Verdict(
        prop.id,
        declared_clause(prop.clause, declaration),
        prop.level,
        PASSED,
        detail="; ".join(kernel.notes[:2]),
        # as run_property counts them: every call but those whose assumption was not met
        examples=sum(example.ended != UNSATISFIED for example in recording.examples),
    )


def judged_alike(verdict: Verdict) -> Verdict:
    """``verdict`` without its timings: what a replay's verdict shares with the kernel's own
    run's (replayed_verdict builds it as run_property does; the premise test and the audit
    hold the two equal)."""
    return replace(verdict, seconds=0.0, kernel_seconds=0.0)


def values(recording: Recording) -> list[tuple[str, tuple[Any, ...], str]]:
    """Each example's stratum, drawn values (with their doors) and ending: what two runs
    drawn alike share (the strategies are built anew per run)."""
    return [
        (e.drawing.stratum.name, tuple((door, value) for _, door, value in e.draws), e.ended)
        for e in recording.examples
    ]


class SharedDraws:
    """Passing runs' recordings by what they were drawn from: :meth:`verdict` replays one
    on a kernel drawn alike, else runs the property (recorded where it passes)."""

    def __init__(self) -> None:
        self.recordings: dict[tuple[Any, ...], Recording] = {}
        self.replayed = 0

    def verdict(
        self,
        prop: Property,
        kernel: KernelUnderTest,
        *,
        profile: str = "quick",
        seed: int | None = None,
        limits: SizeLimits | None = None,
        shrink: bool = True,
    ) -> Verdict:
        """``run_property(prop, kernel, ...)``'s verdict: a replay's where the recording of
        a kernel drawn alike replays (:func:`replayed_verdict`), else the run's own."""
        run: dict[str, Any] = {"profile": profile, "seed": seed, "limits": limits}
        declaration = kernel.declaration
        if prop.clause in declaration.waivers() or prop.not_applicable(declaration, kernel.backend):
            # decided by the declaration alone, at once: nothing drawn, nothing to look up
            return run_property(prop, kernel, shrink=shrink, **run)
        key = drawn_from(prop, kernel, **run)
        recording = self.recordings.get(key)
        if recording is not None:
            verdict = replayed_verdict(prop, kernel, recording, **run)
            if verdict is not None:
                self.replayed += 1
                if AUDIT:
                    _audit(prop, kernel, recording, verdict, **run)
                return verdict
        verdict, recording = recorded_run(prop, kernel, shrink=shrink, **run)
        if recording is not None:
            self.recordings[key] = recording
        return verdict


def _audit(
    prop: Property, kernel: KernelUnderTest, recording: Recording, replayed: Verdict, **run: Any
) -> None:
    """ATTNSPEC_AUDIT_REPLAYS=1: the replayed property's own run on ``kernel`` drew exactly
    the replayed values, each example in its stratum and ending as replayed, and passed
    with the replay's verdict (but its timings)."""
    verdict, own = recorded_run(prop, kernel, **run)
    assert verdict.status == PASSED and own is not None, (prop.id, verdict.detail)
    assert values(own) == values(recording), f"{prop.id}: drawn otherwise on its own run"
    assert judged_alike(verdict) == judged_alike(replayed), (verdict, replayed)
    with open(os.environ.get("ATTNSPEC_AUDIT_LOG", os.devnull), "a") as log:
        log.write(f"{prop.id} {kernel.target} {run} {len(own.examples)} examples\n")


def replay_passes(
    prop: Property,
    kernel: KernelUnderTest,
    recording: Recording,
    *,
    profile: str,
    seed: int | None = None,
    limits: SizeLimits | None = None,
) -> bool:
    """Whether ``recording`` replays on ``kernel`` (:func:`replayed_verdict`)."""
    verdict = replayed_verdict(prop, kernel, recording, profile=profile, seed=seed, limits=limits)
    return verdict is not None
