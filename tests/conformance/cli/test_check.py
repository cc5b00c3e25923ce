"""``attnspec check``: exit status, table, reproductions, targets and what a run leaves
behind (CONF-1, CONF-2).

Kernels under test are tiny files written into ``tmp_path``: one correct (it calls the
reference), one with a realistic bug (no default scale, SDPA-2.1).  Each check runs one
or two cheap properties (``--only``), so the module stays within a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from support import CHEAP, KERNELS, CheckRun, kernel_file, run_main

from attnspec import SPEC_VERSION
from attnspec.conformance import (
    check,
    cli,
)
from attnspec.conformance.report import render
from attnspec.conformance.run.supervisor import JUDGED_IN_THE_KERNELS_PROCESS


@pytest.fixture(scope="module")
def correct_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, list[str]]:
    """``attnspec check kernels.py:correct --only default-scale --only
    explicit-scale,score-variance --skip score-variance --json r.json``, in this process
    (the kernel in its own): its exit status, table and the properties its report holds.
    The --only/--skip selection is exactly CHEAP, so the test of a correct kernel's exit
    status and the test of the selection read one check (~1.1 CPU-s each)."""
    directory = tmp_path_factory.mktemp("correct")
    kernels = kernel_file(directory, "kernels.py", KERNELS)
    path = directory / "r.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(
            [
                *("check", f"{kernels}:correct", "--only", "default-scale"),
                *("--only", "explicit-scale,score-variance", "--skip", "score-variance"),
                *("--json", str(path)),
            ]
        )
    ran = [v["property"] for v in json.loads(path.read_text())["verdicts"]]
    return status, out.getvalue(), ran


def test_correct_kernel_exits_0(correct_run: tuple[int, str, list[str]]) -> None:
    """CONF-1: every applicable MUST property passed -> exit 0, table says passed."""
    status, out, _ = correct_run
    assert status == 0
    rows = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.startswith(("default-", "explicit-"))
    }
    assert set(rows) == {"default-scale", "explicit-scale"}
    assert "SDPA-2.1" in rows["default-scale"] and " passed " in rows["default-scale"] + " "
    assert "result: conforms" in out


def test_an_in_process_check_says_the_kernel_could_have_forged_it(
    correct_run: tuple[int, str, list[str]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """CONF-14: a check run with --no-isolate decided its verdicts where the kernel ran, so
    its report says so (text and JSON notes); an isolated check's report does not."""
    kernels = kernel_file(tmp_path, "kernels.py", KERNELS)
    path = tmp_path / "r.json"
    status, out, err = run_main(
        capsys,
        *("check", f"{kernels}:correct", "--only", "default-scale", "--no-isolate"),
        *("--json", str(path)),
    )
    assert status == 0, err
    assert f"note: {JUDGED_IN_THE_KERNELS_PROCESS}" in out
    assert JUDGED_IN_THE_KERNELS_PROCESS in json.loads(path.read_text())["notes"]
    assert "judged in the kernel's own process" not in correct_run[1]


def test_buggy_kernel_exits_1_and_its_reproduction_runs(
    unscaled_run: CheckRun,
    tmp_path: Path,
    python_c: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """SDPA-2.1 / CONF-1: the unscaled kernel fails default-scale (exit 1); the table shows
    the counterexample, a rerun command and a reproduction that runs on its own (the
    shared check, conftest.unscaled_run: the command in this process, started where the
    kernel's file is; the kernel in its own process)."""
    status, out, err = unscaled_run.status, unscaled_run.out, unscaled_run.err
    assert status == 1, err
    assert "Traceback" not in err
    assert "FAILED default-scale [SDPA-2.1 MUST" in out
    assert "inputs:  q(" in out and "rerun:   attnspec check" in out
    assert "explicit-scale" in out and "result: DOES NOT CONFORM" in out

    verdict = next(
        v
        for v in json.loads(unscaled_run.reports["json"].read_text())["verdicts"]
        if v["property"] == "default-scale"
    )
    # Run the snippet elsewhere, then confirm it rebuilt the failing case: the kernel's
    # output lies outside the TOL-2 bound of the definition there.
    snippet = verdict["reproduction"] + textwrap.dedent("""
        bound = reference_bound(problem, kernel.declaration)
        outside = np.abs(kernel.output(problem) - np.asarray(bound.out)) > np.asarray(
            bound.out_tolerance)
        print("OUTSIDE", bool(outside.any()))
    """)
    ran = python_c(snippet, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().endswith("OUTSIDE True")


def test_rerun_command_reproduces_the_failure(
    unscaled_run: CheckRun,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one-line rerun command runs just that property and finds the same thing, from
    another working directory.  The first run is the shared check (``--seed 7
    --no-mask``, conftest.unscaled_run); the rerun in this process (the kernel in its
    own)."""
    first = unscaled_run.out
    assert unscaled_run.status == 1
    rerun = next(
        line.split("rerun:", 1)[1].strip() for line in first.splitlines() if "rerun:" in line
    )
    again_argv = shlex.split(rerun)
    assert again_argv[:2] == ["attnspec", "check"]
    assert again_argv[-4:] == ["--only", "default-scale", "--seed", "7"]
    assert "--no-mask" in again_argv
    monkeypatch.chdir(unscaled_run.cwd / "..")
    status, again, _ = run_main(capsys, *again_argv[1:])
    assert status == 1

    def finding(text: str) -> str:
        return next(line for line in text.splitlines() if line.strip().startswith("finding:"))

    assert finding(again) == finding(first)


def test_unreadable_result_fails_the_property_not_the_run(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """SDPA-1.3: a result the suite cannot read as an array fails each property (exit 1)
    with what it was, instead of a traceback ending the run; the two failures share that
    one cause and are told once."""
    status, out, _ = run_main(capsys, "check", f"{kernels}:returns_text", "--only", CHEAP)
    assert status == 1
    assert (
        "FAILED 2 properties, one cause [MUST]:\n  default-scale [SDPA-2.1], "
        "explicit-scale [SDPA-2.2]\n"
    ) in out
    assert out.count("  finding: out is a str, but should be a numpy array [SDPA-1.3]") == 1


def test_conformance_claim_only_after_a_full_passing_run() -> None:
    """CONF-1: the claim names the version, the declared features and the dtypes."""
    from attnspec.conformance import KernelDeclaration

    claim = render.conformance_claim(
        KernelDeclaration(bias=True, gqa=True, causal_alignment="bottom_right", scale=False),
        ("float16", "bfloat16", "float32"),
    )
    assert claim == (
        f"conforms to attnspec {SPEC_VERSION} (dense, mask, bias, GQA, "
        "bottom-right causal; float16, bfloat16, float32)"
    )


@pytest.fixture(scope="module")
def in_the_kernels_directory(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[int, str, Path, bool]:
    """``attnspec check attnspec_cwd_kernels:correct --only default-scale,deterministic``
    started in the directory holding that module, without HYPOTHESIS_STORAGE_DIRECTORY
    (conftest sets it for the suite's own processes).  The command in this process; its
    judging worker and the kernel's process, where Hypothesis draws and the kernel's file
    is, start there too.  Its exit status and stderr, the directory, and whether sys.path
    was left as it was: what the tests of a module target and of the .hypothesis folder
    read (one check, not one each: ~0.5 CPU-s)."""
    cwd = tmp_path_factory.mktemp("cwd")
    kernel_file(cwd, "attnspec_cwd_kernels.py", KERNELS)
    before = list(sys.path)
    err = io.StringIO()
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(err),
    ):
        patch.chdir(cwd)
        patch.delenv("HYPOTHESIS_STORAGE_DIRECTORY")
        argv = ["check", "attnspec_cwd_kernels:correct", "--only", "default-scale,deterministic"]
        status = cli.main(argv)
        kept = sys.path == before
    return status, err.getvalue(), cwd, kept


def test_module_target_imports_from_the_working_directory(
    in_the_kernels_directory: tuple[int, str, Path, bool],
) -> None:
    """MODULE:FUNC finds a module in the working directory (as python -m does), and
    sys.path is left as it was (the shared check, in_the_kernels_directory)."""
    status, err, _, kept = in_the_kernels_directory
    assert status == 0, err
    assert kept


def test_file_target_imports_the_files_next_to_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A path/to/file.py:FUNC kernel imports a helper module next to it (as when run as a
    script), from any working directory; sys.path is left as it was."""
    package = tmp_path / "project"
    package.mkdir()
    (package / "attnspec_sibling_helper.py").write_text(KERNELS, encoding="utf-8")
    (package / "uses_sibling.py").write_text(
        "from attnspec_sibling_helper import correct as attention\n", encoding="utf-8"
    )
    before = list(sys.path)
    status, _, err = run_main(
        capsys, "check", f"{package / 'uses_sibling.py'}:attention", "--only", "default-scale"
    )
    assert status == 0, err
    assert sys.path == before


def test_no_hypothesis_directory_is_left_behind(
    in_the_kernels_directory: tuple[int, str, Path, bool],
) -> None:
    """A check leaves no .hypothesis/ folder where it runs (Hypothesis would cache the
    constants of the kernel's file there); HYPOTHESIS_STORAGE_DIRECTORY is honoured.
    The shared check, in_the_kernels_directory: without the variable, started where the
    kernel's module is."""
    status, err, cwd, _ = in_the_kernels_directory
    assert status == 0, err
    assert not (cwd / ".hypothesis").exists()


def test_jax_is_checked_in_its_own_settings_unless_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SDPA-1.4: on JAX the check changes no setting: with x64 off (JAX's default)
    float64 is not checked, the report says why, and x64 is still off after the check;
    --jax-x64 turns it on, checks float64 and says what it changed.  The commands in this
    process with --no-isolate (the settings are the setup's, made where the kernel runs;
    that a worker gets them is test_supervisor.py's JAX tests), JAX's process-wide setting
    put to its default before each run and restored after the test: each run in a fresh
    process imported JAX twice, ~4 CPU-s, where this test process has it loaded already.
    Running only a property the kernel does not claim: the settings are what is read."""
    jax = pytest.importorskip("jax", reason="the jax extra is not installed")
    monkeypatch.delenv("JAX_ENABLE_X64", raising=False)
    kernel_file(tmp_path, "kernels.py", KERNELS)
    monkeypatch.chdir(tmp_path)
    before = jax.config.jax_enable_x64
    reports = {}
    x64_after = {}
    try:
        for name, flags in (("default", ()), ("x64", ("--jax-x64",))):
            jax.config.update("jax_enable_x64", False)  # JAX's default, as in a fresh process
            path = tmp_path / f"{name}.json"
            status, out, err = run_main(
                capsys,
                *("check", "kernels.py:correct", "--backend", "jax", "--only", "bias-semantics"),
                *("--no-isolate", *flags, "--json", str(path)),
            )
            x64_after[name] = jax.config.jax_enable_x64
            assert status == 0, err
            reports[name] = (json.loads(path.read_text()), out)
    finally:
        jax.config.update("jax_enable_x64", before)
    data, out = reports["default"]
    assert "note: float64 is not checked: jax_enable_x64 is off (JAX's default)" in out
    assert "--jax-x64" in out and not any("changed" in note for note in data["notes"])
    assert x64_after["default"] is False  # the check changed no setting
    data, out = reports["x64"]
    assert "note: changed jax_enable_x64: False -> True for this check" in out
    assert not any("float64 is not checked" in note for note in data["notes"])


def test_unclaimed_property_is_not_applicable(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """CONF-3: a kernel without ``scale=`` gets explicit-scale "not applicable", exit 0."""
    # what is applicable is read off the declaration, the same in this process: no worker
    # and kernel process started for it (--no-isolate; test_correct_kernel_exits_0's check
    # of the same properties goes through them)
    status, out, _ = run_main(
        capsys, "check", f"{kernels}:without_scale", "--only", CHEAP, "--no-isolate"
    )
    assert status == 0
    row = next(line for line in out.splitlines() if line.startswith("explicit-scale"))
    assert "not applicable" in row and "does not claim scale" in row
    assert "1 not applicable" in out
    assert "no conformance claim: only some properties ran" in out


def test_should_failure_warns_and_fails_only_when_strict(
    capsys: pytest.CaptureFixture[str], kernels: Path, should_property: str
) -> None:
    """CONF-2: a failed SHOULD property is a warning (exit 0); with --strict, exit 1."""
    # --no-isolate: the test double is registered in this process only, not in a worker's
    status, out, _ = run_main(
        capsys, "check", f"{kernels}:correct", "--only", should_property, "--no-isolate"
    )
    assert status == 0
    assert "warning test-double-should [SDPA-8.2 SHOULD" in out
    assert "conforms (with 1 SHOULD warning(s))" in out
    status, out, _ = run_main(
        capsys, "check", f"{kernels}:correct", "--only", should_property, "--strict", "--no-isolate"
    )
    assert status == 1 and "DOES NOT CONFORM" in out
    assert "MUST" not in out.splitlines()[-1]
    assert out.splitlines()[-1].startswith("no conformance claim in a strict run: 1 SHOULD")


def test_only_and_skip_select_properties(correct_run: tuple[int, str, list[str]]) -> None:
    """--only and --skip (repeatable and comma lists) choose exactly the properties run."""
    status, _, ran = correct_run
    assert status == 0
    assert ran == ["default-scale", "explicit-scale"]


def test_an_internal_error_exits_2_not_1(
    capsys: pytest.CaptureFixture[str], kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-1: a bug in attnspec itself (here the check command raising) is exit status 2
    with its traceback and a line saying it is no verdict, never 1, which CI reads as "does
    not conform"."""

    def broken(args: object) -> int:
        raise RuntimeError("a bug in the suite")

    monkeypatch.setitem(cli.COMMANDS, "check", broken)
    status, _, err = run_main(capsys, "check", f"{kernels}:correct")
    assert status == 2
    assert "Traceback" in err and "RuntimeError: a bug in the suite" in err
    assert "internal error: RuntimeError: a bug in the suite (a bug in attnspec, not" in err


def test_check_takes_one_string_as_a_comma_list(tmp_path: Path) -> None:
    """check(only=..., skip=..., dtypes=...) given one string reads it as the CLI reads a
    flag's value, a comma list, not as its characters (which were unknown property ids,
    and unknown dtypes): a float32-only kernel passes with dtypes="float32"."""
    kernel = kernel_file(
        tmp_path,
        "float32_only.py",
        "import numpy as np\n"
        "from attnspec.reference import scaled_dot_product_attention as sdpa\n"
        "def attention(q, k, v, *, scale=None):\n"
        "    assert q.dtype == np.float32, q.dtype\n"
        "    return sdpa(q, k, v, scale=scale)\n",
    )
    report = check(
        f"{kernel}:attention",
        only="default-scale, explicit-scale,score-variance",
        skip="score-variance",
        dtypes="float32",
    )
    assert [v.property for v in report.verdicts] == ["default-scale", "explicit-scale"]
    assert all(v.status == "passed" for v in report.verdicts), report.verdicts


def test_reproduction_rebuilds_layout_renames_and_claims(
    capsys: pytest.CaptureFixture[str],
    kernels: Path,
    tmp_path: Path,
    python_c: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """A kernel checked through --layout blhd, --rename and claim flags is rebuilt the same
    way by its reproduction snippet, which then shows the SDPA-2.1 failure again.  The
    check in this process (--no-isolate): its reproduction is the one an isolated check
    writes (compared: the same JSON verdict but the seconds), and the snippet runs in a
    process of its own as before; a worker and a kernel process cost ~0.5 CPU-s.  (The
    reproductions of isolated checks are run by the test of the buggy kernel above and by
    test_supervisor.py's hang test.)"""
    path = tmp_path / "r.json"
    status, out, _ = run_main(
        capsys,
        "check",
        f"{kernels}:blhd_no_default_scale",
        "--layout",
        "blhd",
        "--rename",
        "is_causal=causal",
        "--no-mask",
        "--dtype",
        "float64",
        "--only",
        "default-scale",
        "--json",
        str(path),
        "--no-isolate",
    )
    assert status == 1
    assert "--layout blhd --rename is_causal=causal --dtype float64 --no-mask" in out
    snippet = json.loads(path.read_text())["verdicts"][0]["reproduction"]
    assert "fn = kernel_function(" in snippet and "'blhd', {'is_causal': 'causal'})" in snippet
    assert "KernelDeclaration(" in snippet
    snippet += textwrap.dedent("""
        bound = reference_bound(problem, kernel.declaration)
        print("CAUSAL", kernel.declaration.causal, "MASK", kernel.declaration.mask)
        print("OUTSIDE", bool((np.abs(kernel.output(problem) - np.asarray(bound.out))
                               > np.asarray(bound.out_tolerance)).any()))
    """)
    ran = python_c(snippet, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-2:] == ["CAUSAL True MASK False", "OUTSIDE True"]
