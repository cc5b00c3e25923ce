"""``attnspec check``: exit status, table, reproductions, targets and what a run leaves
behind (CONF-1, CONF-2).

Kernels under test are tiny files written into ``tmp_path``: one correct (it calls the
reference), one with a realistic bug (no default scale, SDPA-2.1).  Each check runs one
or two cheap properties (``--only``), so the module stays within a few seconds.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from support import CHEAP, KERNELS, kernel_file, run_command, run_main

from attnspec import SPEC_VERSION
from attnspec.conformance import (
    check,
    cli,
)
from attnspec.conformance.report import render


def test_correct_kernel_exits_0(capsys: pytest.CaptureFixture[str], kernels: Path) -> None:
    """CONF-1: every applicable MUST property passed -> exit 0, table says passed."""
    status, out, _ = run_main(capsys, "check", f"{kernels}:correct", "--only", CHEAP)
    assert status == 0
    rows = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.startswith(("default-", "explicit-"))
    }
    assert set(rows) == {"default-scale", "explicit-scale"}
    assert "SDPA-2.1" in rows["default-scale"] and " passed " in rows["default-scale"] + " "
    assert "result: conforms" in out


def test_buggy_kernel_exits_1_and_its_reproduction_runs(
    kernels: Path,
    tmp_path: Path,
    python_c: Callable[..., subprocess.CompletedProcess[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SDPA-2.1 / CONF-1: the unscaled kernel fails default-scale (exit 1); the table shows
    the counterexample, a rerun command and a reproduction that runs on its own.  The
    command in this process, started in ``tmp_path`` (the kernel in its own process)."""
    report_path = tmp_path / "report.json"
    monkeypatch.chdir(tmp_path)
    status, out, err = run_main(
        capsys,
        *("check", "kernels.py:no_default_scale", "--only", CHEAP, "--json", str(report_path)),
    )
    assert status == 1, err
    assert "Traceback" not in err
    assert "FAILED default-scale [SDPA-2.1 MUST" in out
    assert "inputs:  q(" in out and "rerun:   attnspec check" in out
    assert "explicit-scale" in out and "result: DOES NOT CONFORM" in out

    verdict = next(
        v
        for v in json.loads(report_path.read_text())["verdicts"]
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
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = python_c(snippet, cwd=elsewhere)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().endswith("OUTSIDE True")


def test_rerun_command_reproduces_the_failure(
    kernels: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one-line rerun command runs just that property and finds the same thing, from
    another working directory.  The commands in this process (the kernel in its own)."""
    monkeypatch.chdir(tmp_path)
    argv = ("check", "kernels.py:no_default_scale", "--only", CHEAP, "--seed", "7", "--no-mask")
    status, first, _ = run_main(capsys, *argv)
    assert status == 1
    rerun = next(
        line.split("rerun:", 1)[1].strip() for line in first.splitlines() if "rerun:" in line
    )
    again_argv = shlex.split(rerun)
    assert again_argv[:2] == ["attnspec", "check"]
    assert again_argv[-4:] == ["--only", "default-scale", "--seed", "7"]
    assert "--no-mask" in again_argv
    monkeypatch.chdir(tmp_path / "..")
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


def test_module_target_imports_from_the_working_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MODULE:FUNC finds a module in the working directory (as python -m does), and
    sys.path is left as it was."""
    kernel_file(tmp_path, "attnspec_cwd_kernels.py", KERNELS)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    status, _, err = run_main(
        capsys, "check", "attnspec_cwd_kernels:correct", "--only", "default-scale"
    )
    assert status == 0, err
    assert sys.path == before


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


def test_no_hypothesis_directory_is_left_behind(tmp_path: Path) -> None:
    """A check leaves no .hypothesis/ folder where it runs (Hypothesis would cache the
    constants of the kernel's file there); HYPOTHESIS_STORAGE_DIRECTORY is honoured.
    Without the variable (conftest sets it for the suite's own processes)."""
    kernel_file(tmp_path, "kernels.py", KERNELS)
    result = run_command(
        "check",
        "kernels.py:correct",
        "--only",
        "default-scale,deterministic",
        cwd=tmp_path,
        unset=("HYPOTHESIS_STORAGE_DIRECTORY",),
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / ".hypothesis").exists()


def test_jax_is_checked_in_its_own_settings_unless_asked(tmp_path: Path) -> None:
    """SDPA-1.4: on JAX the check changes no setting: with x64 off (JAX's
    default) float64 is not checked and the report says why; --jax-x64 turns it on, checks
    float64 and says what it changed.  Each in a fresh process (the setting is global),
    running only a property the kernel does not claim: the settings are the setup's, made
    in that process with --no-isolate (a worker's would import JAX twice more, ~3 s of CPU
    each run; that the worker gets them is test_supervisor.py's JAX tests)."""
    pytest.importorskip("jax", reason="the jax extra is not installed")
    kernel_file(tmp_path, "kernels.py", KERNELS)
    env_free = {"JAX_ENABLE_X64": None}
    reports = {}
    for name, flags in (("default", ()), ("x64", ("--jax-x64",))):
        path = tmp_path / f"{name}.json"
        result = run_command(
            "check",
            "kernels.py:correct",
            "--backend",
            "jax",
            "--only",
            "bias-semantics",
            "--no-isolate",
            *flags,
            "--json",
            str(path),
            cwd=tmp_path,
            unset=env_free,
        )
        assert result.returncode == 0, result.stderr
        reports[name] = (json.loads(path.read_text()), result.stdout)
    data, out = reports["default"]
    assert "note: float64 is not checked: jax_enable_x64 is off (JAX's default)" in out
    assert "--jax-x64" in out and not any("changed" in note for note in data["notes"])
    data, out = reports["x64"]
    assert "note: changed jax_enable_x64: False -> True for this check" in out
    assert not any("float64 is not checked" in note for note in data["notes"])


def test_unclaimed_property_is_not_applicable(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """CONF-3: a kernel without ``scale=`` gets explicit-scale "not applicable", exit 0."""
    status, out, _ = run_main(capsys, "check", f"{kernels}:without_scale", "--only", CHEAP)
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


def test_only_and_skip_select_properties(
    capsys: pytest.CaptureFixture[str], kernels: Path, tmp_path: Path
) -> None:
    """--only and --skip (repeatable and comma lists) choose exactly the properties run."""
    path = tmp_path / "r.json"
    status, _, _ = run_main(
        capsys,
        "check",
        f"{kernels}:correct",
        "--only",
        "default-scale",
        "--only",
        "explicit-scale,score-variance",
        "--skip",
        "score-variance",
        "--json",
        str(path),
    )
    assert status == 0
    ran = [v["property"] for v in json.loads(path.read_text())["verdicts"]]
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
    way by its reproduction snippet, which then shows the SDPA-2.1 failure again."""
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
