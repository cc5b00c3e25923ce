"""Scaled dot-product attention exactly as spec/dense.md defines it (SDPA-1 … SDPA-8),
with the score features of spec/features.md (softcapping, ALiBi, the log-sum-exp) and
dropout with an explicit keep mask (DROP-2): the plain form, the spec's text in code.

:func:`plain_attention` holds every ``Lq x Lk`` score at once, which makes it the form to
read beside the spec and the one the oracle tests pin; the public entry point
``scaled_dot_product_attention`` (``attention.py``) computes the same function block by
block (``blocked.py``) unless the weights are asked for.  The checks and the grouped
layout here are shared by both forms and by the tolerance model."""

from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import array_api_compat

from ._array import Array
from ._checks import (
    broadcast_shapes,
    check_choice,
    check_flag,
    check_scale,
    namespace_of,
    require_broadcastable_to,
    require_ndim_at_least,
    require_real_floating,
)
from .features import (
    check_dropout_p,
    check_softcap,
    dropped_weights,
    grouped_alibi,
    log_sum_exp,
    softcapped,
)
from .grouped import GroupedInputs as GroupedInputs  # re-exported: blocked, tolerance ...
from .masks import CAUSAL_ALIGNMENTS, causal_offset
from .options import AttentionOptions, DenseOptions, ScoreOptions, filled, shows_options

if TYPE_CHECKING:
    from typing import Unpack

CALL = "scaled_dot_product_attention(q, k, v)"
PLAIN_CALL = "plain_attention(q, k, v)"
LAYOUT = "(..., heads, length, head_dim)"


def compute_dtype(xp: ModuleType, dtype: Any) -> Any:
    """float16/bfloat16 are computed in float32 (SDPA-7.2); others in their own dtype."""
    return dtype if dtype in (xp.float32, xp.float64) else xp.float32


def check_arguments(
    q: Array, k: Array, v: Array, options: DenseOptions, call: str
) -> tuple[ModuleType, tuple[int, ...], float | None]:
    """Check the arguments against SDPA-1 … SDPA-6; returns the namespace, the broadcast
    batch shape and the checked explicit scale (None for the default)."""
    mask, bias, scale = options["mask"], options["bias"], options["scale"]
    is_causal, causal_alignment = options["is_causal"], options["causal_alignment"]
    xp = namespace_of(call, q=q, k=k, v=v, mask=mask, bias=bias)
    require_real_floating(xp, call, "SDPA-1.4", q=q, k=k, v=v, bias=bias)
    require_ndim_at_least(call, "SDPA-1.1", 3, LAYOUT, q=q, k=k, v=v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q.dtype={q.dtype}, k.dtype={k.dtype}, v.dtype={v.dtype}, but should all be "
            f"the same [SDPA-1.4, {call}]"
        )
    check_flag("is_causal", is_causal, call)
    check_choice("causal_alignment", causal_alignment, CAUSAL_ALIGNMENTS, call, "SDPA-4.3")
    scale = check_scale(scale, call)

    *q_batch, n_q_heads, n_queries, head_dim = q.shape
    *k_batch, n_kv_heads, n_keys, k_head_dim = k.shape
    *v_batch, v_heads, v_keys, _ = v.shape
    if head_dim == 0:
        raise ValueError(
            f"q.shape[-1]=0, but the head dim E should be >= 1 (the default scale is "
            f"1/sqrt(E)) [SDPA-1.1, {call}]"
        )
    if k_head_dim != head_dim:
        raise ValueError(
            f"k.shape[-1]={k_head_dim}, but should equal q.shape[-1]={head_dim} [SDPA-1.1, {call}]"
        )
    if (v_heads, v_keys) != (n_kv_heads, n_keys):
        raise ValueError(
            f"v.shape[-3:-1]={(v_heads, v_keys)}, but should equal k.shape[-3:-1]="
            f"{(n_kv_heads, n_keys)} [SDPA-1.1, {call}]"
        )
    if n_kv_heads == 0 or n_q_heads % n_kv_heads != 0:
        raise ValueError(
            f"q has {n_q_heads} heads and k/v have {n_kv_heads}; the query heads should be "
            f"a whole multiple of the key/value heads [SDPA-6.2, {call}]"
        )
    batch = broadcast_shapes(call, "SDPA-1.2", q=tuple(q_batch), k=tuple(k_batch), v=tuple(v_batch))
    scores_shape = (*batch, n_q_heads, n_queries, n_keys)
    if mask is not None:
        if mask.dtype != xp.bool:
            raise TypeError(
                f"mask.dtype={mask.dtype}, but should be bool (True = may attend); pass an "
                f"additive float mask as bias= [SDPA-3.1, {call}]"
            )
        require_broadcastable_to("mask", tuple(mask.shape), scores_shape, call, "SDPA-3.1")
    if bias is not None:
        require_broadcastable_to("bias", tuple(bias.shape), scores_shape, call, "SDPA-3.2")
    return xp, batch, scale


@shows_options(DenseOptions)
def prepare(
    q: Array, k: Array, v: Array, *, call: str = CALL, **given: Unpack[DenseOptions]
) -> GroupedInputs:
    """Check the arguments against SDPA-1 … SDPA-6 and lay them out for computation."""
    options = filled(DenseOptions, given)
    mask, bias, is_causal = options["mask"], options["bias"], options["is_causal"]
    xp, batch, scale = check_arguments(q, k, v, options, call)
    *_, n_q_heads, n_queries, head_dim = q.shape
    *_, n_kv_heads, n_keys, _ = k.shape
    value_dim = v.shape[-1]
    scores_shape = (*batch, n_q_heads, n_queries, n_keys)
    work = compute_dtype(xp, q.dtype)
    groups = n_q_heads // n_kv_heads
    grouped = (*batch, n_kv_heads, groups, n_queries, n_keys)

    def grouped_scores(a: Any) -> Any:
        return xp.reshape(xp.broadcast_to(a, scores_shape), grouped)

    allowed = None if mask is None else grouped_scores(mask)
    if is_causal:
        device = array_api_compat.device(q)
        rows = xp.arange(n_queries, device=device)[:, None]
        cols = xp.arange(n_keys, device=device)[None, :]
        causal = cols <= rows + causal_offset(n_queries, n_keys, options["causal_alignment"])
        allowed = causal if allowed is None else xp.logical_and(allowed, causal)
        allowed = xp.broadcast_to(allowed, grouped)

    # no copy of an input already in the working dtype: nothing below writes to them
    def widened(a: Any) -> Any:
        return xp.astype(a, work, copy=False)

    q5 = xp.reshape(
        xp.broadcast_to(widened(q), (*batch, n_q_heads, n_queries, head_dim)),
        (*batch, n_kv_heads, groups, n_queries, head_dim),
    )
    k5 = xp.broadcast_to(widened(k), (*batch, n_kv_heads, n_keys, head_dim))
    v5 = xp.broadcast_to(widened(v), (*batch, n_kv_heads, n_keys, value_dim))
    bias5 = None if bias is None else grouped_scores(widened(bias))
    return GroupedInputs(
        xp=xp,
        q=q5,
        k=k5[..., None, :, :],
        v=v5[..., None, :, :],
        allowed=allowed,
        bias=bias5,
        scale=1.0 / math.sqrt(head_dim) if scale is None else scale,
        out_dtype=q.dtype,
        out_shape=(*batch, n_q_heads, n_queries, value_dim),
    )


def allowed_scores(problem: GroupedInputs) -> tuple[Any, Any]:
    """Scaled, biased scores and the boolean set S(i) of keys each query may attend.

    A key is allowed when the mask and the causal rule allow it and its bias is not
    -inf (SDPA-3.3).  Disallowed scores are set to -inf.
    """
    scores, allowed, _ = allowed_and_capped_scores(problem)
    return scores, allowed


def allowed_and_capped_scores(problem: GroupedInputs) -> tuple[Any, Any, Any]:
    """:func:`allowed_scores` and the capped scaled product c tanh(alpha q.k / c) it
    adds the biases to (None without softcap), the same array to the bit."""
    xp = problem.xp
    scores = xp.matmul(problem.q, xp.matrix_transpose(problem.k)) * problem.scale
    capped = None
    if problem.softcap is not None:  # on the scaled product, before any bias (SOFTCAP-1)
        scores = capped = softcapped(xp, scores, problem.softcap)
    if problem.bias is not None:
        scores = scores + problem.bias
    if problem.alibi is not None:
        scores = scores + problem.alibi
    allowed = scores != -xp.inf
    if problem.allowed is not None:
        allowed = xp.logical_and(allowed, problem.allowed)
    return xp.where(allowed, scores, xp.full_like(scores, -xp.inf)), allowed, capped


def softmax_over_allowed(xp: ModuleType, scores: Array, allowed: Array) -> Array:
    """Softmax over the key axis of the allowed scores (SDPA-7.1, SDPA-5.1).

    Rows with no allowed key get all-zero weights.  Disallowed positions never reach
    an arithmetic operation, so no value there (NaN included) can leak (SDPA-8).
    """
    if scores.shape[-1] == 0:
        return scores
    row_max = xp.max(scores, axis=-1, keepdims=True)
    # A row with nothing allowed has max -inf; shifting it by 0 keeps it NaN-free.
    row_max = xp.where(row_max == -xp.inf, xp.zeros_like(row_max), row_max)
    shifted = xp.where(allowed, scores, row_max) - row_max
    exps = xp.where(allowed, xp.exp(shifted), xp.zeros_like(scores))
    total = xp.sum(exps, axis=-1, keepdims=True)
    return exps / xp.where(total == 0, xp.ones_like(total), total)


def weighted_values(xp: ModuleType, weights: Array, allowed: Array, v: Array) -> Array:
    """``weights @ v`` where disallowed keys contribute nothing even if v is not finite.

    A plain matmul computes 0 * NaN = NaN for a masked key whose value is NaN; the spec
    excludes masked keys from the sum altogether (SDPA-8.2), while non-finite values of
    allowed keys propagate even when their weight underflows to 0 (SDPA-8.3).
    """
    finite = xp.isfinite(v)
    if bool(xp.all(finite)):
        return xp.matmul(weights, v)
    out = xp.matmul(weights, xp.where(finite, v, xp.zeros_like(v)))
    return with_nonfinite_values(xp, out, nonfinite_counts(xp, allowed, v))


class NonFiniteCounts(NamedTuple):
    """Per query and value column, how many allowed keys hold NaN, +inf and -inf."""

    nan: Any
    pos_inf: Any
    neg_inf: Any


def nonfinite_counts(xp: ModuleType, allowed: Array, v: Array) -> NonFiniteCounts:
    """The allowed keys whose value in each column is NaN, +inf, -inf (SDPA-8.3)."""
    reaches = xp.astype(allowed, v.dtype)

    def count(selected: Any) -> Any:
        return xp.matmul(reaches, xp.astype(selected, v.dtype))

    return NonFiniteCounts(count(xp.isnan(v)), count(v == xp.inf), count(v == -xp.inf))


def with_nonfinite_values(xp: ModuleType, out: Array, counts: NonFiniteCounts) -> Array:
    """``out`` (the sum over the finite values) where an allowed key's non-finite value
    decides the result: that infinity, or NaN for NaN or both infinities (SDPA-8.3)."""
    out = xp.where(counts.pos_inf > 0, xp.full_like(out, xp.inf), out)
    out = xp.where(counts.neg_inf > 0, xp.full_like(out, -xp.inf), out)
    undefined = xp.logical_or(
        counts.nan > 0, xp.logical_and(counts.pos_inf > 0, counts.neg_inf > 0)
    )
    return xp.where(undefined, xp.full_like(out, xp.nan), out)


def with_features(
    problem: GroupedInputs,
    *,
    softcap: Any = None,
    alibi_slopes: Array = None,
    causal_alignment: str = "top_left",
    call: str = CALL,
) -> GroupedInputs:
    """``problem`` with logit softcapping (SOFTCAP-1, SOFTCAP-2) and the ALiBi bias of
    ``alibi_slopes`` (ALIBI-1, ALIBI-2), measured from the corner of ``causal_alignment``."""
    softcap = check_softcap(softcap, call)
    alibi = None
    if alibi_slopes is not None:
        n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
        offset = causal_offset(n_queries, n_keys, causal_alignment)
        alibi = grouped_alibi(problem, alibi_slopes, offset, call)
    return problem._replace(softcap=softcap, alibi=alibi)


def prepare_with_features(
    q: Array, k: Array, v: Array, options: ScoreOptions, call: str
) -> GroupedInputs:
    """:func:`prepare` then :func:`with_features`: the problem with every option of
    ``options`` applied, checked in that order."""
    problem = prepare(q, k, v, **filled(DenseOptions, options), call=call)
    return with_features(
        problem,
        softcap=options["softcap"],
        alibi_slopes=options["alibi_slopes"],
        causal_alignment=options["causal_alignment"],
        call=call,
    )


def plain_form(q: Array, k: Array, v: Array, options: AttentionOptions, call: str) -> Any:
    """:func:`plain_attention` with its keywords as one value (each present: see
    :func:`~.options.filled`); errors name ``call``.  The entry point
    ``scaled_dot_product_attention`` calls it with its own name."""
    return_weights = check_flag("return_weights", options["return_weights"], call)
    return_lse = check_flag("return_lse", options["return_lse"], call)
    dropout_keep = options["dropout_keep"]
    namespace_of(call, q=q, alibi_slopes=options["alibi_slopes"], dropout_keep=dropout_keep)
    dropout_p = check_dropout_p(options["dropout_p"], call)
    problem = prepare_with_features(q, k, v, options, call)
    xp = problem.xp
    scores, allowed = allowed_scores(problem)
    weights = dropped_weights(
        problem, softmax_over_allowed(xp, scores, allowed), dropout_p, dropout_keep, call
    )
    values = weighted_values(xp, weights, allowed, problem.v)
    out = xp.astype(xp.reshape(values, problem.out_shape), problem.out_dtype)
    results = [out]
    if return_weights:
        weights_shape = (*problem.out_shape[:-1], weights.shape[-1])
        results.append(xp.astype(xp.reshape(weights, weights_shape), problem.out_dtype))
    if return_lse:
        results.append(xp.reshape(log_sum_exp(xp, scores, allowed), problem.out_shape[:-1]))
    return results[0] if len(results) == 1 else tuple(results)


@shows_options(AttentionOptions)
def plain_attention(q: Array, k: Array, v: Array, **given: Unpack[AttentionOptions]) -> Any:
    """``scaled_dot_product_attention`` in its plain form: the spec's text in code.

    The same function, arguments, checks and results as the public entry point (its
    docstring says what each argument means, with the clauses), computed from the whole
    ``Lq x Lk`` score matrix at once, so memory grows with ``Lq * Lk``.

    For reading beside spec/dense.md, for teaching and for the oracle tests; the entry
    point is faster and runs in O(Lq + Lk) extra memory.
    """
    return plain_form(q, k, v, filled(AttentionOptions, given), PLAIN_CALL)
