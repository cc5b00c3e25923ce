"""The RoPE accuracy clause as code: the a-priori bound of ROPE-3 (spec/dense.md).

Given the exact input values a kernel saw and the dtype it computed in, returns the float64
evaluation of ROPE-1 and, for every element, the largest error a kernel that computes its
angles in the accumulation precision can make.  The derivation is in the spec; this module
only evaluates it.  The angle error grows with the angle itself (it is not reduced modulo
2 pi), so the bound of a feature at position 10^5 is much wider than at position 0.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import array_api_compat

from ._array import Array
from ._checks import check_choice, namespace_of, require_real_floating
from .positional import (
    ROPE_LAYOUTS,
    _angle_dtype,
    _check_base,
    _inverse_frequencies,
    _positions,
    apply_rope,
    rope_pairs,
    rotary_dim_of,
)
from .tolerance import (
    SAFETY_FACTOR,
    UNDERFLOW_THRESHOLD,
    UNIT_ROUNDOFF,
    accumulation_roundoff,
)

# ROPE-3: cos and sin accurate to two units in the last place of the accumulation format
COS_SIN_ROUNDOFFS = 4
# ROPE-3: a computed feature rounds three times (two products, one sum) where it may be subnormal
SUBNORMAL_ROUNDINGS = 3


class RopeBound(NamedTuple):
    """ROPE-1 evaluated in float64 (``rotated``) and the ROPE-3 bound per element
    (``tolerance``; 0 for the features beyond the rotary dimension, returned exactly)."""

    rotated: Any
    tolerance: Any


def angle_roundoff(pair: int, rotary_dim: int, base: float, dtype: str) -> float:
    """kappa_i of ROPE-3: the relative error of a computed angle p * theta_i, from
    theta_i = base^(-x_i), x_i = (2i/r) ln base, evaluated in the accumulation precision."""
    x = abs(2 * pair / rotary_dim * math.log(base))
    return (3 * x + 6) * accumulation_roundoff(dtype)


def rope_error_bound(
    x: Array,
    positions: Array = None,
    *,
    dtype: str,
    base: float = 10000.0,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
) -> RopeBound:
    """ROPE-1 on ``x (..., L, d)`` (float64 values exact in ``dtype``) and the ROPE-3 bound
    of a kernel computing in ``dtype`` ("float16", "bfloat16", "float32" or "float64")."""
    call = "rope_error_bound(x, positions, dtype=)"
    xp = namespace_of(call, x=x, positions=positions)
    require_real_floating(xp, call, "ROPE-3", x=x)
    check_choice("dtype", dtype, tuple(UNIT_ROUNDOFF), call, "ROPE-3")
    check_choice("layout", layout, ROPE_LAYOUTS, call, "ROPE-1")
    base = _check_base(base, call, "ROPE-1")
    d = x.shape[-1]
    r = rotary_dim_of(d, rotary_dim, call)
    positions = _positions(xp, x, positions, call)
    device = array_api_compat.device(x)
    wide = _angle_dtype(xp, device)
    x64 = xp.astype(x, wide)
    rotated = apply_rope(x64, positions, base=base, layout=layout, rotary_dim=r)

    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    half = r // 2
    angles = xp.abs(
        xp.astype(positions, wide)[..., None]
        * _inverse_frequencies(xp, half, r, base, wide, device)
    )
    kappa = xp.asarray(
        [angle_roundoff(i, r, base, dtype) for i in range(half)], dtype=wide, device=device
    )
    a, b = rope_pairs(x64[..., :r], layout)
    pair_size = xp.abs(a) + xp.abs(b)
    per_pair = pair_size * (kappa * angles + COS_SIN_ROUNDOFFS * u_a + 2 * u_d)
    # both features of a pair share its term; lay it out as the pairs are laid out
    if layout == "interleaved":
        per_feature = xp.reshape(xp.stack([per_pair, per_pair], axis=-1), (*per_pair.shape[:-1], r))
    else:
        per_feature = xp.concat([per_pair, per_pair], axis=-1)
    floor = SUBNORMAL_ROUNDINGS * UNDERFLOW_THRESHOLD[dtype]
    tolerance = SAFETY_FACTOR * (per_feature + 2 * u_d * xp.abs(rotated[..., :r])) + floor
    if r < d:
        tolerance = xp.concat([tolerance, xp.zeros_like(rotated[..., r:])], axis=-1)
    return RopeBound(rotated, tolerance)
