"""SDPA-4: causal attention in the alignment the kernel declares, and decode consistency.

Top-left (SDPA-4.1): query i may attend key j iff j <= i.  Bottom-right (SDPA-4.2):
iff j <= i + Lk - Lq.  The two differ only when Lq != Lk, so these properties draw
unequal lengths, both ways.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from ....reference.masks import causal_offset
from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.sizes import Dims, current
from ...draw.strategies import draw_dims, draw_problem, draw_rng, random_values
from ..assertions import assert_identical, assert_within_bound, compared_rows, first_index
from ..bounds import reference_bound, weights_bound
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import needs, register
from ..reproduce import replaying
from ._helpers import within_validity

# TOL-2 does not cover weights in the subnormal range (spec/tolerance.md, "Known
# limitation"); kernels that flush subnormals to zero (XLA on CPU) return 0 there.
SMALLEST_NORMAL = {
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
    "float32": 2.0**-126,
    "float64": 2.0**-1022,
}


def alignment_clause(declaration: KernelDeclaration) -> str:
    """The clause defining the kernel's declared causal alignment."""
    if declaration.causal_alignment == "bottom_right":
        return "SDPA-4.2 bottom-right: j <= i + Lk - Lq"
    return "SDPA-4.1 top-left: j <= i"


def _unequal_dims(data: st.DataObject, kernel: KernelUnderTest, weights: bool = False) -> Dims:
    """Dims with Lq != Lk (either way round), where the two alignments differ; realistic
    shapes that already differ keep their lengths (a block boundary on either side)."""
    dims = draw_dims(
        data,
        kernel,
        min_queries=1,
        min_keys=1,
        max_len=8,
        weights=weights,
        where=lambda dims: dims.n_queries != dims.n_keys,
    )
    drawing = current()
    keep = drawing.realistic or drawing.pool is not None  # a pooled shape: compiled already
    if (keep and dims.n_queries != dims.n_keys) or kernel.declaration.equal_lengths:
        return dims  # a kernel that needs Lq == Lk (declared) is checked at Lq == Lk
    shift = data.draw(st.sampled_from([1, -1, 2, -2, 3, -3]), label="Lk - Lq")
    n_keys = dims.n_queries + shift
    if not 1 <= n_keys <= max(drawing.limits.max_len, 2):
        n_keys = dims.n_queries - shift
    if n_keys < 1:  # neither way fits a tiny --max-len: one key fewer, or two keys
        n_keys = dims.n_queries - 1 if dims.n_queries > 1 else 2
    return replace(dims, n_keys=n_keys)


def _offset(problem: Problem, declaration: KernelDeclaration) -> int:
    return causal_offset(problem.q.shape[-2], problem.k.shape[-2], declaration.causal_alignment)


@register("causal-zeros", "SDPA-4.1", applies=needs("causal"))
def causal_zeros(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With is_causal, query i's output is identical when the keys and values beyond its
    causal boundary change (SDPA-4.1, or SDPA-4.2 for a bottom-right kernel)."""
    problem = draw_problem(data, kernel, dims=_unequal_dims(data, kernel), causal="always")
    n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
    offset = _offset(problem, kernel.declaration)
    # Keys j >= cut lie beyond the boundary of every row i with i + offset < cut; the
    # lowest cut keeps row 0 (when it sees a key) among those rows.
    cut = data.draw(st.integers(max(0, min(offset + 1, n_keys - 1)), n_keys - 1), label="cut")
    rng = draw_rng(data)
    changed = {}
    for name in ("k", "v"):
        a = getattr(problem, name).copy()
        a[..., cut:, :] = random_values(kernel, rng, a[..., cut:, :].shape, problem.dtype, 3.0)
        changed[name] = a
    if problem.bias is not None:
        bias = problem.bias.copy()
        bias[..., cut:] = random_values(kernel, rng, bias[..., cut:].shape, problem.dtype, 3.0)
        changed["bias"] = bias
    other = problem.with_(**changed)
    before = (np.arange(n_queries) + offset < cut)[:, None]
    rows = before & compared_rows(problem, kernel.declaration)
    out, out_changed = kernel.output(problem), kernel.output(other)
    with replaying([("original", problem)], "out_original", compared=rows):
        assert_identical(
            np.where(rows, out_changed, 0.0),
            np.where(rows, out, 0.0),
            f"out of rows i + {offset} < {cut} after changing keys/values j >= {cut} "
            f"[{alignment_clause(kernel.declaration)}]",
            other,
            kernel,
        )


@register("causal-alignment", "SDPA-4.1", applies=needs("causal"))
def causal_alignment(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With is_causal and Lq != Lk, the weights are exactly 0 beyond the declared
    alignment's boundary (SDPA-4.1 top-left or SDPA-4.2 bottom-right) and positive within
    it wherever TOL-2 proves the definition's weight positive (and it is not subnormal)."""
    problem = draw_problem(
        data,
        kernel,
        dims=_unequal_dims(data, kernel, weights=True),
        causal="always",
        mask="never",
        tight=True,  # a bias of a few units, where one is drawn, keeps every weight in view
    )
    problem = within_validity(kernel, problem)
    _, weights = kernel.output_with_weights(problem)
    n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
    offset = _offset(problem, kernel.declaration)
    allowed = np.arange(n_keys)[None, :] <= np.arange(n_queries)[:, None] + offset
    rows = compared_rows(problem, kernel.declaration)
    clause = alignment_clause(kernel.declaration)
    leaked = ~allowed & rows & (weights != 0)
    if leaked.any():
        at = first_index(leaked)
        raise PropertyFailure(
            f"weight{at} = {weights[at]!r}, but key {at[-1]} is beyond query {at[-2]}'s causal "
            f"boundary (offset {offset}), so it should be exactly 0; {int(leaked.sum())} such "
            f"weights [{clause}]",
            problem,
            kernel,
            shows_weights=kernel.observes_weights,
        )
    expected, tolerance = (np.asarray(a) for a in weights_bound(problem, kernel.declaration))
    provably_positive = (expected - tolerance > 0) & (expected >= SMALLEST_NORMAL[problem.dtype])
    missing = allowed & provably_positive & ~(weights > 0)
    if missing.any():
        at = first_index(missing)
        raise PropertyFailure(
            f"weight{at} = {weights[at]!r}, but key {at[-1]} is within query {at[-2]}'s causal "
            f"boundary (offset {offset}) and the definition gives {expected[at]:.6g} "
            f"(TOL-2 bound {tolerance[at]:.3g}); {int(missing.sum())} such weights [{clause}]",
            problem,
            kernel,
            shows_weights=kernel.observes_weights,
        )


def _decode_applies(declaration: KernelDeclaration) -> str | None:
    reason = needs("causal")(declaration)
    if reason is None and declaration.causal_alignment != "bottom_right":
        return "decode consistency is a property of bottom-right causal kernels (SDPA-4.4)"
    return reason


def _last_rows(a: np.ndarray | None, n_queries: int, r: int) -> np.ndarray | None:
    """Rows ``-r:`` of a mask or bias whose query axis is not broadcast."""
    if a is None or a.shape[-2] != n_queries:
        return a
    return a[..., n_queries - r :, :]


@register("decode-consistency", "SDPA-4.4", applies=_decode_applies)
def decode_consistency(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With bottom-right causal, the last r query rows computed alone (same keys) equal
    the last r rows of the full computation within TOL-2: what a KV cache relies on."""
    problem = within_validity(kernel, draw_problem(data, kernel, causal="always", min_queries=1))
    n_queries = problem.q.shape[-2]
    r = data.draw(st.integers(1, n_queries), label="rows computed alone")
    tail = problem.with_(
        q=problem.q[..., n_queries - r :, :],
        mask=_last_rows(problem.mask, n_queries, r),
        bias=_last_rows(problem.bias, n_queries, r),
    )
    full_out, tail_out = kernel.output(problem), kernel.output(tail)
    # The float64 definitions of the two rows coincide (same S(i), SDPA-4.2), so each run
    # is within its own TOL-2 bound of one value: their distance is within the sum.
    tolerance = (
        np.asarray(reference_bound(tail, kernel.declaration).out_tolerance)
        + np.asarray(reference_bound(problem, kernel.declaration).out_tolerance)[
            ..., n_queries - r :, :
        ]
    )
    last = f"[..., {n_queries - r}:, :]"
    with replaying([("full", problem)], f"out_full{last}", f"bound(problem_full){last}"):
        assert_within_bound(
            tail_out,
            full_out[..., n_queries - r :, :],
            tolerance,
            f"out of the last {r} rows computed alone vs the full call [SDPA-4.4]",
            tail,
            kernel,
        )
