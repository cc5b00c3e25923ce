"""The recurrence backward catalogue (tests/catalogue/recurrent_backward.py) through the
real check: the correct backward passes (torch.autograd of a token loop and of the chunked
form, a custom autograd.Function with a hand-written adjoint, an explicit backward function)
pass both gradient properties of ``attnspec check --recurrent gated_delta --backward``'s quick
profile, and each buggy backward (its forward right) fails
``recurrent-gradients-match-reference``, run by the suite's property runner (issue 37)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the catalogue's backward kernels are torch's")

import support  # noqa: E402

from attnspec.backends import Backend  # noqa: E402
from attnspec.conformance.api import check  # noqa: E402
from attnspec.conformance.judge.kernel import KernelUnderTest  # noqa: E402
from attnspec.conformance.judge.registry import all_properties  # noqa: E402
from attnspec.conformance.judge.verdict import FAILED, PASSED  # noqa: E402
from attnspec.conformance.report.render import format_table  # noqa: E402
from attnspec.conformance.run.property_runner import run_property  # noqa: E402
from catalogue import recurrent_backward as catalogue  # noqa: E402

GRADIENT_PROPERTIES = ("recurrent-gradients-match-reference", "recurrent-gradients-state-passing")


_one_torch_thread = pytest.fixture(autouse=True, scope="module")(support.one_torch_thread)


# what each correct kernel is checked on (a check costs ~8 s of torch token loops per
# property): the explicit backward function, which is the hand-written adjoint every bug is
# one step of, on the accuracy property, and that adjoint in its autograd.Function on state
# passing; torch.autograd of the two forward forms on the accuracy property
CHECKED = {
    "adjoint": GRADIENT_PROPERTIES[1:],
    "explicit": GRADIENT_PROPERTIES[:1],
    "autograd_token": GRADIENT_PROPERTIES[:1],
    "autograd_chunked": GRADIENT_PROPERTIES[:1],
}


@pytest.mark.parametrize("fn", catalogue.CORRECT, ids=lambda fn: fn.__name__)
def test_correct_backward_passes(fn: Any) -> None:
    """REC-7.1 … REC-7.4, REC-7.7: torch.autograd of the token loop and of the chunked
    form, the hand-written adjoint and the explicit backward function (REC-7's convention)
    pass the gradient properties of the quick profile, run by ``check``."""
    only = CHECKED[fn.__name__]
    report = check(fn, backend="torch", profile="quick", only=only)
    assert {v.property: v.status for v in report.verdicts} == dict.fromkeys(only, PASSED), [
        (v.property, v.detail) for v in report.verdicts
    ]


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.name)
def test_each_backward_bug_is_caught(bug: catalogue.GradientBug) -> None:
    """REC-7.1, REC-7.2, REC-7.7: every buggy backward (a gate gradient missing the
    correction's term or taken against the undecayed state, the past state's gradient
    dropped, the final state's upstream gradient ignored, dbeta's sign, a query group not
    summed, the last partial chunk dropped, dk without its read term) fails
    recurrent-gradients-match-reference in the quick profile."""
    kernel = KernelUnderTest(catalogue.BUGGY[bug.name], Backend("torch"))
    prop = all_properties()["recurrent-gradients-match-reference"]
    verdict = run_property(prop, kernel, profile="quick", shrink=False)
    assert verdict.status == FAILED, (bug.name, verdict.detail)


def test_a_buggy_recurrent_backward_fails_in_the_kernels_process() -> None:
    """REC-7.1, REC-7.7: ``attnspec check --backend torch`` of a declared recurrent kernel
    with ``backward`` runs its backward pass in the kernel's own process and fails the one
    whose dbeta has the wrong sign: the report does not conform (the command's exit status
    1) and its table names the property and the clause.  The check as the command plans
    it, its kernel in a process of its own started as the command's judging worker starts
    it (support.checked_with_the_kernel_in_its_own_process: a "vjp" request with the final
    state's upstream gradient and the gate's and beta's gradients wanted, answered there),
    judged in this process: the judging worker, a process importing PyTorch once more, is
    not the subject (the command's route through it is test_backward.py's
    test_check_command_runs_an_explicit_backward_function's; a failing check's exit status
    1 is the CLI tests')."""
    report = support.checked_with_the_kernel_in_its_own_process(
        "catalogue.recurrent_backward:adjoint_dbeta_sign",
        backend="torch",
        only=["recurrent-gradients-match-reference"],
    )
    table = format_table(report)
    assert not report.conforms, table
    assert "recurrent-gradients-match-reference" in table and "REC-7.7" in table
