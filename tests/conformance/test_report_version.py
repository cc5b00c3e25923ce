"""CONF-10 and spec/index.md section 5: every report names the spec version it was checked
against; against a draft, it also names the draft clauses among the verdicts it checked
(clauses not in the last frozen release, whose text may still change)."""

from __future__ import annotations

import json

import pytest
from support import report_of

from attnspec import SPEC_VERSION
from attnspec.conformance import Report, Verdict
from attnspec.conformance.claims import clauses as spec_clauses
from attnspec.conformance.claims.clauses import all_clauses, last_release
from attnspec.conformance.report import render

PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not applicable"


def _report(released: str, draft: str, unchecked_draft: str) -> Report:
    return report_of(
        [
            Verdict("old", released, "MUST", PASSED, seconds=0.1),
            Verdict("new", draft, "MUST", FAILED, "differs"),
            Verdict("unclaimed", unchecked_draft, "MUST", NOT_APPLICABLE, "not claimed"),
        ],
    )


def _ids() -> tuple[str, str, str, str]:
    version, released = last_release()
    assert version, "no frozen release ships with the package (spec/releases/)"
    new = [clause_id for clause_id in all_clauses() if clause_id not in released]
    assert len(new) >= 2, "the draft adds no clause yet"
    return version, sorted(released)[0], new[0], new[1]


def test_a_report_names_the_draft_clauses_it_checked() -> None:
    """CONF-10: the heading (text and Markdown) and the JSON name the version checked
    against and the draft clauses among the checked verdicts; a released clause and an
    unchecked draft clause are not named."""
    version, released, draft, unchecked = _ids()
    report = _report(released, draft, unchecked)
    if not SPEC_VERSION.endswith("-draft"):
        pytest.skip(f"the package checks the released {SPEC_VERSION}: no clause is a draft's")
    expected = f"attnspec {SPEC_VERSION} (draft clauses, new since {version}: {draft}) conformance"
    assert render.heading(report).startswith(expected + " of m:f on numpy (cpu)")
    assert expected in render.format_table(report)
    assert expected in render.to_markdown(report)
    data = json.loads(render.to_json(report))
    assert (data["spec_version"], data["draft_clauses"]) == (SPEC_VERSION, [draft])


def test_a_release_names_no_draft_clause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Section 5: a package that checks a released version has no draft clauses, so its
    heading is the version alone."""
    monkeypatch.setattr(spec_clauses, "SPEC_IS_DRAFT", False)
    _, released, draft, unchecked = _ids()
    report = _report(released, draft, unchecked)
    assert render.draft_clauses(report) == []
    assert render.heading(report).startswith(f"attnspec {SPEC_VERSION} conformance of m:f")
