"""The backward catalogue (tests/catalogue/backward.py) judged by the clauses of
spec/backward.md: every buggy backward is caught, every correct formulation passes.

Through the real check: each formulation is a kernel ``attnspec check --backward`` checks
(tests/catalogue/backward_kernels.py: a custom torch.autograd.Function whose backward is the
formulation, plain torch.autograd, an explicit FlashAttention-style backward function), the
correct ones passing every ``gradients-*`` property of the quick profile and each buggy one
failing the property the catalogue names, run by the suite's property runner on the quick
profile's examples (the first failure decides; not shrunk).  Beside it, the hand checks of
:func:`failed_checks` (named by the same property ids) judge the correct formulations on
20 random problems each, with the catalogue's own problems, independently of the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the catalogue's backward kernels are torch's")

from support import (  # noqa: E402
    SMALL_LIMITS,
    SMALL_SIZE_FLAGS,
    checked_with_the_kernel_in_its_own_process,
    run_main,
)

from attnspec.backends import Backend  # noqa: E402
from attnspec.conformance.api import check  # noqa: E402
from attnspec.conformance.judge.kernel import KernelUnderTest  # noqa: E402
from attnspec.conformance.judge.registry import all_properties  # noqa: E402
from attnspec.conformance.judge.verdict import (  # noqa: E402
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    WARNING,
    Report,
)
from attnspec.conformance.report.render import format_table  # noqa: E402
from attnspec.conformance.run.property_runner import run_property  # noqa: E402
from attnspec.reference.tolerance_backward import gradient_error_bound  # noqa: E402
from catalogue.backward import BUGS, CORRECT  # noqa: E402
from catalogue.backward_kernels import CORRECT_KERNELS  # noqa: E402

Problem = dict[str, Any]
FLOAT32_MIN = float(np.finfo(np.float32).min)


def _rounded(a: np.ndarray) -> np.ndarray:
    """Values the float32 kernel receives (BWD-16)."""
    return a.astype(np.float32).astype(np.float64)


def _gqa_causal_padded() -> Problem:
    rng = np.random.default_rng(41)
    mask = rng.random((2, 1, 65, 70)) < 0.9
    mask[0, :, 5] = False  # a query with no key (BWD-4)
    mask[..., 3] = False  # a key no query sees (BWD-3)
    bias = rng.standard_normal((1, 1, 65, 70))
    bias[..., -1] = FLOAT32_MIN  # a padded key
    return {
        "q": rng.standard_normal((2, 4, 65, 32)),
        "k": rng.standard_normal((2, 2, 70, 32)),
        "v": rng.standard_normal((2, 2, 70, 32)),
        "grad_out": rng.standard_normal((2, 4, 65, 32)),
        "mask": mask,
        "bias": bias,
        "is_causal": True,
        "causal_alignment": "bottom_right",
    }


def _low_log_sum_exp() -> Problem:
    """PyTorch #196678: every score about -120 (log-sum-exp < -88.7), a mask, L = 192."""
    rng = np.random.default_rng(43)
    q, k = rng.standard_normal((1, 1, 192, 16)) * 0.1, rng.standard_normal((1, 1, 192, 16)) * 0.1
    q[..., 0], k[..., 0] = 1.0, -480.0
    return {
        "q": q,
        "k": k,
        "v": rng.standard_normal((1, 1, 192, 16)),
        "grad_out": rng.standard_normal((1, 1, 192, 16)),
        "mask": np.tril(np.ones((192, 192), dtype=bool)),
    }


def _softcapped() -> Problem:
    rng = np.random.default_rng(47)
    return {
        "q": rng.standard_normal((1, 2, 33, 8)) * 3,
        "k": rng.standard_normal((1, 1, 40, 8)) * 3,  # top-left: keys 33.. no query sees
        "v": rng.standard_normal((1, 1, 40, 8)),
        "grad_out": rng.standard_normal((1, 2, 33, 8)),
        "is_causal": True,
        "softcap": 2.0,
    }


QUICK = (_gqa_causal_padded, _low_log_sum_exp, _softcapped)


def _random(seed: int) -> Problem:
    """A small problem with options drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    n_kv, group = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    n_q, n_k = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    dim, value_dim = int(rng.integers(1, 17)), int(rng.integers(1, 17))
    heads = n_kv * group
    problem: Problem = {
        "q": rng.standard_normal((2, heads, n_q, dim)) * rng.choice([1.0, 3.0]),
        "k": rng.standard_normal((2, n_kv, n_k, dim)) * rng.choice([1.0, 3.0]),
        "v": rng.standard_normal((2, n_kv, n_k, value_dim)),
        "grad_out": rng.standard_normal((2, heads, n_q, value_dim)),
    }
    if rng.random() < 0.5:
        problem["mask"] = rng.random((2, 1, n_q, n_k)) < 0.8
    if rng.random() < 0.5:
        problem["bias"] = rng.standard_normal((1, heads, n_q, n_k))
    if rng.random() < 0.5:
        problem["is_causal"] = True
        problem["causal_alignment"] = str(rng.choice(["top_left", "bottom_right"]))
    if rng.random() < 0.3:
        problem["scale"] = float(rng.choice([0.25, -0.5, 1.3]))
    if rng.random() < 0.3:
        problem["softcap"] = float(rng.choice([1.0, 5.0]))
    return problem


def _options(problem: Problem) -> dict[str, Any]:
    return {k: v for k, v in problem.items() if k not in ("q", "k", "v", "grad_out")}


def _call(backward: Callable[..., Any], problem: Problem) -> list[Any]:
    """The kernel's gradients on float32 torch tensors."""
    tensors = {
        name: torch.from_numpy(problem[name].astype(np.float32))
        for name in ("q", "k", "v", "grad_out", "bias")
        if name in problem
    }
    options = {
        key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for key, value in _options(problem).items()
        if key != "bias"
    }
    return list(
        backward(
            tensors["q"],
            tensors["k"],
            tensors["v"],
            tensors["grad_out"],
            bias=tensors.get("bias"),
            **options,
        )
    )


def _allowed(problem: Problem) -> np.ndarray:
    """S(i) of every (batch, query head, query, key) of the problem."""
    q, k = problem["q"], problem["k"]
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = np.ones((*q.shape[:-1], n_k), dtype=bool)
    if "mask" in problem:
        allowed &= problem["mask"]
    if problem.get("is_causal"):
        offset = 0 if problem.get("causal_alignment", "top_left") == "top_left" else n_k - n_q
        allowed &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset
    if "bias" in problem:
        allowed &= problem["bias"] != -np.inf
    return allowed


_BOUNDS: dict[str, Any] = {}  # one bound per named problem, shared by the kernels judged


def _bound(problem: Problem, name: str) -> Any:
    if name not in _BOUNDS:
        _BOUNDS[name] = gradient_error_bound(
            problem["q"],
            problem["k"],
            problem["v"],
            problem["grad_out"],
            dtype="float32",
            **_options(problem),
        )
    return _BOUNDS[name]


def backward_properties() -> list[str]:
    """The ids of the backward properties (spec/backward.md), in the registry's order."""
    return [p.id for p in all_properties().values() if p.clause.startswith("BWD-")]


def failed_checks(backward: Callable[..., Any], problem: Problem, name: str) -> set[str]:
    """The checks the backward fails on ``problem`` (named ``name``; empty: it passes)."""
    problem = {
        k: _rounded(v) if k in ("q", "k", "v", "grad_out", "bias") else v
        for k, v in problem.items()
    }
    inputs = {
        "dq": problem["q"],
        "dk": problem["k"],
        "dv": problem["v"],
        "dbias": problem.get("bias"),
    }
    first = _call(backward, problem)
    failed: set[str] = set()
    for gradient_name, gradient in zip(inputs, first, strict=True):
        expected = inputs[gradient_name]
        if (expected is None) != (gradient is None) or (
            expected is not None
            and (tuple(gradient.shape) != expected.shape or gradient.dtype != torch.float32)
        ):
            failed.add("gradients-shape-dtype")  # BWD-2, BWD-13
    if failed:
        return failed
    got = [None if g is None else g.double().numpy() for g in first]
    if not all(np.all(np.isfinite(g)) for g in got if g is not None):
        failed.add("gradients-finite")  # BWD-5
    allowed = _allowed(problem)
    group = problem["q"].shape[-3] // problem["k"].shape[-3]
    per_kv_head = allowed.reshape(*allowed.shape[:-3], -1, group, *allowed.shape[-2:])
    unreached = ~per_kv_head.any(axis=(-3, -2))  # (batch, Hkv, Lk): keys no query attends
    if np.any(got[1][unreached] != 0) or np.any(got[2][unreached] != 0):
        failed.add("gradients-excluded-keys-zero")  # BWD-3
    keyless = ~allowed.any(axis=-1)
    if np.any(np.broadcast_to(got[0], (*keyless.shape, got[0].shape[-1]))[keyless] != 0):
        failed.add("gradients-empty-rows")  # BWD-4
    bound = _bound(problem, name)
    for gradient, expected, tolerance in zip(got, bound[:4], bound[4:], strict=True):
        if expected is not None and not np.all(np.abs(gradient - expected) <= tolerance):
            failed.add("gradients-match-reference")  # BWD-17
    second = _call(backward, problem)
    if any(a is not None and not torch.equal(a, b) for a, b in zip(first, second, strict=True)):
        failed.add("gradients-deterministic")  # BWD-15 (a SHOULD: a warning)
    return failed


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_backward_passes_every_check(name: str) -> None:
    """BWD-2, BWD-3, BWD-4, BWD-5, BWD-13, BWD-15, BWD-17: each correct formulation passes
    every check on the quick problems and on 20 random ones."""
    backward = CORRECT[name]
    for make in QUICK:
        assert not failed_checks(backward, make(), make.__name__), (name, make.__name__)
    for seed in range(20):
        assert not failed_checks(backward, _random(seed), f"seed {seed}"), (name, seed)


# each correct kernel's check, once per process (flash2's is read by two tests below)
_REPORTS: dict[str, Report] = {}


def _checked(name: str) -> Report:
    """The check of the correct backward kernel ``name`` (CORRECT_KERNELS) on every backward
    property of the quick profile, once per process.  flash2's runs with the kernel in a
    process of its own (support.checked_with_the_kernel_in_its_own_process: its backward
    answers "vjp" requests there), which test_log_sum_exp_gradient_reaches_the_kernels_process
    reads too; the others' in this process."""
    if name not in _REPORTS:
        target = f"catalogue.backward_kernels:{CORRECT_KERNELS[name]}"
        only = backward_properties()
        _REPORTS[name] = (
            checked_with_the_kernel_in_its_own_process(target, backend="torch", only=only)
            if name == "flash2"
            else check(target, backend="torch", only=only)
        )
    return _REPORTS[name]


@pytest.mark.parametrize("name", sorted(CORRECT_KERNELS))
def test_correct_backward_kernel_passes_the_check(name: str) -> None:
    """BWD-1 … BWD-5, BWD-7, BWD-8, BWD-10, BWD-15, BWD-17: each correct formulation, as a
    kernel, passes every gradients-* property of ``attnspec check --backward``'s quick
    profile (BWD-11's and BWD-12's apply to packed and sparse kernels only; the explicit
    backward function, which
    takes no gradient of the log-sum-exp, all but BWD-10's too; BWD-18's applies to
    float16 and bfloat16, which these float32 kernels are not checked in)."""
    report = _checked(name)
    # packed and sparse kernels only; dropout's (test_dropout_backward.py) for backward_dropout
    families = {"gradients-packed", "gradients-sparse", "gradients-dropout"}
    families.add("gradients-within-flash-rule")  # BWD-18: float16 and bfloat16 only
    not_applicable = {*families, *(["gradients-log-sum-exp"] * (name == "explicit"))}
    assert {v.property for v in report.verdicts if v.status == NOT_APPLICABLE} == not_applicable
    assert [v.property for v in report.verdicts if v.status not in (PASSED, NOT_APPLICABLE)] == []
    assert len(report.verdicts) == len(backward_properties())


def test_log_sum_exp_gradient_reaches_the_kernels_process() -> None:
    """BWD-10: with the kernel in its own process (a "vjp" request carrying dlse) the correct
    formulation passes gradients-log-sum-exp, which it fails without dlse's term (the
    catalogue's lse-not-differentiated, caught in this process below).  The check of
    test_correct_backward_kernel_passes_the_check[flash2], whose kernel runs in a process
    of its own."""
    verdicts = [v for v in _checked("flash2").verdicts if v.property == "gradients-log-sum-exp"]
    assert [v.status for v in verdicts] == [PASSED], verdicts[0].detail


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.name)
def test_each_bug_is_caught(bug: Any) -> None:
    """BWD-1 … BWD-5, BWD-13, BWD-15, BWD-17: every buggy backward (its forward right)
    fails the property named for it on the quick profile, run by the check's runner."""
    from catalogue.backward_kernels import BUGGY

    kernel = KernelUnderTest(BUGGY[bug.name], Backend("torch"))
    verdict = run_property(all_properties()[bug.caught_by], kernel, profile="quick", shrink=False)
    assert verdict.status in (FAILED, WARNING), (bug.name, bug.upstream, verdict.detail)


def test_check_command_runs_an_explicit_backward_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """BWD-1, BWD-17: ``attnspec check`` of a kernel declaring ``backward_fn`` (FlashAttention's
    ``bwd(dout, q, k, v, out, lse, ...)`` convention) runs the backward in the kernel's own
    process and passes a correct one; the same check, its kernel in a process of its own,
    fails a buggy autograd.Function: the report does not conform (the command's exit
    status 1) and its table names the property and the clause.

    Its backward's accuracy property only, at small sizes (every stratum and anchor, cut
    to SMALL_SIZES): what is checked is the route to the backward in the kernel's process
    and back; the bug itself is caught at the quick profile's full sizes by
    test_each_bug_is_caught above, in this process.  The command runs in this process
    (``cli.main``; its own process start-up, ~2 CPU-s a run, is the CLI tests' subject), the
    buggy kernel's check without the command's judging worker
    (support.checked_with_the_kernel_in_its_own_process: the kernel's process is what the
    failure comes back from; a failing check's exit status 1 is the CLI tests' too)."""
    monkeypatch.chdir(tmp_path)
    only = ["--only", "gradients-match-reference", *SMALL_SIZE_FLAGS]
    target = "catalogue.backward_kernels:explicit_flash2"
    status, out, err = run_main(capsys, "check", target, "--backend", "torch", *only)
    assert status == 0, out + err
    report = checked_with_the_kernel_in_its_own_process(
        "catalogue.backward_kernels:flash2_no_delta",
        backend="torch",
        only=["gradients-match-reference"],
        limits=SMALL_LIMITS,
    )
    table = format_table(report)
    assert not report.conforms, table
    assert "gradients-match-reference" in table and "BWD-17" in table


@pytest.mark.parametrize(
    ("target", "status"), [("packed_zeroed_tail", PASSED), ("packed_unwritten_tail", FAILED)]
)
def test_packed_backward_property(target: str, status: str) -> None:
    """BWD-11 (gradients-packed, through the check's runner): a packed kernel whose backward
    zeroes the gradient rows past cu_seqlens[-1] passes; PyTorch #176793's, which leaves them
    unwritten (NaN here), fails."""
    from catalogue import backward_kernels

    kernel = KernelUnderTest(getattr(backward_kernels, target), Backend("torch"))
    verdict = run_property(all_properties()["gradients-packed"], kernel, profile="quick")
    assert verdict.status == status, verdict.detail


def test_sparse_backward_property(monkeypatch: pytest.MonkeyPatch) -> None:
    """BWD-12 (gradients-sparse, through the check's runner): a sliding-window kernel whose
    backward is torch.autograd of its masked forward passes (on 5 draws, to keep this cheap:
    the quick profile's 26 take 9 s of CPU); one that leaves the dk, dv rows of keys no query
    sees unwritten (NaN) fails on the quick profile."""
    from attnspec.conformance.run import property_runner
    from catalogue.backward_kernels import window_unwritten, window_written

    prop = all_properties()["gradients-sparse"]
    failed = run_property(prop, KernelUnderTest(window_unwritten, Backend("torch")), shrink=False)
    assert failed.status == FAILED, failed.detail
    small = property_runner.Profile(5, anchors=0, blocks=0, decode=0, wide=0, corners=0)
    monkeypatch.setitem(property_runner.PROFILES, "quick", small)
    passed = run_property(prop, KernelUnderTest(window_written, Backend("torch")))
    assert passed.status == PASSED, passed.detail


@pytest.mark.parametrize("zero_tail", [True, False])
def test_packed_rows_past_the_last_offset(zero_tail: bool) -> None:
    """BWD-11: a packed backward given arrays 3 tokens longer than cu_seqlens[-1] returns
    rows of exactly 0 past it, and each sequence's rows within BWD-17 of the reference's
    backward of the trimmed arrays (no gradient crosses a boundary); leaving the tail
    unwritten (PyTorch #176793) is caught."""
    from attnspec.reference.backward import varlen_attention_backward
    from catalogue.backward import varlen_backward

    rng = np.random.default_rng(61)
    cu_q, cu_k = [0, 5, 5, 12], [0, 4, 9, 16]
    q, k, v = (_rounded(rng.standard_normal((n, 2, 8))) for n in (15, 19, 19))
    do = _rounded(rng.standard_normal((15, 2, 8)))
    grads = varlen_backward(
        *(torch.from_numpy(a.astype(np.float32)) for a in (q, k, v)),
        cu_q,
        cu_k,
        torch.from_numpy(do.astype(np.float32)),
        is_causal=True,
        zero_tail=zero_tail,
    )
    got = [g.double().numpy() for g in grads]
    tails_zero = all(
        np.all(g[stop:] == 0) for g, stop in zip(got, (cu_q[-1], cu_k[-1], cu_k[-1]), strict=True)
    )
    assert tails_zero == zero_tail
    expected = varlen_attention_backward(
        q[:12],
        k[:16],
        v[:16],
        np.array(cu_q),
        np.array(cu_k),
        do[:12],
        is_causal=True,
        causal_alignment="bottom_right",
    )
    for b in range(3):  # per sequence, against the dense bound of that sequence alone
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        bound = gradient_error_bound(
            *(np.swapaxes(a, 0, 1) for a in (q[rows], k[keys], v[keys], do[rows])),
            dtype="float32",
            is_causal=True,
            causal_alignment="bottom_right",
        )
        parts = zip(got, expected[:3], (rows, keys, keys), bound[4:7], strict=True)
        for g, e, index, tolerance in parts:
            np.testing.assert_array_equal(np.swapaxes(tolerance, 0, 1).shape, g[index].shape)
            assert np.all(np.abs(g[index] - e[index]) <= np.swapaxes(tolerance, 0, 1))
