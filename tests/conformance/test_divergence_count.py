"""The report's divergence count is the blocks it lists, and a block that merges several
minimal cases under one write-up shows each (CONF-1): text table, JSON, Markdown and the
matrix (conformance/report.py, conformance/matrix.py).

A hand-built report as ``attnspec check flax.linen:dot_product_attention`` gave it: two
float16 accuracy failures on different minimal cases that one write-up explains
(docs/divergences.md#flax-linen-float16-accuracy), a failure of its own and a
consequence of a waived clause.  No kernel runs.
"""

from __future__ import annotations

import json

import pytest
from support import hand_verdict

from attnspec.conformance import matrix
from attnspec.conformance.judge.verdict import FAILED, PASSED, WARNING, Report
from attnspec.conformance.kernels.known import KNOWN_KERNELS, write_ups
from attnspec.conformance.report import render
from attnspec.conformance.run.root_causes import divergences

LINEN = next(e for e in KNOWN_KERNELS if e.name == "flax.linen:dot_product_attention")
WRITE_UPS = write_ups(LINEN)
ACCURACY = "docs/divergences.md#flax-linen-float16-accuracy"
CASE_A = "q(1, 1, 3, 8), k(1, 1, 5, 8), v(1, 1, 5, 8), dtype=float16, is_causal=False"
CASE_B = "q(2, 1, 1, 4), k(2, 1, 7, 4), v(2, 1, 7, 4), dtype=float16, bias(1, 7)"
CASE_C = "q(1, 1, 1, 1), k(1, 1, 2, 1), v(1, 1, 2, 1), dtype=float32, mask(1, 2) (0/2 True)"


@pytest.fixture(scope="module")
def report() -> Report:
    verdicts = [
        hand_verdict("default-scale", "SDPA-2.1", PASSED, detail="", case=""),
        hand_verdict(
            "matches-reference",
            "SDPA-7.3",
            FAILED,
            detail="out off by 3.1e-03 (float16)",
            case=CASE_A,
        ),
        hand_verdict(
            "mask-wins-over-bias",
            "SDPA-3.3",
            FAILED,
            detail="-inf bias call off by 2e-03",
            case=CASE_B,
        ),
        hand_verdict(
            "empty-rows-zero",
            "SDPA-5.1",
            FAILED,
            detail="row 0 is mean(v), should be 0",
            case=CASE_C,
        ),
        hand_verdict(
            "rows-sum-to-one", "SDPA-7.1", FAILED, detail="weights sum to 0.5", case=CASE_C
        ),
        hand_verdict(
            "gqa-rejects-bad-heads", "SDPA-6.2", WARNING, detail="Hq=3, Hkv=2 accepted", case=CASE_A
        ),
    ]
    verdicts[4].cause = "SDPA-5.2"  # a clause with no verdict of its own: a waived one
    verdicts[4].drawn_around = "passes drawn around Lk = 0 (SDPA-5.2)"
    assert WRITE_UPS["matches-reference"] == WRITE_UPS["mask-wins-over-bias"] == ACCURACY
    return Report("flax.linen:dot_product_attention", "jax", "cpu", "quick", 1, False, verdicts)


def test_the_header_counts_the_blocks_listed(report: Report) -> None:
    """Four failures, five minimal cases in all, one waived clause: the two accuracy
    failures are one divergence (one write-up), so 3 blocks and the header says 3."""
    found = divergences(report, WRITE_UPS)
    assert [(d.status, d.properties) for d in found] == [
        ("waived", []),
        (FAILED, ["matches-reference", "mask-wins-over-bias"]),
        (FAILED, ["empty-rows-zero"]),
        (WARNING, ["gqa-rejects-bad-heads"]),
    ]
    text = render.format_table(report, write_ups=WRITE_UPS)
    told = text.split("\n\nproperty ")[0].split("\n\n")[1:]  # header, then one per block
    header, blocks = told[0], told[1:]
    assert header == (
        "3 distinct divergences and 1 waived clause that failures follow from, "
        "1 failure folded as consequences:"
    )
    assert len(blocks) == len(found) == 4
    assert render.divergence_count(found).startswith("3 distinct divergences")


def test_a_merged_block_tells_every_finding(report: Report) -> None:
    """The block of the accuracy write-up tells both failures: property, clause, finding
    and minimal case of each, then the write-up once."""
    text = render.format_table(report, write_ups=WRITE_UPS)
    [block] = [b for b in text.split("\n\n") if "one write-up explains" in b]
    assert block.startswith(f"one divergence, 2 findings that one write-up explains ({ACCURACY})")
    for prop, clause, detail, case in (
        ("matches-reference", "SDPA-7.3", "out off by 3.1e-03 (float16)", CASE_A),
        ("mask-wins-over-bias", "SDPA-3.3", "-inf bias call off by 2e-03", CASE_B),
    ):
        assert f"FAILED {prop} [{clause} MUST" in block, block
        assert f"finding: {detail}" in block and f"inputs:  {case}" in block, block
    assert block.count(f"confirmed:   {ACCURACY}") == 1


def test_json_and_markdown_list_the_same_divergences_with_their_findings(
    report: Report,
) -> None:
    data = json.loads(render.to_json(report, write_ups=WRITE_UPS))
    merged = next(d for d in data["divergences"] if d["write_up"] == ACCURACY)
    assert [(f["properties"], f["clause"], f["inputs"]) for f in merged["findings"]] == [
        (["matches-reference"], "SDPA-7.3", CASE_A),
        (["mask-wins-over-bias"], "SDPA-3.3", CASE_B),
    ]
    assert len(data["divergences"]) == 4
    markdown = render.to_markdown(report, write_ups=WRITE_UPS)
    assert "### 3 distinct divergences and 1 waived clause that failures follow from" in markdown
    assert "  - 2 findings, one write-up explains them all:" in markdown
    assert (
        "    - `matches-reference` (SDPA-7.3, MUST, failed): out off by 3.1e-03 (float16); "
        f"minimal case: {CASE_A}" in markdown
    )
    assert f"(SDPA-3.3, MUST, failed): -inf bias call off by 2e-03; minimal case: {CASE_B}" in (
        markdown
    )


def test_the_matrix_shows_every_finding_and_counts_what_it_lists(
    report: Report, tmp_path: object
) -> None:
    """The matrix row's page and summary, and a row read back from its JSON (as
    ``attnspec matrix --merge`` does) and relinked, tell the same."""
    row = matrix.row_from_report(LINEN, report, WRITE_UPS, 3.0)
    page = matrix.to_markdown([row])
    assert f"minimal case: {CASE_A}" in page and f"minimal case: {CASE_B}" in page
    assert "flax.linen:dot_product_attention: 3 distinct divergences and 1 waived" in (
        matrix.summary([row])
    )
    path = tmp_path / "rows.json"  # type: ignore[operator]
    path.write_text(matrix.to_json([row]), encoding="utf-8")
    [again] = matrix.rows_in(path)
    assert again == row
    relinked = matrix.relink(again, WRITE_UPS)
    assert matrix.to_markdown([relinked]) == page


def test_relink_merging_rows_of_earlier_runs_keeps_each_finding() -> None:
    """Two divergences saved apart (no write-up then) that one write-up now explains are
    merged with both minimal cases, and each consequence keeps its evidence line."""
    first = matrix.Divergence(
        "SDPA-7.3", "MUST", FAILED, "out off (float16)", CASE_A, ["matches-reference"]
    )
    second = matrix.Divergence(
        "SDPA-3.3",
        "MUST",
        FAILED,
        "contiguous off (float16)",
        CASE_B,
        ["mask-wins-over-bias"],
        consequences=["value-linearity (SDPA-7.6)"],
        evidence=["value-linearity: passes drawn around ...; minimal case q(1)"],
    )
    row = matrix.MatrixRow(
        LINEN.name, "jax", "cpu", "", matrix.CHECKED, divergences=[first, second]
    )
    [merged] = matrix.relink(row, WRITE_UPS).divergences
    assert [f.inputs for f in merged.findings] == [CASE_A, CASE_B]
    assert len(merged.consequences) == len(merged.evidence) == 1
    assert "1 distinct divergence (" in matrix.summary([row])
