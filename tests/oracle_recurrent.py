"""An independent float64 oracle for spec/recurrent.md, written from its text in plain NumPy.

It shares no code with ``attnspec.reference.recurrent``: one batch element, one state head
and one token at a time, the state a ``dk x dv`` matrix updated exactly as REC-1.2 reads,
the head sharing of REC-3.1 done by index arithmetic per head.  Slow on purpose: it is only
ever run on small problems, as the comparison target of the reference's tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


def normalized(x: np.ndarray, eps: float) -> np.ndarray:
    """REC-2.4: x / sqrt(|x|^2 + eps) along the last axis; a zero vector with eps 0 is 0."""
    squares = np.sum(x * x, axis=-1, keepdims=True) + eps
    return np.divide(x, np.sqrt(squares), out=np.zeros_like(x), where=squares > 0)


@dataclass(frozen=True)
class Keywords:
    """A recurrent call's keywords with the spec's defaults: REC-1.2's rule, gate ``g``,
    strength ``beta``, scale and initial state, REC-2.4's normalisation of q and k.  The
    oracle writes them out itself, so that it depends on nothing of the reference it
    checks; making one of an unknown keyword is a TypeError that names it."""

    rule: str
    g: Any = None
    beta: Any = None
    scale: float | None = None
    initial_state: Any = None
    normalize_qk: bool = False
    norm_eps: float = 0.0


def _heads(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[int, ...]:
    """``(B, Hq, T, dk, Hk, Hv, dv, Hs, Ho)``: the state heads are the more of the key and
    value heads, the output heads the more of those and the query heads (REC-3.1)."""
    batch, h_q, length, d_k = q.shape
    h_k, h_v, d_v = k.shape[1], v.shape[1], v.shape[3]
    h_s = max(h_k, h_v)
    return batch, h_q, length, d_k, h_k, h_v, d_v, h_s, max(h_q, h_s)


def recurrence(q: Any, k: Any, v: Any, **keywords: Any) -> tuple[np.ndarray, np.ndarray]:
    """REC-1.2 for ``q (B, Hq, T, dk)``, ``k (B, Hk, T, dk)``, ``v (B, Hv, T, dv)``, ``g``
    ``(B, Hs, T)`` or ``(B, Hs, T, dk)``, ``beta (B, Hs, T)``, ``initial_state (B, Hs, dk,
    dv)``; returns ``(out (B, Ho, T, dv), final state (B, Hs, dk, dv))`` in float64."""
    call = Keywords(**keywords)
    rule, g, beta, initial_state = call.rule, call.g, call.beta, call.initial_state
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if call.normalize_qk:
        q, k = normalized(q, call.norm_eps), normalized(k, call.norm_eps)
    batch, h_q, length, d_k, h_k, h_v, d_v, h_s, h_o = _heads(q, k, v)
    alpha = 1.0 / math.sqrt(d_k) if call.scale is None else call.scale
    out = np.zeros((batch, h_o, length, d_v))
    final = np.zeros((batch, h_s, d_k, d_v))
    for b in range(batch):
        for s in range(h_s):
            key_head = s // (h_s // h_k)
            value_head = s // (h_s // h_v)
            state = np.zeros((d_k, d_v))
            if initial_state is not None:
                state = np.array(initial_state[b, s], dtype=np.float64)
            readers = [o for o in range(h_o) if o // (h_o // h_s) == s]
            for t in range(length):
                if rule in ("gated", "gated_delta"):
                    gate = np.asarray(g, dtype=np.float64)[b, s, t]
                    factors = np.exp(gate) * np.ones(d_k)  # per head: the same for every row
                    state = factors[:, None] * state
                key = k[b, key_head, t]
                value = v[b, value_head, t].copy()
                if rule in ("delta", "gated_delta"):
                    predicted = state.T @ key  # what the decayed state recalls for this key
                    value = float(np.asarray(beta)[b, s, t]) * (value - predicted)
                state = state + np.outer(key, value)
                for o in readers:
                    query = q[b, o // (h_o // h_q), t]
                    out[b, o, t] = alpha * (query @ state)
            final[b, s] = state
    return out, final


def _normalized_vjp(x: np.ndarray, grad: np.ndarray, eps: float) -> np.ndarray:
    """The chain rule through REC-2.4's x / sqrt(|x|^2 + eps), one vector at a time."""
    result = np.zeros_like(x)
    for index in np.ndindex(*x.shape[:-1]):
        n = math.sqrt(float(x[index] @ x[index]) + eps)
        if n > 0:
            y = x[index] / n
            result[index] = (grad[index] - y * float(y @ grad[index])) / n
    return result


def gradients(
    q: Any, k: Any, v: Any, grad_out: Any, *, grad_final_state: Any = None, **keywords: Any
) -> dict[str, np.ndarray]:
    """REC-7.1's gradients (``dq``, ``dk``, ``dv``, and ``dg``, ``dbeta``, ``dinitial_state``
    where those inputs are given) of :func:`recurrence` for the upstream gradients
    ``grad_out`` and ``grad_final_state``: the states of each head stored token by token,
    then the adjoint state carried back from the last token to the first, each head's
    contribution added into the input head it came from (REC-7.2)."""
    call = Keywords(**keywords)
    rule, g, beta, initial_state = call.rule, call.g, call.beta, call.initial_state
    normalize_qk, norm_eps = call.normalize_qk, call.norm_eps
    raw_q, raw_k = (np.asarray(a, dtype=np.float64) for a in (q, k))
    v = np.asarray(v, dtype=np.float64)
    q, k = (normalized(a, norm_eps) for a in (raw_q, raw_k)) if normalize_qk else (raw_q, raw_k)
    batch, h_q, length, d_k, h_k, h_v, d_v, h_s, h_o = _heads(q, k, v)
    alpha = 1.0 / math.sqrt(d_k) if call.scale is None else call.scale
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    grads = {"q": np.zeros_like(q), "k": np.zeros_like(k), "v": np.zeros_like(v)}
    if gated:
        grads["g"] = np.zeros(np.shape(g))
    if delta:
        grads["beta"] = np.zeros(np.shape(beta))
    if initial_state is not None:
        grads["initial_state"] = np.zeros(np.shape(initial_state))
    for b in range(batch):
        for s in range(h_s):
            key_head, value_head = s // (h_s // h_k), s // (h_s // h_v)
            readers = [o for o in range(h_o) if o // (h_o // h_s) == s]
            state = np.zeros((d_k, d_v))
            if initial_state is not None:
                state = np.array(initial_state[b, s], dtype=np.float64)
            factors, before, after = [], [], []  # per token: exp(g), S'_t, S_t
            for t in range(length):
                factor = np.ones(d_k)
                if gated:
                    factor = np.exp(np.asarray(g, dtype=np.float64)[b, s, t]) * np.ones(d_k)
                state = factor[:, None] * state
                factors.append(factor)
                before.append(state)
                value = v[b, value_head, t]
                if delta:
                    value = float(beta[b, s, t]) * (value - state.T @ k[b, key_head, t])
                state = state + np.outer(k[b, key_head, t], value)
                after.append(state)
            adjoint = np.zeros((d_k, d_v))  # the gradient of the state after token t
            if grad_final_state is not None:
                adjoint = np.array(grad_final_state[b, s], dtype=np.float64)
            for t in reversed(range(length)):
                key = k[b, key_head, t]
                for o in readers:
                    upstream = grad_out[b, o, t]
                    grads["q"][b, o // (h_o // h_q), t] += alpha * (after[t] @ upstream)
                    adjoint = adjoint + alpha * np.outer(q[b, o // (h_o // h_q), t], upstream)
                recalled = key @ adjoint  # what the update's gradient is, per value channel
                if delta:
                    strength = float(beta[b, s, t])
                    residual = v[b, value_head, t] - before[t].T @ key
                    update = strength * residual
                    grads["v"][b, value_head, t] += strength * recalled
                    grads["beta"][b, s, t] += float(recalled @ residual)
                    grads["k"][b, key_head, t] += adjoint @ update - strength * before[t] @ recalled
                    adjoint = adjoint - strength * np.outer(key, recalled)
                else:
                    grads["v"][b, value_head, t] += recalled
                    grads["k"][b, key_head, t] += adjoint @ v[b, value_head, t]
                if gated:
                    per_row = np.sum(adjoint * before[t], axis=1)
                    if np.ndim(g) == 4:
                        grads["g"][b, s, t] += per_row
                    else:
                        grads["g"][b, s, t] += per_row.sum()
                adjoint = factors[t][:, None] * adjoint
            if initial_state is not None:
                grads["initial_state"][b, s] = adjoint
    if normalize_qk:
        grads["q"] = _normalized_vjp(raw_q, grads["q"], norm_eps)
        grads["k"] = _normalized_vjp(raw_k, grads["k"], norm_eps)
    return grads
