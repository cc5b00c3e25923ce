"""``attnspec bench`` end to end (quick mode) and the arithmetic it reports.

The benchmark is not a spec clause; it measures the reference of SDPA-7.1 (plain and
blocked), the sparse kernels of SPARSE-6 and linear attention (LIN-1.2) against the
libraries' own kernels.  These tests pin the command's contract: the JSON schema, every
requested measurement present or skipped with a reason, the derived ratios, the plots.
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
    dense = {(r["backend"], r["impl"], r["length"]) for r in records if r["section"] == "dense"}
    # NumPy has no attention kernel: torch SDPA on the same memory stands in for it
    with_kernel = {"torch", "jax"} & set(backends) | ({"numpy"} if "torch" in backends else set())
    for backend in backends:
        impls = ["blocked", "plain"] + (["framework"] if backend in with_kernel else [])
        for length in suites.QUICK.sizes:
            assert {(backend, impl, length) for impl in impls} <= dense, (backend, length)
    kernels = {
        "torch": "torch.nn.functional.scaled_dot_product_attention",
        "jax": "jax.nn.dot_product_attention",
    }
    for r in records:
        if r["section"] == "dense" and r["seconds"]:
            assert 0 < r["gflops"] and 0 < r["fraction_of_gemm_peak"], r
            against = {"numpy": "torch"}.get(r["backend"], r["backend"])
            if r["impl"] != "framework" and r["backend"] in with_kernel:
                assert r["relative_time"] > 0 and kernels[against] in r["relative_to"], r
    patterns = {r["params"]["pattern"] for r in records if r["section"] == "sparse"}
    assert patterns == set(suites.sparse_patterns(suites.QUICK.sparse_length))
    linear = [r for r in records if r["section"] == "linear"]
    assert {(r["impl"], r["length"]) for r in linear} == {
        (impl, n) for impl in ("linear", "linear causal") for n in suites.QUICK.linear_sizes
    }
    names = [t["name"] for t in doc["targets"]]
    assert any(n.startswith("linear causal attention time exponent") for n in names), names
    missing = matplotlib_missing()
    if missing is None:
        for name in FIGURES:
            assert (tmp_path / "bench" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    else:
        assert f"no plots: {missing}" in printed


def test_plain_reference_is_skipped_where_it_would_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measurement planned beyond the free memory is recorded as skipped, with the sizes
    in the reason, and the rest of the run (plots included) goes on."""
    monkeypatch.setattr(suites, "PLAIN_BYTES_PER_SCORE_ITEM", 1e15)
    doc, _ = run_bench(tmp_path, capsys, "--sections", "dense", backends=["numpy"])
    plain = [r for r in doc["measurements"] if r["impl"] == "plain"]
    assert plain and all(r["seconds"] is None and "GB free" in r["skipped"] for r in plain)
    blocked = [r for r in doc["measurements"] if r["impl"] == "blocked"]
    assert blocked and all(r["seconds"] for r in blocked)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sections", "dense,bogus"], "--sections: unknown bogus"),
        (["--sizes", "0,12"], "lengths should be ints >= 1"),
        (["--sizes", "a"], "is not a comma-separated list of ints"),
    ],
)
def test_bad_arguments_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status = main(["bench", "--quick", "--out", str(tmp_path), *argv])
    assert status == 2
    assert message in capsys.readouterr().err


def test_power_law_exponent_recovers_the_slope() -> None:
    lengths = [1024, 2048, 4096, 8192]
    assert power_law_exponent(lengths, [3e-6 * n**1.5 for n in lengths]) == pytest.approx(1.5)
    assert power_law_exponent([1024], [1.0]) is None


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
