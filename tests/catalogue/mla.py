"""Absorbed multi-head latent attention (MLA-1 … MLA-3) in NumPy at DeepSeek V3's sizes
(latent width 512, rotary part 64): a correct kernel and the bugs MLA ports had.

Every kernel is ``fn(q (..., Hq, Lq, 576), kv (..., 1, Lk, 576), *, scale, is_causal=False)``
-> ``(..., Hq, Lq, 512)``, bottom-right causal, accumulating in float32 for float16.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from attnspec.conformance import MlaClaim, declare

from .entry import CaughtBug

Array = np.ndarray
RANK = 512
CLAIMS = dict(mla=MlaClaim(), causal_alignment="bottom_right")


def _mla(
    q: Array, kv: Array, scale: float, is_causal: bool, values: Callable[[Array], Array]
) -> Array:
    work = np.float32 if q.dtype == np.float16 else q.dtype.type
    k = kv.astype(work)
    scores = (q.astype(work) @ np.swapaxes(k, -1, -2)) * work(scale)
    n_queries, n_keys = scores.shape[-2:]
    if is_causal:
        allowed = np.arange(n_keys)[None, :] <= np.arange(n_queries)[:, None] + n_keys - n_queries
        scores = np.where(allowed, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    exps = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = exps.sum(-1, keepdims=True)
    out = (exps @ values(k)) / np.where(total == 0, 1, total)
    return out.astype(q.dtype)


@declare(**CLAIMS)
def mla_absorbed(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Keys the latent cache, values its first 512 channels, the given scale."""
    return _mla(q, kv, scale, is_causal, lambda k: k[..., :RANK])


CORRECT = (mla_absorbed,)


@declare(**CLAIMS)
def mla_default_scale(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Bug: the kernel's own 1/sqrt(576) instead of the model's scale (MLA-2)."""
    return _mla(q, kv, q.shape[-1] ** -0.5, is_causal, lambda k: k[..., :RANK])


@declare(**CLAIMS)
def mla_values_from_the_end(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Bug: the values read as the last 512 channels, the rotary part among them."""
    return _mla(q, kv, scale, is_causal, lambda k: k[..., -RANK:])


@declare(**CLAIMS)
def mla_top_left(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Bug: causal rows aligned top-left, so speculative decoding's rows miss the newest
    latent positions."""
    work = np.float32 if q.dtype == np.float16 else q.dtype.type
    n_queries, n_keys = q.shape[-2], kv.shape[-2]
    if not is_causal or n_queries == n_keys:
        return _mla(q, kv, scale, is_causal, lambda k: k[..., :RANK])
    k = kv.astype(work)
    scores = (q.astype(work) @ np.swapaxes(k, -1, -2)) * work(scale)
    scores = np.where(np.tril(np.ones((n_queries, n_keys), bool)), scores, -np.inf)
    exps = np.exp(scores - scores.max(-1, keepdims=True))
    return ((exps @ k[..., :RANK]) / exps.sum(-1, keepdims=True)).astype(q.dtype)


BUGS = (
    CaughtBug(mla_default_scale, "mla-matches-reference"),
    CaughtBug(mla_values_from_the_end, "mla-matches-reference"),
    CaughtBug(mla_top_left, "mla-matches-reference"),
)
