"""Pins of the JAX-family divergences in docs/divergences.md (jax 0.10.2, flax 0.12.8, CPU):
each test calls the upstream function directly on the write-up's minimal case, in JAX's
(B, T, N, H) layout, and asserts today's divergent answer next to the float64 definition
(tests/oracle.py, in the spec's (..., H, L, E) layout), so it fails when upstream changes.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import sdpa

from attnspec.reference.tolerance import error_bound

jax = pytest.importorskip("jax", reason="the kernels pinned here are JAX's")
flax = pytest.importorskip("flax", reason="the kernels pinned here are flax's")
jnp = jax.numpy


def _flat(out: object) -> list[float]:
    return np.asarray(out, dtype=np.float64).ravel().tolist()


def test_upstream_jax_fill_outranks_a_finfo_min_bias() -> None:
    """docs/divergences.md#jax-fill-outranks-min-bias: SDPA-4.1 and SDPA-3.1 say an excluded
    key has no weight; a finite bias, finfo.min included, keeps its key in S(i) (SDPA-3.3).
    With both keys' bias at float32's finfo.min and key 1 excluded (causal or masked), the
    definition is key 0's value, 2.  jax.nn (and flax.nnx, which calls it) fills excluded
    logits with -0.7 * float32 max, above s + finfo.min: key 1 takes all the weight (4);
    flax.linen fills with finfo(dtype).min, a tie with s + finfo.min: the mean (3), in every
    dtype.  jax.nn is right in float16: its finfo.min (-65504) is far above the fill."""
    from flax import linen, nnx

    want, _ = sdpa(
        np.ones((1, 1, 1)),
        np.asarray([[[1.0], [-1.0]]]),
        np.asarray([[[2.0], [4.0]]]),
        bias=np.full((1, 2), float(np.finfo(np.float32).min)),
        is_causal=True,
    )
    assert want.ravel().tolist() == [2.0]
    key_1_masked = jnp.asarray([[[[True, False]]]])
    for dtype, jax_gives, linen_gives in (
        (jnp.float32, 4.0, 3.0),
        (jnp.bfloat16, 4.0, 3.0),
        (jnp.float16, 2.0, 3.0),
    ):
        q = jnp.ones((1, 1, 1, 1), dtype)
        k = jnp.asarray([1.0, -1.0], dtype).reshape(1, 2, 1, 1)
        v = jnp.asarray([2.0, 4.0], dtype).reshape(1, 2, 1, 1)
        bias = jnp.full((1, 1, 1, 2), jnp.finfo(dtype).min, dtype)  # an element padded entirely
        for attention in (
            jax.nn.dot_product_attention,
            lambda *a, **kw: nnx.dot_product_attention(*a, **kw, deterministic=True),
        ):
            causal = attention(q, k, v, bias=bias, is_causal=True)
            masked = attention(q, k, v, bias=bias, mask=key_1_masked)
            assert _flat(causal) == _flat(masked) == [jax_gives], dtype
        masked = linen.dot_product_attention(q, k, v, bias=bias, mask=key_1_masked)
        assert _flat(masked) == [linen_gives], dtype


# Two float16 problems whose scores float16 cannot hold, (B, T, N, H), E = 1 (so the scale
# is 1): a bias of 64 added to a score of 2**-5 (64.03125 rounds to 64), and a score
# 3 * 21.34375 = 64.03125 next to 3 * 21.3125 = 63.9375; values 0 and 1.
FLOAT16_SCORES = {
    "bias": ([[[[0.25]]]], [[[[0.125]], [[0.0]]]], [[[[64.0, 64.0]]]]),
    "q.k": ([[[[3.0]]]], [[[[21.34375]], [[21.3125]]]], None),
}
VALUES = [[[[0.0]], [[1.0]]]]


@pytest.mark.parametrize("case", sorted(FLOAT16_SCORES))
def test_upstream_flax_linen_rounds_float16_scores(case: str) -> None:
    """docs/divergences.md#flax-linen-float16-accuracy: SDPA-7.3 bounds the error by TOL-2,
    which allows float32 score arithmetic for float16 inputs (SDPA-7.2).  flax.linen forms
    q k^T and adds the bias in float16, so a score moves by up to half a float16 ulp (1/32
    at 64): about 4x the bound here; forcing the softmax to float32 does not help (the scores are
    already rounded); flax.nnx (float32 logits, through jax.nn) is within it."""
    from flax import linen, nnx

    q, k, bias = FLOAT16_SCORES[case]
    as64 = [np.swapaxes(np.asarray(x, np.float64), 1, 2) for x in (q, k, VALUES)]
    bound = error_bound(
        *as64,
        dtype="float16",
        bias=None if bias is None else np.asarray(bias, np.float64),
        weights=False,
    )
    want, tolerance = bound.out.item(), bound.out_tolerance.item()
    args = [jnp.asarray(x, jnp.float16) for x in (q, k, VALUES)]
    kwargs = {"bias": None if bias is None else jnp.asarray(bias, jnp.float16)}
    rounded = {"bias": 0.5, "q.k": 0.484375}[case]  # the softmax of the float16-rounded scores
    for force_fp32 in (False, True):
        got = linen.dot_product_attention(
            *args, **kwargs, deterministic=True, force_fp32_for_softmax=force_fp32
        )
        # float32 weights times float16 values come back float32: round them as float16
        assert float(np.float16(_flat(got)[0])) == rounded, (force_fp32, got)
    assert abs(rounded - want) > 3 * tolerance, (rounded, want, tolerance)
    right = _flat(nnx.dot_product_attention(*args, **kwargs, deterministic=True))[0]
    assert abs(right - want) <= tolerance, (right, want, tolerance)
