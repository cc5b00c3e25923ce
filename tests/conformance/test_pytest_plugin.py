"""The pytest plugin: ``pytest --attnspec-kernel MODULE:FUNC`` (CONF-1, CONF-2, CONF-3).

Each inner run is a pytester run in this process on a kernel file in its temporary
directory, restricted to one or two cheap properties.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import KERNELS

from attnspec.backends import Backend

pytest_plugins = ["pytester"]
# The inner runs are in this process, and pytester drops the modules an inner run imported
# when it ends; NumPy's extension modules cannot be imported twice in one process, so the
# NumPy backend the inner runs judge on is loaded once, here, before any of them.
Backend("numpy")
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


def test_importing_the_plugin_loads_no_kernel_library_or_property(
    python_c: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """Loaded in every pytest run, the plugin imports neither torch/jax nor the properties."""
    code = (
        "import sys, attnspec.conformance.pytest_plugin as p; "
        "print(sorted(m for m in ('torch', 'jax', 'attnspec.conformance.judge.properties') "
        "if m in sys.modules))"
    )
    result = python_c(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_one_item_per_property_and_must_failures_fail(
    pytester: pytest.Pytester, kernel_file: Path
) -> None:
    """CONF-1, SDPA-2.1: items are named attnspec::ID[CLAUSE]; the unscaled kernel fails
    default-scale with its finding, counterexample and reproduction in the report."""
    result = pytester.runpytest(
        "--attnspec-kernel", f"{kernel_file}:no_default_scale", "--attnspec-only", CHEAP, "-v"
    )
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*collected 2 items*",
            "attnspec::default-scale?SDPA-2.1? FAILED*",
            "attnspec::explicit-scale?SDPA-2.2? PASSED*",
            "*FAILED default-scale ?SDPA-2.1 MUST*",
            "*inputs:  q(*",
            "*rerun:   pytest --attnspec-kernel *--attnspec-only default-scale",
            "*reproduction (runs on its own):*",
            "*DOES NOT CONFORM*",
        ]
    )


def test_correct_kernel_passes_and_unclaimed_is_skipped(
    pytester: pytest.Pytester, kernel_file: Path
) -> None:
    """CONF-3: a property the kernel does not claim is skipped with the reason."""
    result = pytester.runpytest(
        "--attnspec-kernel", f"{kernel_file}:without_scale", "--attnspec-only", CHEAP, "-rs"
    )
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*not applicable: the kernel does not claim scale*"])


def test_should_failure_is_a_warning_unless_strict(
    pytester: pytest.Pytester, kernel_file: Path, should_property: str
) -> None:
    """CONF-2: a failed SHOULD property passes with a pytest warning; strict fails it."""
    args = ("--attnspec-kernel", f"{kernel_file}:correct", "--attnspec-only", should_property)
    # Counted: the plugin's warning alone.  Under --rootdir=tests this process has imported
    # the test folders as modules named like attnspec's own top-level folders (conformance,
    # reference, ...), which the inner session marks for assertion rewriting and warns about.
    result = pytester.runpytest(*args, "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*AttnspecWarning*", "*test-double-should ?SDPA-8.2 SHOULD*"])
    pytester.runpytest(*args, "--attnspec-strict").assert_outcomes(failed=1)


def test_k_selects_properties(pytester: pytest.Pytester, kernel_file: Path) -> None:
    """-k works on property ids, like on any test."""
    result = pytester.runpytest(
        "--attnspec-kernel",
        f"{kernel_file}:correct",
        "--attnspec-only",
        CHEAP,
        "-k",
        "explicit",
        "-v",
    )
    result.assert_outcomes(passed=1, deselected=1)


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        ("{file}:missing", (), "has no attribute 'missing'"),
        ("{file}:two_arrays", (), "does not accept three positional arrays"),
        ("{file}:correct", ("--attnspec-only", "nope"), "unknown property id(s) nope"),
        ("{file}:correct", ("--attnspec-profile", "fast"), "profile='fast'"),
        ("{file}:correct", ("--attnspec-claim", "bias"), "should be KEY=VALUE"),
        ("{file}:correct", ("--attnspec-timeout", "5"), "they need --attnspec-isolate"),
        (
            "{file}:correct",
            ("--attnspec-isolate", "--attnspec-timeout", "0"),
            "--attnspec-timeout 0.0, but should be a positive number of seconds",
        ),
    ],
)
def test_bad_setup_is_a_usage_error(
    pytester: pytest.Pytester, kernel_file: Path, target: str, extra: tuple[str, ...], message: str
) -> None:
    """SDPA-1.1 and the plugin contract: a bad kernel or option stops pytest with a usage
    error (exit 4) and one clear line."""
    result = pytester.runpytest("--attnspec-kernel", target.format(file=kernel_file), *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(message in line for line in result.stderr.lines), result.stderr.str()


def test_plugin_takes_every_declaration_the_cli_takes(pytester: pytest.Pytester) -> None:
    """CONF-3: each declaration flag of ``attnspec check`` (the claims table) is
    a ``--attnspec-...`` option of the plugin, the booleans with their ``--attnspec-no-``."""
    from attnspec.conformance.claims import table as claims
    from attnspec.conformance.run import shared_flags as isolation

    help_text = pytester.runpytest("--help").stdout.str()
    for flag in (*claims.SETUP_FLAGS, *claims.CLAIM_FLAGS, *isolation.SUPERVISION_FLAGS):
        assert f"--attnspec-{flag.option[2:]}" in help_text, flag.option
        if flag.kind == "bool":
            assert f"--attnspec-no-{flag.option[2:]}" in help_text, flag.option
    assert "--attnspec-isolate" in help_text  # the CLI's default, the plugin's option


CRASHES_ON_EXPLICIT_SCALE = """
import ctypes
from attnspec.reference import scaled_dot_product_attention


def attention(q, k, v, *, mask=None, is_causal=False, scale=None):
    if scale is not None:
        ctypes.string_at(0)  # SIGSEGV
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
"""


def test_isolated_plugin_survives_a_crashing_kernel(pytester: pytest.Pytester) -> None:
    """CONF-5: with --attnspec-isolate the kernel runs in a worker process: a segfault
    fails the property that was running, and the pytest run goes on to the next one and
    its summary (run in a subprocess, so a regression cannot take this run down)."""
    path = pytester.makepyfile(crashing=CRASHES_ON_EXPLICIT_SCALE)
    result = pytester.runpytest_subprocess(
        "--attnspec-kernel",
        f"{path}:attention",
        "--attnspec-only",
        "explicit-scale,default-scale",
        "--attnspec-isolate",
        "--attnspec-timeout",
        "30",
        "-v",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "attnspec::explicit-scale?SDPA-2.2? FAILED*",
            "attnspec::default-scale?SDPA-2.1? PASSED*",
            "*killed by signal SIGSEGV*",
            "*rerun:   pytest --attnspec-kernel *--attnspec-isolate *--attnspec-timeout 30.0*",
            "*no conformance claim: 1 MUST property failed (CONF-1): explicit-scale",
        ]
    )


def _cli_statuses(argv: list[str], tmp_path: Path) -> dict[str, str]:
    import json

    from attnspec.conformance import cli

    path = tmp_path / "cli.json"
    cli.main([*argv, "--json", str(path)])
    outcome = {
        "passed": "PASSED",
        "failed": "FAILED",
        "not applicable": "SKIPPED",
        "waived": "SKIPPED",
        "warning": "PASSED",
    }
    return {v["property"]: outcome[v["status"]] for v in json.loads(path.read_text())["verdicts"]}


def test_same_kernel_same_properties_in_cli_and_plugin(
    pytester: pytest.Pytester, kernel_file: Path, tmp_path: Path
) -> None:
    """SDPA-2.1, SDPA-4.1: a (B, L, H, E) kernel with FlashAttention's causal=
    checked with --layout, --rename, --dtype and a claim flag gets the same verdict for
    every property from the CLI and from the plugin, and the plugin's rerun command repeats
    those declarations.  Both run the kernel in this process (the CLI with --no-isolate,
    the plugin's default): what is compared is how each reads the declarations, and a
    worker and a kernel process for the CLI cost ~1.8 s of CPU (an isolated run gives the
    same verdicts: test_strategies.py's isolated-and-in-process tests)."""
    only = "default-scale,explicit-scale,causal-zeros,mask-polarity,empty-rows-zero"
    declarations = ["layout", "blhd", "rename", "is_causal=causal", "dtype", "float64"]
    cli_args = [*(f"--{d}" if i % 2 == 0 else d for i, d in enumerate(declarations)), "--no-mask"]
    plugin_args = [
        *(f"--attnspec-{d}" if i % 2 == 0 else d for i, d in enumerate(declarations)),
        "--attnspec-no-mask",
    ]
    cli = _cli_statuses(
        [
            "check",
            f"{kernel_file}:blhd_no_default_scale",
            "--only",
            only,
            *cli_args,
            "--no-isolate",
        ],
        tmp_path,
    )
    result = pytester.runpytest(
        "--attnspec-kernel",
        f"{kernel_file}:blhd_no_default_scale",
        "--attnspec-only",
        only,
        *plugin_args,
        "-v",
    )
    plugin = {}
    for line in result.stdout.lines:
        if line.startswith("attnspec::") and " " in line:
            name, outcome = line.split()[:2]
            plugin[name.removeprefix("attnspec::").split("[")[0]] = outcome
    assert plugin == cli
    assert cli["causal-zeros"] == "PASSED" and cli["default-scale"] == "FAILED"
    assert cli["mask-polarity"] == "SKIPPED"
    rerun = next(line for line in result.stdout.lines if "rerun:" in line)
    assert " ".join(plugin_args) in rerun
    # the summary ends with the claim, or why there is none (CONF-1)
    result.stdout.fnmatch_lines(
        ["*no conformance claim: 1 MUST property failed (CONF-1): default-scale"]
    )


def _item_outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Each attnspec item's outcome from ``-v`` lines, serial ("attnspec::id[...] PASSED")
    or from xdist ("[gw0] [ 25%] PASSED attnspec::id[...]")."""
    outcomes = {}
    for line in result.stdout.lines:
        words = line.split()
        items = [w for w in words if w.startswith("attnspec::")]
        verdicts = [w for w in words if w in ("PASSED", "FAILED", "SKIPPED")]
        if len(items) == 1 and verdicts and not line.startswith(("FAILED", "PASSED")):
            outcomes[items[0]] = verdicts[0]
    return outcomes


def test_items_run_unchanged_under_xdist(pytester: pytest.Pytester, kernel_file: Path) -> None:
    """CONF-1, SDPA-2.1: under pytest-xdist (-n 2) every item gets the outcome
    it gets in a serial run (a failed MUST, passes, a skip for what is not claimed), and
    the controller prints the same summary and claim from its workers' verdicts.  The
    controller runs in this process (pytester's in-process run), its two workers in
    processes of their own, as pytest-xdist starts them: one pytest process fewer to
    start (~0.9 CPU-s); what the controller reports is its own session's, from its
    workers, not anything the serial run left in this process."""
    args = (
        "--attnspec-kernel",
        f"{kernel_file}:no_default_scale",
        "--attnspec-only",
        "default-scale,explicit-scale,causal-zeros,gqa-mapping",
        "-v",
        "-p",
        "no:cacheprovider",
    )
    serial = pytester.runpytest(*args)
    parallel = pytester.runpytest(*args, "-n", "2")
    expected = {
        "attnspec::default-scale[SDPA-2.1]": "FAILED",
        "attnspec::explicit-scale[SDPA-2.2]": "PASSED",
        "attnspec::causal-zeros[SDPA-4.1]": "PASSED",
        "attnspec::gqa-mapping[SDPA-6.1]": "SKIPPED",
    }
    assert _item_outcomes(serial) == expected
    assert _item_outcomes(parallel) == expected
    assert "2 workers [4 items]" in parallel.stdout.str()
    summary = [line for line in serial.stdout.lines if "result: DOES NOT CONFORM" in line]
    assert len(summary) == 1 and summary[0].split(" (")[0] in parallel.stdout.str()
    parallel.stdout.fnmatch_lines(
        ["*no conformance claim: 1 MUST property failed (CONF-1): default-scale"]
    )


def test_summary_lists_causes_with_the_failures_they_explain(
    pytester: pytest.Pytester,
) -> None:
    """Issues 9 and 38, as in the CLI: a kernel giving mean(V) for fully masked rows fails
    both items, and the summary names one cause (SDPA-5.1, established by a probe) with
    its evidence, the flag that would make it pass and both failures it explains."""
    result = pytester.runpytest(
        "--attnspec-kernel",
        "catalogue.bugs_softmax:finite_fill_jax_style",
        "--attnspec-only",
        "empty-rows-zero,rows-sum-to-one",
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "1 cause: 1 established by diagnosis probes, 0 found by the properties alone:",
            "cause 1: * mean(V)*SDPA-5.1*",
            "  evidence: *",
            "  hint: *--no-empty-rows-zero*",
            "  explains: empty-rows-zero ?SDPA-5.1?, rows-sum-to-one ?SDPA-7.1?",
            "*DOES NOT CONFORM*",
        ]
    )
