"""The measurements of ``attnspec bench``: dense, long, sparse, linear and a user's kernel.

dense   the reference's entry point (``scaled_dot_product_attention``: blocked, O(L)),
        the plain form (the spec's text, Lq x Lk scores) where it fits, PyTorch SDPA (the
        yardstick of every backend) and JAX's own kernel, for each case of
        :data:`DENSE_CASES` (causal, non-causal, a padding mask, GQA) over a range of
        lengths, on each backend.
long    the entry point and PyTorch SDPA once at :attr:`BenchConfig.long_length`
        (causal): the time and the peak memory of a very long row.
sparse  each sparse pattern's kernel (``sparse_attention``) against the dense reference
        given the pattern's mask, blocked and (where it fits) plain, at one length.
linear  ``linear_attention`` (elu + 1), causal and not, over a range of lengths, and the
        exponent of its time (time ~ L**exponent, from 4 or more lengths spanning 8x).
kernel  a user's kernel (``attnspec bench MODULE:FUNC``) against the entry point and
        PyTorch SDPA at the realistic shapes of :data:`WORKLOADS`.
"""

from __future__ import annotations

import dataclasses
import math
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
    scaled_dot_product_attention,
    sparse_attention,
    sparse_mask,
)
from .frameworks import Framework, MemoryProbe, library_kernel, torch_sdpa
from .measure import Measurement, fits, time_together

# Bytes the plain reference holds per score (B x H x Lq x Lk) per byte of its compute
# dtype: about six float32 arrays of scores alive at once (3.1 GB at L = 4096, H = 8).
PLAIN_BYTES_PER_SCORE_ITEM = 6.0
# The entry point's planned memory: inputs, output and a few blocks; O(L), never skipped.
REFERENCE_PLANNED_BYTES = 0.0

Log = Callable[[str], None]


@dataclass(frozen=True)
class DenseCase:
    """One kind of dense call: causal or not, ``kv_heads`` key/value heads for the
    config's query heads (None: as many), and a key-padding mask or not."""

    name: str
    causal: bool
    kv_heads: int | None = None
    padding_mask: bool = False


DENSE_CASES = (
    DenseCase("causal", causal=True),
    DenseCase("non-causal", causal=False),
    # a batch padded to one length: the last eighth of the keys masked out (SDPA-3.1)
    DenseCase("padding mask", causal=False, padding_mask=True),
    # Llama-style grouped heads: 4 query heads per key/value head (SDPA-6)
    DenseCase("GQA 4:1 causal", causal=True, kv_heads=2),
)


@dataclass(frozen=True)
class Workload:
    """A realistic call a user's kernel is timed on: ``batch`` x ``heads`` query heads on
    ``kv_heads`` key/value heads, ``n_queries`` x ``n_keys``, head dim ``head_dim``."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    n_queries: int
    n_keys: int
    head_dim: int
    causal: bool
    padding_mask: bool = False


# The suite's realistic shapes (conformance/draw/anchors.py and its sources): FlashAttention's
# test grid (1024 x 1024 and 2048 x 2048, d 64 and 128, 9 query heads on 3), its KV-cache
# decode (one query against a long cache, 6 query heads on 1, d 128; the suite cuts the
# cache to --max-len 4096), and an HF-style padded batch (aotriton's matrix-bias test:
# batch 4, d 64), at the lengths a model runs.
WORKLOADS = (
    Workload("prefill 1024, d 64, causal", 2, 16, 16, 1024, 1024, 64, causal=True),
    Workload("prefill 2048, GQA 9:3, d 128, causal", 1, 9, 3, 2048, 2048, 128, causal=True),
    Workload("decode 1 x 4096, MQA 6:1, d 128", 8, 6, 1, 1, 4096, 128, causal=False),
    Workload(
        "padded batch 4 x 512, d 64", 4, 12, 12, 512, 512, 64, causal=False, padding_mask=True
    ),
)
QUICK_WORKLOADS = (
    Workload("prefill 64, causal", 1, 2, 2, 64, 64, 16, causal=True),
    Workload("decode 1 x 96, MQA 2:1", 2, 2, 1, 1, 96, 16, causal=False),
    Workload("padded batch 2 x 48", 2, 2, 2, 48, 48, 16, causal=False, padding_mask=True),
)


@dataclass(frozen=True)
class BenchConfig:
    """What ``attnspec bench`` measures; :data:`FULL` and :data:`QUICK` are the presets."""

    sizes: tuple[int, ...]  # the causal case's lengths
    case_sizes: tuple[int, ...]  # the other dense cases' lengths
    batch: int
    heads: int
    head_dim: int
    dtype: str
    long_length: int
    sparse_length: int
    sparse_heads: int
    linear_sizes: tuple[int, ...]
    linear_heads: int
    gemm_size: int
    repeats: int
    budget_seconds: float  # per size, for the timed rounds after the first runs
    workloads: tuple[Workload, ...] = WORKLOADS
    cases: tuple[str, ...] = tuple(case.name for case in DENSE_CASES)  # the dense ones run


FULL = BenchConfig(
    sizes=(256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
    case_sizes=(512, 1024, 2048, 4096, 8192),
    batch=1,
    heads=8,
    head_dim=64,
    dtype="float32",
    long_length=131072,
    sparse_length=16384,
    sparse_heads=1,
    linear_sizes=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
    linear_heads=1,
    gemm_size=2048,
    repeats=5,
    budget_seconds=30.0,
)
# the full preset at small sizes (same batch, dtype and head counts of the sparse and
# linear cases); the cases other than causal at one length (of the causal case's, so JAX
# compiles fewer new shapes): every case still runs on every backend, and the second
# length of each added ~40% to a quick JAX run (its eager ops compile per shape)
QUICK = dataclasses.replace(
    FULL,
    sizes=(64, 160),
    case_sizes=(64,),
    heads=4,
    head_dim=16,
    long_length=512,
    sparse_length=256,
    linear_sizes=(64, 128, 256),
    gemm_size=128,
    repeats=1,
    budget_seconds=0.0,
    workloads=QUICK_WORKLOADS,
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


def _call_inputs(
    backend: Backend,
    dims: tuple[int, int, int, int, int, int],
    dtype: str,
    padding_mask: bool,
) -> tuple[Any, Any, Any, Any]:
    """q, k, v of ``dims`` = (batch, heads, kv_heads, Lq, Lk, E) and the key-padding mask
    (batch, 1, 1, Lk), True = may attend, with the last eighth of the keys padded (None
    without one)."""
    batch, heads, kv_heads, n_queries, n_keys, dim = dims
    rng = np.random.default_rng(0)
    shapes = ((batch, heads, n_queries, dim), *2 * ((batch, kv_heads, n_keys, dim),))
    q, k, v = (backend.asarray(rng.standard_normal(s), dtype=dtype) for s in shapes)
    mask = None
    if padding_mask:
        kept = np.arange(n_keys) < n_keys - n_keys // 8
        mask = backend.asarray(np.broadcast_to(kept, (batch, 1, 1, n_keys)).copy())
    return q, k, v, mask


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
        params = record.params
        what = params.get("case") or params.get("workload") or params.get("pattern") or ""
        line = f"  {record.backend:6} {what[:28]:28} {record.impl:11} L={record.length:6}  "
        if record.skipped is not None:
            log(line + f"skipped: {record.skipped}")
            continue
        timing = timings[record.impl]
        record.seconds, record.first_seconds = timing.seconds, timing.first_seconds
        record.runs, record.peak_bytes = timing.runs, timing.peak_bytes
        peak = "?" if record.peak_bytes is None else f"{record.peak_bytes / 1e6:.0f} MB"
        log(line + f"{record.seconds:9.4f} s  peak {peak}  ({record.runs} timed runs)")
    return [record for record, _, _ in runs]


Run = tuple[str, str | None, Callable[[], Any], float]  # impl, compared kernel, call, bytes


def _framework_run(impl: str, framework: Framework, inputs: tuple[Any, ...]) -> Run:
    args = framework.prepare(*inputs)
    return (impl, framework.name, lambda: framework.call(*args), 0.0)


def _dense_runs(
    backend: Backend,
    case: DenseCase,
    inputs: tuple[Any, Any, Any, Any],
    plain_bytes: float | None,
) -> list[Run]:
    """The calls timed together at one length of one case: (impl, the kernel's name for a
    framework, call, bytes it plans to hold); the plain form only with ``plain_bytes``."""
    q, k, v, mask = inputs
    gqa = case.kv_heads is not None
    runs: list[Run] = []
    yardstick = torch_sdpa(backend, case.causal, gqa)
    if yardstick is not None:
        runs.append(_framework_run("torch_sdpa", yardstick, inputs))
    library = library_kernel(backend, case.causal)
    if library is not None:
        impl, name, call, _ = _framework_run("library", library, inputs)
        runs.append((impl, name, call, library.bytes_per_score * scores(q)))
    options = {"mask": mask, "is_causal": case.causal}
    runs.append(
        (
            "reference",
            None,
            partial(scaled_dot_product_attention, q, k, v, **options),
            REFERENCE_PLANNED_BYTES,
        )
    )
    if plain_bytes is not None:
        runs.append(("plain", None, partial(plain_attention, q, k, v, **options), plain_bytes))
    return runs


def scores(q: Any) -> int:
    """B x H x Lq x Lk of a self-attention call on ``q`` (Lk = Lq)."""
    *batch_heads, length, _ = (int(n) for n in q.shape)
    return math.prod(batch_heads) * length * length


def _case_records(
    backend: Backend,
    probe: MemoryProbe,
    config: BenchConfig,
    case: DenseCase,
    length: int,
    plain: bool,
    log: Log,
) -> list[Measurement]:
    kv_heads = case.kv_heads or config.heads
    dims = (config.batch, config.heads, kv_heads, length, length, config.head_dim)
    inputs = _call_inputs(backend, dims, config.dtype, case.padding_mask)
    plain_bytes = (
        PLAIN_BYTES_PER_SCORE_ITEM * _itemsize(config.dtype) * scores(inputs[0]) if plain else None
    )
    runs = []
    for impl, kernel, call, planned in _dense_runs(backend, case, inputs, plain_bytes):
        params: dict[str, Any] = {"case": case.name}
        if kernel is not None:
            params["kernel"] = kernel
        record = Measurement("dense", backend.name, impl, length, params=params)
        runs.append((record, call, planned))
    return _measure(backend, probe, config, runs, log)


def dense(config: BenchConfig, backend: Backend, log: Log) -> list[Measurement]:
    """Every case of :data:`DENSE_CASES` at its lengths: the reference's entry point, the
    plain form, PyTorch SDPA and the library's own kernel, timed together per length."""
    probe = MemoryProbe(backend)
    records = []
    for case in (c for c in DENSE_CASES if c.name in config.cases):
        sizes = config.sizes if case.name == DENSE_CASES[0].name else config.case_sizes
        for length in sizes:
            records += _case_records(backend, probe, config, case, length, True, log)
    return records


def long(config: BenchConfig, backend: Backend, log: Log) -> list[Measurement]:
    """The causal case at ``config.long_length``, the entry point and PyTorch SDPA only
    (the plain form would need Lq x Lk scores), each run once (minutes at L = 131072)."""
    probe = MemoryProbe(backend)
    once = dataclasses.replace(config, repeats=0, budget_seconds=0.0)
    records = _case_records(backend, probe, once, DENSE_CASES[0], config.long_length, False, log)
    for record in records:
        record.section = "long"
    return records


def kernel(
    config: BenchConfig, backend: Backend, log: Log, user_kernel: Callable[..., Any], name: str
) -> list[Measurement]:
    """``user_kernel(q, k, v, mask=..., is_causal=...)`` (the suite's convention: arrays of
    ``backend``, (..., heads, length, head_dim), top-left causal, a boolean mask with True
    = may attend) against the entry point and PyTorch SDPA at every workload."""
    probe = MemoryProbe(backend)
    records = []
    for work in config.workloads:
        dims = (work.batch, work.heads, work.kv_heads, work.n_queries, work.n_keys, work.head_dim)
        inputs = _call_inputs(backend, dims, config.dtype, work.padding_mask)
        q, k, v, mask = inputs
        options = {"is_causal": work.causal} | ({"mask": mask} if mask is not None else {})
        runs: list[Run] = [
            ("kernel", name, partial(user_kernel, q, k, v, **options), 0.0),
            ("reference", None, partial(scaled_dot_product_attention, q, k, v, **options), 0.0),
        ]
        yardstick = torch_sdpa(backend, work.causal, work.kv_heads != work.heads)
        if yardstick is not None:
            runs.append(_framework_run("torch_sdpa", yardstick, inputs))
        described = {
            "workload": work.name,
            **{f: getattr(work, f) for f in ("batch", "heads", "kv_heads", "n_queries")},
            "head_dim": work.head_dim,
            "causal": work.causal,
            "padding_mask": work.padding_mask,
        }
        measured = []
        for impl, kernel_name, call, planned in runs:
            params = dict(described) | ({"kernel": kernel_name} if kernel_name else {})
            record = Measurement("kernel", backend.name, impl, work.n_keys, params=params)
            measured.append((record, call, planned))
        records += _measure(backend, probe, config, measured, log)
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
