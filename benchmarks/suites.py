"""The three measurements of ``attnspec bench``: dense, sparse and linear attention.

dense   the plain reference (spec text, Lq x Lk scores), the blocked reference (O(L)) and
        the library's own kernel, causal, over a range of lengths, on each backend.
sparse  each sparse pattern's kernel (``sparse_attention``) against the dense reference
        given the pattern's mask, blocked and (where it fits) plain, at one length.
linear  ``linear_attention`` (elu + 1), causal and not, over a range of lengths, and the
        exponent of its time (time ~ L**exponent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..backends import Backend
from ..reference import (
    blocked_attention,
    elu_plus_one,
    linear_attention,
    plain_attention,
    sparse_attention,
    sparse_mask,
)
from .frameworks import Framework, MemoryProbe, framework_kernel
from .measure import Measurement, fits, time_together

# Bytes the plain reference holds per score (B x H x Lq x Lk) per byte of its compute
# dtype: about six float32 arrays of scores alive at once (3.1 GB at L = 4096, H = 8).
PLAIN_BYTES_PER_SCORE_ITEM = 6.0

Log = Callable[[str], None]


@dataclass(frozen=True)
class BenchConfig:
    """What ``attnspec bench`` measures; :data:`FULL` and :data:`QUICK` are the presets."""

    sizes: tuple[int, ...]
    batch: int
    heads: int
    head_dim: int
    dtype: str
    causal: bool
    sparse_length: int
    sparse_heads: int
    linear_sizes: tuple[int, ...]
    linear_heads: int
    gemm_size: int
    repeats: int
    budget_seconds: float  # per size, for the timed rounds after the first runs


FULL = BenchConfig(
    sizes=(256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
    batch=1,
    heads=8,
    head_dim=64,
    dtype="float32",
    causal=True,
    sparse_length=16384,
    sparse_heads=1,
    linear_sizes=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
    linear_heads=1,
    gemm_size=2048,
    repeats=5,
    budget_seconds=30.0,
)
QUICK = BenchConfig(
    sizes=(64, 160),
    batch=1,
    heads=2,
    head_dim=16,
    dtype="float32",
    causal=True,
    sparse_length=256,
    sparse_heads=1,
    linear_sizes=(64, 128, 256),
    linear_heads=1,
    gemm_size=128,
    repeats=1,
    budget_seconds=0.0,
)


def sparse_patterns(length: int) -> dict[str, dict[str, Any]]:
    """Each spec pattern with parameters of the sizes used in practice at ``length``."""
    block = max(2, length // 128)
    n_blocks = -(-length // block)
    return {
        "sliding_window": {"left": min(256, length // 4), "right": 0, "causal": True},
        "strided": {"stride": block, "causal": True},
        "fixed": {"stride": block, "summary": max(1, block // 16), "causal": True},
        "block_sparse": {
            "block_size": block,
            "layout": [
                [abs(i - j) <= 1 or j == 0 for j in range(n_blocks)] for i in range(n_blocks)
            ],
        },
        "longformer": {"left": block, "right": block, "global_tokens": tuple(range(8))},
        "bigbird": {
            "block_size": max(1, block // 2),
            "window_blocks": 1,
            "global_blocks": (0,),
            "num_random": 3,
            "seed": 0,
        },
    }


def _inputs(
    backend: Backend, shape_q: tuple[int, ...], n_keys: int, dtype: str, seed: int = 0
) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    shape_k = (*shape_q[:-2], n_keys, shape_q[-1])
    return tuple(
        backend.asarray(rng.standard_normal(s), dtype=dtype) for s in (shape_q, shape_k, shape_k)
    )


def _itemsize(dtype: str) -> int:
    return 8 if dtype == "float64" else 4  # half precision is computed in float32


def _measure(
    backend: Backend,
    probe: MemoryProbe,
    config: BenchConfig,
    runs: list[tuple[Measurement, Callable[[], Any], float]],
    log: Log,
) -> list[Measurement]:
    """Time the runs that fit in memory together; the others are recorded as skipped."""
    calls = {}
    for record, call, planned_bytes in runs:
        record.skipped = fits(backend, planned_bytes)
        if record.skipped is None:
            calls[record.impl] = call
    timings = time_together(
        calls, probe, repeats=config.repeats, budget_seconds=config.budget_seconds
    )
    for record, _, _ in runs:
        line = f"  {record.backend:6} {record.impl:34} L={record.length:6}  "
        if record.skipped is not None:
            log(line + f"skipped: {record.skipped}")
            continue
        timing = timings[record.impl]
        record.seconds, record.first_seconds = timing.seconds, timing.first_seconds
        record.runs, record.peak_bytes = timing.runs, timing.peak_bytes
        peak = "?" if record.peak_bytes is None else f"{record.peak_bytes / 1e6:.0f} MB"
        log(line + f"{record.seconds:9.4f} s  peak {peak}  ({record.runs} timed runs)")
    return [record for record, _, _ in runs]


def _dense_runs(
    framework: Framework | None, q: Any, k: Any, v: Any, config: BenchConfig, scores: int
) -> list[tuple[str, Callable[[], Any], float]]:
    """(impl, call, bytes it plans to hold) for one length."""
    runs: list[tuple[str, Callable[[], Any], float]] = []
    if framework is not None:
        args = framework.prepare(q, k, v)
        runs.append(
            ("framework", lambda: framework.call(*args), framework.bytes_per_score * scores)
        )
    runs.append(("blocked", lambda: blocked_attention(q, k, v, is_causal=config.causal), 0.0))
    runs.append(
        (
            "plain",
            lambda: plain_attention(q, k, v, is_causal=config.causal),
            PLAIN_BYTES_PER_SCORE_ITEM * _itemsize(config.dtype) * scores,
        )
    )
    return runs


def dense(config: BenchConfig, backend: Backend, log: Log) -> list[Measurement]:
    """Plain and blocked reference and the library's own kernel, at every size."""
    framework = framework_kernel(backend, config.causal)
    probe = MemoryProbe(backend)
    records = []
    for length in config.sizes:
        q, k, v = _inputs(
            backend, (config.batch, config.heads, length, config.head_dim), length, config.dtype
        )
        scores = config.batch * config.heads * length * length
        runs = []
        for impl, call, planned in _dense_runs(framework, q, k, v, config, scores):
            params = {"framework": framework.name} if impl == "framework" and framework else {}
            runs.append(
                (Measurement("dense", backend.name, impl, length, params=params), call, planned)
            )
        records += _measure(backend, probe, config, runs, log)
        del q, k, v
    return records


def sparse(config: BenchConfig, backend: Backend, log: Log) -> list[Measurement]:
    """Each pattern's sparse kernel against the dense reference with the pattern's mask."""
    length = config.sparse_length
    probe = MemoryProbe(backend)
    q, k, v = _inputs(
        backend, (config.batch, config.sparse_heads, length, config.head_dim), length, config.dtype
    )
    scores = config.batch * config.sparse_heads * length * length
    records = []
    for pattern, params in sparse_patterns(length).items():
        mask = sparse_mask(pattern, length, length, xp=backend.xp, device=backend.device, **params)
        described = {"pattern": pattern, **{n: p for n, p in params.items() if n != "layout"}}
        runs = [
            (
                f"sparse {pattern}",
                partial(sparse_attention, q, k, v, pattern=pattern, **params),
                0.0,
            ),
            (f"dense blocked {pattern}", partial(blocked_attention, q, k, v, mask=mask), 0.0),
            (
                f"dense plain {pattern}",
                partial(plain_attention, q, k, v, mask=mask),
                PLAIN_BYTES_PER_SCORE_ITEM * _itemsize(config.dtype) * scores,
            ),
        ]
        records += _measure(
            backend,
            probe,
            config,
            [
                (Measurement("sparse", backend.name, impl, length, params=described), call, planned)
                for impl, call, planned in runs
            ],
            log,
        )
        del mask
    return records


def linear(config: BenchConfig, backend: Backend, log: Log) -> list[Measurement]:
    """``linear_attention`` with elu + 1 features, causal and not, at every size."""
    probe = MemoryProbe(backend)
    records = []
    for causal in (False, True):
        for length in config.linear_sizes:
            q, k, v = _inputs(
                backend,
                (config.batch, config.linear_heads, length, config.head_dim),
                length,
                config.dtype,
            )
            # the causal form holds prefix sums of k (x) v: L x E x Ev numbers, three times
            planned = (
                (
                    3
                    * config.batch
                    * config.linear_heads
                    * length
                    * config.head_dim**2
                    * _itemsize(config.dtype)
                )
                if causal
                else 0.0
            )
            impl = "linear causal" if causal else "linear"
            records += _measure(
                backend,
                probe,
                config,
                [
                    (
                        Measurement(
                            "linear", backend.name, impl, length, params={"feature_map": "elu+1"}
                        ),
                        partial(
                            linear_attention, q, k, v, feature_map=elu_plus_one, is_causal=causal
                        ),
                        planned,
                    )
                ],
                log,
            )
    return records
