"""The kernel runs in a supervised worker process (CONF-5, CONF-9: the checker survives it).

Every hostile kernel of ``catalogue.hostile`` is checked through the ``attnspec check``
command (run in this process; the kernel in a process of its own, as always), and gets its
expected verdicts and exit status: a crash, a signal, any exit (0 included), a hang or a
50 GB allocation fails the property that was running, names what happened and the inputs
of the call, and the check goes on.  Exits, crashes and hangs while importing the kernel's
module are a one-line setup error.  The soak runs the whole suite twice (20 with ``pytest
-m soak``, whose buggy kernel's failures shrink longer) on the same kernels and finds no
verdict that changes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from catalogue import hostile
from catalogue.hostile import HOSTILE, Hostile
from support import (
    SMALL_LIMITS,
    SMALL_SIZE_FLAGS,
    SMALL_SIZES,
    kernel_file,
    processes_in,
    run_main,
    verdict_of,
)

from attnspec.backends import Backend
from attnspec.conformance import SetupError, check, cli
from attnspec.conformance.api import KernelSetup
from attnspec.conformance.claims.loading import load_kernel
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED, Report
from attnspec.conformance.run import property_runner as runner
from attnspec.conformance.run.property_runner import new_report, run_each
from attnspec.conformance.run.supervisor import IsolatedKernel, IsolationOptions, _LastCall

HOSTILE_FILE = str(Path(hostile.__file__).resolve())
HANG_TIMEOUT = "1"  # s: the hang tests wait this long, once per property (every call hangs)


def _on_numpy(target: str, *only: str, **options: Any) -> Report:
    """``check`` of ``target`` on NumPy, for the properties ``only``."""
    return check(target, backend="numpy", only=list(only), **options)


def _told_as_failed(prop: str, table: str) -> bool:
    """The text report tells ``prop``'s failure: on its own ("FAILED prop [...]") or in a
    group of properties with one root cause ("FAILED 2 properties, one cause ...")."""
    if f"FAILED {prop} [" in table:
        return True
    return any(
        re.search(rf"^  .*\b{re.escape(prop)} \[", group, re.MULTILINE)
        for group in re.findall(
            r"^FAILED \d+ properties, one cause.*\n(?:  .*\n)+", table, re.MULTILINE
        )
    )


@pytest.mark.parametrize("case", HOSTILE, ids=lambda case: case.name)
def test_hostile_kernel_gets_its_verdict_from_the_cli(
    case: Hostile,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONF-5, SDPA-1.3: ``attnspec check hostile.py:NAME --backend numpy --json`` gives
    each property its expected verdict and the expected exit status (0, 1 or 2, never a
    signal's or the kernel's own), keeps the kernel's printing off the table's stdout, and
    a crash or hang names the inputs of the call and carries a reproduction.  The command
    runs in this process, started in ``tmp_path`` (its file descriptors 1 and 2 captured,
    which the workers inherit); the kernel, as always, in a process of its own, which is
    what it crashes, ends or fills (a kernel that reached the command's process would end
    this test run)."""
    if case.name == "allocates_50_gb" and not Path("/proc/self/status").exists():
        pytest.skip(
            "the worker's memory limit is measured from /proc/self/status (Linux); "
            "without it this kernel would really touch 50 GB"
        )
    timeout = ["--timeout", HANG_TIMEOUT] if case.name == "hangs" else []
    monkeypatch.chdir(tmp_path)
    status = cli.main(
        [
            *("check", f"{HOSTILE_FILE}:{case.name}", "--backend", "numpy"),
            *("--only", ",".join(case.only), "--json", "report.json"),
            *timeout,
            *SMALL_SIZE_FLAGS,
        ]
    )
    out, err = capfd.readouterr()
    assert status == case.exit, out + err[-2000:]
    assert "Traceback" not in err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"] is True
    statuses = {v["property"]: v["status"] for v in report["verdicts"]}
    assert statuses == {prop: case.expected(prop) for prop in case.only}
    for verdict in report["verdicts"]:
        if verdict["status"] == FAILED:
            assert case.finding in verdict["detail"], verdict["detail"]
            assert _told_as_failed(verdict["property"], out), out
            if case.isolated_only:  # lost with the worker: inputs and reproduction kept
                assert verdict["counterexample"].startswith("q("), verdict
                assert (
                    f"kernel_function({HOSTILE_FILE + ':' + case.name!r})"
                    in (verdict["reproduction"])
                )
    assert "xxxxxxxx" not in out  # prints_a_megabyte's output is not in the table
    if case.name == "prints_a_megabyte":  # but on stderr, whole: 1 MiB per call
        assert err.count("x" * (2**20 - 1)) >= 20  # >= one call per example
    assert [pid for pid in processes_in(tmp_path) if pid != os.getpid()] == []


@pytest.mark.parametrize(
    "case", [c for c in HOSTILE if not c.isolated_only], ids=lambda case: case.name
)
def test_hostile_kernel_in_process_gets_the_same_verdict(case: Hostile) -> None:
    """CONF-5: in-process (the Python API's default, --no-isolate) the same verdicts:
    sys.exit in a kernel is a failure, not the end of the run, and NumPy's error state a
    kernel leaves behind does not make the suite's own arithmetic fail."""
    with np.errstate():
        report = check(
            f"{HOSTILE_FILE}:{case.name}", backend="numpy", only=case.only, **SMALL_SIZES
        )
        after = np.geterr()
    assert {v.property: v.status for v in report.verdicts} == {
        prop: case.expected(prop) for prop in case.only
    }
    for verdict in report.verdicts:
        if verdict.status == FAILED:
            assert case.finding in verdict.detail
    assert after == np.geterr()  # restored after every call, not only at the end


def test_a_kernel_that_leaves_seterr_raise_would_cause_false_failures_unguarded() -> None:
    """Why calls are guarded: run bare, the seterr kernel's leftover state makes its next
    call and the suite's own NumPy code raise, failing properties it satisfies.  (Whether
    they fail is the point, not their smallest inputs: not shrunk, ~300 calls fewer.)"""
    kernel = KernelUnderTest(load_kernel(f"{HOSTILE_FILE}:leaves_seterr_raise"), Backend("numpy"))
    with np.errstate():
        statuses = [
            verdict_of(p, kernel, limits=SMALL_LIMITS, shrink=False).status
            for p in ("default-scale", "large-logits", "matches-reference")
        ]
    assert statuses[0] == PASSED and FAILED in statuses[1:]


def test_keyboard_interrupt_in_process_is_an_interrupt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In-process a KeyboardInterrupt cannot be told from Ctrl-C: the check stops,
    incomplete, exit 2 (in a worker the same kernel gets a FAILED verdict)."""
    status = cli.main(
        [
            "check",
            f"{HOSTILE_FILE}:raises_keyboard_interrupt",
            "--backend",
            "numpy",
            "--only",
            "default-scale",
            "--no-isolate",
        ]
    )
    captured = capsys.readouterr()
    assert status == 2
    assert "INCOMPLETE (interrupted by SIGINT (Ctrl-C) after 0 of 1 properties)" in captured.out


@pytest.mark.parametrize(
    "hazard, words",
    [
        ("sys.exit", "called sys.exit(0)"),
        ("os._exit", "ended with exit status 0"),
        ("segfault", "SIGSEGV"),
    ],
)
def test_exit_or_crash_at_import_is_a_setup_error(
    hazard: str,
    words: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module that exits or crashes while being imported: exit 2 and one line, never
    exit 0 with no table (nothing was checked).  The command in this process: the module
    is imported in the kernel's process (its exit or crash ends that one), which is what
    is checked, not the command's process."""
    monkeypatch.setenv(hostile.AT_IMPORT, hazard)
    report_file = tmp_path / "report.json"
    argv = ["check", f"{HOSTILE_FILE}:attention", "--backend", "numpy", "--json", str(report_file)]
    status, out, err = run_main(capsys, *argv)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnspec: error: loading kernel "), lines
    assert words in lines[0] and "nothing was checked" in lines[0]
    assert out == "" and not report_file.exists()


def test_sys_exit_at_import_in_process_is_a_setup_error(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--no-isolate too: sys.exit(0) at import is exit 2, not a silent exit 0."""
    monkeypatch.setenv(hostile.AT_IMPORT, "sys.exit")
    status = cli.main(["check", f"{HOSTILE_FILE}:attention", "--no-isolate"])
    assert status == 2
    assert "called sys.exit(0) (at import?)" in capsys.readouterr().err


def test_hang_at_import_is_a_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading that does not finish within the load timeout is a SetupError."""
    monkeypatch.setenv(hostile.AT_IMPORT, "hang")
    setup = KernelSetup(f"{HOSTILE_FILE}:attention", "numpy")
    with (
        # the module never finishes importing: any load timeout ends it, the shortest soonest
        pytest.raises(SetupError, match=r"did not finish within 1 s"),
        IsolatedKernel(setup, IsolationOptions(timeout=1, load_timeout=1)) as isolated,
    ):
        isolated.start()


def test_a_stalled_worker_is_named_as_the_judge_not_the_kernel() -> None:
    """CONF-5: the worker ends a kernel call that outlasts --timeout itself (the kernel runs
    in its own process), so a worker that stops answering is the judge stalling: each
    wording says so, with the supervisor's own limit, and never that the kernel did not
    return."""
    isolated = IsolatedKernel(
        KernelSetup(f"{HOSTILE_FILE}:attention", "numpy"),
        IsolationOptions(timeout=2, load_timeout=3),
    )
    for call in (
        _LastCall("q(1, 1, 1, 1)", in_progress=True),
        _LastCall("q(1, 1, 1, 1)"),
        _LastCall(),
    ):
        finding = isolated._hang_finding(call)
        assert finding.startswith("the judging worker sent nothing for 35 s"), finding
        assert "the kernel did not return" not in finding
        assert finding.endswith("the check stopped the worker and went on [CONF-5]")


SOMETIMES = """
import os, time
from attnspec.reference import scaled_dot_product_attention

calls = [0]


def hangs_on_fifth_call(q, k, v, *, mask=None, is_causal=False, scale=None):
    calls[0] += 1
    with open(os.environ["SHAPES_FILE"], "a") as handle:  # the inputs of every call
        handle.write(f"q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}\\n")
    if calls[0] == 5:
        while True:
            time.sleep(1)
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def crashes_on_explicit_scale(q, k, v, *, mask=None, is_causal=False, scale=None):
    if scale is not None:
        os.kill(os.getpid(), 11)
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def slow_first_calls(q, k, v, *, mask=None, is_causal=False, scale=None):
    calls[0] += 1
    if calls[0] <= 4:
        time.sleep(0.5)
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def reports_pid(q, k, v, *, mask=None, is_causal=False, scale=None):
    with open(os.environ["PID_FILE"], "w") as handle:
        handle.write(str(os.getpid()))
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def allocates(q, k, v, *, mask=None, is_causal=False, scale=None):
    import numpy as np
    np.empty(2**30, dtype=np.uint8)  # 1 GiB of address space, never touched
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
"""


@pytest.fixture
def sometimes(tmp_path: Path) -> str:
    return str(kernel_file(tmp_path, "sometimes.py", SOMETIMES))


def test_hang_is_attributed_to_the_example_that_hung(
    sometimes: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    python_c: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """CONF-5: a kernel that hangs on its fifth call, after four calls of earlier examples
    returned: the verdict names the inputs of the call that hung (as the kernel itself
    recorded them), and its reproduction, run elsewhere, calls the kernel on exactly those
    inputs (in a fresh process that call is the first, and returns)."""
    shapes_file = tmp_path / "shapes"
    monkeypatch.setenv("SHAPES_FILE", str(shapes_file))
    report = _on_numpy(
        f"{sometimes}:hangs_on_fifth_call",
        "matches-reference",
        isolate=IsolationOptions(timeout=1),  # s: what the hang costs; small calls take ms
        **SMALL_SIZES,
    )
    (verdict,) = report.verdicts
    assert verdict.status == FAILED
    assert verdict.detail.startswith("the kernel did not return within 1 s (--timeout")
    calls = shapes_file.read_text().splitlines()
    assert len(calls) == 5
    assert verdict.counterexample.startswith(calls[4] + ","), (calls, verdict.counterexample)
    assert "out = fn(q, k, v" in verdict.reproduction  # the kernel called directly
    rerun_file = tmp_path / "rerun_shapes"
    ran = python_c(verdict.reproduction, env={"SHAPES_FILE": str(rerun_file)}, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert rerun_file.read_text().splitlines()[0] == calls[4]


def test_crash_fails_one_property_and_the_next_runs_in_a_new_worker(sometimes: str) -> None:
    """A segfault on explicit-scale's inputs fails that property; default-scale, run after
    it, gets a fresh worker and passes."""
    report = _on_numpy(
        f"{sometimes}:crashes_on_explicit_scale", "explicit-scale", "default-scale", isolate=True
    )
    assert [(v.property, v.status) for v in report.verdicts] == [
        ("explicit-scale", FAILED),
        ("default-scale", PASSED),
    ]
    assert "SIGSEGV" in report.verdicts[0].detail
    assert "scale=" in report.verdicts[0].counterexample


def test_timeout_is_per_call_not_per_property(sometimes: str) -> None:
    """Four calls of 0.5 s each under a 1.5 s timeout: the property takes longer than the
    timeout in all, yet no call does, so it passes."""
    report = _on_numpy(
        f"{sometimes}:slow_first_calls", "default-scale", isolate=IsolationOptions(timeout=1.5)
    )
    (verdict,) = report.verdicts
    assert verdict.status == PASSED, verdict.detail
    assert verdict.seconds > 1.5


def test_the_kernel_runs_in_another_process_unless_no_isolate(
    sometimes: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """attnspec check runs the kernel in a worker; --no-isolate in the check's own process
    (where a debugger can reach it)."""
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    argv = ["check", f"{sometimes}:reports_pid", "--backend", "numpy", "--only", "default-scale"]
    assert cli.main(argv) == 0
    assert int(pid_file.read_text()) != os.getpid()
    assert cli.main([*argv, "--no-isolate"]) == 0
    assert int(pid_file.read_text()) == os.getpid()
    capsys.readouterr()


def test_memory_limit_is_an_option(sometimes: str) -> None:
    """--memory-limit: 1 GiB of address space is refused under a 0.5 GiB limit (a
    MemoryError verdict that names the option) and allowed under the default."""
    target = f"{sometimes}:allocates"
    limited = _on_numpy(target, "default-scale", isolate=IsolationOptions(memory_limit_gib=0.5))
    assert limited.verdicts[0].status == FAILED
    assert "MemoryError" in limited.verdicts[0].detail
    assert "--memory-limit" in limited.verdicts[0].detail
    default = _on_numpy(target, "default-scale", isolate=True)
    assert default.verdicts[0].status == PASSED


# bad --timeout / --memory-limit values on the command line: test_worker_pool.py's
# test_bad_worker_options_are_one_line_and_exit_2, with the other workers' options
def test_isolation_options_reject_bad_values() -> None:
    """The Python API's IsolationOptions name the argument and what it should be."""
    with pytest.raises(ValueError, match=r"timeout=-1, but should be a positive number"):
        IsolationOptions(timeout=-1)
    with pytest.raises(ValueError, match=r"load_timeout=nan, but should be a positive"):
        IsolationOptions(load_timeout=float("nan"))
    with pytest.raises(ValueError, match=r"memory_limit_gib='8', but should be a number"):
        IsolationOptions(memory_limit_gib="8")  # type: ignore[arg-type]


def test_a_callable_the_worker_cannot_import_is_a_setup_error() -> None:
    """A kernel defined inside a function cannot be rebuilt in a worker: a SetupError that
    says what to do (a MODULE:FUNC target, or run in-process)."""

    def local_kernel(q, k, v, *, mask=None, is_causal=False, scale=None):  # type: ignore[no-untyped-def]
        return q

    with pytest.raises(SetupError, match=r"cannot be sent to a worker process.*--no-isolate"):
        check(local_kernel, backend="numpy", only=["default-scale"], isolate=True)


# --- what the worker carries: hints, waivers, JAX settings ------------------------------

WORKER_KERNELS = '''
import ctypes, os
import numpy as np
from attnspec.reference import scaled_dot_product_attention as sdpa


def _record_pid():
    with open(os.environ["PID_FILE"], "a") as handle:
        handle.write(f"{os.getpid()}\\n")


def blhd(q, k, v, *, mask=None, is_causal=False, scale=None):
    """A (B, L, H, D) kernel checked as if it took the spec's layout."""
    _record_pid()
    swap = lambda a: np.swapaxes(a, -2, -3)
    return swap(sdpa(swap(q), swap(k), swap(v), mask=mask, is_causal=is_causal, scale=scale))


def unscaled_crashes_on_random_queries(q, k, v, *, mask=None, is_causal=False, scale=None):
    """No default scale; crashes on a query with no zero (the hint's random probe, never
    the one-hot queries of default-scale)."""
    _record_pid()
    if np.all(q != 0):
        ctypes.string_at(0)
    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=1.0 if scale is None else scale)


def with_weights(q, k, v, *, mask=None, is_causal=False, scale=None):
    out = sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    return out, out


def mean_of_v_when_empty(q, k, v, *, mask=None, is_causal=False, scale=None):
    """JAX's convention for a fully masked row: the mean of V, not 0 (SDPA-5.1 waived)."""
    out = sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    if mask is None:
        return out
    empty = ~np.asarray(mask).any(axis=-1, keepdims=True)
    return np.where(empty, np.mean(v, axis=-2, keepdims=True), out)
'''


@pytest.fixture
def worker_kernels(tmp_path: Path) -> str:
    return str(kernel_file(tmp_path, "worker_kernels.py", WORKER_KERNELS))


def test_hint_probes_run_in_the_worker(
    worker_kernels: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SDPA-1.1, CONF-5: isolated, the layout hint still comes (its probe found that the
    kernel is right in (B, L, H, D)), and every call of the kernel, the probe's included,
    was made in a worker process, never in the check's own."""
    pid_file = tmp_path / "pids"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    report = _on_numpy(
        f"{worker_kernels}:blhd", "matches-reference", dtypes=["float64"], isolate=True
    )
    assert report.verdicts[0].status == FAILED
    assert any("pass --layout blhd" in hint for hint in report.hints), report.hints
    pids = {int(line) for line in pid_file.read_text().split()}
    assert pids and os.getpid() not in pids


def test_a_kernel_that_crashes_on_the_hint_probe_does_not_take_the_check_down(
    worker_kernels: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-5: the hints probe a failing kernel once more; isolated, a crash there costs
    the hint, not the check: the verdicts stand and the report is whole.  The first crash
    ends the probing: no process is started again for the probes left (each crashed a
    new one, ~15 processes and 20 s at load)."""
    pid_file = tmp_path / "pids"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    report = _on_numpy(
        f"{worker_kernels}:unscaled_crashes_on_random_queries",
        "default-scale",
        dtypes=["float64"],
        isolate=True,
    )
    (verdict,) = report.verdicts
    assert verdict.status == FAILED and "looks like 1 (no scale)" in verdict.detail
    assert report.hints == []
    assert report.claim.startswith("no conformance claim: 1 MUST property failed")
    assert len(set(pid_file.read_text().split())) == 1  # the property's, which the probe crashed


def test_hints_and_waivers_travel_from_the_worker(worker_kernels: str) -> None:
    """SDPA-1.3, CONF-7: a verdict's hint (an undeclared tuple return: --returns-weights)
    and a waived clause (SDPA-5.1 with empty_rows_zero=False) come back from the worker
    as they are in-process, and the claim names the waiver."""
    returned = _on_numpy(
        f"{worker_kernels}:with_weights", "output-shape-dtype", dtypes=["float64"], isolate=True
    )
    assert "--returns-weights" in returned.verdicts[0].hint
    waived = _on_numpy(
        f"{worker_kernels}:mean_of_v_when_empty",
        "empty-rows-zero",
        "default-scale",
        dtypes=["float64"],
        isolate=True,
        empty_rows_zero=False,
    )
    assert [v.status for v in waived.verdicts] == [runner.WAIVED, PASSED]
    assert waived.waived == ["SDPA-5.1"]
    assert waived.claim == "no conformance claim: only some properties ran (--only/--skip)"
    in_process = _on_numpy(
        f"{worker_kernels}:mean_of_v_when_empty",
        "empty-rows-zero",
        "default-scale",
        dtypes=["float64"],
        empty_rows_zero=False,
    )
    assert [(v.status, v.detail) for v in waived.verdicts] == [
        (v.status, v.detail) for v in in_process.verdicts
    ]


# examples per property: each new shape costs JAX a compilation, and one float64 example
# passed in the worker is what shows its setting (2 cost ~0.9 CPU-s more in the two tests)
JAX_EXAMPLES = 1


def test_the_worker_checks_in_the_jax_settings_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--jax-x64 reaches the worker: its backend has float64 and the report says what was
    changed; without it, a float64-only check on JAX is a setup error that says why."""
    pytest.importorskip("jax", reason="the JAX backend needs jax installed")
    monkeypatch.setitem(runner.PROFILES, "quick", runner.Profile(JAX_EXAMPLES))
    target = "attnspec.reference:scaled_dot_product_attention"
    report = check(
        target,
        backend="jax",
        dtypes=["float64"],
        only=["default-scale"],
        jax_x64=True,
        isolate=True,
    )
    assert report.verdicts[0].status == PASSED, report.verdicts[0].detail
    assert any("changed jax_enable_x64: False -> True" in note for note in report.notes), (
        report.notes
    )
    assert report.claim.startswith("no conformance claim: only some properties ran")
    with pytest.raises(SetupError, match=r"no dtype to test.*jax_enable_x64 is off"):
        check(target, backend="jax", dtypes=["float64"], only=["default-scale"], isolate=True)


def test_a_loaded_jax_backend_passes_its_x64_setting_to_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Backend object cannot travel to the worker; JAX's process-wide x64 setting, on
    here, goes with its name, so the worker checks float64 as this process would."""
    jax = pytest.importorskip("jax", reason="the JAX backend needs jax installed")
    monkeypatch.setitem(runner.PROFILES, "quick", runner.Profile(JAX_EXAMPLES))
    before = jax.config.jax_enable_x64
    try:
        backend = Backend("jax", config={"jax_enable_x64": True})
        report = check(
            "attnspec.reference:scaled_dot_product_attention",
            backend=backend,
            dtypes=["float64"],
            only=["default-scale"],
            isolate=True,
        )
    finally:
        jax.config.update("jax_enable_x64", before)
    assert report.verdicts[0].status == PASSED, report.verdicts[0].detail


# --- soak ------------------------------------------------------------------------------

SOAK_RUNS = 20  # the full soak: `pytest -m soak` (deselected by default, pyproject.toml)
# The default suite's soak: each kernel's run repeated twice (the full soak took ~2 min of
# one core: 20 runs x 3 kernels, the buggy one's failures shrunk again in each run, the
# suite's longest test and its tail on 2 workers); 2 runs compare every verdict (status,
# finding, shrunk inputs) of a run with the same verdict of a later run in the same worker,
# which is what a verdict that changes between runs needs to show (3 runs made the same
# comparison once more, 18 s of the suite's longest test; the 20-run soak stays, above).
DEFAULT_SOAK_RUNS = 2
SOAK_EXAMPLES = 2  # small examples per property: the soak looks for verdicts that change
CORRECT_SOAK_KERNELS = (
    "attnspec.reference:scaled_dot_product_attention",
    "catalogue.correct:lse_attention",
)
# Each soak's buggy kernel, with the property ids expected to fail (all others pass or are
# not applicable).  The full soak's: missing scale, which fails the scale properties and
# value comparisons against the definition whose fixed per-stratum seeds draw E >= 2 with
# the default scale (1/sqrt(E) != 1 changes the output: bias-semantics takes the default
# scale where drawn, E >= 2; long-peaked-rows' rows at E = 16 peak four times higher
# unscaled); mask-broadcast compares the kernel with itself (SDPA-3.1).  Its gqa-mapping
# and bias-semantics failures shrink in ~530 calls a run: two thirds of the default soak's
# CPU (5.5 of 9.5 CPU-s), so the default soak's buggy kernel takes an explicit scale of 0
# for the default (``scale or 1/sqrt(E)``), whose one failure, explicit-scale, shrinks in
# ~17 calls: a failing verdict, shrunk inputs included, compared between runs all the same.
FULL_SOAK_BUGGY = (
    "catalogue.bugs_scores:missing_scale",
    {"default-scale", "score-variance", "gqa-mapping", "bias-semantics", "long-peaked-rows"},
)
DEFAULT_SOAK_BUGGY = ("catalogue.bugs_scores:scale_zero_means_default", {"explicit-scale"})


@pytest.mark.slow
@pytest.mark.parametrize(
    "n_runs, buggy",
    [
        pytest.param(DEFAULT_SOAK_RUNS, DEFAULT_SOAK_BUGGY, id=f"{DEFAULT_SOAK_RUNS}-runs"),
        pytest.param(SOAK_RUNS, FULL_SOAK_BUGGY, id=f"{SOAK_RUNS}-runs", marks=pytest.mark.soak),
    ],
)
def test_soak_repeated_runs_give_identical_verdicts(
    n_runs: int, buggy: tuple[str, set[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-4, CONF-5: the whole suite, ``n_runs`` times against the same kernels in the
    same worker, gives the same verdict (status, finding, inputs) every time: 0 flaky
    verdicts; the correct kernels pass and the buggy one fails exactly where it should."""
    monkeypatch.setitem(runner.PROFILES, "quick", runner.Profile(SOAK_EXAMPLES))
    properties = list(all_properties().values())
    for target, failing in [*((correct, set()) for correct in CORRECT_SOAK_KERNELS), buggy]:
        setup = KernelSetup(target, "numpy")
        with IsolatedKernel(setup) as isolated:
            kernel = isolated.start()
            runs = [
                run_each(
                    properties,
                    lambda p: isolated.run_property(p, profile="quick", seed=None),
                    new_report(kernel, profile="quick", seed=None, strict=False),
                )
                for _ in range(n_runs)
            ]
        seen = [
            [(v.property, v.status, v.detail, v.counterexample) for v in run.verdicts]
            for run in runs
        ]
        flaky = [row for i, row in enumerate(seen[0]) if any(other[i] != row for other in seen[1:])]
        assert flaky == [], f"{target}: verdicts that changed between runs: {flaky}"
        assert {v.property for v in runs[0].verdicts if v.status == FAILED} == failing
