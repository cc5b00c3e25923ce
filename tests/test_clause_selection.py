"""``pytest --clause ID`` leads from a spec clause to its tests (issue 30: "a clause id
leads to its tests in one place"); the citations are CONTRIBUTING's rule that every test
cites the clause it checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from clause_selection import cites, known_clause_ids
from support import ROOT


@pytest.mark.parametrize(
    ("text", "clause_id", "expected"),
    [
        ("SDPA-4.2: causal rows", "SDPA-4.2", True),
        ("test_scale[SDPA-2.2-negative]", "SDPA-2.2", True),
        ("SDPA-4.2, SDPA-4.3", "SDPA-4", True),  # a section takes its clauses
        # longer numbers (an area that is not the spec's, so no clause is cited by mistake)
        ("XYZ-42", "XYZ-4", False),
        ("XYZ-4.21", "XYZ-4.2", False),
        ("AXYZ-4.2", "XYZ-4.2", False),
        ("REC-1.3.", "REC-1.3", True),  # the end of a sentence
    ],
)
def test_cites_matches_whole_ids_and_sections(text: str, clause_id: str, expected: bool) -> None:
    """What counts as citing a clause: the id itself or one under it, never a longer id."""
    assert cites(text, clause_id) is expected


def test_an_unknown_clause_is_a_usage_error_naming_it() -> None:
    """CONF-5-style bad input: an id spec/*.md does not have is refused by name."""
    assert known_clause_ids(["SDPA-4.2", "SDPA-4"]) == ["SDPA-4.2", "SDPA-4"]
    # SDPA-99.9 is the id the spec-text test allows as one that does not exist
    with pytest.raises(pytest.UsageError, match=r"--clause 'SDPA-99\.9'.*SDPA-4\.2"):
        known_clause_ids(["SDPA-99.9"])


def test_clause_option_selects_the_tests_that_cite_it() -> None:
    """SDPA-6.2 (GQA head mapping) in test_bad_input.py: test_mha_bad_input cites it (its
    cases are collected), test_sdpa_bad_input and the others do not."""
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--clause", "SDPA-6.2", "--collect-only", "-q",
         "tests/reference/test_bad_input.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    ).stdout  # fmt: skip
    collected = {line.partition("[")[0] for line in listing.splitlines() if "::" in line}
    assert collected == {"tests/reference/test_bad_input.py::test_mha_bad_input"}, listing
    assert "deselected" in listing, listing
