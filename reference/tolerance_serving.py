"""The accuracy of serving kernels (spec/serving.md): SINK-5 (with SINK-3's log-sum-exp)
and MERGE-4 as code.

SINK-5 is TOL-2 on the problem with one more key per row, whose score is the sink logit
(counted as a bias) and whose value is 0, so the bound is the dense one evaluated on that
problem; MERGE-4 is a bound of its own, on two given states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import array_api_compat

from ._array import Array
from ._checks import check_choice, namespace_of
from .masks import causal_offset
from .options import DenseOptions, filled, shows_options
from .serving.merge import check_states, merge_attention_states
from .serving.sinks import check_sinks
from .tolerance import (
    SAFETY_FACTOR,
    UNDERFLOW_THRESHOLD,
    UNIT_ROUNDOFF,
    ErrorBound,
    LseBound,
    accumulation_roundoff,
    error_and_lse_bound,
)

if TYPE_CHECKING:
    from typing import Unpack

BOUND = "merge_error_bound(o_a, lse_a, o_b, lse_b)"
SINK_BOUND = "sink_error_and_lse_bound(q, k, v, sinks)"


class SinkBoundOptions(DenseOptions, total=False):
    """The keywords of the bound of attention with sinks (SINK-5) beside ``dtype``."""

    softcap: float | None


@shows_options(SinkBoundOptions)
def sink_error_and_lse_bound(
    q: Array, k: Array, v: Array, sinks: Array, *, dtype: str, **given: Unpack[SinkBoundOptions]
) -> tuple[ErrorBound, LseBound]:
    """SINK-5 and SINK-3 for float64 inputs holding values exactly representable in
    ``dtype`` (one batch shape for q, k, v; ``sinks (Hq,)`` or ``(..., Hq)``): TOL-2 and
    TOL-5 of the problem with a key of score ``sinks[h]`` and value 0 appended to every row,
    allowed whatever the mask and the causal rule say.  Its log-sum-exp is
    log(sum_j e^(s_ij) + e^(sinks[h])), sinks[h] for a row that sees no key."""
    options = filled(SinkBoundOptions, given)
    arguments, _ = with_sink_key(q, k, v, sinks, filled(DenseOptions, options), SINK_BOUND)
    return error_and_lse_bound(
        *arguments.pop("qkv"), dtype=dtype, softcap=options["softcap"], weights=False, **arguments
    )


def with_sink_key(
    q: Array,
    k: Array,
    v: Array,
    sinks: Array,
    options: DenseOptions,
    call: str,
) -> tuple[dict[str, Any], int]:
    """The dense problem with the sink as one more key (score sinks[h], counted as a bias;
    value 0; allowed in every row): its q, k, v under "qkv" and its mask, bias and scale,
    with the number of real keys."""
    mask, bias, scale = options["mask"], options["bias"], options["scale"]
    xp = namespace_of(call, q=q, k=k, v=v, sinks=sinks, mask=mask, bias=bias)
    *batch, n_q_heads, n_queries, head_dim = q.shape
    n_keys = k.shape[-2]
    check_sinks(xp, sinks, n_q_heads, tuple(batch), call)
    device = array_api_compat.device(q)
    scores = (*batch, n_q_heads, n_queries, n_keys)
    allowed = xp.ones(scores, dtype=xp.bool, device=device)
    if mask is not None:
        allowed = xp.logical_and(allowed, mask)
    if options["is_causal"]:  # built here: one more key would move a bottom-right corner
        offset = causal_offset(n_queries, n_keys, options["causal_alignment"])
        rows = xp.arange(n_queries, device=device)[:, None]
        allowed = xp.logical_and(
            allowed, xp.arange(n_keys, device=device)[None, :] <= rows + offset
        )
    sink_column = xp.ones((*batch, n_q_heads, n_queries, 1), dtype=xp.bool, device=device)
    biases = (
        xp.zeros(scores, dtype=q.dtype, device=device)
        if bias is None
        else xp.broadcast_to(bias, scores)
    )
    sink_scores = xp.broadcast_to(xp.astype(sinks, q.dtype)[..., None, None], sink_column.shape)

    def one_more_key(x: Any) -> Any:
        zeros = xp.zeros((*x.shape[:-2], 1, x.shape[-1]), dtype=x.dtype, device=device)
        return xp.concat([x, zeros], axis=-2)

    # the sink key's product is 0 (capped to 0 under a softcap): its score stays sinks[h]
    return {
        "qkv": (q, one_more_key(k), one_more_key(v)),
        "mask": xp.concat([allowed, sink_column], axis=-1),
        "bias": xp.concat([biases, sink_scores], axis=-1),
        "scale": head_dim**-0.5 if scale is None else scale,
    }, n_keys


class MergeBound(NamedTuple):
    """The merged state in float64 with the MERGE-4 bounds of its elements."""

    out: Any
    out_tolerance: Any
    lse: Any
    lse_tolerance: Any


def merge_error_bound(
    o_a: Array, lse_a: Array, o_b: Array, lse_b: Array, *, dtype: str
) -> MergeBound:
    """MERGE-4 for states given in float64 holding the values a ``dtype`` kernel received
    (outputs in ``dtype``, log-sum-exps in its accumulation precision)."""
    xp = check_states(o_a, lse_a, o_b, lse_b, BOUND)
    check_choice("dtype", dtype, tuple(UNIT_ROUNDOFF), BOUND, "MERGE-4")
    if o_a.dtype != xp.float64 or lse_a.dtype != xp.float64 or lse_b.dtype != xp.float64:
        raise TypeError(
            f"o_a.dtype={o_a.dtype}, lse_a.dtype={lse_a.dtype}, lse_b.dtype={lse_b.dtype}, "
            f"but should be float64: the bound is evaluated exactly [MERGE-4, {BOUND}]"
        )
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    out, lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    attends = lse != -xp.inf
    safe_lse = xp.where(attends, lse, xp.zeros_like(lse))
    parts = []
    for o_x, l_x in ((o_a, lse_a), (o_b, lse_b)):
        present = l_x != -xp.inf
        gap = xp.where(present, xp.abs(l_x - safe_lse), xp.zeros_like(l_x))
        weight = xp.where(
            present, xp.exp(xp.where(present, l_x, safe_lse) - safe_lse), xp.zeros_like(l_x)
        )
        magnitude = xp.where(present[..., None], xp.abs(o_x), xp.zeros_like(o_x))
        parts.append((gap, weight, magnitude))
    kappa = u_a * (xp.abs(safe_lse) + 4 + sum(w * g for g, w, _ in parts))
    tolerance = xp.zeros_like(out)
    floor = 2.0 + sum(m for _, _, m in parts)
    for gap, weight, magnitude in parts:
        epsilon = u_a * (gap + 2) + kappa
        tolerance = tolerance + ((xp.expm1(epsilon) + 2 * u_a) * weight)[..., None] * magnitude
    tolerance = SAFETY_FACTOR * (tolerance + u_d * xp.abs(out)) + UNDERFLOW_THRESHOLD[dtype] * floor
    tolerance = xp.where(attends[..., None], tolerance, xp.zeros_like(tolerance))
    return MergeBound(
        out, tolerance, lse, xp.where(attends, SAFETY_FACTOR * kappa, xp.zeros_like(kappa))
    )
