"""REC-1 … REC-6: linear attention as a gated / delta-rule recurrence, called
``fn(q (B, Hq, T, dk), k (B, Hk, T, dk), v (B, Hv, T, dv), g=, beta=, initial_state=)`` ->
``(out (B, Ho, T, dv), final_state (B, Hs, dk, dv))`` with the declared update rule.

The suite draws unit-norm keys (REC-2.4's normalised inputs, the regime of REC-6.3), gates
from weak decay to decays of e^-30 and below per token (REC-5.2), beta in (0, 1), a past
state, query groups where the kernel declares GQA, and lengths around and past the chunk
sizes kernels use (1, 63, 64, 65, 75, 129, 1000) at head dims 60, 64, 100 and 128.  The
output and the final state are compared, element by element, with the float64 recurrence
within the bound of REC-6.2 for the declared chunk size and operand precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.recurrent.tolerance import recurrent_error_bound
from ...claims.declaration import KernelDeclaration
from ...draw import sizes
from ...draw.strategies import draw_dtype, random_values
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import register

REALISTIC_LENGTHS = (1, 63, 64, 65, 75, 129, 1000)  # around chunks of 16, 32, 64 and past them
REALISTIC_HEAD_DIMS = (60, 64, 100, 128)  # flash-linear-attention's test grid
# g = logsigmoid(U) / n: weak decay (n = 10), moderate (1), and e^-30 or less per token
GATE_NORMALIZERS = (10.0, 1.0, 0.01)
GATED, DELTA = ("gated", "gated_delta"), ("delta", "gated_delta")


def _recurrent_only(declaration: KernelDeclaration) -> str | None:
    if declaration.family != "recurrent":
        return "the kernel is not declared a recurrence (--recurrent)"
    return None


@dataclass(frozen=True)
class RecurrentCall:
    """One call in float64 values exact in the dtypes the kernel received."""

    arrays: dict[str, np.ndarray]
    rule: str
    dtype: str
    state_dtype: str

    def describe(self) -> str:
        shapes = ", ".join(f"{n} {a.shape}" for n, a in self.arrays.items())
        gate = self.arrays.get("g")
        strongest = f", g >= {float(gate.min()):.3g}" if gate is not None and gate.size else ""
        return f"rule {self.rule}, {shapes} in {self.dtype} (state {self.state_dtype}){strongest}"


def _as_received(kernel: KernelUnderTest, values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` rounded to ``dtype`` as the kernel receives them, exactly in float64."""
    return np.asarray(kernel.numpy(kernel.backend.asarray(values, dtype)), dtype=np.float64)


def _draw_call(data: st.DataObject, kernel: KernelUnderTest) -> RecurrentCall:
    claim = kernel.declaration.recurrent
    assert claim is not None  # the property applies only to a --recurrent declaration
    dtype = draw_dtype(data, kernel)
    state_dtype = "float64" if dtype == "float64" else "float32"
    if sizes.current().realistic:
        length = data.draw(st.sampled_from(REALISTIC_LENGTHS), label="T")
        d_k = data.draw(st.sampled_from(REALISTIC_HEAD_DIMS), label="dk")
        d_v = data.draw(st.sampled_from(REALISTIC_HEAD_DIMS), label="dv")
        heads = data.draw(st.integers(1, 4), label="Hk")
    else:
        length = data.draw(st.integers(1, 9), label="T")
        d_k = data.draw(st.integers(1, 8), label="dk")
        d_v = data.draw(st.integers(1, 8), label="dv")
        heads = data.draw(st.integers(1, 2), label="Hk")
    group = data.draw(st.sampled_from((1, 2)), label="G") if kernel.declaration.gqa else 1
    batch = data.draw(st.integers(1, 2), label="B")
    normalizer = data.draw(st.sampled_from(GATE_NORMALIZERS), label="gate normaliser")
    with_state = data.draw(st.booleans(), label="past state")
    # head dims up to 128 and T up to 1000: values from a seeded generator
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))
    keys = rng.standard_normal((batch, heads, length, d_k))
    norms = np.linalg.norm(keys, axis=-1, keepdims=True)
    arrays: dict[str, np.ndarray] = {
        "q": random_values(kernel, rng, (batch, heads * group, length, d_k), dtype),
        "k": _as_received(kernel, keys / np.where(norms == 0, 1, norms), dtype),
        "v": random_values(kernel, rng, (batch, heads, length, d_v), dtype),
    }
    if claim.rule in GATED:
        shape = (batch, heads, length) + ((d_k,) if claim.gate == "channel" else ())
        gate = -np.log1p(np.exp(-rng.random(shape))) / normalizer
        arrays["g"] = _as_received(kernel, gate, dtype)
    if claim.rule in DELTA:
        strength = 1 / (1 + np.exp(-rng.standard_normal((batch, heads, length))))
        arrays["beta"] = _as_received(kernel, strength, dtype)
    state = rng.standard_normal((batch, heads, d_k, d_v)) if with_state else None
    if state is not None:
        arrays["initial_state"] = _as_received(kernel, state, state_dtype)
    return RecurrentCall(arrays, claim.rule, dtype, state_dtype)


def _failure(name: str, actual: Any, expected: Any, tolerance: Any, call: RecurrentCall) -> None:
    with np.errstate(invalid="ignore"):
        outside = ~(np.abs(actual - expected) <= tolerance)
    if outside.any():
        at = tuple(int(i) for i in np.argwhere(outside)[0])
        raise PropertyFailure(
            f"{name}[{at}] = {actual[at]!r}, but should be {expected[at]!r} within "
            f"{tolerance[at]:.3g} (REC-1.2, REC-6.2); {int(outside.sum())} of {outside.size} "
            f"elements outside [call: {call.describe()}]"
        )


@register("recurrent-matches-reference", "REC-6.2", applies=_recurrent_only)
def recurrent_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The output and the final state within REC-6.2 of the float64 recurrence: the rule,
    the gate's shape and base, beta, the default scale, the past state, query groups, the
    output reading the updated state, incomplete last chunks and strong decay all show."""
    claim = kernel.declaration.recurrent
    assert claim is not None  # the property applies only to a --recurrent declaration
    call = _draw_call(data, kernel)
    backend = kernel.backend
    arrays = call.arrays
    positional = tuple(backend.asarray(arrays[n], call.dtype) for n in ("q", "k", "v"))
    keywords: dict[str, Any] = dict(kernel.declaration.extra_kwargs)
    for name in ("g", "beta"):
        if name in arrays:
            keywords[name] = backend.asarray(arrays[name], call.dtype)
    state = arrays.get("initial_state")
    keywords["initial_state"] = None if state is None else backend.asarray(state, call.state_dtype)
    try:
        result = kernel.call_raw(positional, keywords)
    except Exception as exc:
        raise KernelRaised(
            f"the recurrent kernel raised {type(exc).__name__}: {str(exc)[:300]} "
            f"[call: {call.describe()}]"
        ) from exc
    batch, heads, length, d_k = arrays["q"].shape
    states, d_v = arrays["v"].shape[1], arrays["v"].shape[-1]
    wanted = (
        ((batch, heads, length, d_v), call.dtype),
        ((batch, states, d_k, d_v), call.state_dtype),
    )
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise PropertyFailure(
            f"the recurrent kernel returned {type(result).__name__}, but should return "
            f"(out, final_state) (REC-2.2) [call: {call.describe()}]"
        )
    for name, got, (shape, dtype) in zip(("out", "final_state"), result, wanted, strict=True):
        if (
            not backend.is_array(got)
            or tuple(got.shape) != shape
            or got.dtype != backend.dtype(dtype)
        ):
            shown = (
                f"shape {tuple(got.shape)}, dtype {got.dtype}"
                if backend.is_array(got)
                else type(got).__name__
            )
            raise PropertyFailure(
                f"the recurrent kernel's {name} has {shown}, but should have shape {shape} "
                f"and dtype {dtype} (REC-1.1, REC-4.2, REC-4.3) [call: {call.describe()}]"
            )
    bound = recurrent_error_bound(
        arrays["q"],
        arrays["k"],
        arrays["v"],
        dtype=call.dtype,
        rule=call.rule,
        g=arrays.get("g"),
        beta=arrays.get("beta"),
        initial_state=state,
        chunk_size=claim.chunk_size,
        operands_in_input_dtype=claim.rounded_operands,
    )
    _failure(
        "out", kernel.numpy(result[0]), np.asarray(bound.out), np.asarray(bound.out_tolerance), call
    )
    _failure(
        "final_state",
        kernel.numpy(result[1]),
        np.asarray(bound.final_state),
        np.asarray(bound.final_state_tolerance),
        call,
    )
