"""Verdicts a kernel cannot forge (CONF-14, CONF-9, CONF-5, SDPA-1.6): the kernel runs in a
process of its own that only calls it; drawing, the reference, the bound and the verdict are
computed where it cannot reach.  Each kernel of ``catalogue/forgers.py`` returns a wrong answer and
reaches into the process it runs in to make the check pass anyway; each must be judged
FAILED, by the command a user runs.  With attnspec 2026.12's design (the property run in
the kernel's process) ``patches_the_runner`` and ``forges_its_messages`` exited 0 with
every property passed (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from catalogue import forgers
from catalogue.forgers import FORGERS, Forger
from forgery_guard import undo_forgery_in_this_process
from support import SMALL_SIZE_FLAGS, run_main

from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.run import property_runner

FORGERS_FILE = str(Path(forgers.__file__).resolve())


@pytest.mark.parametrize("case", FORGERS, ids=lambda case: case.name)
def test_a_forging_kernel_is_judged_failed(
    case: Forger, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CONF-14: ``attnspec check forgers.py:NAME`` exits 1 and every property it was checked
    on FAILED, whatever the kernel did to its own process.  The command runs in this
    process (at small sizes: what a forger does to its process, it does at any size); the
    kernel, as always, in a process of its own, which is the boundary checked here."""
    report_file = tmp_path / "report.json"
    status, out, err = run_main(
        capsys,
        *("check", f"{FORGERS_FILE}:{case.name}", "--backend", "numpy"),
        *("--only", ",".join(case.only), "--json", str(report_file), *SMALL_SIZE_FLAGS),
    )
    assert status == 1, out + err[-2000:]
    report = json.loads(report_file.read_text())
    statuses = {v["property"]: v["status"] for v in report["verdicts"]}
    assert statuses == dict.fromkeys(case.only, "failed"), statuses
    for verdict in report["verdicts"]:
        assert case.finding in verdict["detail"], verdict["detail"]


def test_the_kernels_process_is_not_the_judges(tmp_path: Path) -> None:
    """CONF-14: what a kernel does to its own process does not reach the judge: the kernel
    that replaces the property runner leaves the judging worker's runner as it was (the
    verdict is computed there), and it replaced the one in its own process, which proves
    the attack ran.  Its answer says how long the call took there (the report's kernel
    share, issue 33): more than nothing, less than the round trip."""
    import time

    import numpy as np

    from attnspec.backends import Backend
    from attnspec.conformance.run import property_runner
    from attnspec.conformance.run.kernel_setup import KernelSetup
    from attnspec.conformance.run.remote_kernel import KernelProcess, RemoteFunction
    from attnspec.conformance.run.supervisor import _dumps

    setup = KernelSetup(f"{FORGERS_FILE}:patches_the_runner", backend="numpy")
    process = KernelProcess(_dumps((setup, 0.0)), 0.0, timeout=120, load_timeout=120)
    runner_here = property_runner.run_property
    try:
        process.start()
        backend = Backend("numpy")
        kernel = RemoteFunction(process, backend)
        q = backend.asarray(np.ones((1, 2, 4)), "float32")
        started = time.perf_counter()
        out = backend.to_numpy(kernel(q, q, q))
        assert 0 < kernel.kernel_seconds < time.perf_counter() - started
        assert np.array_equal(out, np.zeros((1, 2, 4)))  # the kernel's (wrong) answer
        assert property_runner.run_property is runner_here
    finally:
        process.end()


def test_a_forger_run_in_the_test_process_is_undone_and_named() -> None:
    """CONF-9, for this suite's own runs: a forging kernel called in the test process (as an
    in-process check would call it) leaves the runner as it found it once the guard that
    tests/conftest.py runs after every test has run, and the guard names what was replaced;
    otherwise every later in-process check of an xdist worker would pass, whatever its
    kernel."""
    genuine = property_runner.run_property
    checks = {prop.id: prop.check for prop in all_properties().values()}
    one = np.ones((1, 1, 1), np.float32)
    forgers.patches_the_runner(one, one, one)
    assert property_runner.run_property is not genuine  # the forger did reach the runner

    forged = undo_forgery_in_this_process()

    assert forged[0].startswith("property_runner.run_property was <function _forge_the_runner")
    assert {line.split()[3] for line in forged[1:]} == set(checks)
    assert property_runner.run_property is genuine
    assert {prop.id: prop.check for prop in all_properties().values()} == checks
    assert undo_forgery_in_this_process() == []
