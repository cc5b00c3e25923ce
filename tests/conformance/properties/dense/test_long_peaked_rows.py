"""long-peaked-rows (SDPA-7.3, for the accumulation precision of SDPA-7.2): what it calls a
kernel with, and where it applies.

Its catching a float16 row sum and passing correct kernels (tiled, split-KV, torch SDPA, the
reference) are the catalogue's tests (tests/catalogue/test_caught.py, test_correct_pass.py).
"""

from __future__ import annotations

from typing import Any

from support import verdict_of

from attnspec.conformance.claims.declaration import KernelDeclaration
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.verdict import NOT_APPLICABLE, PASSED
from attnspec.reference import scaled_dot_product_attention as reference


def _recording(calls: list[tuple[str, int]]) -> Any:
    def kernel(
        q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False, scale: Any = None
    ) -> Any:
        calls.append((str(q.dtype), k.shape[-2]))
        return reference(q, k, v, mask=mask, is_causal=is_causal, scale=scale)

    return kernel


def test_rows_of_1025_to_4096_keys_in_each_half_precision_dtype() -> None:
    """SDPA-7.3: the reference passes; it is called in float16 (NumPy's one half-precision
    dtype) on rows of 1025, 2049 and 4096 keys, two peaked rows each."""
    calls: list[tuple[str, int]] = []
    verdict = verdict_of("long-peaked-rows", _recording(calls))
    assert verdict.status == PASSED, verdict.detail
    assert calls == [("float16", 1025), ("float16", 2049), ("float16", 4096)]


def test_rows_stay_within_max_len() -> None:
    """SDPA-7.3, CONF-12 (the size caps of the check): the user's --max-len caps the rows (a
    fixed property draws within the limits too): with 1500 the rows have 1025 keys; below
    1025, max-len keys."""
    calls: list[tuple[str, int]] = []
    verdict_of("long-peaked-rows", _recording(calls), limits=SizeLimits(max_len=1500))
    assert calls == [("float16", 1025)]
    calls.clear()
    verdict_of("long-peaked-rows", _recording(calls), limits=SizeLimits(max_len=300))
    assert calls == [("float16", 300)]
    calls.clear()
    one_key = verdict_of("long-peaked-rows", _recording(calls), limits=SizeLimits(max_len=1))
    assert one_key.status == PASSED and calls == [("float16", 1)], one_key.detail


def test_not_applicable_without_half_precision_or_with_equal_lengths() -> None:
    """CONF-3: a kernel claiming only float32/float64, or only Lq = Lk, has nothing this
    property can check: "not applicable", never "passed"; so on array-api-strict, which has
    no half-precision dtype."""
    wide = KernelDeclaration(dtypes=("float32", "float64"))
    assert verdict_of("long-peaked-rows", reference, declaration=wide).status == NOT_APPLICABLE
    square = KernelDeclaration(equal_lengths=True)
    assert verdict_of("long-peaked-rows", reference, declaration=square).status == NOT_APPLICABLE
    strict = verdict_of("long-peaked-rows", reference, backend="array_api_strict")
    assert strict.status == NOT_APPLICABLE and "half-precision" in strict.detail
