"""SDPA-3: mask polarity and broadcasting, additive bias, the mask winning over the bias,
and mask combined with causal.

Values are compared with ``assert_matches_reference``, which leaves rows without an
allowed key to SDPA-5.1 for a kernel that does not claim it, so only the clause under
test can fail; where the clause says two spellings of one definition give one result (a
broadcast mask and its full expansion, a -inf bias and the mask), the two calls are
compared with each other (``assert_same_result``), so an accuracy failure both show is
SDPA-7.3's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw import shape_pool
from ...draw.input_features import scores_shape
from ...draw.realistic_values import LARGEST_FINITE
from ...draw.shape_pool import REDUCIBLE_MASK_SHAPE
from ...draw.sizes import current
from ...draw.strategies import (
    broadcast_shape_for,
    draw_dims,
    draw_problem,
    draw_rng,
    random_values,
)
from ..assertions import (
    assert_identical,
    assert_matches_reference,
    assert_same_result,
    assert_weights_match,
    assert_within_bound,
)
from ..bounds import reference_bound
from ..convention_hints import mask_convention
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import needs, register
from ..reproduce import replaying
from ._helpers import values_per_query, within_validity

EXPLICIT_NON_UNIT_SCALES = (0.5, 2.0, 0.125, -0.75, 4.0)
BIAS_MAGNITUDE = 3.0  # |b| of a few units: (1 - s) * b is far outside TOL-2 for s != 1


@register("mask-polarity", "SDPA-3.1", applies=needs("mask"))
def mask_polarity(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """True in the mask means "may attend": with exactly one True per row, every output
    row is that key's value row (within TOL-2); an inverted mask cannot pass."""
    dims = draw_dims(data, kernel, min_keys=1)
    # a bias of a few units (where one is drawn) leaves a row with one key all its weight
    problem = draw_problem(data, kernel, dims=dims, mask="never", causal="never", tight=True)
    rng = draw_rng(data)
    shape = broadcast_shape_for(data, dims.scores_shape, "mask")
    chosen = rng.integers(0, dims.n_keys, size=shape[:-1])
    problem.mask = np.arange(dims.n_keys) == chosen[..., None]
    out = kernel.output(problem)

    # Row i of head h reads value row chosen[i] of the key/value head it uses (SDPA-6.1).
    keys = np.broadcast_to(chosen, dims.scores_shape[:-1])[..., None]
    expected = np.take_along_axis(values_per_query(problem), keys, axis=-2)
    tolerance = np.asarray(reference_bound(problem, kernel.declaration).out_tolerance)
    try:
        assert_within_bound(
            out, expected, tolerance, "out (one allowed key per row)", problem, kernel
        )
    except PropertyFailure as failure:
        convention = mask_convention(kernel, problem, out)
        if convention is None:
            raise
        finding, hint = convention
        raise PropertyFailure(
            f"{finding} [SDPA-3.1]; {failure.finding}", problem, kernel, hint=hint
        ) from None


def _draw_reducible_shape(data: st.DataObject, full: tuple[int, ...]) -> tuple[int, ...]:
    """A shape broadcasting to ``full``: leading dims dropped, any dim (Lq and Lk too) set
    to 1, e.g. (Lk,), (Lq, Lk), (Hq, 1, Lk), (B, 1, 1, Lk), (Lq, 1).  One draw, tied to a
    pooled shape (shape_pool.TIED_LABELS) where the backend compiles per shape: each
    pooled shape meets one such mask shape a run, not one per example."""
    keep, ones = data.draw(
        st.tuples(
            st.integers(1, len(full)),
            st.lists(st.booleans(), min_size=len(full), max_size=len(full)),
        ),
        label=REDUCIBLE_MASK_SHAPE,
    )
    return tuple(1 if one else size for one, size in zip(ones, full, strict=True))[-keep:]


@register("mask-broadcast", "SDPA-3.1", applies=needs("mask"))
def mask_broadcast(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A mask of any shape that broadcasts to (..., Hq, Lq, Lk), a 1-d key mask and an
    (Lq, Lk) mask too, gives the result of the explicitly broadcast full mask, and a full
    mask gives each head the result it gets when every head is given that head's slice of
    the mask: within TOL-2 (each call within its bound of the one definition; how close
    they are to it is matches-reference's)."""
    dims = draw_dims(data, kernel)
    problem = draw_problem(data, kernel, dims=dims, mask="never", bias="never", causal="never")
    rng = draw_rng(data)
    shape = _draw_reducible_shape(shape_pool.tied_to(data, dims), dims.scores_shape)
    density = data.draw(st.sampled_from([0.5, 0.8, 0.2]), label="mask density")
    small = problem.with_(mask=rng.random(shape) < density)
    # the smallest broadcastable mask, a 1-d key mask, in every example but pooled realistic
    # ones (pytorch rejects it for 4-d q: docs/divergences.md)
    key_mask = problem.with_(mask=rng.random(dims.n_keys) < density)
    # and the (Lq, Lk) mask callers pass most, likewise (a kernel that reads a 2-d mask as
    # (batch, Lk) key padding is wrong on it)
    rows_mask = problem.with_(mask=rng.random(dims.scores_shape[-2:]) < density)
    forms = [
        (small, "out (broadcast mask)"),
        (key_mask, "out (1-d key mask)"),
        (rows_mask, "out ((Lq, Lk) mask)"),
    ]
    if current().pooled_realistic:
        # Pooled (a backend compiling per shape), each form is a compilation of its own at
        # every realistic shape: there an example checks the one form tied to its shape
        # (seeded per stratum and shape, as its options are: a stratum of one example
        # would always draw Hypothesis's simplest); every small example still checks all
        # three, and the per-head check below runs in every example.
        tied = shape_pool.tied_to(data, dims)
        forms = [forms[tied.draw(st.integers(0, len(forms) - 1), label="mask form")]]
    for reduced, what in forms:
        full = _explicitly_broadcast(reduced)
        out, out_full = kernel.output(reduced), kernel.output(full)
        assert_same_result(
            kernel,
            reduced,
            out,
            out_full,
            f"{what} vs the full mask",
            replay=([("full", full)], "out_full"),
        )
    if dims.scores_shape[-3] > 1:  # a per-head mask acts per head
        # a full mask of its own, different in every head whatever form was drawn (on a
        # pooled shape the form is one a run), in the shapes the full forms compiled
        per_head = problem.with_(mask=rng.random(dims.scores_shape) < density)
        own = _each_head_with_its_slice_everywhere(kernel, per_head)
        calls = _each_head_calls(per_head)
        heads = ", ".join(f"out_head{h}[..., {h}:{h + 1}, :, :]" for h in range(len(calls)))
        assert_same_result(
            kernel,
            per_head,
            kernel.output(per_head),
            own,
            "out (full mask) vs each head's slice given to all",
            replay=(calls, f"np.concatenate([{heads}], axis=-3)"),
        )


def _explicitly_broadcast(problem: Problem) -> Problem:
    """``problem`` with its mask broadcast to the full scores shape (..., Hq, Lq, Lk)."""
    mask = np.broadcast_to(problem.required("mask"), scores_shape(problem))
    return problem.with_(mask=np.ascontiguousarray(mask))


def _each_head_calls(problem: Problem) -> list[tuple[str, Problem]]:
    """("headH", ``problem`` with head H's slice of its full mask in every head), for
    each head H (named for the reproduction, which replays them)."""
    mask = problem.required("mask")
    return [
        (
            f"head{h}",
            problem.with_(
                mask=np.ascontiguousarray(np.broadcast_to(mask[..., h : h + 1, :, :], mask.shape))
            ),
        )
        for h in range(problem.q.shape[-3])
    ]


def _each_head_with_its_slice_everywhere(kernel: KernelUnderTest, problem: Problem) -> np.ndarray:
    """Head h of the output of ``problem`` (a full mask) given head h's slice of the mask
    in every head, for each h: a kernel that reads another head's slice (the first, the
    key/value head's, ...) for some head gives that head another result.  Each call has
    the problem's own shapes, which a backend compiling per shape has compiled already (a
    call per head alone, with one head, would compile once more per example)."""
    heads = [
        kernel.output(call)[..., h : h + 1, :, :]
        for h, (_, call) in enumerate(_each_head_calls(problem))
    ]
    return np.concatenate(heads, axis=-3)


@register("bias-semantics", "SDPA-3.2", applies=needs("bias"))
def bias_semantics(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The bias is added to the scores after scaling: with a scale s != 1 and a bias of a
    few units, outputs and weights are within TOL-2 of softmax(s q.k + b), so adding it
    before scaling (or scaling it, or dropping it) fails."""
    dims = draw_dims(data, kernel, weights=True)
    # E >= 2 so that the default scale 1/sqrt(E) is not 1 either.
    dims = replace(dims, head_dim=max(2, dims.head_dim))
    # the bias in the shape drawn for it (as other properties meet it on a pooled shape),
    # with values of a few units, and the mask drawn with it; an explicit scale (where
    # drawn) is one of s != 1
    problem = draw_problem(data, kernel, dims=dims, causal="never", bias="always", tight=True)
    if problem.scale is not None:
        problem.scale = data.draw(st.sampled_from(EXPLICIT_NON_UNIT_SCALES), label="scale")
    problem.bias = random_values(
        kernel, draw_rng(data), problem.required("bias").shape, problem.dtype, BIAS_MAGNITUDE
    )
    # the scale drawn here may make realistic scores too large for TOL-2 to be tight
    problem = within_validity(kernel, problem)
    out, weights = kernel.output_with_weights(problem)
    assert_matches_reference(kernel, problem, out)
    assert_weights_match(kernel, problem, weights)


def separate_mask_and_bias(declaration: KernelDeclaration) -> str | None:
    """Applicable to kernels taking a boolean mask and a bias as two arguments."""
    reason = needs("mask", "bias")(declaration)
    if reason is None and declaration.bias_shares_mask_argument:
        reason = (
            "mask and bias travel in one argument, so the caller combines them "
            "(SDPA-3.3 is the caller's business)"
        )
    return reason


def _large_finite_fill(
    kernel: KernelUnderTest, data: st.DataObject, shape: tuple[int, ...], dtype: str
) -> np.ndarray:
    """Bias values for masked positions: the dtype's largest finite values of both signs,
    1e4 and random ones, so that an additive mask fill (-1e9, finfo.min) is overpowered."""
    big = LARGEST_FINITE[dtype]
    rng = draw_rng(data)
    choice = rng.integers(0, 4, size=shape)
    random = random_values(kernel, rng, shape, dtype, 10.0)
    ten_thousand = kernel.rounded(np.array(1e4), dtype)
    return np.select([choice == 0, choice == 1, choice == 2], [big, -big, ten_thousand], random)


@register("mask-wins-over-bias", "SDPA-3.3", applies=separate_mask_and_bias)
def mask_wins_over_bias(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Finite bias values at masked positions, however large, change nothing bit for
    bit; a -inf bias excludes its position exactly as the mask does: the output is the
    one with those positions masked out instead, within TOL-2 (each call within its bound
    of the one definition)."""
    dims = draw_dims(data, kernel, min_keys=1)
    # the mask, a bias of a few units and causal as the pooled shape's options have them
    # (the calls below compile nothing of their own where the bias covers the mask)
    causal = "maybe" if kernel.declaration.mask_and_causal else "never"
    problem = draw_problem(
        data, kernel, dims=dims, mask="always", bias="always", causal=causal, tight=True
    )
    rng = draw_rng(data)
    mask = problem.required("mask")
    shape = np.broadcast_shapes(mask.shape, problem.required("bias").shape)
    bias = np.broadcast_to(problem.required("bias"), shape)  # a value at every mask position
    zeroed = problem.with_(bias=np.where(mask, bias, 0.0))
    loud = zeroed.with_(
        bias=np.where(mask, bias, _large_finite_fill(kernel, data, shape, problem.dtype))
    )
    with replaying([("zeroed", zeroed)], "out_zeroed"):
        assert_identical(
            kernel.output(loud),
            kernel.output(zeroed),
            "out with large finite bias at masked positions vs bias 0 there",
            loud,
            kernel,
        )

    excluded = rng.random(mask.shape) < data.draw(st.sampled_from([0.3, 0.6]), label="-inf share")
    by_bias = zeroed.with_(bias=np.where(excluded, -np.inf, zeroed.required("bias")))
    by_mask = zeroed.with_(mask=mask & ~excluded)
    # one definition, two calls: the kernel's own accuracy is matches-reference's (SDPA-7.3)
    assert_same_result(
        kernel,
        by_bias,
        kernel.output(by_bias),
        kernel.output(by_mask),
        "out with -inf bias vs those positions masked out [SDPA-3.3]",
        keyless_rows=False,
        replay=(
            [("by_mask", by_mask)],
            "out_by_mask",
        ),  # a row the -inf bias empties is SDPA-5.1's (empty-rows-zero)
    )


@register("mask-and-causal", "SDPA-3.4", applies=needs("mask", "causal", "mask_and_causal"))
def mask_and_causal(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A mask together with is_causal allows exactly the keys both allow: the result is
    within TOL-2 of the definition with the AND of the mask and the causal mask (and a
    bias, where one is drawn)."""
    # a bias of a few units where one is drawn: SDPA-7.4's large fills are large-logits'
    problem = draw_problem(data, kernel, mask="always", causal="always", tight=True)
    out = kernel.output(problem)
    assert_matches_reference(kernel, problem, out, "out (mask AND causal)")
