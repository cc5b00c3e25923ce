"""SDPA-7.8: a call's result depends on its own arguments only, not on earlier calls.

Two ways a kernel's state leaks into its results (issue 29):

* a plan, graph or precomputed term cached on the shapes alone: the second call of a shape
  with other values, masks, biases, ALiBi slopes, softcaps, scales, strides or another
  dtype gets the first call's term.  ``same-shape-new-arguments`` calls the kernel back to
  back at one shape with all of those changed, checks each call against the definition
  and calls the first problem again, which must give its first result bit for bit.  Every
  example meets each change but the dtype: the new values, mask, bias, scale, slopes and
  softcap in call 2, the strides (call 2's inputs again, as strided or transposed views,
  where the backend's arrays have strides) in call 3; the other dtype, on small problems,
  is the most precise claimed one above the first call's, so a kernel that computes a
  shape in the first call's precision is caught on every small example whose first dtype
  is not the kernel's most precise one.  Packed and KV-cache calls
  (``packed-same-shape-new-arguments``, spec/features.md) get the same at one set of
  argument shapes with other sequence lengths (cu_seqlens, cache_seqlens) and another
  block table; a new dropout seed at one shape is DROP-4's (``dropout-seed`` calls one
  shape with seeds s, s, s + 1).
* a fault that depends on the number of calls: wrong on a fraction f of the calls, or
  from the N-th call of a process on.  ``many-calls`` calls the kernel
  ``CALLS_PER_SMALL_EXAMPLE`` (8) times on each small problem (the first result checked
  against the definition, every later one bit for bit against it), so a run makes
  8 x (the profile's small examples) calls of this property alone, in one kernel process:
  160 on the quick profile, 800 on the default one, 8000 on the thorough one.  A kernel
  wrong on a fraction f of its calls, independently, passes with probability
  (1 - f) ** calls: for f = 1 % that is 0.20 on quick (caught with probability 0.80),
  0.0003 on default (caught with 0.9997) and below 1e-34 on thorough; f = 3 % is caught with
  0.992 on quick.  A kernel wrong on every m-th call is caught for every m <= 160 on quick
  (800 default, 8000 thorough).  A kernel that goes wrong after its N-th call is caught for
  N < 160 on quick, N < 800 on default and N < 8000 on thorough: wrong after 3000 calls only
  on thorough (calls that other properties make in the same process only add to the
  count, so these are lower bounds).  The quick profile's 160 calls cost about as much as
  ``deterministic``'s.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...draw.sizes import Dims, current
from ...draw.strategies import ALWAYS, MAYBE, draw_dims, draw_problem
from ..assertions import assert_identical, assert_matches_reference
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import dense_only, register
from ._helpers import SOFTCAPS, draw_alibi_slopes, output_laid_out

# Calls of one small problem in many-calls (see the module doc for what they catch).
CALLS_PER_SMALL_EXAMPLE = 8
# Scores large enough that two of SOFTCAPS cap them differently, far beyond TOL-4.
SOFTCAP_MAGNITUDE = 3.0
# Layouts of call 3: views whose memory read with a contiguous array's strides (a plan
# made for call 1's layout) gives other values (filler, or the transpose).
OTHER_LAYOUTS = ("strided", "strided_rows", "transposed")


def _draw(
    data: st.DataObject,
    kernel: KernelUnderTest,
    dims: Dims,
    dtype: str | None,
    magnitude: float | None,
) -> Problem:
    """A problem of ``dims`` with every shape-preserving option the kernel claims forced
    on (mask, bias, explicit scale): a cache keyed on the shape alone then has something
    to get wrong."""
    decl = kernel.declaration
    return draw_problem(
        data,
        kernel,
        dims=dims,
        dtype=dtype,
        magnitude=magnitude,
        mask=ALWAYS if decl.mask else MAYBE,
        bias=ALWAYS if decl.bias and not decl.bias_shares_mask_argument else MAYBE,
        scale=ALWAYS if decl.scale else MAYBE,
    )


def _other_mask(problem: Problem, first: Problem) -> Problem:
    """``problem`` with a mask that differs from ``first``'s (one element flipped where
    the draws happened to agree)."""
    if problem.mask is None or first.mask is None:
        return problem
    mask = np.array(problem.mask, copy=True)
    if mask.shape == first.mask.shape and mask.size and np.array_equal(mask, first.mask):
        mask.flat[0] = not mask.flat[0]
    return problem.with_(mask=mask)


def _in_another_layout(kernel: KernelUnderTest, data: st.DataObject, problem: Problem) -> None:
    """``problem`` called with q, k and v as views of one drawn layout of OTHER_LAYOUTS,
    within TOL-2 of the definition (on a backend whose arrays have no strides: nothing; a
    kernel that refuses the views is noted, and judged by layout-independence)."""
    if not kernel.backend.has_strides:
        return
    layout = data.draw(st.sampled_from(OTHER_LAYOUTS), label="layout of call 3")
    what = f"call 3: call 2's inputs again, q, k and v {layout}"
    try:
        out = output_laid_out(kernel, problem, dict.fromkeys("qkv", layout), f" ({what})")
    except KernelRaised as raised:
        if isinstance(raised.__cause__, PropertyFailure):
            raise  # the suite's own finding (inputs changed later), not the kernel's refusal
        # refusing a layout is SDPA-1.7's (layout-independence), not a state carried over
        kernel.note(f"not called with {layout} views: the kernel raised on them")
        return
    assert_matches_reference(kernel, problem, out, what=f"out ({what})")


def _other_dtype(data: st.DataObject, kernel: KernelUnderTest, dtype: str) -> str | None:
    """The dtype of the call after ``dtype``'s: the most precise claimed one above it (a
    shape computed in the first call's precision then shows), else another claimed one."""
    dtypes = kernel.dtypes  # in precision order
    above = dtypes[dtypes.index(dtype) + 1 :] if dtype in dtypes else ()
    if above:
        return above[-1]
    others = [d for d in dtypes if d != dtype]
    return data.draw(st.sampled_from(others), label="other dtype") if others else None


@register("same-shape-new-arguments", "SDPA-7.8")
def same_shape_new_arguments(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Back to back at one shape: a problem A, then B with new values, mask, bias, scale,
    ALiBi slopes (twice A's) and softcap (another cap) where claimed, then B again with
    q, k and v as strided or transposed views (where arrays have strides), then (small
    problems) one in the most precise claimed dtype above A's (another one when A's is the
    most precise), then A again.  B, B's views and the other dtype's are within TOL-2 of
    the definition and A's second result is A's first bit for bit: a kernel that caches a
    plan, its ALiBi bias, its mask, its softcap, its strides or its precision on the shape
    alone returns B the term it computed for A.  (A's own accuracy is matches-reference's:
    one check fewer.)"""
    decl = kernel.declaration
    if current().stratum.anchor is not None:
        kernel.note("not run on the anchors: the largest problems, and shape caches show at any")
        return
    dims = draw_dims(data, kernel, min_queries=1, min_keys=2)
    magnitude = SOFTCAP_MAGNITUDE if decl.softcap else None
    first = _draw(data, kernel, dims, None, magnitude)
    second = _other_mask(_draw(data, kernel, dims, first.dtype, magnitude), first)
    if first.scale is not None and second.scale == first.scale:
        second = second.with_(scale=first.scale * 0.5)
    if decl.alibi:
        slopes = draw_alibi_slopes(data, kernel, dims)
        first = first.with_(alibi_slopes=slopes)
        # standard slopes for a kernel computing its own: on/off is all it is given
        second = second.with_(alibi_slopes=slopes if decl.alibi_builtin_slopes else 2 * slopes)
    if decl.softcap:
        caps = data.draw(st.permutations(SOFTCAPS[:3]), label="softcaps")
        first, second = first.with_(softcap=caps[0]), second.with_(softcap=caps[1])
    # A's own accuracy is matches-reference's; here what A leaves behind is judged
    first_out = kernel.output(first)
    assert_matches_reference(kernel, second, what="out (call 2: same shape, other arguments)")
    _in_another_layout(kernel, data, second)
    dtype = _other_dtype(data, kernel, first.dtype)
    if dtype is not None and not current().stratum.realistic:  # small: the cost of a check
        third = _draw(data, kernel, dims, dtype, magnitude)
        third = third.with_(alibi_slopes=second.alibi_slopes, softcap=second.softcap)
        assert_matches_reference(kernel, third, what=f"out (call 4: same shape in {dtype})")
    assert_identical(
        kernel.output(first),
        first_out,
        "out of problem A called again after other calls (SDPA-7.8)",
        first,
        kernel,
    )


@register("many-calls", "SDPA-7.8", applies=dense_only)
def many_calls(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """CALLS_PER_SMALL_EXAMPLE calls of each small problem, the first within TOL-2 of the
    definition, every later one bit for bit the first (2 calls of a realistic problem, the
    second bit for bit the first).  A kernel
    wrong on a fraction f of its calls, or from its N-th call on, is caught with the
    probability the module doc states for each profile (f = 1 %: 0.80 on quick, 0.9997 on
    default; from the N-th call on: N < 160 quick, 800 default, 8000 thorough)."""
    problem = draw_problem(data, kernel)
    if current().stratum.realistic:  # large: two calls, their accuracy matches-reference's
        calls, first = 2, kernel.output(problem)
    else:
        calls = CALLS_PER_SMALL_EXAMPLE
        first = assert_matches_reference(kernel, problem, what="out (call 1)")
    for call in range(2, calls + 1):
        assert_identical(
            kernel.output(problem),
            first,
            f"out of call {call} of the same problem vs call 1 (SDPA-7.8)",
            problem,
            kernel,
        )
