"""What judging a kernel produces: one :class:`Verdict` per property, gathered in a
:class:`Report` for the kernel (CONF-1 ... CONF-3)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..draw.sizes import SizeLimits

PASSED, FAILED, WARNING, NOT_APPLICABLE = "passed", "failed", "warning", "not applicable"
WAIVED = "waived"  # the declaration waives the property's MUST clause (CONF-7)
# the run stopped before the property ran: the kernel used up the stall budget, or the
# run's --deadline passed (the verdict's detail says which; the report is then marked
# incomplete when no property failed, CONF-6)
NOT_RUN = "not run"


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
    # of ``seconds``, those spent in the kernel's own calls (in its process: without moving
    # their inputs and results there and back); the rest is the suite's drawing and judging
    kernel_seconds: float = 0.0
    hint: str = ""  # the exact flag or change that would fix a likely convention mismatch
    # input features of the failing case that other clauses govern (input_features.FEATURES)
    features: list[str] = field(default_factory=list)
    # the clause this failure follows from: re-run with that clause's inputs drawn around,
    # the property passed (root_causes.draw_around); "" for a distinct divergence
    cause: str = ""
    # what the re-run drawing around other clauses' inputs showed, in words
    drawn_around: str = ""
    # a kernel call outlasted the timeout (the kernel's process was ended): counted
    # against the run's stall budget
    stalled: bool = False


@dataclass
class Cause:
    """A root cause a diagnosis probe established (:mod:`.diagnosis`): its ``name`` (the
    probe's), the clause it breaks, what the kernel does, the probe's numbers that show
    it, and the exact flag or change that fixes it ("" when none)."""

    name: str
    clause: str
    explanation: str
    evidence: str
    hint: str = ""


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
    limits: SizeLimits = field(default_factory=SizeLimits)
    # MUST clauses the kernel's declaration waives: named in the claim (CONF-7)
    waived: list[str] = field(default_factory=list)
    # the conformance claim, or why there is none (set by whoever knows the whole run)
    claim: str = ""
    # what the run changed or left out (backend settings, dtypes not checked)
    notes: list[str] = field(default_factory=list)
    # likely convention mismatches, each with the exact flag that fixes it
    hints: list[str] = field(default_factory=list)
    # root causes the diagnosis probes established after properties failed
    causes: list[Cause] = field(default_factory=list)
    # what the run did not check, each with why (dtypes, undeclared features, skipped)
    not_checked: list[str] = field(default_factory=list)
    # the wall time of the run in seconds (the properties may run at once), 0 unknown
    wall_seconds: float = 0.0
    # Why not every selected property has a verdict (interrupted, still running); "" when
    # the run finished.  An incomplete report supports no conformance claim (CONF-6).
    incomplete: str = ""

    @property
    def conforms(self) -> bool:
        """CONF-1: every applicable MUST property passed (and, when strict, every SHOULD),
        in a complete run (CONF-6)."""
        bad = {FAILED, WARNING} if self.strict else {FAILED}
        return not self.incomplete and not any(v.status in bad for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.limits.avoid:  # only re-runs avoid features; a run's own limits never do
            data["limits"].pop("avoid")
        data["conforms"] = self.conforms
        return data
