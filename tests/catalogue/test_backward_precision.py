"""BWD-14 named where it causes a BWD-17 failure: a half-precision backward that sums dV
over the query rows in float16 (not float32, as BWD-14 recommends) fails BWD-17 on long
rows of positive terms, and the failure says that the same inputs in float32 pass, so the
cause is the kernel's float16 arithmetic (BWD-14); a kernel that fails in float32 too
gets no such cause.  The float32 re-run that shows it runs once, for the failure reported,
not for every failing example Hypothesis tries while it shrinks."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis.control import current_build_context, currently_in_test_context

torch = pytest.importorskip("torch", reason="the precision catalogue's kernels are torch's")

from attnspec.backends import Backend  # noqa: E402
from attnspec.conformance import declare  # noqa: E402
from attnspec.conformance.call.problem import Problem  # noqa: E402
from attnspec.conformance.judge.failures import PropertyFailure, with_cause  # noqa: E402
from attnspec.conformance.judge.kernel import KernelUnderTest  # noqa: E402
from attnspec.conformance.judge.properties.backward import (  # noqa: E402
    assert_gradients_match,
    call_backward,
)
from attnspec.conformance.judge.registry import all_properties  # noqa: E402
from attnspec.conformance.judge.verdict import FAILED  # noqa: E402
from attnspec.conformance.run import property_runner  # noqa: E402


class _RowByRow(torch.autograd.Function):
    """The forward in float32, its output rounded to the input dtype; the backward's dV
    summed row by row in the input dtype (each partial sum rounded: a float16 accumulator),
    and ``scale_dv`` times that (a bug float32 shows too), or ``scale_half_dv`` times that
    in float16 only (a bug of its half-precision path).  ``CALLS`` logs each backward
    call: its inputs' dtype and the Hypothesis example it ran in (None: outside any)."""

    CALLS: ClassVar[list[tuple[Any, Any]]] = []

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Any, k: Any, v: Any, scale_dv: float, scale_half_dv: float
    ) -> Any:
        weights = torch.softmax(
            q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1]), -1
        )
        ctx.save_for_backward(q, k, v, weights)
        ctx.scale_dv = scale_dv * (scale_half_dv if q.dtype == torch.float16 else 1.0)
        return (weights @ v.float()).to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: Any) -> Any:  # type: ignore[override]
        q, k, v, weights = ctx.saved_tensors
        example = current_build_context() if currently_in_test_context() else None
        _RowByRow.CALLS.append((q.dtype, example))
        alpha, do = 1 / math.sqrt(q.shape[-1]), dout.float()
        dp = do @ v.float().transpose(-1, -2)
        ds = weights * (dp - (do * (weights @ v.float())).sum(-1, keepdim=True))
        dv = torch.zeros(v.shape, dtype=v.dtype)
        for i in range(q.shape[-2]):  # one query row at a time, in the input dtype
            dv = dv + (weights[..., i, :, None] * do[..., i, None, :]).to(v.dtype)
        dq, dk = ds @ k.float() * alpha, ds.transpose(-1, -2) @ q.float() * alpha
        return dq.to(q.dtype), dk.to(k.dtype), dv * ctx.scale_dv, None, None


def _kernel(scale_dv: float, scale_half_dv: float = 1.0) -> Any:
    def kernel(q: Any, k: Any, v: Any) -> Any:
        return _RowByRow.apply(q, k, v, scale_dv, scale_half_dv)

    return declare(
        kernel, mask=False, causal=False, scale=False, dtypes=("float16", "float32"),
        batch_ndim=1, backward=True,
    )  # fmt: skip


def _long_positive_rows() -> tuple[Problem, np.ndarray]:
    """2048 queries, 8 keys, dO > 0: every dV element a sum of 2048 positive terms."""
    rng = np.random.default_rng(7)
    half = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    q, k = half(rng.standard_normal((1, 1, 2048, 8)) * 0.3), half(rng.standard_normal((1, 1, 8, 8)))
    problem = Problem(q=q, k=k, v=half(rng.standard_normal((1, 1, 8, 8))), dtype="float16")
    return problem, half(rng.random((1, 1, 2048, 8)) + 0.5)


@pytest.mark.parametrize(("scale_dv", "names_bwd14"), [(1.0, True), (1.01, False)])
def test_a_float16_accumulator_is_named(scale_dv: float, names_bwd14: bool) -> None:
    """BWD-14: the float16 accumulator fails BWD-17 in float16 and the failure names
    BWD-14 (float32 passes); with dV also 1% off, float32 fails too and BWD-14 is not
    named."""
    kernel = KernelUnderTest(_kernel(scale_dv), Backend("torch"))
    problem, grad_out = _long_positive_rows()
    got = call_backward(kernel, problem, grad_out)
    with pytest.raises(PropertyFailure, match=r"BWD-17") as failure:
        assert_gradients_match(kernel, problem, grad_out, got)
    finding = with_cause(failure.value).finding  # as the runner reports it
    assert ("[BWD-14]" in finding) == names_bwd14, finding


def test_the_float32_rerun_is_for_the_reported_failure_only(monkeypatch: Any) -> None:
    """BWD-14: a kernel whose float16 backward is off (dV doubled) fails BWD-17 on the
    first float16 example gradients-match-reference draws, and Hypothesis shrinks it
    through more failing examples; the report names BWD-14 as before, and the kernel's
    backward ran in float32 on those values once, for the reported failure: in no example
    Hypothesis tried (each calls the backward once, in its own dtype), once after them."""
    monkeypatch.setitem(property_runner.PROFILES, "small-only", property_runner.Profile(5))
    monkeypatch.setattr(_RowByRow, "CALLS", [])
    kernel = KernelUnderTest(_kernel(1.0, scale_half_dv=2.0), Backend("torch"))
    prop = all_properties()["gradients-match-reference"]
    verdict = property_runner.run_property(prop, kernel, profile="small-only", seed=0)
    assert verdict.status == FAILED and "float16" in verdict.counterexample, verdict.detail
    assert verdict.detail.endswith(
        "[BWD-17]; the same inputs in float32 are within its float32 bound: the error is made "
        "by its float16 arithmetic, which BWD-14 (SHOULD) keeps in float32 for dP, D, dS and "
        "the sums of dq, dk, dv, as the bound assumes [BWD-14]"
    ), verdict.detail
    examples: dict[int, list[Any]] = {}
    for dtype, example in _RowByRow.CALLS:
        examples.setdefault(id(example), []).append(dtype)
    assert examples.pop(id(None)) == [torch.float32], _RowByRow.CALLS  # the re-run
    failing = [dtypes for dtypes in examples.values() if torch.float16 in dtypes]
    assert len(failing) > 2, examples  # the first failing example, shrinking, the replay
    assert all(dtypes == [torch.float16] for dtypes in failing), examples
