"""The offline device run (docs/gpu.md, issue #35): attnspec on a bare GPU machine that reaches
no package index, in one time-boxed command.

    scripts/gpu-check --device-image OUTDIR          # runs this with the image's python3
    scripts/gpu-check --device-image OUTDIR --plan   # what it would run, and are the wheels ready

It uses the python it is run with (the image's; nothing of its torch, jax or cupy is
touched), installs the carried wheels of .device-wheels/ (scripts/fetch-device-wheels) with
``pip install --no-index --no-deps --target SITE`` and puts SITE first on PYTHONPATH, then:

1. env: the device, driver and library versions, and which backends see a GPU;
2. survey: ``attnspec backends``, the reference against the float64 oracle on every backend
   and dtype (CuPy, torch-cuda and jax-cuda in float16, bfloat16 and float32 on a GPU);
3. side by side, each in its own process: ``attnspec matrix`` on each known kernel that can
   run on the image (PyTorch SDPA's math, efficient, flash and cuDNN CUDA backends, SDPA as
   dispatched, nn.MultiheadAttention, jax.nn's 'xla' and 'cudnn', flax, flash-linear-
   attention's Triton chunk and fused-recurrent gated delta rules; torch and jax put
   the CPU rows on their default device, the GPU), ``attnspec check`` on SDPA pinned to
   each CUDA backend in float16 and bfloat16 with the inputs it takes
   (scripts/device_sdpa.py), on FlexAttention compiled by torch.compile
   (scripts/device_flex.py) and on the reference on each GPU backend, all quick profile;
4. bench: scripts/device_bench.py, alone on the GPU: the reference (torch-cuda, CuPy)
   against SDPA's flash backend, achieved TFLOP/s against the card's peak;
5. the matrix rows merged into one matrix.json and matrix.md, the checks' JUnit files into
   one junit.xml.

Every step has a time box (``timeout``: SIGTERM, then SIGKILL), and the whole run a budget
(default 450 s, for an 8-minute box on one H100 with the machine's start outside it): a
step that fails or times out is recorded in summary.txt and the run goes on; a step that
needs a GPU none of the backends sees says "needs a GPU" without running.  It writes at most
8 files into OUTDIR (the device tool brings back no more): summary.txt, survey.txt,
matrix.json, matrix.md, junit.xml, checks.json (the checks' JSON reports), bench.json and
log.txt (every step's output).  Exit status 0 when every step that ran finished (a
divergence is a finding, not a failure), 1 otherwise, 2 when it could not start.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".device-wheels"
PINS = ROOT / "scripts" / "device-wheels.txt"
OUT_FILES = (
    "summary.txt",
    "survey.txt",
    "matrix.json",
    "matrix.md",
    "junit.xml",
    "checks.json",
    "bench.json",
    "log.txt",
)
# The whole run's budget: an 8-minute box on one H100 (issue #35) holds it with room for the
# last step's floor (MERGE_FLOOR_S) and the summary; the machine's start is outside it.
BUDGET_S = 450
RESERVE_S = 120  # kept for bench and merge after the side-by-side phase (a quarter at most)
SIDE_BY_SIDE_MAX_S = 300
MIN_BOX_S = 5  # a phase with less time than this left is skipped, not started
MERGE_FLOOR_S = 10  # the merge runs even when the budget is spent: it is what comes back
GRACE_S = 10  # between SIGTERM (attnspec writes the verdicts it has) and SIGKILL
# how often a phase looks at its steps: a step's end is seen this long after it ended at
# most (each phase of a run waited 0.2 s past its last step, and a stub's steps end at once)
POLL_S = 0.05
STOP_S = GRACE_S + 1  # the most a stopped step takes past its box (SIGKILL is final)
LOG_TAIL_BYTES = 400_000  # of each step's output in log.txt
NEEDS_A_GPU = "needs a GPU"

# what the image already has and the run must never replace (docs/gpu.md)
IMAGE_PACKAGES = ("torch", "jax", "jaxlib", "cupy", "numpy", "hypothesis", "triton", "flax")

# The known kernels the matrix step checks, each by a substring of its name that matches it
# alone (``attnspec matrix --kernel``): those that run on the image, i.e. whose libraries it
# has.  FlexAttention's eager rows are left out: on a GPU FlexAttention is run compiled,
# which device_flex.py checks; eagerly it took over 11 minutes of CPU in the CPU matrix.
MATRIX_KERNELS: dict[str, tuple[str, str]] = {
    # step name: (--kernel substring, which GPU it needs: "" runs anywhere)
    "sdpa-cuda-math": ("sdpa_cuda_math", "torch"),
    "sdpa-cuda-efficient": ("sdpa_cuda_efficient", "torch"),
    "sdpa-cuda-flash": ("sdpa_cuda_flash", "torch"),
    "sdpa-cuda-cudnn": ("sdpa_cuda_cudnn", "torch"),
    "sdpa": ("torch.nn.functional:scaled_dot_product_attention", ""),
    "sdpa-pinned-math": (":sdpa_math", ""),
    "sdpa-pinned-flash": (":sdpa_flash", ""),
    "mha": ("torch.nn:MultiheadAttention", ""),
    "mha-no-weights": ("multihead_attention_no_weights", ""),
    "jax-nn-xla": ("jax.nn:dot_product_attention", ""),
    "jax-nn-cudnn": ("dot_product_attention_cudnn", "jax"),
    "flax-nnx": ("flax.nnx:dot_product_attention", ""),
    "flax-linen": ("flax.linen:dot_product_attention", ""),
    # flash-linear-attention's Triton kernels (the carried fla-core and einops wheels)
    "fla-chunk-gated-delta": ("fla.ops.gated_delta_rule:chunk_gated_delta_rule", "torch"),
    "fla-fused-recurrent-gated-delta": (
        "fla.ops.gated_delta_rule:fused_recurrent_gated_delta_rule",
        "torch",
    ),
}
REFERENCE = "attnspec.reference:scaled_dot_product_attention"
CLI = ("-m", "attnspec.conformance.cli")


@dataclass
class Step:
    """One command of the run: ``python ARGV`` with a time box."""

    name: str
    argv: list[str]
    box_s: int
    needs_gpu: str = ""  # "torch", "jax" or "cupy": the backend that must see a GPU
    kind: str = "check"  # env | survey | matrix | check | bench | merge
    nice: int = 0  # steps that re-run CPU rows on the GPU yield the CPUs to the CUDA ones
    stdout: Path | None = None  # where its standard output goes (besides log.txt)
    report: Path | None = None  # its JSON (matrix part, check report, bench)
    junit: Path | None = None


def _quick_step(
    name: str,
    command: list[str],
    options: list[str],
    reports: tuple[Path, str, str],
    box_s: int,
    **step: Any,
) -> Step:
    """A side-by-side step ``attnspec COMMAND --profile quick --quiet OPTIONS --json REPORT
    FLAG REPORT.SUFFIX`` (``reports``: the JSON report, and the flag and suffix of the one
    written beside it, Markdown for a matrix row, JUnit for a check)."""
    report, flag, suffix = reports
    argv = [*CLI, *command, "--profile", "quick", "--quiet", *options, "--json", str(report)]
    return Step(name, [*argv, flag, str(report.with_suffix(suffix))], box_s, report=report, **step)


@dataclass
class Result:
    step: Step
    status: str  # done | findings | failed | timed out | needs a GPU | skipped
    seconds: float = 0.0
    note: str = ""
    returncode: int | None = None
    log: str = ""


@dataclass
class Plan:
    python: str
    work: Path
    out: Path
    budget_s: int
    only: list[str]  # --only for every check and matrix row (a short rehearsal)
    env_step: Step
    survey: Step
    side_by_side: list[Step]
    bench: Step
    merge: Step


def plan_run(
    python: str,
    work: Path,
    out: Path,
    budget_s: int = BUDGET_S,
    only: Sequence[str] = (),
    side_box_s: int = SIDE_BY_SIDE_MAX_S,
) -> Plan:
    """Every step of the run, in its phase, with its command and box (``side_box_s`` for
    each of the side-by-side steps)."""
    only_args = [a for p in only for a in ("--only", p)]
    env_step = Step("env", ["-c", ENV_PROBE], 60, kind="env", stdout=work / "env.json")
    survey = Step("survey", [*CLI, "backends"], 120, kind="survey", stdout=out / "survey.txt")
    side_by_side = []
    for name, (kernel, gpu) in MATRIX_KERNELS.items():
        part = work / "matrix" / f"{name}.json"
        side_by_side.append(
            _quick_step(
                f"matrix {name}",
                ["matrix", "--kernel", kernel],
                only_args,
                (part, "--markdown", ".md"),
                side_box_s,
                needs_gpu=gpu,
                kind="matrix",
                nice=0 if gpu else 10,
            )
        )
    flex = str(ROOT / "scripts" / "device_flex.py")
    # a call that compiles a new Triton kernel may take longer than the default 60 s while
    # the other steps share the CPUs
    compiling = ["--timeout", "180"]
    sdpa = str(ROOT / "scripts" / "device_sdpa.py")
    checks = [
        *(
            (f"sdpa-cuda-{b}-half", f"{sdpa}:sdpa_cuda_{b}_half", "torch", [])
            for b in ("math", "efficient", "flash", "cudnn")
        ),
        ("flex-compiled-block-mask", f"{flex}:flex_compiled_block_mask", "torch", compiling),
        ("flex-compiled-score-mod", f"{flex}:flex_compiled_score_mod", "torch", compiling),
        ("reference-cupy", REFERENCE, "cupy", ["--bias", "--gqa"]),
        ("reference-torch-cuda", REFERENCE, "torch", ["--bias", "--gqa"]),
        ("reference-jax-gpu", REFERENCE, "jax", ["--bias", "--gqa"]),
    ]
    for name, target, gpu, claims in checks:
        report = work / "checks" / f"{name}.json"
        side_by_side.append(
            _quick_step(
                f"check {name}",
                ["check", target, "--backend", gpu, "--device", "cuda", *claims],
                ["--jobs", "1", *only_args],
                (report, "--junit", ".xml"),
                side_box_s,
                needs_gpu=gpu,
                kind="check",
                junit=report.with_suffix(".xml"),
            )
        )
    bench = Step(
        "bench",
        [str(ROOT / "scripts" / "device_bench.py"), "--json", str(out / "bench.json")],
        90,
        kind="bench",
        report=out / "bench.json",
    )
    merge = Step(
        "merge matrix",
        [
            *CLI,
            "matrix",
            "--quiet",
            "--markdown",
            str(out / "matrix.md"),
            "--json",
            str(out / "matrix.json"),
        ],
        60,
        kind="merge",
    )
    return Plan(
        python, work, out, budget_s, list(only), env_step, survey, side_by_side, bench, merge
    )


# The env step: versions and devices, as JSON on stdout (stdlib and the image's libraries).
ENV_PROBE = r"""
import json, platform, subprocess, sys
found = {"python": sys.version.split()[0], "executable": sys.executable,
         "platform": platform.platform(), "gpu": {}}
def version(name):
    try:
        module = __import__(name)
        return getattr(module, "__version__", "?") + " at " + str(getattr(module, "__file__", "?"))
    except Exception as exc:
        return "missing: " + type(exc).__name__ + ": " + str(exc)[:200]
for name in ("attnspec", "array_api_compat", "array_api_strict", "numpy", "hypothesis",
             "torch", "triton", "jax", "jaxlib", "flax", "cupy"):
    found[name] = version(name)
try:
    import torch
    found["gpu"]["torch"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        found["torch_device"] = torch.cuda.get_device_name()
        found["torch_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        found["torch_cuda"] = torch.version.cuda
        found["cudnn"] = torch.backends.cudnn.version()
        flash = getattr(torch.backends.cuda, "is_flash_attention_available", None)
        found["sdpa_flash_built"] = flash() if flash else "unknown"
except Exception as exc:
    found["gpu"]["torch"] = False
    found["torch_error"] = str(exc)[:300]
try:
    import jax
    found["jax_devices"] = [str(d) for d in jax.devices()]
    found["gpu"]["jax"] = any(d.platform == "gpu" for d in jax.devices())
except Exception as exc:
    found["gpu"]["jax"] = False
    found["jax_error"] = str(exc)[:300]
try:
    import cupy
    found["gpu"]["cupy"] = cupy.cuda.runtime.getDeviceCount() > 0
except Exception as exc:
    found["gpu"]["cupy"] = False
    found["cupy_error"] = str(exc)[:300]
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    found["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
except Exception as exc:
    found["nvidia_smi"] = "not run: " + str(exc)[:200]
print(json.dumps(found))
"""


# --- the install -----------------------------------------------------------------------


def wheels_in(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.whl"))


def pinned() -> list[str]:
    """``name==version`` of every pinned wheel (scripts/device-wheels.txt)."""
    return [
        line.split("#")[0].strip()
        for line in PINS.read_text(encoding="utf-8").splitlines()
        if line.split("#")[0].strip()
    ]


def _dist(name: str) -> str:
    """A distribution name as wheel files spell it (PEP 427: - and . become _)."""
    return name.replace("-", "_").replace(".", "_").lower()


def wheel_problems(folder: Path) -> list[str]:
    """Why the carried wheels are not ready: missing, not pure Python, too large, or an
    attnspec wheel whose files differ from this working tree."""
    wheels = wheels_in(folder)
    if not wheels:
        return [f"no wheels in {folder}: run scripts/fetch-device-wheels"]
    problems = []
    names = {w.name.split("-")[0].lower(): w for w in wheels}
    for pin in pinned():
        name, _, version = pin.partition("==")
        wheel = names.get(_dist(name))
        if wheel is None or wheel.name.split("-")[1] != version:
            problems.append(f"{pin} is not among the wheels: run scripts/fetch-device-wheels")
    problems += [f"{w.name} is not pure Python" for w in wheels if "-py3-none-any" not in w.name]
    problems += [
        f"{w.name} would replace the image's {w.name.split('-')[0]}"
        for w in wheels
        if w.name.split("-")[0].lower() in IMAGE_PACKAGES
    ]
    if "attnspec" not in names:
        problems.append("no attnspec wheel: run scripts/fetch-device-wheels")
    else:
        problems += [
            f"the attnspec wheel is stale ({p}): run scripts/fetch-device-wheels"
            for p in stale_files(names["attnspec"])[:5]
        ]
    return problems


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def stale_files(wheel: Path, root: Path = ROOT) -> list[str]:
    """The package files on which the attnspec wheel and this working tree differ: changed,
    gone from the tree, or new in one of the wheel's folders (by the RECORD's hashes)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = archive.read(record).decode().splitlines()
    hashes = {}
    for row in rows:
        path, digest = row.split(",")[:2]
        if path.startswith("attnspec/") and digest.startswith("sha256="):
            hashes[path.removeprefix("attnspec/")] = digest.removeprefix("sha256=")
    stale = []
    for relative, digest in sorted(hashes.items()):
        source = root / relative
        if not source.is_file():
            stale.append(f"{relative} is gone")
        elif _digest(source.read_bytes()) != digest:
            stale.append(f"{relative} changed")
    folders = {Path(r).parent for r in hashes if r.endswith(".py")}
    for folder in sorted(folders):
        for source in sorted((root / folder).glob("*.py")):
            relative = source.relative_to(root).as_posix()
            if relative not in hashes:
                stale.append(f"{relative} is new")
    # a package folder of the tree that the wheel lacks altogether: building again does not
    # help while pyproject.toml's list of packages does not name it
    tops = {Path(r).parts[0] for r in hashes if len(Path(r).parts) > 1 and r.endswith(".py")}
    for top in sorted(tops):
        for init in sorted((root / top).rglob("__init__.py")):
            folder = init.parent.relative_to(root)
            if folder not in folders:
                package = ".".join(("attnspec", *folder.parts))
                stale.append(
                    f"{folder.as_posix()}/ is not in the wheel: is {package} among "
                    "pyproject.toml's [tool.setuptools] packages?"
                )
    return stale


def install(python: str, wheels: Path, site: Path, box_s: int = 120) -> Result:
    """The carried wheels into ``site``, from no index, with none of their dependencies."""
    step = Step("install", [], box_s, kind="install")
    problems = wheel_problems(wheels)
    if problems:
        return Result(step, "failed", note="; ".join(problems))
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    argv = [python, *install_args(wheels_in(wheels), site)]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=box_s, check=False)
    except subprocess.TimeoutExpired:
        return Result(step, "timed out", box_s, f"pip install took over {box_s} s")
    seconds = time.monotonic() - started
    log = f"$ {shlex.join(argv)}\n{done.stdout}{done.stderr}"
    if done.returncode != 0:
        return Result(step, "failed", seconds, "pip install failed", done.returncode, log)
    replaced = sorted(p.name for p in site.iterdir() if p.name.lower() in IMAGE_PACKAGES)
    if replaced:
        return Result(step, "failed", seconds, f"would shadow the image's {replaced}", 0, log)
    names = ", ".join(w.name for w in wheels_in(wheels))
    return Result(step, "done", seconds, f"into {site}: {names}", 0, log)


def install_args(wheels: Sequence[Path], site: Path) -> list[str]:
    return [
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--target",
        str(site),
        *(str(w) for w in wheels),
    ]


# --- running steps -----------------------------------------------------------------------


def step_env(site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    env.update(
        PYTHONUNBUFFERED="1",
        # several processes share the GPU: JAX must not take 75% of its memory up front
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        # nor may each of them start a compile worker per CPU (Inductor's default)
        TORCHINDUCTOR_COMPILE_THREADS="4",
        # some 20 steps share the CPUs side by side: one BLAS/OpenMP thread each, not a
        # worker's default of every CPU (attnspec keeps a thread variable that is set)
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PIP_NO_INDEX="1",
    )
    return env


def _log_path(step: Step, work: Path) -> Path:
    return work / "logs" / f"{step.name.replace(' ', '-')}.log"


def start(step: Step, python: str, env: dict[str, str], work: Path) -> subprocess.Popen[bytes]:
    """``python ARGV`` in its own process group, stderr (and stdout, unless the step keeps
    it in a file of its own) to its log."""
    log = _log_path(step, work)
    log.parent.mkdir(parents=True, exist_ok=True)
    for path in (step.stdout, step.report, step.junit):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as handle:
        handle.write(f"$ {shlex.join([python, *step.argv])}\n".encode())
    with log.open("ab") as err, (step.stdout or log).open("ab") as out:
        process = subprocess.Popen(
            [python, *step.argv],
            stdout=out,
            stderr=err,
            cwd=work,
            env=env,
            start_new_session=True,  # its own process group: the box ends its workers too
        )
    if step.nice:
        # set from here, not by a preexec_fn, which may deadlock a process with threads
        # (one that has JAX or PyTorch loaded); the step's workers, started after its
        # imports, inherit it
        priority = os.getpriority(os.PRIO_PROCESS, 0) + step.nice
        os.setpriority(os.PRIO_PROCESS, process.pid, min(priority, 19))
    return process


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc): attnspec's workers run in sessions of
    their own, out of reach of a signal to the step's process group."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """``sig`` to the step's process group, and to its workers where it is SIGKILL (on
    SIGTERM attnspec ends its workers itself)."""
    below = descendants(process.pid) if sig == signal.SIGKILL else []
    for kill, target in [(os.killpg, process.pid), *((os.kill, pid) for pid in below)]:
        try:
            kill(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def run_steps(
    steps: Sequence[Step], python: str, env: dict[str, str], work: Path, box_s: float
) -> list[Result]:
    """Run ``steps`` side by side, each stopped at ``min(its box, box_s)`` seconds: SIGTERM
    to its process group (attnspec writes the verdicts it has), SIGKILL GRACE_S later."""
    started = time.monotonic()
    running = {step.name: start(step, python, env, work) for step in steps}
    terminated: dict[str, float] = {}  # step -> when SIGTERM was sent
    ended: dict[str, tuple[str, float, str]] = {}
    while True:
        now = time.monotonic()
        for step in steps:
            process = running[step.name]
            limit = min(step.box_s, box_s)
            if step.name in ended:
                continue
            if process.poll() is not None:
                if step.name in terminated:
                    status, note = "timed out", f"stopped at its box of {limit:.0f} s"
                else:
                    status, note = classify(step, process.returncode), ""
                ended[step.name] = (status, now - started, note)
            elif step.name not in terminated and now - started > limit:
                _signal(process, signal.SIGTERM)
                terminated[step.name] = now
            elif step.name in terminated and now - terminated[step.name] > GRACE_S:
                _signal(process, signal.SIGKILL)
        if len(ended) == len(steps):
            break
        time.sleep(POLL_S)
    results = []
    for step in steps:
        status, seconds, note = ended[step.name]
        log = _log_path(step, work).read_bytes()[-LOG_TAIL_BYTES:]
        if step.stdout is not None and step.stdout.is_file():
            log += b"\n--- standard output ---\n" + step.stdout.read_bytes()[-LOG_TAIL_BYTES:]
        results.append(
            Result(
                step,
                status,
                seconds,
                note,
                running[step.name].returncode,
                log.decode(errors="replace"),
            )
        )
    return results


def classify(step: Step, returncode: int) -> str:
    """``attnspec check`` exits 1 when a property failed: a finding; 2 is an error."""
    if returncode == 0:
        return "done"
    if step.kind == "check" and returncode == 1:
        return "findings"
    return "failed"


def needs_gpu_result(step: Step, gpu: dict[str, bool]) -> Result | None:
    if step.needs_gpu and not gpu.get(step.needs_gpu):
        return Result(step, NEEDS_A_GPU, note=f"{step.needs_gpu} sees no GPU here")
    return None


# --- results -----------------------------------------------------------------------------


def merge_junit(paths: Sequence[Path], into: Path) -> int:
    """Every testsuite of ``paths`` in one <testsuites>; returns how many."""
    merged = ET.Element("testsuites")
    for path in paths:
        if path.is_file():
            try:
                root = ET.parse(path).getroot()
            except ET.ParseError:
                continue
            merged.extend(root.iter("testsuite") if root.tag == "testsuites" else [root])
    ET.ElementTree(merged).write(into, encoding="utf-8", xml_declaration=True)
    return len(merged)


def check_line(result: Result) -> str:
    """The verdict counts of a check's JSON report."""
    if result.step.report is None or not result.step.report.is_file():
        return ""
    try:
        report = json.loads(result.step.report.read_text(encoding="utf-8"))
    except ValueError:
        return "its JSON report does not parse"
    counts = report.get("counts", {})
    failed = sorted({v["property"] for v in report.get("verdicts", []) if v["status"] == "failed"})
    words = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    tail = f"; failed: {', '.join(failed)}" if failed else ""
    incomplete = "; INCOMPLETE" if not report.get("complete", True) else ""
    return f"on {report.get('device')}: {words}{tail}{incomplete}"


def matrix_line(part: Path, kernel: str) -> str:
    if not part.is_file():
        return ""
    try:
        rows = json.loads(part.read_text(encoding="utf-8"))
    except ValueError:
        return "its JSON does not parse"
    for row in rows:
        if kernel in row["name"]:
            n = len(row.get("divergences", []))
            status = row["status"]
            reason = f": {row['reason']}" if row.get("reason") else ""
            seen = f", {n} distinct divergence{'s' * (n != 1)}" if status == "checked" else ""
            cut = " (INCOMPLETE)" if "incomplete" in row.get("claim", "") else ""
            return f"{status}{reason}{seen}{cut}"
    return ""


def summary_text(plan: Plan, env: dict[str, object], results: Sequence[Result], wall: float) -> str:
    lines = [
        "attnspec device run (scripts/gpu-check --device-image; docs/gpu.md)",
        f"finished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
        f"{wall:.0f} s of a {plan.budget_s} s budget, python {plan.python}",
    ]
    if plan.only:
        lines.append(f"properties restricted to: {', '.join(plan.only)} (a rehearsal)")
    lines.append("")
    lines.append("environment:")
    for key, value in env.items():
        lines.append(f"  {key}: {value}")
    lines.append("")
    # the matrix labels a row by the device its kernel is declared for; torch and jax put a
    # CPU-declared row on their default device, which is the GPU wherever they see one
    seen = str(env.get("GPU seen by", ""))
    lines.append(
        "matrix rows declared for the CPU ran on: "
        f"torch {'cuda:0' if 'torch' in seen else 'cpu'}, "
        f"jax {'gpu:0' if 'jax' in seen else 'cpu'}"
    )
    lines.append("")
    lines.append("steps (status, seconds, what):")
    for r in results:
        detail = r.note
        if r.step.kind == "matrix" and r.step.report is not None:
            kernel = MATRIX_KERNELS[r.step.name.removeprefix("matrix ")][0]
            detail = "; ".join(x for x in (matrix_line(r.step.report, kernel), r.note) if x)
        elif r.step.kind == "check":
            detail = "; ".join(x for x in (check_line(r), r.note) if x)
        lines.append(f"  {r.step.name:32s} {r.status:12s} {r.seconds:6.1f}  {detail}".rstrip())
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("")
    lines.append("result: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return "\n".join(lines) + "\n"


def write_log(results: Sequence[Result], into: Path) -> None:
    with into.open("w", encoding="utf-8") as handle:
        for r in results:
            handle.write(f"===== {r.step.name}: {r.status} ({r.seconds:.1f} s) {r.note}\n")
            handle.write(r.log)
            handle.write("\n")


# --- the run -----------------------------------------------------------------------------


def execute(plan: Plan, wheels: Path, site: Path) -> int:
    """Install, run every step in its phase within the budget, write the results."""
    begun = time.monotonic()
    plan.out.mkdir(parents=True, exist_ok=True)
    plan.work.mkdir(parents=True, exist_ok=True)
    installed = install(plan.python, wheels, site)
    _progress(installed)
    results = [installed]
    env_info: dict[str, object] = {}
    if installed.status == "done":
        env_info, steps = run_phases(plan, step_env(site), begun + plan.budget_s)
        results += steps
    write_results(plan, results)
    text = summary_text(plan, env_info, results, time.monotonic() - begun)
    (plan.out / "summary.txt").write_text(text, encoding="utf-8")
    print(text, end="")
    stray = sorted(p.name for p in plan.out.iterdir() if p.name not in OUT_FILES)
    if stray:
        print(f"device run: unexpected files in {plan.out}: {stray}", file=sys.stderr)
        return 1
    bad = [r for r in results if r.status in ("failed", "timed out", "skipped")]
    return 1 if bad else 0


def run_phases(
    plan: Plan, env: dict[str, str], deadline: float
) -> tuple[dict[str, object], list[Result]]:
    """env, survey, the side-by-side steps, bench, merge: what the env step found, and
    every step's result."""

    def left() -> float:  # for a phase that may be stopped: its stop fits the budget too
        return deadline - time.monotonic() - STOP_S

    results = run_steps([plan.env_step], plan.python, env, plan.work, left())
    _progress(results[-1])
    env_info, gpu = read_env(plan.env_step)
    results += run_steps([plan.survey], plan.python, env, plan.work, left())
    survey = plan.out / "survey.txt"
    results[-1].note = survey_note(survey.read_text(errors="replace") if survey.is_file() else "")
    _progress(results[-1])
    waiting = [r for r in (needs_gpu_result(s, gpu) for s in plan.side_by_side) if r]
    runnable = [s for s in plan.side_by_side if all(r.step is not s for r in waiting)]
    longest = max((s.box_s for s in runnable), default=0)
    box = min(longest, left() - min(RESERVE_S, plan.budget_s // 4))
    if box < MIN_BOX_S:
        side = [Result(s, "skipped", note="no time left in the budget") for s in runnable]
    else:
        print(f"device run: {len(runnable)} steps side by side, box {box:.0f} s", flush=True)
        side = run_steps(runnable, plan.python, env, plan.work, box)
    for r in [*side, *waiting]:
        _progress(r)
    results += side + waiting
    if gpu.get("torch"):
        results += run_steps([plan.bench], plan.python, env, plan.work, left() - MERGE_FLOOR_S)
    else:  # the same code on the CPU, tiny: a rehearsal proves that it runs
        plan.bench.argv = [*plan.bench.argv, "--smoke"]
        smoke = run_steps([plan.bench], plan.python, env, plan.work, left() - MERGE_FLOOR_S)[0]
        smoke.note = f"torch sees no GPU (the CPU smoke of the same code: {smoke.status})"
        smoke.status = NEEDS_A_GPU if smoke.status == "done" else smoke.status
        results.append(smoke)
    _progress(results[-1])
    parts = sorted((plan.work / "matrix").glob("*.json"))
    plan.merge.argv = [*plan.merge.argv, *(a for p in parts for a in ("--merge", str(p)))]
    results += run_steps([plan.merge], plan.python, env, plan.work, max(MERGE_FLOOR_S, left()))
    _progress(results[-1])
    return env_info, results


def read_env(step: Step) -> tuple[dict[str, object], dict[str, bool]]:
    """The env step's findings, and which backends see a GPU."""
    try:
        found = json.loads(step.stdout.read_text()) if step.stdout else {}
    except (OSError, ValueError) as exc:
        return {"env probe": f"unreadable: {exc}"}, {}
    if not isinstance(found, dict):
        return {"env probe": f"not an object: {found!r}"}, {}
    gpu = {str(k): bool(v) for k, v in dict(found.pop("gpu", {})).items()}
    found["GPU seen by"] = ", ".join(k for k, v in gpu.items() if v) or "none"
    return found, gpu


def write_results(plan: Plan, results: Sequence[Result]) -> None:
    """junit.xml, checks.json, bench.json (when the bench wrote none) and log.txt."""
    junits = [s.junit for s in plan.side_by_side if s.junit is not None]
    merge_junit(junits, plan.out / "junit.xml")
    checks: dict[str, object] = {}
    for s in plan.side_by_side:
        if s.kind == "check" and s.report is not None and s.report.is_file():
            try:
                checks[s.name] = json.loads(s.report.read_text(encoding="utf-8"))
            except ValueError:
                checks[s.name] = {"error": "the report does not parse"}
    (plan.out / "checks.json").write_text(json.dumps(checks, indent=1) + "\n", encoding="utf-8")
    if not (plan.out / "bench.json").is_file():
        (plan.out / "bench.json").write_text('{"status": "not run"}\n', encoding="utf-8")
    write_log(results, plan.out / "log.txt")


def survey_note(text: str) -> str:
    rows = [line for line in text.splitlines() if line.rstrip().endswith("TOL-2")]
    outside = [line.split()[0:3] for line in rows if "OUTSIDE" in line]
    on_gpu = [line for line in rows if any(w in line for w in ("cuda", "gpu", "CUDA Device"))]
    note = f"{len(rows)} rows, {len(on_gpu)} on a GPU, {len(outside)} outside TOL-2"
    return note + (f": {outside}" if outside else "")


def _progress(result: Result) -> None:
    print(
        f"device run: {result.step.name}: {result.status} ({result.seconds:.1f} s) {result.note}",
        flush=True,
    )


def show_plan(plan: Plan, wheels: Path) -> int:
    """Print every step; exit 1 when the carried wheels are not ready."""
    print(f"python: {plan.python}\nwheels: {wheels}\nresults: {plan.out} ({', '.join(OUT_FILES)})")
    side = max(s.box_s for s in plan.side_by_side)
    print(f"budget: {plan.budget_s} s; side-by-side box {side} s at most")
    print(f"install: python {shlex.join(install_args(wheels_in(wheels), Path('SITE')))}")
    for step in (plan.env_step, plan.survey, *plan.side_by_side, plan.bench, plan.merge):
        gpu = f" [needs {step.needs_gpu} on a GPU]" if step.needs_gpu else ""
        argv = ["<env probe>"] if step.kind == "env" else step.argv
        print(f"  {step.name} (box {step.box_s} s){gpu}: python {shlex.join(argv)}")
    problems = wheel_problems(wheels)
    for problem in problems:
        print(f"NOT READY: {problem}")
    if not problems:
        print("ready: the wheels are there and the attnspec wheel matches this tree")
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("out", type=Path, help="results folder (at most 8 files)")
    parser.add_argument("--wheels", type=Path, default=WHEELS, help="the carried wheels")
    parser.add_argument("--site", type=Path, help="install target (default: a scratch folder)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temp folder)")
    parser.add_argument("--budget", type=int, default=BUDGET_S, help="seconds for the run")
    parser.add_argument("--python", default=sys.executable, help="python running every step")
    parser.add_argument(
        "--side-box",
        type=int,
        default=SIDE_BY_SIDE_MAX_S,
        help="seconds for the side-by-side steps at most (the budget may leave them less)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only these properties in every check (a short rehearsal)",
    )
    parser.add_argument("--plan", action="store_true", help="print the steps; run nothing")
    args = parser.parse_args(argv)
    if args.work:
        work = args.work
    elif args.plan:
        work = Path("WORK")
    else:
        work = Path(tempfile.mkdtemp(prefix="attnspec-device-"))
    plan = plan_run(args.python, work, args.out.resolve(), args.budget, args.only, args.side_box)
    if args.plan:
        return show_plan(plan, args.wheels)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"device run: {args.out} is not empty", file=sys.stderr)
        return 2
    try:
        return execute(plan, args.wheels, args.site or work / "site")
    finally:
        if not args.work:  # a scratch folder of its own: everything kept is in OUT
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
