"""``attnspec demo``: torch and the reference checked, a written-up failure confirmed.

One demo run, on the properties every test here needs, is shared by the module (each test
ran its own demo, ~4 CPU-s each: a judging worker and a kernel process for each of the
two kernels, PyTorch imported in those of the first).  PyTorch's SDPA is checked in this
process (``check --no-isolate``'s path; its report is the same but the worker-threads note
and the seconds), the reference in its worker and kernel process as always: the two
processes importing PyTorch were ~4 of the run's ~5 CPU-s, and the demo's own lines (the
tables, the confirmed divergences, the exit status) are what these tests read."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from typing import Any

import pytest

from attnspec.conformance import cli
from attnspec.conformance.plan import Execution
from attnspec.conformance.run.kernel_setup import KernelSetup

# default-scale: both kernels pass it; nan-propagates: PyTorch's confirmed SDPA-8.3
# divergence; the two batch-broadcast properties: its SDPA-1.2 one, met twice
DEMO_ONLY = "default-scale,nan-propagates,batch-broadcast-corners,batch-broadcast"


@pytest.fixture(scope="module")
def demo() -> tuple[int, str]:
    """``attnspec demo --only DEMO_ONLY`` in this process: its exit status and stdout;
    the PyTorch kernel judged in this process, the reference in a worker of its own."""
    pytest.importorskip("torch", reason="the demo's first kernel is PyTorch's SDPA")
    run_one = cli._run_one

    def torch_in_this_process(
        setup: KernelSetup, args: argparse.Namespace, *rest: Any, **options: Any
    ) -> Execution:
        if setup.backend == "torch":
            args = argparse.Namespace(**{**vars(args), "no_isolate": True})
        return run_one(setup, args, *rest, **options)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(cli, "_run_one", torch_in_this_process)
        status = cli.main(["demo", "--only", DEMO_ONLY])
    return status, out.getvalue()


def _torch_part(out: str) -> str:
    """The demo's report of PyTorch's SDPA (before the reference's)."""
    return out.split("conformance of attnspec.reference")[0]


def test_demo_checks_torch_and_the_reference(demo: tuple[int, str]) -> None:
    """``attnspec demo``: PyTorch's SDPA and the reference, both tables, exit 0 (CONF-1);
    the reference conforms, and PyTorch passes what it satisfies (SDPA-2.1)."""
    status, out = demo
    assert status == 0
    assert "conformance of torch.nn.functional:scaled_dot_product_attention on torch" in out
    assert "conformance of attnspec.reference:scaled_dot_product_attention" in out
    reference_part = out.split("conformance of attnspec.reference")[1]
    assert "result: conforms: 0 failed" in reference_part, reference_part
    assert "note: worker threads: " in reference_part  # judged in a worker of its own
    assert "result: conforms" not in _torch_part(out)  # its divergences below
    assert re.search(r"^default-scale +SDPA-2\.1 +MUST +passed ", _torch_part(out), re.M)


def test_demo_calls_a_written_up_failure_confirmed(demo: tuple[int, str]) -> None:
    """SDPA-8.3: PyTorch's SDPA turns a NaN query into 0 (docs/divergences.md#torch-nan-query);
    the demo names that failure as the confirmed divergence and exits 0 (CONF-1)."""
    status, out = demo
    assert "confirmed divergence, not a suite artefact: nan-propagates [SDPA-8.3]" in out, out
    assert "divergences.md#torch-nan-query" in out
    assert status == 0


def test_demo_joins_the_failures_one_write_up_explains(demo: tuple[int, str]) -> None:
    """SDPA-1.2 (issue 38): PyTorch's SDPA keeps q's batch shape for empty queries
    (docs/divergences.md#torch-empty-broadcast), met by batch-broadcast and its fixed corner
    shapes; the demo's report shows that root cause once, with its write-up."""
    status, out = demo
    torch_part = _torch_part(out)
    assert "batch-broadcast-corners, batch-broadcast [SDPA-1.2] -> " in torch_part
    # one root cause for the two batch-broadcast failures, one for nan-propagates
    assert "(2 distinct divergences):" in torch_part, torch_part
    assert torch_part.count("[SDPA-1.2] -> ") == 1, torch_part
    assert status == 0
