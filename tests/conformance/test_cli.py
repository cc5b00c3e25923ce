"""The ``attnspec`` command and the report renderers (CONF-1, CONF-2, CONF-3).

Kernels under test are tiny files written into ``tmp_path``: one correct (it calls the
reference), one with a realistic bug (no default scale, SDPA-2.1).  Each check runs one
or two cheap properties (``--only``), so the whole module stays within a few seconds.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from support import ATTNSPEC, KERNELS, kernel_file, run_main

from attnspec import SPEC_VERSION
from attnspec.conformance import (
    SetupError,
    assert_conforms,
    check,
    cli,
)
from attnspec.conformance.claims.declaration import SparseClaim
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import (
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    WAIVED,
    WARNING,
    Report,
    Verdict,
)
from attnspec.conformance.report import render
from attnspec.conformance.run.property_runner import PROFILES, Profile

BIN = Path(sys.executable).parent
CHEAP = "default-scale,explicit-scale"  # closed-form probes: one small call per example


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    return kernel_file(tmp_path, "kernels.py", KERNELS)


def run_command(
    *argv: str, cwd: Path, unset: dict[str, None] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (unset or {})}
    return subprocess.run(
        [ATTNSPEC, *argv], capture_output=True, text=True, cwd=cwd, timeout=120, env=env
    )


# --- attnspec check: exit status and table -------------------------------------------------


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


def test_buggy_kernel_exits_1_and_its_reproduction_runs(kernels: Path, tmp_path: Path) -> None:
    """SDPA-2.1 / CONF-1: the unscaled kernel fails default-scale (exit 1); the table shows
    the counterexample, a rerun command and a reproduction that runs on its own."""
    report_path = tmp_path / "report.json"
    result = run_command(
        "check",
        "kernels.py:no_default_scale",
        "--only",
        CHEAP,
        "--json",
        str(report_path),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
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
    ran = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, cwd=elsewhere, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().endswith("OUTSIDE True")


def test_rerun_command_reproduces_the_failure(kernels: Path, tmp_path: Path) -> None:
    """The one-line rerun command runs just that property and finds the same thing."""
    first = run_command(
        "check",
        "kernels.py:no_default_scale",
        "--only",
        CHEAP,
        "--seed",
        "7",
        "--no-mask",
        cwd=tmp_path,
    )
    assert first.returncode == 1
    rerun = next(
        line.split("rerun:", 1)[1].strip() for line in first.stdout.splitlines() if "rerun:" in line
    )
    argv = shlex.split(rerun)
    assert argv[:2] == ["attnspec", "check"]
    assert argv[-4:] == ["--only", "default-scale", "--seed", "7"] and "--no-mask" in argv
    again = run_command(*argv[1:], cwd=tmp_path / "..")
    assert again.returncode == 1

    def finding(text: str) -> str:
        return next(line for line in text.splitlines() if line.strip().startswith("finding:"))

    assert finding(again.stdout) == finding(first.stdout)


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


PRINTING_KERNEL = (
    KERNELS
    + """

import os
import re


def chatty(q, k, v, *, mask=None, is_causal=False, scale=None):
    import warnings

    warnings.warn("WARNED BY THE KERNEL")
    print("PRINTED BY THE KERNEL")
    os.write(1, b"WRITTEN TO FD 1\\n")
    return correct(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
"""
)


def test_kernel_output_is_kept_off_the_table(tmp_path: Path) -> None:
    """The table on stdout stays clean: what the kernel prints (print, raw fd 1, warnings)
    goes to stderr by default, to --kernel-output PATH when given, nowhere with --quiet (which
    also drops the progress lines)."""
    kernel_file(tmp_path, "chatty.py", PRINTING_KERNEL)
    only = ("--only", "default-scale")
    kernel_said = ("PRINTED BY THE KERNEL", "WRITTEN TO FD 1", "WARNED BY THE KERNEL")

    plain = run_command("check", "chatty.py:chatty", *only, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert not any(text in plain.stdout for text in kernel_said)
    assert all(text in plain.stderr for text in kernel_said)
    assert "result: conforms" in plain.stdout

    to_file = run_command(
        "check", "chatty.py:chatty", *only, "--kernel-output", "k.log", cwd=tmp_path
    )
    log = (tmp_path / "k.log").read_text(encoding="utf-8")
    assert all(text in log for text in kernel_said)
    assert not any(text in to_file.stdout + to_file.stderr for text in kernel_said)

    quiet = run_command("check", "chatty.py:chatty", *only, "--quiet", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert not any(text in quiet.stdout for text in kernel_said)


def test_no_hypothesis_directory_is_left_behind(tmp_path: Path) -> None:
    """A check leaves no .hypothesis/ folder where it runs (Hypothesis would cache the
    constants of the kernel's file there); HYPOTHESIS_STORAGE_DIRECTORY is honoured."""
    kernel_file(tmp_path, "kernels.py", KERNELS)
    result = run_command(
        "check", "kernels.py:correct", "--only", "default-scale,deterministic", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / ".hypothesis").exists()


NO_SCALE_KERNELS = """
from attnspec.reference import scaled_dot_product_attention


def attention(q, k, v, *, mask=None, is_causal=False):
    # JAX-like: no scale parameter, and it needs Ev == E
    assert q.shape[-1] == v.shape[-1], "needs Ev == E"
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)


def scales_by_one_over_e(q, k, v, *, mask=None, is_causal=False):
    assert q.shape[-1] == v.shape[-1], "needs Ev == E"
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                        scale=1 / q.shape[-1])
"""


def test_equal_head_dims_without_a_scale_parameter(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SDPA-1.1, SDPA-2.1 (once a false failure): --equal-head-dims on a correct kernel
    with no scale parameter passes (it is never given scale=), a 1/E default scale is
    still caught, and the inputs line says how the kernel's arguments were padded."""
    kernel = kernel_file(tmp_path, "noscale.py", NO_SCALE_KERNELS)
    only = ("--only", "matches-reference,default-scale", "--dtype", "float64")
    status, out, err = run_main(capsys, "check", f"{kernel}:attention", "--equal-head-dims", *only)
    assert status == 0, out + err
    status, out, _ = run_main(
        capsys, "check", f"{kernel}:scales_by_one_over_e", "--equal-head-dims", *only
    )
    assert status == 1 and "FAILED default-scale [SDPA-2.1" in out
    lines = out.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("FAILED default-scale"))
    inputs = next(line for line in lines[failed:] if line.startswith("  inputs:"))
    assert "scale=None (equal_head_dims: the kernel got q, k, v zero-padded to" in inputs
    assert "and q times" in inputs and "TypeError" not in out


def test_jax_is_checked_in_its_own_settings_unless_asked(tmp_path: Path) -> None:
    """SDPA-1.4: on JAX the check changes no setting: with x64 off (JAX's
    default) float64 is not checked and the report says why; --jax-x64 turns it on, checks
    float64 and says what it changed.  Each in a fresh process (the setting is global),
    running only a property the kernel does not claim: the settings are the setup's."""
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


def test_report_files_parse(
    capsys: pytest.CaptureFixture[str], kernels: Path, tmp_path: Path
) -> None:
    """--json, --junit and --markdown write reports that parse and agree with the run."""
    paths = {kind: tmp_path / f"report.{kind}" for kind in ("json", "junit", "markdown")}
    status, _, _ = run_main(
        capsys,
        "check",
        f"{kernels}:no_default_scale",
        "--only",
        CHEAP,
        *(a for kind, p in paths.items() for a in (f"--{kind}", str(p))),
    )
    assert status == 1
    data = json.loads(paths["json"].read_text())
    assert data["spec_version"] == SPEC_VERSION and data["conforms"] is False
    assert data["counts"][FAILED] == 1 and data["counts"][PASSED] == 1
    failed = next(v for v in data["verdicts"] if v["status"] == FAILED)
    assert failed["clause"] == "SDPA-2.1" and "--only default-scale" in failed["rerun"]

    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    # the file's path gives no bogus packages: neither its slashes nor its dots
    assert {case.get("classname") for case in cases.values()} == {
        "attnspec.kernels.no_default_scale"
    }
    assert set(cases) == {"default-scale[SDPA-2.1]", "explicit-scale[SDPA-2.2]"}
    assert cases["default-scale[SDPA-2.1]"].find("failure") is not None
    assert "KernelUnderTest" in cases["default-scale[SDPA-2.1]"].findtext("system-out", "")
    assert cases["explicit-scale[SDPA-2.2]"].find("failure") is None

    markdown = paths["markdown"].read_text()
    assert "| property | clause | level | verdict | detail |" in markdown
    assert "| `default-scale` | SDPA-2.1 | MUST | **FAILED** |" in markdown
    assert "```python" in markdown


def test_reproduction_rebuilds_layout_renames_and_claims(
    capsys: pytest.CaptureFixture[str], kernels: Path, tmp_path: Path
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
    ran = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-2:] == ["CAUSAL True MASK False", "OUTSIDE True"]


def test_python_api_assert_conforms(kernels: Path) -> None:
    """CONF-1: assert_conforms returns the report of a conforming kernel, raises
    AssertionError with the table for a failing one, SetupError for a bad setup."""
    report = assert_conforms(f"{kernels}:correct", backend="numpy", only=["default-scale"])
    assert report.conforms and [v.status for v in report.verdicts] == [PASSED]
    with pytest.raises(AssertionError, match=r"FAILED default-scale \[SDPA-2.1 MUST"):
        assert_conforms(f"{kernels}:no_default_scale", only=["default-scale"])
    with pytest.raises(SetupError, match="does not accept the keyword 'bias'"):
        assert_conforms(f"{kernels}:correct", only=["default-scale"], bias=True)
    with pytest.raises(SetupError, match=r"unknown claim\(s\) biass"):
        assert_conforms(f"{kernels}:correct", only=["default-scale"], biass=True)


@pytest.mark.parametrize(
    ("target", "options", "message"),
    [
        (None, {}, r"kernel=None, but should be a callable or a target string, 'MODULE:FUNC'"),
        (3, {}, r"kernel=3, but should be a callable or a target string"),
        ("correct", {"causal": "yes"}, r"causal='yes', but should be True or False"),
        ("correct", {"batch_ndim": True}, r"batch_ndim=True, but should be int or None"),
        ("correct", {"mask_keyword": 3}, r"mask_keyword=3, but should be str"),
        ("correct", {"seed": "abc"}, r"seed='abc', but should be an int"),
    ],
)
def test_python_api_names_a_bad_argument(
    kernels: Path, target: object, options: dict[str, object], message: str
) -> None:
    """CONF-3: check() given a kernel that is neither a callable nor a target, a claim of
    the wrong type (a truthy string for a bool, True for a number) or a seed that is not
    an int says which argument and what it should be, before anything runs (these used to
    run: every property failing on None, or the claim taken as truthy)."""
    kernel = f"{kernels}:{target}" if isinstance(target, str) else target
    with pytest.raises(SetupError, match=message):
        check(kernel, only=["default-scale"], **options)  # type: ignore[arg-type]


def test_assert_conforms_caps_the_reproduction(
    kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SDPA-2.1: the score-variance failure's reproduction (2000 key pairs as literals,
    over a megabyte) is not put into the AssertionError: it is written to a file that the
    message names, in attnspec-reproductions/ of the working directory (never the
    temporary directory), and that file holds the whole snippet."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError) as failure:
        assert_conforms(f"{kernels}:no_default_scale", only=["score-variance"])
    message = str(failure.value)
    assert len(message) < 20_000 and "FAILED score-variance [SDPA-2.1" in message
    path = Path(message.split("too long to show here; it is in ")[1].split()[0])
    assert path == Path("attnspec-reproductions", "score-variance.py")
    try:
        snippet = path.read_text(encoding="utf-8")
        assert len(snippet) > 1_000_000 and "out = fn(q, k, v" in snippet
        compile(snippet, str(path), "exec")
    finally:
        path.unlink()


# --- usage and setup errors: exit 2, one line, no traceback --------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "no_such_module_xyz:f"], "module 'no_such_module_xyz' does not import"),
        (["check", "{kernels}:missing"], "has no attribute 'missing'"),
        (["check", "{kernels}:NOT_CALLABLE"], "is a int, not a callable kernel"),
        (["check", "{kernels}:two_arrays"], "does not accept three positional arrays"),
        (["check", "{kernels}:correct", "--bias"], "does not accept the keyword 'bias'"),
        (
            ["check", "{kernels}:correct", "--only", "no-such-property"],
            "unknown property id(s) no-such-property",
        ),
        (["check", "{kernels}:correct", "--backend", "nonsense"], "backend 'nonsense'"),
        (["check", "{kernels}:correct", "--profile", "fast"], "argument --profile"),
        (["check", "{kernels}:correct", "--dtype", "int8"], "dtype int8 is not one of"),
        (
            ["check", "{kernels}:correct", "--backend", "numpy", "--dtype", "bfloat16"],
            "no dtype to test",
        ),
        (["check", "{kernels}:correct", "--sparse-param", "window=2"], "needs --sparse"),
        (["check", "{kernels}:correct", "--kwarg", "oops"], "should be KEY=VALUE"),
        (["check", "{kernels}"], "should be MODULE:FUNC"),
        (["check", "{kernels}:correct", "--json", "/no/such/dir/r.json"], "does not exist"),
        # LIN-6.2 cannot be derived for m <= 4 n (e^(1/4) - 1) = 18.2 with n = 16 keys
        (
            ["check", "{kernels}:correct", "--linear", "favor+", "--linear-num-features", "16"],
            "it needs m >= 19",
        ),
        (
            ["check", "{kernels}:correct", "--backend", "numpy", "--jax-x64"],
            "jax_x64 (--jax-x64) is a setting of the jax backend",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], kernels: Path, argv: list[str], message: str
) -> None:
    """SDPA-1.1 and the CLI contract: bad targets, signatures and options exit 2 with one
    clear line on stderr and nothing run."""
    status, out, err = run_main(capsys, *(a.format(kernels=kernels) for a in argv))
    assert status == 2
    assert out == ""
    assert err.startswith("attnspec: error: ") and err.count("\n") == 1, err
    assert message in err


def test_usage_error_in_a_real_process_has_no_traceback(kernels: Path, tmp_path: Path) -> None:
    """The installed command: exit 2, one line, no traceback (a missing attribute)."""
    result = run_command("check", "kernels.py:missing", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


# --- the other commands -----------------------------------------------------------------------


def test_properties_lists_every_property(capsys: pytest.CaptureFixture[str]) -> None:
    """``attnspec properties``: every registered id with its clause and level."""
    status, out, _ = run_main(capsys, "properties")
    assert status == 0
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    for prop in all_properties().values():
        assert lines[prop.id][1:3] == [prop.clause, prop.level]


def test_backends_prints_the_survey(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attnspec backends`` prints backends.survey's table (survey stubbed: it is slow
    and tested with the backends)."""
    from attnspec.benchmarks import survey

    rows = [
        survey.SurveyRow("numpy", "cpu", "float64", 0.0, 0.0),
        survey.SurveyRow("cupy", "-", None, None, None, reason="no CUDA device"),
    ]
    monkeypatch.setattr(survey, "survey", lambda seed=0: rows)
    status, out, _ = run_main(capsys, "backends")
    assert status == 0
    assert out.strip() == survey.format_survey(rows).strip()


def test_demo_checks_torch_and_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    """``attnspec demo``: PyTorch's SDPA and the reference, both tables, exit 0 (CONF-1)."""
    pytest.importorskip("torch", reason="the demo's first kernel is PyTorch's SDPA")
    status, out, _ = run_main(capsys, "demo", "--only", "default-scale")
    assert status == 0
    assert "conformance of torch.nn.functional:scaled_dot_product_attention on torch" in out
    assert "conformance of attnspec.reference:scaled_dot_product_attention" in out
    assert out.count("result: conforms") == 2


def test_demo_calls_a_written_up_failure_confirmed(capsys: pytest.CaptureFixture[str]) -> None:
    """SDPA-8.3: PyTorch's SDPA turns a NaN query into 0 (docs/divergences.md#torch-nan-query);
    the demo names that failure as the confirmed divergence and exits 0 (CONF-1)."""
    pytest.importorskip("torch", reason="the demo's first kernel is PyTorch's SDPA")
    status, out, _ = run_main(capsys, "demo", "--only", "nan-propagates")
    assert "confirmed divergence, not a suite artefact: nan-propagates [SDPA-8.3]" in out, out
    assert "divergences.md#torch-nan-query" in out
    assert status == 0


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(capsys)
    assert status == 2 and "check" in out and "demo" in out


# --- flags, progress, renderers (pure) ------------------------------------------------------


def test_declaration_flags_become_claims() -> None:
    """CONF-3: each declaration flag sets exactly its KernelDeclaration field."""
    args = cli.build_parser().parse_args(
        [
            "check",
            "m:f",
            "--bias",
            "--bias-keyword",
            "attn_mask",
            "--gqa-keyword",
            "enable_gqa",
            "--causal-alignment",
            "bottom-right",
            "--no-empty-rows-zero",
            "--returns-weights",
            "--no-mask-and-causal",
            "--no-scale",
            "--kwarg",
            "dropout_p=0.0",
            "--sparse",
            "sliding_window",
            "--sparse-param",
            "left=2",
            "--sparse-param",
            "right=0",
            "--sparse-causal",
        ]
    )
    assert cli.claims_from(args) == {
        "bias": True,
        "bias_keyword": "attn_mask",
        "gqa_keyword": "enable_gqa",
        "gqa": True,
        "causal_alignment": "bottom_right",
        "empty_rows_zero": False,
        "returns_weights": True,
        "mask_and_causal": False,
        "scale": False,
        "extra_kwargs": {"dropout_p": 0.0},
        "sparse": SparseClaim("sliding_window", {"left": 2, "right": 0}, causal=True),
    }
    assert cli.claims_from(cli.build_parser().parse_args(["check", "m:f"])) == {}


def test_claims_table_is_the_one_source_of_declaration_fields_and_flags() -> None:
    """CONF-3: KernelDeclaration's fields (type and default) are exactly the claims table's
    rows, in order, and every claim flag of the CLI comes from the table (so a new claim is
    one field and one row, and neither can be forgotten)."""
    from dataclasses import fields

    from attnspec.conformance import KernelDeclaration
    from attnspec.conformance.claims import table as claims

    assert [f.name for f in fields(KernelDeclaration)] == [c.field for c in claims.CLAIMS]
    for claim in claims.CLAIMS:
        assert claim.field == "dtypes" or claim.flags, f"{claim.field} has no flag"
    options = {
        action.option_strings[0] for action in _check_parser()._actions if action.option_strings
    }
    table = {flag.option for flag in (*claims.SETUP_FLAGS, *claims.CLAIM_FLAGS)}
    assert table <= options
    assert cli.DECLARATION_FLAGS == (*claims.SETUP_FLAGS, *claims.CLAIM_FLAGS)


def _check_parser() -> Any:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    return subparsers.choices["check"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--mask-keyword", "attn_mask"], {"mask_keyword": "attn_mask", "mask": True}),
        (["--bias-keyword", "attn_bias"], {"bias_keyword": "attn_bias", "bias": True}),
        (["--gqa-keyword", "enable_gqa"], {"gqa_keyword": "enable_gqa", "gqa": True}),
        (["--no-bias", "--bias-keyword", "b"], {"bias_keyword": "b", "bias": False}),
        (["--no-mask", "--mask-keyword", "m"], {"mask_keyword": "m", "mask": False}),
    ],
)
def test_keyword_flags_turn_their_claim_on(flags: list[str], expected: dict[str, Any]) -> None:
    """CONF-3: --mask-keyword, --bias-keyword and --gqa-keyword claim what they
    name, unless the claim's own flag says otherwise."""
    args = cli.build_parser().parse_args(["check", "m:f", *flags])
    assert cli.claims_from(args) == expected


def test_bias_keyword_alone_runs_the_bias_properties(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SDPA-3.2: --bias-keyword NAME alone makes bias-semantics run (not "not applicable"),
    and it catches a kernel that ignores that argument."""
    kernel = tmp_path / "biased.py"
    kernel.write_text(
        "from attnspec.reference import scaled_dot_product_attention as sdpa\n"
        "def good(q, k, v, *, mask=None, attn_bias=None, is_causal=False, scale=None):\n"
        "    return sdpa(q, k, v, mask=mask, bias=attn_bias, is_causal=is_causal, scale=scale)\n"
        "def ignores(q, k, v, *, mask=None, attn_bias=None, is_causal=False, scale=None):\n"
        "    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)\n"
    )
    for name, status in (("good", 0), ("ignores", 1)):
        code, out, err = run_main(
            capsys,
            "check",
            f"{kernel}:{name}",
            "--bias-keyword",
            "attn_bias",
            "--dtype",
            "float64",
            "--only",
            "bias-semantics",
        )
        assert code == status, err
        row = next(line for line in out.splitlines() if line.startswith("bias-semantics"))
        assert ("passed" if status == 0 else "FAILED") in row


# the full run feeds the kernel NaN (SDPA-8.x), which NumPy reports while computing on it
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_waived_must_clause_is_named_in_every_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-7, CONF-10: --no-empty-rows-zero waives SDPA-5.1: its property is "waived", the
    claim of a full passing run says "except SDPA-5.1", exit 0, and JSON, JUnit and Markdown
    say the same; every report names the spec version the check was made against.

    A claim needs every property to run, but what is checked here is how the reports name
    the waiver: 2 small examples a property, in this process, are enough for that (the
    quick profile was 30-60 s of this suite; the reference's zero-false-failure run is
    tests/catalogue/test_correct_pass.py, the waiver's way out of a worker
    tests/conformance/test_isolation.py's test_hints_and_waivers_travel_from_the_worker)."""
    monkeypatch.setitem(PROFILES, "quick", Profile(2))
    kernel = kernel_file(tmp_path, "plain.py", KERNELS)
    paths = {kind: tmp_path / f"report.{kind}" for kind in ("json", "junit", "markdown")}
    status, out, err = run_main(
        capsys,
        "check",
        f"{kernel}:correct",
        "--no-empty-rows-zero",
        "--dtype",
        "float64",
        "--profile",
        "quick",
        "--no-isolate",
        *(a for kind, p in paths.items() for a in (f"--{kind}", str(p))),
    )
    assert status == 0, err
    claim = (
        f"conforms to attnspec {SPEC_VERSION} except SDPA-5.1 (dense, mask, top-left "
        "causal, explicit scale; float64)"
    )
    assert out.rstrip().splitlines()[-1] == claim
    row = next(line for line in out.splitlines() if line.startswith("empty-rows-zero"))
    assert " waived " in row and "empty_rows_zero=False" in row
    assert "result: conforms except SDPA-5.1 (waived, CONF-7)" in out
    data = json.loads(paths["json"].read_text())
    assert (data["conforms"], data["waived"], data["claim"]) == (True, ["SDPA-5.1"], claim)
    assert data["counts"][WAIVED] == 1
    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert suite is not None
    junit = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert (junit["conforms"], junit["waived"], junit["claim"]) == ("True", "SDPA-5.1", claim)
    case = next(c for c in suite.iter("testcase") if c.get("name").startswith("empty-rows-"))
    assert case.find("skipped") is not None
    assert claim in paths["markdown"].read_text()
    heading = re.compile(
        rf"^(## )?attnspec {re.escape(SPEC_VERSION)}( \(draft .*\))? conformance of ", re.M
    )
    assert heading.search(out) and heading.search(paths["markdown"].read_text())
    assert data["spec_version"] == junit["spec_version"] == SPEC_VERSION


def test_claim_line_says_why_there_is_no_claim() -> None:
    """CONF-1, CONF-2: a MUST failure, a strict run's SHOULD warning and a partial run each
    give their own reason; a strict warning never reads as a MUST failure."""
    from attnspec.conformance import KernelDeclaration

    declaration, dtypes = KernelDeclaration(), ("float32",)
    report = _report()
    assert render.claim_line(report, declaration, dtypes, partial=False) == (
        "no conformance claim: 1 MUST property failed (CONF-1): bad"
    )
    report.verdicts = [v for v in report.verdicts if v.status != FAILED]
    assert render.claim_line(report, declaration, dtypes, partial=False).startswith(
        f"conforms to attnspec {SPEC_VERSION} (dense"
    )
    report.strict = True
    assert render.claim_line(report, declaration, dtypes, partial=False) == (
        "no conformance claim in a strict run: 1 SHOULD property failed (CONF-2, --strict): meh"
    )
    report.strict = False
    assert render.claim_line(report, declaration, dtypes, partial=True) == (
        "no conformance claim: only some properties ran (--only/--skip)"
    )


def test_linear_flags_become_a_linear_claim() -> None:
    args = cli.build_parser().parse_args(
        [
            "check",
            "m:f",
            "--linear",
            "favor+",
            "--linear-num-features",
            "256",
            "--linear-iid",
        ]
    )
    claim = cli.claims_from(args)["linear"]
    assert (claim.feature_map, claim.num_features, claim.orthogonal) == ("favor+", 256, False)


def _prop(property_id: str = "p", clause: str = "SDPA-2.1") -> object:
    return type("P", (), {"id": property_id, "clause": clause})()


def test_progress_display_plain_and_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress: when piped, a line as each property starts (so a log shows which one
    hangs) and one with its verdict, the failures so far and the wall time; on a terminal
    one line rewritten in place (property n of N, failures so far, elapsed wall time);
    in CI plain lines even on a terminal."""
    ticks = iter(range(100))
    plain = io.StringIO()
    display = cli.ProgressDisplay(2, plain, clock=lambda: 10.0 * next(ticks))
    display(_prop("a"), None)  # type: ignore[arg-type]
    display(_prop("a"), Verdict("a", "SDPA-2.1", "MUST", PASSED))  # type: ignore[arg-type]
    display(_prop("b"), None)  # type: ignore[arg-type]
    display(_prop("b"), Verdict("b", "SDPA-2.1", "MUST", FAILED))  # type: ignore[arg-type]
    assert plain.getvalue().splitlines() == [
        "[1/2] a (SDPA-2.1) ...",
        "[1/2] a (SDPA-2.1): passed (0.0s; 0 failed so far, 20s elapsed)",
        "[2/2] b (SDPA-2.1) ...",
        "[2/2] b (SDPA-2.1): failed (0.0s; 1 failed so far, 40s elapsed)",
    ]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    terminal = Terminal()
    display = cli.ProgressDisplay(1, terminal, clock=lambda: 5.0)
    display(_prop("a"), None)  # type: ignore[arg-type]
    assert terminal.getvalue().endswith(
        "\r\033[Kproperty 0 of 1, 0 failed so far, 0s elapsed, running a"
    )
    display(_prop("a"), Verdict("a", "SDPA-2.1", "MUST", FAILED))  # type: ignore[arg-type]
    assert "property 1 of 1, 1 failed so far" in terminal.getvalue()
    assert "\n" not in terminal.getvalue() and terminal.getvalue().endswith("\r\033[K")
    monkeypatch.setenv("CI", "true")
    ci = Terminal()
    cli.ProgressDisplay(1, ci)(_prop("a"), None)  # type: ignore[arg-type]
    assert ci.getvalue() == "[1/1] a (SDPA-2.1) ...\n"


def _report(strict: bool = False) -> Report:
    return Report(
        "m:f",
        "numpy",
        "cpu",
        "quick",
        None,
        strict,
        [
            Verdict("ok", "SDPA-2.1", "MUST", PASSED, seconds=0.5),
            Verdict(
                "bad",
                "SDPA-4.1",
                "MUST",
                FAILED,
                "out differs | here",
                "q(1, 1, 2)",
                "print('repro')",
            ),
            Verdict("meh", "SDPA-8.2", "SHOULD", WARNING, "NaN leaks", "q(1, 1, 1)", "print(1)"),
            Verdict("na", "SDPA-3.2", "MUST", NOT_APPLICABLE, "the kernel does not claim bias"),
        ],
    )


def test_table_shows_every_verdict_and_each_failure_in_full() -> None:
    """The distinct divergences first, then the text table: labels passed / FAILED /
    warning / not applicable, then details."""
    text = render.format_table(_report(), rerun=lambda v: f"attnspec check m:f --only {v.property}")
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("property "))
    assert "2 distinct divergences:" in lines[:header]
    rows = {line.split()[0]: line for line in lines[header + 2 : header + 6]}
    assert [rows[p].split()[3] for p in ("ok", "bad", "meh")] == ["passed", "FAILED", "warning"]
    assert "not applicable" in rows["na"] and "does not claim bias" in rows["na"]
    assert "rerun:   attnspec check m:f --only bad" in text
    assert "    print('repro')" in text
    assert text.splitlines()[-1].startswith("result: DOES NOT CONFORM: 1 failed, 1 warning(s)")


def test_long_reproductions_are_pointed_to_not_printed() -> None:
    report = _report()
    report.verdicts[1].reproduction = "x = 1\n" * 5000
    text = render.format_table(report, max_reproduction=1000)
    assert "x = 1" not in text and "30000 characters of literal inputs" in text


def test_junit_marks_failures_skips_and_strict_warnings() -> None:
    """JUnit: failure for FAILED, skipped for not applicable; warnings fail only if strict."""
    for strict, failures in ((False, "1"), (True, "2")):
        suite = ET.fromstring(render.to_junit(_report(strict))).find("testsuite")
        assert suite is not None and suite.get("failures") == failures
        cases = {c.get("name"): c for c in suite.iter("testcase")}
        assert cases["na[SDPA-3.2]"].find("skipped") is not None
        assert (cases["meh[SDPA-8.2]"].find("failure") is not None) is strict
        assert "print(1)" in cases["meh[SDPA-8.2]"].findtext("system-out", "")


def test_markdown_escapes_pipes_and_json_has_spec_version() -> None:
    markdown = render.to_markdown(_report())
    assert "out differs \\| here" in markdown
    data = json.loads(render.to_json(_report()))
    assert data["spec_version"] == SPEC_VERSION
    assert data["counts"] == {PASSED: 1, FAILED: 1, WARNING: 1, NOT_APPLICABLE: 1, WAIVED: 0}


def test_unknown_sparse_pattern_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SPARSE-1.1: --sparse takes only the spec's pattern names (exit 2, one line)."""
    kernel = tmp_path / "k.py"
    kernel.write_text("def attention(q, k, v, *, scale=None):\n    return q\n")
    status, _, err = run_main(capsys, "check", f"{kernel}:attention", "--sparse", "window")
    assert status == 2 and "not a spec pattern" in err and "sliding_window" in err


def test_linear_feature_map_may_be_a_callable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """LIN-5.1: --linear MODULE:FUNC declares a custom feature map; the formula property
    then runs with it (and a wrong map is caught)."""
    kernel = tmp_path / "linear_kernel.py"
    kernel.write_text(
        "from attnspec.reference import linear_attention\n"
        "def phi(x):\n    return x * x + 1.0\n"
        "def other(x):\n    return x * x + 2.0\n"
        "def attention(q, k, v, *, is_causal=False):\n"
        "    return linear_attention(q, k, v, feature_map=phi, is_causal=is_causal)\n"
    )
    only = ("--only", "linear-matches-formula,linear-causal-prefix")
    status, out, _ = run_main(
        capsys, "check", f"{kernel}:attention", "--linear", f"{kernel}:phi", *only
    )
    assert status == 0 and "linear-matches-formula" in out
    status, _, _ = run_main(
        capsys, "check", f"{kernel}:attention", "--linear", f"{kernel}:other", *only
    )
    assert status == 1
    status, _, err = run_main(capsys, "check", f"{kernel}:attention", "--linear", "softmax")
    assert status == 2 and "MODULE:FUNC" in err
