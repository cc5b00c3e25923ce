"""One problem, as the reference tests write it, drawn or hand-written.

A *problem* is the keyword arguments of one call of the reference: NumPy float64 ``q``,
``k``, ``v`` (and ``bias``, ``alibi_slopes``), a bool ``mask`` and the options
(``is_causal``, ``causal_alignment``, ``scale``, ``softcap``).  ``support.on_backend``
moves it to a backend in a dtype; the oracles take it as it is.  :func:`problems` draws
one (Hypothesis); :func:`problem_of_shapes` writes one by hand from its shapes, with
reproducible random values, for an ``@example`` or a test of one situation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import oracle_features
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

Shape = tuple[int, ...]

# Values shrink towards 0 and masks towards False (every key disallowed); |x| <= 4 keeps
# the scores where every dtype represents them (SDPA-7.4's large scores have their own test).
VALUES = st.floats(-4.0, 4.0, allow_nan=False, allow_subnormal=False)
BIAS_VALUES = st.one_of(VALUES, st.just(-np.inf))  # SDPA-3.3: -inf excludes a key


def problem_of_shapes(
    *,
    q: Shape,
    k: Shape,
    v: Shape,
    mask: Shape | None = None,
    bias: Shape | None = None,
    empty_rows: Sequence[int] = (),
    minus_inf: bool = False,
    magnitude: float = 1.0,
    alibi: Shape | None = None,
    seed: int = 0,
    **options: Any,
) -> dict[str, Any]:
    """A problem of these shapes: standard normal q, k (times ``magnitude``), v and bias
    (30% of it -inf with ``minus_inf``), a mask of density 0.7, ALiBi slopes of shape
    ``alibi`` (the Press et al. ones, each scaled by a factor in [1, 2)) and ``options``
    as given.  The ``empty_rows`` query rows see no key: all False in the mask, else all
    -inf in the bias (SDPA-5.1)."""
    rng = np.random.default_rng(seed)
    problem: dict[str, Any] = {
        "q": rng.standard_normal(q) * magnitude,
        "k": rng.standard_normal(k) * magnitude,
        "v": rng.standard_normal(v),
    }
    if mask is not None:
        problem["mask"] = rng.random(mask) < 0.7
    if bias is not None:
        problem["bias"] = rng.standard_normal(bias)
        if minus_inf:
            problem["bias"][rng.random(bias) < 0.3] = -np.inf
    for row in empty_rows:
        if mask is not None:
            problem["mask"][..., row, :] = False
        else:
            problem["bias"][..., row, :] = -np.inf
    if alibi is not None:
        slopes = np.asarray(oracle_features.press_slopes(q[-3]))
        problem["alibi_slopes"] = np.broadcast_to(slopes, alibi) * (1 + rng.random(alibi))
    return {**problem, **options}


def broadcast_to_some(draw: st.DrawFn, full: Shape, min_dims: int) -> Shape:
    """A shape that broadcasts to ``full``: a suffix of it, some sizes replaced by 1."""
    n_dims = draw(st.integers(min_dims, len(full)))
    kept = full[len(full) - n_dims :]
    return tuple(draw(st.sampled_from((size, 1))) for size in kept)


def _values(draw: st.DrawFn, shape: Shape, elements: st.SearchStrategy[float] = VALUES) -> Any:
    return draw(arrays(np.float64, shape, elements=elements, fill=st.nothing()))


@st.composite
def problems(draw: st.DrawFn) -> dict[str, Any]:
    """A dense problem of SDPA-1 … SDPA-6: batch dims (empty, zero-sized, broadcast),
    GQA groups, Lq and Lk from 0, E != Ev, Ev = 0, a broadcast mask and bias, causal in
    both alignments, explicit scales including 0 and negative ones."""
    # Zero sizes (SDPA-1.5, SDPA-5.2) are drawn last of each list: a test would otherwise
    # spend most examples on empty arrays (Hypothesis favours the ends of a range), and
    # sampled_from shrinks to the first entry, the smallest non-empty size.
    n_kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    n_queries, n_keys = (
        draw(st.sampled_from((1, 2, 3, 4, 5, 0))),
        draw(st.sampled_from((1, 2, 3, 4, 5, 6, 0))),
    )
    head_dim, value_dim = draw(st.integers(1, 4)), draw(st.sampled_from((1, 2, 3, 0)))
    batch = tuple(draw(st.lists(st.sampled_from((1, 2, 3, 0)), max_size=2)))
    q_batch = broadcast_to_some(draw, batch, 0)
    kv_batch = broadcast_to_some(draw, batch, 0)
    problem: dict[str, Any] = {
        "q": _values(draw, (*q_batch, n_kv_heads * group, n_queries, head_dim)),
        "k": _values(draw, (*kv_batch, n_kv_heads, n_keys, head_dim)),
        "v": _values(draw, (*kv_batch, n_kv_heads, n_keys, value_dim)),
    }
    batch = np.broadcast_shapes(q_batch, kv_batch)  # what the call broadcasts to (SDPA-1.2)
    scores = (*batch, n_kv_heads * group, n_queries, n_keys)
    if draw(st.booleans()):
        problem["mask"] = draw(
            arrays(np.bool_, broadcast_to_some(draw, scores, 2), fill=st.nothing())
        )
    if draw(st.booleans()):
        problem["bias"] = _values(draw, broadcast_to_some(draw, scores, 2), BIAS_VALUES)
    if draw(st.booleans()):
        problem["is_causal"] = True
        problem["causal_alignment"] = draw(st.sampled_from(("top_left", "bottom_right")))
    if draw(st.booleans()):
        problem["scale"] = draw(st.floats(-2.0, 2.0, allow_subnormal=False))
    return problem


@st.composite
def redrawn(draw: st.DrawFn, cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One of ``cases`` with its values drawn anew (masks too; -inf bias entries where
    the case has any), its shapes and options kept: for JAX, which compiles every
    operation anew for each new shape."""
    case = draw(st.sampled_from(list(cases)))
    problem = {n: _values(draw, case[n].shape) for n in ("q", "k", "v")}
    if "mask" in case:
        problem["mask"] = draw(arrays(np.bool_, case["mask"].shape, fill=st.nothing()))
    if "bias" in case:
        minus_inf = bool(np.isneginf(case["bias"]).any())
        problem["bias"] = _values(draw, case["bias"].shape, BIAS_VALUES if minus_inf else VALUES)
    options = {n: value for n, value in case.items() if not isinstance(value, np.ndarray)}
    return {**problem, **options}
