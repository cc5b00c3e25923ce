"""MERGE-1 … MERGE-4: a function merging two attention states, ``fn(o_a, lse_a, o_b, lse_b)``.

A state is an output and its log-sum-exp; the function returns the merged ``(o, lse)``
(spec/serving.md).  The suite draws states as split-KV and cascade attention produce them:
outputs in the declared dtype, log-sum-exps in the accumulation dtype from a few units to
thousands (where a merge without the max shift overflows), with parts that saw no key
(``lse = -inf``, whose output may hold anything, NaN included).  The result is compared,
element by element, with MERGE-1 evaluated in float64 within the MERGE-4 bound, in the
declared base and layouts (MERGE-2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from ....reference.tolerance_serving import merge_error_bound
from ...draw import sizes
from ...draw.strategies import draw_dtype, draw_rng, random_values
from ..assertions import assert_elements_within
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import family_only, register

# Heads, tokens and value dims of serving stacks: MLA's 512, and 128 heads of DeepSeek V3
REALISTIC_HEADS = (1, 8, 32, 128)
REALISTIC_TOKENS = (1, 7, 64, 257)
REALISTIC_VALUE_DIMS = (64, 128, 512)
# log-sum-exps of a few units, of long rows, and past float32's exp overflow (88.7)
LSE_MAGNITUDES = (1.0, 30.0, 1000.0)


_merge_only = family_only(
    "merge", "the function is not declared a merge of attention states (--merge)"
)


@dataclass(frozen=True)
class MergeCall:
    """Two states in the spec's layout as float64 values exact in the kernel's dtypes:
    outputs ``(H, L, Ev)`` in ``dtype``, natural log-sum-exps ``(H, L)`` in the
    accumulation dtype."""

    o_a: np.ndarray
    lse_a: np.ndarray
    o_b: np.ndarray
    lse_b: np.ndarray
    dtype: str

    @property
    def lse_dtype(self) -> str:
        return "float64" if self.dtype == "float64" else "float32"

    def describe(self) -> str:
        empty = int(np.sum(self.lse_a == -np.inf)) + int(np.sum(self.lse_b == -np.inf))
        finite = np.concatenate([x[np.isfinite(x)] for x in (self.lse_a, self.lse_b)])
        largest = float(np.abs(finite).max(initial=0))
        return (
            f"o {self.o_a.shape} {self.dtype}, lse {self.lse_a.shape} {self.lse_dtype} with "
            f"|lse| <= {largest:.3g} and {empty} empty part(s)"
        )


def _draw_call(data: st.DataObject, kernel: KernelUnderTest, *, empty: str) -> MergeCall:
    """States of one drawn size; ``empty`` says which parts saw no key: "some" (a few
    entries on either side, never both), "all" (one side or both, NaN in their outputs)."""
    dtype = draw_dtype(data, kernel)
    heads, tokens, value_dim = sizes.draw_per_stratum(
        data,
        {
            "H": (REALISTIC_HEADS, (1, 3)),
            "L": (REALISTIC_TOKENS, (1, 9)),
            "Ev": (REALISTIC_VALUE_DIMS, (1, 8)),
        },
    )
    rng = draw_rng(data)
    o_a, o_b = (random_values(kernel, rng, (heads, tokens, value_dim), dtype) for _ in "ab")
    magnitude = data.draw(st.sampled_from(LSE_MAGNITUDES), label="|lse|")
    lse_type = np.float64 if dtype == "float64" else np.float32
    seeded = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="lse seed"))
    first = seeded.standard_normal((heads, tokens)) * magnitude
    # the other part near the first, as splits of one row are: both weights matter
    second = first + seeded.standard_normal((heads, tokens)) * 3
    # values exact in the accumulation dtype, as the kernel receives them
    lse_a = first.astype(lse_type).astype(np.float64)
    lse_b = second.astype(lse_type).astype(np.float64)
    if empty == "some":
        share = seeded.random((heads, tokens))
        lse_a[share < 0.15] = -np.inf
        lse_b[share > 0.85] = -np.inf
    else:
        side = seeded.integers(0, 3, (heads, tokens))  # 0: a empty, 1: b empty, 2: both
        lse_a[side != 1] = -np.inf
        lse_b[side != 0] = -np.inf
        o_a[lse_a == -np.inf] = np.nan  # MERGE-3: never read
        o_b[lse_b == -np.inf] = np.nan
    return MergeCall(o_a, lse_a, o_b, lse_b, dtype)


def _to_kernel(kernel: KernelUnderTest, o: np.ndarray, lse: np.ndarray) -> tuple[np.ndarray, ...]:
    """One state in the declared base and layouts (MERGE-2)."""
    claim = kernel.declaration.merge
    assert claim is not None  # the properties apply only to a --merge declaration
    if claim.base == "2":
        lse = lse / math.log(2)
    if claim.out_layout == "lhd":
        o = np.swapaxes(o, 0, 1)
    if claim.lse_layout == "lh":
        lse = lse.T
    return o, lse


def _merged(kernel: KernelUnderTest, call: MergeCall) -> tuple[np.ndarray, np.ndarray]:
    """The function's ``(o, lse)`` in the spec's layout and natural base, as float64, after
    MERGE-1's shape and dtype checks."""
    backend = kernel.backend
    claim = kernel.declaration.merge
    assert claim is not None  # the properties apply only to a --merge declaration
    arrays = []
    for o, lse in ((call.o_a, call.lse_a), (call.o_b, call.lse_b)):
        o_k, lse_k = _to_kernel(kernel, o, lse)
        arrays += [backend.asarray(o_k, call.dtype), backend.asarray(lse_k, call.lse_dtype)]
    try:
        result = kernel.call_raw(tuple(arrays), dict(kernel.declaration.extra_kwargs))
    except Exception as exc:
        raise KernelRaised(
            f"the merge raised {type(exc).__name__}: {str(exc)[:300]} [call: {call.describe()}]"
        ) from exc
    if not (isinstance(result, tuple) and len(result) == 2 and all(map(backend.is_array, result))):
        raise PropertyFailure(
            f"the merge returned {type(result).__name__}, but should return a tuple (o, lse) "
            f"of two arrays (MERGE-1) [call: {call.describe()}]"
        )
    o, lse = result
    o_shape, lse_shape = (np.shape(x) for x in _to_kernel(kernel, call.o_a, call.lse_a))
    expected = [(o, o_shape, call.dtype, "o"), (lse, lse_shape, call.lse_dtype, "lse")]
    for array, shape, dtype, name in expected:
        if tuple(array.shape) != shape or array.dtype != backend.dtype(dtype):
            raise PropertyFailure(
                f"the merge returned {name} of shape {tuple(array.shape)} and dtype "
                f"{array.dtype}, but should return shape {shape} and dtype {dtype} "
                f"(MERGE-1, MERGE-2) [call: {call.describe()}]"
            )
    o_spec, lse_spec = kernel.numpy(o), kernel.numpy(lse)
    if claim.out_layout == "lhd":
        o_spec = np.swapaxes(o_spec, 0, 1)
    if claim.lse_layout == "lh":
        lse_spec = lse_spec.T
    if claim.base == "2":
        lse_spec = lse_spec * math.log(2)
    return o_spec, lse_spec


def _assert_within(
    name: str,
    got: np.ndarray,
    expected: np.ndarray,
    tolerance: np.ndarray,
    call: MergeCall,
    clause: str,
) -> None:
    """Every element within its bound; where the definition is -inf or exact (bound 0),
    the same value (MERGE-3)."""
    with np.errstate(invalid="ignore"):
        outside = ~(np.abs(got - expected) <= tolerance)
    outside &= ~(got == expected)  # equal infinities
    assert_elements_within(
        name,
        got,
        expected,
        tolerance,
        lambda at: (
            f"{clause}; the parts' lse there: {call.lse_a[at[:2]]!r}, {call.lse_b[at[:2]]!r}"
        ),
        f" the bound [call: {call.describe()}]",
        outside=outside,
    )


def _check(kernel: KernelUnderTest, call: MergeCall, clause: str) -> None:
    o, lse = _merged(kernel, call)
    bound = merge_error_bound(call.o_a, call.lse_a, call.o_b, call.lse_b, dtype=call.dtype)
    _assert_within("o", o, np.asarray(bound.out), np.asarray(bound.out_tolerance), call, clause)
    lse_bound = np.asarray(bound.lse), np.asarray(bound.lse_tolerance)
    _assert_within("lse", lse, *lse_bound, call, clause)


@register("merge-matches-reference", "MERGE-4", applies=_merge_only)
def merge_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Two states with log-sum-exps from 1 to 1000 (past float32's exp overflow) and a few
    parts without keys merge, in the declared base and layouts, within the MERGE-4 bound
    of MERGE-1: a merge without the max shift, one that reads the log-sum-exps in the
    wrong base or weights the parts the wrong way round is outside it."""
    _check(kernel, _draw_call(data, kernel, empty="some"), "MERGE-1, MERGE-4")


@register("merge-empty-states", "MERGE-3", applies=_merge_only)
def merge_empty_states(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A part that saw no key (lse = -inf, its output NaN) contributes nothing: merged
    with another state it gives that state, and two such parts give o = 0 and
    lse = -inf, with no NaN (-inf - (-inf) must never be formed)."""
    _check(kernel, _draw_call(data, kernel, empty="all"), "MERGE-3")
