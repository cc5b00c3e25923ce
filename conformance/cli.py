"""The ``attnspec`` command: check a kernel, list properties, survey backends, run the demo.

    attnspec check MODULE:FUNC [--backend torch] [--profile quick] [--bias] ...
    attnspec check path/to/file.py:FUNC --layout blhd --json report.json
    attnspec properties
    attnspec backends
    attnspec demo

Exit status: 0 when every applicable property passed (SHOULD warnings allowed unless
``--strict``), 1 when one failed, 2 on a usage or setup error (one line on stderr), when
a report file could not be written, or when the check was interrupted (Ctrl-C, SIGTERM:
the finished verdicts are printed and written, marked incomplete).

The kernel runs in a supervised worker process: a crash, exit or hang (longer than
``--timeout`` seconds per call) fails the property that was running, and the check goes
on.  ``--no-isolate`` runs it in this process instead, for debuggers.
"""

from __future__ import annotations

import argparse
import ast
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ..reference.masks import CAUSAL_ALIGNMENTS
from ..reference.sparse_sets import PATTERN_NAMES
from .api import KernelSetup, SetupError
from .declaration import LinearClaim, SparseClaim
from .isolation import DEFAULT_MEMORY_LIMIT_GIB, DEFAULT_TIMEOUT, IsolationOptions, open_session
from .kernel import KernelLoadError, load_kernel
from .layouts import LAYOUTS
from .registry import Property
from .report_files import (
    ReportFiles,
    interruption,
    signal_name,
    sigterm_interrupts,
    still_running,
)
from .runner import FAILED, PROFILES, WARNING, Report, Verdict

PROGRAM = "attnspec"
MAX_SHOWN_REPRODUCTION = 6000  # characters; longer ones are in the --json/--junit report
FEATURE_MAPS = ("elu+1", "relu", "favor+")
DEMO_KERNELS = (
    # (target, backend or None for the default, claims as CLI flags)
    ("torch.nn.functional:scaled_dot_product_attention", "torch", ()),
    ("attnspec.reference:scaled_dot_product_attention", None, ("--bias", "--gqa")),
)


class UsageError(Exception):
    """Bad command line: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --mask must never mean --mask-keyword
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _comma_list(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _literal(text: str) -> Any:
    """A CLI value: a Python/JSON literal (3, 0.5, True, [1, 2], null) or else the string."""
    lowered = {"true": True, "false": False, "null": None, "none": None}
    if text.lower() in lowered:
        return lowered[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def key_values(pairs: list[str] | None, option: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"{option} {pair!r}, but should be KEY=VALUE")
        result[key.strip()] = _literal(value)
    return result


def _alignment(text: str) -> str:
    return text.replace("-", "_")


@dataclass(frozen=True)
class Flag:
    """One option of ``attnspec check``; the table also rebuilds rerun commands."""

    option: str
    help: str
    kind: str = "value"  # value | list | switch (store_true) | bool (--x/--no-x)
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] = str
    metavar: str | None = None
    rerun: bool = True

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.kind == "bool":
            parser.add_argument(self.option, action=argparse.BooleanOptionalAction,
                                default=None, help=self.help)
        elif self.kind == "switch":
            parser.add_argument(self.option, action="store_true", help=self.help)
        else:
            parser.add_argument(
                self.option, action="append" if self.kind == "list" else "store",
                choices=self.choices, type=self.type, metavar=self.metavar, help=self.help,
            )

    def tokens(self, value: Any) -> list[str]:
        """The command-line tokens that give this flag ``value`` (none for the default)."""
        if value is None or (value is False and self.kind == "switch"):
            return []
        if self.kind == "bool":
            return [self.option if value else "--no-" + self.option[2:]]
        if self.kind == "switch":
            return [self.option]
        if self.kind == "list":
            return [token for item in value for token in (self.option, str(item))]
        return [self.option, str(value)]


RUN_FLAGS = (
    Flag("--backend", "array library to run on (numpy, torch, jax, cupy, array_api_strict); "
         "default: ATTNSPEC_BACKEND or numpy"),
    Flag("--device", "device on the backend, e.g. cpu, cuda:0; default: ATTNSPEC_DEVICE or the "
         "backend's default"),
    Flag("--dtype", "test only these dtypes (repeatable or comma list): float16, bfloat16, "
         "float32, float64", kind="list", metavar="DTYPE"),
    Flag("--profile", "examples per property: quick 20, default 100, thorough 1000 (default: "
         "quick)", choices=tuple(PROFILES)),
    Flag("--seed", "random seed; without it every run is derandomised and reproduces exactly",
         type=int, metavar="N"),
    Flag("--only", "run only these property ids (repeatable or comma list)", kind="list",
         metavar="ID", rerun=False),
    Flag("--skip", "skip these property ids (repeatable or comma list)", kind="list",
         metavar="ID", rerun=False),
    Flag("--strict", "SHOULD failures fail the check too (CONF-2)", kind="switch"),
    Flag("--timeout", "a kernel call (or the suite's work between two calls) taking longer "
         f"fails its property and the worker is restarted (default {DEFAULT_TIMEOUT:g})",
         type=float, metavar="SECONDS"),
    Flag("--memory-limit", "address space the worker may add after loading the backend "
         f"(default {DEFAULT_MEMORY_LIMIT_GIB:g}; 0: no limit; CPU devices only)", type=float,
         metavar="GIB"),
    Flag("--no-isolate", "run the kernel in this process (for debuggers): a crash, exit or "
         "hang of the kernel ends or stalls the check", kind="switch"),
    Flag("--json", "write the report as JSON to PATH", metavar="PATH", rerun=False),
    Flag("--junit", "write the report as JUnit XML to PATH", metavar="PATH", rerun=False),
    Flag("--markdown", "write the report as a Markdown table to PATH", metavar="PATH",
         rerun=False),
)
DECLARATION_FLAGS = (
    Flag("--layout", "the kernel's array layout: bhld (the spec's, default) or blhd "
         "(JAX/FlashAttention (..., L, H, E))", choices=LAYOUTS),
    Flag("--rename", "the kernel takes a spec keyword under another name, e.g. "
         "is_causal=causal, scale=softmax_scale", kind="list", metavar="SPEC=KERNEL"),
    Flag("--batch-ndim", "the kernel takes exactly this many leading batch dims (1 for "
         "(B, H, L, E) kernels; default: any number)", type=int, metavar="N"),
    Flag("--equal-head-dims", "the kernel needs Ev == E (FlashAttention 2, JAX); the suite "
         "pads q, k or v with exact zero columns", kind="switch"),
    Flag("--mask", "the kernel takes a boolean mask (default: read off its signature)",
         kind="bool"),
    Flag("--mask-keyword", "keyword of the boolean mask (default mask)", metavar="NAME"),
    Flag("--causal", "the kernel takes is_causal", kind="bool"),
    Flag("--causal-alignment", "what is_causal means when Lq != Lk: top_left (PyTorch/JAX) or "
         "bottom_right (FlashAttention >= 2.1)", choices=CAUSAL_ALIGNMENTS, type=_alignment),
    Flag("--scale", "the kernel takes scale=", kind="bool"),
    Flag("--bias", "the kernel takes an additive float bias", kind="bool"),
    Flag("--bias-keyword", "keyword of the bias (default bias; PyTorch: attn_mask)",
         metavar="NAME"),
    Flag("--mask-and-causal", "mask and is_causal may be passed together", kind="bool"),
    Flag("--gqa", "grouped-query attention: Hq a multiple of Hkv", kind="bool"),
    Flag("--gqa-keyword", "keyword set to True when Hq != Hkv (PyTorch: enable_gqa); implies "
         "--gqa", metavar="NAME"),
    Flag("--returns-weights", "the kernel returns (out, weights)", kind="bool"),
    Flag("--empty-rows-zero", "fully masked rows give 0 as the spec says (SDPA-5.1); "
         "--no-empty-rows-zero for kernels that give mean(V)", kind="bool"),
    Flag("--kwarg", "extra keyword passed on every call, e.g. dropout_p=0.0", kind="list",
         metavar="KEY=VALUE"),
    Flag("--sparse", "the kernel implements this sparse pattern (spec/sparse.md)",
         metavar="PATTERN"),
    Flag("--sparse-param", "a parameter of the sparse pattern (repeatable)", kind="list",
         metavar="KEY=VALUE"),
    Flag("--sparse-alignment", "causal alignment of the sparse pattern",
         choices=CAUSAL_ALIGNMENTS, type=_alignment),
    Flag("--sparse-causal", "the sparse pattern is causal", kind="switch"),
    Flag("--sparse-pass-params", "pass the pattern's parameters to the kernel as keywords",
         kind="switch"),
    Flag("--linear", "the kernel is linear attention with this feature map (spec/linear.md): "
         f"{', '.join(FEATURE_MAPS)}, or MODULE:FUNC of a feature-map callable",
         metavar="FEATURE_MAP"),
    Flag("--linear-num-features", "number of random features (FAVOR+)", type=int, metavar="M"),
    Flag("--linear-iid", "FAVOR+ features are iid, not orthogonal", kind="switch"),
    Flag("--linear-seed-keyword", "keyword the FAVOR+ seed is passed as (default seed)",
         metavar="NAME"),
    Flag("--linear-eps", "epsilon the kernel adds to its denominator", type=float,
         metavar="EPS"),
    Flag("--linear-causal-alignment", "causal alignment of the linear kernel",
         choices=CAUSAL_ALIGNMENTS, type=_alignment),
)
_BOOL_CLAIMS = ("mask", "causal", "scale", "bias", "mask_and_causal", "gqa", "returns_weights",
                "empty_rows_zero")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROGRAM, description="attnspec: check attention kernels against the "
                     "spec, clause by clause.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    check = commands.add_parser("check", help="check a kernel clause by clause",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("target", help="MODULE:FUNC or path/to/file.py:FUNC")
    running = check.add_argument_group("running")
    for flag in RUN_FLAGS:
        flag.add_to(running)
    claims = check.add_argument_group("what the kernel claims (overrides its declaration)")
    for flag in DECLARATION_FLAGS:
        flag.add_to(claims)
    commands.add_parser("properties", help="list every property: id, clause, level, summary")
    commands.add_parser("backends", help="the reference on every backend and dtype here")
    demo = commands.add_parser("demo", help="check PyTorch's SDPA and the reference itself")
    for flag in RUN_FLAGS:
        if flag.option in ("--profile", "--seed", "--only", "--skip", "--strict"):
            flag.add_to(demo)
    return parser


def claims_from(args: argparse.Namespace) -> dict[str, Any]:
    """Declaration overrides from the claim flags (only those given)."""
    claims: dict[str, Any] = {
        name: getattr(args, name) for name in _BOOL_CLAIMS if getattr(args, name) is not None
    }
    for name in ("mask_keyword", "bias_keyword", "causal_alignment", "batch_ndim"):
        if getattr(args, name) is not None:
            claims[name] = getattr(args, name)
    if args.equal_head_dims:
        claims["equal_head_dims"] = True
    if args.gqa_keyword is not None:
        claims["gqa_keyword"] = args.gqa_keyword
        claims.setdefault("gqa", True)
    if args.kwarg:
        claims["extra_kwargs"] = key_values(args.kwarg, "--kwarg")
    sparse_given = [f for f in ("sparse_param", "sparse_alignment", "sparse_causal",
                                "sparse_pass_params") if getattr(args, f)]
    if args.sparse is None and sparse_given:
        raise UsageError(f"--{sparse_given[0].replace('_', '-')} needs --sparse PATTERN")
    if args.sparse is not None and args.sparse not in PATTERN_NAMES:
        raise UsageError(
            f"--sparse {args.sparse!r} is not a spec pattern; expected one of "
            f"{', '.join(PATTERN_NAMES)}"
        )
    if args.sparse is not None:
        claims["sparse"] = SparseClaim(
            args.sparse, key_values(args.sparse_param, "--sparse-param"),
            alignment=args.sparse_alignment or "top_left", causal=args.sparse_causal,
            pass_params=args.sparse_pass_params,
        )
    linear_given = [f for f in ("linear_num_features", "linear_iid", "linear_seed_keyword",
                                "linear_eps", "linear_causal_alignment")
                    if getattr(args, f) not in (None, False)]
    if args.linear is None and linear_given:
        raise UsageError(f"--{linear_given[0].replace('_', '-')} needs --linear FEATURE_MAP")
    if args.linear is not None:
        claims["linear"] = LinearClaim(
            _feature_map(args.linear), args.linear_num_features, orthogonal=not args.linear_iid,
            seed_keyword=args.linear_seed_keyword or "seed", eps=args.linear_eps or 0.0,
            causal_alignment=args.linear_causal_alignment or "top_left",
        )
    return claims


def _feature_map(name: str) -> str | Callable[..., Any]:
    """A named feature map, or the callable ``MODULE:FUNC`` names (--linear)."""
    if name in FEATURE_MAPS:
        return name
    if ":" not in name:
        raise UsageError(
            f"--linear {name!r} is neither {', '.join(FEATURE_MAPS)} nor MODULE:FUNC"
        )
    try:
        return load_kernel(name)
    except KernelLoadError as exc:
        raise UsageError(f"--linear: {exc}") from None


def setup_from(args: argparse.Namespace) -> KernelSetup:
    rename = {key: str(value) for key, value in key_values(args.rename, "--rename").items()}
    dtypes = _comma_list(args.dtype)
    return KernelSetup(
        args.target, args.backend, args.device, args.layout or "bhld", rename,
        None if dtypes is None else tuple(dtypes), claims_from(args),
    )


def rerun_command(target: str, flags: Sequence[str], verdict: Verdict,
                  seed: int | None) -> str:
    """The one-line command that reruns just this property, with the same inputs."""
    tokens = [PROGRAM, "check", target, *flags, "--only", verdict.property]
    if seed is not None:
        tokens += ["--seed", str(seed)]
    return shlex.join(tokens)


def rerun_flags(args: argparse.Namespace) -> list[str]:
    """The flags of this run that matter for a rerun (no --only, --seed or output files)."""
    tokens: list[str] = []
    for flag in (*RUN_FLAGS, *DECLARATION_FLAGS):
        if flag.rerun and flag.option != "--seed":
            tokens += flag.tokens(getattr(args, flag.dest))
    return tokens


class ProgressDisplay:
    """One line per property on stderr: rewritten in place on a terminal, appended otherwise."""

    def __init__(self, total: int, stream: TextIO, label: str = "") -> None:
        self.total, self.stream, self.label = total, stream, label
        self.done = 0
        self.tty = stream.isatty()

    def __call__(self, prop: Property, verdict: Verdict | None) -> None:
        if verdict is not None:
            self.done += 1
        number = self.done + 1 if verdict is None else self.done
        position = f"[{number:>{len(str(self.total))}}/{self.total}]"
        if verdict is None:  # on a log, a property that hangs is the last one named
            start = f"{self.label}{position} {prop.id} ({prop.clause}) ..."
            self._write(f"\r\033[K{start}" if self.tty else start + "\n")
            return
        line = (f"{self.label}{position} {prop.id} ({prop.clause}): {verdict.status} "
                f"({verdict.seconds:.1f}s)")
        if not self.tty:
            self._write(line + "\n")
        elif verdict.status in (FAILED, WARNING):
            self._write(f"\r\033[K{line}\n")  # keep failures on screen
        else:
            self._write(f"\r\033[K{line}")
        if self.tty and self.done == self.total:
            self._write("\r\033[K")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def report_files(args: argparse.Namespace) -> ReportFiles:
    """The --json/--junit/--markdown files asked for, checked writable (SetupError if not)."""
    from . import report as render

    files = ReportFiles([(f"--{option}", getattr(args, option), to_text) for option, to_text
                         in (("json", render.to_json), ("junit", render.to_junit),
                             ("markdown", render.to_markdown))
                         if getattr(args, option) is not None])
    files.check_writable()
    return files


def isolation_from(args: argparse.Namespace) -> IsolationOptions | None:
    """The worker's supervision from --timeout/--memory-limit; None with --no-isolate."""
    timeout, memory = getattr(args, "timeout", None), getattr(args, "memory_limit", None)
    if getattr(args, "no_isolate", False):
        if timeout is not None or memory is not None:
            raise UsageError("--timeout and --memory-limit apply to the worker process; "
                             "--no-isolate has none")
        return None
    try:
        return IsolationOptions(DEFAULT_TIMEOUT if timeout is None else timeout,
                                DEFAULT_MEMORY_LIMIT_GIB if memory is None else memory)
    except ValueError as exc:
        raise UsageError(str(exc).replace("timeout=", "--timeout ").replace(
            "memory_limit_gib=", "--memory-limit ")) from None


def _run_one(setup: KernelSetup, args: argparse.Namespace, flags: Sequence[str],
             label: str = "", files: ReportFiles | None = None,
             ) -> tuple[Report, Callable[[Verdict], str], str]:
    """Run one kernel with a progress display: (report, rerun command maker, claim line).

    ``files`` are rewritten after every property.  Ctrl-C or SIGTERM ends the run early
    with the report marked incomplete (``report.incomplete``).
    """
    from .report import conformance_claim
    from .runner import new_report, run_each, select

    only, skip = _comma_list(args.only), _comma_list(args.skip)
    try:
        properties = select(only, skip)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    profile, seed, total = args.profile or "quick", args.seed, len(properties)
    with open_session(setup, isolation_from(args)) as session:
        kernel = session.start()
        report = new_report(kernel, profile=profile, seed=seed, strict=args.strict)

        def rerun(verdict: Verdict) -> str:
            return rerun_command(kernel.target, flags, verdict, seed)

        display = ProgressDisplay(total, sys.stderr, label)
        if files is not None:  # replaces any report of an earlier run at once
            files.write(report, rerun, incomplete=still_running(0, total))

        def progress(prop: Property, verdict: Verdict | None) -> None:
            display(prop, verdict)
            done = len(report.verdicts)
            if verdict is not None and files is not None and done < total:
                files.write(report, rerun, incomplete=still_running(done, total))

        try:
            run_each(properties, lambda p: session.run_property(p, profile=profile, seed=seed),
                     report, progress)
        except KeyboardInterrupt as exc:
            report.incomplete = interruption(exc, len(report.verdicts), total)
            print(f"\n{PROGRAM}: {report.incomplete}", file=sys.stderr)

    if report.incomplete:
        claim = "no conformance claim: the check is incomplete (CONF-6)"
    elif not report.conforms:
        claim = "no conformance claim: a MUST property failed (CONF-1)"
    elif only or skip:
        claim = "no conformance claim: only some properties ran (--only/--skip)"
    else:
        claim = conformance_claim(kernel.declaration, kernel.dtypes)
    return report, rerun, claim


def command_check(args: argparse.Namespace) -> int:
    from . import report as render

    files = report_files(args)
    setup = setup_from(args)
    report, rerun, claim = _run_one(setup, args, rerun_flags(args), files=files)
    files.write(report, rerun)
    print(render.format_table(report, rerun=rerun, max_reproduction=MAX_SHOWN_REPRODUCTION))
    print(claim)
    for error in files.errors.values():
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
    if report.incomplete or files.errors:
        return 2
    return 0 if report.conforms else 1


def command_properties(args: argparse.Namespace) -> int:
    from .registry import all_properties

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
        from ..backends.survey import format_survey, survey
    except ImportError as exc:
        raise SetupError(f"the backend survey is not available in this install ({exc})") from None
    print(format_survey(survey()))
    return 0


def command_demo(args: argparse.Namespace) -> int:
    """PyTorch's SDPA (when torch is installed) and the reference, quick profile.

    Exit 0 when every failure is a confirmed divergence written up in docs/divergences.md.
    """
    from ..backends import Backend, BackendError
    from .known_kernels import known_divergences
    from .report import format_table
    from .runner import FAILED, WARNING

    worst = 0
    for target, backend, flags in DEMO_KERNELS:
        if backend is not None:
            try:
                Backend(backend)
            except BackendError as exc:
                print(f"skipping {target}: {exc}\n")
                continue
        claims = {"bias": True, "gqa": True} if "--bias" in flags else {}
        setup = KernelSetup(target, backend, claims=claims)
        backend_flags = ["--backend", backend] if backend else []
        report, rerun, claim = _run_one(setup, args, [*backend_flags, *flags],
                                        label=f"{target.rpartition(':')[0]}: ")
        print(format_table(report, rerun=rerun, max_reproduction=MAX_SHOWN_REPRODUCTION,
                           full_reproduction_in="the JSON report of: "
                           "attnspec check ... --json PATH"))
        print(claim)
        if report.incomplete:
            return 2
        explained = known_divergences(setup.prepare().fn)
        unexplained = [v.property for v in report.verdicts
                       if v.status == FAILED and v.property not in explained]
        for verdict in report.verdicts:
            if verdict.status in (FAILED, WARNING) and verdict.property in explained:
                print(f"confirmed divergence, not a suite artefact: {verdict.property} "
                      f"[{verdict.clause}] -> {explained[verdict.property]}")
        print()
        worst = max(worst, 1 if unexplained else 0)
    return worst


COMMANDS = {"check": command_check, "properties": command_properties,
            "backends": command_backends, "demo": command_demo}


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


if __name__ == "__main__":
    sys.exit(main())
