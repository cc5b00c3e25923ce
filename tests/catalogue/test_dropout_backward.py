"""BWD-9 (``gradients-dropout``): the backward pass of a dropout call uses the keep
indicators that call drew.  The correct ways of handing them over (torch.autograd's graph,
a Function that saves the seed and regenerates them, an explicit backward function given
the seed) pass; a backward that draws a mask of its own, ignores it or forgets its
rescaling fails, each on the quick profile (tests/catalogue/dropout_backward.py)."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the catalogue's dropout backward kernels are torch's")

from attnspec.backends import Backend  # noqa: E402
from attnspec.conformance.call.wire import receive_message, send_message  # noqa: E402
from attnspec.conformance.claims.declaration import KernelDeclaration  # noqa: E402
from attnspec.conformance.judge.kernel import KernelUnderTest  # noqa: E402
from attnspec.conformance.judge.registry import all_properties  # noqa: E402
from attnspec.conformance.judge.verdict import FAILED, NOT_APPLICABLE, PASSED  # noqa: E402
from attnspec.conformance.run.kernel_process import KernelServer  # noqa: E402
from attnspec.conformance.run.property_runner import run_property  # noqa: E402
from attnspec.conformance.run.remote_kernel import RemoteFunction  # noqa: E402
from catalogue.dropout_backward import (  # noqa: E402
    BUGGY_DROPOUT,
    CORRECT_DROPOUT_KERNELS,
    DROPOUT_BUGS,
)

PROPERTY = "gradients-dropout"


def _verdict(kernel: Any) -> Any:
    prop = all_properties()[PROPERTY]
    return run_property(prop, KernelUnderTest(kernel, Backend("torch")), shrink=False)


@pytest.mark.parametrize("name", sorted(CORRECT_DROPOUT_KERNELS))
def test_correct_dropout_backward_passes(name: str) -> None:
    """BWD-9: the graph's mask, the seed saved and regenerated, and an explicit backward
    function given the seed all use the forward's indicators."""
    verdict = _verdict(CORRECT_DROPOUT_KERNELS[name])
    assert verdict.status == PASSED, verdict.detail


@pytest.mark.parametrize("bug", DROPOUT_BUGS, ids=lambda bug: bug.name)
def test_each_dropout_bug_is_caught(bug: Any) -> None:
    """BWD-9: a backward with a mask of its own, without the mask, or without its
    rescaling is outside BWD-17's bound of the gradients with the forward's indicators."""
    verdict = _verdict(BUGGY_DROPOUT[bug.name])
    assert verdict.status == FAILED, (bug.name, bug.upstream, verdict.detail)
    assert "BWD-9" in verdict.detail


class _ServedInAThread:
    """A KernelProcess stand-in: the kernel process's server (``KernelServer``) answering
    in a thread of this process, over a pipe, the same messages as in its own process."""

    timeout = 120.0

    def __init__(self, kernel: KernelUnderTest) -> None:
        self.extras: dict[str, Any] = {}
        self.connection, served = multiprocessing.Pipe()
        threading.Thread(target=KernelServer(served, kernel).serve, daemon=True).start()

    def request(self, message: tuple[Any, ...], timeout: float) -> Any:
        send_message(self.connection, message)
        return receive_message(self.connection, from_kernel=True)


def test_the_forward_output_crosses_the_kernels_wire() -> None:
    """BWD-9: through the kernel process's messages (a "vjp" request asking for the output
    too), the judge gets the output of the call differentiated, whose indicators the
    gradients are judged with: the correct kernel passes, the fresh-mask one fails."""
    for kernel, status in (
        (CORRECT_DROPOUT_KERNELS["flash2"], PASSED),
        (BUGGY_DROPOUT["fresh-mask"], FAILED),
    ):
        backend = Backend("torch")
        served = _ServedInAThread(KernelUnderTest(kernel, backend))
        remote = RemoteFunction(served, backend)  # type: ignore[arg-type]
        judged = KernelUnderTest(remote, backend, kernel.__attnspec__)
        verdict = run_property(all_properties()[PROPERTY], judged, shrink=False)
        assert verdict.status == status, verdict.detail
        send_message(served.connection, None)  # the server's stop


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"backward": True, "dropout": True}, "backward_dropout"),
        (
            {
                "backward_dropout": True,
                "backward": True,
                "dropout": True,
                "dropout_seeded": False,
                "backward_fn": "catalogue.dropout_backward:flash_dropout_backward",
            },
            "seed",
        ),
    ],
)
def test_dropout_backward_is_declared(claims: dict[str, Any], reason: str) -> None:
    """BWD-9 applies to a kernel that declares backward_dropout; an explicit backward
    function needs the seed keyword to regenerate the indicators."""
    applies = all_properties()[PROPERTY].applies(KernelDeclaration(**claims))
    assert applies is not None and reason in applies


def test_without_the_declaration_it_does_not_apply() -> None:
    """CONF-3: a backward kernel that declares no dropout gets "not applicable"."""
    from catalogue.backward_kernels import flash2

    assert _verdict(flash2).status == NOT_APPLICABLE


def test_pytorch_math_sdpa_with_dropout_passes() -> None:
    """BWD-9 on a real kernel: PyTorch's math SDPA with dropout_p, its mask drawn from
    torch's global generator (no seed: --no-dropout-seeded) and kept by torch.autograd,
    uses the forward's indicators in its backward."""
    import dataclasses

    from attnspec.conformance import declare
    from attnspec.conformance.kernels.torch_sdpa import sdpa_math

    declared = sdpa_math.__attnspec__  # type: ignore[attr-defined]
    claims = {f.name: getattr(declared, f.name) for f in dataclasses.fields(declared)}
    claims.update(dropout=True, dropout_seeded=False, backward=True, backward_dropout=True)

    def sdpa_math_with_dropout(*args: Any, **kwargs: Any) -> Any:
        return sdpa_math(*args, **kwargs)

    verdict = _verdict(declare(sdpa_math_with_dropout, **claims))
    assert verdict.status == PASSED, verdict.detail
