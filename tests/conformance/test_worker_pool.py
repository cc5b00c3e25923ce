"""Properties in several worker processes at once: ``attnspec check --jobs N`` (CONF-5, CONF-6).

The verdicts, their order (clause order, whatever order they finish in) and the reports
are the same for every N; a crash or a hang in one worker fails only the property it was
running (CONF-5); an interrupt keeps every finished verdict, marked incomplete (CONF-6).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import SMALL_SIZES, kernel_file, processes_left_in, start_cli, wait_for

from attnspec.backends import Backend
from attnspec.backends._registry import ADAPTERS
from attnspec.conformance import SetupError, check, cli
from attnspec.conformance.api import KernelSetup
from attnspec.conformance.judge.kernel_info import BackendInfo
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED, Report
from attnspec.conformance.plan import plan_run
from attnspec.conformance.run import worker_pool as jobs_module
from attnspec.conformance.run.property_runner import PROFILES, Profile
from attnspec.conformance.run.supervisor import (
    THREAD_VARIABLES,
    WORKER_THREADS,
    Aborted,
    IsolatedKernel,
    IsolationOptions,
    worker_threads,
)
from attnspec.conformance.run.worker import use_worker_threads
from attnspec.conformance.run.worker_pool import (
    JOBS_VARIABLE,
    MOST_DEFAULT_JOBS,
    WorkerPool,
    available_cpus,
    default_jobs,
    each_in_parallel,
    parse_jobs,
)

# Properties the buggy kernel (scores scaled by scale**2) fails and passes, on NumPy: the
# comparison covers failures with shrunk counterexamples and passes alike.  It fails three
# (matches-reference, default-scale, explicit-scale) and passes five; scale_one_over_e, the
# kernel once compared, failed two, its matches-reference only at float16's edge, shrunk in
# 472 calls: ~2 CPU-s more for its two runs.
ONLY = [
    "matches-reference",
    "default-scale",
    "explicit-scale",
    "causal-zeros",
    "key-permutation",
    "mask-polarity",
    "empty-rows-zero",
    "output-shape-dtype",
]
KERNELS = {
    "correct": "catalogue.correct:online_softmax_attention",
    "buggy": "catalogue.bugs_scores:scale_squared",
}


def outcome(report):  # type: ignore[no-untyped-def]
    """What a run decided, without its timings: each verdict, and what drawing around the
    other failed clauses made of it (root_causes.draw_around)."""
    return [
        (
            v.property,
            v.status,
            v.detail,
            v.counterexample,
            v.reproduction,
            v.examples,
            v.features,
            v.cause,
            v.drawn_around,
        )
        for v in report.verdicts
    ]


COMPARED = "jobs-compared"
COMPARED_EXAMPLES = 8  # small examples a property (the fixture says why)


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[tuple[str, int], object]]:
    """Each catalogue kernel checked with one worker and with two (one run each), on
    COMPARED_EXAMPLES small draws a property (the profile travels to the workers with each
    property): the order of the workers' answers is what differs, not what is drawn (the
    quick profile's strata, cut to small sizes, made the four runs 18 CPU-s, not 15)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROFILES, COMPARED, Profile(COMPARED_EXAMPLES))
        yield {
            (name, jobs): check(
                target,
                backend="numpy",
                profile=COMPARED,
                only=ONLY,
                isolate=True,
                jobs=jobs,
                **SMALL_SIZES,
            )
            for name, target in KERNELS.items()
            for jobs in (1, 2)
        }


@pytest.mark.parametrize("name", list(KERNELS))
def test_two_jobs_give_the_same_verdicts_in_the_same_order(name: str, runs) -> None:  # type: ignore[no-untyped-def]
    """CONF-1: --jobs 2 decides every property as --jobs 1 does (same status, finding,
    shrunk counterexample, reproduction and number of examples), listed in the same
    order, and the same claim."""
    one, two = runs[(name, 1)], runs[(name, 2)]
    assert [v.property for v in two.verdicts] == ONLY
    assert outcome(two) == outcome(one)
    assert two.claim == one.claim and two.conforms == one.conforms


def test_the_comparison_has_failures_and_passes(runs) -> None:  # type: ignore[no-untyped-def]
    """The buggy kernel fails some of the properties compared (SDPA-2.1) and passes others;
    the correct one passes them all: equal outcomes are not equal by being empty."""
    buggy = {v.property: v.status for v in runs[("buggy", 2)].verdicts}
    assert buggy["default-scale"] == FAILED and buggy["matches-reference"] == FAILED
    assert PASSED in buggy.values()
    assert {v.status for v in runs[("correct", 2)].verdicts} == {PASSED}


# mean(V) for fully masked rows (SDPA-5.1): empty-rows-zero fails, and the two others fail
# on such rows only, each re-run drawing around them after the properties
DRAWN_AROUND = ["empty-rows-zero", "rows-sum-to-one", "masked-values-ignored"]
FEW = "jobs-draw-around"  # 10 small draws a stratum: these meet a fully masked row
RE_RUNS = """
import os

import numpy as np

from attnspec.conformance.draw import sizes
from attnspec.reference import scaled_dot_product_attention


def records_what_it_sees(q, k, v, *, mask=None, is_causal=False, scale=None):
    # what these kernels once read to misbehave in re-runs only: the judge's drawing
    # context (a re-run drawing around a failed clause's inputs sets SizeLimits.avoid)
    try:
        seen = sorted(sizes.current().limits.avoid)
    except Exception as exc:  # no drawing context at all in this process
        seen = type(exc).__name__
    with open(os.environ["SEEN_FILE"], "a") as handle:
        handle.write(f"{seen}\\n")
    # the bug (SDPA-5.1): mean(V) for a query row with no allowed key
    out = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    if mask is None or k.shape[-2] == 0:
        return out
    empty = ~np.broadcast_to(mask, (*out.shape[:-1], k.shape[-2])).any(axis=-1)
    return np.where(empty[..., None], v.mean(axis=-2, keepdims=True), out).astype(out.dtype)
"""


# These tests once also ran kernels that crashed or hung in re-runs only, which they
# recognised by reading the judge's drawing context (sizes.current()) from inside their
# own process.  Since the kernel runs in a process of its own (CONF-14) no kernel can read
# it, and nothing in a re-run's inputs tells it from the first run (the same draws, less
# the inputs drawn around; Hypothesis replays a failing example bit for bit in the first
# run too): so those kernels cannot exist any more.  What holds instead is tested below: a
# kernel reading the context sees no re-run in any call, while the re-runs happen.  A
# crash or hang during a property is test_supervisor.py's and the tests below; re-runs
# settling crashes, in-process, test_root_causes.py's.
@pytest.fixture(scope="module")
def seen_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("seen") / "seen.txt"


@pytest.fixture(scope="module")
def re_runs(
    tmp_path_factory: pytest.TempPathFactory, seen_file: Path
) -> Iterator[dict[tuple[str, int], Report]]:
    """A kernel with mean(V) for fully masked rows that records what it sees of the
    judge, checked on DRAWN_AROUND with one worker and with two (one run with two workers
    serves the comparison and what the kernel saw: a catalogue kernel with the same bug
    compared in a third run cost ~2 CPU-s more), at small sizes (the re-runs drawn around
    fully masked rows are what is compared: the two runs 5.3 -> 4.8 CPU-s)."""
    records = kernel_file(tmp_path_factory.mktemp("re-runs"), "re_runs.py", RE_RUNS)
    kernels = {
        ("records", 1): f"{records}:records_what_it_sees",
        ("records", 2): f"{records}:records_what_it_sees",
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROFILES, FEW, Profile(10))
        patch.setenv("SEEN_FILE", str(seen_file))
        yield {
            (name, jobs): check(
                target,
                backend="numpy",
                profile=FEW,
                only=DRAWN_AROUND,
                isolate=True,
                jobs=jobs,
                **SMALL_SIZES,
            )
            for (name, jobs), target in kernels.items()
        }


def test_re_runs_drawn_around_give_the_same_verdicts_with_two_jobs(re_runs) -> None:  # type: ignore[no-untyped-def]
    """CONF-1, CONF-5: the failures re-run around SDPA-5.1's fully masked rows, settled on
    two workers at once, come out as with one: the same causes, evidence and cases, in
    the same order."""
    one, two = re_runs[("records", 1)], re_runs[("records", 2)]
    assert [v.property for v in two.verdicts] == DRAWN_AROUND
    assert outcome(two) == outcome(one)


def test_re_runs_settle_failures_as_consequences(re_runs) -> None:  # type: ignore[no-untyped-def]
    """CONF-1: the comparison above is not of empty outcomes: rows-sum-to-one and
    masked-values-ignored pass drawn around fully masked rows (consequences of SDPA-5.1),
    and empty-rows-zero fails."""
    follows = {v.property: v for v in re_runs[("records", 2)].verdicts}
    for prop in DRAWN_AROUND[1:]:
        assert follows[prop].cause == "SDPA-5.1", follows[prop].drawn_around
        assert follows[prop].drawn_around.startswith("passes drawn around fully-masked-row")
    assert follows["empty-rows-zero"].status == FAILED


def test_the_kernel_never_sees_a_re_run(re_runs, seen_file: Path) -> None:  # type: ignore[no-untyped-def]
    """CONF-14: with two workers, both failures are re-run around fully masked rows (and
    settled as SDPA-5.1's consequences), yet the kernel, reading the judge's drawing
    context in its own process on every call, never sees what is drawn around: it
    cannot tell a re-run from the first run, so it cannot misbehave in re-runs only."""
    recorded = {v.property: v for v in re_runs[("records", 2)].verdicts}
    for prop in DRAWN_AROUND[1:]:
        assert recorded[prop].drawn_around.startswith("passes drawn around fully-masked-row")
    seen = seen_file.read_text().splitlines()
    assert len(seen) > 10 and not [line for line in seen if "fully-masked-row" in line], seen[:5]


HOSTILE_SOMETIMES = """
import os, time
from attnspec.reference import scaled_dot_product_attention


def crashes_or_hangs(q, k, v, *, mask=None, is_causal=False, scale=None):
    if scale is not None:
        os.kill(os.getpid(), 11)
    while is_causal:
        time.sleep(1)
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def hangs_on_causal(q, k, v, *, mask=None, is_causal=False, scale=None):
    while is_causal:
        time.sleep(1)
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
"""


@pytest.fixture
def hostile(tmp_path: Path) -> str:
    return str(kernel_file(tmp_path, "sometimes.py", HOSTILE_SOMETIMES))


def test_a_crash_or_hang_in_one_job_fails_only_its_property(hostile: str) -> None:
    """CONF-5 with two workers: a segfault on explicit-scale and a hang on causal-zeros
    (past --timeout 1) fail those two properties, each naming what happened and the
    inputs of the call; default-scale, run beside them, passes."""
    report = check(
        f"{hostile}:crashes_or_hangs",
        backend="numpy",
        jobs=2,
        only=["explicit-scale", "default-scale", "causal-zeros"],
        isolate=IsolationOptions(timeout=1),  # s: what the hang costs; small calls take ms
        causal=True,
        **SMALL_SIZES,
    )
    statuses = {v.property: v.status for v in report.verdicts}
    assert statuses == {"explicit-scale": FAILED, "default-scale": PASSED, "causal-zeros": FAILED}
    crashed, _, hung = report.verdicts
    assert "SIGSEGV" in crashed.detail and "scale=" in crashed.counterexample
    assert hung.detail.startswith("the kernel did not return within 1 s")
    assert "is_causal=True" in hung.counterexample


def _check_in_two_jobs(
    target: str, only: list[str], cwd: Path, *flags: str
) -> subprocess.Popen[str]:
    """``attnspec check TARGET`` of ``only`` on NumPy in two workers, started in ``cwd``
    (writing r.json there), with a timeout no test waits for."""
    return start_cli(
        [
            "check",
            target,
            "--backend",
            "numpy",
            "--only",
            ",".join(only),
            "--jobs",
            "2",
            "--timeout",
            "300",
            "--json",
            "r.json",
            *flags,
        ],
        cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize(
    "signum, name", [(signal.SIGINT, "SIGINT (Ctrl-C)"), (signal.SIGTERM, "SIGTERM")]
)
def test_interrupt_with_jobs_keeps_finished_verdicts_in_order(
    signum: int,
    name: str,
    hostile: str,
    tmp_path: Path,
) -> None:
    """CONF-6 with two workers: causal-zeros, the first property, hangs in one worker
    while the other finishes default-scale and explicit-scale; the report holds those
    two, in their order, marked still running; SIGINT or SIGTERM then ends the check with
    exit 2,
    the hung property left out, the report marked incomplete, no worker left behind."""
    process = _check_in_two_jobs(
        f"{hostile}:hangs_on_causal",
        ["causal-zeros", "default-scale", "explicit-scale"],
        tmp_path,
        "--markdown",
        "r.md",
    )
    try:
        wait_for(tmp_path / "r.md", "2 of 3")
        running = json.loads((tmp_path / "r.json").read_text())
        assert [v["property"] for v in running["verdicts"]] == ["default-scale", "explicit-scale"]
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 2, err
    final = json.loads((tmp_path / "r.json").read_text())
    reason = f"interrupted by {name} after 2 of 3 properties"
    assert final["incomplete"] == reason and final["complete"] is False
    assert [(v["property"], v["status"]) for v in final["verdicts"]] == [
        ("default-scale", PASSED),
        ("explicit-scale", PASSED),
    ]
    assert f"result: INCOMPLETE ({reason})" in out and "Traceback" not in err
    assert processes_left_in(tmp_path, within=0.5) == []


def test_an_aborted_session_starts_no_worker_again() -> None:
    """CONF-6: once aborted (an interrupted --jobs run), a session's next request, as the
    next re-run of a verdict being settled would make, raises Aborted instead of starting
    a worker again that no one would stop."""
    setup = KernelSetup("attnspec.reference:scaled_dot_product_attention", "numpy")
    with IsolatedKernel(setup, IsolationOptions()) as session:
        session.start()
        session.abort()
        with pytest.raises(Aborted, match="the run was aborted"):
            session.run_property(all_properties()["default-scale"], profile="quick", seed=None)
        assert session.lost == 0


def _check_reference(only: str, *flags: str) -> int:
    """The exit status of ``attnspec check`` of the NumPy reference on the properties
    ``only`` (comma-separated), with ``flags``."""
    return cli.main(
        [
            "check",
            "attnspec.reference:scaled_dot_product_attention",
            "--backend",
            "numpy",
            "--only",
            only,
            *flags,
        ]
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--timeout", "0"], "--timeout 0.0, but should be a positive number of seconds"),
        (["--memory-limit", "-1"], "--memory-limit -1.0, but should be a number of GiB >= 0"),
        (["--timeout", "5", "--no-isolate"], "--no-isolate has none"),
        (["--jobs", "0"], "--jobs 0, but should be a positive integer or 'auto'"),
        (["--jobs", "two"], "--jobs 'two', but should be a positive integer or 'auto'"),
        (["--jobs", "\u00b2"], "--jobs '\u00b2', but should be a positive integer or 'auto'"),
        (["--jobs", "2", "--no-isolate"], "--no-isolate (isolate=False) runs the kernel in this"),
    ],
)
def test_bad_worker_options_are_one_line_and_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """CONF-5 (the worker that runs the kernel, and the workers that run a check): a bad
    --timeout or --memory-limit value, --timeout with --no-isolate, a bad --jobs (a
    superscript digit that str.isdigit() takes included), or --jobs with --no-isolate, is
    one line naming the flag and exit status 2."""
    status = _check_reference("default-scale", *argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and words in lines[0], lines


def test_jobs_values() -> None:
    """'auto' is one worker per CPU this process may use; the API rejects bad values and
    more than one job in-process with a SetupError naming jobs."""
    assert parse_jobs("auto") == available_cpus() >= 1
    assert parse_jobs(None) == 1 and parse_jobs("3") == 3 and parse_jobs(2) == 2
    with pytest.raises(SetupError, match="jobs=0, but should be a positive integer"):
        check("attnspec.reference:scaled_dot_product_attention", backend="numpy", jobs=0)
    with pytest.raises(SetupError, match="jobs=2 runs properties in worker processes"):
        check(
            "attnspec.reference:scaled_dot_product_attention",
            backend="numpy",
            jobs=2,
            only=["default-scale", "explicit-scale"],
        )


def test_each_worker_runs_cpus_over_jobs_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONF-5: with --jobs 2 and no thread variable in the environment, the
    worker gives BLAS, OpenMP and PyTorch's intra-op pool max(1, CPUs // 2) threads and
    says so in the report's notes, with the count PyTorch reports it ran with."""
    pytest.importorskip("torch", reason="PyTorch's intra-op threads are what is set")
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    report = check(
        "torch.nn.functional:scaled_dot_product_attention",
        backend="torch",
        only=["score-variance"],
        isolate=True,
        jobs=2,
    )
    expected = max(1, available_cpus() // 2)
    note = next(n for n in report.notes if n.startswith("worker threads"))
    assert note.startswith(f"worker threads: {expected} per worker process"), note
    assert f"PyTorch {expected})" in note, note


def test_the_users_thread_variables_stand() -> None:
    """A worker's environment keeps OMP_NUM_THREADS (or any thread variable) the user set:
    nothing is added; without them every variable gets CPUs // jobs, at least 1."""
    assert worker_threads(2, {"OMP_NUM_THREADS": "3", "PATH": "/bin"}) == {}
    assert worker_threads(4, {"MKL_NUM_THREADS": "1"}) == {}
    chosen = worker_threads(10**6, {"PATH": "/bin"})
    assert set(chosen) == {*THREAD_VARIABLES, WORKER_THREADS}
    assert set(chosen.values()) == {"1"}
    assert worker_threads(1, {})["OMP_NUM_THREADS"] == str(available_cpus())
    note = use_worker_threads({"OMP_NUM_THREADS": "3"})
    assert note.startswith("worker threads: as the environment sets them (OMP_NUM_THREADS=3"), note


def test_the_default_is_one_worker_per_cpu_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONF-5: without jobs, an isolated run plans one worker per CPU, at most
    MOST_DEFAULT_JOBS, to be cut to one on an accelerator; an in-process run plans one
    (no error: the user did not ask for more); a number given is kept as given."""
    monkeypatch.delenv(JOBS_VARIABLE, raising=False)
    setup = KernelSetup("attnspec.reference:scaled_dot_product_attention", "numpy")
    for cpus, default in ((1, 1), (3, 3), (MOST_DEFAULT_JOBS + 12, MOST_DEFAULT_JOBS)):
        with monkeypatch.context() as cpus_here:
            cpus_here.setattr(jobs_module, "available_cpus", lambda n=cpus: n)
            assert default_jobs() == default, cpus
    isolated = plan_run(setup, isolation=IsolationOptions(), jobs=None)
    assert (isolated.jobs, isolated.sized_by_cpus) == (default_jobs(), True)
    in_process = plan_run(setup, isolation=None, jobs=None)
    assert (in_process.jobs, in_process.sized_by_cpus) == (1, False)
    given = plan_run(setup, isolation=IsolationOptions(), jobs=3)
    assert (given.jobs, given.sized_by_cpus) == (3, False)


@pytest.mark.parametrize("on_cpu", [True, False])
@pytest.mark.parametrize("sized_by_cpus", [True, False])
def test_a_pool_sized_by_cpus_runs_one_worker_on_an_accelerator(
    on_cpu: bool, sized_by_cpus: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-5: a pool sized by the CPUs (the default) runs every worker for a kernel on a
    CPU and only the first for one on an accelerator (workers would share it); a pool of
    --jobs N runs N either way.  (The first worker's report of its device is stood in for:
    this machine has no GPU.)"""
    setup = KernelSetup("attnspec.reference:scaled_dot_product_attention", "numpy")
    pool = WorkerPool(setup, IsolationOptions(), 3, sized_by_cpus=sized_by_cpus)
    info = type(
        "Info", (), {"backend": BackendInfo("torch", "cuda:0" if not on_cpu else "cpu", on_cpu)}
    )
    monkeypatch.setattr(pool, "start", lambda: info)
    running = pool.running()
    assert running == (pool.sessions[:1] if sized_by_cpus and not on_cpu else pool.sessions)


def test_backends_say_whether_they_run_on_the_cpu() -> None:
    """CONF-5 (the workers that run a check: one on an accelerator): Backend.on_cpu:
    NumPy's device is the CPU, a CuPy device never is (checked on the adapter: CuPy needs
    a CUDA GPU, which this test does not), torch's and JAX's follow the device."""
    assert Backend("numpy").on_cpu
    assert ADAPTERS["cupy"].on_cpu(None) is False
    torch = pytest.importorskip("torch", reason="torch devices are what is read")
    assert Backend("torch", "cpu").on_cpu
    assert ADAPTERS["torch"].on_cpu(torch.device("cuda:0")) is False
    pytest.importorskip("jax", reason="jax devices are what is read")
    assert Backend("jax", "cpu").on_cpu


def test_the_cli_runs_the_default_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-5: ``attnspec check`` without --jobs runs default_jobs() workers on a CPU: each
    worker's threads are the CPUs divided by that number (the report's notes say so)."""
    for name in (*THREAD_VARIABLES, JOBS_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    report = tmp_path / "report.json"
    status = _check_reference("default-scale,explicit-scale", "--json", str(report))
    capsys.readouterr()
    notes = json.loads(report.read_text())["notes"]
    threads = next(n for n in notes if n.startswith("worker threads"))
    expected = max(1, available_cpus() // default_jobs())
    assert status == 0 and threads.startswith(f"worker threads: {expected} per worker"), notes


def test_attnspec_jobs_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONF-5: ATTNSPEC_JOBS gives the number of workers of a run that does not say, as
    --jobs does (a number, 'auto'); a bad value is a SetupError naming the variable; a
    number given to the run wins; an in-process run stays one."""
    setup = KernelSetup("attnspec.reference:scaled_dot_product_attention", "numpy")
    isolation = IsolationOptions()
    monkeypatch.setenv(JOBS_VARIABLE, "3")
    assert plan_run(setup, isolation=isolation, jobs=None).jobs == 3
    assert plan_run(setup, isolation=isolation, jobs=2).jobs == 2
    assert plan_run(setup, isolation=None, jobs=None).jobs == 1
    monkeypatch.setenv(JOBS_VARIABLE, "auto")
    assert plan_run(setup, isolation=isolation, jobs=None).jobs == available_cpus()
    monkeypatch.setenv(JOBS_VARIABLE, "two")
    with pytest.raises(SetupError, match="ATTNSPEC_JOBS='two', but should be a positive"):
        plan_run(setup, isolation=isolation, jobs=None)


def test_items_with_no_session_to_run_them_are_a_value_error() -> None:
    """CONF-5 (the workers that run a check): each_in_parallel with no session is a
    ValueError naming ``sessions``, not a wait for results no thread will bring; with
    one, every item runs and is handed back with its index."""
    with pytest.raises(ValueError, match=r"sessions=\[\], but should hold at least one"):
        each_in_parallel([1, 2], [], lambda session, item: item, lambda index, result: None)
    results: dict[int, int] = {}
    each_in_parallel([1, 2, 3], ["one"], lambda session, item: 10 * item, results.__setitem__)
    assert results == {0: 10, 1: 20, 2: 30}
