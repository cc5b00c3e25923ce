"""PAGED-1 … PAGED-9: packed queries of many sequences over a paged cache, called as vLLM calls
FlashAttention: ``fn(q, k_cache, v_cache, cu_seqlens_q=, seqused_k=, block_table=,
max_seqlen_q=, max_seqlen_k=, is_causal=)``.

A drawn batch mixes decode rows (one query), prefill chunks (the newest positions of a longer
cache) and, in causal calls, sequences with more queries than keys (rows that see nothing);
pages of 1 to 256 positions are drawn out of order from a pool, one page shared by two
sequences, with stale values in every slot no sequence reaches.  Each sequence's rows are
compared with TOL-2 of its own dense problem, bottom-right (PAGED-2, PAGED-7); and the
memory past every valid length, NaN there included, must leave the output bit-identical
(PAGED-5).  The options a kernel declares (``PagedBatchClaim.features``) are drawn with the
pages: left padding, windows, chunks, softcap and a flattened mask (PAGED-8).  The output
rows past the last offset must be 0 (PAGED-9), on fixed batches; malformed metadata on
the same batch should be rejected with an exception (PAGED-6).  A kernel that also
declares float8 inputs gets q and the pages in float8 with descales per sequence and
key/value head, each sequence judged within QUANT-4 of its real values (QUANT-6).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.serving.fp8 import round_to_fp8
from ....reference.serving.paged import Rules
from ....reference.tolerance import error_bound
from ....reference.tolerance_fp8 import fp8_error_bound
from ....reference.tolerance_serving import sink_error_and_lse_bound
from ...draw import sizes
from ...draw.anchors import PagedAnchor
from ...draw.strategies import draw_dtype, draw_rng, random_values
from ..assertions import unlike_array
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..packed_calls import window_keywords
from ..registration import family_only, register
from ._helpers import as_float8, descale_keywords, draw_sinks, draw_softcap

SMALL_PAGE_SIZES = (1, 2, 3, 16)
REALISTIC_PAGE_SIZES = (1, 16, 64, 256)  # the sizes upstream tests run
REALISTIC_CACHE_LENGTHS = (1, 17, 63, 64, 65, 129, 255, 257, 1023)
REALISTIC_HEAD_DIMS = (64, 128)


_paged_only = family_only(
    "paged-batch", "the kernel is not declared a paged batch kernel (--paged-batch)"
)


@dataclass(frozen=True)
class PagedFp8:
    """A float8 paged call (QUANT-6): the stored format, and float64 descales as passed,
    ``(S, H_kv)`` per sequence and key/value head or ``(1,)``, by keyword."""

    fmt: str
    descales: dict[str, np.ndarray]

    def of_sequence(self, b: int) -> dict[str, np.ndarray]:
        """Sequence b's descales, ``(1, H_kv)`` or ``(1,)``."""
        return {name: d[b : b + 1] if d.ndim == 2 else d for name, d in self.descales.items()}


def _stored_fp8(
    kernel: KernelUnderTest, seed: int, call: PagedCall, fmt: str | None = None
) -> PagedCall:
    """``call`` in float8 (QUANT-1, QUANT-6): its values times 8 on ``fmt``'s grid (the
    declared format drawn from ``seed`` when None), and float32 descales 2^-e times a factor
    in [0.5, 2), e from 2 to 6, per sequence and key/value head (or per tensor), so that one
    sequence's descale read for another's is far outside QUANT-4's bound."""
    claim = kernel.declaration.fp8
    assert claim is not None  # only for a kernel that declares float8 inputs
    rng = np.random.default_rng(seed)
    fmt = fmt or "float8_" + claim.formats[int(rng.integers(len(claim.formats)))]
    grid = (len(call.n_queries), call.k_cache.shape[1]) if claim.descale == "head" else (1,)
    descales = {
        name: (2.0 ** -rng.integers(2, 7, grid) * rng.uniform(0.5, 2.0, grid))
        .astype(np.float32)
        .astype(np.float64)
        for name in claim.descale_keywords
    }
    k_cache, v_cache = (
        np.asarray(round_to_fp8(x * 8.0, fmt)) for x in (call.k_cache, call.v_cache)
    )
    # beside a float8 cache q stays in the output dtype (QUANT-8)
    q = call.q if claim.kv_only else np.asarray(round_to_fp8(call.q * 8.0, fmt))
    return replace(call, q=q, k_cache=k_cache, v_cache=v_cache, fp8=PagedFp8(fmt, descales))


@dataclass(frozen=True)
class PagedCall:
    """One call in the spec's layout, as float64 values exact in ``dtype``: ``q (T, Hq, E)``,
    pages ``(N, Hkv, P, ·)``, and per sequence its query count, first valid position
    (``cache_leftpad``), cached length (``seqused_k``) and pages; the options drawn for the
    kernel's declared features (None: not passed)."""

    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray
    n_queries: tuple[int, ...]
    n_keys: tuple[int, ...]
    table: np.ndarray  # (B, M) int32
    is_causal: bool
    dtype: str
    starts: tuple[int, ...] | None = None
    window: tuple[int | None, int | None] | None = None
    chunk: int | None = None
    softcap: float | None = None
    masks: tuple[np.ndarray, ...] | None = None  # per sequence (L_q, L_k) bool
    sinks: np.ndarray | None = None  # (Hq,) float64 values exact in float32 (SINK-1)
    sink_tokens: int | None = None  # each sequence's first keys kept beside the window (SINK-4)
    fp8: PagedFp8 | None = None  # q and the pages stored in float8 (QUANT-6); dtype: the output's

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.n_queries)]).astype(np.int32)

    @property
    def page_size(self) -> int:
        return int(self.k_cache.shape[2])

    def start(self, b: int) -> int:
        return 0 if self.starts is None else self.starts[b]

    def reached(self) -> np.ndarray:
        """(N, P) True at the slots some sequence's valid positions occupy."""
        reached = np.zeros(self.k_cache.shape[0:1] + self.k_cache.shape[2:3], bool)
        for b, length in enumerate(self.n_keys):
            for t in range(self.start(b), length):
                reached[self.table[b, t // self.page_size], t % self.page_size] = True
        return reached

    def keys(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Sequence b's keys and values ``(Hkv, L_k, ·)`` in logical order (PAGED-1)."""
        positions = np.arange(self.start(b), self.n_keys[b])
        pages = self.table[b, positions // self.page_size]
        slots = positions % self.page_size
        return (
            np.swapaxes(self.k_cache[pages, :, slots], 0, 1),
            np.swapaxes(self.v_cache[pages, :, slots], 0, 1),
        )

    def allowed(self, b: int) -> np.ndarray:
        """Sequence b's allowed set ``(L_q, L_k)`` (PAGED-2, PAGED-8): the causal rule, the
        window with its sink tokens (SINK-4) and the chunk from its bottom-right query
        positions, and its mask."""
        n_queries, n_keys = self.n_queries[b], self.n_keys[b] - self.start(b)
        left, right = (None, None) if self.window is None else self.window
        rules = Rules(self.is_causal, left, right, self.chunk, self.sink_tokens or 0)
        t = np.arange(n_queries)[:, None] + (n_keys - n_queries)
        allowed = np.asarray(rules.allowed(np, t, np.arange(n_keys)[None, :]))
        allowed = np.broadcast_to(allowed, (n_queries, n_keys))
        return allowed if self.masks is None else allowed & self.masks[b]

    @property
    def _q_float8(self) -> str | None:
        """q's float8 format, None when q is in ``dtype`` (QUANT-8 included)."""
        if self.fp8 is None or "q_descale" not in self.fp8.descales:
            return None
        return self.fp8.fmt

    def describe(self) -> str:
        options = [
            f"{name} {value}"
            for name, value in (
                ("cache_leftpad", None if self.starts is None else list(self.starts)),
                ("window (left, right)", self.window),
                ("n_sink_tokens", self.sink_tokens),
                ("attention_chunk", self.chunk),
                ("softcap", self.softcap),
            )
            if value is not None
        ]
        if self.masks is not None:
            options.append("a custom_mask")
        if self.sinks is not None:
            options.append(f"sinks {np.array2string(self.sinks, precision=4, separator=', ')}")
        if self.fp8 is not None:
            options.extend(
                f"{name} {np.array2string(d, precision=4, separator=', ')}"
                for name, d in self.fp8.descales.items()
            )
        return (
            f"q {self.q.shape} {self.dtype if self._q_float8 is None else self._q_float8}, "
            f"pages {self.k_cache.shape} (N, Hkv, P, E)"
            f"{'' if self.fp8 is None else ' ' + self.fp8.fmt}, "
            f"query lengths {list(self.n_queries)}, cached lengths {list(self.n_keys)}, "
            f"{'causal' if self.is_causal else 'not causal'}"
            + "".join(f", {option}" for option in options)
        )


def _draw_call(data: st.DataObject, kernel: KernelUnderTest) -> PagedCall:
    """A drawn batch: 1-3 sequences of decode rows, prefill chunks of up to 32 queries and
    (causal) more queries than keys; in the mixed-batch stratum a prefill of up to about
    2000 queries among 2-5 others (:func:`_mixed_sequences`); an anchor's fixed batch in
    the anchor strata (:func:`_anchored_call`)."""
    claim = kernel.declaration.paged_batch
    assert claim is not None  # the properties apply only to a --paged-batch declaration
    dtype = draw_dtype(data, kernel)
    drawing = sizes.current()
    if isinstance(drawing.stratum.anchor, PagedAnchor):
        return _anchored_call(data, kernel, drawing.stratum.anchor, dtype)
    realistic = drawing.realistic
    mixed = drawing.stratum.option("shape") == "mixed"
    causal = kernel.declaration.causal and data.draw(st.booleans(), label="is_causal")
    page = claim.page_size or data.draw(
        st.sampled_from(REALISTIC_PAGE_SIZES if realistic else SMALL_PAGE_SIZES), label="P"
    )
    # a mixed batch: one key/value head of 64 channels, which its long prefill makes costly
    n_kv_heads = 1 if mixed else data.draw(st.integers(1, 2), label="Hkv")
    n_q_heads = n_kv_heads * (
        data.draw(st.integers(1, 2 if mixed else 3), label="G") if kernel.declaration.gqa else 1
    )
    head_dim = (
        min(64, drawing.limits.max_head_dim)
        if mixed
        else data.draw(st.sampled_from(REALISTIC_HEAD_DIMS), label="E")
        if realistic
        else data.draw(st.integers(1, 8), label="E")
    )
    features = claim.features
    n_queries, n_keys, starts = [], [], []
    shapes = (
        _mixed_sequences(data, drawing.limits.max_len)
        if mixed
        else [None] * data.draw(st.integers(1, 3), label="B")
    )
    for b, shape in enumerate(shapes):
        used = (
            shape[1]
            if shape is not None
            else data.draw(st.sampled_from(REALISTIC_CACHE_LENGTHS), label=f"seqused_k {b}")
            if realistic
            else data.draw(st.integers(0, 9), label=f"seqused_k {b}")
        )
        start = _draw_leftpad(data, b, used, page) if "leftpad" in features else 0
        length = used - start
        if shape is not None:
            queries = 1 if shape[0] == 1 else min(shape[0], length)
        else:
            kinds = ["decode", "prefill", *(["longer"] if causal else [])]
            kind = data.draw(st.sampled_from(kinds), label=f"sequence {b}")
            if kind == "decode":
                queries = 1
            elif kind == "prefill":
                queries = data.draw(st.integers(0, min(length, 32)), label=f"L_q {b}")
            else:  # more queries than keys: the first rows see nothing (PAGED-3)
                queries = length + data.draw(st.integers(1, 3), label=f"L_q - L_k {b}")
        n_queries.append(queries)
        n_keys.append(used)
        starts.append(start)
    pages_of = [-(-length // page) for length in n_keys]
    width = max([1, *pages_of])
    rng = draw_rng(data)
    seeded = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="pages seed"))
    n_pages = sum(pages_of) + 2  # two pages no sequence reaches
    order = seeded.permutation(n_pages)
    table = np.zeros((len(n_keys), width), np.int32)
    used = 0
    for b, count in enumerate(pages_of):
        table[b, :count] = order[used : used + count]
        table[b, count:] = order[-1]  # entries past the pages read: a page never read
        used += count
    if len(n_keys) > 1 and pages_of[0] and pages_of[1]:
        table[1, 0] = table[0, 0]  # a page shared by two sequences (a common prefix)
    q = random_values(kernel, rng, (sum(n_queries) + 1, n_q_heads, head_dim), dtype)
    k_cache = random_values(kernel, rng, (n_pages, n_kv_heads, page, head_dim), dtype)
    v_cache = random_values(kernel, rng, (n_pages, n_kv_heads, page, head_dim), dtype)
    call = PagedCall(q, k_cache, v_cache, tuple(n_queries), tuple(n_keys), table, causal, dtype)
    return _finished(data, kernel, call, starts, realistic)


def _mixed_sequences(data: st.DataObject, limit: int) -> list[tuple[int, int]]:
    """(L_q, seqused_k) of a batch as chunked prefill schedules it, each cut to ``limit``
    (--max-len): a prefill of 129 to 2047 queries on its own keys and a cached prefix of
    0 to 255 more, a decode row, and 1 to 4 more decode rows (cached lengths 1 to 4096) or
    chunks of 2 to 64 queries (on 63 to 1023 keys), in a drawn order."""
    n_long = data.draw(st.sampled_from((129, 512, 1000, 1023, 2000, 2047)), label="prefill L_q")
    prefix = data.draw(st.sampled_from((0, 1, 17, 255)), label="prefill prefix")
    shapes = [(min(n_long, limit), min(n_long + prefix, limit))]
    for b in range(data.draw(st.integers(2, 5), label="B - 1")):
        if b == 0 or data.draw(st.booleans(), label=f"decode {b}"):
            cached = data.draw(st.sampled_from((1, 17, 257, 1023, 4096)), label=f"cached {b}")
            shapes.append((1, min(cached, limit)))
        else:
            cached = data.draw(st.sampled_from((63, 300, 1023)), label=f"cached {b}")
            chunk = data.draw(st.sampled_from((2, 16, 64)), label=f"chunk {b}")
            shapes.append((min(chunk, cached, limit), min(cached, limit)))
    order = data.draw(st.permutations(range(len(shapes))), label="order")
    return [shapes[i] for i in order]


def _anchored_call(
    data: st.DataObject, kernel: KernelUnderTest, anchor: PagedAnchor, dtype: str
) -> PagedCall:
    """``anchor``'s batch (:class:`~attnspec.conformance.draw.anchors.PagedAnchor`): its
    lengths cut to --max-len, causal where the kernel claims it, pages of the kernel's
    size (else the anchor's), the sequences reading the pool's last pages in a shuffled
    order, each block table row as wide as the pool (its entries past those read: page
    0, never read), one key/value head (two query heads with GQA)."""
    claim = kernel.declaration.paged_batch
    assert claim is not None  # the properties apply only to a --paged-batch declaration
    limits = sizes.current().limits
    page = claim.page_size or anchor.page_size
    n_keys = tuple(min(n, limits.max_len) for n in anchor.n_keys)
    n_queries = tuple(
        1 if q == 1 else min(q, k) for q, k in zip(anchor.n_queries, n_keys, strict=True)
    )
    head_dim = min(anchor.head_dim, limits.max_head_dim)
    pages_of = [-(-n // page) for n in n_keys]
    n_pages = max(-(-anchor.pool_slots // page), sum(pages_of) + 1)
    seeded = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="pages seed"))
    read = iter(n_pages - 1 - seeded.permutation(sum(pages_of)))
    table = np.zeros((len(n_keys), n_pages), np.int32)
    for b, count in enumerate(pages_of):
        table[b, :count] = [next(read) for _ in range(count)]
    rng = draw_rng(data)
    heads = 2 if kernel.declaration.gqa else 1
    q = random_values(kernel, rng, (sum(n_queries) + 1, heads, head_dim), dtype)
    k_cache = random_values(kernel, rng, (n_pages, 1, page, head_dim), dtype)
    v_cache = random_values(kernel, rng, (n_pages, 1, page, head_dim), dtype)
    causal = kernel.declaration.causal
    call = PagedCall(q, k_cache, v_cache, n_queries, n_keys, table, causal, dtype)
    return _finished(data, kernel, call, [0] * len(n_keys), True)


def _finished(
    data: st.DataObject,
    kernel: KernelUnderTest,
    call: PagedCall,
    starts: list[int],
    realistic: bool,
) -> PagedCall:
    """``call`` stored in float8 for a float8 kernel (QUANT-6), with the options the
    kernel declares drawn."""
    if kernel.declaration.fp8 is not None:
        call = _stored_fp8(kernel, data.draw(st.integers(0, 2**32 - 1), label="fp8 seed"), call)
    claim = kernel.declaration.paged_batch
    assert claim is not None  # the properties apply only to a --paged-batch declaration
    return _with_features(data, call, starts, claim.features, realistic)


def _draw_leftpad(data: st.DataObject, b: int, used: int, page: int) -> int:
    """cache_leftpad[b] <= seqused_k[b]: often 0, else within the first page, a page
    boundary or half the sequence, so the first page read is a partial one."""
    choices = sorted({0, min(1, used), min(page - 1, used), min(page, used), used // 2})
    return data.draw(st.sampled_from(choices), label=f"cache_leftpad {b}")


def _with_features(
    data: st.DataObject,
    call: PagedCall,
    starts: list[int],
    features: tuple[str, ...],
    realistic: bool,
) -> PagedCall:
    """The declared options, each drawn or left out (PAGED-2, PAGED-8): windows and chunks
    from 0 (a row's own key only) to past the longest sequence."""
    reach = (0, 1, 16, 63, 256) if realistic else (0, 1, 2, 3, 5, 8)
    changes: dict[str, Any] = {}
    if "leftpad" in features:
        changes["starts"] = tuple(starts)
    if "window" in features and data.draw(st.booleans(), label="with window"):
        bound = st.one_of(st.none(), st.sampled_from(reach))
        # sink tokens (SINK-4) beside a window with a left bound, the one they change
        sink_tokens = "sink_tokens" in features and data.draw(
            st.booleans(), label="with sink tokens"
        )
        left = st.sampled_from(reach) if sink_tokens else bound
        changes["window"] = (data.draw(left, label="left"), data.draw(bound, label="right"))
        if sink_tokens:
            counts = (1, 4, 16, 64) if realistic else (1, 2, 3, 4)
            changes["sink_tokens"] = data.draw(st.sampled_from(counts), label="n_sink_tokens")
    if "chunk" in features and data.draw(st.booleans(), label="with chunk"):
        sizes_ = (16, 64, 256) if realistic else (1, 2, 3, 4, 7)
        changes["chunk"] = data.draw(st.sampled_from(sizes_), label="attention_chunk")
    if "softcap" in features and data.draw(st.booleans(), label="with softcap"):
        changes["softcap"] = draw_softcap(data)
    if "mask" in features and data.draw(st.booleans(), label="with mask"):
        seeded = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="mask seed"))
        keep = data.draw(st.sampled_from([0.3, 0.7, 0.95]), label="kept fraction")
        changes["masks"] = tuple(
            seeded.random((n_q, n_k - start)) < keep
            for n_q, n_k, start in zip(call.n_queries, call.n_keys, starts, strict=True)
        )
    if "sinks" in features and data.draw(st.booleans(), label="with sinks"):
        changes["sinks"] = draw_sinks(data, call.q.shape[1])
    return replace(call, **changes)


def _arguments(
    kernel: KernelUnderTest, call: PagedCall, metadata: dict[str, np.ndarray] | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The kernel's arrays and keywords for ``call``; ``metadata`` replaces its
    ``cu_seqlens_q``, ``seqused_k``, ``block_table`` or ``cache_leftpad`` (malformed ones,
    PAGED-6), ``max_seqlen_q`` and ``max_seqlen_k`` then the largest lengths they give."""
    claim = kernel.declaration.paged_batch
    assert claim is not None  # the properties apply only to a --paged-batch declaration
    backend = kernel.backend
    k_cache, v_cache = call.k_cache, call.v_cache
    if claim.cache_layout == "nhd":
        k_cache, v_cache = np.swapaxes(k_cache, 1, 2), np.swapaxes(v_cache, 1, 2)
    given = {
        "cu_seqlens_q": call.offsets,
        "seqused_k": np.asarray(call.n_keys, np.int32),
        "block_table": call.table,
        **({} if call.starts is None else {"cache_leftpad": np.asarray(call.starts, np.int32)}),
        **(metadata or {}),
    }
    keywords: dict[str, Any] = {name: backend.asarray(a) for name, a in given.items()}
    if claim.max_seqlen:
        keywords["max_seqlen_q"] = int(np.max(np.diff(given["cu_seqlens_q"]), initial=0))
        keywords["max_seqlen_k"] = int(np.max(given["seqused_k"], initial=0))
    if kernel.declaration.causal:
        keywords["is_causal"] = call.is_causal
    keywords.update(window_keywords(call.window, call.sink_tokens, call.chunk))
    if call.softcap is not None:
        keywords["softcap"] = call.softcap
    if call.masks is not None:
        flat = np.concatenate([m.reshape(-1) for m in call.masks])
        keywords["custom_mask"] = backend.asarray(flat)
    if call.sinks is not None:
        keywords[kernel.declaration.sinks_keyword] = backend.asarray(call.sinks, "float32")
    if call.fp8 is None:
        arrays = tuple(backend.asarray(a, call.dtype) for a in (call.q, k_cache, v_cache))
    else:  # QUANT-6: float8 q and pages with their descales (QUANT-8: q in call.dtype)
        arrays = tuple(as_float8(backend, a, call.fp8.fmt) for a in (call.q, k_cache, v_cache))
        if "q_descale" not in call.fp8.descales:
            arrays = (backend.asarray(call.q, call.dtype), *arrays[1:])
        keywords.update(descale_keywords(kernel, call.fp8.descales))
    return arrays, {**kernel.declaration.extra_kwargs, **keywords}


def _run(kernel: KernelUnderTest, call: PagedCall) -> np.ndarray:
    """The kernel's output ``(T, Hq, Ev)`` as float64, after PAGED-1's shape and dtype
    checks."""
    try:
        out = kernel.call_raw(*_arguments(kernel, call))
    except Exception as exc:
        raise KernelRaised(
            f"the paged kernel raised {type(exc).__name__}: {str(exc)[:300]} "
            f"[call: {call.describe()}]"
        ) from exc
    shape = (call.q.shape[0], call.q.shape[1], call.v_cache.shape[-1])
    shown = unlike_array(kernel.backend, out, shape, call.dtype)
    if shown:
        raise PropertyFailure(
            f"the paged kernel returned {shown}, but should return one array of shape {shape} "
            f"(T_q, Hq, Ev) in {call.dtype} (PAGED-1) [call: {call.describe()}]"
        )
    return kernel.numpy(out)


def _sequence_bound(
    kernel: KernelUnderTest,
    call: PagedCall,
    b: int,
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    allowed: np.ndarray,
) -> Any:
    """Sequence b's output and its bound: TOL-2 (SINK-5 with sinks), or QUANT-4 on the
    values stored × the sequence's descales for a float8 call (QUANT-6)."""
    if call.fp8 is not None:
        claim = kernel.declaration.fp8
        assert claim is not None  # a float8 call is drawn for a float8 kernel only
        descales = call.fp8.of_sequence(b)
        bound = fp8_error_bound(
            queries[None],
            keys[None],
            values[None],
            q_descale=descales.get("q_descale"),  # None beside a float8 cache (QUANT-8)
            k_descale=descales["k_descale"],
            v_descale=descales["v_descale"],
            out_dtype=call.dtype,
            fmt=call.fp8.fmt,
            weights_format=None if claim.weights is None else "float8_" + claim.weights,
            mask=allowed,
            softcap=call.softcap,
            sinks=call.sinks,
        )
        return bound._replace(out=bound.out[0], out_tolerance=bound.out_tolerance[0])
    if call.sinks is not None:  # SINK-5: TOL-2 with the sink as one more key
        return sink_error_and_lse_bound(
            queries, keys, values, call.sinks, dtype=call.dtype, mask=allowed, softcap=call.softcap
        )[0]
    return error_bound(
        queries, keys, values, dtype=call.dtype, mask=allowed, softcap=call.softcap, weights=False
    )


@register("paged-batch-matches-reference", "PAGED-7", applies=_paged_only, draws="paged-batch")
def paged_batch_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Decode rows, prefill chunks and (causal) sequences with more queries than keys, over
    shuffled and shared pages of 1 to 256 positions: each sequence's rows within TOL-2 of
    its own problem, bottom-right with its own lengths (PAGED-2, PAGED-3), with the declared
    left padding, window, chunk, softcap and mask (PAGED-8).  A kernel that ignores the
    block table or cache_leftpad, reads a partial last page whole, aligns with the batch's
    largest lengths or top-left, or measures a window or chunk from another position is
    outside it."""
    call = _draw_call(data, kernel)
    out = _run(kernel, call)
    offsets = call.offsets
    for b in range(len(call.n_queries)):
        rows = out[offsets[b] : offsets[b + 1]]
        keys, values = call.keys(b)
        queries = np.swapaxes(call.q[offsets[b] : offsets[b + 1]], 0, 1)
        allowed = call.allowed(b)
        bound = _sequence_bound(kernel, call, b, queries, keys, values, allowed)
        expected = np.swapaxes(np.asarray(bound.out), 0, 1)
        tolerance = np.swapaxes(np.asarray(bound.out_tolerance), 0, 1)
        with np.errstate(invalid="ignore"):
            outside = ~(np.abs(rows - expected) <= tolerance)
        if outside.any():
            row, head, column = (int(i) for i in np.argwhere(outside)[0])
            raise PropertyFailure(
                f"out[{int(offsets[b]) + row}, {head}, {column}] = {rows[row, head, column]!r} "
                f"(row {row} of sequence {b}: {call.n_queries[b]} queries on "
                f"{call.n_keys[b] - call.start(b)} cached keys), but should be "
                f"{expected[row, head, column]!r} within {tolerance[row, head, column]:.3g} "
                f"(PAGED-2, PAGED-7{', PAGED-8' if call.masks is not None else ''}"
                f"{', SINK-5' if call.sinks is not None else ''}"
                f"{', QUANT-4, QUANT-6' if call.fp8 is not None else ''}); "
                f"{int(outside.sum())} of {outside.size} elements of that sequence outside "
                f"[call: {call.describe()}]"
            )


@register("paged-batch-ignores-padding", "PAGED-5", applies=_paged_only, draws="paged-batch")
def paged_batch_ignores_padding(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Cache slots past every sequence's length, pages no table reaches and query rows past
    cu_seqlens_q[-1] holding NaN instead of zeros leave every valid output row
    bit-identical: a kernel that masks those slots' scores but multiplies their values by
    a weight of 0 (0 * NaN) is caught."""
    call = _draw_call(data, kernel)
    reached = call.reached()
    valid = int(call.offsets[-1])

    def filled(value: float) -> PagedCall:
        k_cache, v_cache, q = call.k_cache.copy(), call.v_cache.copy(), call.q.copy()
        k_cache[~reached[:, None, :].repeat(k_cache.shape[1], 1)] = value
        v_cache[~reached[:, None, :].repeat(v_cache.shape[1], 1)] = value
        q[valid:] = value
        return replace(call, q=q, k_cache=k_cache, v_cache=v_cache)

    clean = _run(kernel, filled(0.0))[:valid]
    dirty = _run(kernel, filled(float("nan")))[:valid]
    differs = ~((clean == dirty) | (np.isnan(clean) & np.isnan(dirty)))
    if differs.any():
        at = tuple(int(i) for i in np.argwhere(differs)[0])
        raise PropertyFailure(
            f"out[{at}] = {dirty[at]!r} with NaN in the memory past the valid lengths, but "
            f"{clean[at]!r} with zeros there: memory no sequence reaches must not influence "
            f"the output (PAGED-5); {int(differs.sum())} elements differ "
            f"[call: {call.describe()}]"
        )


def _fixed_call(kernel: KernelUnderTest, dtype: str, seed: int) -> PagedCall:
    """A decode row on 5 keys, a prefill chunk of 2 on 3 keys and, in a causal call, 3
    queries on 1 key, over pages of the declared size (else 2) in reverse order, GQA 2 on 1
    where declared, then 3 query rows of NaN past the last offset."""
    claim = kernel.declaration.paged_batch
    assert claim is not None  # the property applies only to a --paged-batch declaration
    page = claim.page_size or 2
    causal = kernel.declaration.causal
    n_queries, n_keys = (1, 2, *((3,) if causal else ())), (5, 3, *((1,) if causal else ()))
    pages_of = [-(-n // page) for n in n_keys]
    order = iter(range(sum(pages_of) - 1, -1, -1))
    table = np.zeros((len(n_keys), max(pages_of)), np.int32)
    for b, count in enumerate(pages_of):
        table[b, :count] = [next(order) for _ in range(count)]
    rng = np.random.default_rng(seed)
    heads = 2 if kernel.declaration.gqa else 1
    q = random_values(kernel, rng, (sum(n_queries) + 3, heads, 4), dtype)
    q[sum(n_queries) :] = np.nan
    k_cache = random_values(kernel, rng, (sum(pages_of), 1, page, 4), dtype)
    v_cache = random_values(kernel, rng, (sum(pages_of), 1, page, 4), dtype)
    call = PagedCall(q, k_cache, v_cache, n_queries, n_keys, table, causal, dtype)
    return call if kernel.declaration.fp8 is None else _stored_fp8(kernel, seed, call)


@register("paged-batch-padding-rows", "PAGED-9", kind="fixed", applies=_paged_only)
def paged_batch_padding_rows(kernel: KernelUnderTest, seed: int) -> None:
    """Three query rows of NaN past cu_seqlens_q[-1], in every dtype checked: their output
    rows are exactly 0 (PAGED-9), as VARLEN-5 makes a packed call's.  A kernel that
    allocates its output like q and writes only the sequences' rows (FlashAttention's
    torch.empty, flash-attention #1228) leaves them as that memory was."""
    for dtype in kernel.dtypes:
        call = _fixed_call(kernel, dtype, seed)
        valid = int(call.offsets[-1])
        padding = _run(kernel, call)[valid:]
        if not (padding == 0).all():
            at = tuple(int(i) for i in np.argwhere(~(padding == 0))[0])
            raise PropertyFailure(
                f"out[{valid + at[0]}, {at[1]}, {at[2]}] = {padding[at]!r}, a row past "
                f"cu_seqlens_q[-1] = {valid}, but should be 0 (PAGED-9); "
                f"{int((~(padding == 0)).sum())} of {padding.size} padding elements are not "
                f"[call: {call.describe()}]"
            )


def _malformed(call: PagedCall, leftpad: bool) -> dict[str, dict[str, np.ndarray]]:
    """PAGED-6's malformed metadata for ``call`` (at least two sequences, the first with
    keys), each kind by what is wrong: replacements of its keywords."""
    offsets, used, table = call.offsets, np.asarray(call.n_keys, np.int32), call.table
    n_pages, page = call.k_cache.shape[0], call.page_size
    last = (int(used[0]) - 1) // page  # sequence 0's last page read

    def changed(a: np.ndarray, at: Any, value: int) -> np.ndarray:
        a = a.copy()
        a[at] = value
        return a

    kinds = {
        f"block_table[0, 0] = {n_pages}, one past the {n_pages} pages": {
            "block_table": changed(table, (0, 0), n_pages)
        },
        f"block_table[0, {last}] = -1, a negative page index": {
            "block_table": changed(table, (0, last), -1)
        },
        f"seqused_k[0] = {table.shape[1] * page + 1}, past the capacity of a block_table row "
        f"({table.shape[1]} pages of {page})": {
            "seqused_k": changed(used, 0, table.shape[1] * page + 1)
        },
        "cu_seqlens_q[0] = 1, not starting at 0": {"cu_seqlens_q": changed(offsets, 0, 1)},
        f"cu_seqlens_q[1] = {offsets[2] + 1}, past cu_seqlens_q[2] (decreasing)": {
            "cu_seqlens_q": changed(offsets, 1, int(offsets[2]) + 1)
        },
        f"cu_seqlens_q[-1] = {call.q.shape[0] + 1}, past the {call.q.shape[0]} query rows": {
            "cu_seqlens_q": changed(offsets, -1, call.q.shape[0] + 1)
        },
        f"cu_seqlens_q of {len(offsets) - 1} sequences, seqused_k of {len(used) - 1}": {
            "seqused_k": used[:-1].copy()
        },
    }
    if leftpad:
        kinds[f"cache_leftpad[0] = {used[0] + 1}, past seqused_k[0] = {used[0]}"] = {
            "cache_leftpad": changed(np.zeros_like(used), 0, int(used[0]) + 1)
        }
    return kinds


def _accepted(out: Any, kernel: KernelUnderTest) -> str:
    """What a kernel returned where it should have raised: NaN (what it read was not
    there) or finite values (what it read was some other memory, or it ignored the
    metadata), or something that is not an array."""
    try:
        values = np.asarray(kernel.numpy(out), np.float64)
    except Exception:
        return f"returned {type(out).__name__} instead of raising"
    bad = int(np.sum(~np.isfinite(values)))
    if bad:
        return f"returned an output with {bad} of {values.size} elements NaN or infinite"
    return "returned finite values (it read other memory, or ignored the metadata)"


@register("paged-batch-rejects-malformed", "PAGED-6", kind="fixed", applies=_paged_only)
def paged_batch_rejects_malformed(kernel: KernelUnderTest, seed: int) -> None:
    """The fixed batch of paged-batch-padding-rows with one piece of its metadata malformed
    at a time: a page index one past the pool and a negative one among the pages read, a
    length past a block table row's capacity, cache_leftpad past seqused_k (where
    declared), offsets that do not start at 0, decrease, end past the query rows or count
    another number of sequences.  Each call should raise (any exception counts); a kernel
    that returns a result (an index clamped or wrapped into the pool, a length read past
    its row) gets a warning naming each accepted kind and what it returned.  A crash or a
    hang is no rejection: it fails the property (CONF-5)."""
    call = _fixed_call(kernel, kernel.dtypes[0], seed)
    q = call.q.copy()
    q[int(call.offsets[-1]) :] = 0.0  # finite padding rows: any NaN returned is the kernel's
    call = replace(call, q=q)
    accepted = []
    claim = kernel.declaration.paged_batch
    assert claim is not None  # the property applies only to a --paged-batch declaration
    for kind, metadata in _malformed(call, "leftpad" in claim.features).items():
        try:
            out = kernel.call_raw(*_arguments(kernel, call, metadata))
        except Exception:
            continue  # rejected, as PAGED-6 recommends
        accepted.append(f"{kind}: {_accepted(out, kernel)}")
    if accepted:
        raise PropertyFailure(
            f"the paged kernel accepted {len(accepted)} kinds of malformed metadata instead "
            f"of raising (PAGED-6): {'; '.join(accepted)} [well-formed call: {call.describe()}]"
        )
