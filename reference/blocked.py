"""Scaled dot-product attention in O(L) memory: SDPA-7.1 evaluated block by block.

The plain form (``sdpa.plain_attention``) is the spec's text in code and holds every
``Lq x Lk`` score.  This module computes the same function over chunks of query rows and,
for each chunk, blocks of keys, keeping per query row only the running maximum ``m``, the
running sum ``l`` of ``exp(s - m)`` and the running ``sum exp(s - m) v``
(the online softmax of Milakov & Gimelshein 2018, as FlashAttention uses it).  When a
block raises the maximum from ``m`` to ``m'``, what was summed so far is multiplied by
``exp(m - m')``; at the end ``o = acc / l``.  In exact arithmetic this is SDPA-7.1; in
floating point the difference is the "weights not renormalised" term TOL-2 allows for.

Everything the plain reference decides per element is decided the same way here:
S(i) is the mask AND the causal rule AND score != -inf (SDPA-3.3, SDPA-3.4); a row with
no allowed key outputs exactly 0 (SDPA-5.1); a NaN or +inf score of an allowed key makes
the row NaN (SDPA-8.3) because ``maximum`` and ``exp`` propagate it; excluded scores are
replaced by -inf before any arithmetic, so no excluded value reaches the output
(SDPA-8.1, SDPA-8.2); and non-finite values of allowed keys are counted apart from the
finite sum, exactly as in ``sdpa.weighted_values`` (SDPA-8.3).  The score features of
spec/features.md are applied per block in the plain form's order: softcapping of the scaled
product (SOFTCAP-1), then the bias, then ALiBi (ALIBI-2); the log-sum-exp is ``m + log l``
(LSE-1).

Under the causal rule a chunk of query rows reads the keys every one of its rows may attend
in whole blocks, with no mask at all, and then the one narrow block that crosses the
diagonal, masked; keys no row of the chunk may attend are never read.  So a causal problem
costs about half the scores of a full one, plus half a chunk's square per chunk.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import array_api_compat

from ._array import Array
from ._checks import check_flag, check_size, namespace_of
from .features import alibi_distance, check_softcap, grouped_slopes, softcapped
from .masks import causal_offset
from .options import BlockedOptions, DenseOptions, filled, shows_options
from .sdpa import (
    GroupedInputs,
    NonFiniteCounts,
    check_arguments,
    nonfinite_counts,
    prepare,
    with_nonfinite_values,
)

if TYPE_CHECKING:
    from typing import Unpack

CALL = "blocked_attention(q, k, v)"

# Keys per block.  A block of scores is (batch, heads, query_chunk, KEY_BLOCK); long key
# blocks keep the per-block Python overhead (about 15 array calls) small next to its
# arithmetic, and a short query chunk keeps the diagonal blocks of a causal problem (half
# a chunk's square each, computed and then masked) a small share of the work.
KEY_BLOCK = 1024
# Scores held at once, over all batch elements and heads: 2**20 float32 numbers (4 MiB)
# stay in a CPU's last-level cache, which is what makes several passes over a block cheap.
SCORES_PER_BLOCK = 2**20
MIN_QUERY_CHUNK, MAX_QUERY_CHUNK = 16, 512


def default_block_sizes(batch_heads: int, n_queries: int, n_keys: int) -> tuple[int, int]:
    """``(query_chunk, key_block)`` for a problem of ``batch_heads`` (batch x query heads)
    score matrices of ``n_queries x n_keys``: blocks of about :data:`SCORES_PER_BLOCK`."""
    key_block = max(1, min(n_keys, KEY_BLOCK))
    chunk = SCORES_PER_BLOCK // max(1, batch_heads * key_block)
    chunk = min(max(chunk, MIN_QUERY_CHUNK), MAX_QUERY_CHUNK)
    return max(1, min(n_queries, chunk)), key_block


class _Scores(NamedTuple):
    """The inputs of the scores: the laid-out problem plus mask, bias and ALiBi slopes as
    grouped views."""

    problem: GroupedInputs
    mask: Array  # None, or bool broadcastable to (*batch, Hkv, G, Lq, Lk)
    bias: Array  # None, or floating broadcastable to (*batch, Hkv, G, Lq, Lk)
    causal_offset: int | None  # d of SDPA-4 (query i sees key j iff j <= i + d), or None
    slopes: Array = None  # None, or the ALiBi slopes as (*batch, Hkv, G, 1, 1)
    alibi_offset: int = 0  # d of ALIBI-2: the distance is |i + d - j|
    excluded: Array = None  # -inf as a 0-d array of the computation dtype (None: made here)


def _grouped_view(xp: ModuleType, a: Any, n_dims: int, n_kv_heads: int, groups: int) -> Any:
    """``a``, which broadcasts to ``(*batch, Hq, Lq, Lk)`` (``n_dims`` dims), as an array
    that broadcasts to ``(*batch, Hkv, G, Lq, Lk)``; a view, never the broadcast copy."""
    a = xp.reshape(a, (1,) * (n_dims - a.ndim) + tuple(a.shape))
    heads = (1, 1) if a.shape[-3] == 1 else (n_kv_heads, groups)
    return xp.reshape(a, (*a.shape[:-3], *heads, *a.shape[-2:]))


def _block(a: Any, rows: slice, cols: slice) -> Any:
    """Rows and columns of the last two axes, leaving broadcast (size-1) axes whole."""
    return a[
        ..., rows if a.shape[-2] != 1 else slice(None), cols if a.shape[-1] != 1 else slice(None)
    ]


def _block_scores(inputs: _Scores, q_chunk: Any, rows: slice, cols: slice) -> Any:
    """Scaled, capped, biased scores of one block with -inf wherever the pair is excluded
    (SDPA-3.1, SDPA-3.3, SDPA-3.4, SDPA-4); no excluded value survives this step.  Only a
    block that crosses the causal diagonal builds the causal mask."""
    problem = inputs.problem
    xp = problem.xp
    k_block = problem.k[..., cols, :]
    scores = xp.matmul(q_chunk, xp.matrix_transpose(k_block))
    # In place: the same product, and one block of scores fewer made (PyTorch's CPU
    # allocator returns each large block to the system, so every new one pays its page
    # faults); the matrix product's gradient needs its operands, not this result.
    scores *= problem.scale
    if problem.softcap is not None:  # on the scaled product, before any bias (SOFTCAP-1)
        scores = softcapped(xp, scores, problem.softcap)
    if inputs.bias is not None:
        scores = scores + xp.astype(_block(inputs.bias, rows, cols), scores.dtype)
    device = array_api_compat.device(scores)
    if inputs.slopes is not None:
        n_rows, n_cols = rows.stop - rows.start, cols.stop - cols.start
        shift = inputs.alibi_offset + rows.start - cols.start
        distance = alibi_distance(xp, n_rows, n_cols, shift, device, scores.dtype)
        scores = scores + -inputs.slopes * distance
    allowed = None if inputs.mask is None else _block(inputs.mask, rows, cols)
    offset = inputs.causal_offset
    if offset is not None and cols.stop - 1 > rows.start + offset:
        query = xp.arange(rows.start, rows.stop, device=device)[:, None]
        key = xp.arange(cols.start, cols.stop, device=device)[None, :]
        causal = key <= query + offset
        allowed = causal if allowed is None else xp.logical_and(allowed, causal)
    if allowed is None:
        return scores
    excluded = xp.full_like(scores, -xp.inf) if inputs.excluded is None else inputs.excluded
    return xp.where(allowed, scores, excluded)


class _Running(NamedTuple):
    """Per query row: the maximum ``m`` so far, ``l = sum exp(s - m)``, ``acc = sum
    exp(s - m) v`` over the finite values, and the non-finite value counts."""

    m: Any
    l: Any
    acc: Any
    counts: NonFiniteCounts | None


def _absorb(
    xp: ModuleType, state: _Running | None, scores: Array, v_block: Any, v_nonfinite: Array
) -> _Running:
    """Fold one block of scores and its values into the running state (SDPA-7.1)."""
    m = xp.max(scores, axis=-1, keepdims=True)
    if state is not None:
        m = xp.maximum(state.m, m)  # NaN propagates: a NaN score makes the row NaN
    # A row with nothing allowed so far has m = -inf; shifting by 0 keeps exp(-inf) = 0.
    shift = xp.where(m == -xp.inf, xp.zeros_like(m), m)
    # Not in place: the maximum's gradient (PyTorch's autograd through this form) needs
    # the scores it was taken over.
    weights = xp.exp(scores - shift)
    l = xp.sum(weights, axis=-1, keepdims=True)
    acc = xp.matmul(weights, v_block)
    counts = None
    if v_nonfinite is not None:
        counts = nonfinite_counts(xp, scores != -xp.inf, v_nonfinite)
    if state is None:
        return _Running(m, l, acc, counts)
    # exp(old m - new shift) is 0 where the old m was -inf (nothing summed yet) and <= 1
    # elsewhere, so the rescaled sums never overflow.
    rescale = xp.exp(state.m - shift)
    if counts is not None:
        assert state.counts is not None  # every block counts when the first one did
        counts = NonFiniteCounts(*(a + b for a, b in zip(state.counts, counts, strict=True)))
    # the sums in place on the products' own results (which no gradient needs)
    total = state.l * rescale
    total += l
    acc_total = state.acc * rescale
    acc_total += acc
    return _Running(m, total, acc_total, counts)


def _key_stop(inputs: _Scores, rows: slice, n_keys: int) -> int:
    """One past the last key any query of ``rows`` may attend under the causal rule."""
    if inputs.causal_offset is None:
        return n_keys
    return max(0, min(n_keys, int(rows.stop + inputs.causal_offset)))


def _key_blocks(inputs: _Scores, rows: slice, n_keys: int, key_block: int) -> list[slice]:
    """The key blocks the query rows ``rows`` read.

    Without the causal rule: every key, ``key_block`` at a time.  With it: the keys every
    row of the chunk may attend (j <= first row + d) in whole blocks, which need no mask,
    then the keys only later rows may attend (up to the last row + d) as one block across
    the diagonal; the keys no row may attend are never read.
    """
    reached = _key_stop(inputs, rows, n_keys)
    seen_by_all = reached
    if inputs.causal_offset is not None:
        seen_by_all = min(n_keys, max(0, rows.start + inputs.causal_offset + 1))
    blocks = [
        slice(start, min(start + key_block, seen_by_all))
        for start in range(0, seen_by_all, key_block)
    ]
    if reached > seen_by_all:
        blocks.append(slice(seen_by_all, reached))
    return blocks


class _Rows(NamedTuple):
    """Output rows of one query chunk, ``(..., G, rows, Ev)``, and their log-sum-exp
    ``(..., G, rows, 1)``."""

    out: Any
    lse: Any


def _attend_chunk(
    inputs: _Scores, rows: slice, key_block: int, v_finite: Any, v_nonfinite: Array
) -> _Rows:
    """Output rows ``rows`` of every batch element and head."""
    problem = inputs.problem
    xp = problem.xp
    q_chunk = problem.q[..., rows, :]
    state = None
    for cols in _key_blocks(inputs, rows, problem.k.shape[-2], key_block):
        scores = _block_scores(inputs, q_chunk, rows, cols)
        state = _absorb(
            xp,
            state,
            scores,
            v_finite[..., cols, :],
            None if v_nonfinite is None else v_nonfinite[..., cols, :],
        )
    if state is None:  # the causal rule leaves these rows no key (SDPA-4.3, SDPA-5.1)
        device = array_api_compat.device(q_chunk)
        shape = (*q_chunk.shape[:-1], v_finite.shape[-1])
        out = xp.zeros(shape, dtype=v_finite.dtype, device=device)
        lse = xp.full((*q_chunk.shape[:-1], 1), -xp.inf, dtype=v_finite.dtype, device=device)
        return _Rows(out, lse)
    # l == 0 only for rows with no allowed key; their acc is 0, so they give exactly 0.
    empty = state.l == 0
    total = xp.where(empty, xp.ones_like(state.l), state.l)
    out = state.acc / total
    if state.counts is not None:
        out = with_nonfinite_values(xp, out, state.counts)
    # LSE-1, LSE-2: m + log l, -inf for rows with no allowed key; a NaN m stays NaN.
    lse = xp.where(empty, xp.full_like(state.m, -xp.inf), state.m + xp.log(total))
    return _Rows(out, lse)


def blocked_form(q: Array, k: Array, v: Array, options: BlockedOptions, call: str) -> Any:
    """:func:`blocked_attention` with its keywords as one value (each present: see
    :func:`~.options.filled`); errors name ``call``.  The entry point
    ``scaled_dot_product_attention`` calls it with its own name."""
    return_lse = check_flag("return_lse", options["return_lse"], call)
    query_chunk, key_block = options["query_chunk"], options["key_block"]
    xp, _, _ = check_arguments(q, k, v, filled(DenseOptions, options), call)
    mask, bias, alibi_slopes = options["mask"], options["bias"], options["alibi_slopes"]
    namespace_of(call, q=q, alibi_slopes=alibi_slopes)
    problem = prepare(q, k, v, scale=options["scale"], call=call)
    problem = problem._replace(softcap=check_softcap(options["softcap"], call))
    slopes = None if alibi_slopes is None else grouped_slopes(problem, alibi_slopes, call)
    if query_chunk is not None:
        query_chunk = check_size("query_chunk", query_chunk, call, minimum=1)
    if key_block is not None:
        key_block = check_size("key_block", key_block, call, minimum=1)
    *_, n_kv_heads, groups, n_queries, _ = problem.q.shape
    n_keys = problem.k.shape[-2]
    work = problem.q.dtype
    device = array_api_compat.device(problem.q)
    if n_keys == 0 or math.prod(problem.out_shape[:-1]) == 0:  # SDPA-5.2, SDPA-1.5
        out = xp.zeros(problem.out_shape, dtype=problem.out_dtype, device=device)
        lse = xp.full(problem.out_shape[:-1], -xp.inf, dtype=work, device=device)
        return (out, lse) if return_lse else out
    n_dims = len(problem.out_shape)
    offset = causal_offset(n_queries, n_keys, options["causal_alignment"])
    inputs = _Scores(
        problem=problem,
        mask=None if mask is None else _grouped_view(xp, mask, n_dims, n_kv_heads, groups),
        bias=None if bias is None else _grouped_view(xp, bias, n_dims, n_kv_heads, groups),
        causal_offset=offset if options["is_causal"] else None,
        slopes=slopes,
        alibi_offset=offset,
        excluded=xp.full((), -xp.inf, dtype=work, device=device),
    )
    default_chunk, default_block = default_block_sizes(
        math.prod(problem.out_shape[:-2]), n_queries, n_keys
    )
    query_chunk, key_block = query_chunk or default_chunk, key_block or default_block

    # Non-finite values are summed apart (SDPA-8.3); the common all-finite case pays one
    # pass over v for knowing it.
    finite = xp.isfinite(problem.v)
    v_finite, v_nonfinite = problem.v, None
    if not bool(xp.all(finite)):
        v_finite, v_nonfinite = xp.where(finite, problem.v, xp.zeros_like(problem.v)), problem.v
    chunks = [
        _attend_chunk(
            inputs,
            slice(start, min(start + query_chunk, n_queries)),
            key_block,
            v_finite,
            v_nonfinite,
        )
        for start in range(0, n_queries, query_chunk)
    ]
    out = xp.concat([chunk.out for chunk in chunks], axis=-2)
    out = xp.astype(xp.reshape(out, problem.out_shape), problem.out_dtype, copy=False)
    if not return_lse:
        return out
    lse = xp.concat([chunk.lse for chunk in chunks], axis=-2)
    return out, xp.reshape(lse, problem.out_shape[:-1])


@shows_options(BlockedOptions)
def blocked_attention(q: Array, k: Array, v: Array, **given: Unpack[BlockedOptions]) -> Any:
    """``scaled_dot_product_attention`` (spec/dense.md, spec/features.md) in O(Lq + Lk)
    extra memory.

    Arguments, output shape and dtype are those of the plain form (SDPA-1 … SDPA-8,
    SOFTCAP, ALIBI, LSE); the result equals it within TOL-2 (the log-sum-exp within
    TOL-5), with the same zeros, NaNs and infinities.  Weights are not returned (they are
    Lq x Lk by nature), nor is dropout applied (its keep mask is too).  ``query_chunk``
    query rows and ``key_block`` keys are processed at a time; the default
    (:func:`default_block_sizes`) depends only on the problem's size.  Extra memory is
    about ``batch * Hq * query_chunk * key_block`` scores plus the output; a mask or bias
    is read block by block and never broadcast.  Returns ``out``, or ``(out, lse)``.
    """
    return blocked_form(q, k, v, filled(BlockedOptions, given), CALL)
