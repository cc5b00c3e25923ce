"""SINK-1 … SINK-5: sink logits, one per query head, in every row's softmax
denominator with no value (gpt-oss; vLLM's ``s_aux``, FlashAttention 4's ``learnable_sink``).

Problems are drawn as for the dense properties (masks, bias, causal calls of the declared
alignment, GQA, explicit scales, rows with no allowed key) and the kernel gets the sink logits
``(Hq,)`` in float32 under its sinks keyword on top of the problem's own arguments.  The output
is compared with SINK-1 evaluated in float64 within SINK-5's bound: TOL-2 with the sink as one
more key whose score is the sink and whose value is 0.  Sink tokens beside a sliding window
(SINK-4, StreamingLLM) are a mask: the kernel gets ``n_sink_tokens=`` and ``window=`` and is
judged within TOL-2 of the dense definition with that mask.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.serving import streaming_mask
from ....reference.tolerance_serving import sink_error_and_lse_bound
from ...call.problem import Problem
from ...draw.strategies import ALWAYS, NEVER, draw_problem
from ..assertions import assert_elements_within, assert_matches_reference
from ..bounds import definition_keywords
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import needs, register
from ._helpers import draw_sinks


def _check(kernel: KernelUnderTest, problem: Problem, sinks: np.ndarray, lse: bool = False) -> None:
    """The output with ``sinks`` within SINK-5's bound of SINK-1; with ``lse`` the returned
    log-sum-exp too, within TOL-5 of SINK-3's."""
    decl = kernel.declaration
    args, keywords = kernel.arguments(problem)
    keywords[decl.sinks_keyword] = kernel.backend.asarray(sinks, "float32")
    shown = np.array2string(sinks, precision=4, separator=", ")
    try:
        raw = kernel.call_raw(args, keywords)
    except Exception as exc:
        raise KernelRaised(
            f"the kernel raised {type(exc).__name__} with sinks {shown}: {str(exc)[:300]}",
            problem,
            kernel,
        ) from exc
    out, _, returned_lse = kernel.results(raw, problem)
    out = kernel.numpy(out)
    batch = np.broadcast_shapes(problem.q.shape[:-3], problem.k.shape[:-3], problem.v.shape[:-3])

    def full(a: np.ndarray) -> np.ndarray:
        return np.broadcast_to(a, (*batch, *a.shape[-3:]))

    bound, lse_bound = sink_error_and_lse_bound(
        full(problem.q),
        full(problem.k),
        full(problem.v),
        sinks,
        **definition_keywords(problem, decl.causal_alignment, features=False),
    )
    expected, tolerance = np.asarray(bound.out), np.asarray(bound.out_tolerance)
    if out.shape != expected.shape:
        raise PropertyFailure(
            f"with sinks the output has shape {out.shape}, but should have {expected.shape} "
            f"(SDPA-1.3, SINK-1)",
            problem,
            kernel,
        )
    _outside_fails(
        out,
        expected,
        tolerance,
        f"with sink logits {shown} (one per query head), out",
        "SINK-1, SINK-5: the sink {sink:g} of head {head} joins the row's denominator, "
        "unscaled and without a value",
        sinks,
        -3,
        problem,
        kernel,
    )
    if lse:
        got = kernel.numpy(returned_lse)
        wanted = np.asarray(lse_bound.lse)
        if got.shape != wanted.shape:
            raise PropertyFailure(
                f"with sinks the log-sum-exp has shape {got.shape}, but should have "
                f"{wanted.shape} (LSE-3, SINK-3)",
                problem,
                kernel,
            )
        _outside_fails(
            got,
            wanted,
            np.asarray(lse_bound.lse_tolerance),
            f"with sink logits {shown} (one per query head), lse",
            "SINK-3, TOL-5: the log-sum-exp is that of the whole denominator, "
            "log(sum_j e^s_ij + e^{sink:g}) for head {head}, the sink itself for a row "
            "that sees no key",
            sinks,
            -2,
            problem,
            kernel,
        )


def _outside_fails(
    got: np.ndarray,
    expected: np.ndarray,
    tolerance: np.ndarray,
    what: str,
    clause: str,
    sinks: np.ndarray,
    head_axis: int,
    problem: Problem,
    kernel: KernelUnderTest,
) -> None:
    """A failure naming the first element of ``got`` outside ``tolerance`` of ``expected``
    and its head's sink (``clause`` is formatted with ``sink`` and ``head``; the head is
    the index on ``head_axis``)."""
    assert_elements_within(
        what,
        got,
        expected,
        tolerance,
        lambda at: clause.format(sink=sinks[at[head_axis]], head=at[head_axis]),
        problem=problem,
        kernel=kernel,
    )


@register("sinks-matches-reference", "SINK-5", applies=needs("sinks"))
def sinks_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With masks, bias, causal calls, GQA and explicit scales, sinks near, far above and
    far below the scores give an output within SINK-5's bound of SINK-1: a sink added to
    the scores' scale, taken per key/value head, left out of some rows' denominators, or
    given a value, is outside it."""
    problem = draw_problem(data, kernel)
    _check(kernel, problem, draw_sinks(data, problem.q.shape[-3]))


@register("sinks-empty-rows", "SINK-2", applies=needs("sinks", "mask"))
def sinks_empty_rows(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A row whose every key is masked gives 0 with sinks (the sink takes the whole weight,
    and has no value), never NaN nor the mean of the values."""
    problem = draw_problem(data, kernel, mask=ALWAYS, min_queries=1, min_keys=1)
    mask = np.array(problem.required("mask"), copy=True)
    shape = np.broadcast_shapes(mask.shape, (*problem.q.shape[:-1], problem.k.shape[-2]))
    mask = np.broadcast_to(mask, shape).copy()
    mask[..., 0, :] = False  # the first query of every head sees no key
    _check(kernel, problem.with_(mask=mask), draw_sinks(data, problem.q.shape[-3]))


@register("sinks-lse", "SINK-3", applies=needs("sinks", "returns_lse"))
def sinks_lse(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The returned log-sum-exp includes the sink, log(sum_j e^(s_ij) + e^(sink_h)), within
    TOL-5, and is the sink itself for a row that sees no key (with a mask, its first query's
    keys all masked): a log-sum-exp over the scores alone (-inf for such rows) fails."""
    problem = draw_problem(data, kernel)
    if kernel.declaration.mask and data.draw(st.booleans(), label="a row without keys"):
        mask = problem.mask if problem.mask is not None else np.ones((1, 1), dtype=bool)
        shape = np.broadcast_shapes(mask.shape, (*problem.q.shape[:-1], problem.k.shape[-2]))
        mask = np.broadcast_to(mask, shape).copy()
        mask[..., :1, :] = False
        problem = problem.with_(mask=mask)
    _check(kernel, problem, draw_sinks(data, problem.q.shape[-3]), lse=True)


def _streaming(n_queries: int, n_keys: int, n_sink: int, window: int, alignment: str) -> Any:
    """SINK-4's allowed set ``(Lq, Lk)`` for the kernel's alignment (the reference's)."""
    return np.asarray(streaming_mask(n_queries, n_keys, n_sink, window, alignment, xp=np))


@register("sink-tokens-matches-reference", "SINK-4", applies=needs("sink_tokens"))
def sink_tokens_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With 0-4 sink tokens and a window of 0 to Lk keys, GQA, bias and explicit scales,
    the output is within TOL-2 of the dense definition with SINK-4's streaming mask (causal
    by construction, in the declared alignment): sink tokens dropped once the window has
    moved past them, or counted twice where the window covers them too, are outside it."""
    problem = draw_problem(data, kernel, mask=NEVER, causal=NEVER)
    n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
    n_sink = data.draw(st.integers(0, 4), label="n_sink_tokens")
    window = data.draw(st.integers(0, max(n_keys, 1)), label="window")
    args, keywords = kernel.arguments(problem)
    keywords.update(n_sink_tokens=n_sink, window=window)
    streaming = _streaming(n_queries, n_keys, n_sink, window, kernel.declaration.causal_alignment)
    shown = problem.with_(mask=streaming)
    try:
        raw = kernel.call_raw(args, keywords)
    except Exception as exc:
        raise KernelRaised(
            f"the kernel raised {type(exc).__name__} with n_sink_tokens={n_sink}, "
            f"window={window}: {str(exc)[:300]}",
            shown,
            kernel,
        ) from exc
    out = kernel.numpy(kernel.results(raw, problem)[0])
    assert_matches_reference(
        kernel, shown, out, f"out with n_sink_tokens={n_sink}, window={window} [SINK-4]"
    )
