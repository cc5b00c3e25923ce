"""Attention on float8 inputs with descale factors (spec/serving.md, QUANT-1 … QUANT-3).

The Array API has no float8 dtype, so the reference takes the *stored* float8 values as a
floating array (float64 holds every product with a float32 descale exactly; float32 rounds
it) and checks that every element lies on the format's grid.  The real value of an element
is stored × descale (QUANT-1), and the output is the dense definition on the real values
(QUANT-2).  :func:`round_to_fp8` rounds to a format's grid (round to nearest, ties to even),
for building inputs and emulating float8 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

import array_api_compat

from .._array import Array
from .._checks import check_choice, namespace_of, require_real_floating
from .._keywords import shows_keywords
from ..attention import scaled_dot_product_attention
from ..options import DEFAULTS, CausalOptions, ReturnLse, ScoreOptions, filled

if TYPE_CHECKING:
    from typing import Unpack

CALL = "fp8_attention(q, k, v, q_descale=, k_descale=, v_descale=)"
ROUND = "round_to_fp8(x, fmt)"


@dataclass(frozen=True)
class Fp8Format:
    """A float8 format (QUANT-1): significand bits after the point, the exponent of its
    smallest normal number, its largest finite value, and what overflow gives."""

    mantissa_bits: int
    min_normal_exponent: int
    largest: float
    overflow: float

    @property
    def unit_roundoff(self) -> float:
        """u_f of QUANT-4: half the spacing of [1, 2)."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def subnormal_spacing(self) -> float:
        return 2.0 ** (self.min_normal_exponent - self.mantissa_bits)


FP8_FORMATS = {
    # no infinities: its all-ones pattern is NaN, so overflow is NaN
    "float8_e4m3fn": Fp8Format(3, -6, 448.0, float("nan")),
    "float8_e5m2": Fp8Format(2, -14, 57344.0, float("inf")),
}


def _format(fmt: Any, call: str) -> Fp8Format:
    return FP8_FORMATS[check_choice("fmt", fmt, tuple(FP8_FORMATS), call, "QUANT-1")]


def round_to_fp8(x: Array, fmt: str) -> Array:
    """``x`` rounded to the nearest value of float8 format ``fmt`` (ties to even), in x's
    dtype; magnitudes past the largest finite value give the format's overflow (NaN for
    ``float8_e4m3fn``, inf for ``float8_e5m2``); NaN stays NaN."""
    xp = namespace_of(ROUND, x=x)
    require_real_floating(xp, ROUND, "QUANT-1", x=x)
    f = _format(fmt, ROUND)
    magnitude = xp.abs(x)
    regular = xp.logical_and(magnitude > 0, xp.isfinite(magnitude))
    safe = xp.where(regular, magnitude, xp.ones_like(magnitude))
    exponent = xp.floor(xp.log2(safe))
    # log2 may round across a power of two: settle the binade exactly
    exponent = xp.where(2.0**exponent > safe, exponent - 1, exponent)
    exponent = xp.where(2.0 ** (exponent + 1) <= safe, exponent + 1, exponent)
    quantum = 2.0 ** (xp.maximum(exponent, float(f.min_normal_exponent)) - f.mantissa_bits)
    rounded = xp.round(safe / quantum) * quantum  # Array API round: half to even
    rounded = xp.where(rounded > f.largest, xp.full_like(rounded, f.overflow), rounded)
    rounded = xp.where(regular, rounded, magnitude)
    return xp.where(x < 0, -rounded, rounded)


def check_on_grid(xp: ModuleType, name: str, x: Array, fmt: str, call: str) -> None:
    """QUANT-1: every element of ``x`` is a finite value of the float8 format."""
    off = xp.logical_not(xp.logical_and(xp.isfinite(x), round_to_fp8(x, fmt) == x))
    if bool(xp.any(off)):
        count = int(xp.sum(xp.astype(off, xp.int32)))
        raise ValueError(
            f"{name} holds {count} value(s) that are not finite {fmt} values, but should hold "
            f"the stored float8 values (e.g. round_to_fp8(x, {fmt!r})) [QUANT-1, {call}]"
        )


def head_descale(
    xp: ModuleType, name: str, d: Any, like: Any, heads: int, kv_heads: int, call: str
) -> Any:
    """A descale as an array broadcasting to ``(..., heads, 1, 1)``: per tensor (a number,
    shape () or (1,)), per head ``(..., heads)``, or for query heads per key/value head
    ``(..., kv_heads)``, shared by each group (QUANT-1)."""
    if isinstance(d, (int, float)):  # a Python number: on the stored array's device
        d = xp.asarray(float(d), dtype=like.dtype, device=array_api_compat.device(like))
    require_real_floating(xp, call, "QUANT-1", **{name: d})
    if not bool(xp.all(xp.logical_and(d > 0, xp.isfinite(d)))):
        raise ValueError(f"{name} should hold positive finite numbers [QUANT-1, {call}]")
    if d.ndim == 0 or d.shape[-1] in (1, heads):
        return d[..., None, None] if d.ndim else d
    if d.shape[-1] == kv_heads:
        groups = heads // kv_heads
        shared = xp.broadcast_to(d[..., None], (*d.shape, groups))
        return xp.reshape(shared, (*d.shape[:-1], heads))[..., None, None]
    raise ValueError(
        f"{name}.shape={tuple(d.shape)}, but should be () or (1,) per tensor, or end in the "
        f"number of heads ({heads}) or of key/value heads ({kv_heads}) [QUANT-1, {call}]"
    )


class _Descales(TypedDict):
    q_descale: Any
    k_descale: Any
    v_descale: Any


class Fp8Inputs(_Descales, total=False):
    """What makes stored float8 values real (QUANT-1): the three descales, required
    (``q_descale=None`` for queries given in half precision beside a float8 cache,
    QUANT-8), and the format (default ``float8_e4m3fn``).  The functions of stored float8
    inputs take them as ``**fp8``, shown by :data:`shows_fp8_inputs`."""

    fmt: str


DEFAULT_FORMAT = "float8_e4m3fn"
FP8_DEFAULTS = {**DEFAULTS, "fmt": DEFAULT_FORMAT}  # and those of options
shows_fp8_inputs = shows_keywords(Fp8Inputs, FP8_DEFAULTS)


@shows_fp8_inputs
def real_values(
    q: Array, k: Array, v: Array, *, call: str = CALL, **fp8: Unpack[Fp8Inputs]
) -> tuple[Array, Array, Array]:
    """QUANT-1: the stored values checked against the format, times their descales;
    ``q_descale=None``: q is not stored in float8 but given in half precision, its values
    taken as they are (QUANT-8, a float8 cache)."""
    xp = namespace_of(call, q=q, k=k, v=v)
    require_real_floating(xp, call, "QUANT-1", q=q, k=k, v=v)
    fmt = fp8.get("fmt", DEFAULT_FORMAT)
    _format(fmt, call)
    unquantised_q = fp8["q_descale"] is None
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 3:
            raise ValueError(
                f"{name}.shape={tuple(x.shape)}, but should have at least 3 dims laid out "
                f"as (..., heads, length, head_dim) [SDPA-1.1, {call}]"
            )
        if not (name == "q" and unquantised_q):
            check_on_grid(xp, name, x, fmt, call)
    n_q_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    k, v = (
        x * xp.astype(head_descale(xp, f"{name}_descale", d, x, heads, n_kv_heads, call), x.dtype)
        for name, x, d, heads in (
            ("k", k, fp8["k_descale"], n_kv_heads),
            ("v", v, fp8["v_descale"], n_kv_heads),
        )
    )
    if not unquantised_q:
        descale = head_descale(xp, "q_descale", fp8["q_descale"], q, n_q_heads, n_kv_heads, call)
        q = q * xp.astype(descale, q.dtype)
    return q, k, v


class Fp8AttentionOptions(Fp8Inputs, CausalOptions, ReturnLse, total=False):
    """``fp8_attention``'s keywords: :class:`Fp8Inputs`, the dense definition's causal rule,
    ``scale``, ``mask`` and ``softcap``, ``return_lse`` and ``out_dtype``."""

    out_dtype: Any
    mask: Array
    softcap: float | None


@shows_keywords(Fp8AttentionOptions, FP8_DEFAULTS)
def fp8_attention(q: Array, k: Array, v: Array, **given: Unpack[Fp8AttentionOptions]) -> Any:
    """QUANT-2: the dense definition on the real values ``stored × descale`` of ``q``,
    ``k``, ``v`` (stored float8 values given as a floating array, checked against ``fmt``),
    returned in ``out_dtype`` (default: the stored arrays' dtype).  Pass float64 arrays for
    the exact definition: float64 holds every product of a float8 value and a float32
    descale exactly."""
    options = filled(Fp8AttentionOptions, given, FP8_DEFAULTS)
    return_lse, out_dtype = options["return_lse"], options["out_dtype"]
    xp = namespace_of(CALL, q=q, k=k, v=v)
    real_q, real_k, real_v = real_values(q, k, v, **filled(Fp8Inputs, options))
    scores = filled(ScoreOptions, options)
    result = scaled_dot_product_attention(real_q, real_k, real_v, **scores, return_lse=return_lse)
    out_dtype = q.dtype if out_dtype is None else out_dtype
    if return_lse:
        return xp.astype(result[0], out_dtype), result[1]
    return xp.astype(result, out_dtype)
