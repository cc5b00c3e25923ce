"""Attention sinks (spec/serving.md, SINK-1 … SINK-4).

A sink logit joins every row's softmax denominator and has no value: the output with sinks
is the merge (MERGE-1) of the state over the keys with the state ``(0, sigma_h)``, which is
how :func:`with_sinks` computes it, on the dense definition's own output and log-sum-exp.
Sink *tokens* (StreamingLLM) are ordinary keys kept visible beside a causal window: a mask,
:func:`streaming_mask`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import array_api_compat

from .._array import Array
from .._checks import (
    check_flag,
    check_size,
    namespace_of,
    require_broadcastable_to,
    require_real_floating,
)
from .._keywords import Creation, shows_creation
from ..attention import scaled_dot_product_attention
from ..options import ReturnLse, ScoreOptions, filled, shows_options
from ..sdpa import compute_dtype
from .merge import merge_attention_states
from .positions import query_and_key_positions

if TYPE_CHECKING:
    from typing import Unpack

CALL = "sink_attention(q, k, v, sinks)"
STREAMING = "streaming_mask(n_queries, n_keys, n_sink_tokens, window)"


def check_sinks(
    xp: ModuleType, sinks: Array, n_q_heads: int, batch: tuple[int, ...], call: str
) -> None:
    """SINK-1: a real floating array of shape (..., Hq) broadcasting to (*batch, Hq)."""
    require_real_floating(xp, call, "SINK-1", sinks=sinks)
    if sinks.ndim < 1 or sinks.shape[-1] != n_q_heads:
        raise ValueError(
            f"sinks.shape={tuple(sinks.shape)}, but should be (Hq,) = ({n_q_heads},), one "
            f"sink logit per query head, or (..., Hq) [SINK-1, {call}]"
        )
    require_broadcastable_to("sinks", tuple(sinks.shape), (*batch, n_q_heads), call, "SINK-1")


def with_sinks(out: Array, lse: Array, sinks: Array) -> tuple[Array, Array]:
    """The state ``(out, lse)`` over the keys, ``out (..., Hq, Lq, Ev)``, ``lse (..., Hq,
    Lq)``, with the sink logits ``(..., Hq)`` added to every row's denominator (SINK-1 …
    SINK-3): the merge with the state ``(0, sigma_h)``.  A row without keys gives 0 and
    ``lse = sigma_h``."""
    xp = array_api_compat.array_namespace(out, lse, sinks)
    sink_lse = xp.broadcast_to(xp.astype(sinks, lse.dtype)[..., None], lse.shape)
    return merge_attention_states(out, lse, xp.zeros_like(out), sink_lse)


class SinkOptions(ScoreOptions, ReturnLse, total=False):
    """``sink_attention``'s keywords: the dense definition's that decide the scores, and
    ``return_lse``."""


@shows_options(SinkOptions)
def sink_attention(q: Array, k: Array, v: Array, sinks: Array, **given: Unpack[SinkOptions]) -> Any:
    """Attention with one sink logit per query head (SINK-1): the dense definition of
    :func:`~attnspec.reference.scaled_dot_product_attention` with ``e^sinks[h]`` added to
    every denominator, the sink unscaled, uncapped, unmasked and without a value.

    ``sinks`` is ``(Hq,)`` or ``(..., Hq)``.  Returns ``out`` in q's dtype, or ``(out,
    lse)`` with the log-sum-exp of the whole denominator (SINK-3) in the accumulation dtype.
    """
    options = filled(SinkOptions, given)
    return_lse = check_flag("return_lse", options["return_lse"], CALL)
    xp = namespace_of(CALL, q=q, k=k, v=v, sinks=sinks)
    require_real_floating(xp, CALL, "SDPA-1.4", q=q, k=k, v=v)
    out, lse = attention_with_sinks(q, k, v, sinks, filled(ScoreOptions, options), CALL)
    return (out, lse) if return_lse else out


def attention_with_sinks(
    q: Array, k: Array, v: Array, sinks: Array | None, options: Mapping[str, Any], call: str
) -> tuple[Any, Any]:
    """``(out, lse)`` of the dense definition with ``options`` (the keywords of
    :func:`~attnspec.reference.scaled_dot_product_attention` that decide the scores), with
    ``sinks (..., Hq)`` in every row's denominator (SINK-1 … SINK-3; None: without): the
    function of :func:`sink_attention` and of each sequence of a packed or cache call."""
    if sinks is None:
        out, lse = scaled_dot_product_attention(q, k, v, **options, return_lse=True)
        return out, lse
    xp = array_api_compat.array_namespace(q, k, v, sinks)
    # The dense output is kept in the accumulation precision until the sink is merged in,
    # so that a half-precision result is rounded once (SDPA-7.2).
    work = compute_dtype(xp, q.dtype)
    out, lse = scaled_dot_product_attention(
        xp.astype(q, work, copy=False),
        xp.astype(k, work, copy=False),
        xp.astype(v, work, copy=False),
        **options,
        return_lse=True,
    )
    check_sinks(xp, sinks, lse.shape[-2], tuple(lse.shape[:-2]), call)
    out, lse = with_sinks(out, lse, sinks)
    return xp.astype(out, q.dtype), lse


@shows_creation
def streaming_mask(
    n_queries: int,
    n_keys: int,
    n_sink_tokens: int,
    window: int,
    alignment: str = "bottom_right",
    **where: Unpack[Creation],
) -> Array:
    """SINK-4's allowed set as a boolean ``(n_queries, n_keys)`` mask: key j is visible to
    query i iff ``j <= t_i`` and (``j < n_sink_tokens`` or ``t_i - window <= j``), with
    ``t_i = i + d`` for the alignment's offset d."""
    for name, value in (
        ("n_queries", n_queries),
        ("n_keys", n_keys),
        ("n_sink_tokens", n_sink_tokens),
        ("window", window),
    ):
        check_size(name, value, STREAMING)
    xp, t, j = query_and_key_positions(n_queries, n_keys, alignment, where, STREAMING, "SINK-4")
    kept = xp.logical_or(j < n_sink_tokens, j >= t - window)
    return xp.logical_and(j <= t, kept)
