"""The backward pass of spec/backward.md: the vector-Jacobian product of attention (BWD-1).

Two evaluations of the same gradients:

* :func:`scaled_dot_product_attention_backward`, the plain one, holds every ``Lq x Lk``
  matrix and supports every feature of the forward reference (mask, bias, both causal
  alignments, GQA, scale, softcap, ALiBi, dropout with a keep mask, an upstream gradient
  of the log-sum-exp);
* :func:`blocked_attention_backward`, the memory-efficient one, walks key blocks and query
  chunks as FlashAttention 2's backward does (Dao 2023, Algorithm 2): it recomputes each
  block of weights from the saved log-sum-exp, ``p = exp(s - lse)``, and never holds more
  than one block of scores (mask, bias, causal and scale, as :func:`~.blocked.blocked_attention`).

Both compute, per query head, ``dP = dO V^T``, ``D = rowsum(dO * O)``,
``dS = P * (dP - D + dlse)``, ``dQ = scale dS K``, ``dK = scale dS^T Q``, ``dV = P^T dO``
and ``dbias = dS`` reduced to the bias's shape (BWD-1, BWD-2); excluded pairs get exactly
zero (BWD-3) and rows with no allowed key give no gradient and no NaN (BWD-4).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import array_api_compat

from ._array import Array
from ._checks import check_size, namespace_of, require_real_floating
from .blocked import _block_scores, _grouped_view, _key_stop, _Scores, default_block_sizes
from .features import check_dropout_p, dropped_weights, log_sum_exp
from .masks import causal_offset
from .options import (
    BlockOptions,
    CausalOptions,
    DenseOptions,
    DropoutOptions,
    FeatureOptions,
    ScoreOptions,
    UpstreamLse,
    filled,
    shows_options,
)
from .sdpa import (
    GroupedInputs,
    allowed_scores,
    check_arguments,
    prepare,
    prepare_with_features,
    softmax_over_allowed,
)
from .varlen import heads_first, paired_offsets, require_packed

if TYPE_CHECKING:
    from typing import Unpack

CALL = "scaled_dot_product_attention_backward(q, k, v, grad_out)"
BLOCKED_CALL = "blocked_attention_backward(q, k, v, grad_out)"
VARLEN_CALL = "varlen_attention_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, grad_out)"


class Gradients(NamedTuple):
    """``dq``, ``dk``, ``dv`` with the shapes and dtypes of ``q``, ``k``, ``v`` and ``dbias``
    with the bias's (None without a bias) (BWD-2, BWD-13)."""

    dq: Any
    dk: Any
    dv: Any
    dbias: Any = None


def reduce_to_shape(xp: ModuleType, a: Array, shape: tuple[int, ...]) -> Array:
    """``a`` summed over the dimensions along which an array of ``shape`` was broadcast to
    ``a.shape`` (Array API broadcasting: aligned from the right; BWD-2)."""
    extra = a.ndim - len(shape)
    if extra > 0:
        a = xp.sum(a, axis=tuple(range(extra)))
    broadcast = tuple(axis for axis, size in enumerate(shape) if size == 1 and a.shape[axis] != 1)
    if broadcast:
        a = xp.sum(a, axis=broadcast, keepdims=True)
    return a


def _as_inputs(
    xp: ModuleType,
    gradients: tuple[Array, Array, Array],
    inputs: tuple[Array, Array, Array],
    dbias: Array,
) -> Gradients:
    """dq, dk, dv each reduced to its input's shape and cast to its dtype (BWD-2, BWD-13)."""
    dq, dk, dv = (
        xp.astype(reduce_to_shape(xp, g, tuple(a.shape)), a.dtype)
        for g, a in zip(gradients, inputs, strict=True)
    )
    return Gradients(dq, dk, dv, dbias)


def _check_upstream(
    xp: ModuleType, name: str, gradient: Array, shape: tuple[int, ...], call: str
) -> None:
    """An upstream gradient must be a real floating array of exactly ``shape`` (BWD-1)."""
    require_real_floating(xp, call, "BWD-1", **{name: gradient})
    if tuple(gradient.shape) != tuple(shape):
        raise ValueError(
            f"{name}.shape={tuple(gradient.shape)}, but should be {tuple(shape)}, the shape of "
            f"the result it is the gradient of [BWD-1, {call}]"
        )


def _grouped_rows(problem: GroupedInputs, a: Array) -> Array:
    """An ``(..., Hq, Lq, ·)`` array (output or upstream gradient, batch-broadcast shape) in
    the grouped layout ``(*batch, Hkv, G, Lq, ·)`` of ``problem.q``."""
    xp = problem.xp
    grouped = (*problem.q.shape[:-1], a.shape[-1])
    return xp.reshape(xp.astype(a, problem.q.dtype), grouped)


def _grouped_lse_gradient(problem: GroupedInputs, grad_lse: Array, call: str) -> Any:
    """``grad_lse`` (``(..., Hq, Lq)``) as ``(*batch, Hkv, G, Lq, 1)``, or None."""
    if grad_lse is None:
        return None
    xp = problem.xp
    _check_upstream(xp, "grad_lse", grad_lse, problem.out_shape[:-1], call)
    return xp.reshape(xp.astype(grad_lse, problem.q.dtype), (*problem.q.shape[:-1], 1))


def _capped_derivative(problem: GroupedInputs) -> Any:
    """1 - tanh^2(x / c) of the scaled dot products x (BWD-7), or None without softcap."""
    if problem.softcap is None:
        return None
    xp = problem.xp
    x = xp.matmul(problem.q, xp.matrix_transpose(problem.k)) * problem.scale
    slope = xp.tanh(x / problem.softcap)
    return 1 - slope * slope


def _finish(
    problem: GroupedInputs,
    grad_scores: Array,
    grad_v_grouped: Array,
    q: Array,
    k: Array,
    v: Array,
    bias: Array,
) -> Gradients:
    """dq, dk, dv and dbias from dS (grouped layout) and dV summed over nothing yet:
    dQ = scale dX K, dK = scale dX^T Q summed over the group, reduced to each input's shape
    and cast to its dtype (BWD-2, BWD-6, BWD-7, BWD-13)."""
    xp = problem.xp
    grad_x = grad_scores
    derivative = _capped_derivative(problem)
    if derivative is not None:
        grad_x = grad_scores * derivative
    batch = problem.out_shape[:-3]
    n_q_heads, n_queries = problem.out_shape[-3], problem.out_shape[-2]
    dq = xp.matmul(grad_x, problem.k) * problem.scale
    dq = xp.reshape(dq, (*batch, n_q_heads, n_queries, q.shape[-1]))
    dk = xp.sum(xp.matmul(xp.matrix_transpose(grad_x), problem.q), axis=-3) * problem.scale
    dv = xp.sum(grad_v_grouped, axis=-3)
    dbias = None
    if bias is not None:
        scores_shape = (*batch, n_q_heads, n_queries, problem.k.shape[-2])
        dbias = xp.astype(
            reduce_to_shape(xp, xp.reshape(grad_scores, scores_shape), tuple(bias.shape)),
            bias.dtype,
        )
    return _as_inputs(xp, (dq, dk, dv), (q, k, v), dbias)


class BackwardSteps(NamedTuple):
    """The intermediate matrices of the backward pass in the grouped layout
    ``(*batch, Hkv, G, Lq, Lk)`` (``delta``: ``(..., Lq, 1)``), shared with the accuracy
    bound of the gradients: the weights P, the kept and rescaled weights W (P without
    dropout), the dropout factor xi / (1 - p) (None without dropout), dP, D, dS and the
    allowed set S(i)."""

    weights: Any
    kept: Any
    rescale: Any
    grad_weights: Any
    delta: Any
    grad_scores: Any
    allowed: Any


def backward_steps(
    problem: GroupedInputs,
    d_out: Array,
    d_lse: Array,
    dropout_p: float,
    dropout_keep: Array,
    call: str,
) -> BackwardSteps:
    """P, W, dP = (xi / (1 - p)) dO V^T, D = rowsum(P * dP) = rowsum(dO * O) and
    dS = P * (dP - D + dlse) of the summary of spec/backward.md (BWD-1, BWD-9, BWD-10)."""
    xp = problem.xp
    scores, allowed = allowed_scores(problem)
    weights = softmax_over_allowed(xp, scores, allowed)
    kept = dropped_weights(problem, weights, dropout_p, dropout_keep, call)
    grad_weights = xp.matmul(d_out, xp.matrix_transpose(problem.v))
    rescale = None
    if dropout_keep is not None:  # the forward's keep indicators xi (BWD-9)
        rescale = dropped_weights(problem, xp.ones_like(weights), dropout_p, dropout_keep, call)
        grad_weights = grad_weights * rescale
    delta = xp.sum(weights * grad_weights, axis=-1, keepdims=True)
    shifted = grad_weights - delta if d_lse is None else grad_weights - delta + d_lse
    # excluded pairs and rows without a key: exactly 0, whatever dP holds there (BWD-3, BWD-4)
    grad_scores = xp.where(allowed, weights * shifted, xp.zeros_like(shifted))
    return BackwardSteps(weights, kept, rescale, grad_weights, delta, grad_scores, allowed)


class BackwardOptions(UpstreamLse, ScoreOptions, DropoutOptions, total=False):
    """``scaled_dot_product_attention_backward``'s keywords."""


@shows_options(BackwardOptions)
def scaled_dot_product_attention_backward(
    q: Array, k: Array, v: Array, grad_out: Array, **given: Unpack[BackwardOptions]
) -> Gradients:
    """The gradients of ``scaled_dot_product_attention`` (spec/backward.md, BWD-1 … BWD-10).

    Arguments are those of the forward reference; ``grad_out`` is the upstream gradient of
    the output, ``(..., Hq, Lq, Ev)`` with the broadcast batch shape, and ``grad_lse``
    (optional) that of the returned log-sum-exp, ``(..., Hq, Lq)`` (BWD-10).  The mask, the
    causal rule, the scale, the softcap, the ALiBi slopes and the keep mask are held fixed
    (BWD-1).  Returns :class:`Gradients` ``(dq, dk, dv, dbias)``, each with its input's
    shape and dtype; ``dbias`` is None without a bias.
    """
    options = filled(BackwardOptions, given)
    grad_lse, dropout_keep = options["grad_lse"], options["dropout_keep"]
    namespace_of(
        CALL,
        q=q,
        grad_out=grad_out,
        grad_lse=grad_lse,
        alibi_slopes=options["alibi_slopes"],
        dropout_keep=dropout_keep,
    )
    dropout_p = check_dropout_p(options["dropout_p"], CALL)
    problem = prepare_with_features(q, k, v, options, CALL)
    xp = problem.xp
    _check_upstream(xp, "grad_out", grad_out, problem.out_shape, CALL)
    d_out = _grouped_rows(problem, grad_out)
    d_lse = _grouped_lse_gradient(problem, grad_lse, CALL)

    steps = backward_steps(problem, d_out, d_lse, dropout_p, dropout_keep, CALL)
    grad_v = xp.matmul(xp.matrix_transpose(steps.kept), d_out)
    return _finish(problem, steps.grad_scores, grad_v, q, k, v, options["bias"])


def _running_lse(inputs: _Scores, rows: slice, key_block: int) -> Any:
    """The log-sum-exp of query rows ``rows`` over key blocks (LSE-1), ``(..., rows, 1)``,
    -inf for rows with no allowed key (LSE-2): FlashAttention's forward statistics."""
    problem = inputs.problem
    xp = problem.xp
    q_chunk = problem.q[..., rows, :]
    n_keys = problem.k.shape[-2]
    running = None
    for start in range(0, _key_stop(inputs, rows, n_keys), key_block):
        cols = slice(start, min(start + key_block, n_keys))
        scores = _block_scores(inputs, q_chunk, rows, cols)
        block = log_sum_exp(xp, scores, scores != -xp.inf)[..., None]
        running = block if running is None else xp.logaddexp(running, block)
    if running is None:
        device = array_api_compat.device(q_chunk)
        return xp.full((*q_chunk.shape[:-1], 1), -xp.inf, dtype=q_chunk.dtype, device=device)
    return running


def _block_weights(xp: ModuleType, scores: Array, lse: Array) -> Array:
    """``exp(s - lse)`` where the pair is allowed (score > -inf) and the row has a key;
    exactly 0 elsewhere, so a row with lse = -inf never computes -inf + inf (BWD-4)."""
    allowed = xp.logical_and(scores != -xp.inf, lse != -xp.inf)
    safe_lse = xp.where(lse == -xp.inf, xp.zeros_like(lse), lse)
    shifted = xp.where(allowed, scores - safe_lse, xp.full_like(scores, -xp.inf))
    return xp.exp(shifted)


def _reduce_to_view(xp: ModuleType, a: Array, view_shape: tuple[int, ...]) -> Array:
    """A block of dS summed over the axes along which the bias view broadcasts."""
    axes = tuple(axis for axis, size in enumerate(view_shape) if size == 1 and a.shape[axis] != 1)
    return xp.sum(a, axis=axes, keepdims=True) if axes else a


class _Forward(TypedDict, total=False):
    out: Array
    lse: Array


class BlockedBackwardOptions(_Forward, UpstreamLse, DenseOptions, BlockOptions, total=False):
    """``blocked_attention_backward``'s keywords: the forward's output and log-sum-exp."""


@shows_options(BlockedBackwardOptions)
def blocked_attention_backward(
    q: Array, k: Array, v: Array, grad_out: Array, **given: Unpack[BlockedBackwardOptions]
) -> Gradients:
    """The gradients of :func:`~.blocked.blocked_attention` in O(Lq + Lk) extra memory, as
    FlashAttention 2's backward computes them (BWD-1 … BWD-6, BWD-10).

    ``out`` and ``lse`` are the forward's output and log-sum-exp (``(..., Hq, Lq, Ev)`` and
    ``(..., Hq, Lq)``), computed block by block when not given.  ``D = rowsum(dO * out)``;
    then, for each block of ``key_block`` keys and each chunk of ``query_chunk`` queries,
    the weights are recomputed as ``exp(s - lse)`` and the block's contributions added to
    dV, dK (per key block) and dQ, dbias (per query chunk).  Returns :class:`Gradients`.
    """
    # the forward's keywords, for the checks and for the forward pass when out is not given
    options = filled(BlockedBackwardOptions, given)
    forward = filled(DenseOptions, options)
    mask, bias, is_causal = forward["mask"], forward["bias"], forward["is_causal"]
    causal_alignment, scale = forward["causal_alignment"], forward["scale"]
    out, lse, grad_lse = options["out"], options["lse"], options["grad_lse"]
    query_chunk, key_block = options["query_chunk"], options["key_block"]
    xp, _, _ = check_arguments(q, k, v, forward, BLOCKED_CALL)
    namespace_of(BLOCKED_CALL, q=q, grad_out=grad_out, out=out, lse=lse, grad_lse=grad_lse)
    problem = prepare(q, k, v, scale=scale, call=BLOCKED_CALL)
    if query_chunk is not None:
        query_chunk = check_size("query_chunk", query_chunk, BLOCKED_CALL, minimum=1)
    if key_block is not None:
        key_block = check_size("key_block", key_block, BLOCKED_CALL, minimum=1)
    _check_upstream(xp, "grad_out", grad_out, problem.out_shape, BLOCKED_CALL)
    if out is not None:
        _check_upstream(xp, "out", out, problem.out_shape, BLOCKED_CALL)
    if lse is not None:
        _check_upstream(xp, "lse", lse, problem.out_shape[:-1], BLOCKED_CALL)
    *_, n_kv_heads, groups, n_queries, _ = problem.q.shape
    n_keys = problem.k.shape[-2]
    n_dims = len(problem.out_shape)
    inputs = _Scores(
        problem=problem,
        mask=None if mask is None else _grouped_view(xp, mask, n_dims, n_kv_heads, groups),
        bias=None if bias is None else _grouped_view(xp, bias, n_dims, n_kv_heads, groups),
        causal_offset=causal_offset(n_queries, n_keys, causal_alignment) if is_causal else None,
    )
    default_chunk, default_block = default_block_sizes(
        math.prod(problem.out_shape[:-2]), n_queries, n_keys
    )
    query_chunk, key_block = query_chunk or default_chunk, key_block or default_block
    chunks = [
        slice(start, min(start + query_chunk, n_queries))
        for start in range(0, n_queries, query_chunk)
    ]
    d_out = _grouped_rows(problem, grad_out)
    d_lse = _grouped_lse_gradient(problem, grad_lse, BLOCKED_CALL)
    if lse is None:
        row_lse = [_running_lse(inputs, rows, key_block) for rows in chunks]
    else:
        whole_lse = xp.reshape(xp.astype(lse, problem.q.dtype), (*problem.q.shape[:-1], 1))
        row_lse = [whole_lse[..., rows, :] for rows in chunks]
    if out is None:
        from .blocked import blocked_attention  # the forward pass, once, for D

        out = blocked_attention(
            q,
            k,
            v,
            **forward,
            query_chunk=query_chunk,
            key_block=key_block,
        )
    # D_i = dO_i . o_i, from the forward's output as FlashAttention 2 does (BWD-9, BWD-10)
    delta = xp.sum(d_out * _grouped_rows(problem, out), axis=-1, keepdims=True)
    if d_lse is not None:
        delta = delta - d_lse

    grad_q = [xp.zeros_like(problem.q[..., rows, :]) for rows in chunks]
    bias_view = inputs.bias
    grad_bias: dict[tuple[int, int], Any] = {}
    grad_k_blocks, grad_v_blocks = [], []
    for start in range(0, n_keys, key_block):
        cols = slice(start, min(start + key_block, n_keys))
        k_block, v_block = problem.k[..., cols, :], problem.v[..., cols, :]
        grad_k = xp.zeros_like(
            xp.broadcast_to(k_block, (*problem.q.shape[:-2], *k_block.shape[-2:]))
        )
        grad_v = xp.zeros_like(
            xp.broadcast_to(v_block, (*problem.q.shape[:-2], *v_block.shape[-2:]))
        )
        for index, rows in enumerate(chunks):
            if _key_stop(inputs, rows, n_keys) <= cols.start:
                # the causal rule excludes the whole block for these rows: it adds exactly
                # 0 (BWD-3), and its bias gradient is a block of zeros
                if bias_view is not None:
                    _add_bias_block(xp, grad_bias, bias_view, index, rows, cols, None, problem)
                continue
            q_chunk = problem.q[..., rows, :]
            scores = _block_scores(inputs, q_chunk, rows, cols)
            weights = _block_weights(xp, scores, row_lse[index])
            d_out_chunk = d_out[..., rows, :]
            grad_v = grad_v + xp.matmul(xp.matrix_transpose(weights), d_out_chunk)
            grad_weights = xp.matmul(d_out_chunk, xp.matrix_transpose(v_block))
            grad_scores = xp.where(
                weights > 0, weights * (grad_weights - delta[..., rows, :]), xp.zeros_like(weights)
            )
            grad_q[index] = grad_q[index] + xp.matmul(grad_scores, k_block) * problem.scale
            grad_k = grad_k + xp.matmul(xp.matrix_transpose(grad_scores), q_chunk) * problem.scale
            if bias_view is not None:
                _add_bias_block(xp, grad_bias, bias_view, index, rows, cols, grad_scores, problem)
        grad_k_blocks.append(xp.sum(grad_k, axis=-3))
        grad_v_blocks.append(xp.sum(grad_v, axis=-3))
    return _assemble_blocked(
        problem, q, k, v, bias, bias_view, grad_q, grad_k_blocks, grad_v_blocks, grad_bias
    )


def _add_bias_block(
    xp: ModuleType,
    grad_bias: dict[tuple[int, int], Any],
    bias_view: Any,
    index: int,
    rows: slice,
    cols: slice,
    grad_scores: Any,
    problem: GroupedInputs,
) -> None:
    """Add one block of dS (None: a block of zeros), summed over the axes along which the
    bias broadcasts, to the bias gradient's block of query chunk ``index`` and key block
    ``cols`` (BWD-2); a broadcast rows or keys axis collects every chunk or block at 0."""
    block_shape = (*problem.q.shape[:-2], rows.stop - rows.start, cols.stop - cols.start)
    shape = tuple(1 if v == 1 else b for v, b in zip(bias_view.shape, block_shape, strict=True))
    if grad_scores is None:
        part = xp.zeros(shape, dtype=problem.q.dtype, device=array_api_compat.device(problem.q))
    else:
        part = _reduce_to_view(xp, grad_scores, shape)
    key = (index if bias_view.shape[-2] != 1 else 0, cols.start if bias_view.shape[-1] != 1 else 0)
    grad_bias[key] = part if key not in grad_bias else grad_bias[key] + part


def _assemble_blocked(
    problem: GroupedInputs,
    q: Array,
    k: Array,
    v: Array,
    bias: Array,
    bias_view: Any,
    grad_q: list[Any],
    grad_k_blocks: list[Any],
    grad_v_blocks: list[Any],
    grad_bias: dict[tuple[int, int], Any],
) -> Gradients:
    """The blocks of :func:`blocked_attention_backward` put together, reduced to each input's
    shape and dtype (BWD-2, BWD-13)."""
    xp = problem.xp
    device = array_api_compat.device(problem.q)
    batch, n_q_heads = problem.out_shape[:-3], problem.out_shape[-3]
    n_queries = problem.out_shape[-2]

    def joined(parts: list[Any], like: Any, axis: int) -> Any:
        if parts:
            return xp.concat(parts, axis=axis) if len(parts) > 1 else parts[0]
        return xp.zeros(like, dtype=problem.q.dtype, device=device)

    dq = joined(grad_q, (*problem.q.shape[:-2], 0, problem.q.shape[-1]), -2)
    dq = xp.reshape(dq, (*batch, n_q_heads, n_queries, problem.q.shape[-1]))
    dk = joined(grad_k_blocks, (*problem.q.shape[:-3], 0, problem.k.shape[-1]), -2)
    dv = joined(grad_v_blocks, (*problem.q.shape[:-3], 0, problem.v.shape[-1]), -2)
    dbias = None
    if bias is not None:
        view_shape = tuple(
            s if s == 1 else t
            for s, t in zip(
                bias_view.shape,
                (*problem.q.shape[:-1], problem.k.shape[-2]),
                strict=True,
            )
        )
        if grad_bias:
            rows = sorted({r for r, _ in grad_bias})
            cols = sorted({c for _, c in grad_bias})
            grid = [joined([grad_bias.get((r, c), None) for c in cols], (), -1) for r in rows]
            whole = joined(grid, (), -2)
            whole = _reduce_to_view(xp, whole, view_shape)
        else:  # no block was visited: every pair excluded, every gradient 0 (BWD-3)
            whole = xp.zeros(view_shape, dtype=problem.q.dtype, device=device)
        dbias = xp.astype(xp.reshape(whole, tuple(bias.shape)), bias.dtype)
    return _as_inputs(xp, (dq, dk, dv), (q, k, v), dbias)


class VarlenBackwardOptions(UpstreamLse, CausalOptions, FeatureOptions, total=False):
    """``varlen_attention_backward``'s keywords."""


@shows_options(VarlenBackwardOptions)
def varlen_attention_backward(
    q: Array,
    k: Array,
    v: Array,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    grad_out: Array,
    **given: Unpack[VarlenBackwardOptions],
) -> Gradients:
    """The gradients of :func:`~.varlen.varlen_attention` (BWD-11): sequence b's gradient
    rows are the dense backward of that sequence alone, so none crosses a boundary.

    ``grad_out`` is ``(T_q, Hq, Ev)``; ``grad_lse`` (optional) ``(Hq, T_q)``.  Returns
    packed ``dq (T_q, Hq, E)``, ``dk (T_k, Hkv, E)``, ``dv (T_k, Hkv, Ev)``.
    """
    options = filled(VarlenBackwardOptions, given)
    grad_lse, alibi_slopes = options["grad_lse"], options["alibi_slopes"]
    xp = namespace_of(VARLEN_CALL, q=q, k=k, v=v, grad_out=grad_out, grad_lse=grad_lse)
    require_packed(VARLEN_CALL, q=q, k=k, v=v)
    _check_upstream(xp, "grad_out", grad_out, (q.shape[0], q.shape[1], v.shape[2]), VARLEN_CALL)
    if grad_lse is not None:
        _check_upstream(xp, "grad_lse", grad_lse, (q.shape[1], q.shape[0]), VARLEN_CALL)
    starts_q, starts_k = paired_offsets(
        cu_seqlens_q, cu_seqlens_k, q, k, VARLEN_CALL, padding=False
    )

    parts: list[Gradients] = []
    for b in range(len(starts_q) - 1):
        queries = slice(starts_q[b], starts_q[b + 1])
        keys = slice(starts_k[b], starts_k[b + 1])
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.ndim == 2:
            slopes = alibi_slopes[b, ...]
        parts.append(
            scaled_dot_product_attention_backward(
                heads_first(xp, q[queries, ...]),
                heads_first(xp, k[keys, ...]),
                heads_first(xp, v[keys, ...]),
                heads_first(xp, grad_out[queries, ...]),
                **filled(CausalOptions, options),
                grad_lse=None if grad_lse is None else grad_lse[:, queries],
                softcap=options["softcap"],
                alibi_slopes=slopes,
            )
        )
    if not parts:
        return Gradients(xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v))
    return Gradients(
        xp.concat([heads_first(xp, part.dq) for part in parts], axis=0),
        xp.concat([heads_first(xp, part.dk) for part in parts], axis=0),
        xp.concat([heads_first(xp, part.dv) for part in parts], axis=0),
    )
