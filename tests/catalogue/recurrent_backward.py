"""Backward passes of the gated delta rule (spec/recurrent.md, REC-7) as kernel authors
write them, in PyTorch float32: correct formulations and the bugs of hand-written
backward kernels, one step wrong each, all with the same correct forward pass.

Every kernel is ``fn(q, k, v, *, g, beta, initial_state)`` -> ``(out, final_state)`` in the
layout of REC-1.1, computing in float32, declared ``--recurrent gated_delta
--recurrent-chunk-size 16 --gqa --backward``.  The correct ones: ``torch.autograd`` of a
token-by-token loop written here, of the reference's chunked form (chunks of 16), and a
custom ``torch.autograd.Function`` whose backward is :func:`adjoint_backward`, the adjoint
recurrence written here independently of ``attnspec.reference``; the same Function with one
``bug`` of :data:`BUGS` is each buggy kernel.  Also one correct kernel with an explicit
backward function in REC-7's convention (``--backward-fn``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from attnspec.conformance import RecurrentClaim, declare
from attnspec.reference.recurrent import recurrent_attention

CHUNK = 16


class GradientBug(NamedTuple):
    name: str
    what: str  # the step done wrong, and where such a bug was seen


BUGS = (
    GradientBug("dg_missing_correction", "dg from the adjoint before the delta correction's term"),
    GradientBug("past_state_gradient_dropped", "no gradient for the initial state (dh0 = 0)"),
    GradientBug("final_state_gradient_ignored", "the final state's upstream gradient (dht) unused"),
    GradientBug("dbeta_sign", "dbeta with its sign flipped"),
    GradientBug(
        "decay_gradient_on_undecayed_state", "dg taken against S_{t-1}, not the decayed S'_t"
    ),
    GradientBug(
        "query_group_not_summed", "a shared state's adjoint from its first query head only"
    ),
    GradientBug("last_partial_chunk_dropped", "a chunked backward over full chunks of 16 only"),
    GradientBug("dk_missing_correction", "dk without the read of the decayed state, -beta S' w"),
)


def _shared(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any, int]:
    """k and v repeated to the states, q to the output heads (REC-3.1), and the groups."""
    states = max(k.shape[-3], v.shape[-3])
    outputs = max(q.shape[-3], states)
    k = k.repeat_interleave(states // k.shape[-3], dim=-3)
    v = v.repeat_interleave(states // v.shape[-3], dim=-3)
    return q.repeat_interleave(outputs // q.shape[-3], dim=-3), k, v, outputs // states


def token_forward(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any) -> Any:
    """REC-1.2 for the gated delta rule, token by token, in float32; differentiable."""
    dtype = q.dtype
    q, k, v, groups = _shared(*(a.float() for a in (q, k, v)))
    g, beta = g.float(), beta.float()
    state = initial_state.float()
    scale = 1 / math.sqrt(q.shape[-1])
    outs = []
    for t in range(k.shape[-2]):
        state = torch.exp(g[..., t])[..., None, None] * state
        key = k[..., t, :]
        read = (key[..., None, :] @ state)[..., 0, :]
        update = beta[..., t, None] * (v[..., t, :] - read)
        state = state + key[..., :, None] * update[..., None, :]
        queries = q[..., t, :].unflatten(-2, (-1, groups))  # (B, Hs, G, dk)
        outs.append(scale * (queries @ state))
    if not outs:
        out = q.new_zeros((*q.shape[:-1], v.shape[-1]))
    else:
        out = torch.stack(outs, dim=-2).flatten(-4, -3)  # (B, Hs, G, T, dv) -> (B, Ho, T, dv)
    return out.to(dtype), state


def adjoint_backward(
    q: Any, k: Any, v: Any, g: Any, beta: Any, s0: Any, d_out: Any, d_final: Any, bug: str = ""
) -> tuple[Any, ...]:
    """REC-7.1 by hand: the states kept, then the adjoint carried from the last token to the
    first, in float32; ``bug`` one of :data:`BUGS`' names (empty: correct)."""
    h_q, h_k = q.shape[-3], k.shape[-3]
    qs, ks, vs, groups = _shared(*(a.float() for a in (q, k, v)))
    g, beta, d_out = g.float(), beta.float(), d_out.float()
    scale = 1 / math.sqrt(q.shape[-1])
    length = ks.shape[-2]
    states, decayed = [s0.float()], []
    for t in range(length):
        decayed.append(torch.exp(g[..., t])[..., None, None] * states[-1])
        read = (ks[..., t, None, :] @ decayed[-1])[..., 0, :]
        update = beta[..., t, None] * (vs[..., t, :] - read)
        states.append(decayed[-1] + ks[..., t, :, None] * update[..., None, :])
    dq, dk, dv = torch.zeros_like(qs), torch.zeros_like(ks), torch.zeros_like(vs)
    dg, dbeta = torch.zeros_like(g), torch.zeros_like(beta)
    adjoint = (
        torch.zeros_like(s0.float()) if bug == "final_state_gradient_ignored" else d_final.float()
    )
    stop = length - length % CHUNK if bug == "last_partial_chunk_dropped" else length
    for t in range(stop - 1, -1, -1):
        queries = qs[..., t, :].unflatten(-2, (-1, groups))  # (B, Hs, G, dk)
        upstream = d_out[..., t, :].unflatten(-2, (-1, groups))
        dq[..., t, :] = scale * (upstream @ states[t + 1].transpose(-1, -2)).flatten(-3, -2)
        if bug == "query_group_not_summed":
            queries, upstream = queries[..., :1, :], upstream[..., :1, :]
        adjoint = adjoint + scale * queries.transpose(-1, -2) @ upstream
        key = ks[..., t, :]
        w = (key[..., None, :] @ adjoint)[..., 0, :]
        residual = vs[..., t, :] - (key[..., None, :] @ decayed[t])[..., 0, :]
        update = beta[..., t, None] * residual
        dv[..., t, :] = beta[..., t, None] * w
        dbeta[..., t] = (w * residual).sum(-1) * (-1 if bug == "dbeta_sign" else 1)
        dk[..., t, :] = (adjoint @ update[..., :, None])[..., 0]
        if bug != "dk_missing_correction":
            dk[..., t, :] -= (decayed[t] @ dv[..., t, :, None])[..., 0]
        corrected = adjoint - key[..., :, None] * dv[..., t, None, :]
        against = states[t] if bug == "decay_gradient_on_undecayed_state" else decayed[t]
        dg[..., t] = ((adjoint if bug == "dg_missing_correction" else corrected) * against).sum(
            (-1, -2)
        )
        adjoint = torch.exp(g[..., t])[..., None, None] * corrected
    d_state = torch.zeros_like(adjoint) if bug == "past_state_gradient_dropped" else adjoint
    dq = dq.unflatten(-3, (h_q, -1)).sum(-3)
    dk = dk.unflatten(-3, (h_k, -1)).sum(-3)
    dv = dv.unflatten(-3, (v.shape[-3], -1)).sum(-3)
    return (
        dq.to(q.dtype),
        dk.to(k.dtype),
        dv.to(v.dtype),
        dg.to(g.dtype),
        dbeta.to(beta.dtype),
        d_state.to(s0.dtype),
    )


class _WithBackward(torch.autograd.Function):
    """Forward: :func:`token_forward`; backward: :func:`adjoint_backward` with a bug."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, s0: Any, bug: str) -> Any:
        ctx.save_for_backward(q, k, v, g, beta, s0)
        ctx.bug = bug
        with torch.no_grad():
            return token_forward(q, k, v, g, beta, s0)

    @staticmethod
    def backward(ctx: Any, d_out: Any, d_final: Any) -> Any:  # type: ignore[override]
        grads = adjoint_backward(*ctx.saved_tensors, d_out, d_final, bug=ctx.bug)
        return (*grads, None)


def _claimed(fn: Callable[..., Any], name: str, **claims: Any) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    claim = RecurrentClaim("gated_delta", chunk_size=CHUNK)
    return declare(fn, recurrent=claim, gqa=True, dtypes=("float32",), backward=True, **claims)


def _state(q: Any, k: Any, v: Any, initial_state: Any) -> Any:
    if initial_state is not None:
        return initial_state
    states = max(k.shape[-3], v.shape[-3])
    return q.new_zeros((q.shape[0], states, q.shape[-1], v.shape[-1]), dtype=torch.float32)


def with_adjoint(bug: str, name: str) -> Callable[..., Any]:
    """A declared kernel whose backward is :func:`adjoint_backward` with ``bug``."""

    def kernel(q: Any, k: Any, v: Any, *, g: Any, beta: Any, initial_state: Any = None) -> Any:
        return _WithBackward.apply(q, k, v, g, beta, _state(q, k, v, initial_state), bug)

    return _claimed(kernel, name)


def _autograd_token(q: Any, k: Any, v: Any, *, g: Any, beta: Any, initial_state: Any = None) -> Any:
    return token_forward(q, k, v, g, beta, _state(q, k, v, initial_state))


def _autograd_chunked(
    q: Any, k: Any, v: Any, *, g: Any, beta: Any, initial_state: Any = None
) -> Any:
    result = recurrent_attention(
        q, k, v, g=g, beta=beta, initial_state=initial_state, chunk_size=CHUNK
    )
    return result.out, result.final_state


def _forward_only(q: Any, k: Any, v: Any, *, g: Any, beta: Any, initial_state: Any = None) -> Any:
    with torch.no_grad():
        return token_forward(q, k, v, g, beta, _state(q, k, v, initial_state))


def explicit_backward(
    d_out: Any, d_final: Any, q: Any, k: Any, v: Any, out: Any, final: Any, **keywords: Any
) -> tuple[Any, ...]:
    """REC-7's explicit convention: ``bwd(d_out, d_final_state, q, k, v, out, final_state,
    g=, beta=, initial_state=) -> (dq, dk, dv, dg, dbeta, d_initial_state)``."""
    del out, final  # recomputed from the inputs
    s0 = _state(q, k, v, keywords.get("initial_state"))
    return adjoint_backward(q, k, v, keywords["g"], keywords["beta"], s0, d_out, d_final)


autograd_token = _claimed(_autograd_token, "autograd_token")
autograd_chunked = _claimed(_autograd_chunked, "autograd_chunked")
adjoint = with_adjoint("", "adjoint")
explicit = _claimed(
    _forward_only, "explicit", backward_fn="catalogue.recurrent_backward:explicit_backward"
)
CORRECT = (autograd_token, autograd_chunked, adjoint, explicit)
BUGGY = {bug.name: with_adjoint(bug.name, f"adjoint_{bug.name}") for bug in BUGS}
globals().update({fn.__name__: fn for fn in BUGGY.values()})
