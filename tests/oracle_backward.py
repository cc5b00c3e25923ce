"""An independent float64 oracle for the gradients of spec/backward.md: plain NumPy loops
over batch elements, query heads and query rows, written from the chain rule, sharing
nothing with ``attnspec.reference``.

Inputs have full shapes: ``q (B, Hq, Lq, E)``, ``k (B, Hkv, Lk, E)``, ``v (B, Hkv, Lk, Ev)``,
``grad_out (B, Hq, Lq, Ev)``; ``allowed``, ``bias`` and ``keep`` ``(B, Hq, Lq, Lk)`` or None;
``grad_lse (B, Hq, Lq)`` or None.
"""

from __future__ import annotations

import math

import numpy as np


def gradients(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    grad_out: np.ndarray,
    *,
    allowed: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    keep: np.ndarray | None = None,
    dropout_p: float = 0.0,
    grad_lse: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv, dbias) of BWD-1 row by row; dbias at the full score shape."""
    n_batch, n_q_heads, n_queries, dim = q.shape
    n_kv_heads, n_keys = k.shape[1], k.shape[2]
    group = n_q_heads // n_kv_heads
    alpha = 1.0 / math.sqrt(dim) if scale is None else scale
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dbias = np.zeros((n_batch, n_q_heads, n_queries, n_keys))
    for b in range(n_batch):
        for h in range(n_q_heads):
            g = h // group  # SDPA-6.1
            for i in range(n_queries):
                x = np.array([alpha * float(np.dot(q[b, h, i], k[b, g, j])) for j in range(n_keys)])
                capped = x if softcap is None else softcap * np.tanh(x / softcap)
                s = capped + (0.0 if bias is None else bias[b, h, i])
                ok = s != -np.inf  # a bias of -inf excludes the key (SDPA-3.3)
                if allowed is not None:
                    ok &= allowed[b, h, i]
                if not ok.any():
                    continue  # an empty row: no gradient at all (BWD-4)
                top = s[ok].max()
                e = np.where(ok, np.exp(np.where(ok, s - top, 0.0)), 0.0)
                p = e / e.sum()
                factor = np.ones(n_keys) if keep is None else keep[b, h, i] / (1 - dropout_p)
                dp = np.array(
                    [
                        factor[j] * float(np.dot(grad_out[b, h, i], v[b, g, j]))
                        for j in range(n_keys)
                    ]
                )
                delta = float(np.sum(p * dp))
                extra = 0.0 if grad_lse is None else float(grad_lse[b, h, i])
                ds = np.where(ok, p * (dp - delta + extra), 0.0)
                dx = ds if softcap is None else ds * (1 - np.tanh(x / softcap) ** 2)
                dbias[b, h, i] = ds
                for j in range(n_keys):
                    if not ok[j]:
                        continue
                    dq[b, h, i] += alpha * dx[j] * k[b, g, j]
                    dk[b, g, j] += alpha * dx[j] * q[b, h, i]
                    dv[b, g, j] += factor[j] * p[j] * grad_out[b, h, i]
    return dq, dk, dv, dbias
