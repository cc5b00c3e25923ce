"""Rendering a conformance :class:`Report`: text table, JSON, JUnit XML and Markdown.

Pure functions of the report (no I/O), shared by the CLI, the pytest plugin and
:func:`attnspec.conformance.assert_conforms`.  Every failure shows its finding, the
inputs, the reproduction snippet and, when the caller can say how, a rerun command.
"""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from .clauses import clause as spec_clause
from .declaration import KernelDeclaration
from .runner import FAILED, NOT_APPLICABLE, PASSED, WARNING, Report, Verdict

Rerun = Callable[[Verdict], str]
LABELS = {PASSED: "passed", FAILED: "FAILED", WARNING: "warning", NOT_APPLICABLE: "not applicable"}
DETAIL_WIDTH = 72


def spec_version() -> str:
    from .. import SPEC_VERSION

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
    """"conforms" or "DOES NOT CONFORM", then the count of each verdict."""
    tally = counts(report)
    seconds = sum(v.seconds for v in report.verdicts)
    if report.incomplete:  # CONF-6: no verdict on conformance either way
        outcome = f"INCOMPLETE ({report.incomplete})"
    elif report.conforms:
        outcome = "conforms"
        if tally[WARNING]:
            outcome += f" (with {tally[WARNING]} SHOULD warning(s))"
    else:
        outcome = "DOES NOT CONFORM"
    return (
        f"result: {outcome}: {tally[FAILED]} failed, {tally[WARNING]} warning(s), "
        f"{tally[PASSED]} passed, {tally[NOT_APPLICABLE]} not applicable "
        f"({len(report.verdicts)} propert{'y' if len(report.verdicts) == 1 else 'ies'}, "
        f"{seconds:.1f} s)"
    )


def conformance_claim(declaration: KernelDeclaration, dtypes: tuple[str, ...]) -> str:
    """The claim a conforming kernel may make (CONF-1): the version, what it declares and
    the dtypes it was checked in, e.g. "conforms to attnspec 2026.12 (dense, bias, GQA,
    bottom-right causal; float16, bfloat16, float32)"."""
    features = [declaration.family]
    if declaration.family == "dense":
        features += [name for name, claimed in (
            ("mask", declaration.mask), ("bias", declaration.bias), ("GQA", declaration.gqa),
            (f"{declaration.causal_alignment.replace('_', '-')} causal", declaration.causal),
            ("explicit scale", declaration.scale), ("returned weights",
                                                    declaration.returns_weights),
        ) if claimed]
        if not declaration.empty_rows_zero:
            features.append("without the fully-masked-row rule")
    elif declaration.sparse is not None:
        features.append(declaration.sparse.pattern)
    elif declaration.linear is not None and isinstance(declaration.linear.feature_map, str):
        features.append(declaration.linear.feature_map)
    return f"conforms to attnspec {spec_version()} ({', '.join(features)}; {', '.join(dtypes)})"


def heading(report: Report) -> str:
    seed = "derandomised" if report.seed is None else f"seed {report.seed}"
    strict = ", strict" if report.strict else ""
    return (
        f"attnspec {spec_version()} conformance of {report.kernel} on {report.backend} "
        f"({report.device}), profile {report.profile}, {seed}{strict}"
    )


def _findings(report: Report) -> list[Verdict]:
    return [v for v in report.verdicts if v.status in (FAILED, WARNING)]


def failure_text(
    verdict: Verdict, rerun: Rerun | None = None, *, max_reproduction: int | None = None,
    full_reproduction_in: str = "the JSON report (--json PATH)",
) -> str:
    """Everything about one failed or warning verdict: clause, finding, inputs, how to rerun.

    A reproduction longer than ``max_reproduction`` characters (its inputs are written
    out as literals) is not shown; the text says where the full one is.
    """
    title = clause_title(verdict.clause)
    lines = [f"{label(verdict)} {verdict.property} [{verdict.clause} {verdict.level}"
             f"{': ' + title if title else ''}]"]
    lines.append(f"  finding: {verdict.detail}")
    if verdict.counterexample:
        lines.append(f"  inputs:  {verdict.counterexample}")
    if rerun is not None:
        lines.append(f"  rerun:   {rerun(verdict)}")
    size = len(verdict.reproduction)
    if size and max_reproduction is not None and size > max_reproduction:
        lines.append(f"  reproduction: {size} characters of literal inputs, too long to show "
                     f"here; it is in {full_reproduction_in}")
    elif size:
        lines.append("  reproduction (runs on its own):")
        lines.append(textwrap.indent(verdict.reproduction, "    "))
    return "\n".join(lines)


def format_table(
    report: Report, *, rerun: Rerun | None = None, max_reproduction: int | None = None,
    full_reproduction_in: str = "the JSON report (--json PATH)",
) -> str:
    """The verdict table, then the full story of every failure and warning, then a summary."""
    header = ("property", "clause", "level", "verdict", "time", "detail")
    rows = [
        (v.property, v.clause, v.level, label(v),
         "" if v.status == NOT_APPLICABLE else f"{v.seconds:.1f}s", _one_line(v.detail))
        for v in report.verdicts
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def render(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        return "  ".join([*cells, row[-1]]).rstrip()

    lines = [heading(report), "", render(header), render((*("-" * w for w in widths), ""))]
    lines.extend(render(row) for row in rows)
    for verdict in _findings(report):
        lines.extend(["", failure_text(verdict, rerun, max_reproduction=max_reproduction,
                                       full_reproduction_in=full_reproduction_in)])
    lines.extend(["", summary_line(report)])
    return "\n".join(lines)


def report_dict(report: Report, *, rerun: Rerun | None = None) -> dict[str, Any]:
    """``Report.to_dict()`` plus the spec version, the verdict counts and rerun commands."""
    data = report.to_dict()
    data["spec_version"] = spec_version()
    data["counts"] = counts(report)
    data["complete"] = not report.incomplete
    if rerun is not None:
        for entry, verdict in zip(data["verdicts"], report.verdicts, strict=True):
            entry["rerun"] = rerun(verdict) if verdict.status in (FAILED, WARNING) else ""
    return data


def to_json(report: Report, *, rerun: Rerun | None = None) -> str:
    return json.dumps(report_dict(report, rerun=rerun), indent=2, default=str) + "\n"


def to_junit(report: Report, *, rerun: Rerun | None = None) -> str:
    """JUnit XML: one testcase per property; failure, skipped (not applicable), system-out.

    A SHOULD warning is a failure element only in a strict run; otherwise the testcase
    passes and its system-out says what it should do better (CONF-2).
    """
    tally = counts(report)
    failing = tally[FAILED] + (tally[WARNING] if report.strict else 0)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites, "testsuite", name=f"attnspec {report.kernel}", tests=str(len(report.verdicts)),
        failures=str(failing), errors="0", skipped=str(tally[NOT_APPLICABLE]),
        time=f"{sum(v.seconds for v in report.verdicts):.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in [("spec_version", spec_version()), ("backend", report.backend),
                        ("device", report.device), ("profile", report.profile),
                        ("seed", str(report.seed)), ("strict", str(report.strict)),
                        ("conforms", str(report.conforms)),
                        ("complete", str(not report.incomplete))]:
        ET.SubElement(properties, "property", name=name, value=value)
    for verdict in report.verdicts:
        case = ET.SubElement(
            suite, "testcase", classname=f"attnspec.{report.kernel}",
            name=f"{verdict.property}[{verdict.clause}]", time=f"{verdict.seconds:.3f}",
        )
        if verdict.status == NOT_APPLICABLE:
            ET.SubElement(case, "skipped", message=verdict.detail)
        elif verdict.status == FAILED or (verdict.status == WARNING and report.strict):
            element = ET.SubElement(case, "failure", message=_one_line(verdict.detail, 500),
                                    type=f"{verdict.clause} {verdict.level}")
            element.text = failure_text(verdict, rerun)
        if verdict.status in (FAILED, WARNING):
            out = ET.SubElement(case, "system-out")
            out.text = failure_text(verdict, rerun) if verdict.status == WARNING else (
                verdict.reproduction
            )
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _cell(text: str) -> str:
    return _one_line(text, 200).replace("|", "\\|")


def to_markdown(report: Report, *, rerun: Rerun | None = None) -> str:
    """A Markdown table of verdicts, then one section per failure with its reproduction."""
    lines = [f"## {heading(report)}", "", "| property | clause | level | verdict | detail |",
             "|---|---|---|---|---|"]
    for v in report.verdicts:
        verdict = f"**{label(v)}**" if v.status in (FAILED, WARNING) else label(v)
        lines.append(f"| `{v.property}` | {v.clause} | {v.level} | {verdict} | "
                     f"{_cell(v.detail)} |")
    for v in _findings(report):
        lines.extend(["", f"### {label(v)} `{v.property}` ({v.clause}, {v.level})", "",
                      f"- finding: {v.detail}"])
        if v.counterexample:
            lines.append(f"- inputs: `{v.counterexample}`")
        if rerun is not None:
            lines.append(f"- rerun: `{rerun(v)}`")
        if v.reproduction:
            lines.extend(["", "```python", v.reproduction, "```"])
    lines.extend(["", summary_line(report)])
    return "\n".join(lines) + "\n"
