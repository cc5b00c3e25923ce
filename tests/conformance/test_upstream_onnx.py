"""Pins of ONNX ``Attention``'s divergences in docs/divergences.md (onnx 1.23.2's reference
evaluator, ONNX Runtime 1.32.0's CPU provider): each test runs the operator through the
matrix's adapters (a one-node model, the spec's layout) on the write-up's minimal case, at
opset 23 and 24, and asserts today's divergent answer next to the float64 definition
(tests/oracle.py), so it fails when upstream changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oracle import sdpa

pytest.importorskip("onnx", reason="the operator pinned here is ONNX's Attention")

from attnspec.conformance.kernels.adapters import onnx_attention

F16, F32 = np.float16, np.float32
OPSETS = (23, 24)


def _reference(opset: int, q: Any, k: Any, v: Any, mask: Any = None, **attributes: Any) -> Any:
    arrays = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    return onnx_attention.run_attention(onnx_attention._reference_runner, opset, arrays, attributes)


def _runtime(opset: int, q: Any, k: Any, v: Any, mask: Any = None, **attributes: Any) -> Any:
    pytest.importorskip("onnxruntime", reason="this pin is of ONNX Runtime's CPU kernel")
    arrays = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    return onnx_attention.run_attention(onnx_attention._runtime_runner, opset, arrays, attributes)


def _flat(out: Any) -> list[float]:
    return np.asarray(out, np.float64).ravel().tolist()


def _oracle(q: Any, k: Any, v: Any, **options: Any) -> list[float]:
    out, _ = sdpa(q[0], k[0], v[0], **options)
    return _flat(out)


TWO_KEYS = (
    np.array([[[[1.0]]]], F32),
    np.array([[[[1.0], [-1.0]]]], F32),
    np.array([[[[2.0], [4.0]]]], F32),
)


@pytest.mark.parametrize("opset", OPSETS)
def test_upstream_onnx_negative_scale_is_nan_and_runtime_refuses_nonpositive(opset: int) -> None:
    """docs/divergences.md#onnx-scale-sqrt: SDPA-2.2 allows any finite scale.  The operator
    scales Q and K by sqrt(scale): NaN for scale < 0 in the reference evaluator; ONNX
    Runtime refuses scale <= 0 when the session is created (the reference gets 0 right)."""
    q, k, v = TWO_KEYS
    want = _oracle(q, k, v, scale=-0.5)
    assert np.isfinite(want).all() and abs(want[0] - 3.4621) < 1e-4
    with np.errstate(invalid="ignore"):
        assert np.isnan(_flat(_reference(opset, q, k, v, scale=-0.5))).all()
    assert _flat(_reference(opset, q, k, v, scale=0.0)) == _oracle(q, k, v, scale=0.0) == [3.0]
    for scale in (-0.5, 0.0):
        with pytest.raises(Exception, match="scale must be greater than 0"):
            _runtime(opset, q, k, v, scale=scale)


@pytest.mark.parametrize("opset", OPSETS)
def test_upstream_onnx_empty_lengths_raise(opset: int) -> None:
    """docs/divergences.md#onnx-empty-lengths: SDPA-5.2 gives zeros for a query without keys
    and SDPA-1.5 allows empty lengths; both implementations raise on Lk = 0 (ONNX Runtime
    on Lq = 0 too)."""
    q, k, v = np.ones((1, 1, 2, 1), F32), np.ones((1, 1, 0, 1), F32), np.ones((1, 1, 0, 3), F32)
    assert _oracle(q, k, v) == [0.0] * 6
    with pytest.raises(ValueError, match="zero-size array"):
        _reference(opset, q, k, v)
    with pytest.raises(Exception, match="KV sequence length must be greater than 0"):
        _runtime(opset, q, k, v)
    with pytest.raises(Exception, match="q_sequence_length > 0"):
        _runtime(opset, q[:, :, :0], np.ones((1, 1, 2, 1), F32), np.ones((1, 1, 2, 3), F32))


@pytest.mark.parametrize("opset", OPSETS)
def test_upstream_onnx_mask_shapes(opset: int) -> None:
    """docs/divergences.md#onnx-mask-shapes: SDPA-3.1 / SDPA-3.2 broadcast a length-1 axis.
    The reference evaluator pads a (1,) mask over two keys with False (key 0 alone); ONNX
    Runtime refuses a 1-d mask and a bias whose query axis is 1 (transformers' padding
    mask shape)."""
    q, v = np.ones((1, 1, 1, 1), F32), np.array([[[[2.0], [4.0]]]], F32)
    k = np.zeros((1, 1, 2, 1), F32)
    mask = np.array([True])
    assert _oracle(q, k, v, mask=mask) == [3.0]
    assert _flat(_reference(opset, q, k, v, mask)) == [2.0]
    with pytest.raises(Exception, match="attn_mask must be 2D or 3D or 4D"):
        _runtime(opset, q, k, v, mask)
    q2, k2 = np.ones((2, 1, 3, 2), F32), np.ones((2, 1, 4, 2), F32)
    bias = np.zeros((2, 1, 1, 4), F32)
    assert _oracle(q2, k2, k2, bias=bias[0]) == [1.0] * 6
    assert _flat(_reference(opset, q2, k2, k2, bias)) == [1.0] * 12
    with pytest.raises(Exception, match="inconsistent q_sequence_length"):
        _runtime(opset, q2, k2, k2, bias)


@pytest.mark.parametrize("opset", OPSETS)
def test_upstream_onnx_float16_scores(opset: int) -> None:
    """docs/divergences.md#onnx-float16-scores: TOL-2 allows float32 scores for float16
    inputs (SDPA-7.2), where these are finite.  Scores in float16: q.k = 90000 overflows
    (SDPA-7.4; NaN in both); a masked key whose score overflows gives NaN (reference) or
    takes all the weight (ONNX Runtime's finite fill, SDPA-8.1); a row of finfo.min biases
    rounds to a tie (reference, SDPA-7.3) or comes out as zeros (ONNX Runtime)."""
    v = np.array([[[[2.0], [4.0]]]], F16)
    q, k = np.array([[[[300.0]]]], F16), np.array([[[[300.0], [299.0]]]], F16)
    assert _oracle(q, k, v, scale=1.0) == [2.0]
    with np.errstate(all="ignore"):
        assert np.isnan(_flat(_reference(opset, q, k, v, scale=1.0))).all()
    assert np.isnan(_flat(_runtime(opset, q, k, v, scale=1.0))).all()

    q, k = np.array([[[[2.0]]]], F16), np.array([[[[0.5], [40000.0]]]], F16)
    mask = np.array([[True, False]])
    assert _oracle(q, k, v, mask=mask, scale=1.0) == [2.0]
    with np.errstate(all="ignore"):
        assert np.isnan(_flat(_reference(opset, q, k, v, mask, scale=1.0))).all()
    assert _flat(_runtime(opset, q, k, v, mask, scale=1.0)) == [4.0]

    q, k = np.ones((1, 1, 1, 1), F16), np.array([[[[0.25], [-2.0]]]], F16)
    v = np.array([[[[1.0], [3.0]]]], F16)
    bias = np.full((1, 2), np.finfo(F16).min, F16)
    want = _oracle(q, k, v, bias=bias, scale=1.0)[0]
    assert abs(want - 1.1907) < 1e-4
    assert _flat(_reference(opset, q, k, v, bias, scale=1.0)) == [2.0]
    assert _flat(_runtime(opset, q, k, v, bias, scale=1.0)) == [0.0]


@pytest.mark.parametrize("opset", OPSETS)
def test_upstream_onnx_masked_nan_and_head_counts(opset: int) -> None:
    """docs/divergences.md#onnx-masked-nan (SDPA-8.2) and #onnx-gqa-heads (SDPA-6.2), both
    SHOULD: a NaN value at a masked key leaks in both; H_kv = 2 does not divide H_q = 1,
    which the reference evaluator broadcasts into two heads (ONNX Runtime raises)."""
    q, k = np.ones((1, 1, 1, 1), F32), np.ones((1, 1, 2, 1), F32)
    v = np.array([[[[2.0], [np.nan]]]], F32)
    mask = np.array([[True, False]])
    assert _oracle(q, k, np.nan_to_num(v), mask=mask) == [2.0]
    assert np.isnan(_flat(_reference(opset, q, k, v, mask))).all()
    assert np.isnan(_flat(_runtime(opset, q, k, v, mask))).all()
    kv = np.ones((1, 2, 1, 1), F32)
    assert np.shape(_reference(opset, q, kv, kv)) == (1, 2, 1, 1)
    with pytest.raises(Exception):  # noqa: B017 (ONNX Runtime's own exception type)
        _runtime(opset, q, kv, kv)


@pytest.mark.parametrize(
    "kernel",
    [onnx_attention.reference_attention_kv_cache, onnx_attention.runtime_attention_kv_cache],
    ids=["reference", "runtime"],
)
def test_upstream_onnx_cache_nan_past_the_lengths_leaks(kernel: Any) -> None:
    """docs/divergences.md#onnx-cache-nan (KVCACHE-7): NaN in the cache slots past
    nonpad_kv_seqlen = [3, 5] makes the output NaN; the oracle over each element's first
    keys is finite, and the operator gives it with finite values there."""
    if kernel is onnx_attention.runtime_attention_kv_cache:
        pytest.importorskip("onnxruntime", reason="this pin is of ONNX Runtime's CPU kernel")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 2, 1, 4)).astype(F32)
    k, v = (rng.standard_normal((2, 2, 8, 4)).astype(F32) for _ in range(2))
    lengths = np.array([3, 5], np.int32)
    want = np.stack([sdpa(q[b], k[b, :, :n], v[b, :, :n])[0] for b, n in enumerate(lengths)])
    assert np.abs(kernel(q, k, v, cache_seqlens=lengths) - want).max() < 1e-5
    for b, n in enumerate(lengths):
        k[b, :, n:] = v[b, :, n:] = np.nan
    with np.errstate(invalid="ignore"):
        assert np.isnan(kernel(q, k, v, cache_seqlens=lengths)).all()


def test_adapters_follow_the_declared_causal_alignment() -> None:
    """The declarations (not a divergence): without a cache is_causal is top-left
    (SDPA-4.1: the operator's offset is 0); over nonpad_kv_seqlen it is bottom-right per
    batch element (KVCACHE-2), against the oracle on Lq = 3, Lk = 5, GQA 4:2."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 3, 8)).astype(F32)
    k, v = (rng.standard_normal((1, 2, 5, 8)).astype(F32) for _ in range(2))
    want = sdpa(q[0], k[0], v[0], is_causal=True, causal_alignment="top_left")[0]
    got = onnx_attention.reference_attention_23(q, k, v, is_causal=True)
    assert np.abs(got - want).max() < 1e-5
    lengths = np.array([4])
    want = sdpa(q[0], k[0, :, :4], v[0, :, :4], is_causal=True, causal_alignment="bottom_right")[0]
    got = onnx_attention.reference_attention_kv_cache(
        q, k, v, cache_seqlens=lengths, is_causal=True
    )
    assert np.abs(got - want).max() < 1e-5
