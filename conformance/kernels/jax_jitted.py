"""JAX's ``jax.nn.dot_product_attention`` under ``jax.jit``, as a JAX user runs it.

    attnspec check attnspec.conformance.kernels.jax_jitted:jitted_dot_product_attention \
        --backend jax

One jitted function takes the spec's ``(B, H, L, E)`` arrays, transposes them to JAX's
``(B, T, N, H)``, calls ``jax.nn.dot_product_attention`` and transposes back (exact
moves), so XLA compiles the whole call once per input shape and option: the kernel whose
quick profile the suite's shape pools are measured on (``conformance/shape_pool.py``,
README "Cost of a check").  Its declaration says what JAX documents and does: GQA, a
mask and an additive bias (combined with ``is_causal`` by AND), head dims E == Ev (the
suite pads with exact zero columns), and a fully masked row that gives mean(V), not 0
(SDPA-5.1 waived; docs/divergences.md).  float16 is left out: XLA's CPU dot product
rejects float16 inputs with float32 accumulation.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

from ..claims.declaration import declare
from .convention import SPEC_KEYWORDS, convention


@cache
def _jitted() -> Any:
    import jax

    def attention(q: Any, k: Any, v: Any, mask: Any, bias: Any, scale: Any, is_causal: bool) -> Any:
        def to_jax(x: Any) -> Any:
            return jax.numpy.swapaxes(x, -3, -2)

        out = jax.nn.dot_product_attention(
            to_jax(q), to_jax(k), to_jax(v), bias=bias, mask=mask, scale=scale, is_causal=is_causal
        )
        return to_jax(out)

    return jax.jit(attention, static_argnames=("is_causal",))


@declare(
    batch_ndim=1,
    gqa=True,
    bias=True,
    mask_and_causal=True,
    equal_head_dims=True,
    empty_rows_zero=False,
    dtypes=("bfloat16", "float32", "float64"),
)
@convention(keywords=SPEC_KEYWORDS)
def jitted_dot_product_attention(call: SimpleNamespace) -> Any:
    """jax.nn.dot_product_attention under jax.jit, in the spec's (B, H, L, E) layout."""
    q, k, v, mask, bias = call.q, call.k, call.v, call.mask, call.bias
    return _jitted()(q, k, v, mask, bias, call.scale, is_causal=call.is_causal)
