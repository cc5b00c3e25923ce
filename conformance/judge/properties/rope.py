"""ROPE-1 and ROPE-3: a rotary position embedding function, called ``fn(x, positions)``.

``x`` is ``(B, H, L, d)`` in each declared dtype and ``positions`` ``(B, 1, L)`` integers:
the prefill positions ``0 .. L-1``, or a decoding step whose positions start at a
different cache length per batch element, up to ``2^17`` (where a float32 angle of pair 0
is already off by ~0.008 rad and a half-precision one by whole radians).  The result is
compared, element by element, with ROPE-1 evaluated in float64 within the ROPE-3 bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from ....reference.rope_tolerance import rope_error_bound
from ...draw import sizes
from ...draw.strategies import draw_dtype, draw_rng, random_values
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import family_only, register

# Head dims RoPE models use (GPT-J 256 with rotary_dim 64, LLaMA 128, GPT-NeoX 96 at 25%)
REALISTIC_HEAD_DIMS = (32, 64, 80, 96, 128, 256)
REALISTIC_LENGTHS = (1, 2, 17, 64, 129)
# Cache lengths before a decoding step: small, block boundaries, long contexts
CACHE_LENGTHS = (0, 1, 5, 63, 511, 2047, 4095, 32767, 131071 - 129)
MAGNITUDES = (1.0, 30.0)  # normal q/k rows, and LLM outlier channels


_rope_only = family_only(
    "rope", "the function is not declared a rotary position embedding (--rope)"
)


@dataclass(frozen=True)
class RopeCall:
    """One call: the inputs as float64 values exact in ``dtype``."""

    x: np.ndarray  # (B, H, L, d)
    positions: np.ndarray  # (B, 1, L), int64
    dtype: str

    def describe(self) -> str:
        starts = sorted({int(p) for p in self.positions[:, 0, 0]}) if self.x.shape[2] else []
        largest = np.abs(self.x).max(initial=0)
        return (
            f"x {tuple(self.x.shape)} {self.dtype} with |x| <= {largest:.3g}, "
            f"positions (B, 1, L) starting at {starts}"
        )


def _draw_call(
    data: st.DataObject,
    kernel: KernelUnderTest,
    *,
    decode: bool | None = None,
) -> RopeCall:
    claim = kernel.declaration.rope
    assert claim is not None  # the property applies only to a --rope declaration
    dtype = draw_dtype(data, kernel)
    realistic = sizes.current().realistic
    rotary = claim.rotary_dim or 0
    if realistic:
        head_dim = data.draw(
            st.sampled_from([h for h in REALISTIC_HEAD_DIMS if h >= rotary] or [rotary]), label="d"
        )
        length = data.draw(st.sampled_from(REALISTIC_LENGTHS), label="L")
    else:
        head_dim = max(rotary, 2 * data.draw(st.integers(1, 8), label="d/2"))
        length = data.draw(st.integers(1, 9), label="L")
    if rotary and data.draw(st.booleans(), label="features beyond the rotary dim"):
        head_dim += 2 * data.draw(st.integers(1, 4), label="unrotated pairs")
    batch, heads = data.draw(st.integers(1, 3), label="B"), data.draw(st.integers(1, 3), label="H")
    if decode is None:
        decode = data.draw(st.booleans(), label="decode step")
    starts = (
        [data.draw(st.sampled_from(CACHE_LENGTHS), label=f"cache length {b}") for b in range(batch)]
        if decode
        else [0] * batch
    )
    positions = (
        np.asarray(starts, np.int64)[:, None, None]
        + np.arange(length, dtype=np.int64)[None, None, :]
    )
    magnitude = data.draw(st.sampled_from(MAGNITUDES), label="magnitude")
    x = random_values(kernel, draw_rng(data), (batch, heads, length, head_dim), dtype, magnitude)
    return RopeCall(x, positions, dtype)


def _rotate(kernel: KernelUnderTest, call: RopeCall) -> np.ndarray:
    """The function's result as float64 NumPy, after ROPE-1's shape and dtype checks."""
    backend = kernel.backend
    try:
        arrays = (backend.asarray(call.x, call.dtype), backend.asarray(call.positions))
        result = kernel.call_raw(arrays, dict(kernel.declaration.extra_kwargs))
    except Exception as exc:
        raise KernelRaised(
            f"the RoPE function raised {type(exc).__name__}: {str(exc)[:300]} "
            f"[call: {call.describe()}]"
        ) from exc
    if not backend.is_array(result):
        raise PropertyFailure(
            f"the RoPE function returned {type(result).__name__}, but should "
            f"return one array of x's shape (ROPE-1) [call: {call.describe()}]"
        )
    if tuple(result.shape) != call.x.shape or result.dtype != backend.dtype(call.dtype):
        raise PropertyFailure(
            f"the RoPE function returned shape {tuple(result.shape)} of dtype {result.dtype}, but "
            f"should return x's shape {call.x.shape} and dtype {call.dtype} (ROPE-1) "
            f"[call: {call.describe()}]"
        )
    return kernel.numpy(result)


@register("rope-shape-and-dtype", "ROPE-1", applies=_rope_only)
def rope_shape_and_dtype(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """In every declared dtype, prefill and decode positions give an array of x's shape
    and dtype."""
    for dtype in kernel.dtypes:
        call = _draw_call(data, kernel)
        _rotate(kernel, RopeCall(kernel.rounded(call.x, dtype), call.positions, dtype))


@register("rope-matches-reference", "ROPE-3", applies=_rope_only)
def rope_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Every element within the ROPE-3 bound of ROPE-1 in float64, with the declared
    pairing, base and rotary dimension; features beyond the rotary dimension exact."""
    claim = kernel.declaration.rope
    assert claim is not None  # the property applies only to a --rope declaration
    call = _draw_call(data, kernel)
    actual = _rotate(kernel, call)
    bound = rope_error_bound(
        call.x,
        call.positions,
        dtype=call.dtype,
        base=claim.base,
        layout=claim.pairing,
        rotary_dim=claim.rotary_dim,
    )
    expected, tolerance = np.asarray(bound.rotated), np.asarray(bound.tolerance)
    with np.errstate(invalid="ignore"):
        error = np.abs(actual - expected)
        outside = ~(error <= tolerance)
    if outside.any():
        with np.errstate(over="ignore", invalid="ignore"):
            ratio = np.where(outside, error / np.maximum(tolerance, np.finfo(np.float64).tiny), 0.0)
        at = np.unravel_index(
            int(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio))), ratio.shape
        )
        b, _, token, feature = at
        raise PropertyFailure(
            f"out[{tuple(int(i) for i in at)}] = {actual[at]!r}, but should be {expected[at]!r} "
            f"within {tolerance[at]:.3g} (ROPE-3; {claim.pairing} pairing, base {claim.base}, "
            f"rotary dim {claim.rotary_dim or call.x.shape[-1]}): feature {int(feature)} of the "
            f"token at position {int(call.positions[b, 0, token])}; "
            f"{int(outside.sum())} of {outside.size} elements outside the bound "
            f"[call: {call.describe()}]"
        )
