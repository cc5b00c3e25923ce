"""Buggy kernels, part 1: what goes into the scores (scale, mask, bias, causal, heads).

Each kernel is :func:`catalogue.blocks.attend` (a correct log-sum-exp kernel) with
exactly one step done wrong; the docstring says which, and where it happened upstream.
"""

from __future__ import annotations

import numpy as np

from attnspec.conformance import declare

from .blocks import (
    QUIET,
    arrange,
    attend,
    causal_table,
    combine,
    default_scale,
    finish,
    row_max,
    scores,
    softmax_lse,
)

Array = np.ndarray
Mask = np.ndarray | None
ALL = {"bias": True, "gqa": True}


# --- scale (SDPA-2) --------------------------------------------------------------------


@declare(**ALL)
def scale_one_over_e(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Default scale 1/E instead of 1/sqrt(E) (a misread of "scaled by the dimension")."""
    return attend(
        arrange(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            is_causal=is_causal,
            scale=1.0 / q.shape[-1] if scale is None else scale,
        )
    )


@declare(**ALL)
def scale_one_over_sqrt_ev(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Default scale 1/sqrt(Ev), the value head dim: only shows when Ev != E."""
    return attend(
        arrange(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            is_causal=is_causal,
            scale=default_scale(v.shape[-1]) if scale is None else scale,
        )
    )


@declare(**ALL)
def scale_squared(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Scales q and k each by the scale, not by its square root, so scores get scale**2
    (the split PyTorch's math backend does right with sqrt(scale), PR #163508)."""
    a = arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)
    return attend(
        a.with_(q=a.q * a.q.dtype.type(a.scale), k=a.k * a.k.dtype.type(a.scale), scale=1.0)
    )


@declare(**ALL)
def explicit_scale_ignored(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Accepts ``scale=`` but always uses 1/sqrt(E)."""
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=None))


@declare(**ALL)
def scale_zero_means_default(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """``scale or 1/sqrt(E)``: an explicit scale of 0 silently becomes the default
    (the ``if not scale`` slip SDPA-2.2's rationale warns about)."""
    return attend(
        arrange(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            is_causal=is_causal,
            scale=scale or default_scale(q.shape[-1]),
        )
    )


@declare(**ALL)
def missing_scale(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """No default scaling at all: unscaled dot products, score variance E instead of 1."""
    return attend(
        arrange(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            is_causal=is_causal,
            scale=1.0 if scale is None else scale,
        )
    )


# --- mask (SDPA-3) ---------------------------------------------------------------------


@declare(**ALL)
def inverted_mask_polarity(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """True = masked out, the ``torch.nn.MultiheadAttention`` convention, used for SDPA."""
    return attend(
        arrange(
            q,
            k,
            v,
            mask=None if mask is None else ~mask,
            bias=bias,
            is_causal=is_causal,
            scale=scale,
        )
    )


@declare(**ALL)
def mask_ignores_head_broadcast(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Assumes a padding-style mask (B, 1, Lq, Lk): takes head 0 of the mask for every
    head, so a per-head mask is wrong for all heads but the first."""
    if mask is not None and mask.ndim >= 3:
        mask = mask[..., :1, :, :]
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale))


@declare(**ALL)
def causal_ignored_with_mask(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """With both a mask and ``is_causal=True``, uses the mask alone ("the mask already
    says what to attend"), instead of their AND."""
    return attend(
        arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal and mask is None, scale=scale)
    )


@declare(**ALL)
def additive_mask_minus_1e4(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Turns the mask into an additive -1e4 and sums it with the bias (the old Hugging
    Face "extended attention mask"): a large bias at a masked position beats the mask."""
    a = arrange(q, k, v, mask=None, bias=bias, is_causal=is_causal, scale=scale)
    if mask is not None:
        full = np.broadcast_to(mask, a.allowed.shape)
        additive = np.where(full, 0.0, -1e4).astype(a.q.dtype)
        a = a.with_(bias=additive if a.bias is None else a.bias + additive)
    return attend(a)


@declare(**ALL)
def max_includes_masked_keys(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Takes the row max over every key, masked ones included (a max over the whole
    tile before masking): exact in real arithmetic, but masked keys then change the
    rounding, and a large masked score underflows the allowed weights."""
    a = arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)
    s, allowed = scores(a)
    raw = np.matmul(a.q, np.swapaxes(a.k, -1, -2)) * a.q.dtype.type(a.scale)
    if a.bias is not None:
        raw = raw + a.bias
    with np.errstate(**QUIET):
        e = np.where(allowed, np.exp(s - row_max(raw)), 0.0)
        total = np.sum(e, axis=-1, keepdims=True)
        p = e / np.where(total == 0, 1.0, total)
    return finish(combine(p.astype(s.dtype), allowed, a.v), a)


# --- bias (SDPA-3.2, SDPA-7.6) ---------------------------------------------------------


@declare(**ALL)
def bias_before_scaling(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Adds the bias to q.k and then scales: (q.k + b) * scale instead of scale*q.k + b."""
    a = arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)
    if a.bias is not None:
        a = a.with_(bias=a.bias * a.q.dtype.type(a.scale))
    return attend(a)


@declare(**ALL)
def logits_soft_capped(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Applies Gemma-2-style logit soft-capping 30 * tanh(s / 30) that nobody asked for:
    harmless for small scores, but a per-row shift of the bias is no longer a no-op."""
    a = arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)
    s, allowed = scores(a)
    cap = s.dtype.type(30.0)
    s = np.where(allowed, cap * np.tanh(s / cap), -np.inf)
    return finish(combine(softmax_lse(s, allowed), allowed, a.v), a)


# --- causal (SDPA-4) -------------------------------------------------------------------


def _with_causal(
    q: Array, k: Array, v: Array, mask: Mask, bias: Mask, scale: float | None, table: Array | None
) -> Array:
    """attend() with ``table`` (Lq, Lk) as the causal rule instead of the spec's."""
    a = arrange(q, k, v, mask=mask, bias=bias, scale=scale)
    if table is not None:
        a = a.with_(allowed=a.allowed & table)
    return attend(a)


@declare(**ALL)
def causal_strict(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Causal off by one: j < i, so a query does not see its own key (row 0 sees nothing)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    table = np.arange(n_k)[None, :] < np.arange(n_q)[:, None] if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@declare(**ALL)
def causal_one_ahead(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Causal off by one the other way: j <= i + 1, each query sees one future key."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    table = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + 1 if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@declare(causal_alignment="bottom_right", **ALL)
def top_left_declared_bottom_right(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Declares bottom-right alignment but computes top-left (pytorch #115111,
    flash-attn #20: the triangle anchored at the wrong corner when Lq != Lk)."""
    table = causal_table(q.shape[-2], k.shape[-2], "top_left") if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@declare(**ALL)
def bottom_right_declared_top_left(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Declares top-left alignment (PyTorch's ``is_causal``) but computes bottom-right
    (flash-attn >= 2.1 semantics behind a PyTorch-style API, mlx #2835)."""
    table = causal_table(q.shape[-2], k.shape[-2], "bottom_right") if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@declare(causal_alignment="bottom_right", **ALL)
def decode_step_top_left(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Bottom-right causal, except that the single-query decode path (Lq == 1) uses the
    top-left rule, so the decoded token sees only key 0 (executorch #22426)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    alignment = "top_left" if n_q == 1 else "bottom_right"
    table = causal_table(n_q, n_k, alignment) if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


# --- grouped-query heads (SDPA-6) ------------------------------------------------------


def _tiled_heads(n_q_heads: int, n_kv_heads: int) -> Array:
    return np.arange(n_q_heads) % n_kv_heads


@declare(**ALL)
def gqa_modulo_mapping(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Query head h reads key/value head h % Hkv (``tile`` instead of ``repeat``,
    jax-js PR #180) instead of h // G."""
    return attend(
        arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale, heads=_tiled_heads)
    )


@declare(**ALL)
def gqa_accepts_indivisible_heads(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Mask = None,
    bias: Mask = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """No head-count check: query head h reads key/value head floor(h * Hkv / Hq), which
    is h // G when Hq = G * Hkv but silently pairs heads when it is not (fla #1029)."""
    n_q_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_kv_heads and n_q_heads % n_kv_heads:
        # Expand K/V ourselves so that arrange()'s head check sees Hq == Hkv.
        kv_head = np.arange(n_q_heads) * n_kv_heads // n_q_heads
        k, v = np.take(k, kv_head, axis=-3), np.take(v, kv_head, axis=-3)
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale))
