"""An independent float64 oracle for spec/linear.md, written from its text in plain NumPy.

Like ``oracle.py`` it shares no code with ``attnspec.reference``: the feature maps are
re-implemented, so a shared bug cannot cancel, and linear attention is the quadratic form of
LIN-1.2/LIN-2.1, the full ``Lq x Lk`` matrix ``A = phi(Q) psi(K)^T`` (which the reference
never builds), masked and row-normalised.
"""

from __future__ import annotations

import math

import numpy as np


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """LIN-4.1: elu(x) + 1."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def relu(x: np.ndarray) -> np.ndarray:
    """LIN-4.2: max(x, 0)."""
    return np.maximum(x, 0.0)


def favor(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """LIN-4.3 without stabiliser: m^-1/2 exp(-|x~|^2/2) exp(W x~), x~ = x / E^(1/4)."""
    scaled = x / x.shape[-1] ** 0.25
    exponent = scaled @ w.T - 0.5 * np.sum(scaled**2, axis=-1, keepdims=True)
    return np.exp(exponent) / math.sqrt(w.shape[0])


def quadratic_form(
    fq: np.ndarray,
    fk: np.ndarray,
    v: np.ndarray,
    *,
    alignment: str | None = None,
    eps: float = 0.0,
) -> np.ndarray:
    """LIN-1.2/LIN-2.1 as the masked, row-normalised quadratic form, query head h using
    key/value head h // G (SDPA-6.1); a zero denominator gives 0 (LIN-1.4)."""
    group = fq.shape[-3] // fk.shape[-3]
    fk, v = np.repeat(fk, group, axis=-3), np.repeat(v, group, axis=-3)
    a = fq @ np.swapaxes(fk, -1, -2)
    n_queries, n_keys = a.shape[-2:]
    if alignment is not None:
        offset = 0 if alignment == "top_left" else n_keys - n_queries
        rows, cols = np.arange(n_queries)[:, None], np.arange(n_keys)[None, :]
        a = a * (cols <= rows + offset)
    denominator = a.sum(axis=-1, keepdims=True) + eps
    numerator = a @ v
    safe = np.where(denominator == 0, 1.0, denominator)
    return np.where(denominator == 0, 0.0, numerator / safe)
