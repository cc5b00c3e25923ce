"""The offline device run (scripts/device_run.py, ``scripts/gpu-check --device-image``;
docs/gpu.md, issue #35) and its CPU rehearsal.  The device is a bare GPU machine with no
package index, lent for one short call: what can be proven here is proven here.

- the plan fits the device's box, brings back at most 8 files, installs with no index and
  no dependencies, and covers every CUDA row of the matrix (CONF-1: the known kernels);
- the carried attnspec wheel is caught when stale;
- the install puts the carried wheels first on the path without touching the image's
  packages;
- the run with a stub python: a step that hangs is stopped at its box and the run goes on,
  a step needing a GPU that none of the backends sees says so, and the 8 files are written;
- the compiled-FlexAttention adapters (scripts/device_flex.py) compute SDPA-7.1 (run here
  with torch.compile's eager backend) and the benchmark's code runs (CPU smoke);
- the full rehearsal (``scripts/gpu-check --rehearse``) only with ATTNSPEC_REHEARSAL=1.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from oracle import sdpa
from support import ROOT

from attnspec.conformance import declaration_of
from attnspec.conformance.kernels.known import KNOWN_KERNELS

SCRIPTS = ROOT / "scripts"
EIGHT_MINUTES = 480


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"device_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


device_run = _load("device_run")


def test_the_plan_fits_the_device_box(tmp_path: Path) -> None:
    """Every step is time-boxed; the budget, the merge's floor and a stop's grace fit 8
    minutes; the results are at most 8 files with names the device tool brings back."""
    plan = device_run.plan_run(sys.executable, tmp_path / "work", tmp_path / "out")
    steps = [plan.env_step, plan.survey, *plan.side_by_side, plan.bench, plan.merge]
    assert all(0 < s.box_s <= plan.budget_s for s in steps)
    worst = device_run.BUDGET_S + device_run.MERGE_FLOOR_S + device_run.STOP_S
    assert worst <= EIGHT_MINUTES, worst
    assert len(device_run.OUT_FILES) <= 8
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in device_run.OUT_FILES)
    written = {s.stdout for s in steps} | {s.report for s in steps}
    in_out = {p.name for p in written if p is not None and p.parent == plan.out}
    assert in_out <= set(device_run.OUT_FILES), in_out
    assert len({s.name for s in steps}) == len(steps)
    # the side-by-side steps share one GPU and the CPUs: no JAX process takes 75% of the
    # GPU's memory up front, no worker starts a thread per CPU
    env = device_run.step_env(tmp_path / "site")
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "site")


def test_the_matrix_steps_cover_the_image_kernels() -> None:
    """CONF-1: each matrix step's --kernel names exactly one known kernel, every CUDA row
    whose library the image has (torch, jax) is among them and needs that GPU, and every
    CPU row of torch, jax or flax is run too (on the GPU: the backends' default device)."""
    matched = {}
    for name, (substring, gpu) in device_run.MATRIX_KERNELS.items():
        rows = [e for e in KNOWN_KERNELS if substring in e.name]
        assert len(rows) == 1, (name, substring, [e.name for e in rows])
        entry = rows[0]
        assert gpu == (entry.backend if entry.device == "cuda" else ""), (name, entry)
        matched[entry.name] = entry
    image = {"torch", "jax", "flax"}
    left_out = [
        e.name
        for e in KNOWN_KERNELS
        if set(e.requires) <= image and e.name not in matched and "flex_attention" not in e.name
    ]
    assert not left_out, left_out


def test_the_install_takes_no_index_and_no_dependencies(tmp_path: Path) -> None:
    args = device_run.install_args([tmp_path / "a-1-py3-none-any.whl"], tmp_path / "site")
    assert {"--no-index", "--no-deps", "--target"} <= set(args)
    pins = device_run.pinned()
    assert pins and all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", p) for p in pins), pins
    assert not {p.split("==")[0] for p in pins} & set(device_run.IMAGE_PACKAGES)


def test_plan_command_says_when_the_wheels_are_missing(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            "bash",
            str(SCRIPTS / "gpu-check"),
            "--device-image",
            str(tmp_path / "out"),
            "--plan",
            "--wheels",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "GPU_CHECK_PYTHON": sys.executable},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT READY: no wheels" in done.stdout
    assert "sdpa_cuda_flash" in done.stdout and "device_flex.py" in done.stdout
    assert not (tmp_path / "out").exists()


def _copy_tree(into: Path) -> Path:
    """The working tree as scripts/fetch-device-wheels builds it: tracked and untracked
    files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    into.mkdir()
    with tarfile.open(into / "tree.tar", "w") as archive:
        for name in filter(None, listed):
            path = ROOT / name.decode()
            if path.is_file():
                archive.add(path, arcname=name.decode())
    with tarfile.open(into / "tree.tar") as archive:
        archive.extractall(into, filter="data")
    (into / "tree.tar").unlink()
    return into


def _build_wheel(tree: Path, into: Path) -> Path:
    """attnspec's wheel of ``tree`` built by setuptools' PEP 517 hook in a process of its
    own: what ``pip wheel --no-deps --no-build-isolation`` (scripts/fetch-device-wheels)
    runs, the same files, without pip's start-up (~0.7 of its ~1.2 CPU-s)."""
    hook = f"from setuptools import build_meta; build_meta.build_wheel({str(into)!r})"
    subprocess.run(
        [sys.executable, "-c", hook], cwd=tree, capture_output=True, check=True, timeout=300
    )
    (wheel,) = into.glob("attnspec-*.whl")
    return wheel


def _fake_wheel(folder: Path, pin: str) -> Path:
    """A pure-Python wheel named as ``pin`` whose module says where it came from."""
    name, version = pin.split("==")
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\nCARRIED = True\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = [
        f"{path},sha256="
        + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        + f",{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a copy of the working tree, a wheels folder: attnspec built from that copy and
    stand-ins for the pinned wheels)."""
    pytest.importorskip(
        "setuptools",
        minversion="77",
        reason="attnspec's wheel is built offline with the venv's setuptools (>= 77, as torch "
        "requires), which this venv lacks",
    )
    base = tmp_path_factory.mktemp("device")
    tree = _copy_tree(base / "tree")
    wheels = base / "wheels"
    wheels.mkdir()
    _build_wheel(tree, wheels)
    for pin in device_run.pinned():
        _fake_wheel(wheels, pin)
    return tree, wheels


def test_the_wheel_holds_every_package_of_the_tree(built: tuple[Path, Path]) -> None:
    """pyproject.toml lists attnspec's packages one by one (the repository root is the
    package): a subpackage missing there is missing from every installed, non-editable
    attnspec, the device run's included, while the editable checkout imports it fine."""
    tree, wheels = built
    (wheel,) = wheels.glob("attnspec-*.whl")
    assert device_run.stale_files(wheel, tree) == []


def test_a_stale_attnspec_wheel_is_caught(built: tuple[Path, Path], tmp_path: Path) -> None:
    tree, wheels = built
    (wheel,) = wheels.glob("attnspec-*.whl")
    assert device_run.stale_files(wheel, tree) == []
    edited = _copy_tree(tmp_path / "edited")
    (edited / "reference" / "__init__.py").write_text("# changed\n", encoding="utf-8")
    (edited / "backends" / "added.py").write_text("", encoding="utf-8")
    gone = next(p for p in sorted((edited / "backends").glob("*.py")) if p.name != "added.py")
    gone.unlink()
    (edited / "reference" / "unlisted").mkdir()
    (edited / "reference" / "unlisted" / "__init__.py").write_text("", encoding="utf-8")
    stale = device_run.stale_files(wheel, edited)
    assert "reference/__init__.py changed" in stale
    assert "backends/added.py is new" in stale
    assert f"backends/{gone.name} is gone" in stale
    assert any(s.startswith("reference/unlisted/ is not in the wheel") for s in stale), stale


def test_the_install_puts_the_carried_wheels_first(
    built: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheels land in the target folder, which comes first on PYTHONPATH, so the
    carried packages and attnspec import from it; numpy and hypothesis stay the
    interpreter's own."""
    tree, wheels = built
    monkeypatch.setattr(device_run, "ROOT", tree)
    site = tmp_path / "site"
    result = device_run.install(sys.executable, wheels, site)
    assert result.status == "done", result
    # numpy's and hypothesis's files as the import system finds them (find_spec), without
    # running them (~0.2 CPU-s of imports): where they would load from is what is checked
    probe = (
        "import json, importlib.util, array_api_compat, attnspec\n"
        "files = {m.__name__: m.__file__ for m in (array_api_compat, attnspec)}\n"
        "files.update((n, importlib.util.find_spec(n).origin) for n in ('numpy', 'hypothesis'))\n"
        "print(json.dumps(files))\n"
        "print(getattr(array_api_compat, 'CARRIED', False))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=device_run.step_env(site),
        timeout=60,
        check=True,
    )
    files_line, carried = done.stdout.splitlines()
    files = json.loads(files_line)
    assert carried == "True"
    assert Path(files["attnspec"]).is_relative_to(site), files
    assert not Path(files["numpy"]).is_relative_to(site), files
    assert not Path(files["hypothesis"]).is_relative_to(site), files
    # bin/: the attnspec command of the wheel's entry point
    carried_modules = {pin.split("==")[0].replace("-", "_") for pin in device_run.pinned()}
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == sorted(
        {*carried_modules, "attnspec", "bin"}
    )
    assert {"array_api_compat", "array_api_strict", "fla_core", "einops"} <= carried_modules


STUB = """\
#!{python}
# A stand-in for the image's python: answers each step of the device run at once.
import json, os, sys, time, zipfile
args = sys.argv[1:]
def value(flag):
    return args[args.index(flag) + 1] if flag in args else None
if args[:3] == ["-m", "pip", "install"]:
    target = value("--target")
    for wheel in [a for a in args if a.endswith(".whl")]:
        zipfile.ZipFile(wheel).extractall(target)
elif args[0] == "-c":
    gpu = os.environ["STUB_GPU"] == "1"
    print(json.dumps({{"gpu": {{"torch": gpu, "jax": gpu, "cupy": False}}, "torch": "stub"}}))
elif args[:3] == ["-m", "attnspec.conformance.cli", "backends"]:
    print("torch  cuda:0  float16  1e-4  0.1  within TOL-2")
elif args[:3] == ["-m", "attnspec.conformance.cli", "matrix"]:
    kernel = value("--kernel")
    if kernel == os.environ["STUB_HANG"]:
        time.sleep(600)
    row = {{"name": kernel or "merged", "status": "checked", "divergences": []}}
    open(value("--json"), "w").write(json.dumps([row]))
    open(value("--markdown"), "w").write("| kernel |\\n")
elif args[:3] == ["-m", "attnspec.conformance.cli", "check"]:
    report = {{"device": "cuda", "counts": {{"passed": 3}}, "verdicts": [], "complete": True}}
    open(value("--json"), "w").write(json.dumps(report))
    open(value("--junit"), "w").write(
        '<testsuites><testsuite name="{{}}" tests="3"/></testsuites>'.format(args[3]))
else:  # the bench script
    open(value("--json"), "w").write(json.dumps({{"status": "stub"}}))
"""


# the side box of the run below, and the least a phase runs with in it (the run's own
# MIN_BOX_S is 5 s): what the hung step costs, where a stub answers every other step at once
SHORT_BOX_S = 2
# scripts/device_run.py in a process of its own (it starts its steps with a preexec_fn,
# which may deadlock in a process with threads, as this one may be), MIN_BOX_S set first:
# python -c RUN_WITH_MIN_BOX SCRIPT MIN_BOX_S ARGS
RUN_WITH_MIN_BOX = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("device_run", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["device_run"] = module
spec.loader.exec_module(module)
module.MIN_BOX_S = int(sys.argv[2])
sys.exit(module.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "no-gpu"])
def test_a_run_goes_on_past_a_hung_step(
    gpu: bool, built: tuple[Path, Path], tmp_path: Path
) -> None:
    """With a stub python answering for the image's: where a GPU is seen, a hung matrix
    step is stopped at its box and every other step still runs, the checks' JUnit files
    merged into one; where none is, every GPU step says "needs a GPU" and the rest runs.
    The merge and the summary follow, and exactly the 8 result files are written.  The
    run has a side box of SHORT_BOX_S, the least a phase runs with lowered to it."""
    _, wheels = built
    stub = tmp_path / "python"
    stub.write_text(STUB.format(python=sys.executable), encoding="utf-8")
    stub.chmod(0o755)
    hung = "flax-linen"
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-c", RUN_WITH_MIN_BOX, str(SCRIPTS / "device_run.py")),
            *(str(SHORT_BOX_S), str(out), "--python", str(stub), "--wheels", str(wheels)),
            *("--budget", "60", "--side-box", str(SHORT_BOX_S), "--work", str(tmp_path / "work")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            **os.environ,
            "STUB_GPU": "1" if gpu else "0",
            "STUB_HANG": device_run.MATRIX_KERNELS[hung][0] if gpu else "none",
        },
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(device_run.OUT_FILES), done.stderr
    summary = (out / "summary.txt").read_text(encoding="utf-8")
    status = {
        line.split()[1] if line.split()[0] in ("matrix", "check") else line.split()[0]: line
        for line in summary.split("steps (status, seconds, what):")[1].splitlines()
        if line.strip() and not line.startswith("result:")
    }
    assert "done" in status["install"] and "done" in status["survey"], summary
    assert "done" in status["merge"], summary
    where = "torch cuda:0, jax gpu:0" if gpu else "torch cpu, jax cpu"
    assert f"matrix rows declared for the CPU ran on: {where}" in summary
    for name, (_, needs) in device_run.MATRIX_KERNELS.items():
        if gpu and name == hung:
            assert "timed out" in status[name], status[name]
        elif needs and not gpu:
            assert device_run.NEEDS_A_GPU in status[name], status[name]
        else:
            assert " done " in status[name], status[name]
    plan = device_run.plan_run("", tmp_path, out)
    checks = [s.name.split()[1] for s in plan.side_by_side if s.kind == "check"]
    ran = [c for c in checks if " done " in status[c]]
    assert len(ran) == (len(checks) - 1 if gpu else 0), {c: status[c] for c in checks}  # CuPy
    assert len(checks) == 9
    junit = (out / "junit.xml").read_text(encoding="utf-8")
    assert junit.count("<testsuite ") == len(ran)
    assert device_run.NEEDS_A_GPU in status["bench"] if not gpu else " done " in status["bench"]
    assert done.returncode == (1 if gpu else 0), summary


def test_each_cuda_sdpa_backend_is_checked_in_half_precision(tmp_path: Path) -> None:
    """The four pinned CUDA SDPA backends of scripts/device_sdpa.py each have a check step
    needing torch on a GPU, claim float16 and bfloat16 only, and claim what their backend
    takes: no attn_mask on flash, no empty sizes except on math (SDPA-1.5, SDPA-5.2 waived
    by name, CONF-7)."""
    pytest.importorskip("torch", reason="the adapters import torch when called, not loaded")
    sdpa = _load("device_sdpa")
    plan = device_run.plan_run(sys.executable, tmp_path, tmp_path / "out")
    for backend in ("math", "efficient", "flash", "cudnn"):
        (step,) = [s for s in plan.side_by_side if s.name == f"check sdpa-cuda-{backend}-half"]
        assert step.needs_gpu == "torch" and f"device_sdpa.py:sdpa_cuda_{backend}_half" in " ".join(
            step.argv
        )
        claims = declaration_of(getattr(sdpa, f"sdpa_cuda_{backend}_half"))
        assert claims.dtypes == ("float16", "bfloat16")
        assert claims.mask == claims.bias == (backend != "flash")
        assert claims.empty_sizes == (backend == "math")
        assert claims.gqa and claims.gqa_keyword == "enable_gqa"


IGNORES_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True)
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(600)
"""


def test_a_stopped_step_takes_its_workers_along(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that ignores SIGTERM is killed GRACE_S later, and so is its worker in a
    session of its own (as attnspec's are), which a signal to the step's process group
    would miss: nothing of it is left on the GPU while the benchmark runs."""
    monkeypatch.setattr(device_run, "GRACE_S", 1)
    pid_file = tmp_path / "worker.pid"
    step = device_run.Step("stubborn", ["-c", IGNORES_SIGTERM, str(pid_file)], box_s=2)
    (result,) = device_run.run_steps([step], sys.executable, dict(os.environ), tmp_path, 60)
    assert result.status == "timed out" and result.seconds < 10, result
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        # a killed child of ours lingers as a zombie until reaped; the worker is init's
        state = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        assert not Path(f"/proc/{worker}").exists(), "the worker outlived its step"


NICENESS_OF_A_STEP = """
import os, subprocess, sys, time
time.sleep(0.3)  # as a step's imports: its niceness is set by then
worker = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"],
                        capture_output=True, text=True)
open(sys.argv[1], "w").write(f"{os.nice(0)} {worker.stdout.strip()}")
"""


def test_a_step_yielding_the_cpus_runs_niced(tmp_path: Path) -> None:
    """A step with ``nice`` (the CPU rows re-run beside the CUDA ones) runs that much
    nicer than the run, and so do the workers it starts after its imports; set from the
    run's side after the start, with no preexec_fn (unsafe in a process with threads)."""
    out = tmp_path / "nice.txt"
    step = device_run.Step("niced", ["-c", NICENESS_OF_A_STEP, str(out)], box_s=30, nice=5)
    (result,) = device_run.run_steps([step], sys.executable, dict(os.environ), tmp_path, 60)
    assert result.status == "done", result
    ours = os.nice(0)
    assert out.read_text().split() == [str(min(ours + 5, 19))] * 2


def test_device_flex_adapters_compute_the_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    """SDPA-7.1 with a mask, top-left causal (SDPA-4.1), a bias (SDPA-3.2) and GQA
    (SDPA-6.1) through both compiled-FlexAttention adapters, compiled with torch.compile's
    eager backend (the Triton one needs a GPU), against the float64 oracle; and their
    declarations say what FlexAttention takes."""
    torch = pytest.importorskip("torch", reason="the FlexAttention adapters need torch")
    monkeypatch.setenv("ATTNSPEC_FLEX_COMPILE_BACKEND", "eager")
    flex = _load("device_flex")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 5, 8))
    k, v = rng.standard_normal((2, 1, 2, 7, 8))
    mask = rng.random((5, 7)) < 0.7
    bias = rng.standard_normal((1, 4, 5, 7))
    want, _ = sdpa(
        q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), mask=mask, bias=bias, is_causal=True
    )
    for kernel in (flex.flex_compiled_block_mask, flex.flex_compiled_score_mod):
        claims = declaration_of(kernel)
        assert claims.equal_head_dims and not claims.empty_sizes and claims.gqa
        got = kernel(
            *(torch.tensor(a) for a in (q, k, v)),
            mask=torch.tensor(mask),
            bias=torch.tensor(bias),
            is_causal=True,
            enable_gqa=True,
        )
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_the_benchmark_code_runs_on_a_cpu(tmp_path: Path) -> None:
    """The CPU smoke of scripts/device_bench.py: one timed reference row with the flops of
    two matrix products, and the matrix-product peak it is set against."""
    pytest.importorskip("torch", reason="the benchmark times torch tensors")
    bench = _load("device_bench")
    assert bench.attention_flops(2, 3, 5, 7) == 4 * 2 * 3 * 5 * 5 * 7
    assert bench.datasheet_peak("NVIDIA H100 PCIe") == bench.DATASHEET_TFLOPS["H100 PCIe"]
    assert bench.datasheet_peak("NVIDIA H100 80GB HBM3") == bench.DATASHEET_TFLOPS["H100"]
    assert bench.main(["--json", str(tmp_path / "bench.json"), "--smoke"]) == 0
    result = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    assert result["status"].startswith("smoke")
    (row,) = result["rows"]
    assert row["kernel"] == "reference (torch)" and row["tflops"] > 0
    assert result["peaks"]["float32"] > 0


@pytest.mark.skipif(
    os.environ.get("ATTNSPEC_REHEARSAL") != "1",
    reason="builds .rehearsal/venv of the image's packages (torch, jax, flax: ~2 min, 1.6 GB) "
    "and runs the device command (~3 min with one property): set ATTNSPEC_REHEARSAL=1",
)
def test_the_cpu_rehearsal() -> None:
    """``scripts/gpu-check --rehearse``: the device command with only the image's packages
    and the carried wheels, every GPU step saying "needs a GPU", every other finished."""
    done = subprocess.run(
        ["bash", str(SCRIPTS / "gpu-check"), "--rehearse", "--only", "output-shape-dtype"],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    summary = (ROOT / ".rehearsal" / "out" / "summary.txt").read_text(encoding="utf-8")
    for name, (_, gpu) in device_run.MATRIX_KERNELS.items():
        line = next(x for x in summary.splitlines() if x.strip().startswith(f"matrix {name} "))
        assert (device_run.NEEDS_A_GPU in line) == bool(gpu), line
        assert bool(gpu) or " done " in line, line
    assert sorted(p.name for p in (ROOT / ".rehearsal" / "out").iterdir()) == sorted(
        device_run.OUT_FILES
    )
