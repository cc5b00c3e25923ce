"""The recurrence backward catalogue (tests/catalogue/recurrent_backward.py) through the
real check: the correct backward passes (torch.autograd of a token loop and of the chunked
form, a custom autograd.Function with a hand-written adjoint, an explicit backward function)
pass both gradient properties of ``attnspec check --recurrent gated_delta --backward``'s quick
profile, and each buggy backward (its forward right) fails
``recurrent-gradients-match-reference``, run by the suite's property runner (issue 37)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the catalogue's backward kernels are torch's")

import support  # noqa: E402

from attnspec.backends import Backend  # noqa: E402
from attnspec.conformance.api import check  # noqa: E402
from attnspec.conformance.judge.kernel import KernelUnderTest  # noqa: E402
from attnspec.conformance.judge.registry import all_properties  # noqa: E402
from attnspec.conformance.judge.verdict import FAILED, PASSED  # noqa: E402
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


def test_check_command_fails_a_buggy_recurrent_backward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """REC-7.1, REC-7.7: ``attnspec check --backend torch`` of a declared recurrent kernel
    with ``backward`` runs its backward pass in the kernel's own process and fails the one
    whose dbeta has the wrong sign, naming the property and the clause.  (The command runs
    in this process: the kernel's own process is the check's, started as the CLI starts it,
    with this process's sys.path, which holds tests/.)"""
    monkeypatch.chdir(tmp_path)
    status, out, err = support.run_main(
        capsys,
        "check",
        "catalogue.recurrent_backward:adjoint_dbeta_sign",
        "--backend",
        "torch",
        "--only",
        "recurrent-gradients-match-reference",
    )
    assert status == 1, out + err
    assert "recurrent-gradients-match-reference" in out and "REC-7.7" in out
