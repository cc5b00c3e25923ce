"""The recurrence evaluated a chunk of tokens at a time (REC-5.1), equal to the token form.

Within a chunk of ``c`` tokens that starts from state ``S0``, write ``G_t`` for the
cumulative log decay (inclusive, per key channel) and ``D_tj = exp(G_t - G_j)`` for
``j <= t``.  Unrolling REC-1.2 gives, in exact arithmetic,

* the corrections of the delta rules, ``u_t = beta_t (v_t - (k_t * e^{G_t})^T S0 -
  sum_{j<t} (k_t . D_tj k_j) u_j)``: the unit lower-triangular system
  ``(I + diag(beta) L) U = diag(beta) (V - (K * e^G) S0)`` with ``L_tj = k_t . D_tj k_j``
  (j < t).  Solving it for the two right-hand sides ``diag(beta) V`` and ``diag(beta) (K *
  e^G)`` (the inverse of the unit lower-triangular matrix applied to both) gives the WY /
  UT form ``U = U~ - W S0``: only ``W``, the keys, carries the decay
  (a chunked form that also decays ``U~`` is wrong; shainet PR #170);
* the outputs ``o_t = scale ((q_t * e^{G_t})^T S0 + sum_{j<=t} (q_t . D_tj k_j) u_j)``;
* the next state ``e^{G_last} * S0 + sum_j (k_j * e^{G_last - G_j}) u_j^T``.

Every decay is the exponential of a difference ``G_t - G_j <= 0`` (for ``g <= 0``), never a
product ``e^{G_t} e^{-G_j}``, whose second factor overflows for strong decay (executorch
PR #21417, tt-metal #56550).  The chunk-local terms (the pairwise decays, ``L``, the
inverse of the triangular matrix) are computed for a slab of chunks at once, by forward
substitution over the ``c`` rows of all of them together; only the state passes from chunk
to chunk.  The
last chunk is shorter when ``c`` does not divide ``T``; it is never padded (transformers
#46190).  Memory is that of one slab, ``O(chunks x c^2 x e)`` with ``e`` 1 (per-head gates)
or ``dk`` (per-channel gates), never ``O(T^2)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import array_api_compat

from .._array import Array
from ._inputs import Recurrence

# Elements of the largest slab temporary (pairwise decays times heads): 4 Mi, 32 MiB in
# float64, small enough for the cache-friendly range the other reference modules use.
SLAB_ELEMENTS = 2**22


@dataclass(frozen=True)
class _Chunks:
    """``n`` chunks of ``c`` tokens from token ``start``, reshaped to ``(..., n, c, .)``."""

    q: Array  # (..., Hs, n, G * c, dk): the G output heads of a state stacked as rows
    k: Array  # (..., Hs, n, c, dk)
    v: Array  # (..., Hs, n, c, dv)
    cumulative: Array  # (..., Hs, n, c, e): G_t, inclusive
    beta: Array | None  # (..., Hs, n, c)


def _cut(p: Recurrence, start: int, n: int, c: int) -> _Chunks:
    xp, stop = p.xp, start + n * c

    def split(a: Array, time_axis: int) -> Array:
        time_axis %= a.ndim
        window = xp.take(
            a, xp.arange(start, stop, device=array_api_compat.device(a)), axis=time_axis
        )
        shape = tuple(window.shape)
        return xp.reshape(window, (*shape[:time_axis], n, c, *shape[time_axis + 1 :]))

    queries = split(p.q, -2)  # (..., Hs, G, n, c, dk)
    shape = tuple(queries.shape)
    nd = len(shape)  # to (..., Hs, n, G, c, dk), then G and c merged
    queries = xp.permute_dims(queries, (*range(nd - 4), nd - 3, nd - 4, nd - 2, nd - 1))
    stacked = (*shape[:-4], n, shape[-4] * c, shape[-1])
    return _Chunks(
        q=_contiguous(xp, xp.reshape(_contiguous(xp, queries), stacked)),
        k=split(p.k, -2),
        v=split(p.v, -2),
        cumulative=xp.cumulative_sum(split(p.log_decay, -2), axis=-2),
        beta=None if p.beta is None else split(p.beta, -1),
    )


def _contiguous(xp: ModuleType, a: Array) -> Array:
    """``a`` with its elements laid out in row-major order: a matrix product of transposed
    or permuted views falls off NumPy's BLAS path (10x slower, measured), and the standard
    has no other way to ask for a copy in this order than a round trip through 1-d."""
    return xp.reshape(xp.reshape(a, (-1,)), tuple(a.shape))


def _chunk_major(xp: ModuleType, a: Array) -> Array:
    """``(..., n, r, x)`` as ``(n, ..., r, x)`` in row-major order, so that the chunk the
    state loop reads is one contiguous block (NumPy's stacked products of strided views
    leave BLAS)."""
    nd = a.ndim
    return _contiguous(xp, xp.permute_dims(a, (nd - 3, *range(nd - 3), nd - 2, nd - 1)))


def _by_row_groups(xp: ModuleType, a: Array, groups: int) -> Array:
    """``(..., c, x)`` repeated for each of ``groups`` stacked row blocks: ``(..., G * c,
    x)``, so that the G queries of one chunk position see that position's decay."""
    shape = tuple(a.shape)
    tiled = xp.broadcast_to(a[..., None, :, :], (*shape[:-2], groups, *shape[-2:]))
    return xp.reshape(tiled, (*shape[:-2], groups * shape[-2], shape[-1]))


def _pair_decays(xp: ModuleType, cumulative: Array, strict: bool) -> Array:
    """``D_tj = exp(G_t - G_j)`` for ``j <= t`` (``j < t`` if strict), 0 elsewhere:
    ``(..., c, c, e)``, the exponent a difference so that nothing overflows."""
    c = int(cumulative.shape[-2])
    rows = xp.arange(c, device=array_api_compat.device(cumulative))
    keep = (rows[:, None] > rows[None, :]) if strict else (rows[:, None] >= rows[None, :])
    keep = keep[:, :, None]
    difference = cumulative[..., :, None, :] - cumulative[..., None, :, :]
    safe = xp.where(keep, difference, xp.zeros_like(difference))
    return xp.where(keep, xp.exp(safe), xp.zeros_like(difference))


def _pair_products(xp: ModuleType, a: Array, b: Array, decays: Array) -> Array:
    """``sum_e a_te D_tje b_je`` for ``a (..., G * c, dk)``, ``b (..., c, dk)`` and
    ``D (..., c, c, e)``: ``(..., G * c, c)``; a matrix product for per-head decays."""
    groups = int(a.shape[-2]) // int(b.shape[-2])
    if decays.shape[-1] == 1:
        products = xp.matmul(a, _contiguous(xp, xp.matrix_transpose(b)))
        return products * _by_row_groups(xp, decays[..., 0], groups)
    shape = tuple(a.shape)
    rows = xp.reshape(a, (*shape[:-2], groups, shape[-2] // groups, shape[-1]))
    summed = xp.sum(
        rows[..., :, :, None, :] * decays[..., None, :, :, :] * b[..., None, None, :, :], axis=-1
    )
    return xp.reshape(summed, (*shape[:-2], shape[-2], int(b.shape[-2])))


def _unit_lower_inverse(xp: ModuleType, lower: Array, beta: Array) -> Array:
    """``(I + diag(beta) L)^{-1}`` for ``L`` strictly lower triangular, by forward
    substitution: row ``i`` is ``e_i - beta_i sum_{j<i} L_ij T_j``, for all chunks of the
    slab at once.  Every step has the same shapes (row ``i`` of ``L`` times all of ``T``,
    whose rows from ``i`` on are still 0), so a library that compiles per shape compiles one
    step, not ``c``; the inverse is ``c x c``, narrower than the ``dk + dv`` columns it is
    then applied to, which is why it is formed rather than applied row by row."""
    c = int(lower.shape[-1])
    rows = xp.arange(c, device=array_api_compat.device(lower))
    identity = xp.astype(rows[:, None] == rows[None, :], lower.dtype)
    inverse = xp.zeros_like(lower)
    for i in range(c):
        index = xp.asarray([i], device=array_api_compat.device(lower))
        carried = xp.matmul(xp.take(lower, index, axis=-2), inverse)  # (..., 1, c)
        row = xp.take(identity, index, axis=-2) - xp.take(beta, index, axis=-1)[..., None] * carried
        inverse = xp.where((rows == i)[:, None], row, inverse)
    return inverse


def _slab(p: Recurrence, state: Array, chunks: _Chunks) -> tuple[list[Array], Array]:
    """The outputs of each chunk of the slab, ``(..., Hs, G * c, dv)``, and the state after
    the last one."""
    xp = p.xp
    groups = int(chunks.q.shape[-2]) // int(chunks.k.shape[-2])
    decay = xp.exp(chunks.cumulative)  # (..., Hs, n, c, e)
    last = chunks.cumulative[..., -1:, :]
    to_end = xp.exp(last - chunks.cumulative)  # (..., Hs, n, c, e), exponents <= 0
    inclusive = _pair_decays(xp, chunks.cumulative, strict=False)
    scores = _pair_products(xp, chunks.q, chunks.k, inclusive)  # (..., Hs, n, G c, c)
    queries = chunks.q * _by_row_groups(xp, decay, groups)
    written_keys = _contiguous(xp, xp.matrix_transpose(chunks.k * to_end))  # (..., dk, c)
    if chunks.beta is not None:
        strict = _pair_decays(xp, chunks.cumulative, strict=True)
        lower = _pair_products(xp, chunks.k, chunks.k, strict)
        d_v = int(chunks.v.shape[-1])
        right = chunks.beta[..., None] * xp.concat([chunks.v, chunks.k * decay], axis=-1)
        solved = xp.matmul(_unit_lower_inverse(xp, lower, chunks.beta), right)
        values, keys = solved[..., :d_v], solved[..., d_v:]  # U~ and W
    else:
        values = chunks.v
    values, queries, scores, written_keys = (
        _chunk_major(xp, a) for a in (values, queries, scores, written_keys)
    )
    keys = None if chunks.beta is None else _chunk_major(xp, keys)
    outs = []
    for m in range(int(chunks.k.shape[-3])):
        update = values[m, ...]
        if keys is not None:
            update = update - xp.matmul(keys[m, ...], state)
        from_state = xp.matmul(queries[m, ...], state)
        within = xp.matmul(scores[m, ...], update)
        outs.append(p.scale * (from_state + within))
        written = xp.matmul(written_keys[m, ...], update)
        state = xp.exp(last[..., m, 0, :])[..., :, None] * state + written
    return outs, state


def chunked_recurrence(
    p: Recurrence, chunk_size: int, slab_chunks: int | None = None
) -> tuple[Array, Array]:
    """The same ``(out, final state)`` as :func:`~.definition.token_recurrence`, in chunks
    of ``chunk_size`` tokens (the last one shorter), slab by slab.  ``slab_chunks`` fixes
    the chunks per slab (default: as many as fit ``SLAB_ELEMENTS``; 1 solves each chunk
    alone, the naive chunked form the benchmark compares with)."""
    xp, length = p.xp, p.length
    full, rest = divmod(length, chunk_size)
    heads = 1
    for n in p.q.shape[:-3]:
        heads *= int(n)
    per_chunk = heads * chunk_size * chunk_size * int(p.log_decay.shape[-1]) * (p.q.shape[-3] + 1)
    slab = max(1, SLAB_ELEMENTS // max(per_chunk, 1)) if slab_chunks is None else slab_chunks
    pieces = [
        (start, min(slab, full - start // chunk_size), chunk_size)
        for start in range(0, full * chunk_size, slab * chunk_size)
    ]
    if rest:
        pieces.append((full * chunk_size, 1, rest))
    state, outs = p.state, []
    for start, n, c in pieces:
        slab_outs, state = _slab(p, state, _cut(p, start, n, c))
        outs.extend(slab_outs)
    if not outs:
        empty = (*p.q.shape[:-2], 0, p.v.shape[-1])
        return p.output_heads(
            xp.zeros(empty, dtype=state.dtype, device=array_api_compat.device(state))
        ), state
    groups = int(p.q.shape[-3])
    unstacked = []
    for out in outs:  # (..., Hs, G * c, dv) -> (..., Hs, G, c, dv)
        shape = tuple(out.shape)
        unstacked.append(xp.reshape(out, (*shape[:-2], groups, shape[-2] // groups, shape[-1])))
    return p.output_heads(xp.concat(unstacked, axis=-2)), state
