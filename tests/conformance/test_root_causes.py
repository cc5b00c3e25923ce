"""One finding per root cause (CONF-1): failed properties re-run drawing around the clauses
the kernel failed (conformance/root_causes.py, conformance/input_features.py).

Three catalogue-style kernels run in this process on a few properties each, on a profile
of small draws only (one run per kernel, shared by the module's assertions); the folding
rules themselves are checked on hand-built reports with a stub re-run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from catalogue.blocks import arrange, attend
from catalogue.bugs_plumbing import value_dim_must_equal_head_dim
from catalogue.bugs_softmax import finite_fill_jax_style
from catalogue.entry import SpecCall, spec_kernel
from support import hand_report, hand_verdict

from attnspec.backends import Backend
from attnspec.conformance import declare
from attnspec.conformance.api import KernelSetup, check
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.draw import input_features
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import (
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    WAIVED,
    Report,
    Verdict,
)
from attnspec.conformance.report import render
from attnspec.conformance.run.property_runner import PROFILES, Profile
from attnspec.conformance.run.root_causes import Rerun, divergences, draw_around, one_at_a_time
from attnspec.conformance.run.supervisor import IsolatedKernel, _LastCall

PROFILE = "root-causes"  # 20 small draws a stratum: enough to meet every bug below
ALL = {"bias": True, "gqa": True}


@spec_kernel(**ALL, dtypes=("float32", "float64"))
def float64_returned_as_float32(call: SpecCall) -> np.ndarray:
    """float64 inputs computed and returned in float32 (JAX without x64): SDPA-1.3."""
    if call.q.dtype == np.float64:
        q, k, v = (a.astype(np.float32) for a in (call.q, call.k, call.v))
        bias = None if call.bias is None else call.bias.astype(np.float32)
        call = call._replace(q=q, k=k, v=v, bias=bias)
    return attend(call.pass_to(arrange))


@spec_kernel(**ALL)
def mean_v_and_scale_by_e(call: SpecCall) -> np.ndarray:
    """Two independent bugs: mean(V) for fully masked rows (SDPA-5.1) and a default scale
    of 1/E instead of 1/sqrt(E) (SDPA-2.1)."""
    scale = 1.0 / call.q.shape[-1] if call.scale is None else call.scale
    return call._replace(scale=scale).pass_to(finite_fill_jax_style)


@spec_kernel(**ALL, dtypes=("float16", "float32"))
def mean_v_no_gqa_float16_as_float32(call: SpecCall) -> np.ndarray:
    """Three bugs, as keras on NumPy has them: mean(V) for fully masked rows (SDPA-5.1),
    grouped heads rejected (SDPA-6.1) and float16 inputs answered in float32 (SDPA-1.3)."""
    q, k = call.q, call.k
    if q.shape[-3] != k.shape[-3]:
        raise ValueError(f"operands could not be broadcast together: {q.shape}, {k.shape}")
    out = call.pass_to(finite_fill_jax_style)
    return out.astype(np.float32) if q.dtype == np.float16 else out


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Report]]:
    def checked(fn: Any, only: list[str]) -> Report:
        return check(fn, backend="numpy", profile=PROFILE, only=only)

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROFILES, PROFILE, Profile(20))
        yield {
            "mean-v": checked(
                finite_fill_jax_style,
                ["empty-rows-zero", "rows-sum-to-one", "masked-values-ignored"],
            ),
            "float32": checked(
                float64_returned_as_float32, ["output-shape-dtype", "matches-reference"]
            ),
            "two-bugs": checked(
                mean_v_and_scale_by_e,
                ["empty-rows-zero", "default-scale", "masked-values-ignored", "matches-reference"],
            ),
            "three-bugs": checked(
                mean_v_no_gqa_float16_as_float32,
                ["output-shape-dtype", "empty-rows-zero", "gqa-mapping", "rows-sum-to-one"],
            ),
            "value-dim": checked(
                value_dim_must_equal_head_dim,
                ["value-head-dim", "output-shape-dtype", "rows-sum-to-one", "matches-reference"],
            ),
        }


def _statuses(report: Report) -> dict[str, str]:
    return {v.property: v.status for v in report.verdicts}


def test_mean_v_for_fully_masked_rows_is_one_divergence(runs: dict[str, Report]) -> None:
    """SDPA-5.1: the kernel's other failures pass when re-run with fully masked rows drawn
    around, so they are its consequences, each with the evidence; nothing is hidden (the
    verdicts stay failed)."""
    report = runs["mean-v"]
    assert set(_statuses(report).values()) == {FAILED}, _statuses(report)
    [divergence] = divergences(report)
    assert divergence.clause == "SDPA-5.1" and divergence.properties == ["empty-rows-zero"]
    assert sorted(c.split()[0] for c in divergence.consequences) == [
        "masked-values-ignored",
        "rows-sum-to-one",
    ]
    for verdict in report.verdicts[1:]:
        assert verdict.cause == "SDPA-5.1", verdict
        assert input_features.FULLY_MASKED_ROW in verdict.features
        assert "passes drawn around fully-masked-row (SDPA-5.1)" in verdict.drawn_around
        assert int(verdict.drawn_around.split(": ")[1].split()[0]) > 0  # examples checked
    # the diagnosis probe names the cause (issue 38): one cause, every failure under it
    assert [c.name for c in report.causes] == ["excluded-keys-filled-finite"]
    text = render.format_table(report)
    assert text.index("1 cause: 1 established by diagnosis probes") < text.index("property  ")
    assert "explains 3 failures" in text
    assert text.count("  finding: ") == 1
    assert "(follows from SDPA-5.1)" in text


def test_float64_returned_as_float32_is_one_divergence(runs: dict[str, Report]) -> None:
    """SDPA-1.3: a float64 accuracy failure passes with float64 drawn around."""
    report = runs["float32"]
    assert _statuses(report) == {"output-shape-dtype": FAILED, "matches-reference": FAILED}
    [divergence] = divergences(report)
    assert divergence.clause == "SDPA-1.3"
    assert divergence.consequences == ["matches-reference (SDPA-7.3)"]
    assert "float64-inputs (SDPA-1.3)" in report.verdicts[1].drawn_around


def test_two_independent_bugs_are_two_divergences(runs: dict[str, Report]) -> None:
    """SDPA-5.1 and SDPA-2.1 are both reported; masked-values-ignored follows from SDPA-5.1
    only (which values a mask hides does not depend on the scale); matches-reference, which
    the scale breaks on any input, is never folded away."""
    report = runs["two-bugs"]
    found = divergences(report)
    clauses = [d.clause for d in found]
    assert clauses[:2] == ["SDPA-5.1", "SDPA-2.1"], clauses
    verdicts = {v.property: v for v in report.verdicts}
    assert verdicts["masked-values-ignored"].cause == "SDPA-5.1"
    reference = verdicts["matches-reference"]
    assert reference.status == FAILED and reference.cause == ""
    assert "matches-reference" in found[2].properties
    # its case shown has no fully masked row: the first draw, or the re-run drawn around it
    assert input_features.FULLY_MASKED_ROW not in reference.features


def test_a_dtype_is_drawn_around_only_where_its_clause_failed_in_it(
    runs: dict[str, Report],
) -> None:
    """SDPA-1.3 failed in float16 only: a mean(V) failure in float32 is re-run around empty
    rows and grouped heads (whichever it meets first), never around float32 too; before, every
    dtype the failures met was left out until nothing could be drawn, and rows-sum-to-one
    was reported as a divergence of its own ("could not be drawn around")."""
    report = runs["three-bugs"]
    verdicts = {v.property: v for v in report.verdicts}
    assert {p: v.status for p, v in verdicts.items()} == dict.fromkeys(verdicts, FAILED)
    rows = verdicts["rows-sum-to-one"]
    assert rows.cause in ("SDPA-5.1", "SDPA-6.1"), rows.drawn_around
    assert rows.drawn_around.startswith("passes drawn around "), rows.drawn_around
    assert "fully-masked-row (SDPA-5.1)" in rows.drawn_around
    assert "float32-inputs" not in rows.drawn_around
    found = divergences(report)
    assert sorted(d.clause for d in found) == ["SDPA-1.3", "SDPA-5.1", "SDPA-6.1"]
    assert not any("could not be drawn around" in d.drawn_around for d in found)


def test_a_kernel_that_rejects_unequal_head_dims_is_one_divergence(
    runs: dict[str, Report],
) -> None:
    """SDPA-1.1: Ev != E raising is one finding (value-head-dim); the shape, accuracy and
    weights (V = I, Ev = Lk) failures pass re-run with Ev != E padded away, as
    equal_head_dims does, and are listed as its consequences."""
    report = runs["value-dim"]
    assert set(_statuses(report).values()) == {FAILED}, _statuses(report)
    [divergence] = divergences(report)
    assert divergence.clause == "SDPA-1.1" and divergence.properties == ["value-head-dim"]
    assert "value shape should be" in divergence.finding
    assert sorted(c.split()[0] for c in divergence.consequences) == [
        "matches-reference",
        "output-shape-dtype",
        "rows-sum-to-one",
    ]
    for verdict in report.verdicts[1:]:
        assert "passes drawn around unequal-head-dims (SDPA-1.1)" in verdict.drawn_around


def test_a_kernel_declaring_equal_head_dims_never_meets_unequal_ones() -> None:
    """SDPA-1.1 / equal_head_dims: the declared limitation is no finding; value-head-dim
    is not applicable and no problem has the feature (the kernel sees padded inputs)."""

    @declare(equal_head_dims=True, **ALL)  # on a kernel of its own: declare marks the function
    def padded(q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any) -> np.ndarray:
        return value_dim_must_equal_head_dim(q, k, v, **options)

    kernel = KernelUnderTest(padded, Backend("numpy"))
    problem = Problem(
        q=np.zeros((1, 1, 2)), k=np.zeros((1, 1, 2)), v=np.zeros((1, 1, 3)), dtype="float64"
    )
    assert input_features.UNEQUAL_HEAD_DIMS not in input_features.features_of(
        problem, kernel.declaration
    )
    assert kernel.output(problem).shape == (1, 1, 3)
    [verdict] = check(padded, backend="numpy", only=["value-head-dim"]).verdicts
    assert verdict.status == NOT_APPLICABLE and "equal_head_dims" in verdict.detail


# --- the rules, on hand-built reports -------------------------------------------------------


def _stub_rerun(
    results: dict[str, list[Verdict]], calls: list[tuple[str, tuple[str, ...]]]
) -> Rerun:
    """A re-run that answers each property with its next verdict in ``results`` and logs
    the call (property, features avoided) in ``calls``."""

    def rerun(prop: Any, limits: SizeLimits) -> Verdict:
        calls.append((prop.id, limits.avoid))
        return results[prop.id].pop(0)

    return rerun


def _rerun(results: dict[str, list[Verdict]], calls: list[tuple[str, tuple[str, ...]]]) -> Any:
    """The stub re-run, the verdicts settled one at a time, as with one session."""
    return one_at_a_time(_stub_rerun(results, calls))


def test_a_failure_that_still_fails_drawn_around_stays_distinct_with_its_new_case() -> None:
    """No hiding: a property that still fails with the other clause's inputs drawn around
    is a divergence of its own, shown on the new minimal case, the first one kept."""
    report = hand_report(
        [
            hand_verdict("empty-rows-zero", "SDPA-5.1", features=("fully-masked-row",)),
            hand_verdict(
                "key-permutation", "SDPA-7.6", features=("fully-masked-row",), case="first case"
            ),
        ],
    )
    again = hand_verdict("key-permutation", "SDPA-7.6", case="second case")
    calls: list[tuple[str, tuple[str, ...]]] = []
    draw_around(
        report, all_properties().values(), _rerun({"key-permutation": [again]}, calls), SizeLimits()
    )
    assert calls == [("key-permutation", ("fully-masked-row",))]
    moved = report.verdicts[1]
    assert (moved.cause, moved.counterexample) == ("", "second case")
    assert "still fails drawn around fully-masked-row (SDPA-5.1)" in moved.drawn_around
    assert "first case" in moved.drawn_around
    assert [d.clause for d in divergences(report)] == ["SDPA-5.1", "SDPA-7.6"]


def test_a_re_run_that_stalls_drawing_around_keeps_the_first_case() -> None:
    """A supervised re-run stopped while no kernel call ran (its draws were all discarded)
    says nothing about the kernel: the failure stays as found, and says why."""
    report = hand_report(
        [
            hand_verdict("gqa-mapping", "SDPA-6.1", features=("gqa",)),
            hand_verdict("key-permutation", "SDPA-7.6", features=("gqa",), case="first case"),
        ],
    )
    stalled = Verdict(
        "key-permutation",
        "SDPA-7.6",
        "MUST",
        FAILED,
        detail=IsolatedKernel(KernelSetup("m:f", "numpy"))._hang_finding(
            _LastCall("q(1, 1, 1, 1)")  # the judging worker stalled after the kernel returned
        ),
    )
    draw_around(
        report, all_properties().values(), _rerun({"key-permutation": [stalled]}, []), SizeLimits()
    )
    kept = report.verdicts[1]
    assert (kept.cause, kept.counterexample) == ("", "first case")
    assert kept.drawn_around.startswith(
        "could not be drawn around gqa (SDPA-6.1): the re-run stalled"
    )


def _three_failures() -> Report:
    return hand_report(
        [
            hand_verdict("empty-rows-zero", "SDPA-5.1", features=("fully-masked-row",)),
            hand_verdict("gqa-mapping", "SDPA-6.1", features=("gqa",)),
            hand_verdict("rows-sum-to-one", "SDPA-7.1", features=("fully-masked-row", "gqa")),
        ],
    )


def test_a_re_run_that_cannot_draw_falls_back_to_a_smaller_avoid_set() -> None:
    """A re-run that can draw nothing around every feature of the case (or stalls) is
    tried with one feature fewer before giving up: passing so, the failure is a
    consequence; the honest "could not be drawn around" is kept for when none settles."""
    nothing = Verdict("rows-sum-to-one", "SDPA-7.1", "MUST", PASSED, examples=0)
    ok = Verdict("rows-sum-to-one", "SDPA-7.1", "MUST", PASSED, examples=9)
    fails = hand_verdict("rows-sum-to-one", "SDPA-7.1", case="another case")
    for results, settled in (([nothing, fails, ok], True), ([nothing, fails, nothing], False)):
        report = _three_failures()
        calls: list[tuple[str, tuple[str, ...]]] = []
        settle_all = _rerun({"rows-sum-to-one": list(results)}, calls)
        draw_around(report, all_properties().values(), settle_all, SizeLimits())
        assert calls == [
            ("rows-sum-to-one", ("fully-masked-row", "gqa")),
            ("rows-sum-to-one", ("fully-masked-row",)),
            ("rows-sum-to-one", ("gqa",)),
        ]
        rows = report.verdicts[2]
        if settled:
            assert rows.cause == "SDPA-6.1"
            assert rows.drawn_around.startswith("passes drawn around gqa (SDPA-6.1): 9 examples")
        else:
            assert (rows.cause, rows.counterexample) == ("", "q(1, 1, 1)")
            assert rows.drawn_around == (
                "could not be drawn around fully-masked-row (SDPA-5.1), gqa (SDPA-6.1): every "
                "draw had such inputs, nor around any one of them fewer; reported as found"
            )


def test_a_clause_failing_only_as_a_consequence_is_not_drawn_around() -> None:
    """SDPA-1.3 failing only on grouped heads (its failure follows from SDPA-6.1) does not
    make other properties draw around dtypes; nor does SDPA-1.3 failing in float16 make
    them draw around float32 inputs."""
    report = hand_report(
        [
            hand_verdict("gqa-mapping", "SDPA-6.1", features=("gqa",)),
            hand_verdict("output-shape-dtype", "SDPA-1.3", features=("gqa", "float16-inputs")),
            hand_verdict("key-permutation", "SDPA-7.6", features=("float16-inputs",)),
            hand_verdict("query-permutation", "SDPA-7.6", features=("float32-inputs",)),
        ],
    )
    ok = Verdict("any", "SDPA-7.6", "MUST", PASSED, examples=5)
    calls: list[tuple[str, tuple[str, ...]]] = []
    draw_around(
        report,
        all_properties().values(),
        _rerun({"output-shape-dtype": [ok]}, calls),
        SizeLimits(),
    )
    assert calls == [("output-shape-dtype", ("gqa",))]
    assert [d.clause for d in divergences(report)] == ["SDPA-6.1", "SDPA-7.6", "SDPA-7.6"]


def test_only_features_of_failed_or_waived_clauses_are_drawn_around() -> None:
    """A feature whose clause passed is not drawn around (the failure is the property's own);
    a waived clause (CONF-7) is, and its consequences are listed under it."""
    passed = hand_report(
        [
            hand_verdict("empty-rows-zero", "SDPA-5.1", PASSED),
            hand_verdict("rows-sum-to-one", "SDPA-7.1", features=("fully-masked-row",)),
        ],
    )
    calls: list[tuple[str, tuple[str, ...]]] = []
    draw_around(passed, all_properties().values(), _rerun({}, calls), SizeLimits())
    assert calls == [] and [d.clause for d in divergences(passed)] == ["SDPA-7.1"]
    waived = hand_report(
        [
            hand_verdict("empty-rows-zero", "SDPA-5.1", WAIVED),
            hand_verdict("rows-sum-to-one", "SDPA-7.1", features=("fully-masked-row",)),
        ],
        backend="jax",
        waived=["SDPA-5.1"],
    )
    ok = Verdict("rows-sum-to-one", "SDPA-7.1", "MUST", PASSED, examples=12)
    draw_around(
        waived, all_properties().values(), _rerun({"rows-sum-to-one": [ok]}, calls), SizeLimits()
    )
    [root] = divergences(waived)
    assert (root.clause, root.status) == ("SDPA-5.1", WAIVED)
    assert root.consequences == ["rows-sum-to-one (SDPA-7.1)"]
    assert "12 examples" in root.evidence[0]


def test_consequences_of_consequences_fold_to_the_root_and_cycles_do_not_hide() -> None:
    """A failure caused by a clause whose own failure follows from a third is listed under
    the third; two failures that each follow from the other stay one divergence."""
    chain = hand_report(
        [
            hand_verdict("output-shape-dtype", "SDPA-1.3"),
            hand_verdict("empty-rows-zero", "SDPA-5.1"),
            hand_verdict("key-permutation", "SDPA-7.6"),
        ],
    )
    chain.verdicts[1].cause, chain.verdicts[2].cause = "SDPA-1.3", "SDPA-5.1"
    [root] = divergences(chain)
    assert root.consequences == [
        "empty-rows-zero (SDPA-5.1)",
        "key-permutation (SDPA-7.6, via SDPA-5.1)",
    ]
    cycle = hand_report(
        [
            hand_verdict("empty-rows-zero", "SDPA-5.1", features=("float64-inputs",)),
            hand_verdict(
                "output-shape-dtype", "SDPA-1.3", features=("fully-masked-row", "float64-inputs")
            ),
        ],
    )
    ok = Verdict("any", "SDPA-7.3", "MUST", PASSED, examples=5)
    calls: list[tuple[str, tuple[str, ...]]] = []
    draw_around(
        cycle,
        all_properties().values(),
        _rerun({"empty-rows-zero": [ok], "output-shape-dtype": [ok]}, calls),
        SizeLimits(),
    )
    assert [v.cause for v in cycle.verdicts] == ["SDPA-1.3", ""]
    assert len(divergences(cycle)) == 1


def _one_governing_then_three() -> Report:
    """SDPA-1.3 failing on grouped heads (a consequence of SDPA-6.1 once settled), and three
    failures on fully masked rows (SDPA-5.1), one also in float16."""
    return hand_report(
        [
            hand_verdict("output-shape-dtype", "SDPA-1.3", features=("gqa", "float16-inputs")),
            hand_verdict("empty-rows-zero", "SDPA-5.1"),
            hand_verdict("gqa-mapping", "SDPA-6.1"),
            hand_verdict(
                "rows-sum-to-one", "SDPA-7.1", features=("fully-masked-row", "float16-inputs")
            ),
            hand_verdict("key-permutation", "SDPA-7.6", features=("fully-masked-row",)),
            hand_verdict("masked-values-ignored", "SDPA-8.1", features=("fully-masked-row",)),
        ],
    )


def _answers() -> dict[str, list[Verdict]]:
    ok = Verdict("any", "SDPA-7.1", "MUST", PASSED, examples=7)
    return {
        "output-shape-dtype": [ok],
        "rows-sum-to-one": [ok],
        "key-permutation": [hand_verdict("key-permutation", "SDPA-7.6", case="second case")],
        "masked-values-ignored": [ok],
    }


def test_settling_in_any_order_gives_the_same_report() -> None:
    """CONF-1, CONF-5 (--jobs N): draw_around hands the verdicts it may settle at once to its
    settle_all together: settled last to first, the report is the one settled one at a
    time, each property re-run the same way; SDPA-1.3 is settled (as following from
    SDPA-6.1) before rows-sum-to-one re-runs, which therefore draws around fully masked
    rows only, not float16 inputs."""

    def last_to_first(rerun: Rerun) -> Any:
        def settle_all(settles: Any, keep: Any) -> None:
            for index in reversed(range(len(settles))):
                keep(index, settles[index](rerun))

        return settle_all

    outcomes, re_runs = [], []
    for settle_all in (one_at_a_time, last_to_first):
        report, calls = _one_governing_then_three(), []
        draw_around(
            report,
            all_properties().values(),
            settle_all(_stub_rerun(_answers(), calls)),
            SizeLimits(),
        )
        outcomes.append([(v.cause, v.counterexample, v.drawn_around) for v in report.verdicts])
        re_runs.append(sorted(calls))
    assert outcomes[0] == outcomes[1] and re_runs[0] == re_runs[1]
    assert ("rows-sum-to-one", ("fully-masked-row",)) in re_runs[0]
    assert [cause for cause, _, _ in outcomes[0]] == [
        "SDPA-6.1",
        "",
        "",
        "SDPA-5.1",
        "",
        "SDPA-5.1",
    ]


def test_a_verdict_interrupted_between_its_re_runs_stays_as_found() -> None:
    """CONF-6 (--jobs N, an interrupt during the re-runs): a verdict is settled on a copy,
    so one interrupted after its first re-run (which still failed, on a case with grouped
    heads, so a second re-run was under way) stays in the report as it was found, not half
    settled with the first re-run's case."""
    report = hand_report(
        [
            hand_verdict("empty-rows-zero", "SDPA-5.1", features=("fully-masked-row",)),
            hand_verdict("gqa-mapping", "SDPA-6.1", features=("gqa",)),
            hand_verdict(
                "key-permutation", "SDPA-7.6", features=("fully-masked-row",), case="first case"
            ),
        ],
    )
    found = [(v.counterexample, v.detail, v.features, v.drawn_around) for v in report.verdicts]
    again = hand_verdict("key-permutation", "SDPA-7.6", features=("gqa",), case="second case")
    calls: list[tuple[str, tuple[str, ...]]] = []

    def interrupted_second(prop: Any, limits: SizeLimits) -> Verdict:
        calls.append((prop.id, limits.avoid))
        if len(calls) > 1:
            raise KeyboardInterrupt
        return again

    with pytest.raises(KeyboardInterrupt):
        draw_around(
            report, all_properties().values(), one_at_a_time(interrupted_second), SizeLimits()
        )
    assert calls == [
        ("key-permutation", ("fully-masked-row",)),
        ("key-permutation", ("fully-masked-row", "gqa")),
    ]
    after = [(v.counterexample, v.detail, v.features, v.drawn_around) for v in report.verdicts]
    assert after == found


def _masked_zeros(n_queries: int, n_keys: int, dtype: str, **options: Any) -> Problem:
    """Zero q, k and v of one head and head dims 1, every key masked out (no row has one)."""
    return Problem(
        q=np.zeros((1, n_queries, 1)),
        k=np.zeros((1, n_keys, 1)),
        v=np.zeros((1, n_keys, 1)),
        dtype=dtype,
        mask=np.zeros((n_queries, n_keys), dtype=bool),
        **options,
    )


def test_the_avoid_hook_rejects_problems_with_an_avoided_feature() -> None:
    """SizeLimits.avoid names features (a typo is a ValueError); a problem a property builds
    itself with such a feature is discarded on the kernel call, inside a run only."""
    with pytest.raises(ValueError, match="avoid='fully-masked'"):
        SizeLimits(avoid=("fully-masked",))
    problem = _masked_zeros(1, 1, "float64")
    kernel = KernelUnderTest(finite_fill_jax_style, Backend("numpy"))
    assert input_features.features_of(problem, kernel.declaration) == [
        "fully-masked-row",
        "float64-inputs",
    ]
    assert kernel.output(problem).shape == (1, 1, 1)  # outside a run nothing is avoided
    from hypothesis.errors import UnsatisfiedAssumption

    from attnspec.conformance.draw import sizes

    with sizes.drawing(sizes.SMALL, SizeLimits(avoid=("fully-masked-row",))):
        with pytest.raises(UnsatisfiedAssumption):
            kernel.output(problem)
        assert kernel.output(problem.with_(mask=np.ones((1, 1), dtype=bool))).shape == (1, 1, 1)


def test_drawing_around_empty_rows_gives_each_row_a_key_in_the_masks_own_shape() -> None:
    """Lk = 0 (SDPA-5.2's inputs) has no row to give a key: the mask comes back as is.  A
    row without a key gets the last one the causal rule allows it; a broadcast mask keeps
    its shape (a re-run meets the shapes a compiling kernel compiled), its row getting the
    last key allowed in every scores row it serves; a mask broadcast over the keys allows
    them all."""
    from attnspec.conformance.claims.declaration import KernelDeclaration
    from attnspec.conformance.draw.strategies import with_a_key_per_row

    none = _masked_zeros(2, 0, "float32", is_causal=True)
    assert with_a_key_per_row(none, KernelDeclaration()).shape == (2, 0)
    blank = none.with_(
        k=np.zeros((1, 3, 1)), v=np.zeros((1, 3, 1)), mask=np.zeros((2, 3), dtype=bool)
    )
    assert with_a_key_per_row(blank, KernelDeclaration()).tolist() == [
        [True, False, False],
        [False, True, False],
    ]  # top-left causal: the last allowed key
    shared = with_a_key_per_row(blank.with_(mask=np.zeros((1, 3), dtype=bool)), KernelDeclaration())
    assert shared.tolist() == [[True, False, False]]  # row 0 allows key 0 only
    bottom_right = KernelDeclaration(causal_alignment="bottom_right")
    shared = with_a_key_per_row(blank.with_(mask=np.zeros((1, 3), dtype=bool)), bottom_right)
    assert shared.tolist() == [[False, True, False]]  # row 0 allows keys 0 and 1
    over_keys = blank.with_(mask=np.array([[True], [False]]))
    assert with_a_key_per_row(over_keys, KernelDeclaration()).tolist() == [[True], [True]]


def test_one_root_cause_with_two_write_ups_is_two_divergences() -> None:
    """Two properties that fail with the same exception but whose write-ups differ are two
    divergences, each with its own write-up, not one under the first write-up; a property
    without a write-up stays with the one that has it."""
    raised = [
        hand_verdict(p, c)
        for p, c in (("matches-reference", "SDPA-7.3"), ("nan-propagates", "SDPA-8.3"))
    ]
    for verdict in raised:
        verdict.detail = "kernel raised ValueError: bad shape"
    report = hand_report(raised)
    found = divergences(report, {"matches-reference": "docs/a.md", "nan-propagates": "docs/b.md"})
    assert [(d.properties, d.write_up) for d in found] == [
        (["matches-reference"], "docs/a.md"),
        (["nan-propagates"], "docs/b.md"),
    ]
    (one,) = divergences(report, {"nan-propagates": "docs/b.md"})
    assert (one.properties, one.write_up) == (["matches-reference", "nan-propagates"], "docs/b.md")


def test_a_write_up_links_only_the_failure_it_describes() -> None:
    """A property's write-up confirms its failure only when the failure is listed under the
    clause the write-up names and shows what it describes: PyTorch's causal-with-scale-0
    write-up does not explain a matches-reference failure without scale 0, and a write-up
    of a property's own clause does not explain its failure as a consequence of another
    (waived) clause.  Both say "unconfirmed" (no write-up)."""
    link = "docs/divergences.md#torch-causal-scale-zero"
    scale_zero = hand_verdict("matches-reference", "SDPA-7.3", case="q(1, 1, 1), scale=0.0")
    other = hand_verdict("matches-reference", "SDPA-7.3", case="q(1, 1, 1), scale=0.5")
    for verdict, expected in ((scale_zero, link), (other, "")):
        report = hand_report([verdict], backend="torch")
        [found] = divergences(report, {"matches-reference": link})
        assert found.write_up == expected, verdict.counterexample
    consequence = hand_verdict("rows-sum-to-one", "SDPA-7.1")
    consequence.cause = "SDPA-5.1"  # waived: no verdict of its own
    report = hand_report([consequence])
    [waived] = divergences(report, {"rows-sum-to-one": "docs/own-clause.md"})
    assert (waived.clause, waived.write_up) == ("SDPA-5.1", "")
    # the jax write-up names SDPA-5.1: it does explain rows-sum-to-one's failure there
    [waived] = divergences(report, {"rows-sum-to-one": "docs/divergences.md#jax-empty-rows"})
    assert waived.write_up == "docs/divergences.md#jax-empty-rows"
