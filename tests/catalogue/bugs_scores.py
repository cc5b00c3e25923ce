"""Buggy kernels, part 1: what goes into the scores (scale, mask, bias, causal, heads).

Each kernel is :func:`catalogue.blocks.attend` (a correct log-sum-exp kernel) with
exactly one step done wrong; the docstring says which, and where it happened upstream.
"""

from __future__ import annotations

from functools import partial

import numpy as np

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
from .entry import ALL, SpecCall, spec_kernel

Array = np.ndarray
Mask = np.ndarray | None


# --- scale (SDPA-2) --------------------------------------------------------------------


@spec_kernel(**ALL)
def scale_one_over_e(call: SpecCall) -> Array:
    """Default scale 1/E instead of 1/sqrt(E) (a misread of "scaled by the dimension")."""
    q, scale = call.q, call.scale
    return attend(
        call._replace(scale=1.0 / q.shape[-1] if scale is None else scale).pass_to(arrange)
    )


@spec_kernel(**ALL)
def scale_one_over_sqrt_ev(call: SpecCall) -> Array:
    """Default scale 1/sqrt(Ev), the value head dim: only shows when Ev != E."""
    v, scale = call.v, call.scale
    return attend(
        call._replace(scale=default_scale(v.shape[-1]) if scale is None else scale).pass_to(arrange)
    )


@spec_kernel(**ALL)
def scale_squared(call: SpecCall) -> Array:
    """Scales q and k each by the scale, not by its square root, so scores get scale**2
    (the split PyTorch's math backend does right with sqrt(scale), PR #163508)."""
    a = call.pass_to(arrange)
    return attend(
        a.with_(q=a.q * a.q.dtype.type(a.scale), k=a.k * a.k.dtype.type(a.scale), scale=1.0)
    )


@spec_kernel(**ALL)
def explicit_scale_ignored(call: SpecCall) -> Array:
    """Accepts ``scale=`` but always uses 1/sqrt(E)."""
    return attend(call._replace(scale=None).pass_to(arrange))


@spec_kernel(**ALL)
def scale_zero_means_default(call: SpecCall) -> Array:
    """``scale or 1/sqrt(E)``: an explicit scale of 0 silently becomes the default
    (the ``if not scale`` slip SDPA-2.2's rationale warns about)."""
    q, scale = call.q, call.scale
    return attend(call._replace(scale=scale or default_scale(q.shape[-1])).pass_to(arrange))


@spec_kernel(**ALL)
def missing_scale(call: SpecCall) -> Array:
    """No default scaling at all: unscaled dot products, score variance E instead of 1."""
    scale = call.scale
    return attend(call._replace(scale=1.0 if scale is None else scale).pass_to(arrange))


# --- mask (SDPA-3) ---------------------------------------------------------------------


@spec_kernel(**ALL)
def inverted_mask_polarity(call: SpecCall) -> Array:
    """True = masked out, the ``torch.nn.MultiheadAttention`` convention, used for SDPA."""
    q, k, v, mask, bias, is_causal, scale = call
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


@spec_kernel(**ALL)
def mask_ignores_head_broadcast(call: SpecCall) -> Array:
    """Assumes a padding-style mask (B, 1, Lq, Lk): takes head 0 of the mask for every
    head, so a per-head mask is wrong for all heads but the first."""
    q, k, v, mask, bias, is_causal, scale = call
    if mask is not None and mask.ndim >= 3:
        mask = mask[..., :1, :, :]
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale))


@spec_kernel(**ALL)
def causal_ignored_with_mask(call: SpecCall) -> Array:
    """With both a mask and ``is_causal=True``, uses the mask alone ("the mask already
    says what to attend"), instead of their AND."""
    q, k, v, mask, bias, is_causal, scale = call
    return attend(
        arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal and mask is None, scale=scale)
    )


@spec_kernel(**ALL)
def additive_mask_minus_1e4(call: SpecCall) -> Array:
    """Turns the mask into an additive -1e4 and sums it with the bias (the old Hugging
    Face "extended attention mask"): a large bias at a masked position beats the mask."""
    q, k, v, mask, bias, is_causal, scale = call
    a = arrange(q, k, v, mask=None, bias=bias, is_causal=is_causal, scale=scale)
    if mask is not None:
        full = np.broadcast_to(mask, a.allowed.shape)
        additive = np.where(full, 0.0, -1e4).astype(a.q.dtype)
        a = a.with_(bias=additive if a.bias is None else a.bias + additive)
    return attend(a)


@spec_kernel(**ALL)
def max_includes_masked_keys(call: SpecCall) -> Array:
    """Takes the row max over every key, masked ones included (a max over the whole
    tile before masking): exact in real arithmetic, but masked keys then change the
    rounding, and a large masked score underflows the allowed weights."""
    a = call.pass_to(arrange)
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


@spec_kernel(**ALL)
def bias_before_scaling(call: SpecCall) -> Array:
    """Adds the bias to q.k and then scales: (q.k + b) * scale instead of scale*q.k + b."""
    a = call.pass_to(arrange)
    if a.bias is not None:
        a = a.with_(bias=a.bias * a.q.dtype.type(a.scale))
    return attend(a)


@spec_kernel(**ALL)
def logits_soft_capped(call: SpecCall) -> Array:
    """Applies Gemma-2-style logit soft-capping 30 * tanh(s / 30) that nobody asked for:
    harmless for small scores, but a per-row shift of the bias is no longer a no-op."""
    a = call.pass_to(arrange)
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


@spec_kernel(**ALL)
def causal_strict(call: SpecCall) -> Array:
    """Causal off by one: j < i, so a query does not see its own key (row 0 sees nothing)."""
    q, k, v, mask, bias, is_causal, scale = call
    n_q, n_k = q.shape[-2], k.shape[-2]
    table = np.arange(n_k)[None, :] < np.arange(n_q)[:, None] if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@spec_kernel(**ALL)
def causal_one_ahead(call: SpecCall) -> Array:
    """Causal off by one the other way: j <= i + 1, each query sees one future key."""
    q, k, v, mask, bias, is_causal, scale = call
    n_q, n_k = q.shape[-2], k.shape[-2]
    table = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + 1 if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@spec_kernel(causal_alignment="bottom_right", **ALL)
def top_left_declared_bottom_right(call: SpecCall) -> Array:
    """Declares bottom-right alignment but computes top-left (pytorch #115111,
    flash-attn #20: the triangle anchored at the wrong corner when Lq != Lk)."""
    q, k, v, mask, bias, is_causal, scale = call
    table = causal_table(q.shape[-2], k.shape[-2], "top_left") if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@spec_kernel(**ALL)
def bottom_right_declared_top_left(call: SpecCall) -> Array:
    """Declares top-left alignment (PyTorch's ``is_causal``) but computes bottom-right
    (flash-attn >= 2.1 semantics behind a PyTorch-style API, mlx #2835)."""
    q, k, v, mask, bias, is_causal, scale = call
    table = causal_table(q.shape[-2], k.shape[-2], "bottom_right") if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


@spec_kernel(causal_alignment="bottom_right", **ALL)
def decode_step_top_left(call: SpecCall) -> Array:
    """Bottom-right causal, except that the single-query decode path (Lq == 1) uses the
    top-left rule, so the decoded token sees only key 0 (executorch #22426)."""
    q, k, v, mask, bias, is_causal, scale = call
    n_q, n_k = q.shape[-2], k.shape[-2]
    alignment = "top_left" if n_q == 1 else "bottom_right"
    table = causal_table(n_q, n_k, alignment) if is_causal else None
    return _with_causal(q, k, v, mask, bias, scale, table)


# --- grouped-query heads (SDPA-6) ------------------------------------------------------


def _tiled_heads(n_q_heads: int, n_kv_heads: int) -> Array:
    return np.arange(n_q_heads) % n_kv_heads


@spec_kernel(**ALL)
def gqa_modulo_mapping(call: SpecCall) -> Array:
    """Query head h reads key/value head h % Hkv (``tile`` instead of ``repeat``,
    jax-js PR #180) instead of h // G."""
    return attend(call.pass_to(partial(arrange, heads=_tiled_heads)))


@spec_kernel(**ALL)
def gqa_accepts_indivisible_heads(call: SpecCall) -> Array:
    """No head-count check: query head h reads key/value head floor(h * Hkv / Hq), which
    is h // G when Hq = G * Hkv but silently pairs heads when it is not (fla #1029)."""
    q, k, v, mask, bias, is_causal, scale = call
    n_q_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_kv_heads and n_q_heads % n_kv_heads:
        # Expand K/V ourselves so that arrange()'s head check sees Hq == Hkv.
        kv_head = np.arange(n_q_heads) * n_kv_heads // n_q_heads
        k, v = np.take(k, kv_head, axis=-3), np.take(v, kv_head, axis=-3)
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale))
