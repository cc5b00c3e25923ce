"""What ``attnspec check`` prints and writes: progress, the table, the claim line, report
files, JUnit, Markdown and JSON (CONF-1, CONF-2).
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support import KERNELS, CheckRun, kernel_file, report_of

from attnspec import SPEC_VERSION
from attnspec.conformance import cli
from attnspec.conformance.judge.verdict import (  # by name, as report/render.py imports them
    FAILED,
    NOT_APPLICABLE,
    NOT_RUN,
    PASSED,
    WAIVED,
    WARNING,
    Report,
    Verdict,
)
from attnspec.conformance.report import render

PRINTING_KERNEL = (
    KERNELS
    + """

import os
import re


def chatty(q, k, v, *, mask=None, is_causal=False, scale=None):
    import warnings

    warnings.warn("WARNED BY THE KERNEL")
    print("PRINTED BY THE KERNEL")
    os.write(1, b"WRITTEN TO FD 1\\n")
    return correct(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
"""
)


def test_kernel_output_is_kept_off_the_table(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table on stdout stays clean: what the kernel prints (print, raw fd 1, warnings)
    goes to stderr by default, to --kernel-output PATH when given, nowhere with --quiet (which
    also drops the progress lines).  The command in this process, started in ``tmp_path``,
    its file descriptors 1 and 2 captured (the kernel's process writes to what it inherits)."""
    kernel_file(tmp_path, "chatty.py", PRINTING_KERNEL)
    monkeypatch.chdir(tmp_path)
    only = ("--only", "default-scale")
    kernel_said = ("PRINTED BY THE KERNEL", "WRITTEN TO FD 1", "WARNED BY THE KERNEL")

    def run(*flags: str) -> tuple[int, str, str]:
        status = cli.main(["check", "chatty.py:chatty", *only, *flags])
        out, err = capfd.readouterr()
        return status, out, err

    status, out, err = run()
    assert status == 0, err
    assert not any(text in out for text in kernel_said)
    assert all(text in err for text in kernel_said)
    assert "result: conforms" in out

    _, out, err = run("--kernel-output", "k.log")
    log = (tmp_path / "k.log").read_text(encoding="utf-8")
    assert all(text in log for text in kernel_said)
    assert not any(text in out + err for text in kernel_said)

    status, out, err = run("--quiet")
    assert status == 0 and err == ""
    assert not any(text in out for text in kernel_said)


def test_report_files_parse(unscaled_run: CheckRun) -> None:
    """--json, --junit and --markdown write reports that parse and agree with the run (the
    failing check test_check.py's tests read too, conftest.unscaled_run)."""
    paths = unscaled_run.reports
    assert unscaled_run.status == 1
    data = json.loads(paths["json"].read_text())
    assert data["spec_version"] == SPEC_VERSION and data["conforms"] is False
    assert data["counts"][FAILED] == 1 and data["counts"][PASSED] == 1
    failed = next(v for v in data["verdicts"] if v["status"] == FAILED)
    assert failed["clause"] == "SDPA-2.1" and "--only default-scale" in failed["rerun"]

    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    # the file's path gives no bogus packages: neither its slashes nor its dots
    assert {case.get("classname") for case in cases.values()} == {
        "attnspec.kernels.no_default_scale"
    }
    assert set(cases) == {"default-scale[SDPA-2.1]", "explicit-scale[SDPA-2.2]"}
    assert cases["default-scale[SDPA-2.1]"].find("failure") is not None
    assert "KernelUnderTest" in cases["default-scale[SDPA-2.1]"].findtext("system-out", "")
    assert cases["explicit-scale[SDPA-2.2]"].find("failure") is None

    markdown = paths["markdown"].read_text()
    assert "| property | clause | level | verdict | detail |" in markdown
    assert "| `default-scale` | SDPA-2.1 | MUST | **FAILED** |" in markdown
    assert "```python" in markdown


def test_claim_line_says_why_there_is_no_claim() -> None:
    """CONF-1, CONF-2: a MUST failure, a strict run's SHOULD warning and a partial run each
    give their own reason; a strict warning never reads as a MUST failure."""
    from attnspec.conformance import KernelDeclaration

    declaration, dtypes = KernelDeclaration(), ("float32",)
    report = _report()
    assert render.claim_line(report, declaration, dtypes, partial=False) == (
        "no conformance claim: 1 MUST property failed (CONF-1): bad"
    )
    report.verdicts = [v for v in report.verdicts if v.status != FAILED]
    assert render.claim_line(report, declaration, dtypes, partial=False).startswith(
        f"conforms to attnspec {SPEC_VERSION} (dense"
    )
    report.strict = True
    assert render.claim_line(report, declaration, dtypes, partial=False) == (
        "no conformance claim in a strict run: 1 SHOULD property failed (CONF-2, --strict): meh"
    )
    report.strict = False
    assert render.claim_line(report, declaration, dtypes, partial=True) == (
        "no conformance claim: only some properties ran (--only/--skip)"
    )


def _prop(property_id: str = "p", clause: str = "SDPA-2.1") -> object:
    return type("P", (), {"id": property_id, "clause": clause})()


def test_progress_display_plain_and_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress: when piped, a line as each property starts (so a log shows which one
    hangs) and one with its verdict, the failures so far and the wall time; on a terminal
    one line rewritten in place (property n of N, failures so far, elapsed wall time);
    in CI plain lines even on a terminal."""
    ticks = iter(range(100))
    plain = io.StringIO()
    display = cli.ProgressDisplay(3, plain, clock=lambda: 10.0 * next(ticks))
    display(_prop("a"), None)  # type: ignore[arg-type]
    display(_prop("a"), Verdict("a", "SDPA-2.1", "MUST", PASSED))  # type: ignore[arg-type]
    display(_prop("b"), None)  # type: ignore[arg-type]
    display(_prop("b"), Verdict("b", "SDPA-2.1", "MUST", FAILED))  # type: ignore[arg-type]
    display(_prop("c"), None)  # type: ignore[arg-type]
    display(_prop("c"), Verdict("c", "SDPA-8.2", "SHOULD", WARNING))  # type: ignore[arg-type]
    assert plain.getvalue().splitlines() == [
        "[1/3] a (SDPA-2.1) ...",
        "[1/3] a (SDPA-2.1): passed (0.0s; 0 failed so far, 20s elapsed)",
        "[2/3] b (SDPA-2.1) ...",
        "[2/3] b (SDPA-2.1): failed (0.0s; 1 failed so far, 40s elapsed)",
        "[3/3] c (SDPA-2.1) ...",
        "[3/3] c (SDPA-2.1): warning (0.0s; 1 failed, 1 warned so far, 60s elapsed)",
    ]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    terminal = Terminal()
    display = cli.ProgressDisplay(1, terminal, clock=lambda: 5.0)
    display(_prop("a"), None)  # type: ignore[arg-type]
    assert terminal.getvalue().endswith(
        "\r\033[Kproperty 0 of 1, 0 failed so far, 0s elapsed, running a"
    )
    display(_prop("a"), Verdict("a", "SDPA-2.1", "MUST", FAILED))  # type: ignore[arg-type]
    assert "property 1 of 1, 1 failed so far" in terminal.getvalue()
    assert "\n" not in terminal.getvalue() and terminal.getvalue().endswith("\r\033[K")
    monkeypatch.setenv("CI", "true")
    ci = Terminal()
    cli.ProgressDisplay(1, ci)(_prop("a"), None)  # type: ignore[arg-type]
    assert ci.getvalue() == "[1/1] a (SDPA-2.1) ...\n"


def _report(strict: bool = False) -> Report:
    return report_of(
        [
            Verdict("ok", "SDPA-2.1", "MUST", PASSED, seconds=0.5),
            Verdict(
                "bad",
                "SDPA-4.1",
                "MUST",
                FAILED,
                "out differs | here",
                "q(1, 1, 2)",
                "print('repro')",
            ),
            Verdict("meh", "SDPA-8.2", "SHOULD", WARNING, "NaN leaks", "q(1, 1, 1)", "print(1)"),
            Verdict("na", "SDPA-3.2", "MUST", NOT_APPLICABLE, "the kernel does not claim bias"),
        ],
        strict,
    )


def test_table_shows_every_verdict_and_each_failure_in_full() -> None:
    """The distinct divergences first, then the text table: labels passed / FAILED /
    warning / not applicable, then details."""
    text = render.format_table(_report(), rerun=lambda v: f"attnspec check m:f --only {v.property}")
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("property "))
    assert "2 distinct divergences:" in lines[:header]
    rows = {line.split()[0]: line for line in lines[header + 2 : header + 6]}
    assert [rows[p].split()[3] for p in ("ok", "bad", "meh")] == ["passed", "FAILED", "warning"]
    assert "not applicable" in rows["na"] and "does not claim bias" in rows["na"]
    assert "rerun:   attnspec check m:f --only bad" in text
    assert "    print('repro')" in text
    assert text.splitlines()[-1].startswith("result: DOES NOT CONFORM: 1 failed, 1 warning(s)")


def test_long_reproductions_are_pointed_to_not_printed() -> None:
    report = _report()
    report.verdicts[1].reproduction = "x = 1\n" * 5000
    text = render.format_table(report, max_reproduction=1000)
    assert "x = 1" not in text and "30000 characters of literal inputs" in text


def test_junit_marks_failures_skips_and_strict_warnings() -> None:
    """JUnit: failure for FAILED, skipped for not applicable; warnings fail only if strict."""
    for strict, failures in ((False, "1"), (True, "2")):
        suite = ET.fromstring(render.to_junit(_report(strict))).find("testsuite")
        assert suite is not None and suite.get("failures") == failures
        cases = {c.get("name"): c for c in suite.iter("testcase")}
        assert cases["na[SDPA-3.2]"].find("skipped") is not None
        assert (cases["meh[SDPA-8.2]"].find("failure") is not None) is strict
        assert "print(1)" in cases["meh[SDPA-8.2]"].findtext("system-out", "")


def test_markdown_escapes_pipes_and_json_has_spec_version() -> None:
    markdown = render.to_markdown(_report())
    assert "out differs \\| here" in markdown
    data = json.loads(render.to_json(_report()))
    assert data["spec_version"] == SPEC_VERSION
    assert data["counts"] == {
        PASSED: 1,
        FAILED: 1,
        WARNING: 1,
        NOT_APPLICABLE: 1,
        WAIVED: 0,
        NOT_RUN: 0,
    }
