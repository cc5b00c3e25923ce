"""One finding per root cause: drawing around failed clauses, and the divergences of a run.

A kernel that fails one clause (mean(V) for a fully masked row, SDPA-5.1) fails every
property whose drawn inputs happen to meet that clause's inputs.  After a run,
:func:`draw_around` re-runs each failed property whose minimal case has an input feature
(:mod:`.input_features`) governed by another clause the kernel failed or its declaration
waives, with that feature left out of the draws:

* if the property then passes, its failure is a *consequence* of that clause: the verdict
  stays failed (the kernel did fail it), keeps its minimal case as evidence, and says how
  many examples passed drawn around the clause (``Verdict.cause``, ``Verdict.drawn_around``);
* if it still fails, it is a *distinct divergence*, reported with the new minimal case (the
  first is kept in ``drawn_around``); features of the new case governed by failed clauses
  are drawn around in turn.

Which re-runs are independent (what lets ``--jobs N`` run them at once,
:func:`.jobs.run_properties`): settling one verdict (its re-runs, one after the other, each
with an avoid set grown from the last) writes that verdict only, and reads, besides its own
case, the verdicts of the clauses governing the features of its case (``_implicated``:
their ``cause``, and their ``features`` for a dtype; ``root_clause`` follows ``cause`` from
one governing clause to another, every ``cause`` being a governing clause) and nothing
else: the set of failed clauses and the waived ones are fixed before the first re-run, and
no status changes.  So

* the verdicts of non-governing clauses read only governing verdicts, which no longer
  change once those are settled, and never each other: they are settled at once, after;
* a verdict never reads the verdicts of its own clause (``_implicated`` skips features its
  own clause governs, and ``root_clause`` stops on entering it), so consecutive verdicts of
  one governing clause are settled at once too;
* a verdict of one governing clause may read those of another, settled before it or not
  depending on the order: those are settled in the report's order, one clause after the
  other.

Each verdict is settled on a copy, with every re-run of its own in the serial order, and
the copy replaces it in the report on the calling thread once done: the outcome is the
same whatever settles first, and an interrupted verdict stays as it was found.

:func:`divergences` then lists the distinct divergences (failures with one cause, the same
exception or wrong return type, or one confirmed write-up, merged), each with the
consequences folded under it; the CLI, the JSON report and the matrix show that list.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from copy import copy
from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import TYPE_CHECKING

from ..draw.input_features import BY_NAME, describe
from ..draw.sizes import SizeLimits
from ..judge.diagnosis import explains
from ..judge.failures import KERNEL_RAISED
from ..judge.verdict import FAILED, PASSED, WAIVED, WARNING, Cause, Report, Verdict

if TYPE_CHECKING:
    from ..judge.registry import Property

# runs one property within the limits given (their ``avoid`` set), on one session
Rerun = Callable[["Property", "SizeLimits"], Verdict]
# settles one failed verdict with the re-runs it makes through the Rerun given: a copy
Settle = Callable[[Rerun], Verdict]
# takes a settled verdict by the index of its Settle
Keep = Callable[[int, Verdict], None]
# runs independent Settles (serially or over workers), each result to Keep on this thread
SettleAll = Callable[[Sequence[Settle], Keep], None]
FINDING = (FAILED, WARNING)
# a supervised re-run whose judging worker stalled (supervisor._hang_finding: the kernel's
# own calls are ended by the worker, so the time went on the suite's drawing or judging),
# or whose property itself broke on a drawn-around input: either way it shows nothing new
# about the kernel
_SUITE_STALLED = (
    "the judging worker sent nothing for",
    "the property could not check the kernel's result",
)


def _failed_clauses(report: Report) -> set[str]:
    return {v.clause for v in report.verdicts if v.status in FINDING} | set(report.waived)


def root_clause(report: Report, clause: str, seen: frozenset[str] = frozenset()) -> str | None:
    """The clause a failure caused by ``clause`` finally follows from: ``clause`` itself
    when one of its failures is distinct (or it is waived and none failed), else the root
    of what its failures follow from; None when that leads back into ``seen`` (a cycle)."""
    if clause in seen:
        return None
    failed = [v for v in report.verdicts if v.clause == clause and v.status in FINDING]
    if not failed or any(not v.cause for v in failed):
        return clause
    return root_clause(report, failed[0].cause, seen | {clause})


def one_at_a_time(rerun: Rerun) -> SettleAll:
    """Settle verdicts one after the other in this thread, each re-run through ``rerun``
    (one session: a single worker, or the kernel in this process)."""

    def settle_all(settles: Sequence[Settle], keep: Keep) -> None:
        for index, settle in enumerate(settles):
            keep(index, settle(rerun))

    return settle_all


def draw_around(
    report: Report, properties: Iterable[Property], settle_all: SettleAll, limits: SizeLimits
) -> Report:
    """Re-run each failed property of ``report`` around the inputs of the other clauses the
    kernel failed or waives (see the module doc), replacing its verdict with the settled
    one.  ``settle_all(settles, keep)`` runs independent settles, each given a ``rerun(prop,
    limits)`` that runs one property within ``limits`` (with ``avoid`` set), and calls
    ``keep(index, verdict)`` on this thread for each: :func:`one_at_a_time`, or over
    workers (:func:`.jobs.run_properties`).

    Failures of the clauses that govern input features are settled first, clause by
    clause in the report's order, so a clause whose own failures all follow from another
    (SDPA-1.3 failing only on GQA) is known as such before other properties would draw
    around its inputs; the others then all at once (the module doc says why that gives
    the outcome of settling them one by one)."""
    by_id = {prop.id: prop for prop in properties}
    failed = _failed_clauses(report)
    governing = {row.clause for row in BY_NAME.values()}
    positions = [
        index
        for index, verdict in enumerate(report.verdicts)
        if verdict.status in FINDING
        and verdict.property in by_id
        and by_id[verdict.property].kind != "fixed"
    ]
    batches = [
        list(batch)
        for _, batch in groupby(
            (i for i in positions if report.verdicts[i].clause in governing),
            key=lambda i: report.verdicts[i].clause,
        )
    ]
    batches.append([i for i in positions if report.verdicts[i].clause not in governing])

    def settle(index: int) -> Settle:
        verdict = report.verdicts[index]
        prop = by_id[verdict.property]
        return lambda rerun: _settled(report, verdict, prop, rerun, limits, failed)

    def keep_in(batch: list[int]) -> Keep:
        def keep(position: int, settled: Verdict) -> None:
            report.verdicts[batch[position]] = settled

        return keep

    for batch in batches:
        if batch:
            settle_all([settle(index) for index in batch], keep_in(batch))
    return report


def _implicated(report: Report, name: str, own: str, failed: set[str]) -> bool:
    """Whether a failure of clause ``own`` on inputs with feature ``name`` may follow from
    the clause governing that feature: the clause is waived, or failed on its own (not
    only as a consequence of a third clause); a partitioning feature (a dtype) only when
    one of those failures had it."""
    clause = BY_NAME[name].clause
    if clause == own or clause not in failed:
        return False
    if clause in report.waived:
        return True
    if root_clause(report, clause, frozenset({own})) != clause:
        return False  # its failures follow from another clause: draw around that one's
    if not BY_NAME[name].partitions:
        return True
    return any(
        v.clause == clause and v.status in FINDING and not v.cause and name in v.features
        for v in report.verdicts
    )


def _settles(again: Verdict) -> bool:
    return again.status == PASSED and again.examples > 0


def _unsettled(again: Verdict) -> bool:
    """The re-run showed nothing about the kernel: no example could be drawn, or it
    stalled (isolation) on discarded draws."""
    return again.status not in FINDING or again.detail.startswith(_SUITE_STALLED)


def _settled(
    report: Report,
    found: Verdict,
    prop: Property,
    rerun: Rerun,
    limits: SizeLimits,
    failed: set[str],
) -> Verdict:
    """``found`` settled by its re-runs: a copy; ``report`` is only read."""
    verdict = copy(found)
    avoid: list[str] = []
    latest = verdict
    while True:
        new = [
            name
            for name in latest.features
            if name not in avoid
            and name in BY_NAME
            and _implicated(report, name, verdict.clause, failed)
        ]
        if not new:
            break
        trial = avoid + new
        again = rerun(prop, replace(limits, avoid=tuple(trial)))
        verdict.seconds += again.seconds
        if _unsettled(again) and len(trial) > 1:
            # a smaller avoid set may draw where this one cannot (every dtype left out,
            # every draw discarded): one feature fewer at a time, the latest first
            for smaller in ([n for n in trial if n != dropped] for dropped in reversed(trial)):
                fallback = rerun(prop, replace(limits, avoid=tuple(smaller)))
                verdict.seconds += fallback.seconds
                if _settles(fallback):
                    trial, again = smaller, fallback
                    break
        if _settles(again):
            verdict.cause = BY_NAME[trial[0]].clause
            verdict.drawn_around = (
                f"passes drawn around {describe(trial)}: {again.examples} examples without "
                f"{'those inputs' if len(trial) > 1 else 'such inputs'}; it failed only on them"
            )
            return verdict
        if _unsettled(again):
            verdict.drawn_around = (
                f"could not be drawn around {describe(trial)}: "
                + (
                    "the re-run stalled drawing around them"
                    if again.status in FINDING
                    else "every draw had such inputs"
                )
                + (", nor around any one of them fewer" if len(trial) > 1 else "")
                + "; reported as found"
            )
            return verdict
        avoid = trial
        first = f"{verdict.counterexample}: {verdict.detail}"
        for name in ("detail", "counterexample", "reproduction", "hint", "features"):
            setattr(verdict, name, getattr(again, name))
        verdict.drawn_around = (
            f"still fails drawn around {describe(avoid)}, on the case shown; "
            f"first minimal case: {first}"
        )
        latest = again
    return verdict


@dataclass
class MergedFinding:
    """One minimal case among those a divergence merges (one write-up explains them all):
    its clause, the properties that failed on it, the finding and the case."""

    clause: str
    level: str
    status: str
    properties: list[str]
    finding: str
    inputs: str


@dataclass
class Divergence:
    """One root cause: its clause, the properties it failed, the minimal case, the
    write-up (docs/divergences.md, for known kernels), and the failures that follow from
    it (each "property (clause)")."""

    clause: str
    level: str
    status: str
    finding: str
    inputs: str
    properties: list[str]
    write_up: str = ""  # docs/divergences.md#anchor (upstream issue), "" when unconfirmed
    consequences: list[str] = field(default_factory=list)
    # how each consequence was shown to follow (Verdict.drawn_around), in the same order
    evidence: list[str] = field(default_factory=list)
    # what re-running it around other failed clauses showed (Verdict.drawn_around)
    drawn_around: str = ""
    # every minimal case it merges (the first is the one above), told in reports
    findings: list[MergedFinding] = field(default_factory=list)


def _flat(text: str) -> str:
    return " ".join(text.split())


def confirmed_link(verdict: Verdict, write_ups: dict[str, str] | None) -> str:
    """The write-up (docs/divergences.md) that explains ``verdict``'s failure, "" if none."""
    return _confirmed_link(verdict, verdict.clause, write_ups or {})


def _confirmed_link(verdict: Verdict, clause: str, write_ups: dict[str, str]) -> str:
    """The write-up filed under ``verdict``'s property when it explains this failure,
    listed under ``clause`` (known_kernels.confirms); "" when none does."""
    from ..kernels.known import confirms

    link = write_ups.get(verdict.property, "")
    evidence = f"{verdict.detail} {verdict.counterexample}"
    return link if link and confirms(link, verdict.clause, clause, evidence) else ""


def _add_divergence(
    merged: dict[str, Divergence],
    by_clause: dict[str, Divergence],
    group: list[Verdict],
    link: str,
) -> None:
    """Fold ``group`` (failures of one minimal case and one write-up) into ``merged``."""
    first = group[0]
    key = link or f"{first.status}:{first.property}"
    if key in merged:
        merged[key].properties += [v.property for v in group]
    else:
        merged[key] = Divergence(
            first.clause,
            first.level,
            first.status,
            _flat(first.detail),
            _flat(first.counterexample),
            [v.property for v in group],
            link,
            drawn_around=first.drawn_around,
        )
    merged[key].findings.append(
        MergedFinding(
            first.clause,
            first.level,
            first.status,
            [v.property for v in group],
            _flat(first.detail),
            _flat(first.counterexample),
        )
    )
    for v in group:
        by_clause.setdefault(v.clause, merged[key])


def divergences(report: Report, write_ups: dict[str, str] | None = None) -> list[Divergence]:
    """The report's distinct divergences, in the order they ran, each with the failures
    that follow from it folded in; a waived clause that failures follow from is listed
    first, with status "waived"."""
    write_ups = write_ups or {}
    merged: dict[str, Divergence] = {}
    by_clause: dict[str, Divergence] = {}
    distinct = [v for v in report.verdicts if v.status in FINDING and not v.cause]
    for whole in grouped_findings(report, distinct):
        # properties whose write-ups differ failed for different written-up reasons, even
        # on one minimal case: one divergence per write-up; one whose write-up does not
        # explain this failure is a divergence of its own, unconfirmed; those without a
        # write-up go with the group's first
        links = {v.property: _confirmed_link(v, v.clause, write_ups) for v in whole}
        first_link = next((link for link in links.values() if link), "")
        parts: dict[str, list[Verdict]] = {}
        for v in whole:
            unexplained = v.property in write_ups and not links[v.property]
            key = f"unconfirmed: {v.property}" if unexplained else links[v.property] or first_link
            parts.setdefault(key, []).append(v)
        for key, group in parts.items():
            link = "" if key.startswith("unconfirmed: ") else key
            _add_divergence(merged, by_clause, group, link)
    waived: list[Divergence] = []
    for v in report.verdicts:
        if v.status not in FINDING or not v.cause:
            continue
        root = root_clause(report, v.cause) or v.cause
        if root not in by_clause:  # a waived clause (CONF-7): no verdict of its own
            by_clause[root] = Divergence(
                root,
                "MUST",
                WAIVED,
                "waived by the declaration (CONF-7)",
                "",
                [],
                "",
            )
            waived.append(by_clause[root])
        via = "" if root == v.cause else f", via {v.cause}"
        if by_clause[root].status == WAIVED and not by_clause[root].write_up:
            # a waived clause's write-up is filed under the properties that meet it
            by_clause[root].write_up = _confirmed_link(v, root, write_ups)
        by_clause[root].consequences.append(f"{v.property} ({v.clause}{via})")
        by_clause[root].evidence.append(
            f"{v.property}: {v.drawn_around}; minimal case {_flat(v.counterexample)}"
        )
    return waived + list(merged.values())


def findings(report: Report) -> list[Verdict]:
    return [v for v in report.verdicts if v.status in (FAILED, WARNING)]


# Findings that say what the kernel did on any input (it raised, returned the wrong type,
# outlasted --timeout) rather than what a property measured: the same one across
# properties is one cause.
_ROOT_CAUSES = (
    KERNEL_RAISED,
    "the kernel returned ",
    "the kernel did not return within ",
    "out is a",
    "weights is a",
    "the property could not check the kernel's result",
)


def _cause(verdict: Verdict) -> tuple[str, ...]:
    if verdict.detail.startswith(_ROOT_CAUSES):
        # sizes in the message and a trailing "(context)" differ from property to
        # property; the cause does not
        cause = re.sub(r" \([^()]*\)$", "", verdict.detail)
        return (verdict.status, re.sub(r"\d+", "#", cause), verdict.hint)
    return (verdict.status, verdict.property)


def grouped_findings(
    report: Report, verdicts: Iterable[Verdict] | None = None
) -> list[list[Verdict]]:
    """Failures and warnings (of ``verdicts``, default the report's), those that share one
    root cause (the same exception, the same wrong return type) grouped, in the order
    they ran."""
    groups: dict[tuple[str, ...], list[Verdict]] = {}
    for verdict in findings(report) if verdicts is None else verdicts:
        groups.setdefault(_cause(verdict), []).append(verdict)
    return list(groups.values())


@dataclass
class ExplainedCause:
    """A cause a diagnosis probe established (``Report.causes``) and the failures of the
    run it explains (:func:`.diagnosis.explains`), in the order they ran."""

    cause: Cause
    failures: list[Verdict] = field(default_factory=list)


def by_cause(report: Report) -> tuple[list[ExplainedCause], list[Verdict]]:
    """Every failure and warning under the first established cause that explains it (in
    the order of ``Report.causes``, the probes' order: the most specific inputs first),
    and the failures no cause explains.  A failure found to follow from another clause
    (``Verdict.cause``) goes where that clause's own failures went when its own minimal
    case is explained by no cause."""
    groups = [ExplainedCause(cause) for cause in report.causes]
    unexplained: list[Verdict] = []
    placed: dict[str, ExplainedCause] = {}  # clause -> where its distinct failures went

    def place(verdict: Verdict) -> ExplainedCause | None:
        return next((g for g in groups if explains(g.cause, verdict)), None)

    found = findings(report)
    for verdict in (v for v in found if not v.cause):
        group = place(verdict)
        if group is None:
            unexplained.append(verdict)
        else:
            group.failures.append(verdict)
            placed.setdefault(verdict.clause, group)
    for verdict in (v for v in found if v.cause):
        root = root_clause(report, verdict.cause) or verdict.cause
        group = place(verdict) or placed.get(root)
        if group is None:
            unexplained.append(verdict)
        else:
            group.failures.append(verdict)
    order = {id(v): i for i, v in enumerate(report.verdicts)}
    for group in groups:
        group.failures.sort(key=lambda v: order[id(v)])
    unexplained.sort(key=lambda v: order[id(v)])
    return groups, unexplained
