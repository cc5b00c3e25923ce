"""SDPA-7.8: a call's result depends on its own arguments only, not on earlier calls.

Two ways a kernel's state leaks into its results (issue 29):

* a plan, graph or precomputed term cached on the shapes alone: the second call of a shape
  with other values, masks, biases, ALiBi slopes, softcaps, scales or another dtype gets
  the first call's term.  ``same-shape-new-arguments`` calls the kernel back to back at one
  shape with all of those changed, checks each call against the definition and calls the
  first problem again, which must give its first result bit for bit.
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
from ..kernel import KernelUnderTest
from ..registration import dense_only, register
from ._helpers import SOFTCAPS, draw_alibi_slopes

# Calls of one small problem in many-calls (see the module doc for what they catch).
CALLS_PER_SMALL_EXAMPLE = 8
# Scores large enough that two of SOFTCAPS cap them differently, far beyond TOL-4.
SOFTCAP_MAGNITUDE = 3.0


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


@register("same-shape-new-arguments", "SDPA-7.8")
def same_shape_new_arguments(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Back to back at one shape: a problem A, then B with new values, mask, bias, scale,
    ALiBi slopes (twice A's) and softcap (another cap) where claimed, then (small problems)
    one in another claimed dtype, then A again.  B and the other dtype's are within TOL-2 of
    the definition and A's second result is A's first bit for bit: a kernel that caches a
    plan, its ALiBi bias, its mask or its softcap on the shape alone returns B the term it
    computed for A.  (A's own accuracy is matches-reference's: one check fewer.)"""
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
    others = [d for d in kernel.dtypes if d != first.dtype]
    if others and not current().stratum.realistic:  # small problems: the cost of a check
        dtype = data.draw(st.sampled_from(others), label="other dtype")
        third = _draw(data, kernel, dims, dtype, magnitude)
        third = third.with_(alibi_slopes=second.alibi_slopes, softcap=second.softcap)
        assert_matches_reference(kernel, third, what=f"out (call 3: same shape in {dtype})")
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
