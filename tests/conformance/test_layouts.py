"""Layout and argument adapters (conformance/layouts.py): kernels written the JAX /
FlashAttention way are checked against the spec's layout (SDPA-1.1) unchanged.

The checks through the adapters draw every stratum and anchor cut to small sizes
(support.SMALL_SIZES): what an adapter moves (axes, padding, names) it moves at any size."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any

import numpy as np
import pytest
from array_api_compat import array_namespace
from support import SMALL_SIZES, backend_or_skip

from attnspec.backends import Backend
from attnspec.conformance import assert_conforms, declaration_of, declare
from attnspec.conformance.call.layouts import (
    from_blhd,
    from_layout,
    pad_head_dims,
    rename_arguments,
)
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, WAIVED
from attnspec.conformance.run.property_runner import run_property
from attnspec.reference import scaled_dot_product_attention

AGREEMENT = ["matches-reference", "default-scale", "explicit-scale"]


def _numpy_attention(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Softmax over the last axis restricted to ``allowed``; rows with none give 0."""
    scores = np.where(allowed, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    weights = np.where(allowed, np.exp(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def blhd_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """Attention written natively for (..., L, H, E) arrays, as JAX and FlashAttention
    lay them out; the mask stays (..., H, Lq, Lk)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("...qhe,...khe->...hqk", q.astype(np.float64), k.astype(np.float64))
    allowed = np.ones(scores.shape, dtype=bool)
    if mask is not None:
        allowed = allowed & mask
    if is_causal:
        n_q, n_k = scores.shape[-2:]
        allowed = allowed & np.tril(np.ones((n_q, n_k), dtype=bool))
    weights = _numpy_attention(scores * scale, allowed)
    return np.einsum("...hqk,...khe->...qhe", weights, v.astype(np.float64)).astype(q.dtype)


def same_dims_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any) -> np.ndarray:
    """A spec-layout kernel that, like JAX's and FlashAttention 2's, needs E == Ev.  Its
    ``options`` (mask, is_causal, scale) go to blhd_attention; undeclared, it is read as
    claiming them, as blhd_attention's own keywords are."""
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"value head dim {v.shape[-1]} != query head dim {q.shape[-1]}")
    swap = (*range(q.ndim - 3), q.ndim - 2, q.ndim - 3, q.ndim - 1)
    out = blhd_attention(*(np.transpose(a, swap) for a in (q, k, v)), **options)
    return np.transpose(out, swap)


# --- from_blhd --------------------------------------------------------------------------------


def test_blhd_kernel_conforms_through_the_adapter() -> None:
    """SDPA-1.1: a correct BLHD kernel, wrapped, passes the agreement properties."""
    assert_conforms(from_blhd(blhd_attention), backend="numpy", only=AGREEMENT, **SMALL_SIZES)


def test_blhd_kernel_without_the_adapter_fails() -> None:
    """SDPA-1.1: the same kernel unwrapped reads heads as positions, and the suite says so."""
    with pytest.raises(AssertionError, match="FAILED matches-reference"):
        assert_conforms(blhd_attention, backend="numpy", only=["matches-reference"], **SMALL_SIZES)


@pytest.mark.parametrize("batch", [(), (2, 1)], ids=["no-batch", "2-batch"])
def test_from_blhd_transposes_exactly(cpu_backend: Backend, batch: tuple[int, ...]) -> None:
    """SDPA-1.1: wrapping a BLHD kernel that is the reference behind an explicit
    transpose gives the reference's own output, bit for bit, on every backend."""
    n = len(batch) + 3
    to_blhd = (*range(n - 3), n - 2, n - 3, n - 1)  # (..., H, L, E) <-> (..., L, H, E)

    def reference_in_blhd(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        xp = array_namespace(q, k, v)
        out = scaled_dot_product_attention(
            *(xp.permute_dims(a, to_blhd) for a in (q, k, v)), **kwargs
        )
        return xp.permute_dims(out, to_blhd)

    rng = np.random.default_rng(0)
    q, k, v = (
        cpu_backend.asarray(rng.standard_normal((*batch, 2, length, dim)), "float32")
        for length, dim in ((3, 4), (5, 4), (5, 6))
    )
    mask = cpu_backend.asarray(rng.random((2, 3, 5)) < 0.7)
    out = from_blhd(reference_in_blhd)(q, k, v, mask=mask, is_causal=True)
    expected = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True)
    assert tuple(out.shape) == (*batch, 2, 3, 6)
    np.testing.assert_array_equal(cpu_backend.to_numpy(out), cpu_backend.to_numpy(expected))


def test_from_blhd_transposes_only_the_output_of_a_tuple() -> None:
    """Returned weights are already (..., H, Lq, Lk): only ``out`` is transposed."""
    q = np.zeros((1, 3, 2, 4))  # (B, L, H, E)
    weights = np.ones((1, 2, 3, 3))
    out, passed = from_blhd(lambda q, k, v: (q, weights))(q, q, q)
    assert out.shape == (1, 3, 2, 4) and passed is weights


def test_from_blhd_keeps_and_updates_the_declaration() -> None:
    """The wrapper carries the kernel's declaration (attached, known or inferred) plus claims."""
    # declare() marks the function it is given: a copy, so that blhd_attention stays
    # undeclared for the tests that run after this one in the same worker
    copy = functools.wraps(blhd_attention)(lambda *args, **kwargs: blhd_attention(*args, **kwargs))
    declared = declare(bias=True, causal_alignment="bottom_right")(copy)
    wrapped = from_blhd(declared, gqa=True)
    declaration = declaration_of(wrapped)
    assert (declaration.bias, declaration.gqa, declaration.causal_alignment) == (
        True,
        True,
        "bottom_right",
    )
    assert wrapped.__qualname__ == "from_blhd(blhd_attention)"
    torch = pytest.importorskip("torch", reason="torch SDPA's known declaration")
    known = declaration_of(from_blhd(torch.nn.functional.scaled_dot_product_attention))
    assert (known.mask_keyword, known.gqa_keyword) == ("attn_mask", "enable_gqa")


def test_from_blhd_rejects_bad_arrays() -> None:
    """SDPA-1.1: too few dims and mixed libraries are errors naming the argument."""
    kernel = from_blhd(blhd_attention)
    with pytest.raises(ValueError, match=r"q\.shape=\(2, 3\), but should have at least 3 dims"):
        kernel(np.zeros((2, 3)), np.zeros((1, 2, 3)), np.zeros((1, 2, 3)))
    strict = backend_or_skip("array_api_strict")
    with pytest.raises(TypeError, match="arrays from different libraries"):
        kernel(np.zeros((1, 1, 2)), strict.asarray(np.zeros((1, 1, 2))), np.zeros((1, 1, 2)))


def test_from_layout() -> None:
    assert from_layout(blhd_attention, "bhld") is blhd_attention
    assert from_layout(blhd_attention, "blhd").__qualname__ == "from_blhd(blhd_attention)"
    assert declaration_of(from_layout(blhd_attention, "bhld", bias=True)).bias
    with pytest.raises(ValueError, match="layout='bshd', but should be one of 'bhld', 'blhd'"):
        from_layout(blhd_attention, "bshd")


# --- pad_head_dims ------------------------------------------------------------------------------


def test_kernel_needing_equal_head_dims_conforms_when_padded() -> None:
    """SDPA-1.1, SDPA-2.1: zero padding lets an E == Ev kernel take any E and Ev exactly."""
    with pytest.raises(AssertionError, match="value head dim"):
        assert_conforms(
            same_dims_attention, backend="numpy", only=["matches-reference"], **SMALL_SIZES
        )
    assert_conforms(
        pad_head_dims(same_dims_attention), backend="numpy", only=AGREEMENT, **SMALL_SIZES
    )


def test_pad_head_dims_pads_and_cuts() -> None:
    """SDPA-1.1, SDPA-2.1: Ev < E pads v and cuts the output; Ev > E with a scale pads q, k
    to Ev; Ev > E without one pads q, k, v to E * 4**n >= Ev and doubles q n times, so the
    kernel's own default 1/sqrt(E * 4**n) applies 1/sqrt(E), and no scale is passed."""
    calls: list[tuple[tuple[int, ...], ...]] = []
    scales: list[Any] = []
    largest_q: list[float] = []

    def recorder(q: Any, k: Any, v: Any, *, scale: Any = None) -> Any:
        calls.append((q.shape, k.shape, v.shape))
        scales.append(scale)
        largest_q.append(float(np.max(q)))
        return np.ones((*q.shape[:-1], v.shape[-1]))

    padded = pad_head_dims(recorder)
    ones = np.ones((2, 3, 4))
    assert padded(ones, np.zeros((2, 5, 4)), np.zeros((2, 5, 1))).shape == (2, 3, 1)
    assert padded(ones, np.zeros((2, 5, 4)), np.zeros((2, 5, 9))).shape == (2, 3, 9)
    assert padded(ones, np.zeros((2, 5, 4)), np.zeros((2, 5, 9)), scale=0.5).shape
    assert calls == [
        ((2, 3, 4), (2, 5, 4), (2, 5, 4)),
        ((2, 3, 16), (2, 5, 16), (2, 5, 16)),
        ((2, 3, 9), (2, 5, 9), (2, 5, 9)),
    ]
    assert scales == [None, None, 0.5]
    assert largest_q == [1.0, 2.0, 1.0]


# --- rename_arguments --------------------------------------------------------------------------


def flash_like(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> np.ndarray:
    """FlashAttention's keyword names (causal, softmax_scale), spec layout, no mask."""
    return same_dims_attention(q, k, v, is_causal=causal, scale=softmax_scale)


def test_renamed_kernel_is_read_and_checked_under_spec_names() -> None:
    """SDPA-1.1, SDPA-2.2: renamed keywords make is_causal and scale claimable and checked."""
    renamed = rename_arguments(flash_like, is_causal="causal", scale="softmax_scale")
    declaration = declaration_of(renamed)
    assert (declaration.causal, declaration.scale, declaration.mask) == (True, True, False)
    assert declaration_of(flash_like).causal is False  # unrenamed, neither is claimable
    assert_conforms(pad_head_dims(renamed), backend="numpy", only=AGREEMENT, **SMALL_SIZES)


def test_renamed_keywords_reach_the_kernel() -> None:
    seen: dict[str, Any] = {}

    def kernel(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: Any = None) -> Any:
        seen.update(causal=causal, softmax_scale=softmax_scale)
        return v

    rename_arguments(kernel, is_causal="causal", scale="softmax_scale")(
        1, 2, 3, is_causal=True, scale=0.25
    )
    assert seen == {"causal": True, "softmax_scale": 0.25}


def test_rename_keeps_a_declared_keyword_under_its_spec_name() -> None:
    kernel = declare(bias=True, mask_keyword="attn_mask")(
        lambda q, k, v, *, attn_mask=None, bias=None: v
    )
    assert declaration_of(rename_arguments(kernel, mask="attn_mask")).mask_keyword == "mask"


def test_rename_arguments_rejects_bad_names() -> None:
    """Unknown spec keywords, missing kernel parameters and non-names are errors."""
    with pytest.raises(ValueError, match="keyword='causal', but should be one of 'mask'"):
        rename_arguments(flash_like, causal="causal")
    with pytest.raises(ValueError, match="mask='attn_mask', but flash_like has no parameter"):
        rename_arguments(flash_like, mask="attn_mask")
    with pytest.raises(TypeError, match="scale=3, but should be the kernel's parameter name"):
        rename_arguments(flash_like, scale=3)  # type: ignore[arg-type]


# --- jax.nn.dot_product_attention ----------------------------------------------------------------


def test_jax_dot_product_attention_empty_rows_are_reported_as_sdpa_5_1() -> None:
    """SDPA-5.1: JAX gives mean(V) for a fully masked row; checked through the adapters,
    the property of that clause fails it; declaring empty_rows_zero=False waives it
    instead, and the report names the waived clause (CONF-7)."""
    jax = pytest.importorskip("jax", reason="checks JAX's own kernel")
    # under jax.jit, as JAX users call it: one compilation per shape, not one per eager
    # operation of the function (3.0 -> 1.8 CPU-s; the adapters see its signature through
    # the jit wrapper, and the run draws and finds the same: 3 examples, the same case)
    attention = jax.jit(jax.nn.dot_product_attention, static_argnames=("is_causal",))
    # jax.nn.dot_product_attention takes (B, T, N, H): one batch dim, declared (SDPA-1.1)
    kernel = from_blhd(pad_head_dims(attention), gqa=True, dtypes=("float32",), batch_ndim=1)
    # the property alone, its first failing example as found (it is the shrunk one too,
    # on the pooled shapes of a compiling backend): a check would go on to probe the
    # failure (convention hints, diagnosis probes: ~45 more JAX compilations, 2.3 of its
    # 3.0 CPU-s) for a finding this test does not read; the check itself is the
    # waived run's below, which reads the signature through the adapters and the jit
    under_test = KernelUnderTest(kernel, backend_or_skip("jax"), declaration_of(kernel))
    verdict = run_property(
        all_properties()["empty-rows-zero"],
        under_test,
        limits=SizeLimits(**SMALL_SIZES),
        shrink=False,
        reproduce=False,
    )
    assert (verdict.status, verdict.clause) == (FAILED, "SDPA-5.1"), verdict.detail
    # JAX fills a masked row with a finite value (mean(V)) and an all -inf bias row
    # gives NaN: whichever the example hit, the finding names what it saw.
    assert "in a row with no allowed key, but should be exactly 0" in verdict.detail
    assert "mean(V)" in verdict.detail or "NaN" in verdict.detail
    report = assert_conforms(
        kernel, backend="jax", only=["empty-rows-zero"], empty_rows_zero=False, **SMALL_SIZES
    )
    assert [v.status for v in report.verdicts] == [WAIVED]
    assert report.waived == ["SDPA-5.1"]


def test_packed_and_tokens_first_layouts_of_a_recurrence() -> None:
    """REC-1.1: ``from_packed`` hands a kernel ONNX's ``(B, T, H * d)`` arrays, a per-head gate
    and beta as ``(B, T, H)``, a per-key-channel gate as ``(B, T, H * dk)`` and the head counts
    as ``q_num_heads`` / ``kv_num_heads`` (which its signature then hides), and unpacks the
    output; ``from_blhd`` hands over ``(B, T, H, d)``, ``(B, T, H)`` and ``(B, T, H, dk)``. The
    final state passes through unchanged in both."""
    from attnspec.conformance.call.layouts import from_packed

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 5, n)) for n in (3, 3, 6))
    per_head, per_channel, state = (rng.standard_normal(s) for s in ((2, 4, 5), (2, 4, 5, 3), (1,)))
    seen: dict[str, Any] = {}

    def packed(
        query: Any, key: Any, value: Any, *, q_num_heads: int, kv_num_heads: int, **more: Any
    ) -> tuple[Any, Any]:
        seen.update(q=query, g=more["g"], beta=more["beta"], heads=(q_num_heads, kv_num_heads))
        return value * 2, more["initial_state"]

    wrapped = from_packed(packed)
    assert "q_num_heads" not in str(inspect.signature(wrapped))
    out, final = wrapped(q, k, v, g=per_channel, beta=per_head, initial_state=state)
    np.testing.assert_array_equal(seen["q"], np.swapaxes(q, 1, 2).reshape(2, 5, 12))
    np.testing.assert_array_equal(seen["g"], np.swapaxes(per_channel, 1, 2).reshape(2, 5, 12))
    np.testing.assert_array_equal(seen["beta"], np.swapaxes(per_head, 1, 2))
    assert seen["heads"] == (4, 4) and final is state
    np.testing.assert_array_equal(out, v * 2)

    def tokens_first(
        query: Any, key: Any, value: Any, *, g: Any, beta: Any, initial_state: Any = None
    ) -> tuple[Any, Any]:
        seen.update(q=query, g=g, beta=beta)
        return value * 2, initial_state

    out, final = from_blhd(tokens_first)(q, k, v, g=per_channel, beta=per_head, initial_state=state)
    np.testing.assert_array_equal(seen["g"], np.swapaxes(per_channel, 1, 2))
    np.testing.assert_array_equal(seen["beta"], np.swapaxes(per_head, 1, 2))
    assert final is state
    np.testing.assert_array_equal(out, v * 2)
