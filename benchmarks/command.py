"""``attnspec bench``: time and memory of the reference against PyTorch SDPA (and JAX's
own kernel), and of your kernel against both.

    attnspec bench                      # dense, sparse, linear: L = 256 .. 32768 (~1 hour)
    attnspec bench --quick              # tiny sizes, seconds: checks that everything runs
    attnspec bench --backends torch --sections dense --sizes 1024,4096
    attnspec bench --sections long --backends torch   # L = 131072, causal: time, memory
    attnspec bench mypkg:kernel --backends torch      # your kernel at the suite's shapes
    attnspec bench --sections check     # what one quick `attnspec check` costs (~4 min)

``MODULE:FUNC`` (or ``path/to/file.py:FUNC``) is called as the suite calls a kernel:
``fn(q, k, v, mask=..., is_causal=...)`` on arrays of the first of ``--backends`` in the
(..., heads, length, head_dim) layout; it runs the kernel section only (unless
``--sections`` says more).  Writes ``OUT/bench.json`` (schema in
:mod:`attnspec.benchmarks.report`) and, when matplotlib is installed, one figure per
section with a JSON of its numbers beside it (``bench-dense.png`` and
``bench-dense.json``, ...; the check section has no figure; its checks' JSON reports go
to ``OUT/check-reports/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ..backends import Backend, BackendError
from . import check_cost, frameworks, suites
from .measure import Measurement, gemm_gflops
from .plots import matplotlib_missing, write_figures
from .report import document

SECTIONS: dict[str, Callable[..., list[Measurement]]] = {
    "dense": suites.dense,
    "sparse": suites.sparse,
    "linear": suites.linear,
}
# Run when asked for: a very long row (minutes), a user's kernel, and the cost of
# `attnspec check` itself (benchmarks/check_cost.py, not a measurement of the reference).
LONG, KERNEL, CHECK = "long", "kernel", "check"
ALL_SECTIONS = (*SECTIONS, LONG, KERNEL, CHECK)
DEFAULT_BACKENDS = ("numpy", "torch", "jax")


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(t) for t in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of ints"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: lengths should be ints >= 1")
    return sizes


def add_parser(commands: Any) -> None:
    """The ``bench`` subcommand of the ``attnspec`` command."""
    bench = commands.add_parser(
        "bench",
        help="time and memory of the reference against "
        "torch/jax kernels; writes JSON and PNG plots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "kernel",
        nargs="?",
        help="MODULE:FUNC or path/to/file.py:FUNC: time your kernel against the reference and "
        "PyTorch SDPA at the suite's realistic shapes (the kernel section)",
    )
    bench.add_argument("--quick", action="store_true", help="tiny sizes (for tests)")
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="directory for bench.json and the PNGs (default: bench-results)",
    )
    bench.add_argument(
        "--backends",
        type=_names,
        default=list(DEFAULT_BACKENDS),
        help="dense section: comma-separated backends (default: numpy,torch,jax, those installed)",
    )
    bench.add_argument(
        "--scaling-backends",
        type=_names,
        default=["numpy"],
        help="sparse and linear sections: backends (default: numpy)",
    )
    bench.add_argument(
        "--sections",
        type=_names,
        default=None,
        help=f"comma-separated, of {','.join(ALL_SECTIONS)} (default: {','.join(SECTIONS)}, "
        "or kernel when a kernel is given; check runs on its own, on a quiet machine with no "
        "thread limits)",
    )
    bench.add_argument("--sizes", type=_sizes, help="dense lengths of every case, e.g. 1024,4096")
    bench.add_argument(
        "--cases",
        type=_names,
        help="dense cases, comma-separated, of "
        + ",".join(c.name.replace(" ", "_") for c in suites.DENSE_CASES)
        + " (default: all)",
    )
    bench.add_argument("--long-length", type=int, help="the long section's length (default 131072)")
    bench.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")


def _backend_info(backend: Backend, config: suites.BenchConfig) -> dict[str, Any]:
    return {
        "version": frameworks.library_version(backend),
        "device": str(backend.device),
        "threads": frameworks.threads(backend),
        "gemm_gflops": gemm_gflops(backend, config.dtype, config.gemm_size, repeats=config.repeats),
        "memory_method": frameworks.MemoryProbe(backend).method,
    }


def _write(out: Path, doc: dict[str, Any]) -> None:
    (out / "bench.json").write_text(json.dumps(doc, indent=1) + "\n")


def _save_checks(
    args: argparse.Namespace,
    config: suites.BenchConfig,
    info: dict[str, dict[str, Any]],
    measurements: list[Measurement],
    checks: list[dict[str, Any]],
) -> None:
    from .._version import __version__

    _write(args.out, document(config, args.quick, info, measurements, __version__, checks))


Loader = Callable[[str], Callable[..., Any]]


def run(
    args: argparse.Namespace,
    log: Callable[[str], None] = print,
    load: Loader | None = None,
) -> dict[str, Any]:
    """Measure what ``args`` asks for; returns the document (also written to ``args.out``).
    ``load`` imports ``args.kernel`` (the CLI passes the suite's loader)."""
    from .._version import __version__

    kernel_target = getattr(args, "kernel", None)
    if args.sections is None:
        args.sections = [KERNEL] if kernel_target else list(SECTIONS)
    if KERNEL in args.sections and not kernel_target:
        raise ValueError("--sections kernel: name the kernel, attnspec bench MODULE:FUNC")
    user_kernel = None
    if kernel_target:
        if load is None:
            raise ValueError(f"cannot load {kernel_target!r}: no kernel loader given")
        user_kernel = load(kernel_target)
        if KERNEL not in args.sections:
            args.sections = [*args.sections, KERNEL]
    unknown = sorted(set(args.sections) - set(ALL_SECTIONS))
    if unknown:
        raise ValueError(
            f"--sections: unknown {', '.join(unknown)}; expected of {', '.join(ALL_SECTIONS)}"
        )
    config = suites.QUICK if args.quick else suites.FULL
    if args.sizes:
        config = dataclasses.replace(config, sizes=args.sizes, case_sizes=args.sizes)
    if args.cases:
        names = {c.name.replace(" ", "_"): c.name for c in suites.DENSE_CASES}
        wrong = sorted(set(args.cases) - set(names))
        if wrong:
            raise ValueError(f"--cases: unknown {', '.join(wrong)}; expected of {', '.join(names)}")
        config = dataclasses.replace(config, cases=tuple(names[n] for n in args.cases))
    if args.long_length:
        config = dataclasses.replace(config, long_length=args.long_length)
    if args.threads:
        frameworks.set_threads(args.threads)
    backends: dict[str, Backend] = {}
    info: dict[str, dict[str, Any]] = {}
    needed = [
        *(args.backends if {"dense", LONG} & set(args.sections) else []),
        *(args.backends[:1] if KERNEL in args.sections else []),
        *(args.scaling_backends if {"sparse", "linear"} & set(args.sections) else []),
    ]
    for name in dict.fromkeys(needed):
        try:
            backends[name] = Backend(name)
        except (BackendError, ValueError) as exc:
            log(f"backend {name}: not measured ({exc})")
            continue
        info[name] = _backend_info(backends[name], config)
        log(
            f"backend {name} {info[name]['version']} on {info[name]['device']}: GEMM "
            f"{config.gemm_size}^2 {config.dtype} {info[name]['gemm_gflops']:.1f} GFLOP/s"
        )
    measurements: list[Measurement] = []
    checks: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    for section in args.sections:
        if section == CHECK:
            log("check: quick-profile `attnspec check` runs, one after the other:")
            checks = check_cost.check(
                check_cost.QUICK if args.quick else check_cost.FULL,
                args.out,
                log,
                partial(_save_checks, args, config, info, list(measurements)),
            )
            continue
        names = args.backends if section in ("dense", LONG) else args.scaling_backends
        if section == KERNEL:
            names = args.backends[:1]
        for name in names:
            if name in backends:
                log(f"{section} on {name}:")
                if section == KERNEL:
                    assert user_kernel is not None and kernel_target is not None
                    measured = suites.kernel(
                        config, backends[name], log, user_kernel, kernel_target
                    )
                elif section == LONG:
                    measured = suites.long(config, backends[name], log)
                else:
                    measured = SECTIONS[section](config, backends[name], log)
                measurements += measured
                # the GEMM again after each part: the peak is the best seen in the run
                info[name]["gemm_gflops"] = max(
                    info[name]["gemm_gflops"],
                    gemm_gflops(
                        backends[name], config.dtype, config.gemm_size, repeats=config.repeats
                    ),
                )
                # written after every part, so that an interrupted run keeps what it measured
                _write(
                    args.out, document(config, args.quick, info, measurements, __version__, checks)
                )
    doc = document(config, args.quick, info, measurements, __version__, checks)
    _write(args.out, doc)
    log(f"wrote {args.out / 'bench.json'}")
    missing = matplotlib_missing()
    if missing:
        log(f"no plots: {missing}")
    else:
        for path in write_figures(doc, args.out):
            log(f"wrote {path}")
    for target in doc["targets"]:
        verdict = {True: "met", False: "NOT met", None: target["how"]}[target["met"]]
        value = "-" if target["value"] is None else f"{target['value']:.3g}"
        log(f"target: {target['name']}: {value} (limit {target['limit']:.3g}) {verdict}")
    return doc


def command_using(load: Loader) -> Callable[[argparse.Namespace], int]:
    """:func:`command` with ``load`` as the kernel loader (the CLI passes the suite's)."""
    return partial(command, load=load)


def command(args: argparse.Namespace, load: Loader | None = None) -> int:
    """``attnspec bench``; ``load`` imports a ``MODULE:FUNC`` kernel (the CLI's loader)."""
    try:
        run(args, load=load)
    except ValueError as exc:
        print(f"attnspec bench: error: {exc}", file=sys.stderr)
        return 2
    return 0
