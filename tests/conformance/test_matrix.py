"""``attnspec matrix`` (CONF-1, CONF-7): the kernel x clause-family table, one divergence per root
cause, consequences (failures that pass re-run around another failed clause's inputs,
conformance/root_causes.py) folded into it.

One matrix run on two torch rows (four properties each, FEW_EXAMPLES small draws as the
quick profile: nn.MultiheadAttention's failures re-run around fully masked rows cost ~135 s
of CPU on the real quick profile, 6 s on FEW_EXAMPLES, with the same findings), its kernels
checked in this process (--no-isolate), is shared by the module; a second, on one property
of the real quick profile, checks two kernels at once in processes of their own (--jobs 2:
a profile patched here does not reach them); the folding and cell rules are also checked on
hand-built reports.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, hand_report, hand_verdict

from attnspec.backends import Backend
from attnspec.conformance import cli, matrix
from attnspec.conformance.judge.verdict import FAILED, NOT_APPLICABLE, PASSED, WAIVED, Report
from attnspec.conformance.kernels.known import KNOWN_KERNELS, KnownKernel
from attnspec.conformance.plan import Execution
from attnspec.conformance.run import supervisor as isolation
from attnspec.conformance.run.property_runner import PROFILES, Profile
from attnspec.conformance.run.root_causes import Divergence

pytest.importorskip("torch", reason="the matrix rows checked here are PyTorch kernels")

PROPERTIES = "empty-rows-zero,rows-sum-to-one,mask-broadcast,masked-nonfinite-ignored"
# small draws a property: these meet fully masked rows (nn.MultiheadAttention's NaN) and
# NaN in masked keys (sdpa_math's SDPA-8.2), and the re-runs drawn around them pass
FEW_EXAMPLES = Profile(10)
SDPA_MATH = "attnspec.conformance.kernels.torch_sdpa:sdpa_math"
MHA = "torch.nn:MultiheadAttention"


def _matrix(out: Path, *argv: str) -> dict[str, Any]:
    """``attnspec matrix ARGV --quiet`` in this process, writing into ``out``: its exit
    status, Markdown, rows by name and JSON file."""
    md, js = out / "matrix.md", out / "matrix.json"
    status = cli.main(["matrix", *argv, "--quiet", "--markdown", str(md), "--json", str(js)])
    rows = {row["name"]: row for row in json.loads(js.read_text())}
    return {"status": status, "markdown": md.read_text(), "rows": rows, "json": js}


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The matrix of four kernels (two checkable here) on FEW_EXAMPLES as their quick
    profile, each checked in this process (``--no-isolate``), not in a worker of its own:
    the rows are the same either way (compared on this run: bit for bit but the seconds),
    and the two processes of each kernel (its worker and the kernel's process, each
    importing torch) cost ~11 of the ~13 s of CPU this run took.  The worker's own
    behaviour is test_supervisor.py's and test_worker_pool.py's; the matrix's processes are
    run by test_kernels_checked_at_once_come_back_as_their_rows."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROFILES, "quick", FEW_EXAMPLES)
        return _matrix(
            tmp_path_factory.mktemp("matrix"),
            *("--kernel", "sdpa_math", "--kernel", "torch.nn:Multihead"),
            *("--kernel", "fast_transformers", "--kernel", "flash_attn"),
            *("--only", PROPERTIES, "--jobs", "1", "--no-isolate"),
        )


def test_matrix_writes_a_row_per_selected_kernel(matrix_run: dict[str, Any]) -> None:
    """Checked rows, and the uninstalled / GPU-only ones reported as such, not crashes."""
    rows = matrix_run["rows"]
    assert matrix_run["status"] == 0
    selected = {
        "attnspec.conformance.kernels.torch_sdpa:sdpa_math",
        "torch.nn:MultiheadAttention",
        "attnspec.conformance.kernels.adapters.thirdparty:fast_transformers_linear",
        "flash_attn:flash_attn_func",
    }
    assert set(rows) == {entry.name for entry in KNOWN_KERNELS}
    # a kernel that cannot run here says why whether --kernel selected it or not; the
    # runnable ones are checked exactly when selected
    cannot_run = (matrix.NOT_INSTALLED, matrix.NEEDS_GPU)
    assert all(rows[name]["status"] != matrix.NOT_SELECTED for name in selected)
    assert {
        name
        for name, row in rows.items()
        if row["status"] not in (matrix.NOT_SELECTED, *cannot_run)
    } == {name for name in selected if rows[name]["status"] not in cannot_run}
    assert all(
        row["status"] in cannot_run or name in selected
        for name, row in rows.items()
        if row["status"] != matrix.NOT_SELECTED
    )
    installed = importlib.util.find_spec("fast_transformers") is not None
    assert rows["attnspec.conformance.kernels.adapters.thirdparty:fast_transformers_linear"][
        "status"
    ] == (matrix.CHECKED if installed else matrix.NOT_INSTALLED)
    flash = rows["flash_attn:flash_attn_func"]
    assert flash["status"] in (matrix.NOT_INSTALLED, matrix.NEEDS_GPU), flash


def test_kernels_checked_at_once_come_back_as_their_rows(
    matrix_run: dict[str, Any], tmp_path: Path
) -> None:
    """CONF-1 (the matrix's --jobs N): two kernels checked at once, each by ``attnspec
    matrix`` in a process of its own, come back as their rows: checked, with the cells and
    the divergence (and its write-up) that the same property gives them in this process.
    --no-isolate goes with them: each kernel is checked in its matrix process, which
    imports torch once, not also in a worker and a kernel process that import it again
    (~1.4 CPU-s each; the worker's verdicts are those of this process,
    test_strategies.py's isolated-and-in-process tests)."""
    run = _matrix(
        tmp_path,
        *("--kernel", "sdpa_math", "--kernel", "torch.nn:Multihead"),
        *("--only", "empty-rows-zero", "--jobs", "2", "--no-isolate"),
    )
    assert run["status"] == 0
    rows, alone = run["rows"], matrix_run["rows"]
    assert {n for n, r in rows.items() if r["status"] == matrix.CHECKED} == {SDPA_MATH, MHA}
    for name in (SDPA_MATH, MHA):
        assert rows[name]["cells"] == {"SDPA-5": alone[name]["cells"]["SDPA-5"]}, rows[name]
    assert rows[SDPA_MATH]["cells"]["SDPA-5"] == PASSED and not rows[SDPA_MATH]["divergences"]
    [empty] = rows[MHA]["divergences"]
    assert empty["clause"] == "SDPA-5.1" and empty["write_up"].startswith("docs/divergences.md#")


def test_sdpa_math_row_links_its_confirmed_warning(matrix_run: dict[str, Any]) -> None:
    """SDPA-8.2 is sdpa_math's one finding, linked to its write-up; SDPA-5 passes."""
    row = matrix_run["rows"][SDPA_MATH]
    assert row["cells"]["SDPA-5"] == PASSED and row["cells"]["SDPA-8"] == "warning"
    [divergence] = row["divergences"]
    assert divergence["clause"] == "SDPA-8.2"
    assert divergence["write_up"].startswith("docs/divergences.md#torch-masked-nan")


def test_mha_fully_masked_rows_are_one_divergence(matrix_run: dict[str, Any]) -> None:
    """nn.MultiheadAttention gives NaN for a fully masked row (SDPA-5.1): the properties that
    fail only because their minimal case has such a row are folded into it."""
    row = matrix_run["rows"][MHA]
    by_clause = {d["clause"]: d for d in row["divergences"]}
    empty = by_clause["SDPA-5.1"]
    assert "SDPA-7.1" not in by_clause and "SDPA-3.1" not in by_clause, row["divergences"]
    assert {c.split()[0] for c in empty["consequences"]} == {"rows-sum-to-one", "mask-broadcast"}
    assert (
        "consequences (each passes re-run with these inputs drawn around)"
        in (matrix_run["markdown"])
    )
    assert "passes drawn around fully-masked-row (SDPA-5.1)" in matrix_run["markdown"]
    assert "| `torch.nn:MultiheadAttention` | torch |" in matrix_run["markdown"]


def test_cells_take_the_worst_verdict_and_show_waivers() -> None:
    report = Report(
        "k",
        "torch",
        "cpu",
        "quick",
        None,
        False,
        verdicts=[
            hand_verdict("a", "SDPA-7.1", PASSED),
            hand_verdict("b", "SDPA-7.3", FAILED),
            hand_verdict("c", "SDPA-5.1", WAIVED),
            hand_verdict("d", "SDPA-6.1", NOT_APPLICABLE),
        ],
    )
    report.waived = ["SDPA-5.1"]
    assert matrix.cells_of(report) == {"SDPA-7": FAILED, "SDPA-5": WAIVED, "SDPA-6": NOT_APPLICABLE}


def test_a_failure_is_folded_only_when_its_re_run_showed_a_cause() -> None:
    """The matrix folds what root_causes.draw_around established (Verdict.cause), never a
    failure merely because its minimal case looks like another clause's inputs."""
    masked = "q(1, 1, 1, 1), k(1, 1, 1, 1), v(1, 1, 1, 1), dtype=float16, mask(1, 1) (0/1 True)"
    verdicts = [
        hand_verdict("empty-rows-zero", "SDPA-5.1", FAILED, case="q(1, 1, 1)"),
        hand_verdict("rows-sum-to-one", "SDPA-7.1", FAILED, case=masked),
        hand_verdict("query-permutation", "SDPA-7.6", FAILED, case=masked),
    ]
    verdicts[1].cause = "SDPA-5.1"
    report = hand_report(verdicts, backend="torch")
    folded = matrix.divergences_of(report, {})
    assert [d.clause for d in folded] == ["SDPA-5.1", "SDPA-7.6"]
    assert folded[0].consequences == ["rows-sum-to-one (SDPA-7.1)"]


def test_failures_explained_by_one_write_up_are_one_divergence() -> None:
    causal_scale_zero = "q(1, 1, 2, 1), dtype=float16, is_causal=True, scale=0.0"
    verdicts = [
        hand_verdict("matches-reference", "SDPA-7.3", FAILED, case=causal_scale_zero),
        hand_verdict("output-in-value-hull", "SDPA-7.1", FAILED, case=causal_scale_zero),
    ]
    report = hand_report(verdicts, backend="torch")
    link = "docs/divergences.md#torch-causal-scale-zero"
    [one] = matrix.divergences_of(report, {"matches-reference": link, "output-in-value-hull": link})
    assert one.properties == ["matches-reference", "output-in-value-hull"]


def test_relink_links_only_what_a_write_up_describes() -> None:
    """matrix.relink (rows of earlier runs): a divergence whose properties' write-ups
    differ, or whose failure is not the one written up, is left unconfirmed; one that is
    gets its write-up."""
    link = "docs/divergences.md#torch-causal-scale-zero"

    def row(inputs: str, properties: list[str], clause: str = "SDPA-7.3") -> matrix.MatrixRow:
        found = Divergence(clause, "MUST", FAILED, "out is nan", inputs, properties)
        return matrix.MatrixRow("k", "torch", "cpu", "", matrix.CHECKED, divergences=[found])

    zero, half = "q(1, 1, 1), is_causal=True, scale=0.0", "q(1, 1, 1), scale=0.5"
    assert (
        matrix.relink(row(zero, ["matches-reference"]), {"matches-reference": link})
        .divergences[0]
        .write_up
        == link
    )
    assert (
        not matrix.relink(row(half, ["matches-reference"]), {"matches-reference": link})
        .divergences[0]
        .write_up
    )
    # two properties of SDPA-7.1, each with a write-up of its own
    two = {"output-in-value-hull": "docs/a.md", "rows-sum-to-one": "docs/b.md"}
    relinked = matrix.relink(row(zero, [*two], "SDPA-7.1"), two)
    assert relinked.divergences[0].write_up == ""


def test_rows_show_the_probed_causes_as_the_console_does(tmp_path: Path) -> None:
    """CONF-1 (issue 38): a row keeps the causes diagnosis probes established, with the
    properties each explains; the Markdown tells each before the divergences and marks
    a divergence a cause explains; the summary counts them; the JSON keeps them."""
    from attnspec.conformance.judge.verdict import Cause

    wide = "q(1, 1, 1), k(1, 2, 1), dtype=float64, is_causal=False, scale=None"
    report = hand_report(
        [
            hand_verdict("matches-reference", "SDPA-7.3", case=wide),
            hand_verdict("output-shape-dtype", "SDPA-1.3", case=wide.replace("64", "16")),
        ],
        causes=[Cause("float64-in-float32", "SDPA-7.3", "f64 in f32", "probe", "--dtype x")],
    )
    row = matrix.row_from_report(KNOWN_KERNELS[0], report, {}, 1.0)
    assert [(c["name"], c["explains"]) for c in row.causes] == [
        ("float64-in-float32", ["matches-reference"])
    ]
    text = matrix.to_markdown([row])
    told = text.split("### ")[-1]
    assert "- cause 1 (**SDPA-7.3**): f64 in f32" in told
    assert "  - evidence: probe" in told and "  - hint: --dtype x" in told
    assert "  - explains: `matches-reference`" in told
    assert told.index("cause 1") < told.index("properties: matches-reference")
    assert "explained by cause 1 above; properties: matches-reference" in told
    assert "output-shape-dtype" in told.split("explained by cause 1 above")[1]
    assert "1 probed cause" in matrix.summary([row])
    path = tmp_path / "matrix.json"
    path.write_text(matrix.to_json([row]), encoding="utf-8")
    assert matrix.rows_in(path)[0].causes == row.causes


def test_unknown_kernel_name_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(["matrix", "--kernel", "no-such-kernel", "--markdown", str(tmp_path / "m.md")])
        == 2
    )
    assert "matches no known kernel" in capsys.readouterr().err


def test_supervision_without_a_worker_is_one_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CONF-5: ``matrix --no-isolate`` with --timeout is one usage error, as check's, before
    any kernel is checked (with --jobs 2, not a failed row from each kernel's process)."""
    status = cli.main(
        [
            *("matrix", "--kernel", "sdpa_math", "--kernel", "torch.nn:Multihead"),
            *("--no-isolate", "--timeout", "5", "--jobs", "2"),
            *("--markdown", str(tmp_path / "m.md"), "--json", str(tmp_path / "m.json")),
        ]
    )
    err = capsys.readouterr().err
    assert status == 2 and "--timeout apply to the worker processes" in err, err
    assert not (tmp_path / "m.json").exists()


def test_merge_renders_earlier_runs_without_rerunning(
    matrix_run: dict[str, Any], tmp_path: Path
) -> None:
    """--merge alone runs nothing: the checked rows of the earlier JSON come back as they
    were (so rows run at different times make one matrix)."""
    md, js = tmp_path / "m.md", tmp_path / "m.json"
    assert (
        cli.main(
            ["matrix", "--merge", str(matrix_run["json"]), "--markdown", str(md), "--json", str(js)]
        )
        == 0
    )
    rows = {row["name"]: row for row in json.loads(js.read_text())}
    checked = {n for n, r in matrix_run["rows"].items() if r["status"] == matrix.CHECKED}
    assert {n for n, r in rows.items() if r["status"] == matrix.CHECKED} == checked
    for name in checked:
        assert rows[name] == matrix_run["rows"][name]


def test_failures_on_a_waived_clause_s_inputs_are_its_consequences() -> None:
    """jax.nn waives SDPA-5.1; a property failing on a fully masked row is listed under
    the waived clause, not as a divergence of its own."""
    masked = "q(1, 1, 1, 1), k(1, 1, 1, 1), v(1, 1, 1, 1), dtype=float16, mask(1, 1) (0/1 True)"
    report = Report(
        "k",
        "jax",
        "cpu",
        "quick",
        None,
        False,
        verdicts=[hand_verdict("rows-sum-to-one", "SDPA-7.1", FAILED, case=masked)],
    )
    report.waived = ["SDPA-5.1"]
    report.verdicts[0].cause = "SDPA-5.1"  # its re-run around fully masked rows passed
    [waived] = matrix.divergences_of(report, {})
    assert (waived.clause, waived.status) == ("SDPA-5.1", WAIVED)
    assert waived.consequences == ["rows-sum-to-one (SDPA-7.1)"]


def test_an_interrupt_ends_the_matrix_not_just_one_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ctrl-C or SIGTERM during one kernel's check leaves that kernel's row incomplete and
    runs no further kernel (each is reported as not run, with why)."""
    calls: list[str] = []

    def interrupted_run(setup: Any, args: Any, flags: Any, **_: Any) -> Execution:
        calls.append(setup.kernel)
        report = Report(
            setup.kernel,
            "torch",
            "cpu",
            "quick",
            None,
            False,
            incomplete="interrupted by SIGTERM after 3 of 63 properties",
        )
        return Execution(report, None, {})

    monkeypatch.setattr(cli, "_run_one", interrupted_run)
    js = tmp_path / "m.json"
    assert (
        cli.main(
            [
                "matrix",
                "--kernel",
                "sdpa_math",
                "--kernel",
                "sdpa_flash",
                "--quiet",
                "--markdown",
                str(tmp_path / "m.md"),
                "--json",
                str(js),
            ]
        )
        == 0
    )
    rows = {row["name"]: row for row in json.loads(js.read_text())}
    assert calls == ["attnspec.conformance.kernels.torch_sdpa:sdpa_math"]
    flash = rows["attnspec.conformance.kernels.torch_sdpa:sdpa_flash"]
    assert flash["status"] == matrix.NOT_SELECTED
    assert flash["reason"] == (
        "not run: the matrix was interrupted by SIGTERM while checking "
        "attnspec.conformance.kernels.torch_sdpa:sdpa_math"
    )


def test_every_divergence_in_the_committed_matrix_is_confirmed() -> None:
    """docs/matrix.json: each checked row's divergences (failed or warning) link a write-up
    in docs/divergences.md whose anchor exists, and the Markdown shows each row."""
    docs = ROOT / "docs"
    rows = matrix.rows_in(docs / "matrix.json")
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', (docs / "divergences.md").read_text()))
    markdown = (docs / "matrix.md").read_text()
    checked = [row for row in rows if row.status == matrix.CHECKED]
    assert checked
    for row in checked:
        assert f"### {row.name}" in markdown
        for d in row.divergences:
            if d.status == WAIVED and not d.consequences:
                continue
            assert d.write_up.startswith("docs/divergences.md#"), (row.name, d)
            assert d.write_up.split("#")[1].split()[0] in anchors, (row.name, d.write_up)


def test_every_write_up_scope_names_a_write_up_in_use() -> None:
    """Each entry of what a write-up confirms (known_kernels._CONFIRMS) is a link some
    known kernel's divergence uses, to an anchor docs/divergences.md has, and names
    clauses that exist: a scope cannot outlive its write-up."""
    from attnspec.conformance.judge.registry import all_properties
    from attnspec.conformance.kernels.known import _CONFIRMS, _DIVERGENCES

    used = {link for entries in _DIVERGENCES.values() for link in entries.values()}
    anchors = set(
        re.findall(r'<a id="([^"]+)"></a>', (ROOT / "docs" / "divergences.md").read_text())
    )
    clauses = {prop.clause for prop in all_properties().values()}
    for link, scope in _CONFIRMS.items():
        assert link in used, link
        assert link.split("#")[1].split()[0] in anchors, link
        assert set(scope.clauses) <= clauses, (link, scope.clauses)


def test_a_kernel_left_out_by_kernel_keeps_why_it_cannot_run() -> None:
    """CONF-1: a row ``--kernel`` left out is its earlier checked row, else the reason it
    cannot run here (a CUDA kernel without a GPU), and only else "left out"."""
    # a CUDA kernel whose libraries import here: one that needs fla or flash_attn is
    # "not installed" first, wherever they are missing
    cuda = next(e for e in KNOWN_KERNELS if e.device == "cuda" and not e.missing())
    assert matrix.unselected_row(cuda, {}, has_cuda=False).status == matrix.NEEDS_GPU
    earlier = matrix.MatrixRow(cuda.name, cuda.backend, cuda.device, cuda.note, matrix.CHECKED)
    assert matrix.unselected_row(cuda, {cuda.name: earlier}, has_cuda=False) is earlier
    runnable = next(e for e in KNOWN_KERNELS if matrix.unavailable(e, has_cuda=False) is None)
    row = matrix.unselected_row(runnable, {}, has_cuda=False)
    assert (row.status, row.reason) == (matrix.NOT_SELECTED, "left out of this run (--kernel)")


def test_a_cpu_row_too_costly_here_is_listed_as_needing_a_gpu() -> None:
    """CONF-1: a CPU row whose check costs hours on this machine (gpu_only_here) is listed as
    needing a GPU, with the reason, where there is none, and is checked where there is."""
    entry = KnownKernel("m:f", "m:f", "torch", gpu_only_here="it compiles per shape: hours")
    row = matrix.unavailable(entry, has_cuda=False)
    assert row is not None and row.status == matrix.NEEDS_GPU
    assert row.reason.endswith("it compiles per shape: hours")
    assert matrix.unavailable(entry, has_cuda=True) is None


def test_kernels_checked_at_once_share_the_cpus_between_their_thread_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONF-1 (the matrix's --jobs N): each kernel's process gets CPUs // N threads in its
    BLAS, OpenMP and PyTorch pools, as the workers of one check do (a thread per core in
    each of 2 kernels on 2 cores made a torch row's mask-broadcast 15 s instead of 0.8 s);
    thread variables the user set stand."""
    seen: list[dict[str, str]] = []

    def recorded(command: list[str], **options: Any) -> subprocess.CompletedProcess[bytes]:
        seen.append(options["env"])
        return subprocess.CompletedProcess(command, 2)

    monkeypatch.setattr(matrix.subprocess, "run", recorded)
    monkeypatch.setattr(isolation, "available_cpus", lambda: 8)
    for name in isolation.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    entries = [KNOWN_KERNELS[0], KNOWN_KERNELS[1]]
    rows = matrix.rows_in_processes(entries, 2, ["--quiet"])
    assert [row.status for row in rows] == [matrix.SETUP_FAILED] * 2
    assert [env["OMP_NUM_THREADS"] for env in seen] == ["4", "4"]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    seen.clear()
    matrix.rows_in_processes(entries, 2, ["--quiet"])
    assert [env["OMP_NUM_THREADS"] for env in seen] == ["3", "3"]
    assert all("OPENBLAS_NUM_THREADS" not in env for env in seen)


def test_kernels_checked_at_once_are_told_whether_there_is_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONF-1 (the matrix's --jobs N): each kernel's process is told whether this matrix
    found a GPU for the CUDA rows (it takes that, not torch's default device, which it would
    import torch to read); without the variable, torch's device decides."""
    seen: list[dict[str, str]] = []

    def recorded(command: list[str], **options: Any) -> subprocess.CompletedProcess[bytes]:
        seen.append(options["env"])
        return subprocess.CompletedProcess(command, 2)

    monkeypatch.setattr(matrix.subprocess, "run", recorded)
    entries = [KNOWN_KERNELS[0], KNOWN_KERNELS[1]]
    for has_cuda, told in ((True, "1"), (False, "0")):
        seen.clear()
        matrix.rows_in_processes(entries, 2, ["--quiet"], has_cuda)
        assert [env[matrix.HAS_CUDA_VARIABLE] for env in seen] == [told, told]
        assert matrix.has_cuda_here({matrix.HAS_CUDA_VARIABLE: told}) is has_cuda
    assert matrix.has_cuda_here({}) is ("cuda" in str(Backend("torch").device))


def test_backward_clauses_share_one_column() -> None:
    """BWD-1, BWD-17: `matrix --backward` shows every clause of spec/backward.md in one
    column, BWD, and the other clauses by family as before."""
    from attnspec.conformance.matrix import family

    assert {family(c) for c in ("BWD-1", "BWD-4", "BWD-17")} == {"BWD"}
    assert family("SDPA-5.1") == "SDPA-5"
