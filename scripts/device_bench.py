"""The device run's GPU benchmark (docs/gpu.md, issue #35): the reference on torch-cuda and on
CuPy against PyTorch SDPA pinned to its flash backend, forward pass, no mask, as achieved
TFLOP/s against the card's peak.

    python scripts/device_bench.py --json bench.json          # on a CUDA GPU
    python scripts/device_bench.py --json bench.json --smoke  # any machine: tiny, on the CPU

FLOPs are the two matrix products' 4 B H Lq Lk E (the softmax's few per score left out, as
FlashAttention's papers count them).  The peak is given twice: the data-sheet dense
float16/bfloat16 tensor-core figure of the card (None for a card not in the table) and what
one 8192^3 matrix product measured here in the same dtype, the attainable ceiling.  Each time
is the median of the timed calls after warm-ups, the device synchronised around each.
Without a CUDA device it records "needs a GPU"; ``--smoke`` then runs the same code on the
CPU at a tiny size, so that a rehearsal proves the code path (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Dense (no sparsity) float16/bfloat16 tensor-core peaks in TFLOP/s from NVIDIA's data
# sheets, by a substring of torch.cuda.get_device_name(); the longest match wins.
DATASHEET_TFLOPS = {
    "H100": 989.4,  # H100 SXM5; the PCIe card matches the row below
    "H100 PCIe": 756.5,
    "H100 NVL": 835.5,
    "H200": 989.4,
    "A100": 312.0,
}
GPU_SHAPES = ((2, 16, 1024, 128), (2, 16, 4096, 128))  # (B, H, L, E), Lq = Lk = L
SMOKE_SHAPES = ((1, 2, 64, 16),)
WARMUP, REPEATS = 2, 5


def attention_flops(batch: int, heads: int, length: int, head_dim: int) -> float:
    """Q K^T and P V: 2 products of 2 B H L L E flops each."""
    return 4.0 * batch * heads * length * length * head_dim


def timed(call: Callable[[], Any], synchronize: Callable[[], None], repeats: int) -> float:
    """Median seconds of ``repeats`` calls after ``WARMUP`` untimed ones."""
    for _ in range(WARMUP):
        call()
    synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def datasheet_peak(device_name: str) -> float | None:
    matches = [name for name in DATASHEET_TFLOPS if name in device_name]
    return DATASHEET_TFLOPS[max(matches, key=len)] if matches else None


def run(smoke: bool) -> dict[str, Any]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnspec.reference import scaled_dot_product_attention as reference

    cuda = torch.cuda.is_available() and not smoke
    device = "cuda" if cuda else "cpu"
    result: dict[str, Any] = {"device": device, "rows": [], "peaks": {}, "errors": []}
    if cuda:
        name = torch.cuda.get_device_name()
        result["device_name"] = name
        result["datasheet_tflops"] = datasheet_peak(name)
    shapes = GPU_SHAPES if cuda else SMOKE_SHAPES
    dtypes = ("float16", "bfloat16") if cuda else ("float32",)
    repeats = REPEATS if cuda else 1

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize()

    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        n = 8192 if cuda else 64
        a = torch.randn(n, n, dtype=dtype, device=device)
        seconds = timed(functools.partial(torch.matmul, a, a), synchronize, repeats)
        result["peaks"][dtype_name] = 2.0 * n**3 / seconds / 1e12
        del a
    try:
        import cupy
    except ImportError:
        cupy = None
    for batch, heads, length, head_dim in shapes:
        flops = attention_flops(batch, heads, length, head_dim)
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            q, k, v = (
                torch.randn(batch, heads, length, head_dim, dtype=dtype, device=device)
                for _ in range(3)
            )
            calls: dict[str, Callable[[], Any]] = {
                "reference (torch)": functools.partial(reference, q, k, v),
            }
            if cuda:

                def flash(q: Any = q, k: Any = k, v: Any = v) -> Any:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

                calls["sdpa flash (torch)"] = flash
                if cupy is not None and dtype_name == "float16":  # CuPy has no bfloat16
                    cq, ck, cv = (cupy.asarray(x) for x in (q, k, v))
                    calls["reference (cupy)"] = functools.partial(reference, cq, ck, cv)
            for label, call in calls.items():
                row: dict[str, Any] = {
                    "kernel": label,
                    "dtype": dtype_name,
                    "shape": [batch, heads, length, length, head_dim],
                }
                try:
                    seconds = timed(call, synchronize, repeats)
                except Exception as exc:  # one kernel's failure (out of memory) is a row
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    result["errors"].append(f"{label} {dtype_name} L={length}: {row['error']}")
                else:
                    row["ms"] = seconds * 1e3
                    row["tflops"] = flops / seconds / 1e12
                    peak = result["peaks"][dtype_name]
                    row["of_measured_peak"] = row["tflops"] / peak
                    sheet = result.get("datasheet_tflops")
                    row["of_datasheet_peak"] = row["tflops"] / sheet if sheet else None
                result["rows"].append(row)
            del q, k, v, calls
            if cuda:
                torch.cuda.empty_cache()
    return result


def table(result: dict[str, Any]) -> str:
    peaks = ", ".join(f"{d} {t:.0f}" for d, t in result["peaks"].items())
    sheet = result.get("datasheet_tflops")
    lines = [
        f"device {result.get('device_name', result['device'])}: matrix-product peak measured "
        f"{peaks} TFLOP/s; data sheet {sheet if sheet else 'unknown'}",
        f"{'kernel':20s} {'dtype':9s} {'B,H,L,E':16s} {'ms':>9s} {'TFLOP/s':>8s} "
        f"{'of measured':>11s} {'of sheet':>8s}",
    ]
    for row in result["rows"]:
        shape = ",".join(str(s) for s in (*row["shape"][:3], row["shape"][4]))
        if "error" in row:
            lines.append(f"{row['kernel']:20s} {row['dtype']:9s} {shape:16s} {row['error']}")
            continue
        sheet_share = f"{row['of_datasheet_peak']:.1%}" if row["of_datasheet_peak"] else "-"
        lines.append(
            f"{row['kernel']:20s} {row['dtype']:9s} {shape:16s} {row['ms']:9.3f} "
            f"{row['tflops']:8.2f} {row['of_measured_peak']:11.1%} {sheet_share:>8s}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny CPU run of the same code (no GPU needed)"
    )
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as exc:  # nothing to time against, on any device
        result: dict[str, Any] = {"device": "cpu", "status": f"not run: {exc}", "rows": []}
        print(f"bench: not run: {exc}")
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        return 0
    if not torch.cuda.is_available() and not args.smoke:
        result = {"device": "cpu", "status": "needs a GPU", "rows": []}
        print("bench: needs a GPU: torch sees no CUDA device")
    else:
        result = run(args.smoke)
        result["status"] = "smoke (CPU, not a measurement)" if args.smoke else "measured"
        print(table(result))
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 1 if result.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
