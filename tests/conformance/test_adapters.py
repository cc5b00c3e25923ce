"""The built-in adapters of known kernels (CONF-1, CONF-3): ``attnspec check NAME`` finds each one
under its library's name with its backend, each computes attention (checked against the
float64 oracle on small inputs with a mask, a bias and causality), and the divergences the
matrix shows are pinned here, so a test fails when upstream changes the behaviour.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import numpy as np
import pytest
from oracle import sdpa

from attnspec.conformance.api import KernelSetup
from attnspec.conformance.kernels.known import KNOWN_KERNELS, known_backend

torch = pytest.importorskip("torch", reason="the adapters checked here are PyTorch's")

RNG = np.random.default_rng(9)
Q, K, V = (RNG.standard_normal((2, 3, n, 4)) for n in (5, 6, 6))
MASK = RNG.random((2, 1, 5, 6)) < 0.7
MASK[..., 0] = True  # every row keeps a key, so no row is fully masked
BIAS = RNG.standard_normal((1, 3, 5, 6))


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x)


def test_every_known_kernel_names_an_installed_or_reported_adapter() -> None:
    """Each matrix row either imports or says which module is missing."""
    for entry in KNOWN_KERNELS:
        missing = entry.missing()
        assert missing is None or missing.endswith("does not import here"), entry
        assert known_backend(entry.name) == entry.backend


def test_check_finds_the_adapter_and_backend_of_a_library_name() -> None:
    """``attnspec check torch.nn:MultiheadAttention`` needs no wrapper and no --backend."""
    kernel = KernelSetup("torch.nn:MultiheadAttention").prepare()
    assert kernel.backend.name == "torch"
    assert kernel.declaration.returns_weights and kernel.declaration.batch_ndim == 1
    assert "multihead_attention" in kernel.fn.__qualname__


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_names_resolve_to_the_jax_backend() -> None:
    assert KernelSetup("jax.nn:dot_product_attention").make_backend().name == "jax"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_adapters_compute_masked_biased_causal_attention() -> None:
    from attnspec.conformance.kernels.adapters import torch as adapters

    for kernel in (adapters.flex_attention_block_mask, adapters.flex_attention_score_mod):
        for causal in (False, True):
            want, _ = sdpa(Q, K, V, mask=MASK, bias=BIAS, is_causal=causal)
            got = kernel(_t(Q), _t(K), _t(V), mask=_t(MASK), bias=_t(BIAS), is_causal=causal)
            np.testing.assert_allclose(got.detach().numpy(), want, atol=1e-12, err_msg=str(kernel))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_sinks_adapter_puts_the_sink_in_the_denominator_only() -> None:
    """SINK-1, SINK-2: the sink score_mod (a key of zeros scored by the head's sink) against
    the serving oracle, with GQA, a mask, the causal rule (which must not exclude the sink's
    key, past every real key) and a row that sees no key (its output 0: the sink takes the
    whole weight)."""
    from oracle_serving import attend

    from attnspec.conformance.kernels.adapters.torch import flex_attention_sinks

    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 4, 5, 3)), *rng.standard_normal((2, 2, 2, 6, 3))
    mask = rng.random((2, 1, 5, 6)) < 0.6
    mask[:, :, 1] = False
    sinks = rng.standard_normal(4).astype(np.float32)
    got = flex_attention_sinks(
        *map(_t, (q, k, v)), mask=_t(mask), is_causal=True, sinks=_t(sinks), enable_gqa=True
    ).numpy()
    for b in range(2):
        allowed = mask[b, 0] & np.tri(5, 6, dtype=bool)
        want, _ = attend(q[b], k[b], v[b], allowed.__getitem__, sinks=sinks)
        np.testing.assert_allclose(got[b], want, atol=1e-12)
    assert not got[:, :, 1].any()


def test_multihead_attention_adapter_is_pure_attention_with_either_mask_argument() -> None:
    """Identity projections: the layer is SDPA per head; a key-only mask goes through
    key_padding_mask, any other through attn_mask (both True = masked out)."""
    from attnspec.conformance.kernels.adapters.torch import (
        multihead_attention,
        multihead_attention_no_weights,
    )

    key_only = MASK[:, :, :1, :]
    for mask in (MASK, key_only):
        want, weights = sdpa(Q, K, V, mask=mask)
        out, got_weights = multihead_attention(_t(Q), _t(K), _t(V), attn_mask=_t(mask))
        np.testing.assert_allclose(out.numpy(), want, atol=1e-12)
        np.testing.assert_allclose(got_weights.numpy(), weights, atol=1e-12)
        out = multihead_attention_no_weights(_t(Q), _t(K), _t(V), attn_mask=_t(mask))
        np.testing.assert_allclose(out.numpy(), want, atol=1e-12)


def test_upstream_multihead_attention_gives_nan_for_a_fully_masked_row_with_weights() -> None:
    """docs/divergences.md#mha-empty-rows: SDPA-5.1 says 0.  nn.MultiheadAttention (torch
    2.13.0) gives NaN with need_weights=True (weights NaN too), through attn_mask,
    key_padding_mask or an all -inf float mask, and 0 with need_weights=False.  This fails
    when upstream changes either."""
    layer = torch.nn.MultiheadAttention(2, 1, bias=False, batch_first=True).eval()
    x = torch.ones(1, 1, 2)
    want, _ = sdpa(
        np.ones((1, 1, 1, 2)),
        np.ones((1, 1, 1, 2)),
        np.ones((1, 1, 1, 2)),
        mask=np.zeros((1, 1), dtype=bool),
    )
    assert (want == 0).all()
    masked_out = torch.ones(1, 1, dtype=torch.bool)
    with torch.no_grad():
        for masks in (
            {"attn_mask": masked_out},
            {"key_padding_mask": masked_out},
            {"attn_mask": torch.full((1, 1), float("-inf"))},
        ):
            out, weights = layer(x, x, x, need_weights=True, **masks)
            assert torch.isnan(out).all() and torch.isnan(weights).all(), masks
            out, _ = layer(x, x, x, need_weights=False, **masks)
            assert (out == 0).all(), masks


def _refuses_empty_and_cross(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any
) -> np.ndarray:
    """Correct attention that, like local-attention and FlexAttention, raises on an empty
    length or on Lq != Lk.  Its ``options`` go to the reference; undeclared, it is read
    as claiming mask, is_causal and scale (and no bias), all the suite passes it."""
    from attnspec.reference import scaled_dot_product_attention

    if 0 in (q.shape[-2], k.shape[-2]) or q.shape[-2] != k.shape[-2]:
        raise ValueError(f"unsupported lengths Lq={q.shape[-2]}, Lk={k.shape[-2]}")
    return scaled_dot_product_attention(q, k, v, **options)


def test_limitations_are_declared_once_and_named_in_the_claim() -> None:
    """equal_lengths and empty_sizes=False: a kernel that refuses Lq != Lk and empty
    lengths conforms on everything else, the claim line says "needs Lq == Lk" and names
    SDPA-1.5 and SDPA-5.2 as waived (CONF-7); undeclared, the same kernel fails."""
    from attnspec.conformance.api import check
    from attnspec.conformance.claims.declaration import declaration_of
    from attnspec.conformance.judge.verdict import FAILED, WAIVED
    from attnspec.conformance.report.render import conformance_claim

    only = ["matches-reference", "empty-sizes", "no-keys-zero", "key-permutation"]
    declared = check(
        _refuses_empty_and_cross,
        backend="numpy",
        only=only,
        dtypes=["float64"],
        equal_lengths=True,
        empty_sizes=False,
    )
    assert declared.conforms, [v.detail for v in declared.verdicts]
    status = {v.property: v.status for v in declared.verdicts}
    assert status["empty-sizes"] == status["no-keys-zero"] == WAIVED
    assert declared.waived == ["SDPA-1.5", "SDPA-5.2"]
    claim = conformance_claim(
        declaration_of(_refuses_empty_and_cross, equal_lengths=True, empty_sizes=False),
        ("float64",),
    )
    assert "needs Lq == Lk" in claim and "except SDPA-1.5, SDPA-5.2" in claim, claim
    undeclared = check(_refuses_empty_and_cross, backend="numpy", only=only[:2], dtypes=["float64"])
    assert {v.status for v in undeclared.verdicts} == {FAILED}


def test_upstream_multihead_attention_overflows_float16_scores_with_weights() -> None:
    """docs/divergences.md#mha-float16-overflow: SDPA-7.4 says finite inputs whose output
    is representable give a finite output.  With need_weights=True, nn.MultiheadAttention
    (torch 2.13.0) forms q k^T in float16 and returns NaN once it passes 65504; with
    need_weights=False it gives the right value.  Fails when upstream changes either."""
    layer = (
        torch.nn.MultiheadAttention(1, 1, bias=False, batch_first=True, dtype=torch.float16)
        .eval()
        .requires_grad_(False)
    )
    with torch.no_grad():
        layer.in_proj_weight.fill_(1.0)
        layer.out_proj.weight.fill_(1.0)
    q = torch.tensor([[[1000.0]]], dtype=torch.float16)
    k = torch.tensor([[[1000.0], [-1000.0]]], dtype=torch.float16)
    v = torch.tensor([[[1.0], [2.0]]], dtype=torch.float16)
    want, _ = sdpa(q.double().numpy(), k.double().numpy(), v.double().numpy())
    assert want.item() == 1.0
    out, weights = layer(q, k, v, need_weights=True)
    assert torch.isnan(out).all() and torch.isnan(weights).all()
    out, _ = layer(q, k, v, need_weights=False)
    assert out.item() == 1.0


def test_upstream_flex_attention_leaks_nan_from_masked_values() -> None:
    """docs/divergences.md#flex-masked-nan: SDPA-8.2 (SHOULD) says a NaN in a masked-out
    value does not reach the output; FlexAttention (torch 2.13.0) gives NaN, whether the key
    is masked by a block mask's mask_mod or by a score_mod's -inf.  Fails when upstream
    changes it."""
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q = torch.tensor([[[[0.25, 1.0]]]], dtype=torch.float64)
    k = torch.tensor([[[[0.5, -1.0], [0.5, 0.5]]]], dtype=torch.float64)
    v = torch.tensor([[[[1.0, 2.0], [float("nan"), float("nan")]]]], dtype=torch.float64)
    want, _ = sdpa(q.numpy(), k.numpy(), np.nan_to_num(v.numpy()), mask=np.array([[True, False]]))
    assert want.tolist() == [[[[1.0, 2.0]]]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "called without torch.compile()"
        block_mask = create_block_mask(
            lambda b, h, q_idx, kv_idx: kv_idx == 0, 1, 1, 1, 2, device="cpu"
        )
        by_block_mask = flex_attention(q, k, v, block_mask=block_mask)
        by_score_mod = flex_attention(
            q,
            k,
            v,
            score_mod=lambda s, b, h, q_idx, kv_idx: torch.where(kv_idx == 0, s, float("-inf")),
        )
    assert torch.isnan(by_block_mask).all() and torch.isnan(by_score_mod).all()


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras is not installed")
def test_upstream_keras_computes_float64_as_float32(
    tmp_path: Path, python_c: Callable[..., CompletedProcess[str]]
) -> None:
    """docs/divergences.md#keras-float64: keras.ops.dot_product_attention returns float32
    for float64 inputs (its floatx), so float64 is outside its declared dtypes.  In a fresh
    process: Keras picks its backend (numpy here) once, at import.  Fails when upstream
    changes it."""
    code = (
        "import numpy as np, keras; q = np.full((1, 1, 1, 1), 0.1); "
        "print(keras.config.floatx(), keras.ops.dot_product_attention(q, q, q).dtype)"
    )
    result = python_c(code, env={"KERAS_BACKEND": "numpy"}, cwd=tmp_path)
    assert result.stdout.split() == ["float32", "float32"], result.stderr[-2000:]


@pytest.mark.skipif(
    importlib.util.find_spec("local_attention") is None, reason="local-attention is not installed"
)
def test_upstream_local_attention_leaks_nan_outside_the_window() -> None:
    """docs/divergences.md#local-attention-masked-nan: SPARSE-6.3 (SHOULD) says a NaN
    outside S(i) does not reach row i; local-attention 1.11.2 leaks a NaN value from a key
    outside the exact window but inside the looked-at bucket.  Fails when upstream changes."""
    from attnspec.conformance.kernels.adapters.thirdparty import local_attention

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 6, 2, dtype=torch.float64, generator=generator) for _ in range(3))
    clean = local_attention(q, k, v)
    window = np.zeros((6, 6), dtype=bool)
    for i in range(6):
        window[i, max(0, i - 4) : i + 1] = True
    want, _ = sdpa(q.numpy(), k.numpy(), v.numpy(), mask=window)
    np.testing.assert_allclose(clean.numpy(), want, atol=1e-12)  # the pattern, as declared
    v[..., 0, :] = float("nan")  # key 0 is outside query 5's window
    assert torch.isnan(local_attention(q, k, v)[0, 0, 5]).all()


def test_upstream_sdpa_masked_overflowing_key_gives_nan() -> None:
    """docs/divergences.md#torch-masked-overflow: torch 2.13.0's SDPA (math, CPU flash,
    dispatcher) gives NaN when a masked key's score overflows float32, outside SDPA-8.1's
    precondition (q . k = 6e38 is not finite), so not a divergence.  Fails when upstream
    changes it."""
    from attnspec.conformance.kernels.torch_sdpa import sdpa_flash, sdpa_math

    q = torch.ones(1, 1, 1, 2)
    k = torch.tensor([[[[0.5, 0.5], [3e38, 3e38]]]])
    v = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    mask = torch.tensor([[True, False]])
    want, _ = sdpa(q.double().numpy(), k.double().numpy(), v.double().numpy(), mask=mask.numpy())
    assert want.flatten().tolist() == [1.0, 2.0]
    for kernel in (torch.nn.functional.scaled_dot_product_attention, sdpa_math, sdpa_flash):
        assert torch.isnan(kernel(q, k, v, attn_mask=mask)).all(), kernel


def test_sdpa_flash_pads_without_carrying_scores_past_float32() -> None:
    """SDPA-8.1 (docs/divergences.md#torch-masked-overflow): sdpa_flash pads E = 8 up to
    Ev = 160 with the scale passed, so a masked key whose q . k is within the precondition
    (a quarter of float32's largest, over the largest |q| row sum) leaves every output
    bit-identical; padding to head dim 512 with q times 8, as it did, gives NaN there."""
    from attnspec.conformance.call.layouts import pad_head_dims
    from attnspec.conformance.kernels.torch_sdpa import one_batch_dim, sdpa_flash, sdpa_on

    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, 16, 8, generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(1, 1, 16, 160, generator=gen).bfloat16()
    mask = torch.ones(16, 16, dtype=torch.bool)
    mask[:, 0] = False
    largest = torch.finfo(torch.float32).max / 4 / float(q.float().abs().sum(-1).max())
    k2, v2 = k.clone(), v.clone()
    k2[..., 0, :] = largest
    v2[..., 0, :] = largest
    assert float((q.float() @ k2.float().mT).abs().max()) < torch.finfo(torch.float32).max / 4
    before, after = (sdpa_flash(q, a, b, attn_mask=mask) for a, b in ((k, v), (k2, v2)))
    assert torch.equal(before, after)
    factor_padded = pad_head_dims(one_batch_dim(sdpa_on("FLASH_ATTENTION", "old")))
    assert torch.isnan(factor_padded(q, k2, v2, attn_mask=mask)).any()


NAN = float("nan")
# What keras 3.15.1 gives on keras_probe.py's inputs (beside this file; jax: jax 0.10.2);
# the spec's answers are fully_masked 0 (SDPA-5.1), nan_query NaN (SDPA-8.3), gqa_4_over_2
# ones (SDPA-6.1), gqa_1_over_2 an error (SDPA-6.2, SHOULD), float16_scores_1e6 1
# (SDPA-7.4), mask_1d 2 (SDPA-3.1), causal_scale_0 [[0, 1], [1, 2], [2, 3]] (SDPA-7.1),
# and, computed by test_keras_probe_definitions, causal_min_bias 2 (SDPA-4.1),
# masked_score_5e4_float16 1 (SDPA-8.1), float16_score_rounding 0.47658 within 0.00194
# (SDPA-7.3), masked_nan_value and bias_excluded_nan_key 4 (SDPA-8.2, SHOULD),
# value_dim_3_head_dim_2 ones of shape (1, 1, 1, 3) and value_dim_3_no_queries_shape
# [1, 0, 1, 3] (SDPA-1.1, SDPA-1.5).
KERAS_BACKENDS = ("torch", "jax", "numpy")
ONE = [[[[1.0]]]]
CAUSAL_ROWS = [[[[0.0, 1.0]], [[1.0, 2.0]], [[2.0, 3.0]]]]
GQA_ONES = [[[[1.0], [1.0], [1.0], [1.0]]]]
# case: the answers of (torch, jax, numpy), side by side
KERAS_ANSWERS: dict[str, tuple[Any, Any, Any]] = {
    "fully_masked": ([[[[3.0]]]],) * 3,
    "nan_query": ([[[[0.0]]]], [[[[NAN]]]], [[[[NAN]]]]),
    "gqa_4_over_2": (GQA_ONES, GQA_ONES, "ValueError"),
    "gqa_1_over_2": ([[[[1.0], [1.0]]]], "TypeError", [[[[1.0], [1.0]]]]),
    "float16_scores_1e6": (ONE, ONE, [[[[NAN]]]]),
    "mask_1d": ("IndexError", [[[[2.0]]]], [[[[2.0]]]]),
    "causal_scale_0": ([[[[NAN, NAN]], [[NAN, NAN]], [[2.0, 3.0]]]], CAUSAL_ROWS, CAUSAL_ROWS),
    "causal_min_bias": ([[[[2.0]]]], [[[[4.0]]]], [[[[4.0]]]]),
    "masked_score_5e4_float16": ([[[[2.0]]]], ONE, ONE),
    "float16_score_rounding": ([[[[0.476562]]]], [[[[0.476562]]]], [[[[0.484375]]]]),
    "masked_nan_value": ([[[[NAN]]]],) * 3,
    "bias_excluded_nan_key": ([[[[NAN]]]],) * 3,
    "value_dim_3_head_dim_2": ([[[[1.0, 1.0, 1.0]]]], "TypeError", [[[[1.0, 1.0, 1.0]]]]),
    "value_dim_3_no_queries_shape": ([1, 0, 1, 3], [1, 0, 1, 2], [1, 0, 1, 3]),
}
KERAS_UPSTREAM = {
    backend: {case: answers[i] for case, answers in KERAS_ANSWERS.items()}
    for i, backend in enumerate(KERAS_BACKENDS)
}


# The probe's later cases that each backend answers differently from the definition
KERAS_DIVERGING = {
    "torch": {"masked_score_5e4_float16", "masked_nan_value", "bias_excluded_nan_key"},
    "jax": {
        "causal_min_bias",
        "masked_nan_value",
        "bias_excluded_nan_key",
        "value_dim_3_head_dim_2",
        "value_dim_3_no_queries_shape",
    },
    # float16_score_rounding no longer diverges: erratum E-2026.12-14 (spec/errata.md) lets a
    # kernel round its scale and the operands it scales to the input dtype, so TOL-2 charges
    # one such rounding at every scale and Keras-on-NumPy's float16 scores fall within it
    "numpy": {
        "causal_min_bias",
        "masked_nan_value",
        "bias_excluded_nan_key",
    },
}


def test_keras_probe_definitions() -> None:
    """The float64 definitions (tests/oracle.py, TOL-2 for the float16 accuracy case) of
    keras_probe.py's later cases, restated in the spec's (B, H, L, E) layout, and which of
    KERAS_UPSTREAM's pinned answers differ from them: the pins are divergences, not typos."""
    from attnspec.reference.tolerance import error_bound

    finfo_min = float(np.finfo(np.float32).min)
    rounding = error_bound(
        np.full((1, 1, 1, 1), 3.0),
        np.asarray([[[[21.34375], [21.3125]]]]),
        np.asarray([[[[0.0], [1.0]]]]),
        dtype="float16",
        weights=False,
    )
    definitions = {
        "causal_min_bias": sdpa(
            np.ones((1, 1, 1)),
            np.asarray([[[1.0], [-1.0]]]),
            np.asarray([[[2.0], [4.0]]]),
            bias=np.full((1, 2), finfo_min),
            is_causal=True,
        )[0],
        "masked_score_5e4_float16": sdpa(
            np.ones((1, 1, 1)),
            np.asarray([[[0.5], [5.0e4]]]),
            np.asarray([[[1.0], [2.0]]]),
            mask=np.asarray([[True, False]]),
        )[0],
        "masked_nan_value": sdpa(
            np.full((1, 1, 1), 0.5),
            np.asarray([[[0.5], [1.0]]]),
            np.asarray([[[0.0], [4.0]]]),  # key 0's NaN is masked out: any value
            mask=np.asarray([[False, True]]),
        )[0],
        "bias_excluded_nan_key": sdpa(
            np.full((1, 1, 1), 0.5),
            np.asarray([[[0.0], [1.0]]]),  # key 0's NaN is excluded by its -inf bias: any key
            np.asarray([[[2.0], [4.0]]]),
            bias=np.asarray([[-np.inf, 0.0]]),
        )[0],
        "value_dim_3_head_dim_2": sdpa(np.ones((1, 1, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 3)))[
            0
        ],
    }
    assert [definitions[c].ravel().tolist() for c in sorted(definitions)] == [
        [4.0],
        [2.0],
        [4.0],
        [1.0],
        [1.0, 1.0, 1.0],
    ]
    want, tolerance = rounding.out.item(), rounding.out_tolerance.item()
    for backend, answers in KERAS_UPSTREAM.items():
        diverging = set()
        for case, definition in definitions.items():
            got = np.asarray(answers[case], dtype=object)
            if got.shape != (1, 1, 1, definition.size) or not np.array_equal(
                got.astype(float).ravel(), definition.ravel()
            ):
                diverging.add(case)
        if abs(answers["float16_score_rounding"][0][0][0][0] - want) > tolerance:
            diverging.add("float16_score_rounding")
        if answers["value_dim_3_no_queries_shape"] != [1, 0, 1, 3]:
            diverging.add("value_dim_3_no_queries_shape")
        assert diverging == KERAS_DIVERGING[backend], backend


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras is not installed")
@pytest.mark.parametrize("backend", sorted(KERAS_UPSTREAM))
def test_upstream_keras_divergences(backend: str, tmp_path: Path) -> None:
    """docs/divergences.md#keras-empty-rows ... #keras-numpy-float16: Keras's answers on the
    divergences' minimal cases, per backend; fails when upstream changes any of them."""
    import json
    import os
    import subprocess
    import sys

    probe = Path(__file__).with_name("keras_probe.py")
    result = subprocess.run(
        [sys.executable, str(probe)],
        capture_output=True,
        text=True,
        env={**os.environ, "KERAS_BACKEND": backend},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    observed = json.loads(result.stdout.strip().splitlines()[-1])
    assert observed.keys() == KERAS_UPSTREAM[backend].keys()
    for case, want in KERAS_UPSTREAM[backend].items():
        np.testing.assert_equal(observed[case], want, err_msg=f"{backend}: {case}")


@pytest.mark.skipif(importlib.util.find_spec("flax") is None, reason="flax is not installed")
def test_upstream_flax_divergences() -> None:
    """docs/divergences.md#flax-empty-rows, #flax-nnx-head-dims, #flax-batch-broadcast,
    #flax-linen-float16: what
    flax's dot_product_attention (nnx and linen) gives on each divergence's minimal case,
    (B, L, H, E) inputs; fails when upstream changes any of them."""
    import jax.numpy as jnp
    from flax import linen, nnx

    one = jnp.full((1, 1, 1, 1), 0.5)
    keys, values = jnp.asarray([[[[0.5]], [[1.0]]]]), jnp.asarray([[[[2.0]], [[4.0]]]])
    for attention in (nnx.dot_product_attention, linen.dot_product_attention):
        # SDPA-5.1: 0; flax fills masked logits with finfo.min: mean(V) = 3
        masked = attention(
            one, keys, values, mask=jnp.zeros((1, 1, 1, 2), bool), deterministic=True
        )
        assert np.asarray(masked).tolist() == [[[[3.0]]]], attention
        # ... and an all -inf bias row gives NaN
        biased = attention(
            one, keys, values, bias=jnp.full((1, 1, 1, 2), -jnp.inf), deterministic=True
        )
        assert np.isnan(np.asarray(biased)).all(), attention
    # SDPA-1.1: Ev != E is valid; nnx rejects it (it calls jax.nn.dot_product_attention)
    with pytest.raises(ValueError):
        nnx.dot_product_attention(
            jnp.ones((1, 1, 1, 2)),
            jnp.ones((1, 2, 1, 2)),
            jnp.ones((1, 2, 1, 3)),
            deterministic=True,
        )
    # SDPA-1.2: batch shapes (2, 3) and (1,) broadcast; both flax functions reject them
    broadcastable = jnp.ones((2, 3, 1, 4)), jnp.ones((1, 5, 1, 4)), jnp.ones((1, 5, 1, 4))
    with pytest.raises(AssertionError, match="batch dims must match"):
        linen.dot_product_attention(*broadcastable, deterministic=True)
    with pytest.raises(ValueError, match="batch dims must match"):
        nnx.dot_product_attention(*broadcastable, deterministic=True)
    # SDPA-7.4: scores of 1e6 are finite; linen computes them in float16 (65504): NaN; 1
    q16 = jnp.asarray([[[[1000.0]]]], jnp.float16)
    k16 = jnp.asarray([[[[1000.0]], [[-1000.0]]]], jnp.float16)
    v16 = jnp.asarray([[[[1.0]], [[2.0]]]], jnp.float16)
    assert np.isnan(
        np.asarray(linen.dot_product_attention(q16, k16, v16, deterministic=True))
    ).all()
    assert np.asarray(
        nnx.dot_product_attention(q16, k16, v16, deterministic=True), dtype=np.float64
    ).tolist() == [[[[1.0]]]]


@pytest.mark.skipif(importlib.util.find_spec("flax") is None, reason="flax is not installed")
def test_upstream_jax_and_flax_leak_a_masked_nan_value() -> None:
    """docs/divergences.md#jax-masked-nan: SDPA-8.2 (SHOULD) says a NaN at a masked-out
    position does not reach the output; jax.nn and flax give NaN for a NaN value of a masked
    key (the definition: key 1's value, 4), but not for a NaN key, unless the key is
    excluded by a -inf bias instead of the mask (NaN + -inf is NaN).  Fails when upstream
    changes it."""
    import jax
    import jax.numpy as jnp
    from flax import linen, nnx

    q, k = jnp.full((1, 1, 1, 1), 0.5), jnp.asarray([[[[0.5]], [[1.0]]]])
    mask = jnp.asarray([[[[False, True]]]])  # key 0 masked out
    excluded_by_bias = jnp.asarray([[[[-jnp.inf, 0.0]]]])  # key 0 excluded (SDPA-3.3)
    nan_value = jnp.asarray([[[[jnp.nan]], [[4.0]]]])
    nan_key, values = jnp.asarray([[[[jnp.nan]], [[1.0]]]]), jnp.asarray([[[[2.0]], [[4.0]]]])
    want, _ = sdpa(
        np.zeros((1, 1, 1)),
        np.zeros((1, 2, 1)),
        np.asarray([[[0.0], [4.0]]]),
        mask=np.asarray([[False, True]]),
    )
    assert want.ravel().tolist() == [4.0]
    for attention in (
        jax.nn.dot_product_attention,
        lambda *a, **kw: nnx.dot_product_attention(*a, **kw, deterministic=True),
        lambda *a, **kw: linen.dot_product_attention(*a, **kw, deterministic=True),
    ):
        assert np.isnan(np.asarray(attention(q, k, nan_value, mask=mask))).all()
        assert np.asarray(attention(q, nan_key, values, mask=mask)).ravel().tolist() == [4.0]
        assert np.isnan(np.asarray(attention(q, nan_key, values, bias=excluded_by_bias))).all()
