"""Diagnosis probes and the report grouped by cause (CONF-1, issue 38).

Each probe is pinned to a kernel with exactly that defect (``catalogue``: one bug per
kernel) and must give exactly its own cause there: not the look-alikes the issue lists (a
softmax over one key taken as 1 is not "a finite mask fill", float32 scores cast to float16
are not "scores computed in float16", a mask read inverted is not "masking by a finite
value").  On every correct kernel of the catalogue every probe stays silent.  Then the
report: each cause once, with its evidence and every failure it explains, the header
counting causes, and the failures no cause explains after them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from catalogue import bugs_diagnosis as dg
from catalogue import bugs_plumbing as pl
from catalogue import bugs_scores as sc
from catalogue import bugs_softmax as sm
from catalogue.correct import CORRECT
from support import SMALL_SIZES, hand_report, hand_verdict

from attnspec.backends import Backend
from attnspec.conformance import check
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.judge.diagnosis import (
    PROBES,
    case_of,
    diagnose,
    explains,
    from_lines,
    to_line,
)
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.verdict import Cause
from attnspec.conformance.report.render import format_table, report_dict, summary_line
from attnspec.conformance.run.root_causes import by_cause, divergences

# (kernel with one defect, the one cause the probes must establish, words of its explanation)
PINNED: list[tuple[Callable[..., Any], str, str]] = [
    (sm.float64_computed_in_float32, "float64-in-float32", "computes float64 inputs in float32"),
    (pl.dtype_not_preserved, "float64-in-float32", "returns float32 for float64 inputs"),
    (sc.scale_zero_means_default, "scale-zero-is-default", "scale=0 as 'use the default'"),
    (sc.explicit_scale_ignored, "explicit-scale-ignored", "ignores an explicit scale"),
    (sc.scale_one_over_e, "default-scale-other", "default scale is 1/E"),
    (sc.missing_scale, "default-scale-other", "1 (no scaling)"),
    (sc.top_left_declared_bottom_right, "causal-alignment-reversed", "computes top-left"),
    (sc.bottom_right_declared_top_left, "causal-alignment-reversed", "computes bottom-right"),
    (sc.additive_mask_minus_1e4, "mask-added-as-finite-value", "adding a finite value"),
    # a fill rather than exclusion: mean(V) for empty rows, and the fill outranking allowed
    # scores below it (-1e9) or NaN leaking from an excluded value (both): one cause
    (sm.finite_fill_minus_1e9, "excluded-keys-filled-finite", "replaces excluded scores"),
    (sm.finite_fill_jax_style, "excluded-keys-filled-finite", "replaces excluded scores"),
    (sm.nan_on_empty_rows, "empty-row-nan", "outputs NaN"),
    (dg.floor_weight_on_excluded, "floor-weight-on-excluded-keys", "tiny weight"),
    (dg.single_key_weight_one, "single-key-weight-one", "weight 1 whatever the score"),
    (dg.scores_cast_to_float16, "scores-rounded-to-float16", "rounds them to float16"),
    (dg.scores_accumulated_in_float16, "scores-accumulated-in-float16", "accumulated in float16"),
    (dg.bias_added_in_float16, "bias-added-in-float16", "adds the bias to the scores in float16"),
    (sc.inverted_mask_polarity, "mask-inverted", "reads the mask inverted"),
    (sc.gqa_modulo_mapping, "gqa-interleaved-heads", "h mod Hkv"),
    (sm.batch_and_heads_transposed, "batch-head-mixed", "mixed up"),
]


def _kernel(fn: Callable[..., Any]) -> KernelUnderTest:
    return KernelUnderTest(fn, Backend("numpy"))


@pytest.mark.parametrize(
    ("fn", "name", "words"), PINNED, ids=[f"{fn.__name__}" for fn, _, _ in PINNED]
)
def test_each_probe_finds_exactly_its_cause(fn: Callable[..., Any], name: str, words: str) -> None:
    """CONF-1 (SDPA-1.3, SDPA-2, SDPA-3.1, SDPA-4, SDPA-5.1, SDPA-6.1, SDPA-7.2, SDPA-8):
    on a kernel with exactly one defect the probes establish exactly that cause and its
    explanation, and none of the look-alikes (the list is compared whole)."""
    found = diagnose(_kernel(fn))
    assert [cause.name for cause in found] == [name]
    assert words in found[0].explanation
    assert found[0].evidence


@pytest.mark.parametrize(
    "entry", [c for c in CORRECT if c.backend == "numpy"], ids=lambda c: c.name
)
def test_probes_stay_silent_on_correct_kernels(entry: Any) -> None:
    """CONF-1: no probe establishes a cause on a correct kernel (the zero-false-failure
    catalogue: log-sum-exp, online softmax, tiled, bottom-right, float16 weights, ...)."""
    assert diagnose(_kernel(entry.fn)) == []


# Look-alikes of the causes above that no probe may explain as one of them: each has a
# defect of its own (an epsilon in the denominator is not float64 computed in float32, NaN
# inputs cleaned is not a softmax over one key taken as 1, the scale applied twice is not
# another default scale).
LOOK_ALIKES: list[Callable[..., Any]] = [
    sm.eps_in_denominator,
    sm.nan_inputs_sanitised,
    sc.scale_squared,
    sm.nan_leaks_through_matmul,
    sm.row_sum_accumulated_in_float16,
    sc.causal_strict,
    sc.decode_step_top_left,
    # scores capped by tanh: a -65504 bias collapses a row in every dtype, not float16 only
    sc.logits_soft_capped,
]


@pytest.mark.parametrize("fn", LOOK_ALIKES, ids=lambda fn: fn.__name__)
def test_look_alikes_get_no_explanation_of_another_defect(fn: Callable[..., Any]) -> None:
    """CONF-1 (SDPA-7.3, SDPA-8.3, SDPA-2.1, SDPA-4): a kernel whose defect resembles a
    probed cause without being it gets no cause: its failures are listed as found."""
    assert diagnose(_kernel(fn)) == []


# (a PyTorch kernel, the causes the probes must establish on it, as listed): the one defect
# of its CPU flash path the probes see (docs/divergences.md#torch-causal-scale-zero), and the
# math path, right there
TORCH_PINNED = [
    ("attnspec.conformance.kernels.torch_sdpa:sdpa_flash", ["causal-scale-zero-nan"]),
    ("torch.nn.functional:scaled_dot_product_attention", ["causal-scale-zero-nan"]),
    ("attnspec.conformance.kernels.torch_sdpa:sdpa_math", []),
]


@pytest.mark.parametrize(("target", "names"), TORCH_PINNED, ids=[t for t, _ in TORCH_PINNED])
def test_probes_on_pytorch_sdpa(target: str, names: list[str]) -> None:
    """SDPA-2.2 (CONF-1): with is_causal and scale=0, PyTorch's CPU flash path (which the
    dispatcher takes for 4-d inputs with E = Ev) gives NaN rows; the probe says so, and
    stays silent on the math path."""
    pytest.importorskip("torch", reason="the kernels are PyTorch's")
    from attnspec.conformance.run.kernel_setup import KernelSetup

    causes = diagnose(KernelSetup(target, "torch").prepare())
    assert [c.name for c in causes] == names
    assert all("scale=0.0" in c.evidence and "-inf x 0" in c.explanation for c in causes)


def test_every_probe_is_pinned() -> None:
    """CONF-1: every probe has a kernel above on which it establishes its cause."""
    established = {name for _, name, _ in PINNED} | {n for _, names in TORCH_PINNED for n in names}
    names = {
        "float64_computed_in_float32": "float64-in-float32",
        "scale_zero_taken_as_default": "scale-zero-is-default",
        "default_scale_other": "default-scale-other",
        "causal_alignment_reversed": "causal-alignment-reversed",
        "empty_row_output": "empty-row-nan",
        "masks_by_adding_finite_value": "mask-added-as-finite-value",
        "floor_weight_on_excluded_keys": "floor-weight-on-excluded-keys",
        "single_key_softmax_weight_one": "single-key-weight-one",
        "scores_in_float16": "scores-rounded-to-float16",
        "bias_added_in_float16": "bias-added-in-float16",
        "batch_or_head_mapping": "batch-head-mixed",
        "mask_sense": "mask-inverted",
        "causal_scale_zero_nan": "causal-scale-zero-nan",
    }
    assert {probe.__name__ for probe in PROBES} == set(names)
    assert set(names.values()) <= established


def test_hints_name_the_declaration_that_passes() -> None:
    """CONF-3 (SDPA-4.2, SDPA-1.4, SDPA-5.1): where a declaration would make the kernel
    pass, the cause's hint gives the exact flag, and the kernel passes under it."""
    (alignment,) = diagnose(_kernel(sc.top_left_declared_bottom_right))
    assert "--causal-alignment top_left" in alignment.hint
    (dtype,) = diagnose(_kernel(sm.float64_computed_in_float32))
    assert "--dtype float16,float32" in dtype.hint
    (empty,) = diagnose(_kernel(sm.finite_fill_minus_1e9))
    assert "--no-empty-rows-zero" in empty.hint
    # the declared kernel passes every stratum and anchor, cut to small sizes (what the
    # declaration changes is the same at any size)
    passes = check(
        sc.top_left_declared_bottom_right,
        only="causal-zeros,causal-alignment",
        causal_alignment="top_left",
        **SMALL_SIZES,
    )
    assert passes.conforms, [v.detail for v in passes.verdicts]
    lower = check(
        sm.float64_computed_in_float32,
        only="matches-reference",
        dtypes="float16,float32",
        **SMALL_SIZES,
    )
    assert lower.conforms, [v.detail for v in lower.verdicts]
    waived = check(sm.finite_fill_minus_1e9, only="empty-rows-zero", empty_rows_zero=False)
    assert waived.conforms, [v.detail for v in waived.verdicts]


def test_float16_scores_and_bias_in_one_buffer_are_one_cause() -> None:
    """CONF-1 (SDPA-7.2, SDPA-5.1): torch.nn.MultiheadAttention with need_weights keeps
    scores and bias in one float16 buffer; the float16-bias probe sees that too, and its
    evidence joins the scores' cause instead of making a second one (pytorch #41508 gives
    the NaN for empty rows, docs/divergences.md)."""
    pytest.importorskip("torch", reason="the kernel is torch's MultiheadAttention")
    from attnspec.conformance.judge.diagnosis import bias_added_in_float16
    from attnspec.conformance.run.kernel_setup import KernelSetup

    kernel = KernelSetup("torch.nn:MultiheadAttention").prepare()
    assert bias_added_in_float16(kernel) is not None  # both probes see it
    causes = diagnose(kernel)
    assert [c.name for c in causes] == ["empty-row-nan", "scores-rounded-to-float16"]
    assert "-65504" in causes[1].evidence


def test_a_worker_silent_before_any_kernel_call_does_not_stop_the_diagnosis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONF-5, CONF-1: a verdict lost because the worker went silent before any kernel
    call or after the kernel returned (its own draws and checks, on a loaded machine) says
    nothing about the kernel, so the diagnosis probes still run; one lost during a kernel
    call stops them (probing a kernel that hung could cost another timeout)."""
    from attnspec.conformance.judge.registry import all_properties
    from attnspec.conformance.run import supervisor
    from attnspec.conformance.run.kernel_setup import KernelSetup

    setup = KernelSetup("attnspec.reference:scaled_dot_product_attention", "numpy")
    prop = all_properties()["default-scale"]
    with supervisor.IsolatedKernel(setup, supervisor.IsolationOptions()) as session:
        session.start()
        for call, lost in (
            (supervisor._LastCall(), 0),  # before any kernel call
            (supervisor._LastCall("q(1, 1, 1)"), 0),  # after the kernel returned
            (supervisor._LastCall("q(1, 1, 1)", None, True), 1),  # during a kernel call
        ):

            def silent(request: tuple[Any, ...], call: Any = call) -> Any:
                if request[0] == "hints":
                    return ["probed"]
                raise supervisor._Lost("nothing happened", call)

            monkeypatch.setattr(session, "_request", silent)
            assert session.run_property(prop, profile="quick", seed=None).status == "failed"
            assert session.lost == lost
            assert session.run_hints(1) == (["probed"] if not lost else [])
        # and the report says that the failures' causes were not probed
        from attnspec.conformance.plan import finish_report

        report = hand_report([hand_verdict("default-scale", "SDPA-2.1")])
        finish_report(report, session, partial=True)
        assert any(line.startswith("the causes of the failures") for line in report.not_checked)
        # a call that outlasted --timeout in the worker (which then probes nothing) too
        monkeypatch.setattr(session, "lost", 0)
        stalled = hand_verdict("default-scale", "SDPA-2.1")
        stalled.stalled = True
        report = hand_report([stalled])
        finish_report(report, session, partial=True)
        assert any(line.startswith("the causes of the failures") for line in report.not_checked)


def test_calls_that_outlast_the_timeout_are_one_cause() -> None:
    """CONF-5 (issue 38): torch's MultiheadAttention outlasted --timeout in two properties
    on a loaded machine (docs/figures/findings.json): one finding, not two divergences."""
    hung = (
        "the kernel did not return within 60 s (--timeout SECONDS) on the inputs below; the "
        "check ended the kernel's process (and whatever it started) and went on [CONF-5]"
    )
    report = hand_report(
        [
            hand_verdict("value-head-dim", "SDPA-1.1", detail=hung),
            hand_verdict("output-shape-dtype", "SDPA-1.3", detail=hung),
        ]
    )
    [one] = divergences(report)
    assert one.properties == ["value-head-dim", "output-shape-dtype"]


def test_cause_lines_travel_with_the_hints() -> None:
    """CONF-1: a cause survives the hint lines a worker returns, the hints stay hints."""
    cause = Cause("scale-zero-is-default", "SDPA-2.2", "x", "y", "z")
    assert from_lines(["a hint", to_line(cause)]) == (["a hint"], [cause])


def _case(**options: Any) -> str:
    problem = Problem(
        q=np.zeros((2, 4, 3, 8)), k=np.zeros((2, 2, 5, 8)), v=np.zeros((2, 2, 5, 8)), **options
    )
    return problem.describe()


def test_a_cause_explains_the_failures_on_the_inputs_it_acts_on() -> None:
    """CONF-1 (SDPA-2.2, SDPA-4.2, SDPA-1.3): a failure's minimal case says which cause
    explains it: scale=0 for scale=0 taken as the default, a causal call with Lq != Lk for
    the other alignment, a float64 input for float64 computed in float32."""
    zero = hand_verdict("explicit-scale", "SDPA-2.2", case=_case(dtype="float32", scale=0.0))
    causal = hand_verdict("causal-zeros", "SDPA-4.2", case=_case(dtype="float32", is_causal=True))
    wide = hand_verdict("matches-reference", "SDPA-7.3", case=_case(dtype="float64"))
    parsed = case_of(zero.counterexample)
    assert parsed is not None and parsed.q == (2, 4, 3, 8) and parsed.scale == "0.0"
    for name, verdict in (
        ("scale-zero-is-default", zero),
        ("causal-alignment-reversed", causal),
        ("float64-in-float32", wide),
    ):
        cause = Cause(name, "SDPA-1.3", "", "")
        assert [v for v in (zero, causal, wide) if explains(cause, v)] == [verdict]


def test_causal_scale_zero_explains_causal_failures_at_a_scale_of_zero_or_below() -> None:
    """SDPA-2.2: the causal-scale-zero cause explains causal failures at scale 0 or a
    negative scale, not at scale 0.3 (whose text also starts with "0") nor without
    is_causal."""
    cause = Cause("causal-scale-zero-nan", "SDPA-2.2", "", "")
    explained = {
        options: explains(
            cause,
            hand_verdict(
                "matches-reference", "SDPA-7.3", case=_case(dtype="float32", **dict(options))
            ),
        )
        for options in (
            (("is_causal", True), ("scale", 0.0)),
            (("is_causal", True), ("scale", -0.75)),
            (("is_causal", True), ("scale", 0.3)),
            (("is_causal", False), ("scale", 0.0)),
        )
    }
    assert list(explained.values()) == [True, True, False, False]


def test_report_shows_each_cause_once_with_the_failures_it_explains() -> None:
    """CONF-1: each cause once, with evidence, hint and every failure it explains (none
    hidden), then the failures no cause explains; the header counts causes."""
    verdicts = [
        hand_verdict("explicit-scale", "SDPA-2.2", case=_case(dtype="float32", scale=0.0)),
        hand_verdict("key-permutation", "SDPA-7.6", case=_case(dtype="float32", scale=0.0)),
        hand_verdict("matches-reference", "SDPA-7.3", case=_case(dtype="float64")),
        hand_verdict("dtype-preserved", "SDPA-1.3", case=_case(dtype="float16")),
    ]
    causes = [
        Cause("scale-zero-is-default", "SDPA-2.2", "scale=0 as default", "probe A", "hint A"),
        Cause("float64-in-float32", "SDPA-7.3", "float64 in float32", "probe B", "--dtype x"),
    ]
    report = hand_report(verdicts, causes=causes)
    groups, unexplained = by_cause(report)
    assert [[v.property for v in g.failures] for g in groups] == [
        ["explicit-scale", "key-permutation"],
        ["matches-reference"],
    ]
    assert [v.property for v in unexplained] == ["dtype-preserved"]
    text = format_table(report)
    assert "3 causes: 2 established by diagnosis probes, 1 found by the properties alone" in text
    assert text.count("scale=0 as default") == 1 and text.count("float64 in float32") == 1
    for verdict in verdicts:
        assert verdict.property in text
    assert "failures no probed cause explains" in text
    assert "hint:     --dtype x" in text
    # a known kernel's write-up of an explained failure stays in the report
    linked = format_table(report, write_ups={"key-permutation": "docs/divergences.md#x"})
    assert "key-permutation [SDPA-7.6]" in linked and "confirmed: docs/divergences.md#x" in linked
    data = report_dict(report)
    assert data["causes"][0]["explains"] == ["explicit-scale", "key-permutation"]
    assert [d["properties"] for d in data["divergences"]] == [["dtype-preserved"]]


def test_junit_shows_the_causes_as_the_console_does() -> None:
    """CONF-1: the JUnit report counts the causes (a suite property), tells them as the
    console does (the suite's system-out: each cause with its evidence, hint and the
    failures it explains, then those no cause explains), and heads each failure a cause
    explains with that cause."""
    import xml.etree.ElementTree as ET

    from attnspec.conformance.report.render import to_junit

    verdicts = [
        hand_verdict("explicit-scale", "SDPA-2.2", case=_case(dtype="float32", scale=0.0)),
        hand_verdict("key-permutation", "SDPA-7.6", case=_case(dtype="float32", scale=0.0)),
        hand_verdict("dtype-preserved", "SDPA-1.3", case=_case(dtype="float16")),
    ]
    cause = Cause("scale-zero-is-default", "SDPA-2.2", "scale=0 as default", "probe A", "hint A")
    suite = ET.fromstring(to_junit(hand_report(verdicts, causes=[cause])))[0]
    counted = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert counted["causes"] == (
        "2 causes: 1 established by diagnosis probes, 1 found by the properties alone"
    )
    told = suite.find("system-out")
    assert told is not None and told.text is not None
    assert "cause 1: scale=0 as default [SDPA-2.2]" in told.text
    assert "  evidence: probe A" in told.text and "  hint: hint A" in told.text
    assert "explains: explicit-scale [SDPA-2.2], key-permutation [SDPA-7.6]" in told.text
    assert "not explained by a probe: SDPA-1.3 (failed): dtype-preserved" in told.text
    failures = {
        case.get("name"): (case.find("failure").text or "")  # type: ignore[union-attr]
        for case in suite.iter("testcase")
    }
    assert failures["key-permutation[SDPA-7.6]"].startswith("cause 1: scale=0 as default")
    assert not failures["dtype-preserved[SDPA-1.3]"].startswith("cause")


def test_a_check_reports_the_probed_cause() -> None:
    """CONF-1 (SDPA-2.2): checking a kernel that takes scale=0 as the default reports that
    cause once, with the failures it explains under it."""
    report = check(sc.scale_zero_means_default, only="explicit-scale,default-scale")
    assert [c.name for c in report.causes] == ["scale-zero-is-default"]
    text = format_table(report)
    assert "1 cause: 1 established by diagnosis probes, 0 found by the properties alone" in text
    assert "explicit-scale" in text.split("cause 1:")[1]


def test_headings_name_the_declared_alignment() -> None:
    """SDPA-4.2: a kernel declared bottom-right that fails the causal properties has them
    headed with SDPA-4.2's title, never "Top-left causal alignment"."""
    report = check(sc.top_left_declared_bottom_right, only="causal-alignment")
    [verdict] = report.verdicts
    assert verdict.status == "failed" and verdict.clause == "SDPA-4.2"
    text = format_table(report)
    assert "SDPA-4.2: Bottom-right causal alignment" in text
    assert "Top-left causal alignment" not in text


def test_every_report_says_what_was_not_checked_and_the_wall_time() -> None:
    """CONF-6, SDPA-1.4: the report names the dtypes the backend cannot express (NumPy
    has no bfloat16), the properties of undeclared features and those --only left out;
    the summary gives the wall time of the run and the kernel's share of it (issue 33)."""
    report = check(CORRECT[0].fn, only="default-scale,dropout-zero")
    text = format_table(report)
    [line] = [line for line in text.splitlines() if line.startswith("not checked: ")]
    assert "bfloat16 (numpy cannot express it)" in line
    assert "dropout-zero" in line and "--only/--skip" in line
    ran, not_applicable = report.verdicts
    assert 0 < ran.kernel_seconds < ran.seconds and not_applicable.kernel_seconds == 0
    share = f"{ran.kernel_seconds / report.wall_seconds:.0%} of the wall time"
    assert report.wall_seconds > 0 and (
        f" s wall time; the kernel's calls took {ran.kernel_seconds:.1f} s, {share})" in text
    )


def test_a_kernel_share_past_the_wall_time_says_it_is_summed_over_workers() -> None:
    """CONF-6: with --jobs N the kernel's calls, summed over the workers, may take longer
    than the run's wall time; the summary says they are summed instead of printing a share
    past 100% unexplained (issue 33)."""
    report = check(CORRECT[0].fn, only="default-scale")
    alone = summary_line(report)
    assert "summed over" not in alone
    wall = report.verdicts[0].kernel_seconds / 2
    parallel = summary_line(dataclasses.replace(report, wall_seconds=wall))
    assert "s summed over the check's workers, 200% of the wall time)" in parallel


def test_long_reproductions_go_beside_the_report(tmp_path: Path) -> None:
    """CONF-1: a reproduction too long to show is written to --reproductions DIR, else
    beside the --markdown/--junit report, else to the working directory; never to the
    temporary directory."""
    from attnspec.conformance.cli import build_parser, reproductions_directory
    from attnspec.conformance.judge.reproduce import reproductions_in

    def directory(*argv: str) -> Path:
        return reproductions_directory(build_parser().parse_args(["check", "m:f", *argv]))

    assert directory() == Path("attnspec-reproductions")
    report = tmp_path / "out" / "report.md"
    assert directory("--markdown", str(report)) == tmp_path / "out" / "attnspec-reproductions"
    assert directory("--reproductions", str(tmp_path / "r")) == tmp_path / "r"
    verdict = hand_verdict("key-permutation", "SDPA-7.6")
    verdict.reproduction = "print('replay')\n"
    written = Path(reproductions_in(tmp_path / "r")(verdict))
    assert written == tmp_path / "r" / "key-permutation.py"
    assert written.read_text(encoding="utf-8") == "print('replay')\n"


@pytest.mark.parametrize(
    ("property_id", "fn", "other"),
    [
        ("key-permutation", sm.online_softmax_drops_tail, "out_original = fn("),
        ("value-linearity", sm.values_cached_in_int8, "out_v2 = fn("),
        ("masked-values-ignored", sc.max_includes_masked_keys, "out_original = fn("),
        ("masked-nonfinite-ignored", sm.nan_leaks_through_matmul, "out_original = fn("),
        ("causal-zeros", sc.causal_one_ahead, "out_original = fn("),
        ("decode-consistency", sc.decode_step_top_left, "out_full = fn("),
        ("batch-head-independence", sm.batch_and_heads_transposed, "out_original = fn("),
        ("mask-broadcast", sc.mask_ignores_head_broadcast, "out_head0 = fn("),
        ("mask-wins-over-bias", sc.additive_mask_minus_1e4, "out_zeroed = fn("),
        # a kernel whose calls differ at random: its replay may happen to agree
        ("deterministic", pl.random_key_order, "out_again = fn("),
    ],
)
def test_two_call_reproductions_replay_every_call(
    property_id: str, fn: Callable[..., Any], other: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """SDPA-7.6, SDPA-8, SDPA-4, SDPA-3, SDPA-7.5: the reproduction of a property that
    compared calls with each other makes every call it made and the comparison it failed,
    and run on its own shows the difference beyond the allowed one.  The first failing
    example is replayed, not shrunk (as tests/catalogue/test_caught.py): the reproduction
    is written the same way for any failing example, and shrinking took ~95% of these
    tests' time (8.2 -> 0.4 CPU-s for the ten)."""
    from support import verdict_of

    verdict = verdict_of(property_id, fn, shrink=False)
    assert verdict.status in ("failed", "warning"), verdict.detail  # SDPA-8.2 is a SHOULD
    assert other in verdict.reproduction and "expected = " in verdict.reproduction
    exec(compile(verdict.reproduction, property_id, "exec"), {})
    printed = capsys.readouterr().out
    assert "largest difference between the calls:" in printed
    beyond = printed.split("beyond it at: ")[1].splitlines()[0]
    assert beyond != "[]" or property_id == "deterministic", printed
