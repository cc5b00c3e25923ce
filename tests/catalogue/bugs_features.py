"""Buggy feature kernels: each is the definition of :mod:`catalogue.feature_blocks` with one
step wrong, the way real kernels get softcapping, ALiBi, the log-sum-exp and dropout wrong.

Every kernel declares what it claims, so the suite calls it with those features.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .blocks import QUIET, Arranged, finish, named, row_max, softmax_lse
from .entry import SPEC_KEYWORDS, SpecCall, spec_kernel
from .feature_blocks import (
    Features,
    alibi_bias,
    arranged,
    attend_features,
    feature_scores,
    keep_mask,
    log_sum_exp,
    softcapped,
    weighted,
)

Array = np.ndarray
SOFTCAP = {"bias": True, "gqa": True, "softcap": True}
ALIBI = {"bias": True, "gqa": True, "alibi": True}
LSE = {"bias": True, "gqa": True, "softcap": True, "returns_lse": True}
DROPOUT = {"bias": True, "gqa": True, "dropout": True}
# the keywords each group of kernels takes besides the spec's, with their defaults
SOFTCAP_KEYWORDS = {**SPEC_KEYWORDS, "softcap": None}
ALIBI_KEYWORDS = {**SPEC_KEYWORDS, "alibi_slopes": None}
DROPOUT_KEYWORDS = {**SPEC_KEYWORDS, "dropout_p": 0.0, "seed": None}


def _masked_softmax_output(a: Arranged, s: Array, allowed: Array) -> Array:
    return finish(weighted(softmax_lse(s, allowed), allowed, a.v), a)


# --- softcapping (SOFTCAP-1, SOFTCAP-3) ---------------------------------------------------


@spec_kernel(SOFTCAP_KEYWORDS, **SOFTCAP)
def softcap_before_scale(call: SpecCall) -> Array:
    """Caps the unscaled q.k and scales afterwards: alpha c tanh(q.k / c) instead of
    c tanh(alpha q.k / c)."""
    f = Features()
    a = arranged(*call, f)
    if call.softcap is None:
        return attend_features(a, f)
    with np.errstate(**QUIET):
        capped = softcapped(np.matmul(a.q, np.swapaxes(a.k, -1, -2)), call.softcap)
        s = capped * a.q.dtype.type(a.scale)
        if a.bias is not None:
            s = s + a.bias
    allowed = a.allowed & (s != -np.inf)
    return _masked_softmax_output(a, np.where(allowed, s, -np.inf), allowed)


@spec_kernel(SOFTCAP_KEYWORDS, **SOFTCAP)
def softcap_bias_inside(call: SpecCall) -> Array:
    """Adds the bias before capping: c tanh((alpha q.k + b) / c), so a padding bias of
    finfo.min becomes -c."""
    f = Features()
    a = arranged(*call, f)
    s, allowed = feature_scores(a, f)  # scaled + bias, masked
    if call.softcap is not None:
        s = np.where(allowed, softcapped(s, call.softcap), -np.inf)
    return _masked_softmax_output(a, s, allowed)


@spec_kernel(SOFTCAP_KEYWORDS, **SOFTCAP)
def softcap_mask_inside(call: SpecCall) -> Array:
    """Masks with finfo.min before capping (as a Flax port of Gemma 2 does): a masked key's
    score becomes -c and it is attended."""
    f = Features()
    mask, softcap = call.mask, call.softcap
    a = arranged(*call._replace(mask=None), f)
    s, allowed = feature_scores(a, f)
    if softcap is None:
        if mask is not None:
            allowed = allowed & np.broadcast_to(mask, allowed.shape)
        return _masked_softmax_output(a, np.where(allowed, s, -np.inf), allowed)
    if mask is not None:
        s = np.where(np.broadcast_to(mask, s.shape), s, np.finfo(s.dtype).min)
    return _masked_softmax_output(a, np.where(allowed, softcapped(s, softcap), -np.inf), allowed)


@spec_kernel(SOFTCAP_KEYWORDS, **SOFTCAP)
def softcap_ignored(call: SpecCall) -> Array:
    """Accepts softcap= and does nothing with it."""
    f = Features()
    return attend_features(arranged(*call, f), f)


# --- ALiBi (ALIBI-2, ALIBI-3) --------------------------------------------------------------


def _with_alibi(call: SpecCall, alignment: str, alibi: Callable[[Arranged], Array] | None) -> Array:
    """The definition with ``alibi`` (or None) as the ALiBi term, given whole."""
    f = Features(alignment=alignment)
    a = arranged(*call, f)
    s, allowed = feature_scores(a, f)
    if alibi is not None:
        s = np.where(allowed, s + alibi(a), -np.inf)
    return _masked_softmax_output(a, s, allowed)


# (the arranged inputs, the slopes given) -> the ALiBi term a kernel adds to the scores
AlibiTerm = Callable[[Arranged, Array], Array]


def _alibi_bug(
    name: str, doc: str, term: AlibiTerm, alignment: str = "top_left"
) -> Callable[..., Any]:
    """An ALiBi kernel (causal ``alignment``, declared) adding ``term(a, alibi_slopes)``."""

    @spec_kernel(ALIBI_KEYWORDS, **ALIBI, causal_alignment=alignment)
    def kernel(call: SpecCall) -> Array:
        slopes = call.alibi_slopes
        return _with_alibi(call, alignment, None if slopes is None else lambda a: term(a, slopes))

    return named(kernel, name, doc)


alibi_wrong_corner = _alibi_bug(
    "alibi_wrong_corner",
    "Bottom-right causal, but the ALiBi distance measured top-left, |i - j|.",
    lambda a, slopes: alibi_bias(a, slopes, "top_left"),
    alignment="bottom_right",
)
alibi_positive_sign = _alibi_bug(
    "alibi_positive_sign",
    "Adds +m_h |i - j|: distant keys are favoured instead of penalised.",
    lambda a, slopes: -alibi_bias(a, slopes, "top_left"),
)
alibi_scaled = _alibi_bug(
    "alibi_scaled",
    "Adds ALiBi to q.k before scaling, so the bias is multiplied by alpha.",
    lambda a, slopes: a.q.dtype.type(a.scale) * alibi_bias(a, slopes, "top_left"),
)


@spec_kernel(ALIBI_KEYWORDS, **ALIBI)
def alibi_kv_head_slopes(call: SpecCall) -> Array:
    """Indexes the slopes by the key/value head a query head reads: query head h gets
    slope g = h // G instead of slope h."""

    alibi_slopes = call.alibi_slopes

    def alibi(a: Arranged) -> Array:
        n_q_heads, n_kv_heads = call.q.shape[-3], call.k.shape[-3]
        slopes = np.broadcast_to(alibi_slopes, (*alibi_slopes.shape[:-1], n_q_heads))
        per_kv = np.take(slopes, np.arange(n_q_heads) // (n_q_heads // n_kv_heads), axis=-1)
        return alibi_bias(a, per_kv, "top_left")

    return _with_alibi(call, "top_left", None if alibi_slopes is None else alibi)


def _naive_slopes(n_heads: int) -> Array:
    return np.asarray([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)], np.float32)


@spec_kernel(
    {"mask": None, "is_causal": False, "scale": None, "use_alibi": False},
    gqa=True,
    alibi=True,
    alibi_builtin_slopes=True,
    alibi_keyword="use_alibi",
)
def alibi_naive_slopes(call: SpecCall) -> Array:
    """Computes its own slopes as 2^(-8(h+1)/H) for every H: right for powers of two only
    (Press et al. interleave the slopes of the next power of two otherwise)."""
    n_heads = call.q.shape[-3]
    alibi = (
        (lambda a: alibi_bias(a, _naive_slopes(n_heads), "top_left")) if call.use_alibi else None
    )
    return _with_alibi(call, "top_left", alibi)


# --- the log-sum-exp (LSE-1 ... LSE-3) ------------------------------------------------------


def _lse_kernel(call: SpecCall, softcap: float | None) -> tuple[Arranged, Array, Array, Array]:
    f = Features(softcap=softcap)
    a = arranged(*call, f)
    s, allowed = feature_scores(a, f)
    return a, _masked_softmax_output(a, s, allowed), log_sum_exp(s, allowed), allowed


# (the arranged inputs, the correct log-sum-exp, the allowed keys) -> the one returned
LseBug = Callable[[Arranged, Array, Array], Array]


def _lse_bug(name: str, doc: str, returned: LseBug) -> Callable[..., Any]:
    """A kernel returning the correct output and ``returned(a, lse, allowed)`` for its
    log-sum-exp."""

    @spec_kernel(SOFTCAP_KEYWORDS, **LSE)
    def kernel(call: SpecCall) -> tuple[Array, Array]:
        a, out, lse, allowed = _lse_kernel(call, call.softcap)
        return out, returned(a, lse, allowed)

    return named(kernel, name, doc)


def _plus_unscaled_max(a: Arranged, lse: Array, allowed: Array) -> Array:
    raw = np.where(allowed, np.matmul(a.q, np.swapaxes(a.k, -1, -2)), -np.inf)
    top = row_max(raw)[..., 0]
    with np.errstate(**QUIET):
        return np.where(np.isfinite(lse), lse + (1 - a.scale) * top, lse)


lse_base_two = _lse_bug(
    "lse_base_two",
    "Returns the log-sum-exp in base 2, as FlexAttention keeps it internally, without the "
    "final conversion.",
    lambda a, lse, allowed: lse / math.log(2),
)
lse_unscaled_max = _lse_bug(
    "lse_unscaled_max",
    "Adds the row maximum of the unscaled q.k (FlashAttention keeps that one) without "
    "multiplying it by the scale: lse = max(q.k) + log(sum exp(s - alpha max(q.k))).",
    _plus_unscaled_max,
)
lse_plus_inf_empty = _lse_bug(
    "lse_plus_inf_empty",
    "+inf for a row with no visible key, as FlashAttention's unsplit forward writes it.",
    lambda a, lse, allowed: np.where(lse == -np.inf, np.inf, lse),
)
lse_zero_empty = _lse_bug(
    "lse_zero_empty",
    "0 for a row with no visible key: the maximum's 0 fill plus log(1), never made -inf.",
    lambda a, lse, allowed: np.where(lse == -np.inf, 0, lse).astype(lse.dtype),
)
lse_input_dtype = _lse_bug(
    "lse_input_dtype",
    "Returns the log-sum-exp in the input dtype (float16 for float16 inputs).",
    lambda a, lse, allowed: lse.astype(a.out_dtype),
)
lse_plus_inf_without_keys = _lse_bug(
    "lse_plus_inf_without_keys",
    "+inf for every row when there are no keys at all (FlashAttention's early exit for an "
    "empty key range writes INFINITY), -inf correctly for masked-out rows: a split-KV part "
    "without keys then dominates the combination.",
    lambda a, lse, allowed: np.full_like(lse, np.inf) if a.k.shape[-2] == 0 else lse,
)


@spec_kernel(SOFTCAP_KEYWORDS, **LSE)
def lse_without_softcap(call: SpecCall) -> tuple[Array, Array]:
    """Caps the scores for the weights but returns the log-sum-exp of the uncapped ones."""
    _, out, _, _ = _lse_kernel(call, call.softcap)
    _, _, uncapped, _ = _lse_kernel(call, None)
    return out, uncapped


# --- dropout (DROP-2 ... DROP-4) ------------------------------------------------------------


def _dropout(
    call: SpecCall,
    dropout_p: float,
    keep: Array | None,
    rescale: float | None = None,
    renormalise: bool = False,
) -> Array:
    """Weights times ``keep`` times ``rescale`` (1/(1 - p) unless given), renormalised
    over the kept keys when ``renormalise``."""
    f = Features()
    a = arranged(*call, f)
    s, allowed = feature_scores(a, f)
    p = softmax_lse(s, allowed)
    if dropout_p and keep is not None:
        p = p * keep
        if renormalise:
            total = p.sum(axis=-1, keepdims=True)
            p = np.where(total > 0, p / np.where(total > 0, total, 1), 0).astype(s.dtype)
        else:
            p = p * s.dtype.type(1 / (1 - dropout_p) if rescale is None else rescale)
    return finish(weighted(p, allowed, a.v), a)


def _shape(q: Array, k: Array) -> tuple[int, ...]:
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3])
    return (*batch, q.shape[-3], q.shape[-2], k.shape[-2])


# (weights shape, dropout_p, seed) -> the keep indicators a kernel draws (or None)
Keep = Callable[[tuple[int, ...], float, "int | None"], "Array | None"]


def _dropout_bug(
    name: str,
    doc: str,
    *,
    keep: Keep = keep_mask,
    rate: Callable[[float], float] = lambda p: p,
    rescale: Callable[[float], float] | None = None,
    renormalise: bool = False,
    on_output: bool = False,
) -> Callable[..., Any]:
    """A dropout kernel drawing ``keep(shape, p, seed)`` at rate ``rate(dropout_p)``, kept
    weights times ``rescale(p)`` (default 1/(1 - p)) or renormalised (:func:`_dropout`);
    ``on_output``: the indicators drop elements of the output instead of weights."""

    @spec_kernel(DROPOUT_KEYWORDS, **DROPOUT)
    def kernel(call: SpecCall) -> Array:
        p, seed = rate(call.dropout_p), call.seed
        if on_output:
            out = _dropout(call, 0.0, None)
            if not p:
                return out
            dropped = out * keep(out.shape, p, seed) * out.dtype.type(1 / (1 - p))
            return dropped.astype(out.dtype)
        return _dropout(
            call,
            p,
            keep(_shape(call.q, call.k), p, seed),
            rescale=None if rescale is None else rescale(p),
            renormalise=renormalise,
        )

    return named(kernel, name, doc)


_UNSEEDED = np.random.default_rng(12345)

dropout_no_rescale = _dropout_bug(
    "dropout_no_rescale",
    "Drops weights but never multiplies the kept ones by 1/(1 - p).",
    rescale=lambda p: 1.0,
)
dropout_times_keep_probability = _dropout_bug(
    "dropout_times_keep_probability",
    "Multiplies kept weights by 1 - p instead of dividing by it.",
    rescale=lambda p: 1 - p,
)
dropout_renormalised = _dropout_bug(
    "dropout_renormalised",
    "Renormalises the kept weights to sum to 1 (as dropping scores before the softmax would).",
    renormalise=True,
)
dropout_keeps_with_p = _dropout_bug(
    "dropout_keeps_with_p",
    "Keeps a weight with probability p (the comparison reversed), rescaling by 1/(1 - p).",
    keep=lambda shape, p, seed: ~keep_mask(shape, p, seed) if p else None,
)
dropout_shared_by_heads = _dropout_bug(
    "dropout_shared_by_heads",
    "Draws one mask per batch element and uses it for every head (the head left out of "
    "the random stream's offset).",
    keep=lambda shape, p, seed: keep_mask((*shape[:-3], 1, *shape[-2:]), p, seed),
)
dropout_per_key = _dropout_bug(
    "dropout_per_key",
    "Draws one indicator per key and uses it for every query (a mask over key positions, "
    "the query left out of the offset).",
    keep=lambda shape, p, seed: keep_mask((*shape[:-2], 1, shape[-1]), p, seed),
)
dropout_zero_means_default = _dropout_bug(
    "dropout_zero_means_default",
    'Reads dropout_p=0.0 as "not given" and falls back to its default rate of 0.1 '
    "(``p = dropout_p or 0.1``), so dropout cannot be turned off.",
    rate=lambda p: p or 0.1,
)
dropout_ignores_seed = _dropout_bug(
    "dropout_ignores_seed",
    "Takes seed= but draws from a module-level generator, so a seed reproduces nothing.",
    keep=lambda shape, p, seed: _UNSEEDED.random(shape) >= p,
)


dropout_after_values = _dropout_bug(
    "dropout_after_values",
    "Drops elements of the output (after the value product) instead of weights, rescaled "
    "by 1/(1 - p): unbiased, and with V = I indistinguishable from weight dropout, but an "
    "indicator per output element, not per weight (DROP-2).",
    on_output=True,
)
