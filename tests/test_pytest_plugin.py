"""The pytest plugin: ``pytest --attnspec-kernel MODULE:FUNC`` (issue 4, "Running it").

Each inner run is a pytester run in this process on a kernel file in its temporary
directory, restricted to one or two cheap properties.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import KERNELS, should_property  # noqa: F401  (fixture reused)

pytest_plugins = ["pytester"]
CHEAP = "default-scale,explicit-scale"


@pytest.fixture
def kernel_file(pytester: pytest.Pytester) -> Path:
    return pytester.makepyfile(kernels=KERNELS)


def test_without_the_option_the_plugin_adds_nothing(pytester: pytest.Pytester) -> None:
    """A normal pytest run: the project's own tests only, no attnspec items, no session."""
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    assert "attnspec::" not in result.stdout.str()
    assert "--attnspec-kernel" in pytester.runpytest("--help").stdout.str()


def test_importing_the_plugin_loads_no_kernel_library_or_property() -> None:
    """Loaded in every pytest run, the plugin imports neither torch/jax nor the properties."""
    code = ("import sys, attnspec.conformance.pytest_plugin as p; "
            "print(sorted(m for m in ('torch', 'jax', 'attnspec.conformance.properties') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_one_item_per_property_and_must_failures_fail(pytester: pytest.Pytester,
                                                      kernel_file: Path) -> None:
    """CONF-1, SDPA-2.1: items are named attnspec::ID[CLAUSE]; the unscaled kernel fails
    default-scale with its finding, counterexample and reproduction in the report."""
    result = pytester.runpytest("--attnspec-kernel", f"{kernel_file}:no_default_scale",
                                "--attnspec-only", CHEAP, "-v")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "*collected 2 items*",
        "attnspec::default-scale?SDPA-2.1? FAILED*",
        "attnspec::explicit-scale?SDPA-2.2? PASSED*",
        "*FAILED default-scale ?SDPA-2.1 MUST*",
        "*inputs:  q(*",
        "*rerun:   pytest --attnspec-kernel *--attnspec-only default-scale",
        "*reproduction (runs on its own):*",
        "*DOES NOT CONFORM*",
    ])


def test_correct_kernel_passes_and_unclaimed_is_skipped(pytester: pytest.Pytester,
                                                        kernel_file: Path) -> None:
    """CONF-3: a property the kernel does not claim is skipped with the reason."""
    result = pytester.runpytest("--attnspec-kernel", f"{kernel_file}:without_scale",
                                "--attnspec-only", CHEAP, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*not applicable: the kernel does not claim scale*"])


def test_should_failure_is_a_warning_unless_strict(pytester: pytest.Pytester,
                                                   kernel_file: Path,
                                                   should_property: str) -> None:  # noqa: F811
    """CONF-2: a failed SHOULD property passes with a pytest warning; strict fails it."""
    args = ("--attnspec-kernel", f"{kernel_file}:correct", "--attnspec-only", should_property)
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*AttnspecWarning*", "*test-double-should ?SDPA-8.2 SHOULD*"])
    pytester.runpytest(*args, "--attnspec-strict").assert_outcomes(failed=1)


def test_k_selects_properties(pytester: pytest.Pytester, kernel_file: Path) -> None:
    """-k works on property ids, like on any test."""
    result = pytester.runpytest("--attnspec-kernel", f"{kernel_file}:correct",
                                "--attnspec-only", CHEAP, "-k", "explicit", "-v")
    result.assert_outcomes(passed=1, deselected=1)


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        ("{file}:missing", (), "has no attribute 'missing'"),
        ("{file}:two_arrays", (), "does not accept three positional arrays"),
        ("{file}:correct", ("--attnspec-only", "nope"), "unknown property id(s) nope"),
        ("{file}:correct", ("--attnspec-profile", "fast"), "profile='fast'"),
        ("{file}:correct", ("--attnspec-claim", "bias"), "should be KEY=VALUE"),
    ],
)
def test_bad_setup_is_a_usage_error(pytester: pytest.Pytester, kernel_file: Path, target: str,
                                    extra: tuple[str, ...], message: str) -> None:
    """SDPA-1.1 and the plugin contract: a bad kernel or option stops pytest with a usage
    error (exit 4) and one clear line."""
    result = pytester.runpytest("--attnspec-kernel", target.format(file=kernel_file), *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(message in line for line in result.stderr.lines), result.stderr.str()
