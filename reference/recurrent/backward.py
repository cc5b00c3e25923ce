"""The gradients of the recurrences of spec/recurrent.md (REC-7): their vector-Jacobian
product, the adjoint recurrence run backwards over the tokens.

With ``P_t`` the gradient of the loss with respect to the state after token ``t`` (the
upstream gradient of the final state for ``t = T - 1``), each token, from the last to the
first, adds its output's term ``scale * sum_h q_t^h (dO_t^h)^T`` (the output heads that read
the state) to ``P_t`` and then, with ``w_t = P_t^T k_t``, ``S'_t``, ``u_t`` and the residual
``v_t - S'^T_t k_t`` of :func:`~.definition.token_step`:

* ``dq_t^h = scale * S_t dO_t^h``;
* ``dk_t = P_t u_t - beta_t S'_t w_t`` (the second term for the delta rules only);
* ``dv_t = beta_t w_t`` (``w_t`` without a correction), ``dbeta_t = w_t . (v_t - S'^T_t k_t)``;
* ``D_t = P_t - beta_t k_t w_t^T``, the gradient of the decayed state ``S'_t``;
* ``dg_{t,i} = sum_c D_t,ic S'_t,ic`` (per key channel; summed over ``i`` for a per-head gate);
* ``P_{t-1} = diag(exp(g_t)) D_t``, and the past state's gradient is ``P_{-1}``.

Then shared heads sum their gradients (REC-3.1) and normalised q and k (REC-2.4) pass
through the normalisation's Jacobian.  :func:`recurrent_attention_backward` keeps every
state of the forward pass, or, with ``chunk_size``, only the state at the start of each
chunk, recomputing a chunk's states from it when the backward pass reaches the chunk (as
chunked kernels recompute their per-chunk states): memory ``O((T / c + c) dk dv)`` per head.
Pure Array API, on every array library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .._array import Array
from .._checks import namespace_of
from ..varlen import sequence_offsets
from ._inputs import (
    GradientInputs,
    Recurrence,
    check_chunk_size,
    optional_arrays,
    prepare_for_gradients,
    shows_gradient_inputs,
    split_gradient_inputs,
)
from .definition import Token, token_step

if TYPE_CHECKING:
    from typing import Unpack

CALL = "recurrent_attention_backward(q, k, v, grad_out)"
VARLEN_CALL = "varlen_recurrent_attention_backward(q, k, v, cu_seqlens, grad_out)"


class RecurrentGradients(NamedTuple):
    """The gradients of REC-7.1, each of its input's shape and dtype (REC-7.3): ``dg``,
    ``dbeta`` and ``dinitial_state`` are None where ``g``, ``beta`` or ``initial_state``
    was not given."""

    dq: Array
    dk: Array
    dv: Array
    dg: Array | None
    dbeta: Array | None
    dinitial_state: Array | None


class Adjoint(NamedTuple):
    """Token ``t``'s backward step for every state head: ``total`` is ``P_t`` (its output's
    term included), ``read`` ``w_t = P_t^T k_t``, ``decayed`` ``D_t``; the gradients of
    token ``t``'s inputs in computation form (``dq (..., Hs, G, dk)``, ``dg (..., Hs, 1 or
    dk)``; ``dbeta`` None without a correction)."""

    total: Array
    read: Array
    decayed: Array
    dq: Array
    dk: Array
    dv: Array
    dg: Array
    dbeta: Array | None


def adjoint_step(
    p: Recurrence, token: Token, grad_state: Array, grad_out: Array, t: int
) -> Adjoint:
    """REC-7.1 for token ``t``: ``grad_state`` is ``P_t`` without token ``t``'s output term
    (the gradient flowing back from token ``t + 1``), ``grad_out (..., Hs, G, dv)`` the
    upstream gradient of token ``t``'s outputs."""
    xp = p.xp
    queries, key = p.q[..., t, :], p.k[..., t, :]
    total = grad_state + p.scale * xp.matmul(xp.matrix_transpose(queries), grad_out)
    dq = p.scale * xp.matmul(grad_out, xp.matrix_transpose(token.state))
    read = xp.matmul(key[..., None, :], total)[..., 0, :]  # w_t = P_t^T k_t, (..., Hs, dv)
    dk = xp.matmul(total, token.update[..., :, None])[..., 0]
    decayed, dv, dbeta = total, read, None
    if p.beta is not None and token.residual is not None:
        strength = p.beta[..., t, None]
        dv = strength * read
        dbeta = xp.sum(read * token.residual, axis=-1)
        dk = dk - xp.matmul(token.decayed, dv[..., :, None])[..., 0]
        decayed = total - key[..., :, None] * dv[..., None, :]
    dg = xp.sum(decayed * token.decayed, axis=-1)  # (..., Hs, dk)
    if int(p.log_decay.shape[-1]) == 1:
        dg = xp.sum(dg, axis=-1, keepdims=True)
    return Adjoint(total, read, decayed, dq, dk, dv, dg, dbeta)


def _states_from(p: Recurrence, state: Array, start: int, stop: int) -> list[Array]:
    """The states ``S_{start-1}, ..., S_{stop-2}`` from ``state = S_{start-1}``: the state
    each of tokens ``start .. stop - 1`` starts from."""
    states = [state]
    for t in range(start, stop - 1):
        states.append(token_step(p, states[-1], t).state)
    return states


def _adjoint(p: Recurrence, grad_out: Array, grad_final: Array, chunk: int) -> tuple[Any, ...]:
    """The per-token gradients in computation form (lists over t) and ``P_{-1}``."""
    xp, length = p.xp, p.length
    starts = list(range(0, length, chunk))
    saved, state = [], p.state  # the state at the start of each chunk
    for start in starts:
        saved.append(state)
        for t in range(start, min(start + chunk, length)):
            state = token_step(p, state, t).state
    per_token: list[list[Array]] = [[] for _ in range(5)]  # dq, dk, dv, dg, dbeta
    adjoint = grad_final
    for start, first in zip(reversed(starts), reversed(saved), strict=True):
        stop = min(start + chunk, length)
        states = _states_from(p, first, start, stop)
        for t in range(stop - 1, start - 1, -1):
            token = token_step(p, states[t - start], t)
            step = adjoint_step(p, token, adjoint, grad_out[..., t, :], t)
            adjoint = token.decay[..., :, None] * step.decayed
            dbeta = xp.zeros_like(step.dg[..., 0]) if step.dbeta is None else step.dbeta
            for found, value in zip(per_token[:4], step[3:7], strict=True):
                found.append(value[..., None, :])  # a token axis before the last
            per_token[4].append(dbeta[..., None])
    likes = (p.q, p.k, p.v, p.log_decay, p.log_decay[..., 0])
    stacked = []
    for n, (found, like) in enumerate(zip(per_token, likes, strict=True)):
        found.reverse()
        stacked.append(
            xp.concat(found, axis=-1 if n == 4 else -2) if found else xp.zeros_like(like)
        )
    return (*stacked, adjoint)


def _unshare(xp: Any, a: Array, heads: int, axis: int = -3) -> Array:
    """The sum over the copies REC-3.1's sharing made of each of ``heads`` heads (copies
    of a head are adjacent: head ``h`` of the shared array is head ``h // r`` of the input)."""
    shape = tuple(a.shape)
    have = shape[axis]
    if have == heads:
        return a
    at = axis % len(shape)
    grouped = xp.reshape(a, (*shape[:at], heads, have // heads, *shape[at + 1 :]))
    return xp.sum(grouped, axis=at + 1)


def _normalization_vjp(xp: Any, x: Array, grad: Array, eps: float) -> Array:
    """The gradient of ``x`` through ``x / sqrt(|x|^2 + eps)`` (REC-2.4): ``(dx^ - x^ (x^ .
    dx^)) / n``; 0 where ``|x|^2 + eps = 0`` (the zero vector, kept zero)."""
    squared = xp.sum(x * x, axis=-1, keepdims=True) + eps
    zero = squared == 0
    norm = xp.sqrt(xp.where(zero, xp.ones_like(squared), squared))
    unit = x / norm
    dx = (grad - unit * xp.sum(unit * grad, axis=-1, keepdims=True)) / norm
    return xp.where(zero, xp.zeros_like(dx), dx)


def _upstream(xp: Any, name: str, a: Array, shape: tuple[int, ...], dtype: Any) -> Array:
    if not xp.isdtype(a.dtype, "real floating"):
        raise TypeError(
            f"{name}.dtype={a.dtype}, but should be a real floating dtype [REC-7.1, {CALL}]"
        )
    if tuple(int(n) for n in a.shape) != shape:
        raise ValueError(
            f"{name}.shape={tuple(a.shape)}, but should be {shape}, the shape of the "
            f"{'output' if name == 'grad_out' else 'final state'} [REC-7.1, {CALL}]"
        )
    return xp.astype(a, dtype)


@shows_gradient_inputs
def recurrent_attention_backward(
    q: Array,
    k: Array,
    v: Array,
    grad_out: Array,
    *,
    chunk_size: int | None = None,
    **inputs: Unpack[GradientInputs],
) -> RecurrentGradients:
    """The vector-Jacobian product of :func:`~attnspec.reference.recurrent.recurrent_attention`
    (REC-7.1) for the upstream gradients ``grad_out (..., Ho, T, dv)`` of the output and
    ``grad_final_state (..., Hs, dk, dv)`` of the final state (zeros when None).  Arguments
    otherwise as the forward call's; ``chunk_size`` keeps only each chunk's starting state
    and recomputes the others (the same gradients, less memory).  Computed in float64 when
    any input or upstream gradient is, else float32 (REC-7.3)."""
    forward, grad_final_state = split_gradient_inputs(inputs)
    g, beta, initial_state = optional_arrays(forward)
    xp = namespace_of(
        CALL,
        q=q,
        k=k,
        v=v,
        grad_out=grad_out,
        g=g,
        beta=beta,
        initial_state=initial_state,
        grad_final_state=grad_final_state,
    )
    wide = any(a is not None and a.dtype == xp.float64 for a in (grad_out, grad_final_state))
    work_q = xp.astype(q, xp.float64) if wide else q  # float64 upstream: float64 throughout
    p, raw, eps = prepare_for_gradients(work_q, k, v, CALL, **forward)
    chunk = (p.length or 1) if chunk_size is None else check_chunk_size(chunk_size, CALL)
    batch, (states, groups, length, d_k), d_v = p.q.shape[:-4], p.q.shape[-4:], p.v.shape[-1]
    dtype = p.q.dtype
    out_shape = tuple(int(n) for n in (*batch, states * groups, length, d_v))
    upstream = _upstream(xp, "grad_out", grad_out, out_shape, dtype)
    upstream = xp.reshape(upstream, (*batch, states, groups, length, d_v))
    state_shape = tuple(int(n) for n in p.state.shape)
    final = (
        xp.zeros_like(p.state)
        if grad_final_state is None
        else _upstream(xp, "grad_final_state", grad_final_state, state_shape, dtype)
    )
    dq, dk, dv, dg, dbeta, d_initial = _adjoint(p, upstream, final, chunk)
    if raw is not None:
        dq, dk = _normalization_vjp(xp, raw[0], dq, eps), _normalization_vjp(xp, raw[1], dk, eps)
    dq = xp.reshape(dq, (*batch, states * groups, length, d_k))
    dq = _unshare(xp, dq, int(q.shape[-3]))
    dk, dv = _unshare(xp, dk, int(k.shape[-3])), _unshare(xp, dv, int(v.shape[-3]))
    if g is not None and g.ndim == dg.ndim - 1:
        dg = dg[..., 0]
    return RecurrentGradients(
        xp.astype(dq, q.dtype),
        xp.astype(dk, k.dtype),
        xp.astype(dv, v.dtype),
        None if g is None else xp.astype(dg, g.dtype),
        None if beta is None else xp.astype(dbeta, beta.dtype),
        None if initial_state is None else xp.astype(d_initial, initial_state.dtype),
    )


@shows_gradient_inputs
def varlen_recurrent_attention_backward(
    q: Array, k: Array, v: Array, cu_seqlens: Any, grad_out: Array, **inputs: Unpack[GradientInputs]
) -> RecurrentGradients:
    """The gradients of :func:`~attnspec.reference.recurrent.varlen_recurrent_attention`
    (REC-7.4): packed, tokens-first arrays as there, ``grad_out (T, Ho, dv)`` and
    ``grad_final_state (N, Hs, dk, dv)``; sequence ``b``'s gradients are
    :func:`recurrent_attention_backward` of its own tokens, so no gradient crosses a
    boundary and an empty sequence's past state gets its final state's gradient."""
    xp = namespace_of(VARLEN_CALL, q=q, k=k, v=v, grad_out=grad_out)
    forward, grad_final_state = split_gradient_inputs(inputs)
    g, beta, initial_state = optional_arrays(forward)
    for name, a in (("q", q), ("k", k), ("v", v), ("grad_out", grad_out)):
        if a.ndim != 3 or a.shape[0] != q.shape[0]:
            raise ValueError(
                f"{name}.shape={tuple(a.shape)}, but should be (T, heads, head_dim) with q's "
                f"{q.shape[0]} packed tokens [REC-7.4, {VARLEN_CALL}]"
            )
    offsets = sequence_offsets(cu_seqlens, "cu_seqlens", int(q.shape[0]), VARLEN_CALL)
    for name, a in (("initial_state", initial_state), ("grad_final_state", grad_final_state)):
        if a is not None and (a.ndim != 4 or a.shape[0] != len(offsets) - 1):
            raise ValueError(
                f"{name}.shape={tuple(a.shape)}, but should be (N, Hs, dk, dv) with N = "
                f"{len(offsets) - 1} sequences [REC-7.4, {VARLEN_CALL}]"
            )

    def heads_first(a: Array, start: int, stop: int) -> Array:
        return xp.permute_dims(a[start:stop, ...], (1, 0, *range(2, a.ndim)))

    def tokens_first(a: Array) -> Array:
        return xp.permute_dims(a, (1, 0, *range(2, a.ndim)))

    parts = []
    for b, start in enumerate(offsets[:-1]):
        stop = offsets[b + 1]
        own: GradientInputs = {
            **forward,
            "g": None if g is None else heads_first(g, start, stop),
            "beta": None if beta is None else heads_first(beta, start, stop),
            "initial_state": None if initial_state is None else initial_state[b, ...],
            "grad_final_state": None if grad_final_state is None else grad_final_state[b, ...],
        }
        parts.append(
            recurrent_attention_backward(
                *(heads_first(a, start, stop) for a in (q, k, v, grad_out)), **own
            )
        )
    if not parts:
        raise ValueError(f"cu_seqlens has no sequence [REC-3.3, {VARLEN_CALL}]")
    joined = [
        None
        if parts[0][n] is None
        else xp.concat([tokens_first(part[n]) for part in parts], axis=0)
        for n in range(5)
    ]
    states = None if initial_state is None else xp.stack([part[5] for part in parts], axis=0)
    return RecurrentGradients(joined[0], joined[1], joined[2], joined[3], joined[4], states)
