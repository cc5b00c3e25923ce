"""Rendering a conformance :class:`Report`: text table, JSON, JUnit XML and Markdown.

Pure functions of the report (no I/O), shared by the CLI, the pytest plugin and
:func:`attnspec.conformance.assert_conforms`.  Every failure shows its finding, the
inputs, the reproduction snippet and, when the caller can say how, a rerun command.
"""

from __future__ import annotations

import json
import re
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from copy import copy
from dataclasses import asdict, replace
from typing import Any

from ..._version import SPEC_VERSION
from ..claims.clauses import clause as spec_clause
from ..claims.clauses import last_release, new_in_draft, spec_order
from ..claims.declaration import KernelDeclaration
from ..claims.table import claim_features
from ..judge.reproduce import Where, reproduction_lines
from ..judge.verdict import (
    FAILED,
    NOT_APPLICABLE,
    NOT_RUN,
    PASSED,
    WAIVED,
    WARNING,
    Cause,
    Report,
    Verdict,
)
from ..run.root_causes import (
    Divergence,
    ExplainedCause,
    by_cause,
    confirmed_link,
    divergences,
    findings,
    grouped_findings,
)

Rerun = Callable[[Verdict], str]
# where a reproduction too long to show is: a description, or a function that puts it
# somewhere (e.g. a file) and says where
MAX_REPRODUCTION = 6000  # characters of a reproduction shown in text
LABELS = {
    PASSED: "passed",
    FAILED: "FAILED",
    WARNING: "warning",
    NOT_APPLICABLE: "not applicable",
    WAIVED: "waived",
    NOT_RUN: "not run",
}
DETAIL_WIDTH = 72
INCOMPLETE_CLAIM = "no conformance claim: the check is incomplete (CONF-6)"


def spec_version() -> str:
    return SPEC_VERSION


def label(verdict: Verdict) -> str:
    """The verdict as the table shows it: passed / FAILED / warning / not applicable."""
    return LABELS.get(verdict.status, verdict.status)


def counts(report: Report) -> dict[str, int]:
    """How many verdicts have each status (every status present, zeros included)."""
    tally = dict.fromkeys(LABELS, 0)
    for verdict in report.verdicts:
        tally[verdict.status] = tally.get(verdict.status, 0) + 1
    return tally


def clause_title(clause_id: str) -> str:
    """The clause's title from the spec, or "" when the spec has no such clause."""
    try:
        return spec_clause(clause_id).title
    except KeyError:
        return ""


def _one_line(text: str, width: int = DETAIL_WIDTH) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def summary_line(report: Report) -> str:
    """ "conforms" or "DOES NOT CONFORM", then the count of each verdict, the wall time
    and the kernel's share of it (issue 33: the time of a check should go to the kernel)."""
    tally = counts(report)
    seconds = report.wall_seconds or sum(v.seconds for v in report.verdicts)
    in_kernel = sum(v.kernel_seconds for v in report.verdicts)
    # summed over the workers: with --jobs N it may pass the wall time when the kernel
    # is most of the work
    # none while no property has taken time yet (a report file written before the first)
    share = (
        f", {in_kernel / seconds:.0%} of the {'wall ' if report.wall_seconds else ''}time"
        if seconds > 0
        else ""
    )
    # said where it shows: a share past 100% reads as a clock error otherwise
    summed = " summed over the check's workers" if in_kernel > seconds > 0 else ""
    if report.incomplete:  # CONF-6: no verdict on conformance either way
        outcome = f"INCOMPLETE ({report.incomplete})"
    elif report.conforms:
        outcome = "conforms"
        if report.waived:
            outcome += f" except {', '.join(report.waived)} (waived, CONF-7)"
        if tally[WARNING]:
            outcome += f" (with {tally[WARNING]} SHOULD warning(s))"
    else:
        outcome = "DOES NOT CONFORM"
    return (
        f"result: {outcome}: {tally[FAILED]} failed, {tally[WARNING]} warning(s), "
        f"{tally[PASSED]} passed, {tally[NOT_APPLICABLE]} not applicable"
        f"{f', {tally[WAIVED]} waived' if tally[WAIVED] else ''}"
        f"{f', {tally[NOT_RUN]} not run' if tally[NOT_RUN] else ''} "
        f"({len(report.verdicts)} propert{'y' if len(report.verdicts) == 1 else 'ies'}, "
        f"{seconds:.1f} s{' wall time' if report.wall_seconds else ''}; "
        f"the kernel's calls took {in_kernel:.1f} s{summed}{share})"
    )


def conformance_claim(declaration: KernelDeclaration, dtypes: tuple[str, ...]) -> str:
    """The claim a conforming kernel may make (CONF-1): the version, every MUST clause its
    declaration waives (CONF-7), what it declares and the dtypes it was checked in, e.g.
    "conforms to attnspec 2026.12 (dense, bias, GQA, bottom-right causal; float16,
    bfloat16, float32)" or "conforms to attnspec 2026.12 except SDPA-5.1 (dense, ...)"."""
    waived = declaration.waived
    exception = f" except {', '.join(waived)}" if waived else ""
    return (
        f"conforms to attnspec {spec_version()}{exception} "
        f"({', '.join(claim_features(declaration))}; {', '.join(dtypes)})"
    )


def claim_line(
    report: Report, declaration: KernelDeclaration, dtypes: tuple[str, ...], *, partial: bool
) -> str:
    """The conformance claim of this run, or why it has none (CONF-1, CONF-2, CONF-6, CONF-7).

    ``partial``: only some properties ran (--only/--skip), so no claim can be made.
    """
    failed = [v.property for v in report.verdicts if v.status == FAILED]
    warned = [v.property for v in report.verdicts if v.status == WARNING]
    if report.incomplete:
        return INCOMPLETE_CLAIM
    if failed:
        return (
            f"no conformance claim: {_count(failed, 'MUST property', 'MUST properties')} "
            f"failed (CONF-1): {', '.join(failed)}"
        )
    if report.strict and warned:
        return (
            f"no conformance claim in a strict run: "
            f"{_count(warned, 'SHOULD property', 'SHOULD properties')} failed (CONF-2, "
            f"--strict): {', '.join(warned)}"
        )
    if partial:
        return "no conformance claim: only some properties ran (--only/--skip)"
    return conformance_claim(declaration, dtypes)


def _count(items: list[str], one: str, many: str) -> str:
    return f"{len(items)} {one if len(items) == 1 else many}"


def draft_clauses(report: Report) -> list[str]:
    """The clauses checked (passed, failed or warned) that are new in the draft checked
    against (not in its last release), in the spec's order: their text may still change
    (section 5)."""
    order = spec_order()
    checked = [v for v in report.verdicts if v.status in (PASSED, FAILED, WARNING)]
    found = {v.clause for v in checked if new_in_draft(v.clause)}
    return sorted(found, key=lambda clause_id: order.get(clause_id, len(order)))


def heading(report: Report) -> str:
    """The report's first line: the spec version checked against (CONF-10), with the draft
    clauses among the verdicts named, then what was checked and how."""
    seed = "derandomised" if report.seed is None else f"seed {report.seed}"
    strict = ", strict" if report.strict else ""
    draft = draft_clauses(report)
    new = f" (draft clauses, new since {last_release()[0]}: {', '.join(draft)})" if draft else ""
    return (
        f"attnspec {spec_version()}{new} conformance of {report.kernel} on {report.backend} "
        f"({report.device}), profile {report.profile}, {seed}{strict}"
    )


def divergence_count(found: Sequence[Divergence]) -> str:
    """ "N distinct divergences": the blocks a report lists (each one write-up or one
    minimal case), the waived clauses that failures follow from counted apart."""
    waived = sum(d.status == WAIVED for d in found)
    n = len(found) - waived
    return f"{n} distinct divergence{'s' * (n != 1)}" + (
        f" and {waived} waived clause{'s' * (waived != 1)} that failures follow from"
        if waived
        else ""
    )


def merged_groups(report: Report, divergence: Divergence) -> list[list[Verdict]]:
    """The failures ``divergence`` lists, one group per minimal case it merges (several
    when one write-up explains them all); none for a waived clause."""
    listed = [v for v in findings(report) if v.property in divergence.properties]
    return grouped_findings(report, listed)


def divergence_lines(
    report: Report,
    write_ups: dict[str, str] | None = None,
    *,
    rerun: Rerun | None = None,
    max_reproduction: int | None = MAX_REPRODUCTION,
    full_reproduction_in: Where = "the JSON report (--json PATH)",
) -> list[str]:
    """The distinct divergences, each told in full (with its write-up when a known kernel's
    is confirmed; every minimal case one write-up merges), then the failures that follow
    from each, folded under their cause with the evidence (root_causes.draw_around);
    nothing is left out."""
    if report.causes:
        return _cause_lines(
            report,
            write_ups,
            rerun=rerun,
            max_reproduction=max_reproduction,
            full_reproduction_in=full_reproduction_in,
        )
    found = divergences(report, write_ups)
    if not found:
        return []
    folded = sum(len(d.consequences) for d in found)
    lines = [
        "",
        divergence_count(found)
        + (f", {folded} failure{'s' * (folded != 1)} folded as consequences" if folded else "")
        + ":",
    ]
    lines.extend(
        _divergence_blocks(
            report,
            found,
            rerun=rerun,
            max_reproduction=max_reproduction,
            full_reproduction_in=full_reproduction_in,
        )
    )
    return lines


def unexplained_report(report: Report, unexplained: Sequence[Verdict]) -> Report:
    """``report`` with only the failures in ``unexplained`` (the others' verdicts left
    out), for listing them as divergences."""
    keep = {id(v) for v in unexplained}
    rest = copy(report)
    rest.verdicts = [
        v for v in report.verdicts if v.status not in (FAILED, WARNING) or id(v) in keep
    ]
    return rest


def cause_count(groups: Sequence[ExplainedCause], found: Sequence[Divergence]) -> str:
    """ "N causes: K established by diagnosis probes, M found by the properties alone"."""
    waived = sum(d.status == WAIVED for d in found)
    n = len(groups) + len(found) - waived
    return (
        f"{n} cause{'s' * (n != 1)}: {len(groups)} established by diagnosis probes, "
        f"{len(found) - waived} found by the properties alone"
        + (
            f" (and {waived} waived clause{'s' * (waived != 1)} that failures follow from)"
            if waived
            else ""
        )
    )


def _cause_lines(
    report: Report,
    write_ups: dict[str, str] | None,
    *,
    rerun: Rerun | None,
    max_reproduction: int | None,
    full_reproduction_in: Where,
) -> list[str]:
    """Each established cause once, with its evidence, hint and every failure it explains
    (one told in full, of the cause's own clause where one failed; the others folded to
    one line each), then the failures no cause explains as distinct divergences."""
    groups, unexplained = by_cause(report)
    rest = unexplained_report(report, unexplained)
    found = divergences(rest, write_ups)
    explained = sum(len(g.failures) for g in groups)
    lines = [
        "",
        cause_count(groups, found)
        + f"; {explained} failure{'s' * (explained != 1)} explained by a probed cause:",
    ]
    for number, group in enumerate(groups, 1):
        cause = group.cause
        title = clause_title(cause.clause)
        lines.extend(
            [
                "",
                f"cause {number}: {cause.explanation} [{cause.clause}"
                f"{': ' + title if title else ''}]",
                f"  evidence: {cause.evidence}",
            ]
        )
        if cause.hint:
            lines.append(f"  hint:     {cause.hint}")
        if not group.failures:
            lines.append("  explains no failure of this run (the probe found it on its own)")
            continue
        # told in full: a failure of the cause's own clause (the property that checks
        # what the cause breaks) where there is one, else the first that ran
        first = next((v for v in group.failures if v.clause == cause.clause), group.failures[0])
        others = [v for v in group.failures if v is not first]
        lines.append(
            f"  explains {len(group.failures)} failure{'s' * (len(group.failures) != 1)}"
            + (f", {first.property} told in full:" if others else ":")
        )
        lines.extend(
            "  " + line
            for line in failure_text(
                first,
                rerun,
                max_reproduction=max_reproduction,
                full_reproduction_in=full_reproduction_in,
            ).splitlines()
        )
        if confirmed_link(first, write_ups):
            lines.append(f"    confirmed:   {confirmed_link(first, write_ups)}")
        for verdict in others:
            link = confirmed_link(verdict, write_ups)
            lines.append(
                f"    - {label(verdict)} {verdict.property} [{verdict.clause}]: "
                f"{_one_line(verdict.detail, 110)}; "
                f"inputs: {_one_line(verdict.counterexample, 110)}"
                + (f"; confirmed: {link}" if link else "")
            )
    if found:
        lines.extend(["", f"failures no probed cause explains ({divergence_count(found)}):"])
        lines.extend(
            _divergence_blocks(
                rest,
                found,
                rerun=rerun,
                max_reproduction=max_reproduction,
                full_reproduction_in=full_reproduction_in,
            )
        )
    return lines


def cause_summary(
    report: Report, write_ups: dict[str, str] | None = None, width: int = 160
) -> list[str]:
    """The causes as the console tells them, one short block each for a CI log or a
    terminal summary (JUnit, the pytest plugin): the header counting causes, each cause
    established by a probe with its evidence, hint and the failures it explains, then
    each divergence no probe explains with its properties and finding; the distinct
    divergences alone when no probe established a cause.  Empty when nothing failed."""
    groups, unexplained = by_cause(report)
    found = divergences(unexplained_report(report, unexplained), write_ups)
    if not groups and not found:
        return []
    lines = [
        (cause_count(groups, found) if groups else divergence_count(found)) + ":",
    ]
    for number, group in enumerate(groups, 1):
        cause = group.cause
        lines.extend(
            told_cause(
                f"cause {number}: {cause.explanation} [{cause.clause}]",
                replace(cause, evidence=_one_line(cause.evidence, width)),
                [f"{v.property} [{v.clause}]" for v in group.failures],
                "  ",
            )
        )
    for divergence in found:
        lines.append(
            ("not explained by a probe: " if groups else "")
            + f"{divergence.clause} ({divergence.status}): "
            + (", ".join(divergence.properties) or "waived")
            + (f": {_one_line(divergence.finding, width)}" if divergence.properties else "")
        )
        if divergence.write_up:
            lines.append(f"  confirmed: {divergence.write_up}")
        lines.extend(f"  consequence: {_one_line(e, width)}" for e in divergence.evidence)
    return lines


def told_cause(head: str, cause: Cause, explains: Sequence[str], indent: str) -> list[str]:
    """``head``, then the cause's evidence, hint and the failures it ``explains``, each on
    a line of its own starting with ``indent`` (the short forms of a cause: CI logs,
    Markdown reports, the matrix)."""
    return [
        head,
        f"{indent}evidence: {cause.evidence}",
        *([f"{indent}hint: {cause.hint}"] if cause.hint else []),
        f"{indent}explains: "
        + (", ".join(explains) or "no failure of this run (the probe found it on its own)"),
    ]


def cause_of(report: Report, verdict: Verdict) -> str:
    """ "cause N: explanation [clause]" for a failure a probed cause explains, "" when
    none does (the numbering of :func:`cause_summary` and the console)."""
    groups, _ = by_cause(report)
    for number, group in enumerate(groups, 1):
        if any(v is verdict for v in group.failures):
            return f"cause {number}: {group.cause.explanation} [{group.cause.clause}]"
    return ""


def _divergence_blocks(
    report: Report,
    found: Sequence[Divergence],
    *,
    rerun: Rerun | None,
    max_reproduction: int | None,
    full_reproduction_in: Where,
) -> list[str]:
    lines: list[str] = []
    for divergence in found:
        groups = merged_groups(report, divergence)
        lines.append("")
        if not groups:  # a waived clause other failures follow from
            lines.append(
                f"waived {divergence.clause} [{divergence.level}: "
                f"{clause_title(divergence.clause)}]: the declaration waives it "
                "(CONF-7)"
            )
        if len(groups) > 1:
            lines.append(
                f"one divergence, {len(groups)} findings that one write-up explains "
                f"({divergence.write_up or 'unconfirmed'}):"
            )
        for group in groups:
            lines.append(
                group_text(
                    group,
                    rerun,
                    max_reproduction=max_reproduction,
                    full_reproduction_in=full_reproduction_in,
                )
            )
            if group[0].drawn_around:
                lines.append(f"  drawn around: {group[0].drawn_around}")
        if divergence.write_up:
            lines.append(f"  confirmed:   {divergence.write_up}")
        n_consequences = len(divergence.consequences)
        lines += _consequence_lines(
            divergence,
            f"  consequences ({n_consequences}), each passing with {divergence.clause}'s "
            "inputs drawn around:",
        )
    return lines


def _consequence_lines(divergence: Divergence, header: str, clip: int | None = None) -> list[str]:
    """A divergence's consequences, if it has any: ``header``, then each one's evidence
    (cut at ``clip`` characters) as a nested item, in the text report and in Markdown
    alike."""
    if not divergence.consequences:
        return []
    return [header, *(f"    - {line[:clip]}" for line in divergence.evidence)]


def failure_text(
    verdict: Verdict,
    rerun: Rerun | None = None,
    *,
    max_reproduction: int | None = MAX_REPRODUCTION,
    full_reproduction_in: Where = "the JSON report (--json PATH)",
) -> str:
    """Everything about one failed or warning verdict: clause, finding, inputs, how to rerun.

    A reproduction longer than ``max_reproduction`` characters (its inputs are written
    out as literals) is not shown; the text says where the full one is
    (``full_reproduction_in``, or what it returns for the verdict, e.g. after writing it
    to a file).
    """
    title = clause_title(verdict.clause)
    lines = [
        f"{label(verdict)} {verdict.property} [{verdict.clause} {verdict.level}"
        f"{': ' + title if title else ''}]"
    ]
    lines.extend(_case_lines(verdict, rerun, max_reproduction, full_reproduction_in))
    return "\n".join(lines)


def _case_lines(
    verdict: Verdict, rerun: Rerun | None, max_reproduction: int | None, full_reproduction_in: Where
) -> list[str]:
    lines = [f"  {name + ':':<8} {value}" for name, value, _ in _case_fields(verdict, rerun)]
    return lines + reproduction_lines(verdict, max_reproduction, full_reproduction_in)


def _case_fields(verdict: Verdict, rerun: Rerun | None) -> list[tuple[str, str, bool]]:
    """A failure's finding, then its hint, inputs and rerun command where it has them, as
    (name, text, whether the text is code), for the text report and Markdown alike."""
    fields = [("finding", verdict.detail, False)]
    if verdict.hint:
        fields.append(("hint", verdict.hint, False))
    if verdict.counterexample:
        fields.append(("inputs", verdict.counterexample, True))
    if rerun is not None:
        fields.append(("rerun", rerun(verdict), True))
    return fields


def group_text(
    group: list[Verdict],
    rerun: Rerun | None = None,
    *,
    max_reproduction: int | None = MAX_REPRODUCTION,
    full_reproduction_in: Where = "the JSON report (--json PATH)",
) -> str:
    """:func:`failure_text` for one verdict; for several with one root cause, one finding
    naming every property, told in full for the first."""
    if len(group) == 1:
        return failure_text(
            group[0],
            rerun,
            max_reproduction=max_reproduction,
            full_reproduction_in=full_reproduction_in,
        )
    first = group[0]
    names = ", ".join(f"{v.property} [{v.clause}]" for v in group)
    lines = [
        f"{label(first)} {len(group)} properties, one cause [{first.level}]:",
        *textwrap.wrap(names, 96, initial_indent="  ", subsequent_indent="  "),
        f"  (told for the first, {first.property}; the others failed the same way)",
    ]
    lines.extend(_case_lines(first, rerun, max_reproduction, full_reproduction_in))
    return "\n".join(lines)


def format_table(
    report: Report,
    *,
    rerun: Rerun | None = None,
    max_reproduction: int | None = MAX_REPRODUCTION,
    full_reproduction_in: Where = "the JSON report (--json PATH)",
    write_ups: dict[str, str] | None = None,
) -> str:
    """The distinct divergences (one per root cause, with their consequences folded in:
    :func:`divergence_lines`), then the verdict table, a summary, the hints and the
    claim.  ``write_ups``: property id -> a known kernel's confirmed write-up."""
    header = ("property", "clause", "level", "verdict", "time", "detail")
    rows = [
        (
            v.property,
            v.clause,
            v.level,
            label(v),
            "" if v.status in (NOT_APPLICABLE, WAIVED) else f"{v.seconds:.1f}s",
            _one_line(f"(follows from {v.cause}) {v.detail}" if v.cause else v.detail),
        )
        for v in report.verdicts
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def render(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        return "  ".join([*cells, row[-1]]).rstrip()

    lines = [heading(report), *(f"note: {note}" for note in report.notes)]
    lines.extend(
        divergence_lines(
            report,
            write_ups,
            rerun=rerun,
            max_reproduction=max_reproduction,
            full_reproduction_in=full_reproduction_in,
        )
    )
    lines.extend(["", render(header), render((*("-" * w for w in widths), ""))])
    lines.extend(render(row) for row in rows)
    lines.extend(["", not_checked_line(report), summary_line(report)])
    lines.extend(f"hint: {hint}" for hint in report.hints)
    if report.claim:
        lines.append(report.claim)
    return "\n".join(lines)


def not_checked_line(report: Report) -> str:
    """ "not checked: ..." (``Report.not_checked``), in every report."""
    return "not checked: " + ("; ".join(report.not_checked) or "nothing left out")


def report_dict(
    report: Report, *, rerun: Rerun | None = None, write_ups: dict[str, str] | None = None
) -> dict[str, Any]:
    """``Report.to_dict()`` plus the spec version, the verdict counts, rerun commands, the
    findings that share a cause (``findings``) and the distinct divergences with their
    consequences (``divergences``, see :mod:`.root_causes`)."""
    data = report.to_dict()
    data["spec_version"] = spec_version()
    data["draft_clauses"] = draft_clauses(report)
    data["counts"] = counts(report)
    data["findings"] = [
        {
            "status": group[0].status,
            "finding": group[0].detail,
            "hint": group[0].hint,
            "properties": [v.property for v in group],
        }
        for group in grouped_findings(report)
    ]
    groups, unexplained = by_cause(report)
    data["causes"] = [
        {**asdict(group.cause), "explains": [v.property for v in group.failures]}
        for group in groups
    ]
    data["divergences"] = [
        asdict(d) for d in divergences(unexplained_report(report, unexplained), write_ups)
    ]
    data["complete"] = not report.incomplete
    if rerun is not None:
        for entry, verdict in zip(data["verdicts"], report.verdicts, strict=True):
            entry["rerun"] = rerun(verdict) if verdict.status in (FAILED, WARNING) else ""
    return data


def to_json(
    report: Report, *, rerun: Rerun | None = None, write_ups: dict[str, str] | None = None
) -> str:
    return (
        json.dumps(report_dict(report, rerun=rerun, write_ups=write_ups), indent=2, default=str)
        + "\n"
    )


def junit_classname(target: str) -> str:
    """``attnspec.<module>.<function>`` for JUnit: a file target gives its file's stem, so
    no slash or dot of the path splits the name into bogus packages."""
    module, _, name = target.rpartition(":")
    if module.endswith(".py"):
        module = re.split(r"[\\/]", module)[-1][: -len(".py")]
    parts = [*(module.split(".") if module else []), *name.split(".")]
    return ".".join(["attnspec", *(re.sub(r"\W+", "_", part).strip("_") or "_" for part in parts)])


def to_junit(report: Report, *, rerun: Rerun | None = None) -> str:
    """JUnit XML: one testcase per property; failure, skipped (not applicable), system-out.

    A SHOULD warning is a failure element only in a strict run; otherwise the testcase
    passes and its system-out says what it should do better (CONF-2).
    """
    tally = counts(report)
    failing = tally[FAILED] + (tally[WARNING] if report.strict else 0)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"attnspec {report.kernel}",
        tests=str(len(report.verdicts)),
        failures=str(failing),
        errors="0",
        skipped=str(tally[NOT_APPLICABLE] + tally[WAIVED]),
        time=f"{sum(v.seconds for v in report.verdicts):.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    causes = cause_summary(report)
    for name, value in [
        ("spec_version", spec_version()),
        ("backend", report.backend),
        ("device", report.device),
        ("profile", report.profile),
        ("seed", str(report.seed)),
        ("strict", str(report.strict)),
        ("conforms", str(report.conforms)),
        ("complete", str(not report.incomplete)),
        ("waived", " ".join(report.waived)),
        ("claim", report.claim),
        *(("note", note) for note in report.notes),
        *((("causes", causes[0].rstrip(":")),) if causes else ()),
    ]:
        ET.SubElement(properties, "property", name=name, value=value)
    for verdict in report.verdicts:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=junit_classname(report.kernel),
            name=f"{verdict.property}[{verdict.clause}]",
            time=f"{verdict.seconds:.3f}",
        )
        if verdict.status in (NOT_APPLICABLE, WAIVED):
            ET.SubElement(case, "skipped", message=verdict.detail)
        elif verdict.status == FAILED or (verdict.status == WARNING and report.strict):
            element = ET.SubElement(
                case,
                "failure",
                message=_one_line(verdict.detail, 500),
                type=f"{verdict.clause} {verdict.level}",
            )
            cause = cause_of(report, verdict)
            element.text = (cause + "\n" if cause else "") + failure_text(verdict, rerun)
        if verdict.status in (FAILED, WARNING):
            out = ET.SubElement(case, "system-out")
            out.text = (
                failure_text(verdict, rerun)
                if verdict.status == WARNING
                else (
                    verdict.reproduction
                    if len(verdict.reproduction) <= MAX_REPRODUCTION
                    else reproduction_lines(
                        verdict, MAX_REPRODUCTION, "the JSON report (--json PATH)"
                    )[0].strip()
                )
            )
    if causes:  # the causes as the console tells them, for the whole run
        ET.SubElement(suite, "system-out").text = "\n".join(causes)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


# Why this stays parallel to the divergence lines of the text report above: the two render
# the same fields (drawn around, confirmed, consequences) in two formats, each with its own
# wording and clipping; a shared skeleton would hide which format a line belongs to (the
# consequences' evidence alone is nested alike: _consequence_lines).
def divergence_markdown(divergence: Divergence, confirmed: str, clip: int = 2000) -> list[str]:
    """A Markdown list item for ``divergence`` (``confirmed``: how its write-up is told),
    with every minimal case it merges, what it was drawn around and its consequences;
    each text cut at ``clip`` characters (the matrix keeps its page short)."""
    d = divergence
    lines = [
        f"- **{d.clause}** ({d.level}, {d.status}) — {confirmed}; properties: "
        f"{', '.join(d.properties)}"
    ]
    if len(d.findings) > 1:
        lines.append(f"  - {len(d.findings)} findings, one write-up explains them all:")
        for case in d.findings:
            lines.append(
                f"    - `{'`, `'.join(case.properties)}` ({case.clause}, {case.level}, "
                f"{case.status}): {case.finding[:clip]}"
                + (f"; minimal case: {case.inputs[:clip]}" if case.inputs else "")
            )
    else:
        lines.append(f"  - finding: {d.finding[:clip]}")
        if d.inputs:
            lines.append(f"  - minimal case: {d.inputs[:clip]}")
    if d.drawn_around:
        lines.append(f"  - drawn around: {d.drawn_around[:clip]}")
    consequences = ", ".join(d.consequences)
    header = f"  - consequences (each passes re-run with these inputs drawn around): {consequences}"
    return lines + _consequence_lines(d, header, clip)


def _divergences_markdown(report: Report, write_ups: dict[str, str] | None) -> list[str]:
    groups, unexplained = by_cause(report)
    found = divergences(unexplained_report(report, unexplained), write_ups)
    lines = []
    if groups:
        lines.extend(["", f"### {cause_count(groups, found)}", ""])
        for group in groups:
            cause = group.cause
            lines.extend(
                told_cause(
                    f"- **{cause.clause}**: {cause.explanation}",
                    cause,
                    [f"`{v.property}`" for v in group.failures],
                    "  - ",
                )
            )
    if not found:
        return lines
    lines.extend(["", f"### {divergence_count(found)}", ""])
    for d in found:
        confirmed = (
            f"confirmed: {d.write_up}"
            if d.write_up
            else "declared, not checked"
            if d.status == WAIVED
            else "unconfirmed"
        )
        lines.extend(divergence_markdown(d, confirmed))
    return lines


def _cell(text: str) -> str:
    return _one_line(text, 200).replace("|", "\\|")


def to_markdown(
    report: Report, *, rerun: Rerun | None = None, write_ups: dict[str, str] | None = None
) -> str:
    """A Markdown table of verdicts, the distinct divergences (``write_ups``: property id
    -> a known kernel's confirmed write-up), then one section per failure with its
    reproduction."""
    lines = [
        f"## {heading(report)}",
        "",
        "| property | clause | level | verdict | detail |",
        "|---|---|---|---|---|",
    ]
    for v in report.verdicts:
        verdict = f"**{label(v)}**" if v.status in (FAILED, WARNING) else label(v)
        lines.append(f"| `{v.property}` | {v.clause} | {v.level} | {verdict} | {_cell(v.detail)} |")
    lines.extend(_divergences_markdown(report, write_ups))
    for group in grouped_findings(report):
        v = group[0]
        title = (
            f"{label(v)} `{v.property}` ({v.clause}, {v.level})"
            if len(group) == 1
            else f"{label(v)} {len(group)} properties, one cause ({v.level}): "
            + ", ".join(f"`{g.property}`" for g in group)
        )
        lines.extend(["", f"### {title}", ""])
        for name, text, code in _case_fields(v, rerun):
            lines.append(f"- {name}: `{text}`" if code else f"- {name}: {text}")
        if v.reproduction and len(v.reproduction) <= MAX_REPRODUCTION:
            lines.extend(["", "```python", v.reproduction, "```"])
        elif v.reproduction:
            lines.append(
                f"- reproduction: {len(v.reproduction)} characters, in the JSON "
                "report (--json PATH)"
            )
    lines.extend(["", summary_line(report), "", not_checked_line(report)])
    lines.extend(f"- hint: {hint}" for hint in report.hints)
    if report.claim:
        lines.extend(["", report.claim])
    return "\n".join(lines) + "\n"
