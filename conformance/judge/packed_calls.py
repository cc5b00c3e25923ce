"""Calling packed (varlen) and KV-cache kernels in their own conventions (spec/features.md,
VARLEN-1, KVCACHE-1).

A batch is a list of dense per-sequence :class:`Problem` s, each without batch dims
(``q (Hq, Lq_b, E)``), sharing the dtype, the options and the features; what a kernel
returns for sequence b is compared with the dense definition of that problem alone
(VARLEN-2, KVCACHE-2).  Here the batch is packed into the library's arguments, the kernel
is called once, and its results are cut back into sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration
from .kernel import KernelUnderTest, feature_keywords


@dataclass
class Batch:
    """Sequences of one packed or KV-cache call; ``cache`` is set for a KV-cache call."""

    sequences: list[Problem]
    cache: CacheCall | None = None
    sinks: np.ndarray | None = None  # (Hq,) float64 values exact in float32 (SINK-6)

    @property
    def first(self) -> Problem:
        return self.sequences[0]

    @property
    def kv_cache(self) -> CacheCall:
        """``cache``, for the functions that only take a KV-cache call."""
        if self.cache is None:
            raise ValueError(f"batch: expected a KV-cache call (cache set), got {self.describe()}")
        return self.cache

    def describe(self) -> str:
        """Lengths and options, for a failure message (the call has no single Problem)."""
        lengths = [(s.q.shape[-2], s.k.shape[-2]) for s in self.sequences]
        first = self.first
        parts = [
            f"{len(lengths)} sequences (Lq, Lk) = {lengths}",
            f"Hq={first.q.shape[-3]}",
            f"Hkv={first.k.shape[-3]}",
            f"E={first.q.shape[-1]}",
            f"Ev={first.v.shape[-1]}",
            f"dtype={first.dtype}",
            f"is_causal={first.is_causal}",
            f"scale={first.scale!r}",
        ]
        if first.softcap is not None:
            parts.append(f"softcap={first.softcap!r}")
        if first.alibi_slopes is not None:
            parts.append("ALiBi")
        if self.sinks is not None:
            parts.append(f"sinks {np.array2string(self.sinks, precision=4, separator=', ')}")
        if self.cache is None and any(s.mask is not None for s in self.sequences):
            parts.append("a custom_mask (VARLEN-6)")
        if self.cache is not None:
            parts.append(self.cache.describe())
        return ", ".join(parts)


@dataclass
class CacheCall:
    """How a KV-cache call lays the keys out: each batch element's keys are cached at
    positions ``start(b)`` … ``lengths[b] - 1``, the last ``n_new`` are passed as new keys
    (KVCACHE-1, KVCACHE-2, KVCACHE-6).

    ``block_size`` (None: a contiguous cache of ``capacity`` positions) with
    ``table`` ``(B, capacity / block_size)`` block indices among ``n_blocks`` blocks;
    ``stale_seed`` fills every position no sequence owns (KVCACHE-3), with values of
    ``stale_magnitude``; NaN makes them all NaN (KVCACHE-7).
    """

    lengths: list[int]
    n_new: int
    capacity: int
    block_size: int | None = None
    table: np.ndarray | None = None
    n_blocks: int = 0
    stale_seed: int = 0
    stale_magnitude: float = 3.0
    extra: dict[str, Any] = field(default_factory=dict)
    starts: list[int] | None = None  # cache_leftpad (KVCACHE-6); None: not passed
    window: tuple[int | None, int | None] | None = None  # window_size; None: not passed
    chunk: int | None = None  # attention_chunk; None: not passed
    sink_tokens: int | None = None  # n_sink_tokens beside the window (SINK-4); None: not passed

    def start(self, b: int) -> int:
        """Batch element b's first valid cache position (KVCACHE-6)."""
        return 0 if self.starts is None else self.starts[b]

    @property
    def block_table(self) -> np.ndarray:
        """``table``, for a paged cache (``block_size`` set)."""
        if self.table is None:
            raise ValueError(f"table: a paged cache (block_size={self.block_size}) needs one")
        return self.table

    def describe(self) -> str:
        text = f"cache_seqlens={self.lengths}, {self.n_new} new keys, capacity {self.capacity}"
        for name, value in (
            ("cache_leftpad", self.starts),
            ("window (left, right)", self.window),
            ("n_sink_tokens", self.sink_tokens),
            ("attention_chunk", self.chunk),
        ):
            if value is not None:
                text += f", {name} {value}"
        if self.block_size is not None:
            text += f", paged: blocks of {self.block_size}, table {self.block_table.tolist()}"
        return text

    def position(self, b: int, t: int) -> tuple[int, int]:
        """(cache index, position in it) of batch element b's logical position t."""
        if self.block_size is None:
            return b, t
        return int(self.block_table[b, t // self.block_size]), t % self.block_size


def _options(kernel: KernelUnderTest, batch: Batch) -> dict[str, Any]:
    """The keywords every sequence shares: causal, scale, the features, the LSE request,
    the sink logits (SINK-6, under the declared keyword)."""
    first = batch.first
    keywords: dict[str, Any] = {}
    if batch.sinks is not None:
        keywords[kernel.declaration.sinks_keyword] = kernel.backend.asarray(batch.sinks, "float32")
    if first.is_causal:
        keywords["is_causal"] = True
    if first.scale is not None:
        keywords["scale"] = first.scale
    for name, (value, _) in feature_keywords(kernel.declaration, first).items():
        keywords[name] = value
    return keywords


def _slopes(kernel: KernelUnderTest, batch: Batch, keywords: dict[str, Any]) -> None:
    """ALiBi slopes of the batch as (B, Hq) float32 (FlashAttention's per-batch form)."""
    decl = kernel.declaration
    if batch.first.alibi_slopes is not None and not decl.alibi_builtin_slopes:
        slopes = np.stack(
            [np.broadcast_to(s.required("alibi_slopes"), (s.q.shape[-3],)) for s in batch.sequences]
        ).astype(np.float32)
        keywords[decl.alibi_keyword] = kernel.backend.asarray(slopes, "float32")


def _results(kernel: KernelUnderTest, result: Any) -> tuple[np.ndarray, np.ndarray | None]:
    out, _, lse = kernel.results(result)
    return kernel.numpy(out), None if lse is None else kernel.numpy(lse)


def _call(
    kernel: KernelUnderTest, batch: Batch, args: tuple[Any, ...], keywords: dict[str, Any]
) -> Any:
    """The kernel's raw result; an exception it raises is a failure naming the call."""
    return kernel.call_checked(args, keywords, context=f" [call: {batch.describe()}]")


@dataclass(frozen=True)
class Padding:
    """Tokens past the last offsets (VARLEN-5): ``queries`` rows of q, ``keys`` rows of k
    and v, all holding ``value``."""

    queries: int
    keys: int
    value: float


def _packed(batch: Batch, name: str, padding: Padding | None) -> np.ndarray:
    """One of q, k, v packed as ``(total, H, ·)``, with the padding rows appended."""
    packed = np.concatenate([np.swapaxes(getattr(s, name), 0, 1) for s in batch.sequences])
    extra = 0 if padding is None else (padding.queries if name == "q" else padding.keys)
    if not extra:
        return packed
    assert padding is not None  # extra > 0 only with padding
    rows = np.full((extra, *packed.shape[1:]), padding.value)
    return np.concatenate([packed, rows])


def flat_mask(batch: Batch) -> np.ndarray | None:
    """The sequences' masks flattened as VARLEN-6 (and PAGED-8) lay them out: each
    ``(L_q, L_k)`` mask row by row, sequence after sequence; None when none has one."""
    if all(s.mask is None for s in batch.sequences):
        return None
    return np.concatenate(
        [
            np.broadcast_to(s.required("mask"), (s.q.shape[-2], s.k.shape[-2])).reshape(-1)
            for s in batch.sequences
        ]
    )


def varlen_arguments(
    kernel: KernelUnderTest,
    batch: Batch,
    offsets: tuple[np.ndarray, np.ndarray] | None = None,
    padding: Padding | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(q, k, v)`` packed as ``(total, H, ·)`` and the keywords of VARLEN-1; ``offsets``
    replace the true cu_seqlens (to pass malformed ones, VARLEN-4); ``padding`` appends
    tokens past the last offsets (VARLEN-5)."""
    b, dtype = kernel.backend, batch.first.dtype
    arrays = [b.asarray(_packed(batch, name, padding), dtype) for name in ("q", "k", "v")]
    lengths_q = [s.q.shape[-2] for s in batch.sequences]
    lengths_k = [s.k.shape[-2] for s in batch.sequences]
    if offsets is None:
        offsets_q, offsets_k = (
            np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lengths_q, lengths_k)
        )
        offsets = offsets_q, offsets_k
    keywords = {"cu_seqlens_q": b.asarray(offsets[0]), "cu_seqlens_k": b.asarray(offsets[1])}
    if kernel.declaration.varlen_max_seqlen:
        keywords.update(max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    keywords.update(_options(kernel, batch))
    _slopes(kernel, batch, keywords)
    mask = flat_mask(batch)
    if mask is not None:
        keywords["custom_mask"] = b.asarray(mask)
    return tuple(arrays), keywords


def call_varlen(
    kernel: KernelUnderTest, batch: Batch, padding: Padding | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The packed output ``(T_q, Hq, Ev)`` and log-sum-exp ``(Hq, T_q)`` (or None), as
    returned (float64 NumPy)."""
    arguments = varlen_arguments(kernel, batch, padding=padding)
    return _results(kernel, _call(kernel, batch, *arguments))


def per_sequence(batch: Batch, packed: np.ndarray, axis: int) -> list[np.ndarray]:
    """A packed result cut into sequences along its token ``axis``; outputs come back as
    ``(Hq, Lq_b, Ev)``."""
    cuts = np.cumsum([s.q.shape[-2] for s in batch.sequences])[:-1]
    parts = np.split(packed, cuts, axis=axis)
    return [np.swapaxes(part, 0, 1) for part in parts] if axis == 0 else parts


def _filled(shape: tuple[int, ...], seed: int, magnitude: float) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape) * magnitude


def cache_contents(batch: Batch, kernel: KernelUnderTest) -> tuple[np.ndarray, np.ndarray]:
    """The caches before the call, float64 values exact in the dtype: each batch element's
    cached keys and values at their logical positions, stale values everywhere else."""
    call = batch.kv_cache
    first = batch.first
    n_kv, head_dim, value_dim = first.k.shape[-3], first.k.shape[-1], first.v.shape[-1]
    count, length = (
        (len(call.lengths), call.capacity)
        if call.block_size is None
        else (call.n_blocks, call.block_size)
    )
    caches = [
        kernel.rounded(
            _filled((count, n_kv, length, width), call.stale_seed + i, call.stale_magnitude),
            first.dtype,
        )
        for i, width in enumerate((head_dim, value_dim))
    ]
    for b, (cached, sequence) in enumerate(zip(call.lengths, batch.sequences, strict=True)):
        start = call.start(b)  # the sequence's keys begin at cache_leftpad[b] (KVCACHE-6)
        for t in range(start, cached):
            index, position = call.position(b, t)
            caches[0][index, :, position] = sequence.k[:, t - start]
            caches[1][index, :, position] = sequence.v[:, t - start]
    return caches[0], caches[1]


def window_keywords(
    window: tuple[int | None, int | None] | None, sink_tokens: int | None, chunk: int | None
) -> dict[str, Any]:
    """A cache or paged call's ``window_size=(left, right)`` (-1 unbounded, SPARSE-2.1),
    ``n_sink_tokens`` (SINK-4) and ``attention_chunk`` (CHUNK-1), each left out when None."""
    keywords: dict[str, Any] = {}
    if window is not None:
        keywords["window_size"] = tuple(-1 if w is None else w for w in window)
    if sink_tokens is not None:
        keywords["n_sink_tokens"] = sink_tokens
    if chunk is not None:
        keywords["attention_chunk"] = chunk
    return keywords


def kv_cache_arguments(
    kernel: KernelUnderTest, batch: Batch
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, np.ndarray]]:
    """``(q, k_cache, v_cache)``, the keywords of KVCACHE-1, and the NumPy inputs."""
    b, dtype, call = kernel.backend, batch.first.dtype, batch.kv_cache
    inputs = {"q": np.stack([s.q for s in batch.sequences])}
    inputs["k_cache"], inputs["v_cache"] = cache_contents(batch, kernel)
    args = tuple(b.asarray(inputs[name], dtype) for name in ("q", "k_cache", "v_cache"))
    inputs["cache_seqlens"] = np.asarray(call.lengths, dtype=np.int32)
    keywords: dict[str, Any] = {"cache_seqlens": b.asarray(inputs["cache_seqlens"])}
    if call.n_new:
        for name in ("k", "v"):
            inputs[name] = np.stack([getattr(s, name)[:, -call.n_new :] for s in batch.sequences])
            keywords[name] = b.asarray(inputs[name], dtype)
    if call.block_size is not None:
        inputs["block_table"] = call.block_table.astype(np.int32)
        keywords["block_table"] = b.asarray(inputs["block_table"])
    if call.starts is not None:
        inputs["cache_leftpad"] = np.asarray(call.starts, dtype=np.int32)
        keywords["cache_leftpad"] = b.asarray(inputs["cache_leftpad"])
    keywords.update(window_keywords(call.window, call.sink_tokens, call.chunk))
    keywords.update(_options(kernel, batch))
    _slopes(kernel, batch, keywords)
    return args, keywords, inputs


def call_kv_cache(
    kernel: KernelUnderTest, batch: Batch
) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any], dict[str, np.ndarray]]:
    """The output ``(B, Hq, Lq, Ev)``, the log-sum-exp (or None), every argument as the
    kernel left it (NumPy) and as it was given."""
    args, keywords, inputs = kv_cache_arguments(kernel, batch)
    out, lse = _results(kernel, _call(kernel, batch, args, keywords))
    after = dict(zip(("q", "k_cache", "v_cache"), (kernel.numpy(a) for a in args), strict=True))
    after.update(
        (name, np.asarray(kernel.backend.to_numpy(keywords[name])))
        for name in inputs
        if name in keywords
    )
    return out, lse, after, inputs


def bottom_right(declaration: KernelDeclaration) -> KernelDeclaration:
    """A KV-cache call is bottom-right whatever the dense alignment (KVCACHE-2)."""
    return replace(declaration, causal_alignment="bottom_right")
