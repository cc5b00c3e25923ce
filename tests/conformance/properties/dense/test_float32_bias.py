"""SDPA-1.4: a kernel declaring ``float32_bias`` gets its bias in float32 for float16 inputs
(PyTorch SDPA accepts such a float attn_mask; Hugging Face models build float32 padding masks
of finfo(float32).min), in every property, and the definition uses those values as given.
A kernel that adds it in float32 passes; one that casts it to the inputs' dtype first turns
finfo(float32).min into -inf, so a fully padded row excludes its keys: a NaN in their values
no longer reaches the output (SDPA-8.3; TOL-2's cap allows any convex combination for such a
row, so the output alone does not show it).  Issue 32's gap: the bias was always passed in
q's dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import SMALL_LIMITS, verdict_of

from attnspec.conformance import declaration_of, declare
from attnspec.conformance.judge.verdict import FAILED, PASSED
from attnspec.reference import scaled_dot_product_attention


def _kernel(cast_bias: bool) -> Any:
    @declare(bias=True, float32_bias=True, dtypes=("float16",), mask=False)
    def kernel(
        q: Any, k: Any, v: Any, *, bias: Any = None, is_causal: bool = False, scale: Any = None
    ) -> Any:
        if bias is not None and bias.dtype != np.float32:
            raise TypeError(f"bias.dtype={bias.dtype}, but this kernel takes float32 biases")
        if bias is not None and cast_bias:
            with np.errstate(over="ignore"):
                bias = bias.astype(q.dtype)  # the bug: finfo(float32).min -> -inf
        wide = [a.astype(np.float32) for a in (q, k, v)]
        with np.errstate(all="ignore"):
            out = scaled_dot_product_attention(
                *wide,
                bias=None if bias is None else bias.astype(np.float32),
                is_causal=is_causal,
                scale=scale,
            )
        return np.asarray(out).astype(q.dtype)

    return kernel


CHECKED = ("matches-reference", "nan-propagates", "layout-independence", "bias-shift-invariance")


@pytest.mark.parametrize("property_id", CHECKED)
def test_a_kernel_adding_the_float32_bias_in_float32_conforms(property_id: str) -> None:
    """SDPA-1.4, SDPA-3.2, SDPA-8.3, SDPA-1.7: float32 biases of float16 inputs, used as
    given, in every property that passes a bias (the strided-layout call included).  The
    sizes are capped (SMALL_LIMITS, every stratum and anchor still run): the bias's dtype on
    its way to the kernel is what is checked, which a small problem shows as a large one."""
    fn = _kernel(cast_bias=False)
    verdict = verdict_of(
        property_id, fn, declaration=declaration_of(fn), seed=0, limits=SMALL_LIMITS
    )
    assert verdict.status == PASSED, verdict.detail


def test_a_kernel_casting_the_float32_bias_to_float16_fails() -> None:
    """SDPA-1.4, SDPA-8.3: finfo(float32).min cast to float16 is -inf; a fully padded row
    then drops the NaN its values hold."""
    fn = _kernel(cast_bias=True)
    verdict = verdict_of("nan-propagates", fn, declaration=declaration_of(fn), seed=0, shrink=False)
    assert verdict.status == FAILED, verdict.detail


def test_without_the_claim_the_bias_comes_in_the_inputs_dtype() -> None:
    """SDPA-1.4: the claim decides the bias's dtype; undeclared, float16 inputs get a float16
    bias, which this kernel refuses (so the claim is what the passing runs above relied on)."""
    fn = _kernel(cast_bias=False)
    declaration = declaration_of(fn)
    from dataclasses import replace

    plain = replace(declaration, float32_bias=False)
    verdict = verdict_of("matches-reference", fn, declaration=plain, seed=0, shrink=False)
    assert verdict.status == FAILED
    assert "float32 biases" in verdict.detail
