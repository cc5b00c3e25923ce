"""An independent NumPy oracle for BWD-18's comparison implementation (spec/backward.md):
automatic differentiation of FlashAttention's ``attention_ref(upcast=False,
reorder_ops=True)`` in a half-precision dtype, written as loops over batch elements, query
heads and rows from the steps the clause lists, each step in float32 and stored in float16
(``np.float16``), sharing nothing with ``attnspec.reference``; and the root-sum-squares of
BWD-18's floor in float64.

Inputs have full shapes: ``q (B, Hq, Lq, E)``, ``k (B, Hkv, Lk, E)``, ``v (B, Hkv, Lk, Ev)``,
``grad_out (B, Hq, Lq, Ev)``; ``allowed`` and ``bias`` ``(B, Hq, Lq, Lk)`` or None.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _stored(x: object) -> np.ndarray:
    """A float32 result stored in float16 and read back as float32."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def same_dtype_gradients(
    arrays: tuple[np.ndarray, ...],
    allowed: Any = None,
    bias: Any = None,
    softcap: Any = None,
    delta_from_output: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv, dbias) of the comparison implementation in float16 for ``arrays`` =
    (q, k, v, grad_out), the default scale, as float32 values; dbias at the full score shape.
    The delta term is sum_j p_j dp_j, or dO . o from the row's stored output o = p V where
    ``delta_from_output`` (the comparison's second form)."""
    q, k, v, grad_out = (a.astype(np.float32) for a in arrays)
    scale = None
    n_batch, n_q_heads, n_queries, dim = q.shape
    n_kv_heads, n_keys = k.shape[1], k.shape[2]
    group = n_q_heads // n_kv_heads
    alpha = 1.0 / math.sqrt(dim) if scale is None else scale
    dq = np.zeros(q.shape, np.float32)
    dk = np.zeros(k.shape, np.float32)
    dv = np.zeros(v.shape, np.float32)
    dbias = np.zeros((n_batch, n_q_heads, n_queries, n_keys), np.float32)
    for b in range(n_batch):
        dk_heads, dv_heads = [], []
        for h in range(n_q_heads):
            g = h // group
            k_scaled = _stored(k[b, g] * np.float32(alpha))
            grad_x = np.zeros((n_queries, n_keys), np.float32)
            for i in range(n_queries):
                s = _stored([np.dot(q[b, h, i], k_scaled[j]) for j in range(n_keys)])
                t = None
                if softcap is not None:
                    t = _stored(np.tanh(_stored(s / np.float32(softcap))))
                    s = _stored(t * np.float32(softcap))
                ok = np.ones(n_keys, bool) if allowed is None else allowed[b, h, i].copy()
                if bias is not None:
                    s = _stored(s + bias[b, h, i].astype(np.float32))
                ok &= s != -np.inf
                if not ok.any():
                    continue  # no key: zero weights, zero gradients
                top = s[ok].max()
                e = np.where(ok, np.exp(np.where(ok, s - top, 0)), 0).astype(np.float32)
                p = _stored(e / e.sum(dtype=np.float32))
                dp = _stored([np.dot(grad_out[b, h, i], v[b, g, j]) for j in range(n_keys)])
                if delta_from_output:
                    delta = np.dot(grad_out[b, h, i], _stored(p @ v[b, g]))
                else:
                    delta = np.dot(p, dp)
                ds = _stored(p * (dp - delta))
                dbias[b, h, i] = ds
                if t is not None:
                    ds = _stored(_stored(_stored(ds * np.float32(softcap)) * (1 - t * t)) / softcap)
                grad_x[i] = ds
                dq[b, h, i] = _stored(grad_x[i] @ k_scaled)
            dk_heads.append(_stored(_stored(grad_x.T @ q[b, h]) * np.float32(alpha)))
            dv_heads.append(_weights_t_grad(q, k_scaled, grad_out, b, h, allowed, bias, softcap))
        for g in range(n_kv_heads):
            members = range(g * group, (g + 1) * group)
            dk[b, g] = _stored(np.sum([dk_heads[h] for h in members], axis=0, dtype=np.float32))
            dv[b, g] = _stored(np.sum([dv_heads[h] for h in members], axis=0, dtype=np.float32))
    return dq, dk, dv, dbias


def _weights_t_grad(
    q: np.ndarray,
    k_scaled: np.ndarray,
    grad_out: np.ndarray,
    b: int,
    h: int,
    allowed: np.ndarray | None,
    bias: np.ndarray | None,
    softcap: float | None,
) -> np.ndarray:
    """dv' = P^T dO of one query head, stored, with P recomputed row by row as above."""
    n_queries, n_keys = q.shape[2], k_scaled.shape[0]
    weights = np.zeros((n_queries, n_keys), np.float32)
    for i in range(n_queries):
        s = _stored([np.dot(q[b, h, i], k_scaled[j]) for j in range(n_keys)])
        if softcap is not None:
            s = _stored(_stored(np.tanh(_stored(s / np.float32(softcap)))) * np.float32(softcap))
        ok = np.ones(n_keys, bool) if allowed is None else allowed[b, h, i].copy()
        if bias is not None:
            s = _stored(s + bias[b, h, i].astype(np.float32))
        ok &= s != -np.inf
        if ok.any():
            e = np.where(ok, np.exp(np.where(ok, s - s[ok].max(), 0)), 0).astype(np.float32)
            weights[i] = _stored(e / e.sum(dtype=np.float32))
    return _stored(weights.T @ grad_out[b, h])


def floor_roots(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    grad_out: np.ndarray,
    *,
    allowed: np.ndarray | None = None,
    scale: float | None = None,
) -> tuple[float, float, float]:
    """The largest root-sum-squares r^Q, r^K, r^V of BWD-18's floor, in float64 loops: the
    terms of dq, dk (each pair's weight times the magnitudes dP and D are summed from, times
    a key or query) and dv (a weight times an upstream gradient), each times float32's
    roundings of the term, E_v + 2 + |s_ij| + |lse_i|."""
    n_batch, n_q_heads, n_queries, dim = q.shape
    n_kv_heads, n_keys = k.shape[1], k.shape[2]
    group = n_q_heads // n_kv_heads
    alpha = abs(1.0 / math.sqrt(dim) if scale is None else scale)
    rq = np.zeros(q.shape)
    rk = np.zeros(k.shape)
    rv = np.zeros(v.shape)
    for b in range(n_batch):
        for h in range(n_q_heads):
            g = h // group
            for i in range(n_queries):
                s = (1.0 / math.sqrt(dim) if scale is None else scale) * (k[b, g] @ q[b, h, i])
                ok = np.ones(n_keys, bool) if allowed is None else allowed[b, h, i]
                if not ok.any():
                    continue
                e = np.where(ok, np.exp(np.where(ok, s - s[ok].max(), 0)), 0)
                p = e / e.sum()
                lse = s[ok].max() + math.log(e.sum())
                roundings = v.shape[-1] + 2 + np.abs(s) + abs(lse)
                out = p @ v[b, g]
                sizes = np.abs(v[b, g]) @ np.abs(grad_out[b, h, i])  # sum_c |dO_ic| |v_jc|
                terms = p * (sizes + float(np.abs(grad_out[b, h, i]) @ np.abs(out))) * roundings
                for j in range(n_keys):
                    rq[b, h, i] += (alpha * terms[j] * k[b, g, j]) ** 2
                    rk[b, g, j] += (alpha * terms[j] * q[b, h, i]) ** 2
                    rv[b, g, j] += (p[j] * roundings[j] * grad_out[b, h, i]) ** 2
    return tuple(float(np.sqrt(r.max())) for r in (rq, rk, rv))  # type: ignore[return-value]
