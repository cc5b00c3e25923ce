"""Attention with sink logits (SINK-1 … SINK-3) as people write it, in NumPy: three correct
formulations (one returning the log-sum-exp) and the bugs that real sink kernels had; and
StreamingLLM's sink tokens beside a window (SINK-4), one correct kernel and two bugs.

Every kernel is ``fn(q, k, v, *, mask=None, is_causal=False, scale=None, sinks=None)`` in
the spec's layout with GQA and top-left causal calls, accumulating in float32 for float16
inputs (in the inputs' dtype otherwise), and declares ``sinks=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .entry import SPEC_KEYWORDS, CaughtBug, SpecCall, spec_kernel

Array = np.ndarray
CLAIMS = dict(sinks=True, gqa=True)
# the keywords of every sink kernel, with their defaults
KEYWORDS = {"mask": None, "is_causal": False, "scale": None, "sinks": None}


def _scores(
    q: Array, k: Array, v: Array, mask: Any, is_causal: bool, scale: Any
) -> tuple[Array, Array]:
    """Scaled scores with -inf where a key is not allowed, and the values, per query head."""
    work = np.float32 if q.dtype == np.float16 else q.dtype.type
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    q = np.broadcast_to(q, (*batch, *q.shape[-3:])).astype(work)
    group = q.shape[-3] // k.shape[-3]
    k = np.repeat(np.broadcast_to(k, (*batch, *k.shape[-3:])), group, axis=-3).astype(work)
    v = np.repeat(np.broadcast_to(v, (*batch, *v.shape[-3:])), group, axis=-3).astype(work)
    alpha = work(q.shape[-1] ** -0.5 if scale is None else scale)
    scores = (q @ np.swapaxes(k, -1, -2)) * alpha
    allowed = np.ones(scores.shape, bool)
    if mask is not None:
        allowed &= np.broadcast_to(mask, scores.shape)
    if is_causal:
        allowed &= np.tril(np.ones(scores.shape[-2:], bool))
    return np.where(allowed, scores, -np.inf), v


def _sink_column(sinks: Any, scores: Array) -> Array:
    return np.broadcast_to(np.asarray(sinks, scores.dtype)[:, None, None], (*scores.shape[:-1], 1))


@spec_kernel(KEYWORDS, **CLAIMS)
def sinks_concatenated(call: SpecCall) -> Array:
    """Hugging Face's gpt-oss eager attention: the sink appended as one more column after
    scaling and masking, one softmax, the column dropped."""
    q, k, v, mask, _, is_causal, scale = call
    scores, values = _scores(q, k, v, mask, is_causal, scale)
    if call.sinks is not None:
        scores = np.concatenate([scores, _sink_column(call.sinks, scores)], axis=-1)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    exps = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = exps.sum(-1, keepdims=True)
    weights = (exps / np.where(total == 0, 1, total))[..., : values.shape[-2]]
    return (weights @ values).astype(q.dtype)


def _denominator_form(call: SpecCall, *, bug: str | None = None, returns_lse: bool = False) -> Any:
    """FlashAttention 4's form: the row max over the scores and the sink, the sink's term
    added to the row sum; ``bug`` names the one step done wrong.  ``returns_lse``: also the
    log-sum-exp, the row max plus the log of the row sum (SINK-3), in the working dtype."""
    q, k, v, mask, _, is_causal, scale = call
    sinks = call.sinks
    scores, values = _scores(q, k, v, mask, is_causal, scale)
    if sinks is None:
        sink = np.full((*scores.shape[:-1], 1), -np.inf, scores.dtype)
    else:
        sink = _sink_column(sinks, scores)
        if bug == "scaled":
            alpha = q.shape[-1] ** -0.5 if scale is None else scale
            sink = sink * sink.dtype.type(alpha)
        if bug == "per-kv-head":
            group = scores.shape[-3] // k.shape[-3]
            sink = np.repeat(sink[..., ::group, :, :], group, axis=-3)
        if bug == "dropped-under-mask" and (mask is not None or is_causal):
            sink = np.full_like(sink, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    if bug != "max-over-scores":
        top = np.maximum(top, sink)
    shift = np.where(top == -np.inf, 0, top) if bug != "max-over-scores" else top
    with np.errstate(invalid="ignore", over="ignore"):
        exps = np.exp(scores - shift)
        sink_term = np.exp(sink - shift)
        total = exps.sum(-1, keepdims=True) + sink_term
        numerator = exps @ values
        if bug == "numerator":
            numerator = numerator + sink_term
        out = numerator / np.where(total == 0, 1, total)
        if not returns_lse:
            return out.astype(q.dtype)
        summed = exps.sum(-1, keepdims=True) if bug == "lse-without-sink" else total
        with np.errstate(divide="ignore"):
            lse = np.where(summed == 0, -np.inf, shift + np.log(np.where(summed == 0, 1, summed)))
    return out.astype(q.dtype), lse[..., 0]


@spec_kernel(KEYWORDS, **CLAIMS)
def sinks_in_denominator(call: SpecCall) -> Array:
    """The sink's term e^(sink - m) added to the row sum, m the max of scores and sink."""
    return _denominator_form(call)


def _denominator_kernel(
    name: str, doc: str, bug: str | None = None, returns_lse: bool = False
) -> Callable[..., Any]:
    """A kernel of :func:`_denominator_form` with one step done wrong (``bug``), returning
    (out, lse) when ``returns_lse``."""

    @spec_kernel(KEYWORDS, **CLAIMS, returns_lse=returns_lse)
    def kernel(call: SpecCall) -> Any:
        return _denominator_form(call, bug=bug, returns_lse=returns_lse)

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return kernel


sinks_with_lse = _denominator_kernel(
    "sinks_with_lse",
    "FlashAttention 4's form returning (out, lse), the sink inside the lse.",
    returns_lse=True,
)
sinks_lse_without_sink = _denominator_kernel(
    "sinks_lse_without_sink",
    "Bug: the right output, but the log-sum-exp of the scores alone (the sink's term left out "
    "of it; -inf for a row that sees no key), so a backward pass or a merge through it is "
    "wrong.",
    bug="lse-without-sink",
    returns_lse=True,
)


CORRECT = (sinks_concatenated, sinks_in_denominator, sinks_with_lse)


def _bug(name: str, doc: str) -> Callable[..., Any]:
    return _denominator_kernel("sinks_" + name.replace("-", "_"), doc, bug=name)


sinks_scaled = _bug("scaled", "Bug: the sink multiplied by the softmax scale like a score.")
sinks_per_kv_head = _bug(
    "per-kv-head", "Bug: under GQA the sink of the key/value head's first query head is used."
)
sinks_dropped_under_mask = _bug(
    "dropped-under-mask",
    "Bug: the sink left out when a mask or the causal rule applies (FlashInfer and FA4 test "
    "sinks with and without windows because of this path).",
)
sinks_numerator = _bug("numerator", "Bug: the sink's term added to the numerator too.")
sinks_max_over_scores = _bug(
    "max-over-scores",
    "Bug: the row max over the scores only: a row with no allowed key computes "
    "-inf - (-inf) and gives NaN instead of 0.",
)


BUGS = (
    CaughtBug(sinks_scaled, "sinks-matches-reference"),
    CaughtBug(sinks_per_kv_head, "sinks-matches-reference"),
    CaughtBug(sinks_dropped_under_mask, "sinks-matches-reference"),
    CaughtBug(sinks_numerator, "sinks-matches-reference"),
    CaughtBug(sinks_max_over_scores, "sinks-empty-rows"),
    CaughtBug(sinks_lse_without_sink, "sinks-lse"),
)


# SINK-4: sink tokens beside a causal sliding window (StreamingLLM), called with
# n_sink_tokens= and window= on top of the spec's keywords, plain attention without them
TOKEN_KEYWORDS = {**SPEC_KEYWORDS, "n_sink_tokens": None, "window": None}
TOKEN_CLAIMS = dict(sink_tokens=True, gqa=True, bias=True, mask=True)


def _token_multiplicity(call: SpecCall, bug: str | None) -> Array | None:
    """How often each key enters query i's softmax ``(Lq, Lk)``: 1 for a sink token (j < n)
    or a key of the window (t_i - window <= j), never past t_i = i (top-left); None without
    sink tokens.  ``bug``: "counted-twice" gives a sink token the window also covers both
    entries (the sink keys and the window keys concatenated), "dropped" counts the window
    alone."""
    if call.n_sink_tokens is None:
        return None
    n_queries, n_keys = call.q.shape[-2], call.k.shape[-2]
    t = np.arange(n_queries)[:, None]
    j = np.arange(n_keys)[None, :]
    causal = j <= t
    sink = (j < call.n_sink_tokens) & causal
    recent = (j >= t - call.window) & causal
    if bug == "counted-twice":
        return sink.astype(np.int64) + recent
    if bug == "dropped":
        return recent.astype(np.int64)
    return (sink | recent).astype(np.int64)


def _streaming_form(call: SpecCall, bug: str | None = None) -> Array:
    """The softmax over each key's entries (:func:`_token_multiplicity`), the mask and bias
    applied as given."""
    q, k, v, mask, bias, is_causal, scale = call
    scores, values = _scores(q, k, v, mask, is_causal, scale)
    if bias is not None:
        scores = scores + np.broadcast_to(bias, scores.shape).astype(scores.dtype)
    count = _token_multiplicity(call, bug)
    if count is not None:
        scores = np.where(count > 0, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    exps = np.exp(scores - np.where(top == -np.inf, 0, top))
    if count is not None:
        exps = exps * count.astype(exps.dtype)
    total = exps.sum(-1, keepdims=True)
    return ((exps @ values) / np.where(total == 0, 1, total)).astype(q.dtype)


@spec_kernel(TOKEN_KEYWORDS, **TOKEN_CLAIMS)
def sink_tokens_masked(call: SpecCall) -> Array:
    """StreamingLLM's attention as a mask: the first n keys and the last window + 1 up to the
    query itself, each once."""
    return _streaming_form(call)


@spec_kernel(TOKEN_KEYWORDS, **TOKEN_CLAIMS)
def sink_tokens_counted_twice(call: SpecCall) -> Array:
    """Bug: the sink keys and the window's keys concatenated, so a sink token the window also
    covers (early queries, or a window reaching back to the start) enters the softmax twice."""
    return _streaming_form(call, bug="counted-twice")


@spec_kernel(TOKEN_KEYWORDS, **TOKEN_CLAIMS)
def sink_tokens_dropped(call: SpecCall) -> Array:
    """Bug: the window applied to the sink tokens too: they are lost once the window has
    moved past them, the case the pattern exists for."""
    return _streaming_form(call, bug="dropped")


TOKEN_CORRECT = (sink_tokens_masked,)
TOKEN_BUGS = (
    CaughtBug(sink_tokens_counted_twice, "sink-tokens-matches-reference"),
    CaughtBug(sink_tokens_dropped, "sink-tokens-matches-reference"),
)
