"""Shared fixtures: one parameter per backend, skipped with the reason it is unusable."""

from __future__ import annotations

import gc
import os
from collections.abc import Generator, Iterator

import pytest
from bound_memo import bounds_remembered
from bytecode_prefix import prefix_filled_from_installed_bytecode
from clause_selection import select_by_clause
from forgery_guard import undo_forgery_in_this_process
from numpy._core.multiarray import _set_madvise_hugepage
from support import ROOT, backend_or_skip, quick_jax_compiles

from attnspec.backends import BACKEND_NAMES, REFERENCE_CONFIG, Backend
from attnspec.conformance.judge.properties import shapes
from attnspec.conformance.run.supervisor import THREAD_VARIABLES, worker_threads
from attnspec.conformance.run.worker_pool import JOBS_VARIABLE


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--clause",
        action="append",
        default=[],
        metavar="ID",
        help="only the tests that cite this spec clause or section (e.g. SDPA-4.2, SDPA-4); "
        "repeatable",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    select_by_clause(config, items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The cyclic garbage collector kept off what lives for the whole run and run less
    often: after collection (the libraries, the test modules, their parameters imported)
    everything alive is frozen (``gc.freeze``: no full collection looks at it again), and a
    young collection runs every 7000 net allocations of container objects, not 700.  Why:
    the suite's property runs allocate Hypothesis's bookkeeping by the million, most freed
    at once by reference counting, and every full collection walked the ~0.6 million
    objects alive (torch's among them once loaded): 6.0 CPU-s of collections in one process
    running tests/catalogue/test_correct_pass.py and test_caught.py, 3.3 with this (4.1 ->
    1.0 of it full collections), the same peak memory (1.31 GB).  What any test checks is
    unchanged; garbage in cycles is still collected, later (a thousand young objects' worth
    more at a time).  A threshold the user set higher stands."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, 7000), middle, old)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's BLAS, OpenMP and PyTorch pools get CPUs // workers
    threads, as ``attnspec check --jobs`` gives its workers (isolation.worker_threads; a
    thread variable the user set stands).  Set here, in the controller before it starts the
    workers, so that they (and the checks they start) read it when NumPy or PyTorch load.
    Why: with every worker starting a thread per core, 2 workers on 2 cores ran OpenBLAS's
    spinning threads 2x oversubscribed, a small matmul 20x slower (39 ms, not 2 ms, for
    (1, 4, 128, 64) @ its transpose on the shared machine); the same tests, no check weaker.
    """
    in_worker = "PYTEST_XDIST_WORKER" in os.environ
    _quieter_runs(starts_workers=bool(getattr(config.option, "tx", None)) and not in_worker)
    # One worker per check unless a test asks for more: the default (one per CPU) starts a
    # second worker process for every small check of the suite's own tests, which made
    # them ~1.8x slower on 2 cores; tests/conformance/test_worker_pool.py checks the default.
    os.environ.setdefault(JOBS_VARIABLE, "1")
    workers = len(getattr(config.option, "tx", None) or ())
    if workers > 1 and "PYTEST_XDIST_WORKER" not in os.environ:
        chosen = worker_threads(workers)
        os.environ.update({name: chosen[name] for name in THREAD_VARIABLES if name in chosen})


def _quieter_runs(starts_workers: bool) -> None:
    """Two settings of this process and every process it starts (xdist workers, the checks'
    workers and kernel processes, the CLI runs), each kept where the user set it; what any
    test checks is unchanged, only the machine's work is.

    NumPy asks the kernel for transparent huge pages on every buffer of 4 MiB or more
    (NUMPY_MADVISE_HUGEPAGE); where THP defrag is "madvise" (a common default, this
    machine's) each such fault may compact memory first, in system time: a quick check of
    the reference took 33 s of CPU with it and 20 s without (14 s and 4.5 s of it system
    time) at load 11, causal-alignment and batch-broadcast alone 5.3 s against 2.7 s.

    Hypothesis caches the constants it collects from local source files (attnspec's, the
    tests') in its storage directory; a check keeps that in a temporary directory of its
    own (call/side_effects.py, unless HYPOTHESIS_STORAGE_DIRECTORY is set), so every fresh
    process that draws (a CLI run, a --jobs worker) parsed every local module again.  One
    directory for every process, the checkout's .cache/hypothesis (ignored by git, beside
    pip's and mypy's caches), has each file parsed once.
    """
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    # NumPy is loaded already (a plugin imports it): it read the variable at import
    _set_madvise_hugepage(os.environ["NUMPY_MADVISE_HUGEPAGE"] != "0")
    if "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:
        os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = str(ROOT / ".cache" / "hypothesis")
    if _children_get_the_bytecode_prefix() and "PYTEST_XDIST_WORKER" not in os.environ:
        # once, by the process that starts the workers or runs the tests, before any
        # process that reads it starts
        prefix_filled_from_installed_bytecode(BYTECODE_PREFIX)
    if not starts_workers:  # an xdist worker, or a run without workers
        _bytecode_kept_out_of_the_tree()


BYTECODE_PREFIX = ROOT / ".cache" / "pycache"


def _children_get_the_bytecode_prefix() -> bool:
    """Whether _bytecode_kept_out_of_the_tree (below) gives the processes tests start
    :data:`BYTECODE_PREFIX`."""
    return bool(os.environ.get("PYTHONDONTWRITEBYTECODE")) and (
        "PYTHONPYCACHEPREFIX" not in os.environ
    )


def _bytecode_kept_out_of_the_tree() -> None:
    """Where PYTHONDONTWRITEBYTECODE is set (to keep ``__pycache__`` out of the tree), every
    process a test starts (a CLI run, a check's judging worker and kernel process) compiled
    the ~450 modules of attnspec it imports from source again: 0.2 s of CPU a process of
    the 0.35 s its imports take with bytecode (`import attnspec.conformance.cli` and the
    properties, measured), and the suite starts hundreds.  The same intent, no bytecode
    in the tree, holds with the bytecode written under the checkout's ``.cache/pycache``
    (ignored by git) instead: PYTHONPYCACHEPREFIX, for this process's children.  Kept
    as set where the user chose a prefix of their own.

    Only for the processes the tests start, not for the xdist workers (set in each worker,
    not in the process that starts them): with a prefix Python reads no ``__pycache__``,
    so the workers compiled every module they import from source, torch's, JAX's, SciPy's,
    pytest's and the standard library's included (the venv has their bytecode), both at
    once at collection, into a prefix that a clean checkout has empty: main's clean clone
    of 22:56 UTC wrote 121 MB of bytecode there, and importing torch, JAX, NumPy,
    Hypothesis and matplotlib took 8.8 CPU-s from source, 3.7 with the venv's bytecode.  A
    worker compiles attnspec's modules and its test modules once, as it would anyway on a
    clean checkout; the processes the tests start share theirs through the prefix."""
    if _children_get_the_bytecode_prefix():
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        os.environ["PYTHONPYCACHEPREFIX"] = str(BYTECODE_PREFIX)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    """A test that let a kernel forge the runner in this process errors at its teardown,
    and the runner is put back, rather than every later test of the worker passing."""
    result = yield
    forged = undo_forgery_in_this_process()
    if forged:
        raise RuntimeError(
            f"{item.nodeid} let a forging kernel run in the test process ("
            + "; ".join(forged)
            + "): run its kernel in a process of its own"
        )
    return result


@pytest.fixture(scope="session", autouse=True)
def _bound_memo() -> Iterator[None]:
    """TOL-2's float64 bound evaluated once per distinct NumPy problem in this process
    (tests/bound_memo.py says why and how it stays exact)."""
    with bounds_remembered():
        yield


@pytest.fixture(scope="session", autouse=True)
def _jax_compiles_quickly(request: pytest.FixtureRequest) -> None:
    """JAX started in this process with support.quick_jax_compiles before the first test,
    where a test of this run names JAX.  Why: the option only takes where this process's
    JAX starts through it (backend_or_skip), and a test that starts JAX another way (a
    check of a JAX kernel in this process, ``import jax``) left every later JAX test of
    the process, an xdist worker's hundreds, compiling in XLA's slower default:
    test_reference_matches_oracle[jax] took 19.3 CPU-s after a check of
    jax.nn.dot_product_attention (test_layouts.py), 12.6 CPU-s first, for the same 505
    compilations.  Runs that name no JAX test do not start it."""
    if any("jax" in item.nodeid.lower() for item in request.session.items):
        quick_jax_compiles()


def _load(name: str) -> Backend:
    """The backend in the settings the reference is tested in (JAX: float64 available)."""
    return backend_or_skip(name, config=REFERENCE_CONFIG.get(name))


@pytest.fixture(params=BACKEND_NAMES)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Every backend, each on its default device; CuPy skips where no CUDA device is."""
    return _load(request.param)


@pytest.fixture(params=[n for n in BACKEND_NAMES if n != "cupy"])
def cpu_backend(request: pytest.FixtureRequest) -> Backend:
    """The backends CI must run (all but CuPy, which needs a CUDA device)."""
    return _load(request.param)


@pytest.fixture(scope="session")
def torch_backend() -> Backend:
    """PyTorch on its default device, for the tests about torch's own kernels or dtypes."""
    return backend_or_skip("torch")


@pytest.fixture
def inputs_rechecked_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """inputs-unmodified (SDPA-1.6) re-reads the inputs RECHECK_DELAY (50 ms) after each
    call, to catch a kernel that goes on writing them from a thread of its own; for tests
    whose kernels return with their work done (they pass, or are caught writing during the
    call, at any delay) it re-reads them at once.  Why: the sleeps were idle seconds of an
    xdist worker (~28 s in tests/catalogue/test_correct_pass.py alone, 8 s in
    test_every_family.py).  Catching a late writer at the real delay is
    tests/conformance/test_forgery.py's (zeroes_its_inputs_later)."""
    monkeypatch.setattr(shapes, "RECHECK_DELAY", 0.0)
