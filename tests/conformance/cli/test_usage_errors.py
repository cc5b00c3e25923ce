"""Usage and setup errors of ``attnspec``: exit status 2, one line, no traceback; no
command prints the help.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import run_command, run_main

# The options below that only the kernel's setup judges (the backend, its dtypes, the FAVOR+
# bound, --jax-x64) are judged by the same KernelSetup.prepare in this process as in the
# kernel's own, with the same one line (compared on the command): they run --no-isolate,
# without the judging worker and kernel process a check starts (~0.3 CPU-s a row).  How a
# setup error comes back from the kernel's process as that one line is shown by the rows of
# bad targets and signatures, which keep the kernel in its own process.
IN_PROCESS = "--no-isolate"


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
        (["check", "{kernels}:correct", "--backend", "nonsense", IN_PROCESS], "backend 'nonsense'"),
        (["check", "{kernels}:correct", "--profile", "fast"], "argument --profile"),
        (["check", "{kernels}:correct", "--dtype", "int8", IN_PROCESS], "dtype int8 is not one of"),
        (
            ["check", "{kernels}:correct", "--backend", "numpy", "--dtype", "bfloat16", IN_PROCESS],
            "no dtype to test",
        ),
        (["check", "{kernels}:correct", "--sparse-param", "window=2"], "needs --sparse"),
        (["check", "{kernels}:correct", "--kwarg", "oops"], "should be KEY=VALUE"),
        (["check", "{kernels}"], "should be MODULE:FUNC"),
        (["check", "{kernels}:correct", "--json", "/no/such/dir/r.json"], "does not exist"),
        # LIN-6.2 cannot be derived for m <= 4 n (e^(1/4) - 1) = 18.2 with n = 16 keys
        (
            [
                *("check", "{kernels}:correct", "--linear", "favor+"),
                *("--linear-num-features", "16", IN_PROCESS),
            ],
            "it needs m >= 19",
        ),
        (
            ["check", "{kernels}:correct", "--backend", "numpy", "--jax-x64", IN_PROCESS],
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


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(capsys)
    assert status == 2 and "check" in out and "demo" in out


def test_unknown_sparse_pattern_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SPARSE-1.1: --sparse takes only the spec's pattern names (exit 2, one line)."""
    kernel = tmp_path / "k.py"
    kernel.write_text("def attention(q, k, v, *, scale=None):\n    return q\n")
    status, _, err = run_main(capsys, "check", f"{kernel}:attention", "--sparse", "window")
    assert status == 2 and "not a spec pattern" in err and "sliding_window" in err
