"""QUANT-4 as code: the accuracy a float8 attention kernel must reach (spec/serving.md).

TOL-2 on the real values (stored × descale) in float32 arithmetic throughout, with (E + 8) u_a
for the descale products, plus the rounding of the output to its dtype and, for a kernel that
rounds its unnormalised weights to a float8 format before P V (QUANT-3), the term
``2 sum_j min(u_f p_ij + eta_f max_l p_il, p_ij) |v_jc|``.  Queries given in half precision
beside a float8 cache (QUANT-8) get that term for the weights rounded to q's own dtype, and one
more rounding of the output.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import array_api_compat

from ._array import Array
from ._checks import check_choice
from ._keywords import shows_keywords
from .options import DEFAULTS, CausalOptions, DenseOptions, filled
from .serving.fp8 import DEFAULT_FORMAT, FP8_FORMATS, Fp8Inputs, head_descale, real_values
from .tolerance import SAFETY_FACTOR, UNDERFLOW_THRESHOLD, UNIT_ROUNDOFF, error_bound
from .tolerance_serving import with_sink_key

if TYPE_CHECKING:
    from typing import Unpack

CALL = "fp8_error_bound(q, k, v, q_descale=, k_descale=, v_descale=, out_dtype=)"
OUT_DTYPES = ("float16", "bfloat16", "float32")
# Four more roundings per score than TOL-2 counts: the descale products folded into the scale
# (QUANT-4's (E + 8) u_a); zero columns raise TOL-2's E by exactly that, and change no score.
_DESCALE_COLUMNS = 4
# QUANT-4: Q bounds the rounding of the weights exactly, so only the oracle's share of C = 4.
WEIGHTS_FACTOR = 2.0


class Fp8Bound(NamedTuple):
    """The float64 output on the real values and its QUANT-4 bound, ``(..., Hq, Lq, Ev)``;
    ``weights_term`` is 2 Q of QUANT-4 (0 without float8 weights)."""

    out: Any
    out_tolerance: Any
    weights_term: Any


class _OutDtype(TypedDict):
    out_dtype: str


class _Mask(_OutDtype, total=False):
    weights_format: str | None
    mask: Array


class Fp8BoundOptions(Fp8Inputs, _Mask, CausalOptions, total=False):
    """``fp8_error_bound``'s keywords: the descales and ``out_dtype`` are required."""

    softcap: float | None
    sinks: Array


_DEFAULTS = {**DEFAULTS, "fmt": DEFAULT_FORMAT}


@shows_keywords(Fp8BoundOptions, _DEFAULTS)
def fp8_error_bound(q: Array, k: Array, v: Array, **given: Unpack[Fp8BoundOptions]) -> Fp8Bound:
    """QUANT-4 for stored float8 values given as float64 arrays (one batch shape for q, k
    and v) and float64 descales; ``weights_format`` is the float8 format the kernel rounds
    its weights to (QUANT-3), or None.  With ``q_descale=None`` q is given in ``out_dtype``
    beside a float8 cache and QUANT-8's bound applies: QUANT-4's, with Q for the weights
    rounded to that dtype and one more rounding of the output (the value descale applied
    after it).  With a ``softcap`` (on the real values' scaled
    scores) TOL-4's term joins, with ``sinks (Hq,)`` the sink is one more key (SINK-5),
    both as QUANT-5 says.  Evaluates the weights, so memory grows with Lq × Lk."""
    settings = filled(Fp8BoundOptions, given, _DEFAULTS)
    out_dtype, weights_format = settings["out_dtype"], settings["weights_format"]
    mask, sinks = settings["mask"], settings["sinks"]
    scale, softcap = settings["scale"], settings["softcap"]
    check_choice("out_dtype", out_dtype, OUT_DTYPES, CALL, "QUANT-2")
    if weights_format is not None:
        check_choice("weights_format", weights_format, tuple(FP8_FORMATS), CALL, "QUANT-3")
    real_q, real_k, real_v = real_values(q, k, v, call=CALL, **filled(Fp8Inputs, settings))
    xp = array_api_compat.array_namespace(real_q, real_k, real_v)
    device = array_api_compat.device(real_q)

    def padded(x: Any) -> Any:
        zeros = xp.zeros((*x.shape[:-1], _DESCALE_COLUMNS), dtype=x.dtype, device=device)
        return xp.concat([x, zeros], axis=-1)

    # float32 arithmetic throughout (the scale and descales applied in float32 to exact
    # products of float8 values), then the output rounded to its own dtype
    alpha = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dense = DenseOptions(mask=mask, bias=None, **filled(CausalOptions, settings))
    dense["scale"] = alpha
    options: dict[str, Any] = {**dense}
    if sinks is not None:  # SINK-5: the sink as one more key, of score sinks[h] and value 0
        options, _ = with_sink_key(real_q, real_k, real_v, sinks, dense, CALL)
        real_q, real_k, real_v = options.pop("qkv")
    options["softcap"] = softcap
    bound = error_bound(padded(real_q), padded(real_k), real_v, dtype="float32", **options)
    p = bound.weights  # (..., Hq, Lq, Lk)
    *batch, n_q_heads, n_queries, n_keys = p.shape
    n_kv_heads = real_v.shape[-3]
    finite_v = xp.where(xp.isfinite(real_v), xp.abs(real_v), xp.zeros_like(real_v))

    def times_values(weights: Any) -> Any:
        """sum_j weights_ij |v_jc| for every query head (GQA groups share v)."""
        shape = (*batch, n_kv_heads, n_q_heads // n_kv_heads, n_queries, n_keys)
        product = xp.matmul(xp.reshape(weights, shape), finite_v[..., None, :, :])
        return xp.reshape(product, bound.out.shape)

    finite = xp.isfinite(bound.out)
    out_size = xp.where(finite, xp.abs(bound.out), xp.zeros_like(bound.out))
    rounding = (
        SAFETY_FACTOR
        * (UNIT_ROUNDOFF[out_dtype] - UNIT_ROUNDOFF["float32"])
        * (times_values(p) + out_size)
    )
    # every key's |v| (an upper bound of the allowed keys' sum of TOL-2's floor)
    floor = (UNDERFLOW_THRESHOLD[out_dtype] - UNDERFLOW_THRESHOLD["float32"]) * (
        n_keys + 2 + times_values(xp.ones_like(p))
    )
    # QUANT-8: queries in q's half precision beside a float8 cache; the output is rounded in
    # the stored values' units (its subnormal spacing times the value descale in real units)
    # and once more when the value descale is applied
    unquantised_q = settings["q_descale"] is None
    if unquantised_q:
        v_descale = head_descale(
            xp, "v_descale", settings["v_descale"], real_v, n_q_heads, n_kv_heads, CALL
        )
        stored_floor = 0.5 * UNDERFLOW_THRESHOLD[out_dtype] * xp.astype(v_descale, p.dtype)
        rounding = rounding + SAFETY_FACTOR * (UNIT_ROUNDOFF[out_dtype] * out_size + stored_floor)
    tolerance = bound.out_tolerance + xp.where(finite, rounding + floor, xp.zeros_like(rounding))
    term = xp.zeros_like(bound.out)
    unit, half_spacing = _weights_rounding(weights_format, out_dtype if unquantised_q else None)
    if unit:
        largest = xp.max(p, axis=-1, keepdims=True) if n_keys else p
        error = xp.minimum(unit * p + half_spacing * largest, p)
        term = WEIGHTS_FACTOR * times_values(error)
        tolerance = xp.where(finite, tolerance + term, tolerance)
    return Fp8Bound(bound.out, tolerance, term)


def _weights_rounding(weights_format: str | None, half_dtype: str | None) -> tuple[float, float]:
    """u_f and eta_f of QUANT-4's Q: the float8 format the weights are rounded to
    (QUANT-3), else, beside a float8 cache, q's own dtype (QUANT-8: P rounded to it for the
    P V product, eta half its smallest spacing TOL-2 counts, sigma_d), else (0, 0)."""
    if weights_format is not None:
        f = FP8_FORMATS[weights_format]
        return f.unit_roundoff, 0.5 * f.subnormal_spacing
    if half_dtype is not None:
        return UNIT_ROUNDOFF[half_dtype], 0.5 * UNDERFLOW_THRESHOLD[half_dtype]
    return 0.0, 0.0
