"""SDPA-6: grouped-query attention — query head h reads key/value head h // G, and head
counts that are not a multiple are rejected."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...draw.input_features import allowed_keys
from ...draw.sizes import Dims, current, realistic
from ...draw.strategies import draw_dims, draw_problem, draw_rng, random_values
from ..assertions import assert_matches_reference, first_index
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import needs, register


@register("gqa-mapping", "SDPA-6.1", applies=needs("gqa"))
def gqa_mapping(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Query head h uses key/value head h // G (contiguous groups, not h % Hkv): with
    column 0 of V constant g + 1 in kv head g, that column names the head each query
    head read; the whole output is within TOL-2 of the definition."""
    if realistic():
        dims = draw_dims(data, kernel, min_kv_heads=2, min_groups=2)
    else:

        def grouped(dims: Dims) -> bool:
            return dims.n_kv_heads >= 2 and dims.groups >= 2

        dims = draw_dims(data, kernel, min_queries=1, min_keys=1, where=grouped)
        if current().pool is None or not grouped(dims):  # a pooled shape: compiled already
            dims = replace(
                dims,
                n_kv_heads=data.draw(st.integers(2, 3), label="Hkv"),
                groups=data.draw(st.integers(2, 3), label="G"),
            )
    # tight: a bias of a few units, so no row's weights vanish (padding fills could); the
    # mask and causal as the pooled shape's options have them (a row keeping a key is
    # read as any other)
    problem = draw_problem(data, kernel, dims=dims, tight=True)
    # Weights sum to 1 over a row's allowed keys and bias is finite, so column 0 of every
    # output row with one is g + 1 up to rounding far below 1/2 (a row without is SDPA-5.1's).
    v = problem.v.copy()
    v[..., 0] = (np.arange(dims.n_kv_heads) + 1.0)[:, None]
    problem = problem.with_(v=v)
    out = kernel.output(problem)

    read = np.rint(out[..., 0]) - 1
    should = np.broadcast_to((np.arange(dims.n_q_heads) // dims.groups)[:, None], read.shape)
    # a non-finite row reads no head: the accuracy check below reports it as what it is
    reads = allowed_keys(problem, kernel.declaration).any(axis=-1) & np.isfinite(read)
    wrong = reads & ~(read == should)
    if wrong.any():
        at = first_index(wrong)
        head = at[-2]
        raise PropertyFailure(
            f"query head {head} read key/value head {read[at]:g} (out{(*at, 0)} = "
            f"{float(out[(*at, 0)])!r}), but should read head h // G = {head} // "
            f"{dims.groups} = {should[at]} [SDPA-6.1]",
            problem,
            kernel,
        )
    assert_matches_reference(kernel, problem, out)


@register("gqa-rejects-bad-heads", "SDPA-6.2", applies=needs("gqa"))
def gqa_rejects_bad_heads(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Hq not a multiple of Hkv raises an exception (any type) instead of returning a
    result; a kernel that silently maps heads somehow fails."""
    dims = draw_dims(data, kernel, min_queries=1, min_keys=1, gqa=False)
    n_kv_heads = data.draw(st.integers(2, 4), label="Hkv")
    whole = data.draw(st.integers(0, 2), label="whole groups")
    n_q_heads = whole * n_kv_heads + data.draw(st.integers(1, n_kv_heads - 1), label="rest")
    dtype = kernel.widest_dtype
    rng = draw_rng(data)
    problem = Problem(
        q=random_values(
            kernel, rng, (*dims.batch, n_q_heads, dims.n_queries, dims.head_dim), dtype
        ),
        k=random_values(kernel, rng, (*dims.batch, n_kv_heads, dims.n_keys, dims.head_dim), dtype),
        v=random_values(kernel, rng, (*dims.batch, n_kv_heads, dims.n_keys, dims.value_dim), dtype),
        dtype=dtype,
    )
    args, kwargs = kernel.arguments(problem)
    try:
        result = kernel.call_raw(args, kwargs)
    except Exception:
        return  # any exception is the rejection this clause asks for
    shape = tuple(getattr(kernel.split(result, problem)[0], "shape", ()))
    raise PropertyFailure(
        f"q has Hq={n_q_heads} heads and k/v have Hkv={n_kv_heads}, which does not divide "
        f"it, but the kernel returned a result of shape {shape} instead of raising [SDPA-6.2]",
        problem,
        kernel,
    )
