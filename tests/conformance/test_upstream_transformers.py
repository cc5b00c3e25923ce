"""Pins of transformers' attention functions' divergences in docs/divergences.md (transformers
5.25.0, torch 2.13.0, CPU): each test calls the function through the matrix's adapter (a
stand-in module, the spec's layout) on the write-up's minimal case and asserts today's
divergent answer next to the float64 definition (tests/oracle.py), so it fails when
upstream changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oracle import sdpa

torch = pytest.importorskip("torch", reason="transformers' attention functions run on torch")
pytest.importorskip("transformers", reason="the functions pinned here are transformers'")

from attnspec.conformance.kernels.adapters import transformers_attention  # noqa: E402

Q, K, V = np.array([[[1.0]]]), np.array([[[1.0], [-1.0]]]), np.array([[[2.0], [4.0]]])


def _t(a: Any) -> Any:
    return torch.tensor(np.asarray(a)[None], dtype=torch.float64)


def _flat(out: Any) -> list[float]:
    # bfloat16 has no NumPy dtype: widen in torch first
    return np.asarray(out.double() if torch.is_tensor(out) else out).ravel().tolist()


def test_upstream_transformers_sdpa_drops_is_causal_for_one_query() -> None:
    """docs/divergences.md#transformers-sdpa-one-query: SDPA-4.1 (top-left, the alignment of
    PyTorch's SDPA that sdpa_attention_forward calls): one query and two keys attend key 0
    alone.  sdpa_attention_forward sets is_causal only when q_length > 1 (transformers
    #37807), so the one query attends both keys: bottom-right for one query, top-left for
    more."""
    want, _ = sdpa(Q, K, V, is_causal=True, causal_alignment="top_left")
    both, _ = sdpa(Q, K, V)
    assert _flat(want) == [2.0]
    got = transformers_attention.sdpa_attention(_t(Q), _t(K), _t(V), is_causal=True)
    assert _flat(got) == pytest.approx(_flat(both), abs=1e-15)
    assert abs(_flat(got)[0] - 2.0) > 0.2
    two = np.concatenate([Q, Q], axis=1)  # two queries: top-left, as declared
    want_two, _ = sdpa(two, K, V, is_causal=True, causal_alignment="top_left")
    got_two = transformers_attention.sdpa_attention(_t(two), _t(K), _t(V), is_causal=True)
    assert _flat(got_two) == pytest.approx(_flat(want_two), abs=1e-15)


def test_upstream_transformers_eager_softmax_in_float32() -> None:
    """docs/divergences.md#transformers-eager-float32-softmax (SDPA-7.3: TOL-2 in float64 is
    about 1e-15 here): Llama's eager_attention_forward takes the softmax in float32
    (softmax(..., dtype=torch.float32)), 1.4e-7 off; gpt-oss's keeps the input dtype.
    #transformers-eager-empty-rows (SDPA-5.1): a row with a -inf bias everywhere gives NaN
    in Llama's, 0 in gpt-oss's (its finite sink takes the weight)."""
    want, _ = sdpa(Q, K, V)
    got = transformers_attention.eager_attention(_t(Q), _t(K), _t(V))
    assert 1e-8 < abs(_flat(got)[0] - _flat(want)[0]) < 1e-6
    sinks = torch.tensor([-30.0], dtype=torch.float64)  # e^-30: no visible weight
    sunk = transformers_attention.gpt_oss_eager_attention(_t(Q), _t(K), _t(V), sinks=sinks)
    assert _flat(sunk) == pytest.approx(_flat(want), abs=1e-12)
    masked = torch.full((1, 2), -torch.inf, dtype=torch.float64)
    assert np.isnan(_flat(transformers_attention.eager_attention(_t(Q), _t(K), _t(V), masked)))[0]
    got = transformers_attention.gpt_oss_eager_attention(_t(Q), _t(K), _t(V), masked, sinks=sinks)
    assert _flat(got) == [0.0]


def test_upstream_transformers_eager_float16_scores_and_head_counts() -> None:
    """docs/divergences.md#transformers-eager-float16-scores (SDPA-7.4): q . k = 90000 is
    finite in float32, which TOL-2 allows for float16 inputs; both eager functions form it
    in float16 (inf, a NaN row), sdpa_attention_forward does not.  #transformers-gqa-heads
    (SDPA-6.2, SHOULD): H_q = 1 over H_kv = 2 gives 0 groups and an empty output."""
    q, k = np.array([[[300.0]]]), np.array([[[300.0], [299.0]]])
    want, _ = sdpa(q, k, V, scale=1.0)
    assert _flat(want) == [2.0]
    half = [_t(x).to(torch.float16) for x in (q, k, V)]
    adapters = transformers_attention
    for eager in (adapters.eager_attention, adapters.gpt_oss_eager_attention):
        assert np.isnan(_flat(eager(*half, scale=1.0))).all()
    assert _flat(adapters.sdpa_attention(*half, scale=1.0)) == [2.0]
    ones = torch.ones(1, 1, 1, 1), torch.ones(1, 2, 1, 1)
    assert adapters.eager_attention(ones[0], ones[1], ones[1]).shape == (1, 0, 1, 1)


def test_upstream_transformers_sdpa_empty_queries_and_head_counts() -> None:
    """docs/divergences.md#transformers-sdpa-empty-queries (SDPA-1.5): L_q = 0 has an empty
    output, but undoing the GQA packing reshapes it with an ambiguous -1.
    #transformers-gqa-heads (SDPA-6.2, SHOULD): H_q = 1 over H_kv = 2 is broadcast by SDPA
    into two heads."""
    keys = _t(K)
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        transformers_attention.sdpa_attention(_t(Q)[:, :, :0], keys, _t(V))
    ones = torch.ones(1, 1, 1, 1), torch.ones(1, 2, 1, 1)
    assert transformers_attention.sdpa_attention(ones[0], ones[1], ones[1]).shape == (1, 2, 1, 1)


def test_upstream_transformers_eager_rounds_bfloat16_scores_with_a_bias() -> None:
    """docs/divergences.md#transformers-eager-float16-scores (SDPA-7.3): scores 40.5 and
    40.25 + 0.125 = 40.375; the eager functions add the bias in bfloat16, where 40.375 rounds
    to 40.5 (a tie: 0.5); sdpa_attention_forward keeps the difference."""
    q, k = np.array([[[1.0]]]), np.array([[[40.5], [40.25]]])
    v, bias = np.array([[[0.0], [1.0]]]), np.array([[0.0, 0.125]])
    want = _flat(sdpa(q, k, v, bias=bias, scale=1.0)[0])[0]
    assert abs(want - 0.46879) < 1e-5
    args = [_t(x).to(torch.bfloat16) for x in (q, k, v)]
    b16 = torch.tensor(bias, dtype=torch.bfloat16)
    adapters = transformers_attention
    for eager in (adapters.eager_attention, adapters.gpt_oss_eager_attention):
        assert _flat(eager(*args, b16, scale=1.0)) == [0.5]
    assert abs(_flat(adapters.sdpa_attention(*args, b16, scale=1.0))[0] - want) < 1e-3


def test_flex_attention_adapter_passes_the_bias_softcap_and_heads(monkeypatch: Any) -> None:
    """SDPA-3.2, SOFTCAP-1, SDPA-6.1: the adapter of transformers' flex_attention_forward gives
    the float64 definition for a (1, H, Lq, Lk) bias it broadcasts to (B, H, Lq, Lk) (the
    function reads head 0 of a per-batch mask), a softcap before the bias, grouped heads and
    its output transposed back.  torch.compile's compilation is replaced by eager
    FlexAttention here (one compilation is 40-100 s on this machine); the matrix row runs
    the compiled kernel where a GPU is."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as integration

    def eager(q: Any, k: Any, v: Any, training: bool = False, **kwargs: Any) -> Any:
        return flex_attention(q, k, v, **kwargs)

    monkeypatch.setattr(integration, "compile_friendly_flex_attention", eager)
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 4, 3, 4)), *rng.standard_normal((2, 2, 2, 5, 4))
    bias = rng.standard_normal((1, 1, 3, 5))
    want, _ = sdpa(q, k, v, bias=bias, softcap=2.0, scale=0.3)
    got = transformers_attention.flex_attention(
        *(torch.from_numpy(a) for a in (q, k, v, bias)), scale=0.3, softcap=2.0
    )
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
