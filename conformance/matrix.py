"""The conformance matrix: every known kernel (``known_kernels.KNOWN_KERNELS``) checked
through the suite, one row per kernel, one column per clause family (``SDPA-5`` for
SDPA-5.1 and SDPA-5.2), and each kernel's distinct divergences listed once.

A divergence is a root cause, not a failing property: the failures of one kernel that
share a cause (``report.grouped_findings``: the same exception or wrong return type) or
one confirmed write-up in docs/divergences.md (``known_kernels.known_divergences``) are
one divergence, shown with the clause and the minimal case of the first property that
met it; failures that pass when re-run around another failed (or waived) clause's inputs
are listed under it as its consequences (:mod:`.root_causes`).  The causes the
diagnosis probes established (:mod:`.judge.diagnosis`) come first, as in the console
report, each with its evidence, hint and the properties whose failures it explains; a
divergence whose properties one of them explains says so.  ``attnspec matrix`` writes
the Markdown (docs/matrix.md) and a JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .judge.verdict import FAILED, NOT_APPLICABLE, PASSED, WAIVED, WARNING, Cause, Report
from .kernels.known import KNOWN_KERNELS, KnownKernel
from .report.render import divergence_count, divergence_markdown, told_cause
from .run.root_causes import Divergence, MergedFinding, by_cause, divergences
from .run.supervisor import worker_threads

NOT_INSTALLED, NEEDS_GPU, CHECKED, SETUP_FAILED, NOT_SELECTED = (
    "not installed",
    "needs a GPU",
    "checked",
    "setup failed",
    "not run",
)


@dataclass
class MatrixRow:
    name: str
    backend: str
    device: str
    note: str
    status: str  # checked | not installed | needs a GPU | setup failed
    reason: str = ""
    claim: str = ""
    seconds: float = 0.0
    cells: dict[str, str] = field(default_factory=dict)  # clause family -> verdict word
    divergences: list[Divergence] = field(default_factory=list)
    # the causes diagnosis probes established, as the console tells them (causes_of)
    causes: list[dict[str, Any]] = field(default_factory=list)


def family(clause: str) -> str:
    """``SDPA-5.1`` -> ``SDPA-5``: the column a clause's verdict is shown in; every clause of
    the backward pass (spec/backward.md) in one column, ``BWD``."""
    return "BWD" if clause.startswith("BWD-") else clause.split(".")[0]


_RANK = {FAILED: 4, WARNING: 3, WAIVED: 2, PASSED: 1, NOT_APPLICABLE: 0}


def cells_of(report: Report) -> dict[str, str]:
    """Each clause family's verdict: the worst of its properties' (waived when the
    declaration waives a clause of it and nothing of it failed)."""
    worst: dict[str, str] = {}
    for verdict in report.verdicts:
        column = family(verdict.clause)
        if _RANK.get(verdict.status, 0) >= _RANK.get(worst.get(column, NOT_APPLICABLE), 0):
            worst[column] = verdict.status
    for clause in report.waived:
        if worst.get(family(clause)) in (None, NOT_APPLICABLE, PASSED):
            worst[family(clause)] = WAIVED
    return worst


def divergences_of(report: Report, write_ups: dict[str, str]) -> list[Divergence]:
    """The report's distinct divergences, each with the failures that follow from it
    (:func:`.root_causes.divergences`: established by re-running them around it)."""
    return divergences(report, write_ups)


def causes_of(report: Report) -> list[dict[str, Any]]:
    """Each cause a diagnosis probe established (:func:`.root_causes.by_cause`), with the
    properties whose failures it explains (``explains``), as the JSON report has them."""
    groups, _ = by_cause(report)
    return [
        {**asdict(group.cause), "explains": [v.property for v in group.failures]}
        for group in groups
    ]


def _only_finding(d: Divergence) -> MergedFinding:
    """The one minimal case of a divergence saved before divergences listed theirs."""
    return MergedFinding(d.clause, d.level, d.status, list(d.properties), d.finding, d.inputs)


def relink(row: MatrixRow, write_ups: dict[str, str]) -> MatrixRow:
    """``row`` with write-ups confirmed since it ran linked, and divergences that one
    write-up explains merged (for rows taken from an earlier run)."""
    from .judge.registry import all_properties
    from .kernels.known import confirms

    registry = all_properties()
    by_link: dict[str, Divergence] = {}
    kept = []
    for d in row.divergences:
        # a waived clause's write-up is filed under the properties that meet it; a link
        # holds when the write-up explains this failure (known_kernels.confirms), and
        # properties confirmed by different write-ups leave the divergence unconfirmed
        named = d.properties or [c.split()[0] for c in d.consequences]
        # a waived clause has no case of its own: its consequences' cases show it
        evidence = " ".join([d.finding, d.inputs, *(d.evidence if d.status == WAIVED else [])])
        links = {
            write_ups[p]
            for p in named
            if p in write_ups
            and p in registry
            and confirms(write_ups[p], registry[p].clause, d.clause, evidence)
        }
        d.write_up = links.pop() if len(links) == 1 else ""
        if d.write_up in by_link:
            kept_one = by_link[d.write_up]
            kept_one.properties += d.properties
            kept_one.consequences += d.consequences
            kept_one.evidence += d.evidence  # one line per consequence, in its order
            kept_one.findings += d.findings or [_only_finding(d)]
            continue
        if d.write_up:
            by_link[d.write_up] = d
            d.findings = d.findings or [_only_finding(d)]
        kept.append(d)
    row.divergences = kept
    return row


def unavailable(entry: KnownKernel, has_cuda: bool) -> MatrixRow | None:
    """The row of a kernel that cannot be checked here, or None when it can."""
    row = MatrixRow(entry.name, entry.backend, entry.device, entry.note, "")
    missing = entry.missing()
    if missing:
        row.status, row.reason = NOT_INSTALLED, missing
    elif entry.device == "cuda" and not has_cuda:
        row.status, row.reason = NEEDS_GPU, "declared for CUDA; no GPU on this machine"
    elif entry.gpu_only_here and not has_cuda:
        row.status, row.reason = NEEDS_GPU, f"no GPU on this machine: {entry.gpu_only_here}"
    else:
        return None
    return row


_FULL_NAMES = {e.name for e in KNOWN_KERNELS}


def select(names: Sequence[str] | None) -> list[KnownKernel]:
    """The known kernels whose name contains one of ``names`` (all when None)."""
    if not names:
        return list(KNOWN_KERNELS)
    # a name spelt in full is that kernel alone (jax.nn's is part of keras-on-jax's)
    chosen = [
        e
        for e in KNOWN_KERNELS
        if any(n == e.name or (n in e.name and n not in _FULL_NAMES) for n in names)
    ]
    if not chosen:
        raise ValueError(
            f"--kernel {', '.join(names)} matches no known kernel; known: "
            f"{', '.join(e.name for e in KNOWN_KERNELS)}"
        )
    return chosen


def build_rows(
    entries: Sequence[KnownKernel], check: Callable[[KnownKernel], MatrixRow], has_cuda: bool
) -> list[MatrixRow]:
    return [unavailable(entry, has_cuda) or check(entry) for entry in entries]


def unselected_row(entry: KnownKernel, earlier: dict[str, MatrixRow], has_cuda: bool) -> MatrixRow:
    """The row of a kernel that ``--kernel`` left out: its checked row from an earlier run
    (``--merge``), else why it cannot run here (not installed, needs a GPU), else "left out"."""
    return (
        earlier.get(entry.name)
        or unavailable(entry, has_cuda)
        or MatrixRow(
            entry.name,
            entry.backend,
            entry.device,
            entry.note,
            NOT_SELECTED,
            reason="left out of this run (--kernel)",
        )
    )


def row_from_report(
    entry: KnownKernel, report: Report, write_ups: dict[str, str], seconds: float
) -> MatrixRow:
    return MatrixRow(
        entry.name,
        report.backend,
        entry.device,
        entry.note,
        CHECKED,
        claim=report.claim,
        seconds=seconds,
        cells=cells_of(report),
        divergences=divergences_of(report, write_ups),
        causes=causes_of(report),
    )


def rows_in(path: str | Path) -> list[MatrixRow]:
    """The rows of a JSON file that :func:`to_json` wrote."""
    with open(path, encoding="utf-8") as file:
        found = json.load(file)
    for data in found:
        data["divergences"] = [
            Divergence(**{**d, "findings": [MergedFinding(**f) for f in d.get("findings", [])]})
            for d in data["divergences"]
        ]
    return [MatrixRow(**data) for data in found]


def checked_rows(paths: Sequence[str]) -> dict[str, MatrixRow]:
    """The checked rows of earlier runs' JSON files, by kernel name (a later file wins)."""
    return {row.name: row for path in paths for row in rows_in(path) if row.status == CHECKED}


_MATRIX_COMMAND = (
    "import sys; from attnspec.conformance.cli import main; sys.exit(main(sys.argv[1:]))"
)
# Whether torch's default device is a GPU, as the matrix that starts a kernel's process
# found it ("1" or "0"), for that process: it would otherwise import torch to find it out
# again (~1.8 s of CPU, import and exit, in each kernel's process of --jobs N; the kernel is
# checked in a worker of its own, so that process needs no array library).
HAS_CUDA_VARIABLE = "ATTNSPEC_MATRIX_HAS_CUDA"


def has_cuda_here(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the CUDA rows can run here: torch's default device is a GPU (False where
    torch cannot load), or what the matrix that started this process found
    (HAS_CUDA_VARIABLE)."""
    told = (os.environ if environ is None else environ).get(HAS_CUDA_VARIABLE)
    if told in ("0", "1"):
        return told == "1"
    from ..backends import Backend, BackendError

    try:  # the CUDA rows need torch's default device to be a GPU
        return "cuda" in str(Backend("torch").device)
    except BackendError:
        return False


def rows_in_processes(
    entries: Sequence[KnownKernel],
    jobs: int,
    options: Sequence[str],
    has_cuda: bool | None = None,
) -> list[MatrixRow]:
    """Each of ``entries`` checked by ``attnspec matrix --kernel NAME OPTIONS`` in a process
    of its own, ``jobs`` at a time (``--jobs N``): the kernels' libraries, environment
    (KERAS_BACKEND) and workers stay apart; the rows come back through a JSON file.  Each
    process, and the worker it starts, gets CPUs // ``jobs`` threads in its thread pools
    (isolation.worker_threads; thread variables the user set stand): with a thread per core
    in each of 2 kernels on 2 cores, PyTorch's spinning threads made mask-broadcast 15 s
    instead of 0.8 s.  ``has_cuda`` (this process's :func:`has_cuda_here`) goes with them
    (HAS_CUDA_VARIABLE), so that none imports torch to find it out again."""
    environment = {**os.environ, **worker_threads(jobs)}
    if has_cuda is not None:
        environment[HAS_CUDA_VARIABLE] = "1" if has_cuda else "0"

    def one(index: int, entry: KnownKernel, folder: str) -> MatrixRow:
        out = Path(folder) / f"row-{index}.json"
        command = [
            sys.executable,
            "-c",
            _MATRIX_COMMAND,
            "matrix",
            "--kernel",
            entry.name,
            "--json",
            str(out),
            "--markdown",
            os.devnull,
            *options,
        ]
        status = subprocess.run(
            command, stdin=subprocess.DEVNULL, env=environment, check=False
        ).returncode
        found = [r for r in rows_in(out) if r.name == entry.name] if out.exists() else []
        return (
            found[0]
            if found
            else MatrixRow(
                entry.name,
                entry.backend,
                entry.device,
                entry.note,
                SETUP_FAILED,
                reason=f"its matrix process ended with status {status} and wrote no row",
            )
        )

    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(lambda pair: one(pair[0], pair[1], folder), enumerate(entries)))


# --- rendering ----------------------------------------------------------------------------

_WORD = {PASSED: "pass", FAILED: "FAIL", WARNING: "warn", NOT_APPLICABLE: "–", WAIVED: "waived"}


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _column_key(column: str) -> tuple[str, int]:
    prefix, _, number = column.rpartition("-")
    return (prefix or column, int(number) if number.isdigit() else 0)


def to_markdown(rows: Sequence[MatrixRow], title_note: str = "") -> str:
    checked = [r for r in rows if r.status == CHECKED]
    columns = sorted(
        {c for r in checked for c, v in r.cells.items() if v != NOT_APPLICABLE}, key=_column_key
    )
    lines = [
        "# Conformance matrix of known kernels",
        "",
        "Generated by `attnspec matrix` (quick profile, each kernel in its own worker). "
        "A cell is the worst verdict of the clause family's properties: pass, FAIL, warn "
        "(SHOULD), waived (the declaration names the MUST clause it does not follow, "
        "CONF-7), – (not applicable). Each FAIL links to the kernel's distinct "
        "divergences below; a divergence with a write-up is confirmed against the "
        "float64 definition in [divergences.md](divergences.md).",
        "",
    ]
    if title_note:
        lines += [title_note, ""]
    lines += [
        "| kernel | backend | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for row in checked:
        cells = []
        for column in columns:
            word = _WORD.get(row.cells.get(column, NOT_APPLICABLE), "?")
            cells.append(f"[{word}](#{_anchor(row.name)})" if word == "FAIL" else word)
        lines.append(f"| `{row.name}` | {row.backend} | " + " | ".join(cells) + " |")
    others = [r for r in rows if r.status != CHECKED]
    if others:
        lines += ["", "Not checked here:", ""]
        lines += [f"- `{r.name}` ({r.backend}, {r.device}): {r.status}: {r.reason}" for r in others]
    lines += ["", "## Distinct divergences, kernel by kernel", ""]
    for row in checked:
        # an explicit id: the site's heading slugs drop the dots the table's links keep
        lines += [
            f'<a id="{_anchor(row.name)}"></a>',
            "",
            f"### {row.name}",
            "",
            f"{row.note}. {row.claim} ({row.seconds:.0f} s)",
            "",
        ]
        if not row.divergences:
            lines += ["No divergence.", ""]
        lines.extend(_cause_markdown(row))
        for d in row.divergences:
            target = d.write_up.split(" ")[0].removeprefix("docs/")
            confirmed = (
                f"confirmed: [{d.write_up}]({target})"
                if d.write_up
                else "declared, not checked"
                if d.status == WAIVED
                else "**unconfirmed** (not yet written up)"
            )
            explained = _explaining_cause(row, d)
            if explained:
                confirmed += f"; explained by cause {explained} above"
            lines.extend(divergence_markdown(d, confirmed, clip=300))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cause_markdown(row: MatrixRow) -> list[str]:
    """The causes diagnosis probes established for ``row``'s kernel, as the console tells
    them: explanation, evidence, hint and the properties whose failures each explains."""
    lines = []
    for number, told in enumerate(row.causes, 1):
        cause = Cause(**{k: v for k, v in told.items() if k != "explains"})
        lines.extend(
            told_cause(
                f"- cause {number} (**{cause.clause}**): {cause.explanation}",
                cause,
                [f"`{p}`" for p in told["explains"]],
                "  - ",
            )
        )
    return lines + ([""] if lines else [])


def _explaining_cause(row: MatrixRow, divergence: Divergence) -> int:
    """The number of the cause that explains every property of ``divergence``, 0 if none."""
    named = set(divergence.properties)
    for number, cause in enumerate(row.causes, 1):
        if named and named <= set(cause["explains"]):
            return number
    return 0


def to_json(rows: Sequence[MatrixRow]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2) + "\n"


def summary(rows: Sequence[MatrixRow]) -> str:
    """One line per kernel for the terminal."""
    out = []
    for r in rows:
        if r.status != CHECKED:
            out.append(f"{r.name}: {r.status} ({r.reason})")
        else:
            causes = (
                f", {len(r.causes)} probed cause{'s' * (len(r.causes) != 1)}" if r.causes else ""
            )
            out.append(f"{r.name}: {divergence_count(r.divergences)}{causes} ({r.seconds:.0f} s)")
    return "\n".join(out)
