"""Position encodings of spec/dense.md: sinusoidal (POS-1) and rotary (ROPE-1, ROPE-2).

Angles ``p * theta_i`` grow with the position, and a float32 angle at position 10^5 is
off by ~0.01 rad; so angles, sines and cosines are evaluated in float64 whenever the
namespace has it on the device, and only the result is rounded to the requested dtype.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import array_api_compat

from ._array import Array
from ._checks import (
    check_choice,
    check_size,
    namespace_of,
    require_broadcastable_to,
    require_real_floating,
)
from .masks import creation_namespace
from .sdpa import compute_dtype

ROPE_LAYOUTS = ("interleaved", "half")
FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")


def _check_base(base: Any, call: str, clause: str) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base={base!r}, but should be a real number > 0 [{clause}, {call}]")
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"base={base!r}, but should be finite and > 0 [{clause}, {call}]")
    return float(base)


def _resolve_dtype(xp: ModuleType, dtype: Any, device: Any, call: str) -> Any:
    """The namespace's floating dtype for ``dtype``: a name such as "bfloat16" or a dtype."""
    if dtype is None:
        return xp.__array_namespace_info__().default_dtypes(device=device)["real floating"]
    if isinstance(dtype, str):
        if dtype not in FLOAT_DTYPE_NAMES or not hasattr(xp, dtype):
            available = [n for n in FLOAT_DTYPE_NAMES if hasattr(xp, n)]
            raise ValueError(
                f"dtype={dtype!r}, but should be one of {available} for {xp.__name__} [{call}]"
            )
        return getattr(xp, dtype)
    try:
        floating = xp.isdtype(dtype, "real floating")
    except (TypeError, ValueError):
        floating = False
    if not floating:
        raise TypeError(
            f"dtype={dtype!r}, but should be a real floating dtype of {xp.__name__} or one "
            f"of {FLOAT_DTYPE_NAMES} [{call}]"
        )
    return dtype


def _angle_dtype(xp: ModuleType, device: Any) -> Any:
    """float64 where the device has it (see the module docstring), else float32."""
    available = xp.__array_namespace_info__().dtypes(device=device, kind="real floating")
    return xp.float64 if "float64" in available else xp.float32


def _inverse_frequencies(
    xp: ModuleType, n_pairs: int, d: int, base: float, dtype: Any, device: Any
) -> Any:
    """theta_i = base^(-2i/d) for i = 0 .. n_pairs-1 (POS-1, ROPE-1)."""
    exponents = xp.arange(n_pairs, dtype=dtype, device=device) * (2.0 / d)
    return base ** (-exponents)


def sinusoidal_positional_encoding(
    n: int,
    d: int,
    *,
    base: float = 10000.0,
    dtype: Any = None,
    xp: ModuleType | None = None,
    device: Any = None,
) -> Array:
    """The ``(n, d)`` sinusoidal table of Vaswani et al. 2017 (POS-1).

    ``PE[p, 2i] = sin(p / base^(2i/d))`` and ``PE[p, 2i+1] = cos(p / base^(2i/d))`` for
    p = 0..n-1; for odd d the last column is the sine of its (incomplete) pair.
    ``dtype`` is a dtype name or object (default: the namespace's default floating
    dtype); ``xp``/``device`` default to the selected backend.
    """
    call = "sinusoidal_positional_encoding(n, d)"
    n = check_size("n", n, call)
    d = check_size("d", d, call, minimum=1)
    base = _check_base(base, call, "POS-1")
    xp, device = creation_namespace(xp, device)
    dtype = _resolve_dtype(xp, dtype, device, call)
    angle_dtype = _angle_dtype(xp, device)
    n_pairs = (d + 1) // 2
    positions = xp.arange(n, dtype=angle_dtype, device=device)[:, None]
    angles = positions * _inverse_frequencies(xp, n_pairs, d, base, angle_dtype, device)
    # Column 2i is the sine and 2i+1 the cosine of pair i: stack, then flatten the pairs.
    table = xp.reshape(xp.stack([xp.sin(angles), xp.cos(angles)], axis=-1), (n, 2 * n_pairs))
    return xp.astype(table[:, :d], dtype)


def apply_rope(
    x: Array,
    positions: Array = None,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
) -> Array:
    """Rotary position embedding (Su et al. 2021) of ``x (..., L, d)`` (ROPE-1).

    Feature pair i of the token at position p is rotated by the angle ``p * theta_i``,
    ``theta_i = base^(-2i/r)``: ``(a, b) -> (a cos - b sin, a sin + b cos)``, for the
    first ``r = rotary_dim`` features (default all ``d``; r even), and the features from
    r on are returned unchanged (GPT-J's ``rotary_dim``, GPT-NeoX's ``rotary_pct``).  The
    pairs are features ``(2i, 2i+1)`` for ``layout="interleaved"`` (the paper, GPT-J) and
    ``(i, i + r/2)`` for ``layout="half"`` (GPT-NeoX, HF LLaMA ``rotate_half``).
    ``positions`` defaults to ``arange(L)``; otherwise an integer array of x's library
    that broadcasts to ``x.shape[:-1]`` (e.g. ``(L,)`` or per-sequence ``(B, 1, L)``):
    absolute positions, ``c .. c+L-1`` for a decoding step after ``c`` cached tokens.
    Returns an array of x's shape and dtype; half precision is rotated in float32.
    """
    call = "apply_rope(x, positions)"
    xp = namespace_of(call, x=x, positions=positions)
    require_real_floating(xp, call, "ROPE-1", x=x)
    check_choice("layout", layout, ROPE_LAYOUTS, call, "ROPE-1")
    base = _check_base(base, call, "ROPE-1")
    if x.ndim < 2:
        raise ValueError(f"x.shape={tuple(x.shape)}, but should be (..., L, d) [ROPE-1, {call}]")
    d = x.shape[-1]
    r = rotary_dim_of(d, rotary_dim, call)
    positions = _positions(xp, x, positions, call)
    device = array_api_compat.device(x)
    angle_dtype = _angle_dtype(xp, device)
    half = r // 2
    angles = xp.astype(positions, angle_dtype)[..., None] * _inverse_frequencies(
        xp, half, r, base, angle_dtype, device
    )
    work = compute_dtype(xp, x.dtype)
    cos, sin = xp.astype(xp.cos(angles), work), xp.astype(xp.sin(angles), work)
    xw = xp.astype(x[..., :r], work)
    a, b = rope_pairs(xw, layout)
    first, second = a * cos - b * sin, a * sin + b * cos
    if layout == "interleaved":
        rotated = xp.reshape(xp.stack([first, second], axis=-1), tuple(xw.shape))
    else:
        rotated = xp.concat([first, second], axis=-1)
    rotated = xp.astype(rotated, x.dtype)
    return rotated if r == d else xp.concat([rotated, x[..., r:]], axis=-1)


def rotary_dim_of(d: int, rotary_dim: int | None, call: str) -> int:
    """The rotary dimension r of ROPE-1: ``d`` by default, else even and 2 <= r <= d."""
    if rotary_dim is None:
        if d % 2 or d == 0:
            raise ValueError(
                f"x.shape[-1]={d}, but should be even and >= 2: RoPE rotates feature pairs "
                f"[ROPE-1, {call}]"
            )
        return d
    r = check_size("rotary_dim", rotary_dim, f"ROPE-1, {call}", minimum=2)
    if r % 2 or r > d:
        raise ValueError(
            f"rotary_dim={r} with x.shape[-1]={d}, but should be even, >= 2 and <= {d}: RoPE "
            f"rotates feature pairs [ROPE-1, {call}]"
        )
    return r


def rope_pairs(x: Array, layout: str) -> tuple[Array, Array]:
    """The pair features ``(a_i, b_i)`` of ROPE-1 from the rotated features ``x (..., r)``."""
    if layout == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _positions(xp: ModuleType, x: Any, positions: Array, call: str) -> Any:
    if positions is None:
        return xp.arange(x.shape[-2], device=array_api_compat.device(x))
    if not xp.isdtype(positions.dtype, "integral"):
        raise TypeError(
            f"positions.dtype={positions.dtype}, but should be an integer dtype [ROPE-1, {call}]"
        )
    require_broadcastable_to(
        "positions", tuple(positions.shape), tuple(x.shape[:-1]), call, "ROPE-1"
    )
    return positions
