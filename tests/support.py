"""Helpers shared by the test modules (fixtures built on them live in conftest.py).

Plain functions, importable as ``support`` (``tests/`` is on ``pythonpath``): a conftest
module cannot be imported by name under ``--import-mode=importlib``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from catalogue.entry import CaughtBug, SpecCall, spec_kernel
from hypothesis import settings

from attnspec.backends import Backend, BackendError
from attnspec.conformance import check, cli
from attnspec.conformance.claims.declaration import KernelDeclaration
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, WARNING, Report, Verdict
from attnspec.conformance.run.property_runner import run_property
from attnspec.reference import scaled_dot_product_attention as reference_sdpa

TESTS = Path(__file__).resolve().parent  # on pythonpath: ``oracle``, ``catalogue``, ``support``
ROOT = TESTS.parent  # the checkout, which is the ``attnspec`` package
ATTNSPEC = str(Path(sys.executable).parent / "attnspec")  # the CLI of the venv under test
CHEAP = "default-scale,explicit-scale"  # closed-form probes: one small call per example
# Size caps for the tests whose subject is not the sizes drawn (a declaration, a hostile
# kernel, the report): every stratum and anchor still runs, cut to these caps
# (SizeLimits), so every property is still checked; uncapped, the anchors' upstream shapes
# (up to 2**15 queries) cost a whole-suite check of the NumPy reference ~55 s of CPU of its
# ~60 s, 6 s with these.  As keywords of ``check``, limits of ``run_property`` and
# ``attnspec check`` flags:
SMALL_SIZES = {"max_len": 64, "max_head_dim": 32, "max_batch_heads": 4}
SMALL_LIMITS = SizeLimits(**SMALL_SIZES)
SMALL_SIZE_FLAGS = tuple(
    token
    for name, cap in SMALL_SIZES.items()
    for token in (f"--{name.replace('_', '-')}", str(cap))
)

# The project's own Hypothesis tests: the same examples on every run (derandomize), no
# database (nothing learned in one run changes the next), no deadline (timings on a shared
# 2-core machine are not the property under test).  Each test states its example count.
DRAWN = settings(derandomize=True, database=None, deadline=None, print_blob=False)


def one_torch_thread() -> Iterator[None]:
    """Token loops of small torch ops: two threads per op cost up to 20 times one on a loaded
    machine.  Torch runs on one thread while the fixture made of this lives, and its thread
    count is restored after (``pytest.fixture(autouse=True, scope="module")(...)``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def drawn(max_examples: int) -> settings:
    """:data:`DRAWN` with a bounded number of generated examples (explicit ones run too)."""
    return settings(DRAWN, max_examples=max_examples)


# The XLA options of this test process's JAX (quick_jax_compiles).
QUICK_XLA_COMPILES = " ".join(
    ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
)
_started_quickly: list[bool] = []  # True once this process's JAX started with the options
# Whether XLA knows every option of XLA_FLAGS: it parses them all at its first
# DebugOptions (a CompileOptions here, from jaxlib alone) and exits on one it does not know,
# as it would where JAX starts its backends.  jaxlib alone: 0.15 CPU-s, against 1.4 for
# ``import jax; jax.devices()`` (JAX's own import), in every xdist worker that runs a JAX
# test; where jaxlib has no ``_jax`` module (another layout), JAX's backends are started.
PROBE_XLA_FLAGS = """
try:
    from jaxlib import _jax
except ImportError:
    import jax
    jax.devices()
else:
    _jax.CompileOptions()
"""


def jax_compiles_quickly() -> bool:
    """Whether this process's JAX started with :data:`QUICK_XLA_COMPILES`."""
    return bool(_started_quickly)


def quick_jax_compiles() -> None:
    """Start JAX's backends in this process with XLA's elemental emitters for CPU and
    each program's code generated in one piece.

    Why: the reference runs on JAX op by op, and JAX compiles every operation anew for
    each new shape and dtype; that XLA compilation was ~80% of the time of the JAX tests
    (profiled), and the JAX tests ~80% of tests/reference.  XLA's elemental emitters build
    the same one-operation programs in about two thirds of the CPU time of its fusion
    emitters (the default; measured on 100 eager operations, 5.0 -> 3.4 CPU-s); every
    check compares with its float64 oracle or TOL bound as before.  And each program is
    compiled as one LLVM module, not split into parts for parallel code generation
    (xla_cpu_parallel_codegen_split_count=1): splitting spreads a large program's code
    generation over threads at a cost in CPU, which the suite's two busy workers pay for
    no gain in time; a jitted kernel's backward programs took ~15% less CPU
    (test_backward_properties.py's JAX tests 28.0/29.8 -> 24.6/24.7 CPU-s), and their
    results were the same bit for bit (the jitted JAX kernel's output and jax.vjp
    gradients on 96 random problems, GQA, masks, biases, causal, bfloat16 and float32,
    lengths 1 to 2049; the reference's forward and backward op by op).  LLVM at -O0 would save
    a quarter more but changes what jitted code computes (no fused multiply-add: the
    upstream divergence pinned by test_large_logits_xla.py no longer shows), so it is not
    used.  Only this process: XLA reads the variable when JAX starts its backends, and it
    is removed right after, so the processes a check starts (kernel processes, CLI runs)
    compile a kernel under test in JAX's defaults.  Nothing is done where the user set
    XLA_FLAGS, JAX has started already, or this XLA does not know the options (probed
    first: XLA aborts on an unknown flag).  (test_backward_properties.py's test of the
    kernel's process gives that process the option too, on purpose: both routes alike.)

    Every lowering of this process also builds its module in one MLIR context
    (:func:`_lowering_in_one_mlir_context`), whatever XLA_FLAGS says."""
    if importlib.util.find_spec("jax") is None:
        return
    _lowering_in_one_mlir_context()
    if "XLA_FLAGS" in os.environ:
        return
    try:  # JAX's private module: where it moved, the compilations stay JAX's defaults
        from jax._src import xla_bridge

        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):
        return
    if started:
        return
    probe = subprocess.run(
        [sys.executable, "-c", PROBE_XLA_FLAGS],
        env={**os.environ, "XLA_FLAGS": QUICK_XLA_COMPILES},
        capture_output=True,
    )
    if probe.returncode != 0:
        return
    import jax

    os.environ["XLA_FLAGS"] = QUICK_XLA_COMPILES
    try:
        jax.devices()
        _started_quickly.append(True)
    finally:
        del os.environ["XLA_FLAGS"]


_shared_mlir_context: list[Any] = []  # the one MLIR context of this process's lowerings


def _lowering_in_one_mlir_context() -> None:
    """JAX lowers every program (each eager operation of a new shape or dtype, each jitted
    function) to an MLIR module in a context it makes anew, loading and registering every
    dialect again: ~16% of the CPU time of compiling an eager operation here (30 shapes of
    12 operations: 9.4-10.0 -> 7.9-8.4 CPU-s).  This process makes one and lowers every
    module in it.  What is lowered does not change: the modules' text, the compiled HLO,
    outputs and jax.vjp gradients were the same bit for bit with one context and with a
    context per lowering (jax 0.10.2, checked on jitted and eager attention).  A context
    only keeps uniqued types and attributes beyond its modules' lives: a few per shape.
    Only this process (the processes a check starts make theirs as JAX does); where JAX's
    private function moved, lowering stays JAX's default."""
    if _shared_mlir_context:
        return
    try:
        from jax._src.interpreters import mlir

        context = mlir.make_ir_context()
    except (ImportError, AttributeError):
        return
    _shared_mlir_context.append(context)

    def one_context() -> Any:
        return context

    mlir.make_ir_context = one_context


def backend_or_skip(name: str, config: dict[str, Any] | None = None) -> Backend:
    """The backend ``name``, or a skip that says why it is unusable here (not installed,
    no device): optional libraries are extras, so their absence is not a failure."""
    if name == "jax":
        quick_jax_compiles()
    try:
        return Backend(name, config=config)
    except BackendError as exc:
        pytest.skip(f"backend {name!r} unusable on this machine: {exc}")


def compiling(name: str = "numpy", compiles_per_shape: bool = True) -> Backend:
    """The backend ``name`` (skipped where unusable), its adapter saying that it compiles
    (or not) per shape: NumPy then draws from shape pools and observes weights in column
    blocks as JAX does, where runs cost no compilations; JAX with False takes the paths of
    backends that do not."""
    backend = backend_or_skip(name)
    backend._adapter = dataclasses.replace(backend._adapter, compiles_per_shape=compiles_per_shape)
    return backend


Shapes = tuple[tuple[int, ...], ...]


def recording(
    seen: list[Any],
    fn: Callable[..., Any] | None = None,
    *,
    record: Callable[..., Any] | None = None,
    **claims: Any,
) -> Callable[..., Any]:
    """``fn`` (default: the reference) as a kernel claiming a bias and GQA (and ``claims``)
    that appends to ``seen`` what ``record`` makes of every call's arguments (default: the
    (q, k, v) shapes)."""
    attention = reference_sdpa if fn is None else fn

    @spec_kernel(**{"bias": True, "gqa": True, **claims})
    def kernel(call: SpecCall) -> Any:
        if record is None:
            seen.append((tuple(call.q.shape), tuple(call.k.shape), tuple(call.v.shape)))
        else:
            seen.append(call.pass_to(record))
        return call.pass_to(attention)

    return kernel


def verdict_of(
    property_id: str,
    kernel: KernelUnderTest | Callable[..., Any],
    *,
    backend: Backend | str = "numpy",
    declaration: KernelDeclaration | None = None,
    **options: Any,
) -> Verdict:
    """The verdict of the registered property ``property_id`` on ``kernel``: a
    KernelUnderTest, or a function run on ``backend`` under ``declaration`` (none: it
    claims nothing optional).  ``options`` go to ``run_property`` (profile, seed, limits,
    shrink)."""
    if not isinstance(kernel, KernelUnderTest):
        chosen = backend_or_skip(backend) if isinstance(backend, str) else backend
        kernel = KernelUnderTest(kernel, chosen, declaration)
    return run_property(all_properties()[property_id], kernel, **options)


def family_verdicts(catalogue: ModuleType) -> dict[str, dict[str, str]]:
    """One quick-profile check on NumPy of every correct function of a family catalogue
    (its ``CORRECT``): its verdict per property, by name."""
    results = {}
    for fn in catalogue.CORRECT:
        report = check(fn, backend="numpy", profile="quick", seed=0)
        results[fn.__name__] = {v.property: v.status for v in report.verdicts}
    return results


def assert_bug_caught(bug: CaughtBug, *, seed: int | None = None) -> None:
    """A family catalogue's bug fails the property that names it on the quick profile (on
    NumPy): that property alone, in this process, the first failing example as found (the
    verdict is what is asserted, so it is not shrunk, as tests/catalogue/test_caught.py);
    a property of a SHOULD clause warns instead (CONF-2)."""
    verdict = verdict_of(bug.catches, bug.fn, profile="quick", seed=seed, shrink=False)
    assert verdict.status == (FAILED if verdict.level == "MUST" else WARNING), verdict.detail


def assert_family_passes(statuses: dict[str, str], prefix: str, name: str) -> None:
    """One kernel's verdicts: every property of its family (ids starting ``prefix``)
    passed, and no other property applies to it."""
    family = {p: s for p, s in statuses.items() if p.startswith(prefix)}
    assert family and set(family.values()) == {"passed"}, (name, family)
    others = {s for p, s in statuses.items() if not p.startswith(prefix)}
    assert others == {"not applicable"}, (name, others)


def hand_verdict(
    prop: str,
    clause: str,
    status: str = FAILED,
    *,
    detail: str | None = None,
    case: str | None = None,
    features: tuple[str, ...] = (),
) -> Verdict:
    """A verdict written by hand, for the rules that read reports (root causes, cells,
    divergence counts): level SHOULD for a warning, else MUST; detail "PROP broke"; a
    failure or warning found on ``case`` (default "q(1, 1, 1)")."""
    level = "SHOULD" if status == WARNING else "MUST"
    detail = f"{prop} broke" if detail is None else detail
    if case is None:
        case = "q(1, 1, 1)" if status in (FAILED, WARNING) else ""
    return Verdict(
        prop, clause, level, status, detail=detail, counterexample=case, features=list(features)
    )


def hand_report(verdicts: list[Verdict], backend: str = "numpy", **fields: Any) -> Report:
    """A report of kernel "k" on ``backend`` (quick profile, no seed) holding ``verdicts``;
    ``fields``: other :class:`Report` fields (``waived``, ...)."""
    return Report("k", backend, "cpu", "quick", None, False, verdicts=verdicts, **fields)


FLOATING_ARGUMENTS = ("q", "k", "v", "bias")


def on_backend(backend: Backend, problem: dict[str, Any], dtype: str) -> dict[str, Any]:
    """A problem of NumPy arrays as ``backend`` arrays: q, k, v, bias in ``dtype``, the mask
    boolean, ALiBi slopes in float32 (FlashAttention's convention); options unchanged."""
    moved = dict(problem)
    for name in FLOATING_ARGUMENTS:
        if name in problem:
            moved[name] = backend.asarray(problem[name], dtype=dtype)
    if "alibi_slopes" in problem:
        moved["alibi_slopes"] = backend.asarray(problem["alibi_slopes"], dtype="float32")
    if "mask" in problem:
        moved["mask"] = backend.asarray(problem["mask"])
    return moved


def as64(backend: Backend, a: Any) -> np.ndarray:
    """A backend array as float64 NumPy (exact: every dtype converts without rounding)."""
    return np.asarray(backend.to_numpy(a), dtype=np.float64)


def dtypes_checked(backend: Backend, float64: bool) -> tuple[str, ...]:
    """``backend.dtype_names``, less float64 on JAX unless ``float64``: the oracle tests'
    float64 subset for JAX (issue 33).

    Why: JAX compiles every operation anew per shape and dtype; float16 and bfloat16 are
    computed in float32 (SDPA-7.2), so they reuse float32's compilations, while float64
    compiles every operation again (~40% of a JAX oracle test's time).  The same code runs
    on every backend, and NumPy, PyTorch and array-api-strict check float64 on every case;
    JAX checks float64 on the cases a test marks (``float64=True``: at least one per test,
    covering its features) and every other dtype on every case."""
    names = backend.dtype_names
    if backend.name != "jax" or float64:
        return names
    return tuple(name for name in names if name != "float64")


def seen_by_kernel(backend: Backend, moved: dict[str, Any]) -> dict[str, Any]:
    """TOL-1: the float64 values the computation actually received."""
    seen = dict(moved)
    for name in (*FLOATING_ARGUMENTS, "alibi_slopes"):
        if name in moved:
            seen[name] = as64(backend, moved[name])
    if "mask" in moved:
        seen["mask"] = np.asarray(backend.to_numpy(moved["mask"]), dtype=bool)
    return seen


def kernel_file(directory: Path, name: str, source: str) -> Path:
    """``source`` written to ``directory/name``: a kernel module a test loads by its path."""
    path = directory / name
    path.write_text(source, encoding="utf-8")
    return path


def checked_with_the_kernel_in_its_own_process(
    target: str,
    *,
    backend: str,
    only: list[str] | None = None,
    limits: SizeLimits | None = None,
    dtypes: tuple[str, ...] | None = None,
    **claims: Any,
) -> Report:
    """``check(target, backend=backend, only=only, ...)`` judged in this process, the kernel
    loaded and called in a process of its own (:mod:`attnspec.conformance.run.remote_kernel`,
    held as an isolated check's judging worker holds it: ``worker.kernel_in_judge``): every
    call, a backward's "vjp" request included, crosses to that process and back as plain
    data, as in ``attnspec check``.  For the tests whose subject is the kernel's process
    boundary, not the judging worker's (test_supervisor's): the check's own worker process
    is left out, which spares a process start-up and an import of the kernel's library
    (~1.5 CPU-s for PyTorch).  The plan, properties, seeds and report are ``check``'s."""
    from attnspec.conformance.plan import execute, plan_run
    from attnspec.conformance.run.kernel_setup import KernelSetup
    from attnspec.conformance.run.supervisor import IsolatedKernel
    from attnspec.conformance.run.worker import kernel_in_judge, kernel_process_for

    setup = KernelSetup(target, backend, dtypes=dtypes, claims=claims)
    # what `attnspec check` sends its judging worker, and the kernel's process that worker
    # builds from it (worker.serve): the same arguments, from the one place that makes them
    start = IsolatedKernel(setup).worker_start()
    process = kernel_process_for(start)
    try:
        info, _ = process.start()
        kernel = kernel_in_judge(info, process, start.judge_setup.make_backend())
        return execute(plan_run(setup, only=only, limits=limits), kernel=kernel).report
    finally:
        process.end()


@dataclasses.dataclass(frozen=True)
class CheckRun:
    """What one ``attnspec check`` left: its exit status, stdout and stderr, the directory
    it ran in, and its report files by kind (json, junit, markdown)."""

    status: int
    out: str
    err: str
    cwd: Path
    reports: dict[str, Path]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``attnspec ARGV`` in this process: exit status, stdout, stderr."""
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def processes_in(directory: Path) -> list[int]:
    """Ids of live processes whose working directory is ``directory`` (leftover workers)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(entry / "cwd")) == directory:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def processes_left_in(directory: Path, within: float, but: Collection[int] = ()) -> list[int]:
    """:func:`processes_in` ``directory`` (less the ids ``but``) once ``within`` seconds
    have passed, or as soon as there are none: a process that ends within them is not
    left, one that is still there after them is."""
    deadline = time.monotonic() + within
    while True:
        found = [pid for pid in processes_in(directory) if pid not in but]
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


# Starts the CLI with SIGINT at its default action.  A process inherits an ignored SIGINT
# (pytest started as a background job of a non-interactive shell, as CI may start it:
# pytest-xdist's workers keep that disposition) and Python then installs no Ctrl-C handler,
# so a SIGINT sent to the check would be ignored, as it must be for a background job.  The
# interrupt tests model a check started from a terminal, where Ctrl-C reaches it.  (Not
# ``preexec_fn``: it can deadlock in a process with threads, as pytest-xdist's workers are.)
_EXEC_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def start_cli(args: list[str], cwd: Path, **popen: Any) -> subprocess.Popen[str]:
    """``attnspec *args`` in ``cwd``, text mode, receiving SIGINT as from a terminal."""
    return subprocess.Popen(
        [sys.executable, "-c", _EXEC_WITH_DEFAULT_SIGINT, ATTNSPEC, *args],
        cwd=cwd,
        text=True,
        **popen,
    )


def wait_for(path: Path, text: str, seconds: float = 120) -> None:
    """Until ``path`` exists and contains ``text``."""
    deadline = time.monotonic() + seconds
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{path} never said {text!r}"
        time.sleep(0.1)


# Small kernels for the command-line and plugin tests (one correct, the others each with
# one defect a property or the loader reports).
KERNELS = """
from attnspec.reference import scaled_dot_product_attention


def correct(q, k, v, *, mask=None, is_causal=False, scale=None):
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def no_default_scale(q, k, v, *, mask=None, is_causal=False, scale=None):
    # the bug: scores left unscaled when scale=None
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                        scale=1.0 if scale is None else scale)


def without_scale(q, k, v, *, mask=None, is_causal=False):
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)


def returns_text(q, k, v, *, mask=None, is_causal=False, scale=None):
    return "not an array"


def two_arrays(q, k):
    return q


NOT_CALLABLE = 3


def blhd_no_default_scale(q, k, v, *, mask=None, causal=False, scale=None):
    # (..., L, H, E) layout, FlashAttention's keyword name, and the scale bug
    from array_api_compat import array_namespace

    xp = array_namespace(q, k, v)
    swap = tuple(range(q.ndim - 3)) + (q.ndim - 2, q.ndim - 3, q.ndim - 1)
    out = no_default_scale(*(xp.permute_dims(a, swap) for a in (q, k, v)), mask=mask,
                           is_causal=causal, scale=scale)
    return xp.permute_dims(out, swap)
"""


def run_python(
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    unset: Collection[str] = (),
    **options: Any,
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` in a fresh interpreter (this one), its output captured as
    text and its exit status left to the caller; ``env`` adds to this process's variables
    and ``unset`` names those it goes without; ``options`` (cwd, timeout) go to
    ``subprocess.run``."""
    options.setdefault("timeout", 120)
    environ = {k: v for k, v in os.environ.items() if k not in unset} | (env or {})
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=environ,
        check=False,
        **options,
    )


def run_command(
    *argv: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    unset: Collection[str] = (),
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """``attnspec *argv`` in a real process in ``cwd``, with the variables ``env`` sets and
    without those ``unset`` names.  Its stderr goes through a temporary file, not a pipe
    (hostile kernels print megabytes); ``timeout`` only stops a test that hangs."""
    environ = {k: v for k, v in os.environ.items() if k not in unset} | (env or {})
    with tempfile.TemporaryFile("w+", errors="replace") as err:
        result = subprocess.run(
            [ATTNSPEC, *argv],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=cwd,
            timeout=timeout,
            env=environ,
        )
        err.seek(0)
        result.stderr = err.read()
    return result


def report_of(verdicts: list[Verdict], strict: bool = False) -> Report:
    """A report of ``verdicts``, as a quick check of ``m:f`` on NumPy would give it."""
    return Report("m:f", "numpy", "cpu", "quick", None, strict, verdicts)


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """The syntax tree of the file ``path``, parsed once per process for every caller (which
    only reads it).  Why: test_architecture.py's import graph, test_extras.py's imported
    libraries and test_project_rules.py's version and array-library checks each walk every
    module of the package, ~0.7 s of CPU a parse of it, and their files sort together, so
    they run one after the other in a worker.  Here, not in one of them: under
    ``--import-mode=importlib`` a test module imported by name is a second copy of it, with
    a cache of its own.  The trees take ~60 MB."""
    return ast.parse(path.read_text(encoding="utf-8"))
