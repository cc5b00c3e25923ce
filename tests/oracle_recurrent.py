"""An independent float64 oracle for spec/recurrent.md, written from its text in plain NumPy.

It shares no code with ``attnspec.reference.recurrent``: one batch element, one state head
and one token at a time, the state a ``dk x dv`` matrix updated exactly as REC-1.2 reads,
the head sharing of REC-3.1 done by index arithmetic per head.  Slow on purpose: it is only
ever run on small problems, as the comparison target of the reference's tests.
"""

from __future__ import annotations

import math

import numpy as np


def normalized(x: np.ndarray, eps: float) -> np.ndarray:
    """REC-2.4: x / sqrt(|x|^2 + eps) along the last axis; a zero vector with eps 0 is 0."""
    squares = np.sum(x * x, axis=-1, keepdims=True) + eps
    return np.divide(x, np.sqrt(squares), out=np.zeros_like(x), where=squares > 0)


def recurrence(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    rule: str,
    g: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    scale: float | None = None,
    initial_state: np.ndarray | None = None,
    normalize_qk: bool = False,
    norm_eps: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """REC-1.2 for ``q (B, Hq, T, dk)``, ``k (B, Hk, T, dk)``, ``v (B, Hv, T, dv)``, ``g``
    ``(B, Hs, T)`` or ``(B, Hs, T, dk)``, ``beta (B, Hs, T)``, ``initial_state (B, Hs, dk,
    dv)``; returns ``(out (B, Ho, T, dv), final state (B, Hs, dk, dv))`` in float64."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if normalize_qk:
        q, k = normalized(q, norm_eps), normalized(k, norm_eps)
    batch, h_q, length, d_k = q.shape
    h_k, h_v, d_v = k.shape[1], v.shape[1], v.shape[3]
    h_s = max(h_k, h_v)
    h_o = max(h_q, h_s)
    alpha = 1.0 / math.sqrt(d_k) if scale is None else scale
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
