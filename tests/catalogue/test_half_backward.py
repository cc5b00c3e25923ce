"""BWD-18 (FlashAttention's comparative rule) on the half-precision backward catalogue
(tests/catalogue/half_backward.py): the correct formulations, FlashAttention 2's with its own
roundings and PyTorch's math SDPA are within the rule in float16 and bfloat16; four
half-precision bugs (dP, the delta term, dV's and dQ's sums accumulated in the input dtype)
are within BWD-17's bound but outside the rule, and ``gradients-within-flash-rule`` warns
about them, judging the kernel outputs ``gradients-match-reference`` got.  The measured ratios
over more problems and seeds are ``scripts/measure-flash-rule``'s (spec/backward.md, BWD-18)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the half-precision catalogue's kernels are torch's")

from support import one_torch_thread  # noqa: E402

from attnspec.backends import Backend  # noqa: E402
from attnspec.conformance.call.problem import Problem  # noqa: E402
from attnspec.conformance.judge.failures import PropertyFailure  # noqa: E402
from attnspec.conformance.judge.kernel import KernelUnderTest  # noqa: E402
from attnspec.conformance.judge.properties import backward  # noqa: E402
from attnspec.conformance.judge.registry import all_properties  # noqa: E402
from attnspec.conformance.judge.verdict import PASSED, WARNING  # noqa: E402
from attnspec.conformance.run import property_runner  # noqa: E402
from attnspec.reference.same_dtype import (  # noqa: E402
    last_place,
    same_dtype_attention_backward,
)
from catalogue.half_backward import (  # noqa: E402
    HALF_BUGGY,
    HALF_BUGS,
    HALF_CORRECT,
    flash2_half_backward,
    half_kernel,
)

TORCH = Backend("torch")
# (query heads, key/value heads, L, E, causal): a long head dim, causal, at L % 64 = 1; and
# groups of 2 query heads at L % 128 = 64, not causal
SHAPES = ((1, 1, 65, 256, True), (2, 1, 192, 64, False))
# torch ops of these small problems: two threads per op cost up to 20 times one when loaded
_one_torch_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)
_PROBLEMS: dict[tuple[str, int], tuple[Problem, np.ndarray, Any, Any]] = {}


def _problem(dtype: str, which: int) -> tuple[Problem, np.ndarray, Any, Any]:
    """Problem ``which`` of :data:`SHAPES`, unit normal values in ``dtype``, its dO,
    BWD-17's bound and BWD-18's thresholds (computed once)."""
    if (dtype, which) not in _PROBLEMS:
        rng = np.random.default_rng(6)
        kernel = KernelUnderTest(HALF_CORRECT["flash2-half"], TORCH)
        n_q_heads, n_kv_heads, length, dim, causal = SHAPES[which]

        def drawn(heads: int) -> np.ndarray:
            return kernel.rounded(rng.standard_normal((1, heads, length, dim)), dtype)

        problem = Problem(
            q=drawn(n_q_heads),
            k=drawn(n_kv_heads),
            v=drawn(n_kv_heads),
            dtype=dtype,
            is_causal=causal,
        )
        grad_out = drawn(n_q_heads)
        bound = backward.expected_gradients(kernel, problem, grad_out, None)
        expected = tuple(bound[:4])
        limits = backward.flash_rule_thresholds(kernel, problem, grad_out, None, expected)
        _PROBLEMS[dtype, which] = problem, grad_out, bound, limits
    return _PROBLEMS[dtype, which]


def _judged(fn: Any, dtype: str, which: int) -> tuple[bool, str]:
    """(within BWD-17, BWD-18's finding or "") of kernel ``fn`` on problem ``which``."""
    problem, grad_out, bound, limits = _problem(dtype, which)
    kernel = KernelUnderTest(fn, TORCH)
    got = backward.call_backward(kernel, problem, grad_out)
    wanted = (bound.dq, bound.dk, bound.dv)
    tolerances = (bound.dq_tolerance, bound.dk_tolerance, bound.dv_tolerance)
    within = all(
        backward.first_outside(np.abs(g - w), t) is None
        for g, w, t in zip(got[:3], wanted, tolerances, strict=True)
    )
    try:
        backward.assert_within_flash_rule(kernel, problem, grad_out, got, bound[:4], limits)
    except PropertyFailure as failure:
        return within, str(failure.args[0])
    return within, ""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_correct_kernels_are_within_the_rule(dtype: str) -> None:
    """BWD-17, BWD-18: FlashAttention 2's backward with its roundings (P and dS in the input
    dtype), the float32 formulations of the backward catalogue (autograd of a plain forward,
    FlashAttention 2's blocked backward, a split-KV softmax backward, an explicit backward
    function) with their results rounded, and PyTorch's math SDPA under torch.autograd are
    within BWD-17's bound and within 3 times the comparison implementation's error."""
    for name, fn in HALF_CORRECT.items():
        for which in range(len(SHAPES)):
            assert _judged(fn, dtype, which) == (True, ""), (name, SHAPES[which])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_bugs_pass_bwd17_but_not_the_rule(dtype: str) -> None:
    """BWD-14, BWD-17, BWD-18: dP = dO V^T or the delta term rowsum(dO * O) accumulated in
    the input dtype, dV accumulated row by row or dQ key by key in it, are within BWD-17's
    bound (which must allow every kernel of TOL-2's model) on both problems and outside
    FlashAttention's rule on at least one, whose finding names the gradient, both errors and
    the ratio."""
    for bug in HALF_BUGS:
        judged = [_judged(HALF_BUGGY[bug.name], dtype, which) for which in range(len(SHAPES))]
        assert all(within for within, _ in judged), (bug.name, judged)
        findings = [finding for _, finding in judged if finding]
        assert findings, (bug.name, dtype)
        assert "[BWD-18]" in findings[0] and "times BWD-18's threshold" in findings[0]
        assert f"attention_ref(upcast=False, reorder_ops=True), in {dtype})" in findings[0]


class _Counted:
    """FlashAttention 2's half-precision backward, counting its calls."""

    calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return flash2_half_backward(*args, **kwargs)


def test_the_rule_judges_the_outputs_gradients_match_reference_got(monkeypatch: Any) -> None:
    """BWD-17, BWD-18: gradients-within-flash-rule draws gradients-match-reference's
    examples and judges the kernel outputs that property got without calling the kernel's
    backward again; a correct kernel passes both."""
    monkeypatch.setitem(property_runner.PROFILES, "tiny", property_runner.Profile(4))
    monkeypatch.setattr(backward, "JUDGED", backward.JudgedOutputs())
    kernel = KernelUnderTest(half_kernel(_Counted(), "counted_flash2_half"), TORCH)
    properties = all_properties()
    verdict = property_runner.run_property(
        properties["gradients-match-reference"], kernel, profile="tiny", seed=0
    )
    assert verdict.status == PASSED, verdict.detail
    calls = _Counted.calls
    assert calls > 0
    verdict = property_runner.run_property(
        properties["gradients-within-flash-rule"], kernel, profile="tiny", seed=0
    )
    assert verdict.status == PASSED, verdict.detail
    assert _Counted.calls == calls


def test_a_bug_gets_a_warning_with_its_reproduction(monkeypatch: Any) -> None:
    """BWD-18 (SHOULD): the check reports dP accumulated in float16 as a warning, not a
    failure, with the rule's numbers and a reproduction of the call."""
    monkeypatch.setitem(property_runner.PROFILES, "tiny", property_runner.Profile(20))
    kernel = KernelUnderTest(HALF_BUGGY["dp-in-half"], TORCH)
    prop = all_properties()["gradients-within-flash-rule"]
    verdict = property_runner.run_property(prop, kernel, profile="tiny", seed=0, shrink=False)
    assert verdict.status == WARNING, verdict.detail
    assert verdict.clause == "BWD-18" and verdict.level == "SHOULD"
    assert "[BWD-18]" in verdict.detail and "the floor" in verdict.detail
    assert verdict.reproduction and verdict.counterexample


def test_rows_of_one_or_two_keys_are_within_the_rule() -> None:
    """BWD-14, BWD-18: on a causal bfloat16 problem of two rows (one and two allowed keys,
    E = 160, scale 0.5: quick seed 3's false warning), FlashAttention 2's backward, whose
    delta term comes from its output rounded to bfloat16, errs by more than 3 times the
    comparison implementation's form P (autograd's rowsum(P dP), nearly exact on such rows)
    and is within the rule, which takes the larger error of forms P and O."""
    rng = np.random.default_rng(0)
    kernel = KernelUnderTest(HALF_CORRECT["flash2-half"], TORCH)

    def drawn() -> np.ndarray:
        return kernel.rounded(rng.standard_normal((1, 1, 2, 160)), "bfloat16")

    problem = Problem(q=drawn(), k=drawn(), v=drawn(), dtype="bfloat16", is_causal=True, scale=0.5)
    grad_out = drawn()
    got = backward.call_backward(kernel, problem, grad_out)
    bound = backward.expected_gradients(kernel, problem, grad_out, None)
    arrays = (
        torch.tensor(a).to(torch.bfloat16) for a in (problem.q, problem.k, problem.v, grad_out)
    )
    form_p = same_dtype_attention_backward(*arrays, is_causal=True, scale=0.5)
    error, form_p_error = (
        float(np.max(np.abs(g - bound.dq))) for g in (got.dq, form_p.dq.double().numpy())
    )
    assert error > 3 * form_p_error
    backward.assert_within_flash_rule(kernel, problem, grad_out, got, bound[:4])


def _rule_case(problem: Problem, grad_out: np.ndarray) -> tuple[float, float, float, float]:
    """FlashAttention 2's half-precision backward on ``problem``: its largest dq error, the
    comparison implementation's, dq's last place at its largest magnitude and BWD-18's
    threshold, after checking that it is within the rule."""
    kernel = KernelUnderTest(HALF_CORRECT["flash2-half"], TORCH)
    got = backward.call_backward(kernel, problem, grad_out)
    bound = backward.expected_gradients(kernel, problem, grad_out, got.bias)
    limits = backward.flash_rule_thresholds(kernel, problem, grad_out, got.bias, tuple(bound[:4]))
    backward.assert_within_flash_rule(kernel, problem, grad_out, got, bound[:4], limits)
    limit = limits[0]
    assert limit is not None
    largest = float(np.max(np.abs(bound.dq)))
    error = float(np.max(np.abs(got.dq - bound.dq)))
    return error, limit.reference_error, last_place(largest, problem.dtype), limit.threshold


def test_a_last_place_is_within_the_rule() -> None:
    """BWD-18's floor, one unit in the last place: on quick seed 19's float16 problem (q = 0,
    six keys of one channel shared by three query heads, scale 1, a row with no key) the
    definition's dq of -1.30160 lies between float16's -1.30078 and -1.30176, and FlashAttention
    2's backward stores the first: 3.1 times the comparison implementation's error, within
    one last place, which the rule allows."""
    k = [0.77001953125, -2.20703125, 1.2841796875, 0.10296630859375, -1.65625, -0.39697265625]
    v = [1.583984375, -2.20703125, 0.81005859375, 0.32373046875, 1.068359375, -1.0]
    upstream = [[0.345703125, 0.82177734375], [0.330322265625, -1.302734375]]
    upstream.append([0.9052734375, 0.4462890625])
    mask = np.array([[False] * 6, [True] * 6])
    problem = Problem(
        q=np.zeros((1, 3, 2, 1)),
        k=np.array(k).reshape(1, 1, 6, 1),
        v=np.array(v).reshape(1, 1, 6, 1),
        dtype="float16",
        scale=1.0,
        mask=mask,
        bias=np.zeros((2, 6)),
    )
    error, reference_error, place, threshold = _rule_case(
        problem, np.array(upstream)[None, ..., None]
    )
    assert 3 * reference_error < error <= place == threshold


def test_weights_recomputed_beside_a_padding_bias_are_within_the_rule() -> None:
    """BWD-18's floor, the weights' float32 roundings at the scores' magnitude: with float16's
    most negative value as a padding bias on every key and scores of about 1e-6 (as on quick
    seed 18, causal rows of 1 to 17 keys), FlashAttention 2's backward recomputes each weight
    from a float32 log-sum-exp of about -65504, rounded by up to 0.002, while the comparison
    implementation, whose scores all round to -65504, gets the definition's uniform weights;
    its dq error is more than 3 times the comparison's and than a last place, and within the
    rule."""
    rng = np.random.default_rng(2)
    kernel = KernelUnderTest(HALF_CORRECT["flash2-half"], TORCH)

    def drawn(heads: int, size: float) -> np.ndarray:
        return kernel.rounded(rng.standard_normal((1, heads, 4, 8)) * size, "float16")

    problem = Problem(
        q=drawn(2, 1e-3),
        k=drawn(1, 1e-3),
        v=drawn(1, 1.0),
        dtype="float16",
        is_causal=True,
        bias=np.full((4, 4), -65504.0),
    )
    error, reference_error, place, threshold = _rule_case(problem, drawn(2, 1.0))
    assert max(3 * reference_error, place) < error <= threshold
