"""The ``attnspec`` command: check a kernel, list properties, survey backends, run the demo.

    attnspec check MODULE:FUNC [--backend torch] [--profile quick] [--bias] ...
    attnspec check path/to/file.py:FUNC --layout blhd --json report.json
    attnspec properties
    attnspec backends
    attnspec demo

Exit status: 0 when every applicable property passed (SHOULD warnings allowed unless
``--strict``), 1 when one failed, 2 on a usage or setup error (one line on stderr), when
a report file could not be written, when the check was interrupted (Ctrl-C, SIGTERM:
the finished verdicts are printed and written, marked incomplete), or on an internal
error (a bug in attnspec, never a verdict on the kernel: its traceback is printed).

The kernel runs in a supervised worker process: a crash, exit or hang (longer than
``--timeout`` seconds per call) fails the property that was running, and the check goes
on.  ``--no-isolate`` runs it in this process instead, for debuggers; ``--jobs N`` runs
N worker processes at once (same verdicts, same order).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from .. import benchmarks
from .api import KernelSetup, SetupError, size_limits_from
from .call.side_effects import kernel_output_to
from .claims import table as claims
from .claims.flags import Flag, UsageError, comma_list
from .claims.loading import load_kernel
from .claims.table import CLAIM_FLAGS, SETUP_FLAGS
from .judge.registry import Property
from .judge.reproduce import (
    PROGRAM,
    REPRODUCTIONS_DIRECTORY,
    reproduction_file,
    reproductions_in,
    rerun_flags,
)
from .judge.verdict import FAILED, WARNING, Verdict
from .plan import REPORT_FORMATS, Execution, execute, plan_run
from .report.files import signal_name, sigterm_interrupts
from .run.property_runner import PROFILES
from .run.root_causes import divergences
from .run.shared_flags import SIZE_FLAGS, SUPERVISION_FLAGS
from .run.supervisor import IsolationOptions, isolation_options
from .run.worker_pool import MOST_DEFAULT_JOBS, parse_jobs

DEMO_KERNELS: tuple[tuple[str, str | None, dict[str, Any]], ...] = (
    # (target, backend or None for the default, claims)
    ("torch.nn.functional:scaled_dot_product_attention", "torch", {}),
    ("attnspec.reference:scaled_dot_product_attention", None, {"bias": True, "gqa": True}),
)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --mask must never mean --mask-keyword
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise UsageError(f"{message} (see '{self.prog} --help')")


RUN_FLAGS = (
    Flag(
        "--backend",
        "array library to run on (numpy, torch, jax, cupy, array_api_strict); "
        "default: ATTNSPEC_BACKEND or numpy",
    ),
    Flag(
        "--device",
        "device on the backend, e.g. cpu, cuda:0; default: ATTNSPEC_DEVICE or the "
        "backend's default",
    ),
    Flag(
        "--profile",
        "examples per property: quick (20 small + 6 anchors + 10 realistic; "
        "PyTorch's SDPA takes ~40 s of CPU), default (~5x), thorough (~50x); default: quick",
        choices=tuple(PROFILES),
    ),
    *SIZE_FLAGS,
    Flag(
        "--seed",
        "random seed; without it every run is derandomised and reproduces exactly",
        type=int,
        metavar="N",
    ),
    Flag(
        "--only",
        "run only these property ids (repeatable or comma list)",
        kind="list",
        metavar="ID",
        rerun=False,
    ),
    Flag(
        "--skip",
        "skip these property ids (repeatable or comma list)",
        kind="list",
        metavar="ID",
        rerun=False,
    ),
    Flag("--strict", "SHOULD failures fail the check too (CONF-2)", kind="switch"),
    Flag(
        "--kernel-output",
        "write what the kernel prints to PATH (default: stderr, so the "
        "table on stdout stays clean)",
        metavar="PATH",
        rerun=False,
    ),
    Flag(
        "--quiet",
        "no progress lines, and the kernel's printing is dropped (unless --kernel-output)",
        kind="switch",
        rerun=False,
    ),
    Flag(
        "--reproductions",
        "write reproductions too long to show into DIR, one PROPERTY.py each (default: "
        "attnspec-reproductions/ beside the --markdown/--junit report, else in the working "
        "directory; with --json they are in the JSON report)",
        metavar="DIR",
        rerun=False,
    ),
    *SUPERVISION_FLAGS,
    Flag(
        "--no-isolate",
        "run the kernel in this process (for debuggers): a crash, exit or "
        "hang of the kernel ends or stalls the check",
        kind="switch",
    ),
    Flag(
        "--jobs",
        "run properties in N worker processes at once, or 'auto' for one per "
        "available CPU; same verdicts, same order (default: ATTNSPEC_JOBS if set, else one "
        f"per CPU, at most {MOST_DEFAULT_JOBS}, on a CPU, 1 on an accelerator; 1 with "
        "--no-isolate); "
        "each worker's BLAS, OpenMP and PyTorch threads: CPUs // N, unless OMP_NUM_THREADS "
        "or another thread variable is set (the report's notes say which)",
        metavar="N",
        rerun=False,
    ),
    Flag("--json", "write the report as JSON to PATH", metavar="PATH", rerun=False),
    Flag("--junit", "write the report as JUnit XML to PATH", metavar="PATH", rerun=False),
    Flag("--markdown", "write the report as a Markdown table to PATH", metavar="PATH", rerun=False),
)
# How the kernel is called and what it claims: the claims table (claims/table.py), shared with
# the pytest plugin and the Python API.
DECLARATION_FLAGS = (*SETUP_FLAGS, *CLAIM_FLAGS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROGRAM,
        description="attnspec: check attention kernels against the spec, clause by clause.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    check = commands.add_parser(
        "check",
        help="check a kernel clause by clause",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("target", help="MODULE:FUNC or path/to/file.py:FUNC")
    running = check.add_argument_group("running")
    for flag in RUN_FLAGS:
        flag.add_to(running)
    declared = check.add_argument_group("what the kernel claims (overrides its declaration)")
    for flag in DECLARATION_FLAGS:
        flag.add_to(declared)
    commands.add_parser("properties", help="list every property: id, clause, level, summary")
    commands.add_parser("backends", help="the reference on every backend and dtype here")
    demo = commands.add_parser("demo", help="check PyTorch's SDPA and the reference itself")
    add_run_flags(demo, "--profile", "--seed", "--only", "--skip", "--strict", "--quiet", "--jobs")
    add_matrix_parser(commands)
    benchmarks.add_parser(commands)
    return parser


def add_run_flags(parser: argparse.ArgumentParser, *options: str) -> None:
    """The flags of ``attnspec check`` named ``options``, for a command that takes only
    those (same names, help and parsing)."""
    for flag in RUN_FLAGS:
        if flag.option in options:
            flag.add_to(parser)


def add_matrix_parser(commands: Any) -> None:
    matrix = commands.add_parser(
        "matrix",
        help="check every installed known kernel; write docs/matrix.md and a JSON",
        description="Check each known kernel (attnspec.conformance.kernels.known) that is "
        "installed here, in its own worker, and write the kernel x clause-family matrix with "
        "each kernel's distinct divergences.",
    )
    matrix.add_argument(
        "--kernel",
        action="append",
        metavar="NAME",
        help="only known kernels whose name contains NAME (repeatable)",
    )
    matrix.add_argument(
        "--markdown",
        default="docs/matrix.md",
        metavar="PATH",
        help="where to write the matrix (default docs/matrix.md)",
    )
    matrix.add_argument(
        "--json",
        default="docs/matrix.json",
        metavar="PATH",
        help="where to write it as JSON (default docs/matrix.json)",
    )
    matrix.add_argument(
        "--merge",
        action="append",
        metavar="JSON",
        help="take the checked rows of an earlier run's JSON (repeatable; a "
        "later file wins); with --merge only the --kernel kernels are run",
    )
    add_run_flags(
        matrix,
        *("--profile", "--seed", "--only", "--skip", "--quiet", "--timeout", "--memory-limit"),
        "--no-isolate",
    )
    matrix.add_argument(
        "--jobs",
        metavar="N",
        help="check N kernels at once, each in a process "
        "of its own, or 'auto' for one per available CPU (default 1)",
    )
    matrix.add_argument(
        "--backward",
        action="store_true",
        help="check the backward pass too (spec/backward.md) of every kernel whose library "
        "differentiates (torch, jax): its BWD column",
    )


def claims_from(args: argparse.Namespace) -> dict[str, Any]:
    """Declaration overrides from the claim flags (only those given)."""
    return claims.claims_from(lambda dest: getattr(args, dest))


def setup_from(args: argparse.Namespace) -> KernelSetup:
    return KernelSetup(
        args.target,
        args.backend,
        args.device,
        claims=claims_from(args),
        **claims.setup_from(lambda d: getattr(args, d)),
    )


class ProgressDisplay:
    """Progress on stderr.  On a terminal, one line rewritten in place: property n of N,
    the failures so far and the wall time elapsed.  Piped, or in CI (``CI`` set), plain
    lines: one as each property starts (so a log shows which one hangs) and one with its
    verdict, the failures so far and the elapsed time."""

    def __init__(
        self, total: int, stream: TextIO, label: str = "", *, clock: Any = time.monotonic
    ) -> None:
        self.total, self.stream, self.label = total, stream, label
        self.started = self.done = self.failed = self.warned = 0
        self.tty = stream.isatty() and not os.environ.get("CI")
        self.clock = clock
        self.began = clock()

    def __call__(self, prop: Property, verdict: Verdict | None) -> None:
        # a start is numbered by starts, an end by ends (with --jobs they interleave)
        if verdict is None:
            self.started += 1
        else:
            self.done += 1
            # a SHOULD clause's warning is not a failure: counted apart, not as a cascade
            self.failed += verdict.status == FAILED
            self.warned += verdict.status == WARNING
        elapsed = self.clock() - self.began
        if self.tty:
            running = f", running {prop.id}" if verdict is None else ""
            self._write(
                f"\r\033[K{self.label}property {self.done} of {self.total}, "
                f"{self._so_far()}, {elapsed:.0f}s elapsed{running}"
            )
            if self.done == self.total and verdict is not None:
                self._write("\r\033[K")
            return
        number = self.started if verdict is None else self.done
        position = f"[{number:>{len(str(self.total))}}/{self.total}]"
        if verdict is None:
            self._write(f"{self.label}{position} {prop.id} ({prop.clause}) ...\n")
            return
        self._write(
            f"{self.label}{position} {prop.id} ({prop.clause}): {verdict.status} "
            f"({verdict.seconds:.1f}s; {self._so_far()}, {elapsed:.0f}s elapsed)\n"
        )

    def _so_far(self) -> str:
        warned = f", {self.warned} warned" if self.warned else ""
        return f"{self.failed} failed{warned} so far"

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def report_paths(args: argparse.Namespace) -> dict[str, str | None]:
    """The --json/--junit/--markdown files asked for (checked by :func:`.plan.plan_run`)."""
    return {fmt: getattr(args, fmt, None) for fmt in REPORT_FORMATS}


def isolation_from(args: argparse.Namespace) -> IsolationOptions | None:
    """The worker's supervision from --timeout/--memory-limit; None with --no-isolate."""
    return isolation_options(
        not getattr(args, "no_isolate", False), lambda dest: getattr(args, dest, None)
    )


def jobs_from(args: argparse.Namespace) -> int | None:
    """Worker processes from --jobs (None, the default, when not given: plan.plan_run);
    UsageError for a bad value."""
    given = getattr(args, "jobs", None)
    if given is None:
        return None
    try:
        return parse_jobs(given, "--jobs")
    except ValueError as exc:
        raise UsageError(str(exc).replace("--jobs=", "--jobs ")) from None


def _run_one(
    setup: KernelSetup,
    args: argparse.Namespace,
    flags: Sequence[str],
    label: str = "",
    reports: dict[str, str | None] | None = None,
) -> Execution:
    """Run one kernel with a progress display (:func:`.plan.execute`).

    ``reports`` (--json/--junit/--markdown) are rewritten after every property.  Ctrl-C
    or SIGTERM ends the run early with the report marked incomplete
    (``report.incomplete``).  The kernel's printing goes to stderr, ``--kernel-output
    PATH`` or (``--quiet``) nowhere.
    """
    plan = plan_run(
        setup,
        profile=args.profile or "quick",
        seed=args.seed,
        only=comma_list(args.only),
        skip=comma_list(args.skip),
        strict=args.strict,
        limits=size_limits_from(lambda dest: getattr(args, dest, None)),
        isolation=isolation_from(args),
        jobs=jobs_from(args),
        reports=reports,
    )
    quiet = getattr(args, "quiet", False)
    display = None if quiet else ProgressDisplay(len(plan.properties), sys.stderr, label)
    with contextlib.ExitStack() as stack:
        stack.enter_context(kernel_output_to(_kernel_output(args, stack)))
        done = execute(plan, display, rerun_flags=flags, interruptible=True)
    if done.report.incomplete:
        print(f"\n{PROGRAM}: {done.report.incomplete}", file=sys.stderr)
    return done


def _kernel_output(args: argparse.Namespace, stack: contextlib.ExitStack) -> TextIO | None:
    """Where the kernel's printing goes: --kernel-output PATH, else stderr (None, nowhere,
    with --quiet); the file is closed with ``stack``."""
    path = getattr(args, "kernel_output", None)
    if path is None:
        return None if getattr(args, "quiet", False) else sys.stderr
    try:
        return stack.enter_context(open(path, "w", encoding="utf-8"))
    except OSError as exc:
        raise SetupError(f"--kernel-output {path!r}: {exc.strerror}") from None


def reproductions_directory(args: argparse.Namespace) -> Path:
    """Where reproductions too long to show go: --reproductions DIR, else
    attnspec-reproductions/ beside the first --markdown/--junit report, else in the working
    directory (never the temporary directory)."""
    if getattr(args, "reproductions", None):
        return Path(args.reproductions)
    beside = next(
        (getattr(args, fmt) for fmt in ("markdown", "junit") if getattr(args, fmt, None)), None
    )
    parent = Path(beside).parent if beside else Path()
    return parent / REPRODUCTIONS_DIRECTORY


def command_check(args: argparse.Namespace) -> int:
    from .kernels.known import target_write_ups
    from .report import render

    setup = setup_from(args)
    flags = rerun_flags((*RUN_FLAGS, *DECLARATION_FLAGS), lambda dest: getattr(args, dest))
    done = _run_one(setup, args, flags, reports=report_paths(args))
    report = done.report
    # a reproduction too long to show is in the JSON report, or else in a file of its own
    where = (
        f"the JSON report {args.json}"
        if args.json and not args.reproductions
        else reproductions_in(reproductions_directory(args))
    )
    print(
        render.format_table(
            report,
            rerun=done.rerun,
            full_reproduction_in=where,
            write_ups=target_write_ups(args.target),
        )
    )
    for error in done.file_errors.values():
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
    if report.incomplete or done.file_errors:
        return 2
    return 0 if report.conforms else 1


def command_properties(args: argparse.Namespace) -> int:
    from .judge.registry import all_properties

    rows = []
    for prop in all_properties().values():
        try:
            level = prop.level
        except KeyError:
            level = "? (clause not in the spec)"
        proves = " ".join((prop.check.__doc__ or "").split("\n\n")[0].split())
        rows.append((prop.id, prop.clause, level, prop.kind, proves))
    header = ("property", "clause", "level", "kind", "proves")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[4]]))
    return 0


def command_backends(args: argparse.Namespace) -> int:
    try:
        from ..benchmarks.survey import format_survey, survey
    except ImportError as exc:
        raise SetupError(f"the backend survey is not available in this install ({exc})") from None
    print(format_survey(survey()))
    return 0


def command_demo(args: argparse.Namespace) -> int:
    """PyTorch's SDPA (when torch is installed) and the reference, quick profile.

    Exit 0 when every failure is a confirmed divergence written up in docs/divergences.md.
    """
    from ..backends import Backend, BackendError
    from .judge.verdict import FAILED
    from .kernels.known import target_write_ups
    from .report.render import format_table

    worst = 0
    for target, backend, claimed in DEMO_KERNELS:
        if backend is not None:
            try:
                Backend(backend)
            except BackendError as exc:
                print(f"skipping {target}: {exc}\n")
                continue
        setup = KernelSetup(target, backend, claims=claimed)
        backend_flags = ["--backend", backend] if backend else []
        claim_flags = rerun_flags(CLAIM_FLAGS, claimed.get)
        done = _run_one(
            setup, args, [*backend_flags, *claim_flags], label=f"{target.rpartition(':')[0]}: "
        )
        report = done.report
        print(
            format_table(
                report,
                rerun=done.rerun,
                full_reproduction_in=reproduction_file,
                write_ups=target_write_ups(target),  # one block per write-up, as check's
            )
        )
        if report.incomplete:
            return 2
        # by name (the kernel is not loaded again); a write-up counts only for the failure
        # it describes (known_kernels.confirms, applied by root_causes.divergences)
        found = divergences(report, target_write_ups(target))
        for divergence in found:
            if divergence.write_up:
                print(
                    "confirmed divergence, not a suite artefact: "
                    f"{', '.join(divergence.properties)} [{divergence.clause}] -> "
                    f"{divergence.write_up}"
                )
        unexplained = [d for d in found if d.status == FAILED and not d.write_up]
        print()
        worst = max(worst, 1 if unexplained else 0)
    return worst


def _passed_on(args: argparse.Namespace, options: Sequence[str]) -> list[str]:
    """The matrix's ``options`` given, and its --only/--skip, as the command-line tokens of
    each kernel's check (in this process or in a worker of --jobs)."""
    tokens: list[str] = []
    for option in options:
        if getattr(args, option, None) is not None:
            tokens += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    for option in ("only", "skip"):
        for value in getattr(args, option) or ():
            tokens += [f"--{option}", value]
    return tokens


# The backends whose libraries differentiate a kernel (Backend.vjp): `matrix --backward`
# checks their kernels' gradients.
DIFFERENTIATING = ("torch", "jax")


def command_matrix(args: argparse.Namespace) -> int:
    """Every known kernel installed here through the suite; exit 0 unless a run broke."""
    import os
    import time

    from . import matrix
    from .kernels.known import KNOWN_KERNELS, KnownKernel, write_ups

    known = {entry.name: entry for entry in KNOWN_KERNELS}
    try:
        earlier = matrix.checked_rows(args.merge or ())
        entries = matrix.select(args.kernel) if args.kernel or not args.merge else []
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise SetupError(f"--merge: {exc}") from None
    isolation_from(args)  # --timeout or --memory-limit with --no-isolate: one usage error
    has_cuda = matrix.has_cuda_here()
    # each kernel's check in the matrix's process (--jobs N: in each kernel's process), not in
    # a worker of its own
    in_process = ["--no-isolate"] if args.no_isolate else []

    interrupted: list[str] = []  # Ctrl-C or SIGTERM ends the matrix, not just one kernel

    def check(entry: KnownKernel) -> matrix.MatrixRow:
        if interrupted:
            return matrix.MatrixRow(
                entry.name,
                entry.backend,
                entry.device,
                entry.note,
                matrix.NOT_SELECTED,
                reason=f"not run: {interrupted[0]}",
            )
        tokens = [
            "check",
            entry.name,
            "--profile",
            args.profile or "quick",
            "--backend",
            entry.backend,
            *(["--device", "cuda"] if entry.device == "cuda" else []),
            *_passed_on(args, ("seed", "timeout", "memory_limit")),
            *(["--backward"] if args.backward and entry.backend in DIFFERENTIATING else []),
        ]
        # one worker per kernel: the matrix's own --jobs checks kernels side by side
        own = ["--jobs", "1", *(["--quiet"] if args.quiet else []), *in_process]
        check_args = build_parser().parse_args([*tokens, *own])
        print(
            f"{PROGRAM} matrix: checking {entry.name} ({entry.backend})",
            file=sys.stderr,
            flush=True,
        )
        saved = {key: os.environ.get(key) for key, _ in entry.env}
        os.environ.update(dict(entry.env))  # the worker inherits it (KERAS_BACKEND)
        started = time.perf_counter()
        try:
            report = _run_one(
                setup_from(check_args), check_args, tokens[1:], label=f"{entry.name}: "
            ).report
        except SetupError as exc:
            return matrix.MatrixRow(
                entry.name,
                entry.backend,
                entry.device,
                entry.note,
                matrix.SETUP_FAILED,
                reason=str(exc),
            )
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        if report.incomplete:
            interrupted.append(
                f"the matrix was {report.incomplete.split(' after ')[0]} "
                f"while checking {entry.name}"
            )
        return matrix.row_from_report(
            entry, report, write_ups(entry), time.perf_counter() - started
        )

    try:
        jobs = parse_jobs(args.jobs, "--jobs")
    except ValueError as exc:
        raise UsageError(str(exc).replace("--jobs=", "--jobs ")) from None
    checkable = [e for e in entries if matrix.unavailable(e, has_cuda) is None]
    if jobs > 1 and len(checkable) > 1:
        options = [
            *(["--quiet"] if args.quiet else []),
            *(["--backward"] if args.backward else []),
            *in_process,
            *_passed_on(args, ("profile", "seed", "timeout", "memory_limit")),
        ]
        done = {
            row.name: row for row in matrix.rows_in_processes(checkable, jobs, options, has_cuda)
        }
        rows = matrix.build_rows(entries, lambda entry: done[entry.name], has_cuda)
    else:
        rows = matrix.build_rows(entries, check, has_cuda)
    earlier = {
        name: matrix.relink(row, write_ups(known[name]))
        for name, row in earlier.items()
        if name in known
    }
    rows += [matrix.unselected_row(e, earlier, has_cuda) for e in KNOWN_KERNELS if e not in entries]
    order = [e.name for e in KNOWN_KERNELS]
    rows.sort(key=lambda row: order.index(row.name))
    for path, text in (
        (args.markdown, matrix.to_markdown(rows)),
        (args.json, matrix.to_json(rows)),
    ):
        try:
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as exc:
            raise SetupError(f"cannot write {path!r}: {exc.strerror}") from None
    print(matrix.summary(rows))
    return 0


COMMANDS = {
    "check": command_check,
    "matrix": command_matrix,
    "properties": command_properties,
    "backends": command_backends,
    "demo": command_demo,
    "bench": benchmarks.command_using(load_kernel),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``attnspec`` command; returns the exit status."""
    parser = build_parser()
    try:
        with sigterm_interrupts():
            args = parser.parse_args(argv)
            if args.command is None:
                parser.print_help()
                return 2
            return COMMANDS[args.command](args)
    except (UsageError, SetupError) as exc:
        print(f"{PROGRAM}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # outside a run (loading the kernel, writing reports)
        print(f"\n{PROGRAM}: interrupted by {signal_name(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `attnspec properties | head`: the reader has what it wanted
        return _reader_gone()
    except Exception as exc:  # the kernel's own exceptions are verdicts: this is attnspec's
        traceback.print_exc()
        print(
            f"{PROGRAM}: internal error: {type(exc).__name__}: {exc} (a bug in attnspec, not "
            "a verdict on the kernel; please report it with the traceback above)",
            file=sys.stderr,
        )
        return 2


def _reader_gone() -> int:
    """Exit status 2 (the command did not finish: docs/checking-your-kernel.md, section 5)
    without a traceback: stdout goes to the null device first, or Python's flush of it at
    exit raises the same error again."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    return 2


if __name__ == "__main__":
    sys.exit(main())
