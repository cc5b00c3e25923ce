"""NumPy building blocks for the catalogue kernels, written from spec/dense.md.

They share no code with ``attnspec.reference``: each step is the spec's definition in
plain NumPy.  The correct kernels in :mod:`catalogue.correct` compose them, and every
buggy kernel in :mod:`catalogue.buggy` composes them with exactly one step replaced, so
a bug is one visible line, not a rewrite.

Conventions: after :func:`arrange`, ``q`` is ``(*batch, Hq, Lq, E)``, ``k``/``v`` are
expanded to the query heads ``(*batch, Hq, Lk, ·)``, ``allowed`` and ``bias`` are
``(*batch, Hq, Lq, Lk)``, and everything is in the computation dtype (float32 for
float16 inputs, SDPA-7.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from .entry import SPEC_KEYWORDS, SpecCall, spec_function

ALIGNMENTS = ("top_left", "bottom_right")
# Kernels compute exp(-inf), inf - inf and 0/0 on purpose and mask the results.
QUIET = {"all": "ignore"}


Kernel = Callable[..., Any]


def named(kernel: Kernel, name: str, doc: str) -> Kernel:
    """``kernel``, made by a factory, as the module-level function ``name`` documented by
    ``doc``: reports show it, and worker processes load it, by that name."""
    kernel.__doc__ = doc
    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16 is computed in float32 (SDPA-7.2); float32/float64 in their own dtype."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def default_scale(head_dim: int) -> float:
    """SDPA-2.1: 1/sqrt(E), E the query/key head dim."""
    return 1.0 / math.sqrt(head_dim)


# The causal rule as a kernel applies it: (query indices, key indices) -> allowed table.
CausalRule = Callable[[np.ndarray, np.ndarray], np.ndarray]


def causal_rule(offset: int) -> CausalRule:
    """Key j allowed for query i when j <= i + offset: 0 top-left, Lk - Lq bottom-right."""
    return lambda rows, keys: keys[None, :] <= rows[:, None] + offset


def causal_offset(n_queries: int, n_keys: int, alignment: str) -> int:
    """Key j is allowed for query i when j <= i + offset: top-left 0 (SDPA-4.1),
    bottom-right Lk - Lq (SDPA-4.2)."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment={alignment!r}, but should be one of {ALIGNMENTS}")
    return 0 if alignment == "top_left" else n_keys - n_queries


def causal_table(n_queries: int, n_keys: int, alignment: str) -> np.ndarray:
    """(Lq, Lk) bool: top-left j <= i (SDPA-4.1), bottom-right j <= i + Lk - Lq (SDPA-4.2)."""
    offset = causal_offset(n_queries, n_keys, alignment)
    return causal_rule(offset)(np.arange(n_queries), np.arange(n_keys))


def contiguous_groups(n_q_heads: int, n_kv_heads: int) -> np.ndarray:
    """SDPA-6.1: query head h reads key/value head h // G, G = Hq / Hkv."""
    return np.arange(n_q_heads) // (n_q_heads // n_kv_heads)


def check_heads(n_q_heads: int, n_kv_heads: int) -> None:
    """SDPA-6.2: Hq must be a whole multiple of Hkv."""
    if n_kv_heads == 0 or n_q_heads % n_kv_heads:
        raise ValueError(
            f"q.shape[-3]={n_q_heads} query heads, but should be a multiple of "
            f"k.shape[-3]={n_kv_heads} key/value heads [SDPA-6.2]"
        )


@dataclass(frozen=True)
class Arranged:
    """Inputs laid out per query head and broadcast, in the computation dtype."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    allowed: np.ndarray
    bias: np.ndarray | None
    scale: float
    out_dtype: np.dtype

    def with_(self, **changes: Any) -> Arranged:
        return replace(self, **changes)


@dataclass(frozen=True)
class Operands:
    """What :func:`arrange` arranges, before any (Lq, Lk) array exists: q, k and v per
    query head in the computation dtype, the mask and bias as broadcast views, and the
    causal rule as a function, so a tiled kernel can cut out one block of query rows
    and keys at a time in bounded memory.  ``causal_offset`` is None without is_causal.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None
    bias: np.ndarray | None
    causal: CausalRule | None
    causal_offset: int | None
    scale: float
    out_dtype: np.dtype

    def with_(self, **changes: Any) -> Operands:
        return replace(self, **changes)

    @property
    def n_queries(self) -> int:
        return self.q.shape[-2]

    @property
    def n_keys(self) -> int:
        return self.k.shape[-2]

    def tile(self, rows: slice = slice(None), keys: slice = slice(None)) -> Arranged:
        """Query rows ``rows`` against keys ``keys``: the arrays :func:`scores` takes."""
        rows_at = np.arange(self.n_queries)[rows]
        keys_at = np.arange(self.n_keys)[keys]
        shape = (*self.q.shape[:-2], rows_at.size, keys_at.size)
        allowed = np.ones(shape, dtype=bool)
        if self.mask is not None:
            allowed &= self.mask[..., rows, keys]
        if self.causal is not None:
            allowed &= self.causal(rows_at, keys_at)
        work = self.q.dtype
        return Arranged(
            q=self.q[..., rows, :],
            k=self.k[..., keys, :],
            v=self.v[..., keys, :],
            allowed=allowed,
            bias=None if self.bias is None else self.bias[..., rows, keys].astype(work),
            scale=self.scale,
            out_dtype=self.out_dtype,
        )


@spec_function({**SPEC_KEYWORDS, "alignment": "top_left", "heads": contiguous_groups})
def operands(call: SpecCall) -> Operands:
    """``operands(q, k, v, *, mask=None, bias=None, is_causal=False, scale=None,
    alignment="top_left", heads=contiguous_groups)``: check heads, broadcast batch dims,
    expand K/V to the query heads (``heads(Hq, Hkv)`` gives each query head's, SDPA-6.1), and
    keep the mask (SDPA-3.1), bias and causal rule (SDPA-4) for :meth:`Operands.tile`."""
    q, k, v, mask, bias, is_causal, scale = call
    n_q_heads, n_queries, head_dim = q.shape[-3:]
    n_kv_heads, n_keys = k.shape[-3], k.shape[-2]
    check_heads(n_q_heads, n_kv_heads)
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    work = compute_dtype(q.dtype)
    kv_head = call.heads(n_q_heads, n_kv_heads)

    def batched(a: np.ndarray) -> np.ndarray:
        """``a`` over the broadcast batch dims: itself where it has them (read, then copied:
        np.broadcast_to's ~5 us a call was ~1 % of the zero-false-failure run)."""
        shape = (*batch, *a.shape[-3:])
        return a if a.shape == shape else np.broadcast_to(a, shape)

    def per_query_head(a: np.ndarray) -> np.ndarray:
        # take's result is fresh: converted in place of another copy where it is in work
        return np.take(batched(a), kv_head, axis=-3).astype(work, copy=False)

    scores_shape = (*batch, n_q_heads, n_queries, n_keys)
    offset = causal_offset(n_queries, n_keys, call.alignment)
    return Operands(
        q=batched(q).astype(work),
        k=per_query_head(k),
        v=per_query_head(v),
        mask=None if mask is None else np.broadcast_to(mask, scores_shape),
        bias=None if bias is None else np.broadcast_to(bias, scores_shape),
        causal=causal_rule(offset) if is_causal else None,
        causal_offset=offset if is_causal else None,
        scale=default_scale(head_dim) if scale is None else float(scale),
        out_dtype=q.dtype,
    )


def arrange(q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any) -> Arranged:
    """:func:`operands` (same keywords) as one tile of every query and key.

    ``allowed`` is the mask AND the causal rule (SDPA-3.1, SDPA-3.4, SDPA-4); a -inf
    bias is folded in later by :func:`scores`.
    """
    return operands(q, k, v, **options).tile()


def scores(a: Arranged) -> tuple[np.ndarray, np.ndarray]:
    """Scaled, biased scores with -inf where not allowed, and the allowed set S(i).

    A -inf bias removes the key (SDPA-3.3); disallowed scores are replaced, never
    computed with, so a NaN there cannot reach the softmax (SDPA-8).
    """
    with np.errstate(**QUIET):  # NaN/inf inputs are legitimate (SDPA-8)
        s = np.matmul(a.q, np.swapaxes(a.k, -1, -2)) * a.q.dtype.type(a.scale)
        if a.bias is not None:
            s = s + a.bias
    allowed = a.allowed & (s != -np.inf)
    return np.where(allowed, s, -np.inf), allowed


def row_max(s: np.ndarray) -> np.ndarray:
    """Max over keys, 0 for a row with nothing allowed so shifting it stays NaN-free."""
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    return np.where(m == -np.inf, s.dtype.type(0), m)


def softmax_lse(s: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Weights exp(s - logsumexp(s)) over the allowed keys; empty rows are all 0 (SDPA-5).

    The exponent is formed as (s - m) - log(sum exp(s - m)), as log_softmax libraries
    do: forming lse = m + log(...) first rounds it to the precision of |m|, an error
    common to every weight of the row that grows with the score magnitude.
    """
    with np.errstate(**QUIET):
        shifted = s - row_max(s)
        log_total = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
        return np.where(allowed, np.exp(shifted - log_total), s.dtype.type(0))


def combine(p: np.ndarray, allowed: np.ndarray, v: np.ndarray) -> np.ndarray:
    """sum_{j in S(i)} p_ij v_j: disallowed keys are left out of the sum, not multiplied
    by 0, so a non-finite value there cannot leak (SDPA-8.2).

    The finite values go through one P @ V with the disallowed weights and the
    non-finite values zeroed (no (Lq, Lk, Ev) array of terms); the non-finite values of
    allowed keys are then added term by term, so they reach the output (SDPA-8.3) and
    a NaN behind the mask changes no bit.
    """
    with np.errstate(**QUIET):
        finite = np.isfinite(v)
        out = np.matmul(np.where(allowed, p, p.dtype.type(0)), np.where(finite, v, 0))
        if finite.all():
            return out
        keys = np.flatnonzero(np.reshape(~finite.all(axis=-1), (-1, v.shape[-2])).any(axis=0))
        bad_terms = np.where(
            allowed[..., keys, None] & ~finite[..., None, keys, :],
            p[..., keys, None] * v[..., None, keys, :],
            p.dtype.type(0),
        )
        return out + np.sum(bad_terms, axis=-2)


def finish(out: np.ndarray, a: Arranged) -> np.ndarray:
    """The output in q's dtype (SDPA-1.3)."""
    return out.astype(a.out_dtype)


def attend(a: Arranged) -> np.ndarray:
    """The log-sum-exp formulation end to end: scores, weights, weighted values."""
    s, allowed = scores(a)
    return finish(combine(softmax_lse(s, allowed), allowed, a.v), a)


def ragged_blocks(n: int, size: int) -> list[slice]:
    """[0, size), [size, 2 size), ...: every index exactly once, the last block ragged."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


class Rescale(NamedTuple):
    """What multiplies the running sum and the accumulator when the running max grows
    by d = m_old - m_new (<= 0): exp(d) for both in a correct online softmax."""

    total: Callable[[np.ndarray], np.ndarray] = np.exp
    acc: Callable[[np.ndarray], np.ndarray] = np.exp


EXACT_RESCALE = Rescale()


class Running(NamedTuple):
    """An online softmax's state over the keys seen so far: max m, sum l, accumulator."""

    m: np.ndarray
    total: np.ndarray
    acc: np.ndarray


def online_pass(
    s: np.ndarray,
    allowed: np.ndarray,
    v: np.ndarray,
    *,
    block: int = 3,
    blocks: Callable[[int, int], list[slice]] = ragged_blocks,
    rescale: Rescale = EXACT_RESCALE,
) -> Running:
    """FlashAttention-style pass over key blocks: a running max m, a running sum l and
    an accumulator rescaled by exp(m_old - m_new) whenever the max grows.  The weights
    never exist as a whole in the loop (the prepared form holds a tile's, as ``s``).

    ``blocks`` and ``rescale`` are replaced only by the catalogue's online-softmax bugs.
    """
    cuts = blocks(s.shape[-1], block)
    if _covers_in_order(cuts, s.shape[-1]):
        return _online_pass_prepared(s, allowed, v, cuts, rescale)
    return _online_pass_by_block(s, allowed, v, cuts, rescale)


def _online_pass_by_block(
    s: np.ndarray, allowed: np.ndarray, v: np.ndarray, cuts: list[slice], rescale: Rescale
) -> Running:
    """:func:`online_pass` one block of ``cuts`` after the other, each step as a kernel's
    loop makes it (any cuts: the tiling bugs' overlapping or dropped tails too)."""
    dtype = s.dtype.type
    m = np.full((*s.shape[:-1], 1), -np.inf, dtype=s.dtype)
    total = np.zeros_like(m)
    acc = np.zeros((*s.shape[:-1], v.shape[-1]), dtype=s.dtype)
    with np.errstate(**QUIET):
        for blk in cuts:
            s_blk, ok = s[..., blk], allowed[..., blk]
            m_new = np.maximum(m, np.max(s_blk, axis=-1, keepdims=True, initial=-np.inf))
            shift = np.where(m_new == -np.inf, dtype(0), m_new)
            p = np.where(ok, np.exp(s_blk - shift), dtype(0))
            total = total * rescale.total(m - shift) + np.sum(p, axis=-1, keepdims=True)
            acc = acc * rescale.acc(m - shift) + combine(p, ok, v[..., blk, :])
            m = m_new
    return Running(m, total, acc)


def _covers_in_order(cuts: list[slice], n: int) -> bool:
    """Whether ``cuts`` are [0, a), [a, b), ..., [., n): each key once, in order, none empty
    (ragged_blocks' blocks; not the overlapping or dropped tails of the tiling bugs)."""
    at = 0
    for cut in cuts:
        if cut.start != at or cut.step is not None or cut.stop <= at:
            return False
        at = cut.stop
    return at == n and bool(cuts)


def _online_pass_prepared(
    s: np.ndarray, allowed: np.ndarray, v: np.ndarray, cuts: list[slice], rescale: Rescale
) -> Running:
    """:func:`_online_pass_by_block` over ``cuts`` that cover the keys in order, to the bit
    (test_correct_pass.py's test_online_pass_prepared_is_the_blockwise_loop), with what
    does not depend on the running sums done for every block at once: each block's running
    max (a max is exact in any grouping), its shift, its exponentials and rescaling
    factors; only the running sum and the accumulator go block by block (their rounding
    depends on the order), and P V without combine's copies where every value is finite.
    Not the kernels' subject but the suite's time: the zero-false-failure run calls it on
    rows of up to 4096 keys in blocks of 3 (long-peaked-rows; 1.4 -> 0.5 CPU-s for each
    online-softmax kernel, issue 33)."""
    dtype = s.dtype.type
    starts = [cut.start for cut in cuts]
    with np.errstate(**QUIET):
        tops = np.maximum.accumulate(np.maximum.reduceat(s, starts, axis=-1), axis=-1)
        shifts = np.where(tops == -np.inf, dtype(0), tops)
        before = np.concatenate([np.full_like(tops[..., :1], -np.inf), tops[..., :-1]], axis=-1)
        grown = before - shifts
        total_factors = rescale.total(grown)
        acc_factors = total_factors if rescale.acc is rescale.total else rescale.acc(grown)
        widths = [cut.stop - cut.start for cut in cuts]
        exps = np.exp(s - np.repeat(shifts, widths, axis=-1))
        p_all = np.where(allowed, exps, dtype(0))
        finite_values = bool(np.isfinite(v).all())
        total = np.zeros((*s.shape[:-1], 1), dtype=s.dtype)
        acc = np.zeros((*s.shape[:-1], v.shape[-1]), dtype=s.dtype)
        for at, blk in enumerate(cuts):
            # P and V of the block laid out as the loop's own arrays (fresh, C-ordered):
            # BLAS's products can round differently with another row stride
            p = np.ascontiguousarray(p_all[..., blk])
            here = slice(at, at + 1)
            total = total * total_factors[..., here] + np.add.reduce(p, axis=-1, keepdims=True)
            terms = (
                np.matmul(p, np.ascontiguousarray(v[..., blk, :]))
                if finite_values
                else combine(p, allowed[..., blk], v[..., blk, :])
            )
            acc = acc * acc_factors[..., here] + terms
    return Running(tops[..., -1:], total, acc)


def normalise(state: Running) -> np.ndarray:
    """acc / l, and 0 where l = 0 (a row with nothing allowed, SDPA-5)."""
    # total is 0 only for a row with nothing allowed; a NaN total must stay NaN.
    empty = state.total == 0
    with np.errstate(**QUIET):
        return np.where(
            empty,
            state.acc.dtype.type(0),
            state.acc / np.where(empty, state.total.dtype.type(1), state.total),
        )


NO_RESCALE = Rescale(total=np.ones_like, acc=np.ones_like)


def whole_blocks(n: int, size: int) -> list[slice]:
    """:func:`ragged_blocks` without the ragged last one."""
    return ragged_blocks(n - n % size, size)


def online_softmax(
    s: np.ndarray,
    allowed: np.ndarray,
    v: np.ndarray,
    *,
    block: int = 3,
    rescale: bool = True,
    tail: bool = True,
) -> np.ndarray:
    """:func:`online_pass` over blocks of ``block`` keys, normalised: the output directly.

    ``rescale=False`` and ``tail=False`` exist only for the catalogue's online-softmax
    bugs (accumulator not rescaled; ragged last block dropped).
    """
    return normalise(
        online_pass(
            s,
            allowed,
            v,
            block=block,
            blocks=ragged_blocks if tail else whole_blocks,
            rescale=EXACT_RESCALE if rescale else NO_RESCALE,
        )
    )
