"""VARLEN-1 … VARLEN-4 and KVCACHE-1 … KVCACHE-5: packed sequences and KV caches, called in
their libraries' conventions (judge/packed_calls.py) and compared, sequence by sequence,
with the dense definition of that sequence alone.

Batches have ragged lengths, empty sequences, GQA, causal calls, explicit scales and the
features the kernel claims; KV caches have per-batch valid lengths, new keys, stale values
past every length and, when paged, shuffled block tables with unused blocks.  A packed or
KV-cache call whose argument shapes repeat with other lengths and another block table
checks SDPA-7.8 (a plan cached on the argument shapes alone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.serving.paged import Rules
from ....reference.tolerance_serving import sink_error_and_lse_bound
from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw import sizes
from ...draw.anchors import CacheAnchor
from ...draw.strategies import EXPLICIT_SCALES, draw_dtype, draw_rng, random_values
from ..assertions import assert_identical, assert_shape, assert_within_bound
from ..bounds import definition_keywords, lse_bound, reference_bound
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..packed_calls import (
    Batch,
    CacheCall,
    Padding,
    bottom_right,
    call_kv_cache,
    call_varlen,
    per_sequence,
)
from ..registration import register
from ._helpers import draw_alibi_slopes, draw_sinks, draw_softcap

Applies = Callable[[KernelDeclaration], "str | None"]


def _family(name: str, **claims: bool) -> Applies:
    def applies(declaration: KernelDeclaration) -> str | None:
        if declaration.family != name:
            return f"the kernel does not declare {name} attention"
        missing = [c for c, wanted in claims.items() if getattr(declaration, c) != wanted]
        return f"the kernel does not claim {', '.join(missing)}" if missing else None

    return applies


def _cache_property(
    property_id: str, clause: str, **claims: bool
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Registers a KV-cache property: it applies to a KV-cache kernel with ``claims`` and
    draws KV-cache calls, the KV-cache anchors' among them (``anchors.anchors_of``)."""
    return register(property_id, clause, applies=_family("kv-cache", **claims), draws="kv-cache")


@contextlib.contextmanager
def reported_as(batch: Batch) -> Iterator[None]:
    """Failures inside name the whole call (lengths, options, cache layout) instead of one
    sequence's dense inputs: a dense reproduction of a packed call would mislead."""
    try:
        yield
    except PropertyFailure as failure:
        if failure.problem is None:
            raise
        raise PropertyFailure(
            f"{failure.finding} [call: {batch.describe()}]", hint=failure.hint
        ) from None


# Realistic strata: sequence and cache lengths at block boundaries (sizes.LENGTHS) up to
# these, head dims kernels special-case up to 128, so a packed call stays well within the
# cost of one realistic dense problem while crossing tiles of 16 to 256 tokens.
REALISTIC_MAX_LENGTH = 513
REALISTIC_MAX_HEAD_DIM = 128


def _lengths(data: st.DataObject, label: str, small: int) -> int:
    """A length: 0..``small`` in the small stratum, a block-boundary length (or 0) in the
    realistic ones, within the user's --max-len."""
    drawing = sizes.current()
    if not drawing.realistic:
        return data.draw(st.integers(0, small), label=label)
    choices = [
        0,
        *(n for n in sizes.LENGTHS if n <= min(REALISTIC_MAX_LENGTH, drawing.limits.max_len)),
    ]
    return data.draw(st.sampled_from(choices), label=label)


class _Heads:
    """Sizes every sequence of a batch shares: drawn, or a KV-cache anchor's."""

    def __init__(
        self, data: st.DataObject, kernel: KernelUnderTest, anchor: CacheAnchor | None = None
    ) -> None:
        if anchor is not None:
            self.n_kv = anchor.n_kv_heads
            self.groups = anchor.n_q_heads // anchor.n_kv_heads if kernel.declaration.gqa else 1
            self.head_dim = self.value_dim = min(
                anchor.head_dim, sizes.current().limits.max_head_dim
            )
            return
        self.n_kv = data.draw(st.integers(1, 3), label="Hkv")
        self.groups = data.draw(st.integers(1, 3), label="G") if kernel.declaration.gqa else 1
        drawing = sizes.current()
        if drawing.realistic:
            dims = [
                e
                for e in sizes.HEAD_DIMS
                if e <= min(REALISTIC_MAX_HEAD_DIM, drawing.limits.max_head_dim)
            ] or [1]
            self.head_dim = data.draw(st.sampled_from(dims), label="E")
            self.value_dim = data.draw(st.sampled_from(dims), label="Ev")
        else:
            self.head_dim = data.draw(st.integers(1, 8), label="E")
            self.value_dim = data.draw(st.integers(1, 8), label="Ev")

    @property
    def n_q(self) -> int:
        return self.n_kv * self.groups


def _sequence(
    kernel: KernelUnderTest,
    rng: np.random.Generator,
    heads: _Heads,
    n_queries: int,
    n_keys: int,
    dtype: str,
    magnitude: float,
) -> Problem:
    return Problem(
        q=random_values(kernel, rng, (heads.n_q, n_queries, heads.head_dim), dtype, magnitude),
        k=random_values(kernel, rng, (heads.n_kv, n_keys, heads.head_dim), dtype, magnitude),
        v=random_values(kernel, rng, (heads.n_kv, n_keys, heads.value_dim), dtype),
        dtype=dtype,
    )


def _with_options(
    data: st.DataObject, kernel: KernelUnderTest, batch: Batch, heads: _Heads
) -> Batch:
    """Causal, scale, softcap, and sink logits (SINK-6) or ALiBi, the same for every
    sequence (as one call has)."""
    decl = kernel.declaration
    changes: dict[str, object] = {}
    if decl.sinks and data.draw(st.booleans(), label="with sinks"):
        batch = replace(batch, sinks=draw_sinks(data, heads.n_q))
    if decl.causal and data.draw(st.booleans(), label="causal"):
        changes["is_causal"] = True
    if decl.scale and data.draw(st.booleans(), label="explicit scale"):
        changes["scale"] = data.draw(st.sampled_from(EXPLICIT_SCALES), label="scale")
    if decl.softcap and data.draw(st.booleans(), label="with softcap"):
        changes["softcap"] = draw_softcap(data)
    sequences = [s.with_(**changes) for s in batch.sequences]
    # SINK-5's bound has no ALiBi term: a call with sinks is drawn without ALiBi
    if decl.alibi and batch.sinks is None and data.draw(st.booleans(), label="with ALiBi"):
        from ...draw.sizes import Dims

        dims = Dims(
            batch=(),
            n_kv_heads=heads.n_kv,
            groups=heads.groups,
            n_queries=1,
            n_keys=1,
            head_dim=heads.head_dim,
            value_dim=heads.value_dim,
        )
        sequences = [s.with_(alibi_slopes=draw_alibi_slopes(data, kernel, dims)) for s in sequences]
    return replace(batch, sequences=sequences)


def draw_varlen_batch(
    data: st.DataObject, kernel: KernelUnderTest, *, empty: bool = False
) -> Batch:
    """1-4 sequences of 0-9 queries and keys (``empty``: at least one with none)."""
    heads, dtype = _Heads(data, kernel), draw_dtype(data, kernel)
    rng = draw_rng(data)
    magnitude = data.draw(st.sampled_from([1.0, 0.25, 3.0]), label="magnitude")
    count = data.draw(st.integers(1, 4), label="sequences")
    lengths = [(_lengths(data, "Lq_b", 9), _lengths(data, "Lk_b", 9)) for _ in range(count)]
    if empty:
        b = data.draw(st.integers(0, count - 1), label="empty sequence")
        which = data.draw(st.sampled_from(["queries", "keys", "both"]), label="empty side")
        n_q, n_k = lengths[b]
        lengths[b] = (0 if which != "keys" else max(n_q, 1), 0 if which != "queries" else n_k)
    batch = Batch(
        [_sequence(kernel, rng, heads, n_q, n_k, dtype, magnitude) for n_q, n_k in lengths]
    )
    batch = _with_options(data, kernel, batch, heads)
    if kernel.declaration.varlen_mask and data.draw(st.booleans(), label="with custom_mask"):
        keep = data.draw(st.sampled_from([0.3, 0.7, 0.95]), label="kept fraction")
        batch = replace(batch, sequences=[_masked(s, rng, keep) for s in batch.sequences])
    return batch


def _masked(sequence: Problem, rng: np.random.Generator, keep: float) -> Problem:
    """The sequence with a mask of its own ``(L_q, L_k)``, each key kept with probability
    ``keep`` (VARLEN-6: the suite flattens the sequences' masks into one)."""
    return sequence.with_(mask=rng.random((sequence.q.shape[-2], sequence.k.shape[-2])) < keep)


def _compare_sequences(
    kernel: KernelUnderTest,
    batch: Batch,
    outs: list[np.ndarray],
    lses: list[np.ndarray] | None,
    declaration: KernelDeclaration,
    clause: str,
) -> None:
    for b, (sequence, out) in enumerate(zip(batch.sequences, outs, strict=True)):
        # (the output, its definition, bound and name, the bound's clause), lse first
        checks: list[tuple[Any, Any, Any, str, str]] = []
        if batch.sinks is not None:  # SINK-6: SINK-5's bound, SINK-3's log-sum-exp
            bound, lse_part = sink_error_and_lse_bound(
                sequence.q,
                sequence.k,
                sequence.v,
                batch.sinks,
                **definition_keywords(sequence, declaration.causal_alignment, features=False),
                softcap=sequence.softcap,
            )
        elif lses is None:
            bound = reference_bound(sequence, declaration)
        else:
            bound, lse_part = lse_bound(sequence, declaration)
        tolerances = ("SINK-5", "SINK-3") if batch.sinks is not None else ("TOL-2", "TOL-5")
        if lses is not None:
            checks.append((lses[b], lse_part.lse, lse_part.lse_tolerance, "lse", tolerances[1]))
        checks.append((out, bound.out, bound.out_tolerance, "out", tolerances[0]))
        for actual, expected, tolerance, name, bound_clause in checks:
            assert_within_bound(
                actual,
                np.asarray(expected),
                np.asarray(tolerance),
                f"{name} of sequence {b}",
                sequence,
                kernel,
                clause=f"{clause}, {bound_clause}",
            )


def _check_varlen(kernel: KernelUnderTest, batch: Batch, clause: str) -> None:
    out, lse = call_varlen(kernel, batch)
    first = batch.first
    total_q = sum(s.q.shape[-2] for s in batch.sequences)
    assert_shape(out, (total_q, first.q.shape[-3], first.v.shape[-1]), "packed out", first, kernel)
    if lse is not None:
        assert_shape(lse, (first.q.shape[-3], total_q), "packed lse (Hq, total_q)", first, kernel)
    _compare_sequences(
        kernel,
        batch,
        per_sequence(batch, out, 0),
        None if lse is None else per_sequence(batch, lse, -1),
        kernel.declaration,
        clause,
    )


@register("varlen-matches-reference", "VARLEN-2", applies=_family("varlen"))
def varlen_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Each packed sequence's output rows (and log-sum-exp) are the dense definition of
    that sequence alone, causal alignment and ALiBi anchored at its own lengths, with GQA,
    scales and the features the kernel claims, within TOL-2 (TOL-5)."""
    batch = draw_varlen_batch(data, kernel)
    with reported_as(batch):
        _check_varlen(kernel, batch, "VARLEN-2")


@register("varlen-empty-sequences", "VARLEN-3", applies=_family("varlen"))
def varlen_empty_sequences(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A sequence without queries adds no rows; one without keys gives rows of 0 and a
    log-sum-exp of -inf; the other sequences are unaffected."""
    batch = draw_varlen_batch(data, kernel, empty=True)
    with reported_as(batch):
        _check_varlen(kernel, batch, "VARLEN-3")


@register("varlen-isolation", "VARLEN-2", applies=_family("varlen"))
def varlen_isolation(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Changing one sequence's keys and values leaves every other sequence's output
    bit-identical: no tile sees a neighbour's keys."""
    batch = draw_varlen_batch(data, kernel)
    if len(batch.sequences) < 2:
        batch = replace(batch, sequences=batch.sequences * 2)
    b = data.draw(st.integers(0, len(batch.sequences) - 1), label="changed sequence")
    rng = draw_rng(data)
    changed = batch.sequences[b]
    changed = changed.with_(
        k=random_values(kernel, rng, changed.k.shape, changed.dtype, 3.0),
        v=random_values(kernel, rng, changed.v.shape, changed.dtype, 3.0),
    )
    other = replace(batch, sequences=[*batch.sequences[:b], changed, *batch.sequences[b + 1 :]])
    before = per_sequence(batch, call_varlen(kernel, batch)[0], 0)
    after = per_sequence(other, call_varlen(kernel, other)[0], 0)
    with reported_as(other):
        for index, (x, y) in enumerate(zip(before, after, strict=True)):
            if index != b:
                assert_identical(
                    y,
                    x,
                    f"out of sequence {index} after changing sequence "
                    f"{b}'s keys and values [VARLEN-2]",
                    other.sequences[index],
                    kernel,
                )


@register("varlen-padding", "VARLEN-5", applies=_family("varlen"))
def varlen_padding(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With 1-3 padding rows of q and 0-3 of k and v past the last offsets, a kernel that
    accepts the call (VARLEN-4 recommends rejecting it) gives the padding rows 0 (and a
    log-sum-exp of -inf), the sequences' rows within TOL-2, and the same results bit for
    bit when the padding holds NaN instead of zeros: an output left uninitialised past
    cu_seqlens_q[-1], or padding keys read, is caught."""
    batch = draw_varlen_batch(data, kernel)
    queries = data.draw(st.integers(1, 3), label="padding queries")
    keys = data.draw(st.integers(0, 3), label="padding keys")
    try:
        out, lse = call_varlen(kernel, batch, Padding(queries, keys, 0.0))
    except KernelRaised:
        return  # rejected, as VARLEN-4 recommends
    valid = out.shape[0] - queries
    with reported_as(batch):
        for name, got, empty in (("out", out, 0.0), ("lse", lse, -np.inf)):
            if got is None:
                continue
            rows = got[valid:] if name == "out" else got[..., valid:]
            assert_identical(
                rows,
                np.full_like(rows, empty),
                f"{name} of the {queries} padding rows past cu_seqlens_q[-1] [VARLEN-5]",
                batch.first,
                kernel,
            )
        _compare_sequences(
            kernel,
            batch,
            per_sequence(batch, out[:valid], 0),
            None if lse is None else per_sequence(batch, lse[..., :valid], -1),
            kernel.declaration,
            "VARLEN-5",
        )
        poisoned = call_varlen(kernel, batch, Padding(queries, keys, float("nan")))
        for name, clean, dirty in zip(("out", "lse"), (out, lse), poisoned, strict=True):
            if clean is not None and dirty is not None:
                assert_identical(
                    dirty,
                    clean,
                    f"{name} with NaN in the padding tokens instead of zeros [VARLEN-5]",
                    batch.first,
                    kernel,
                )


@register("varlen-rejects-bad-offsets", "VARLEN-4", applies=_family("varlen"))
def varlen_rejects_bad_offsets(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Offsets that do not end at the token count, or decrease, are rejected with an
    exception instead of reading tokens the kernel was not given."""
    from ..packed_calls import varlen_arguments

    batch = draw_varlen_batch(data, kernel)
    lengths = [s.q.shape[-2] for s in batch.sequences]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    bad = offsets.copy()
    how = data.draw(st.sampled_from(["past the end", "decreasing"]), label="malformed")
    if how == "past the end" or len(bad) < 3:
        bad[-1] += data.draw(st.integers(1, 5), label="extra tokens")
        how = "past the end"
    else:
        bad[1] = bad[-1] + 1
    keys = np.concatenate([[0], np.cumsum([s.k.shape[-2] for s in batch.sequences])]).astype(
        np.int32
    )
    args, keywords = varlen_arguments(kernel, batch, offsets=(bad, keys))
    try:
        kernel.call_raw(args, keywords)
    except Exception:
        return
    raise PropertyFailure(
        f"cu_seqlens_q={bad.tolist()} ({how}; {offsets[-1]} query tokens were passed), but the "
        f"kernel returned a result instead of raising [VARLEN-4] [call: {batch.describe()}]"
    )


def _cache_rules(batch: Batch) -> Batch:
    """Each batch element's window with its sink tokens (SINK-4) and chunk (KVCACHE-6) as
    its problem's mask, measured from its bottom-right query positions; the batch as it is
    without either."""
    cache = batch.kv_cache
    if cache.window is None and cache.chunk is None:
        return batch
    left, right = (None, None) if cache.window is None else cache.window
    sequences = []
    for s in batch.sequences:
        n_queries, n_keys = s.q.shape[-2], s.k.shape[-2]
        rules = Rules(s.is_causal, left, right, cache.chunk, cache.sink_tokens or 0)
        t = np.arange(n_queries)[:, None] + (n_keys - n_queries)
        allowed = np.asarray(rules.allowed(np, t, np.arange(n_keys)[None, :]))
        sequences.append(s.with_(mask=np.broadcast_to(allowed, (n_queries, n_keys))))
    return replace(batch, sequences=sequences)


def _cache_options(
    data: st.DataObject, kernel: KernelUnderTest, lengths: list[int]
) -> dict[str, Any]:
    """The KV-cache options the kernel declares (KVCACHE-6), each drawn or left out."""
    features = kernel.declaration.kv_cache_features
    realistic = sizes.current().realistic
    options: dict[str, Any] = {}
    if "leftpad" in features:
        options["starts"] = [
            data.draw(st.integers(0, length), label=f"cache_leftpad[{b}]")
            for b, length in enumerate(lengths)
        ]
    reach = (0, 1, 16, 63, 256) if realistic else (0, 1, 2, 3, 5)
    if "window" in features and data.draw(st.booleans(), label="with window"):
        side = st.one_of(st.none(), st.sampled_from(reach))
        # sink tokens (SINK-4) beside a window with a left bound, the one they change, and a
        # short one (the first three reaches), which has moved past them in most caches drawn
        sink_tokens = "sink_tokens" in features and data.draw(
            st.booleans(), label="with sink tokens"
        )
        left = st.sampled_from(reach[:3]) if sink_tokens else side
        options["window"] = (data.draw(left, label="left"), data.draw(side, label="right"))
        if sink_tokens:
            counts = (1, 4, 16, 64) if realistic else (1, 2, 3, 4)
            options["sink_tokens"] = data.draw(st.sampled_from(counts), label="n_sink_tokens")
    if "chunk" in features and data.draw(st.booleans(), label="with chunk"):
        chunks = (16, 64, 256) if realistic else (1, 2, 3, 5)
        options["chunk"] = data.draw(st.sampled_from(chunks), label="attention_chunk")
    return options


def _anchored_options(
    kernel: KernelUnderTest, anchor: CacheAnchor, lengths: list[int]
) -> dict[str, Any]:
    """``anchor``'s window and sink tokens, and its left padding where the kernel takes
    it (each within its element's cut length)."""
    options: dict[str, Any] = {"window": anchor.window, "sink_tokens": anchor.sink_tokens}
    if "leftpad" in kernel.declaration.kv_cache_features:
        options["starts"] = [min(s, n) for s, n in zip(anchor.starts, lengths, strict=True)]
    return options


def draw_cache_batch(data: st.DataObject, kernel: KernelUnderTest) -> Batch:
    """1-3 batch elements with valid cache lengths 0-8, 1-4 queries, new keys when the
    kernel appends, a paged cache with a shuffled table and spare blocks when it pages,
    and the left padding, window, chunk and sink tokens it declares (KVCACHE-6, SINK-4);
    in a KV-cache anchor's stratum that anchor's sizes and options
    (:class:`~attnspec.conformance.draw.anchors.CacheAnchor`), the rest drawn."""
    decl = kernel.declaration
    drawing = sizes.current()
    anchor = drawing.stratum.anchor if isinstance(drawing.stratum.anchor, CacheAnchor) else None
    heads, dtype = _Heads(data, kernel, anchor), draw_dtype(data, kernel)
    rng = draw_rng(data)
    if anchor is None:
        count = data.draw(st.integers(1, 3), label="B")
        n_new = data.draw(st.integers(0, 3), label="new keys") if decl.kv_cache_append else 0
        n_queries = data.draw(st.sampled_from([1, 1, 2, 4]), label="Lq")
        lengths = [_lengths(data, "cache_seqlens[b]", 8) for _ in range(count)]
    else:
        count, n_queries = len(anchor.lengths), anchor.n_queries
        n_new = n_queries if decl.kv_cache_append else 0
        lengths = [min(n, drawing.limits.max_len) for n in anchor.lengths]
    capacity = max(lengths) + n_new + data.draw(st.integers(0, 3), label="spare capacity")
    cache = CacheCall(
        lengths=lengths,
        n_new=n_new,
        **_cache_layout(data, kernel, rng, count, capacity),
        stale_seed=data.draw(st.integers(0, 2**16), label="stale values"),
        **(
            _cache_options(data, kernel, lengths)
            if anchor is None
            else _anchored_options(kernel, anchor, lengths)
        ),
    )
    batch = Batch(
        [
            _sequence(kernel, rng, heads, n_queries, length - cache.start(b) + n_new, dtype, 1.0)
            for b, length in enumerate(lengths)
        ],
        cache=cache,
    )
    return _cache_rules(_with_options(data, kernel, batch, heads))


def _cache_layout(
    data: st.DataObject,
    kernel: KernelUnderTest,
    rng: np.random.Generator,
    count: int,
    capacity: int,
) -> dict[str, Any]:
    """A contiguous cache of ``capacity`` positions per batch element, or for a paged
    kernel (KVCACHE-5) a drawn block size, the capacity rounded up to whole blocks, and a
    block table of ``count`` rows over shuffled blocks, some unused: :class:`CacheCall`'s
    layout fields."""
    decl = kernel.declaration
    if not decl.kv_cache_paged:
        return {"capacity": capacity}
    block_size = decl.kv_cache_block_size or data.draw(
        st.sampled_from([16, 64, 256]) if sizes.current().realistic else st.integers(1, 4),
        label="block",
    )
    per_row = -(-max(capacity, 1) // block_size)
    n_blocks = count * per_row + data.draw(st.integers(0, 2), label="unused blocks")
    return {
        "capacity": per_row * block_size,
        "block_size": block_size,
        "table": rng.permutation(n_blocks)[: count * per_row].reshape(count, per_row),
        "n_blocks": n_blocks,
    }


def _check_cache_output(
    kernel: KernelUnderTest, batch: Batch, out: np.ndarray, lse: np.ndarray | None, clause: str
) -> None:
    first = batch.first
    shape = (len(batch.sequences), first.q.shape[-3], first.q.shape[-2], first.v.shape[-1])
    assert_shape(out, shape, "out (B, Hq, Lq, Ev)", first, kernel)
    if lse is not None:
        assert_shape(lse, shape[:-1], "lse (B, Hq, Lq)", first, kernel)
    _compare_sequences(
        kernel,
        batch,
        list(out),
        None if lse is None else list(lse),
        bottom_right(kernel.declaration),
        clause,
    )


@_cache_property("kv-cache-matches-reference", "KVCACHE-2")
def kv_cache_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Batch element b attends its first cache_seqlens[b] cached keys and its new keys,
    bottom-right, with GQA, scales and the claimed features, within TOL-2: one cached key
    too many or too few, a top-left causal rule or keys of another batch element are
    outside it."""
    batch = draw_cache_batch(data, kernel)
    out, lse, _, _ = call_kv_cache(kernel, batch)
    with reported_as(batch):
        _check_cache_output(kernel, batch, out, lse, "KVCACHE-2")


@_cache_property("kv-cache-stale-positions", "KVCACHE-3")
def kv_cache_stale_positions(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Other finite values at cache positions past every valid length (and in unused
    blocks) leave the output bit-identical."""
    batch = draw_cache_batch(data, kernel)
    cache = batch.kv_cache
    other = replace(
        batch, cache=replace(cache, stale_seed=cache.stale_seed + 1, stale_magnitude=30.0)
    )
    first, again = call_kv_cache(kernel, batch)[0], call_kv_cache(kernel, other)[0]
    with reported_as(other):
        assert_identical(
            again,
            first,
            "out after changing the cache past every valid length [KVCACHE-3]",
            batch.first,
            kernel,
        )


@_cache_property("kv-cache-nan-past-length", "KVCACHE-7")
def kv_cache_nan_past_length(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """NaN instead of finite stale values at every cache position no batch element reads
    (past each cache_seqlens[b], below cache_leftpad[b], unused blocks) leaves the output
    and the log-sum-exp bit-identical: zero weights multiplied by the values there
    (0 * NaN) are caught."""
    batch = draw_cache_batch(data, kernel)
    poisoned = replace(batch, cache=replace(batch.kv_cache, stale_magnitude=float("nan")))
    clean, dirty = call_kv_cache(kernel, batch)[:2], call_kv_cache(kernel, poisoned)[:2]
    with reported_as(poisoned):
        for name, want, got in zip(("out", "lse"), clean, dirty, strict=True):
            if want is not None and got is not None:
                assert_identical(
                    got,
                    want,
                    f"{name} with NaN in the cache past every valid length [KVCACHE-7]",
                    batch.first,
                    kernel,
                )


def _appended(batch: Batch, before: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The caches of KVCACHE-4: the new keys written at cache_seqlens[b] onwards."""
    call = batch.kv_cache
    caches = [before["k_cache"].copy(), before["v_cache"].copy()]
    for b, (length, sequence) in enumerate(zip(call.lengths, batch.sequences, strict=True)):
        cached = length - call.start(b)  # the sequence's keys before the new ones
        for t in range(call.n_new):
            index, position = call.position(b, length + t)
            caches[0][index, :, position] = sequence.k[:, cached + t]
            caches[1][index, :, position] = sequence.v[:, cached + t]
    return caches[0], caches[1]


@_cache_property("kv-cache-append", "KVCACHE-4", kv_cache_append=True)
def kv_cache_append(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """After the call the cache holds the new keys and values at cache_seqlens[b] ...
    cache_seqlens[b] + L_new - 1 (through the block table when paged), every other cache
    element is unchanged, and q, k, v and cache_seqlens are not modified."""
    batch = draw_cache_batch(data, kernel)
    _, _, after, before = call_kv_cache(kernel, batch)
    expected = dict(zip(("k_cache", "v_cache"), _appended(batch, before), strict=True))
    with reported_as(batch):
        for name, value in before.items():
            want = expected.get(name, value)
            assert_identical(
                after[name].astype(np.float64),
                want.astype(np.float64),
                f"{name} after the call [KVCACHE-4]",
                batch.first,
                kernel,
            )


@_cache_property("kv-cache-paged", "KVCACHE-5", kv_cache_paged=True)
def kv_cache_paged(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A paged cache read through a shuffled block table, with unused blocks full of other
    values, gives the output of the logical cache within TOL-2 (a kernel that reads the
    blocks in memory order passes only identity tables)."""
    batch = draw_cache_batch(data, kernel)
    rng = draw_rng(data)
    cache = batch.kv_cache
    table = cache.block_table
    shuffled = rng.permutation(cache.n_blocks + 2)[: table.size].reshape(table.shape)
    batch = replace(batch, cache=replace(cache, table=shuffled, n_blocks=cache.n_blocks + 2))
    out, lse, _, _ = call_kv_cache(kernel, batch)
    with reported_as(batch):
        _check_cache_output(kernel, batch, out, lse, "KVCACHE-5")


def _other_lengths(lengths: list[int], most: int | None = None) -> list[int]:
    """Lengths of the same count in another order (rotated by one: the same sum and
    largest one); when all are equal, one token moved from the first to the second (the
    same sum, ``most`` None) or the first changed within 0 ... ``most``; the same lengths
    only when none can move (all 0, or a single one with ``most`` 0)."""
    rotated = lengths[1:] + lengths[:1]
    if rotated != lengths:
        return rotated
    if most is not None:
        return [(lengths[0] + 1) % (most + 1), *lengths[1:]]
    if len(lengths) > 1 and lengths[0] > 0:
        return [lengths[0] - 1, lengths[1] + 1, *lengths[2:]]
    return list(lengths)


def _resized(
    kernel: KernelUnderTest, rng: np.random.Generator, like: Problem, n_q: int, n_k: int
) -> Problem:
    """A sequence with ``like``'s heads, head dims, dtype and options, new values, ``n_q``
    queries and ``n_k`` keys."""
    (heads, _, head_dim), (kv_heads, _, value_dim) = like.q.shape, like.v.shape
    resized = like.with_(
        q=random_values(kernel, rng, (heads, n_q, head_dim), like.dtype, 1.0),
        k=random_values(kernel, rng, (kv_heads, n_k, head_dim), like.dtype, 1.0),
        v=random_values(kernel, rng, (kv_heads, n_k, value_dim), like.dtype),
        mask=None,
    )
    return resized


def _same_shapes_other_varlen(data: st.DataObject, kernel: KernelUnderTest) -> tuple[Batch, Batch]:
    """A packed batch of at least 2 sequences, and one with the same packed shapes (token
    totals, sequence count, heads) but other lengths (cu_seqlens) and new values."""
    first = draw_varlen_batch(data, kernel)
    if len(first.sequences) < 2:
        first = replace(first, sequences=first.sequences * 2)
    rng = draw_rng(data)
    sequences = first.sequences
    lengths_q = _other_lengths([s.q.shape[-2] for s in sequences])
    lengths_k = _other_lengths([s.k.shape[-2] for s in sequences])
    other = [
        _resized(kernel, rng, s, n_q, n_k)
        for s, n_q, n_k in zip(sequences, lengths_q, lengths_k, strict=True)
    ]
    if any(s.mask is not None for s in sequences):
        other = [_masked(s, rng, 0.7) for s in other]
    return first, Batch(other, sinks=first.sinks)


def _same_shapes_other_cache(data: st.DataObject, kernel: KernelUnderTest) -> tuple[Batch, Batch]:
    """A KV-cache batch, and one with the same argument shapes (batch, queries, new keys,
    cache capacity and blocks) but other cache_seqlens, another block table, other stale
    values and new values."""
    first = draw_cache_batch(data, kernel)
    cache = first.kv_cache
    rng = draw_rng(data)
    lengths = _other_lengths(cache.lengths, cache.capacity - cache.n_new)
    table = cache.table
    if table is not None:
        table = rng.permutation(cache.n_blocks)[: table.size].reshape(table.shape)
    starts = (
        None
        if cache.starts is None
        else [min(start, length) for start, length in zip(cache.starts, lengths, strict=True)]
    )
    other_cache = replace(
        cache, lengths=lengths, table=table, stale_seed=cache.stale_seed + 1, starts=starts
    )
    other = Batch(
        [
            _resized(kernel, rng, s, s.q.shape[-2], length - other_cache.start(b) + cache.n_new)
            for b, (s, length) in enumerate(zip(first.sequences, lengths, strict=True))
        ],
        cache=other_cache,
        sinks=first.sinks,
    )
    return first, _cache_rules(other)


def _packed(declaration: KernelDeclaration) -> str | None:
    if declaration.family in ("varlen", "kv-cache"):
        return None
    return "the kernel declares neither varlen nor KV-cache attention"


@register("packed-same-shape-new-arguments", "SDPA-7.8", applies=_packed)
def packed_same_shape_new_arguments(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Back to back with the same argument shapes: a packed (or KV-cache) call A, then B
    with other sequence lengths (cu_seqlens; cache_seqlens), another block table (paged),
    other stale cache values and new values, then A again.  B is within TOL-2 of the
    definition, sequence by sequence, and A's second output is its first bit for bit: a
    kernel that caches its offsets, lengths or block table on the argument shapes alone
    reads B's tokens with A's."""
    varlen = kernel.declaration.family == "varlen"
    first, other = (_same_shapes_other_varlen if varlen else _same_shapes_other_cache)(data, kernel)

    def output(batch: Batch) -> np.ndarray:
        return call_varlen(kernel, batch)[0] if varlen else call_kv_cache(kernel, batch)[0]

    first_out = output(first)
    with reported_as(other):
        if varlen:
            _check_varlen(kernel, other, "SDPA-7.8, VARLEN-2")
        else:
            out, lse, _, _ = call_kv_cache(kernel, other)
            _check_cache_output(kernel, other, out, lse, "SDPA-7.8, KVCACHE-2")
    with reported_as(first):
        assert_identical(
            output(first),
            first_out,
            "out of call A again after a call with the same argument shapes [SDPA-7.8]",
            first.first,
            kernel,
        )
