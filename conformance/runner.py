"""Running properties against a kernel and collecting one verdict per property."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from .claims import waiving_flags
from .failures import KernelExited, PropertyFailure
from .kernel import KernelUnderTest
from .registry import Property, all_properties

PROFILES: dict[str, int] = {"quick": 20, "default": 100, "thorough": 1000}
PASSED, FAILED, WARNING, NOT_APPLICABLE = "passed", "failed", "warning", "not applicable"
WAIVED = "waived"  # the declaration waives the property's MUST clause (CONF-7)


@dataclass
class Verdict:
    """The outcome of one property on one kernel (CONF-1 … CONF-3)."""

    property: str
    clause: str
    level: str
    status: str
    detail: str = ""
    counterexample: str = ""
    reproduction: str = ""
    examples: int = 0
    seconds: float = 0.0
    hint: str = ""  # the exact flag or change that would fix a likely convention mismatch

    @property
    def failed_conformance(self) -> bool:
        return self.status == FAILED


@dataclass
class Report:
    """All verdicts for one kernel, plus how the run was configured."""

    kernel: str
    backend: str
    device: str
    profile: str
    seed: int | None
    strict: bool
    verdicts: list[Verdict] = field(default_factory=list)
    # MUST clauses the kernel's declaration waives: named in the claim (CONF-7)
    waived: list[str] = field(default_factory=list)
    # the conformance claim, or why there is none (set by whoever knows the whole run)
    claim: str = ""
    # what the run changed or left out (backend settings, dtypes not checked)
    notes: list[str] = field(default_factory=list)
    # likely convention mismatches, each with the exact flag that fixes it
    hints: list[str] = field(default_factory=list)
    # Why not every selected property has a verdict (interrupted, still running); "" when
    # the run finished.  An incomplete report supports no conformance claim (CONF-6).
    incomplete: str = ""

    @property
    def conforms(self) -> bool:
        """CONF-1: every applicable MUST property passed (and, when strict, every SHOULD),
        in a complete run (CONF-6)."""
        bad = {FAILED, WARNING} if self.strict else {FAILED}
        return not self.incomplete and not any(v.status in bad for v in self.verdicts)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["conforms"] = self.conforms
        return data


def hypothesis_settings(profile: str, seed: int | None) -> settings:
    """Reproducible, quiet, deadline-free settings: no flaky time limits, no database."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r}, but should be one of {', '.join(PROFILES)}")
    return settings(
        max_examples=PROFILES[profile],
        derandomize=seed is None,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
    )


def _failed_verdict(prop: Property, failure: PropertyFailure) -> Verdict:
    level = prop.level
    return Verdict(
        property=prop.id, clause=prop.clause, level=level,
        status=FAILED if level == "MUST" else WARNING,
        detail=failure.finding, counterexample=failure.counterexample,
        reproduction=failure.reproduction, hint=failure.hint,
    )


def run_property(
    prop: Property, kernel: KernelUnderTest, *, profile: str = "quick", seed: int | None = None
) -> Verdict:
    """Run one property; a kernel that does not claim it gets "not applicable" (CONF-3)."""
    started = time.perf_counter()
    waivers = waiving_flags(kernel.declaration)
    if prop.clause in waivers:
        return Verdict(prop.id, prop.clause, prop.level, WAIVED,
                       detail=f"waived: the kernel declares {waivers[prop.clause]}, so "
                              f"{prop.clause} is not checked (CONF-7)")
    reason = prop.applies(kernel.declaration)
    if reason is not None:
        return Verdict(prop.id, prop.clause, prop.level, NOT_APPLICABLE, detail=reason)
    examples = [0]
    kernel.notes.clear()
    try:
        if prop.kind == "fixed":
            prop.check(kernel, 0 if seed is None else seed)
            examples[0] = 1
        else:
            @hypothesis_settings(profile, seed)
            @given(st.data())
            def property_test(data: st.DataObject) -> None:
                examples[0] += 1
                prop.check(kernel, data)

            if seed is not None:
                property_test = hypothesis_seed(seed)(property_test)
            property_test()
    except PropertyFailure as failure:
        verdict = _failed_verdict(prop, failure)
    except KernelExited as exited:
        verdict = _failed_verdict(prop, exited.failure)
    except Flaky as flaky:
        verdict = _failed_verdict(prop, PropertyFailure(
            "a failure seen on one run did not recur when Hypothesis re-ran the same input: "
            f"the kernel's output is not reproducible (SDPA-7.5) [{type(flaky).__name__}]"
        ))
    except Exception as exc:  # an unusable result, e.g. not an array: still a verdict
        verdict = _failed_verdict(prop, PropertyFailure(
            f"the property could not check the kernel's result: {type(exc).__name__}: "
            f"{str(exc)[:300]}"
        ))
    else:
        verdict = Verdict(prop.id, prop.clause, prop.level, PASSED,
                          detail="; ".join(kernel.notes[:2]))
    verdict.examples = examples[0]
    verdict.seconds = time.perf_counter() - started
    return verdict


def select(only: Iterable[str] | None = None, skip: Iterable[str] | None = None) -> list[Property]:
    """The registered properties, filtered by id; unknown ids are a ValueError."""
    registry = all_properties()
    chosen = list(only) if only else list(registry)
    unknown = [p for p in [*chosen, *(skip or ())] if p not in registry]
    if unknown:
        raise ValueError(
            f"unknown property id(s) {', '.join(unknown)}; known: {', '.join(registry)}"
        )
    skipped = set(skip or ())
    return [registry[p] for p in chosen if p not in skipped]


def run_all(
    kernel: KernelUnderTest,
    *,
    profile: str = "quick",
    seed: int | None = None,
    only: Iterable[str] | None = None,
    skip: Iterable[str] | None = None,
    strict: bool = False,
    progress: Callable[[Property, Verdict | None], None] | None = None,
) -> Report:
    """Every selected property against ``kernel``; ``progress`` hears each start and end."""
    properties = select(only, skip)
    hypothesis_settings(profile, seed)  # validate the profile before any work
    return run_each(properties, lambda p: run_property(p, kernel, profile=profile, seed=seed),
                    new_report(kernel, profile=profile, seed=seed, strict=strict), progress)


def new_report(kernel: Any, *, profile: str, seed: int | None, strict: bool) -> Report:
    """An empty report for ``kernel`` (a KernelUnderTest, or what a worker process says
    of one: anything with ``target``, ``backend.name`` / ``backend.device`` and
    ``declaration``), naming the MUST clauses its declaration waives (CONF-7)."""
    return Report(kernel.target, kernel.backend.name, str(kernel.backend.device), profile,
                  seed, strict, waived=list(kernel.declaration.waived))


def run_each(
    properties: Iterable[Property],
    run_one: Callable[[Property], Verdict],
    report: Report,
    progress: Callable[[Property, Verdict | None], None] | None = None,
) -> Report:
    """Append ``run_one(prop)`` for each property to ``report`` as it finishes, so a caller
    holding ``report`` keeps every finished verdict if the run is interrupted."""
    for prop in properties:
        if progress:
            progress(prop, None)
        verdict = run_one(prop)
        report.verdicts.append(verdict)
        if progress:
            progress(prop, verdict)
    return report
