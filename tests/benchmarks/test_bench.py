"""``attnspec bench`` end to end (quick mode) and the arithmetic it reports.

The benchmark is not a spec clause; it measures the reference of SDPA-7.1 (its entry point
and its plain form), the sparse kernels of SPARSE-6 and linear attention (LIN-1.2) against
PyTorch SDPA and JAX's kernel, and a user's kernel against both.  These tests pin the
command's contract: the JSON schema, every requested measurement present or skipped with a
reason, the derived ratios, the plots with a JSON of their numbers beside each, no
exponent from too few lengths.  They assert no timing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnspec.backends import Backend, BackendError
from attnspec.benchmarks import suites
from attnspec.benchmarks.frameworks import MemoryProbe
from attnspec.benchmarks.measure import attention_flops, fits, power_law_exponent
from attnspec.benchmarks.plots import FIGURES, matplotlib_missing
from attnspec.benchmarks.report import SCHEMA
from attnspec.conformance.cli import main

MEASUREMENT_KEYS = {
    "section",
    "backend",
    "impl",
    "length",
    "seconds",
    "first_seconds",
    "runs",
    "peak_bytes",
    "skipped",
    "params",
    "gflops",
    "fraction_of_gemm_peak",
    "relative_time",
    "relative_to",
}


def installed(names: tuple[str, ...]) -> list[str]:
    found = []
    for name in names:
        try:
            Backend(name)
        except BackendError:
            continue
        found.append(name)
    return found


def run_bench(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str, backends: list[str]
) -> tuple[dict[str, Any], str]:
    out = tmp_path / "bench"
    status = main(["bench", "--quick", "--out", str(out), "--backends", ",".join(backends), *extra])
    printed = capsys.readouterr().out
    assert status == 0, printed
    return json.loads((out / "bench.json").read_text()), printed


def test_quick_bench_writes_json_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every default section (the check section: test_check_cost.py), on every
    installed backend: each (backend, impl, length) is measured or skipped with a reason;
    dense ratios are against the library's kernel (torch SDPA for NumPy); the PNGs are
    written, or the run says that matplotlib is missing."""
    backends = installed(("numpy", "torch", "jax"))
    doc, printed = run_bench(tmp_path, capsys, backends=backends)
    assert doc["check"] == []  # the check section runs only when asked for
    assert doc["schema"] == SCHEMA and doc["quick"] is True
    assert set(doc["backends"]) == set(backends)
    for info in doc["backends"].values():
        assert info["gemm_gflops"] > 0 and info["version"]
    records = doc["measurements"]
    for r in records:
        assert set(r) == MEASUREMENT_KEYS, r
        assert (r["seconds"] is None) == (r["skipped"] is not None), r
        assert r["seconds"] is None or (r["seconds"] > 0 and r["runs"] >= 1), r
    dense = {
        (r["backend"], r["params"]["case"], r["impl"], r["length"])
        for r in records
        if r["section"] == "dense"
    }
    # PyTorch SDPA is every backend's yardstick (on the same data); JAX adds its own kernel
    with_torch = "torch" in backends
    for backend in backends:
        impls = ["reference", "plain"] + (["torch_sdpa"] if with_torch else [])
        impls += ["library"] if backend == "jax" else []
        for case in suites.DENSE_CASES:
            sizes = suites.QUICK.sizes if case is suites.DENSE_CASES[0] else suites.QUICK.case_sizes
            for length in sizes:
                expected = {(backend, case.name, impl, length) for impl in impls}
                assert expected <= dense, (backend, case, length)
    for r in records:
        if r["section"] == "dense" and r["seconds"]:
            assert 0 < r["gflops"] and 0 < r["fraction_of_gemm_peak"], r
            if r["impl"] != "torch_sdpa" and with_torch:
                assert r["relative_time"] > 0, r
                assert "torch.nn.functional.scaled_dot_product_attention" in r["relative_to"], r
    patterns = {r["params"]["pattern"] for r in records if r["section"] == "sparse"}
    assert patterns == set(suites.sparse_patterns(suites.QUICK.sparse_length))
    linear = [r for r in records if r["section"] == "linear"]
    assert {(r["impl"], r["length"]) for r in linear} == {
        (impl, n) for impl in ("linear", "linear causal") for n in suites.QUICK.linear_sizes
    }
    # three lengths spanning 4x: no exponent, and the target says why
    exponents = [t for t in doc["targets"] if "time exponent" in t["name"]]
    assert exponents and all(t["value"] is None and t["met"] is None for t in exponents)
    assert all("fewer than 4" in t["how"] for t in exponents), exponents
    missing = matplotlib_missing()
    if missing is None:
        for name in FIGURES[:3]:
            figure = tmp_path / "bench" / name
            assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
            beside = json.loads(figure.with_suffix(".json").read_text())
            assert beside["figure"] == name and beside["measurements"], name
            assert all(r in records for r in beside["measurements"]), name
    else:
        assert f"no plots: {missing}" in printed


def test_plain_reference_is_skipped_where_it_would_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measurement planned beyond the free memory is recorded as skipped, with the sizes
    in the reason, and the rest of the run (plots included) goes on.  One dense case: every
    case plans its plain form by the same rule (its figure has one row of panels, not five)."""
    monkeypatch.setattr(suites, "PLAIN_BYTES_PER_SCORE_ITEM", 1e15)
    doc, _ = run_bench(
        tmp_path, capsys, "--sections", "dense", "--cases", "causal", backends=["numpy"]
    )
    plain = [r for r in doc["measurements"] if r["impl"] == "plain"]
    assert plain and all(r["seconds"] is None and "GB free" in r["skipped"] for r in plain)
    reference = [r for r in doc["measurements"] if r["impl"] == "reference"]
    assert reference and all(r["seconds"] for r in reference)


# (alike in shape to cli/test_usage_errors.py's table: each command's own usage errors,
# which `attnspec bench` words with its own prefix)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sections", "dense,bogus"], "--sections: unknown bogus"),
        (["--sizes", "0,12"], "lengths should be ints >= 1"),
        (["--sizes", "a"], "is not a comma-separated list of ints"),
        (["--sections", "kernel"], "name the kernel"),
        (["--cases", "causal,sideways"], "--cases: unknown sideways"),
        (["no_such_module_xyz:fn"], "does not import"),
    ],
)
def test_bad_arguments_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status = main(["bench", "--quick", "--out", str(tmp_path), *argv])
    assert status == 2
    assert message in capsys.readouterr().err


def test_power_law_exponent_recovers_the_slope() -> None:
    """An exponent from 4 lengths spanning 8x; none from fewer lengths or a narrower span."""
    lengths = [1024, 2048, 4096, 8192]
    assert power_law_exponent(lengths, [3e-6 * n**1.5 for n in lengths]) == pytest.approx(1.5)
    assert power_law_exponent([1024], [1.0]) is None
    assert power_law_exponent(lengths[:3], [1.0, 2.0, 4.0]) is None  # 3 lengths
    narrow = [1024, 1536, 2048, 3072]  # 4 lengths spanning 3x
    assert power_law_exponent(narrow, [float(n) for n in narrow]) is None
    repeated = [1024, 1024, 8192, 8192]  # 2 distinct lengths
    assert power_law_exponent(repeated, [1.0, 1.1, 8.0, 8.2]) is None


KERNEL_FILE = """
from attnspec.reference import plain_attention


def my_kernel(q, k, v, *, mask=None, is_causal=False):
    return plain_attention(q, k, v, mask=mask, is_causal=is_causal)
"""


def test_bench_times_a_users_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``attnspec bench path/to/file.py:FUNC``: the kernel, the reference's entry point and
    (with torch) PyTorch SDPA at every workload, the kernel section only, its figure and
    the JSON beside it."""
    path = tmp_path / "mine.py"
    path.write_text(KERNEL_FILE)
    doc, printed = run_bench(tmp_path, capsys, f"{path}:my_kernel", backends=["numpy"])
    records = doc["measurements"]
    assert {r["section"] for r in records} == {"kernel"}
    workloads = [w.name for w in suites.QUICK.workloads]
    impls = {"kernel", "reference"} | ({"torch_sdpa"} if installed(("torch",)) else set())
    assert {(r["params"]["workload"], r["impl"]) for r in records} == {
        (w, i) for w in workloads for i in impls
    }
    for r in records:
        assert r["seconds"] and r["seconds"] > 0, r
        if r["impl"] == "kernel":
            assert r["params"]["kernel"] == f"{path}:my_kernel", r
            if "torch_sdpa" in impls:
                assert r["relative_time"] > 0, r
    if matplotlib_missing() is None:
        beside = json.loads((tmp_path / "bench" / "bench-kernel.json").read_text())
        assert beside["measurements"] == records
        assert (tmp_path / "bench" / "bench-kernel.png").exists()
    else:
        assert "no plots" in printed


@pytest.mark.parametrize(("n_queries", "n_keys"), [(7, 7), (5, 9), (9, 5), (1, 4)])
def test_causal_flops_count_the_allowed_pairs(n_queries: int, n_keys: int) -> None:
    """Top-left causal (SDPA-4.1): query i attends min(i + 1, Lk) keys."""
    pairs = sum(min(i + 1, n_keys) for i in range(n_queries))
    assert attention_flops(3, n_queries, n_keys, 8, 4, True) == 2 * 3 * pairs * 12
    assert attention_flops(3, n_queries, n_keys, 8, 4, False) == 2 * 3 * n_queries * n_keys * 12


def test_fits_compares_with_free_memory() -> None:
    numpy = Backend("numpy")
    assert fits(numpy, 0) is None
    reason = fits(numpy, 1e18)
    assert reason is None or "GB free" in reason  # None only where the OS does not say


def test_memory_probe_sees_an_allocation() -> None:
    """The RSS probe reports a 64 MB buffer written inside the measured span."""
    probe = MemoryProbe(Backend("numpy"))
    if probe.method is None:
        pytest.skip("no /proc/self/clear_refs here: the probe reports nothing (None)")
    probe.start()
    buffer = np.ones(8 * 2**20)  # 64 MiB, touched
    peak = probe.peak()
    del buffer
    assert peak is not None and peak >= 60 * 2**20, peak
    assert math.isfinite(peak)


def test_long_section_runs_each_call_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--sections long``: the causal case at ``--long-length``, the entry point (and with
    torch PyTorch SDPA) run once each, no timed rounds, no plain form; the peak-memory
    target is evaluated on it."""
    doc, _ = run_bench(
        tmp_path, capsys, "--sections", "long", "--long-length", "192", backends=["numpy"]
    )
    records = doc["measurements"]
    impls = {"reference"} | ({"torch_sdpa"} if installed(("torch",)) else set())
    assert {(r["section"], r["impl"], r["length"]) for r in records} == {
        ("long", impl, 192) for impl in impls
    }
    assert all(r["runs"] == 0 and r["seconds"] == r["first_seconds"] > 0 for r in records)
    memory = [
        t for t in doc["targets"] if t["name"].startswith("scaled_dot_product_attention peak")
    ]
    assert len(memory) == 1 and "L = 192" in memory[0]["name"], doc["targets"]
