"""What each write-up filed in conformance/known_kernels.py confirms (CONF-1's "confirmed"
divergences): a link holds for the failure its docs/divergences.md entry describes, listed
under the clauses it names and showing what it shows, and for no other failure of the same
property.  The evidence strings are the findings and minimal cases of the matrix run
(/work/logs/matrix/m1.md) that the entries were confirmed on, and their near misses.
"""

from __future__ import annotations

import re

import pytest
from support import ROOT

from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.kernels.known import _DIVERGENCES, KNOWN_KERNELS, confirms, write_ups

DOCS = "docs/divergences.md#"
FLOAT16_LAYOUT = (
    "out with input layouts q: contiguous, k: contiguous, v: contiguous[(0, 0, 0, 1)] = "
    "0.0407, but should be 0.0441 within 0.000675 (TOL-2); error 0.0034 is 5.04x the bound "
    "q(1, 2, 1, 1), k(1, 2, 65, 1), v(1, 2, 65, 2), dtype=float16, is_causal=False, scale=None"
)
FLOAT32_LAYOUT = FLOAT16_LAYOUT.replace("float16", "float32")
# a fully masked float16 row (a JAX kernel's, on the padded anchor): SDPA-5.1's, not rounding
FLOAT16_EMPTY_ROW = (
    "out with input layouts q: contiguous, k: contiguous, v: contiguous, mask: contiguous"
    "[(0, 0, 1, 0, 2)] = -3.771484375, but should be 0.0 within 1.79e-07 (TOL-2); error 3.77 "
    "is 2.11e+07x the bound q(1, 3, 2, 6, 7), k(1, 3, 2, 1, 7), v(1, 3, 2, 1, 7), "
    "dtype=float16, is_causal=False, scale=None, mask(3, 1, 6, 1) (8/18 True)"
)
CAUSAL_MIN_BIAS = (
    "out of rows i + 0 < 1 after changing keys/values j >= 1 [SDPA-4.1 top-left: j <= i] "
    "differs at (1, 0, 0, 0) q(4, 1, 64, 64), k(4, 1, 65, 64), v(4, 1, 65, 64), "
    "dtype=bfloat16, is_causal=True, scale=0.5, mask(64, 65) (4160/4160 True), bias(4, 1, 1, 65)"
)
# --backward, the jitted kernel at SMALL_SIZES (docs/divergences.md#jax-fill-outranks-min-bias),
# and a gradient failure of another cause (PyTorch's causal scale 0: no bias)
GRADIENT_MIN_BIAS = (
    "dv[1, 0, 62, 0] = 0.15664993226528168, but should be 0.0 within 7.76e-37; 64 of 8192 "
    "elements outside [BWD-17] [anchor problem 'padded batch 4 x 64 x 64, finfo.min bias, an "
    "element padded entirely, head dim 64, float32' (AOT; HF additive masks), "
    "conformance/draw/anchors.py] q(4, 1, 64, 32), k(4, 1, 64, 32), v(4, 1, 64, 32), "
    "dtype=float32, is_causal=True, scale=None, mask(1, 1, 64, 64) (2051/4096 True), "
    "bias(4, 1, 64, 64)"
)
# a call of jax.nn that timed out under load (the matrix's BWD run, 2026-12-07): not the fill
GRADIENT_TIMEOUT = (
    "the kernel did not return within 60 s (--timeout SECONDS) on the inputs below; the check "
    "ended the kernel's process (and whatever it started) and went on [CONF-5] q(2, 9, 3, 2), "
    "k(2, 3, 4, 2), v(2, 3, 4, 2), dtype=bfloat16, is_causal=False, scale=2.0, mask(2, 1, 3, 4) "
    "(16/24 True), bias(1, 3, 4)"
)
GRADIENT_NAN = (
    "dq[0, 0, 0, 0] = nan, but should be 0.0 within 3.99e-06; 512 of 520 elements outside "
    "[BWD-17] q(1, 1, 65, 8), k(1, 1, 65, 8), v(1, 1, 65, 8), dtype=float16, is_causal=True, "
    "scale=0.0"
)
CAUSAL_MASK_ONLY = (
    "out of rows i + 0 < 1 after changing keys/values j >= 1 differs at (0, 0, 0, 0) "
    "q(1, 1, 1, 1), k(1, 1, 2, 1), v(1, 1, 2, 1), dtype=float32, is_causal=True, scale=None, "
    "mask(1, 2) (0/2 True)"
)
MASKED_LARGE = (
    "out after changing keys/values in masked columns [1] and bias entries at disallowed "
    "positions to values of magnitude 1.41e+04 [SDPA-8.1] differs at (0, 0, 23, 0): -9912.0 "
    "vs 0.27 q(1, 2, 65, 8), k(1, 1, 65, 8), v(1, 1, 65, 8), dtype=float16, is_causal=True, "
    "scale=-0.75, mask(1, 2, 65, 65) (8320/8450 True)"
)
GQA_RAISES = (
    "kernel raised ValueError: operands could not be broadcast together with remapped shapes "
    "q(1, 4, 1, 1), k(1, 2, 1, 1), v(1, 2, 1, 1), dtype=float32, is_causal=False, scale=None"
)
MASKED_NAN_VALUE = (
    "out after writing nan into v at disallowed positions (masked columns [0]) [SDPA-8.2] "
    "differs at (0, 0, 0, 0): nan vs -1.8154296875 q(1, 1, 1, 1), k(1, 1, 6, 1), dtype=float16"
)
MASKED_NAN_KEY = MASKED_NAN_VALUE.replace("into v", "into k")  # through a -inf bias
MASKED_NAN_BIAS = MASKED_NAN_VALUE.replace("into v", "into bias")
MASKED_ONE = MASKED_LARGE.replace("magnitude 1.41e+04", "magnitude 1")
# score-variance's V = I_2 (Ev = 2, E = 16) through Keras's fallback and through jax.nn's
# check (docs/matrix.md, 2026-12-02), and a failure of the statistic itself
KERAS_RESHAPE = (
    "kernel raised TypeError: cannot reshape array of shape (1, 1, 2000, 1, 2) (size 4000) "
    "into shape (1, 1, 2000, 16) (size 32000) q(1, 2000, 1, 16), k(1, 2000, 2, 16), "
    "v(1, 2000, 2, 2), dtype=float32, is_causal=False, scale=None"
)
KERAS_MASK_EXPANSION = (
    "kernel raised TypeError: add got incompatible shapes for broadcasting: (2, 2, 5, 6), "
    "(5, 1, 1, 6). q(2, 2, 5, 1), k(2, 2, 6, 1), v(2, 2, 6, 6), dtype=float32"
)
NNX_VALUE_SHAPE = (
    "kernel raised ValueError: value shape should be [1, 2000, 2, 16]: but got "
    "(1, 2000, 2, 2) q(1, 2000, 1, 16), k(1, 2000, 2, 16), v(1, 2000, 2, 2), dtype=float32"
)
SCORE_VARIANCE_OFF = (
    "sum of squared weight log-ratios / 2 = 8000 (in [7990, 8010] after the rounding slack "
    "that float32 and TOL-2 allow), but a kernel scaling by 1/sqrt(E) gives chi^2_2000"
)

# (kernel row, property, the clause the failure is listed under, evidence, linked?)
# batch-broadcast's findings (2026-12-02, attnspec check ... --only batch-broadcast)
EMPTY_BROADCAST = (
    "out (batch shapes q (1,), k (2,), v (1,)).shape=(1, 1, 0, 1), but should be (2, 1, 0, 1) "
    "q(1, 1, 0, 1), k(2, 1, 0, 1), v(1, 1, 0, 1), dtype=float16, is_causal=False, scale=None"
)
BROADCAST_CAUSAL_SCALE_ZERO = (
    "out (batch shapes q (2, 1), k (1, 1), v (2, 1))[(0, 0, 0, 0, 0)] = nan, but should be "
    "finite: 0.78125 within 0.0244 (TOL-2); 1024 of 1040 elements outside q(2, 1, 1, 65, 8), "
    "k(1, 1, 1, 65, 8), v(2, 1, 1, 65, 8), dtype=bfloat16, is_causal=True, scale=0.0"
)
BROADCAST_VALUE = (
    "out (batch shapes q (2, 2), k (1, 1), v (2, 1))[(0, 1, 0, 0, 0)] = 1.0, but should be 0.0 "
    "within 1.79e-07 (TOL-2); error 1 is 5.59e+06x the bound q(2, 2, 1, 1, 1), "
    "k(1, 1, 1, 1, 1), v(2, 1, 1, 1, 1), dtype=float32, is_causal=False, scale=None"
)
LINEN_BATCH = (
    "kernel raised AssertionError: q, k, v batch dims must match. q(2, 1, 2, 6, 8), "
    "k(1, 1, 2, 5, 8), v(1, 1, 2, 5, 8), dtype=float32, is_causal=False, scale=None"
)

PEAKED_FLOAT16 = (
    "out (peaked rows of 1025 keys)[(0, 0, 1, 3)] = 0.583984375, but should be 0.588283952976988 "
    "within 0.00305 (TOL-2); error 0.0043 is 1.41x the bound; 5 of 32 elements outside "
    "q(1, 1, 2, 16), k(1, 1, 1025, 16), v(1, 1, 1025, 16), dtype=float16, is_causal=False, "
    "scale=None"
)
PEAKED_BFLOAT16 = PEAKED_FLOAT16.replace("float16", "bfloat16")
BIASED_FLOAT16 = (
    "weights[(0, 0, 0, 2)] = 0.050811767578125, but should be 0.051082090896110724 within "
    "0.000203 (TOL-2); error 0.00027 is 1.33x the bound; 1 of 9 elements outside "
    "q(1, 1, 1, 6), k(1, 1, 9, 6), v(1, 1, 9, 1), dtype=float16, is_causal=False, scale=4.0, "
    "bias(1, 9)"
)
BIASED_FLOAT32 = BIASED_FLOAT16.replace("float16", "float32")
MASKED_OVERFLOW = (
    "out (one allowed key per row)[(0, 0, 5, 0)] = nan, but should be finite: -0.66748046875 "
    "within 15.2 (TOL-2); 8 of 128 elements outside q(1, 1, 16, 8), k(1, 1, 16, 8), "
    "v(1, 1, 16, 8), dtype=float16, is_causal=False, scale=None, mask(16, 16) (16/256 True), "
    "bias(1, 16, 16)"
)

NEGATIVE_SCALE = (
    "out(0, 0, 0, 0) = 0.0 lies outside [2.33203125, 2.33203125], the range of its V column over "
    "the allowed keys, by more than the TOL-2 bound 1.56 (275 of 2560 elements) [SDPA-7.1] "
    "q(1, 1, 16, 160), k(1, 1, 16, 160), v(1, 1, 16, 160), dtype=float16, is_causal=True, "
    "scale=-0.75"
)
NEGATIVE_SCALE_NAN = (
    "out[(0, 0, 0, 0)] = nan, but should be finite: 1.0 within 0.0313 (TOL-2); 32 of 32 "
    "elements outside q(1, 4, 1, 8), k(1, 2, 65, 8), v(1, 2, 65, 8), dtype=bfloat16, "
    "is_causal=True, scale=-0.75"
)
POSITIVE_SCALE_OFF = (
    "out[(0, 0, 0, 0)] = 0.9, but should be 1.0 within 0.0313 (TOL-2); 32 of 32 elements "
    "outside q(1, 4, 1, 8), k(1, 2, 65, 8), v(1, 2, 65, 8), dtype=bfloat16, is_causal=True, "
    "scale=0.5"
)

# ONNX Attention (docs/matrix.md, 2026-12-06): ONNX Runtime's refused scale, listed under
# the first clause it failed; the reference evaluator's negative-scale NaN and its padded
# (1,) mask; a positive scale's failure or a full-shape mask's is another cause
ONNX_RUNTIME_SCALE = (
    "kernel raised Fail: [ONNXRuntimeError] : 1 : FAIL : Exception during initialization: "
    "attention.cc:233 scale_ > 0 || std::isnan(scale_) was false. scale must be "
    "q(1, 1, 1, 1), k(1, 1, 1, 1), v(1, 1, 1, 2), dtype=float32, is_causal=False, scale=0.0"
)
ONNX_NEGATIVE_SCALE = (
    "out[(0, 0, 0, 0)] = nan, but should be finite: 1.0 within 0.00391 (TOL-2); 4 of 4 "
    "elements outside q(1, 4, 1, 1), k(1, 2, 1, 1), v(1, 2, 1, 1), dtype=float16, "
    "is_causal=True, scale=-0.75"
)
ONNX_POSITIVE_SCALE = ONNX_NEGATIVE_SCALE.replace("scale=-0.75", "scale=0.75")
ONNX_SHORT_MASK = (
    "out (broadcast mask) vs the full mask[(0, 0, 0, 0)] = 0.0, but should be 0.125 within "
    "0.00098 (TOL-2); error 0.125 is 128x the bound; 1 of 1 elements outside q(1, 1, 1, 1), "
    "k(1, 1, 8, 1), v(1, 1, 8, 1), dtype=float16, is_causal=False, scale=None, mask(1,)"
)
ONNX_EMPTY = (
    "kernel raised ValueError: zero-size array to reduction operation maximum which has no "
    "identity [call: 1 sequences (Lq, Lk) = [(1, 0)], Hq=1, Hkv=1, E=1, Ev=1, dtype=float16, "
    "is_causal=False, scale=None, cache_seqlens=[0], 0 new keys, capacity 0]"
)
ONNX_FULL_MASK = ONNX_SHORT_MASK.replace("(broadcast mask) vs the full mask", "")
# flash-linear-attention's naive forms (docs/matrix.md, 2026-12-06): the output's dtype, and
# naive_chunk_kda's length assertion; an error of the values is another cause
FLA_FLOAT32_OUT = (
    "the recurrent kernel's out has shape (1, 1, 1, 1), dtype torch.float32, but should have "
    "shape (1, 1, 1, 1) and dtype float16 (REC-1.1, REC-4.2, REC-4.3) [call: rule gated_delta, "
    "q (1, 1, 1, 1), k (1, 1, 1, 1), v (1, 1, 1, 1), g (1, 1, 1), beta (1, 1, 1) in float16 "
    "(state float32), g >= -0.0685]"
)
FLA_VALUE_OFF = (
    "out[(0, 0, 0, 0)] = 0.5, but should be 1.0 within 0.000977 (REC-1.2, REC-6.2); 1 of 1 "
    "elements outside [call: rule gated_delta, q (1, 1, 1, 1), k (1, 1, 1, 1), v (1, 1, 1, 1), "
    "g (1, 1, 1), beta (1, 1, 1) in float16 (state float32), g >= -0.0685]"
)
FLA_KDA_ASSERT = (
    "the recurrent kernel raised AssertionError: [call: rule gated_delta, q (1, 1, 1, 1), "
    "k (1, 1, 1, 1), v (1, 1, 1, 1), g (1, 1, 1, 1), beta (1, 1, 1) in float16 (state float32), "
    "g >= -0.0685]"
)
FLA_RECURRENT_GDN = "fla.ops.gated_delta_rule.naive:naive_recurrent_gated_delta_rule"
FLA_CHUNK_KDA = "fla.ops.kda.naive:naive_chunk_kda"
KERAS_NUMPY = "keras:dot_product_attention_numpy"
KERAS_JAX = "keras:dot_product_attention_jax"
KERAS_TORCH = "keras:dot_product_attention_torch"
LINEN = "flax.linen:dot_product_attention"
NNX = "flax.nnx:dot_product_attention"
JAX_NN = "jax.nn:dot_product_attention"
TORCH_SDPA = "torch.nn.functional:scaled_dot_product_attention"
SDPA_FLASH = "attnspec.conformance.kernels.torch_sdpa:sdpa_flash"
ONNX_REFERENCE = "onnx_attention:reference_attention_23"
ONNX_RUNTIME = "onnx_attention:runtime_attention_23"
ONNX_CACHE = "onnx_attention:reference_attention_kv_cache"

# (why the rows look alike: a parametrize table, one finding a row, each spelled out so the
# row a failure names is found by reading it)
CASES = [
    # keras numpy, float16 scores: the contiguous call's inaccuracy, before and after it is
    # reported as accuracy (SDPA-7.3); a float32 failure is another cause
    (KERAS_NUMPY, "layout-independence", "SDPA-1.7", FLOAT16_LAYOUT, True),
    (KERAS_NUMPY, "layout-independence", "SDPA-7.3", FLOAT16_LAYOUT, True),
    (KERAS_NUMPY, "layout-independence", "SDPA-1.7", FLOAT32_LAYOUT, False),
    (KERAS_NUMPY, "matches-reference", "SDPA-7.3", FLOAT16_LAYOUT, True),
    (KERAS_NUMPY, "gqa-mapping", "SDPA-6.1", GQA_RAISES, True),
    (KERAS_NUMPY, "gqa-mapping", "SDPA-6.1", FLOAT16_LAYOUT, False),
    (KERAS_NUMPY, "masked-nonfinite-ignored", "SDPA-8.2", GQA_RAISES, False),
    (KERAS_NUMPY, "causal-zeros", "SDPA-4.1", CAUSAL_MIN_BIAS, True),
    # a fully masked row (keras-empty-rows' cause) has no bias to show
    (KERAS_NUMPY, "causal-zeros", "SDPA-4.1", CAUSAL_MASK_ONLY, False),
    # flax.linen: float16 scores, met as matches-reference and mask-wins-over-bias (JAX arrays
    # have no layouts: layout-independence is not applicable there)
    (LINEN, "matches-reference", "SDPA-7.3", FLOAT16_LAYOUT, True),
    (LINEN, "mask-wins-over-bias", "SDPA-3.3", FLOAT16_LAYOUT, True),
    (LINEN, "mask-wins-over-bias", "SDPA-3.3", FLOAT32_LAYOUT, False),
    (LINEN, "matches-reference", "SDPA-7.3", FLOAT16_EMPTY_ROW, False),
    (KERAS_NUMPY, "matches-reference", "SDPA-7.3", FLOAT16_EMPTY_ROW, False),
    # jax.nn, and nnx and keras-on-jax through it: the fill above a finfo.min bias
    (JAX_NN, "causal-zeros", "SDPA-4.1", CAUSAL_MIN_BIAS, True),
    (JAX_NN, "causal-zeros", "SDPA-4.1", CAUSAL_MASK_ONLY, False),
    (JAX_NN, "causal-zeros", "SDPA-5.1", CAUSAL_MIN_BIAS, False),
    (JAX_NN, "gradients-match-reference", "BWD-17", GRADIENT_MIN_BIAS, True),
    (JAX_NN, "gradients-match-reference", "BWD-17", GRADIENT_NAN, False),
    (JAX_NN, "gradients-match-reference", "BWD-17", GRADIENT_TIMEOUT, False),
    (NNX, "causal-zeros", "SDPA-4.1", CAUSAL_MIN_BIAS, True),
    (KERAS_JAX, "causal-zeros", "SDPA-4.1", CAUSAL_MIN_BIAS, True),
    (KERAS_JAX, "masked-nonfinite-ignored", "SDPA-8.2", MASKED_NAN_VALUE, True),
    (KERAS_JAX, "masked-nonfinite-ignored", "SDPA-8.2", MASKED_NAN_KEY, True),
    (KERAS_JAX, "masked-nonfinite-ignored", "SDPA-8.2", MASKED_NAN_BIAS, False),
    # Ev != E: Keras-on-JAX's fallback and flax.nnx's jax.nn check, met by score-variance
    # too; a statistic out of its interval is another cause
    (KERAS_JAX, "score-variance", "SDPA-2.1", KERAS_RESHAPE, True),
    (KERAS_JAX, "value-head-dim", "SDPA-1.1", KERAS_MASK_EXPANSION, True),
    (KERAS_JAX, "score-variance", "SDPA-2.1", SCORE_VARIANCE_OFF, False),
    (NNX, "score-variance", "SDPA-2.1", NNX_VALUE_SHAPE, True),
    (NNX, "value-head-dim", "SDPA-1.1", NNX_VALUE_SHAPE, True),
    (NNX, "score-variance", "SDPA-2.1", SCORE_VARIANCE_OFF, False),
    # batch-broadcast: torch's empty-query shape, the flash path's causal scale 0 (SDPA's),
    # flax's refusal; a wrong value of a broadcast batch is another cause
    (TORCH_SDPA, "batch-broadcast", "SDPA-1.2", EMPTY_BROADCAST, True),
    (TORCH_SDPA, "batch-broadcast", "SDPA-1.2", BROADCAST_VALUE, False),
    (SDPA_FLASH, "batch-broadcast", "SDPA-1.2", BROADCAST_CAUSAL_SCALE_ZERO, True),
    (SDPA_FLASH, "batch-broadcast", "SDPA-1.2", BROADCAST_VALUE, False),
    (LINEN, "batch-broadcast", "SDPA-1.2", LINEN_BATCH, True),
    (NNX, "batch-broadcast", "SDPA-1.2", BROADCAST_VALUE, False),
    # keras numpy: float16 P V on long peaked rows; the same failure in float32 is another cause
    (KERAS_NUMPY, "long-peaked-rows", "SDPA-7.3", PEAKED_FLOAT16, True),
    (KERAS_NUMPY, "long-peaked-rows", "SDPA-7.3", PEAKED_BFLOAT16, False),
    # keras numpy's float16 scores met by bias-semantics and (a masked key's overflow) by
    # mask-polarity; the same findings in float32 are another cause
    (KERAS_NUMPY, "bias-semantics", "SDPA-3.2", BIASED_FLOAT16, True),
    (KERAS_NUMPY, "bias-semantics", "SDPA-3.2", BIASED_FLOAT32, False),
    (KERAS_NUMPY, "mask-polarity", "SDPA-3.1", MASKED_OVERFLOW, True),
    # keras torch: SDPA's causal rows with a negative scale (0 in float16, NaN in bfloat16)
    (KERAS_TORCH, "output-in-value-hull", "SDPA-7.1", NEGATIVE_SCALE, True),
    (KERAS_TORCH, "gqa-mapping", "SDPA-6.1", NEGATIVE_SCALE_NAN, True),
    (KERAS_TORCH, "gqa-mapping", "SDPA-6.1", POSITIVE_SCALE_OFF, False),
    # keras torch: the additive fill of a boolean mask
    (KERAS_TORCH, "masked-values-ignored", "SDPA-8.1", MASKED_LARGE, True),
    (KERAS_TORCH, "masked-values-ignored", "SDPA-8.1", MASKED_ONE, False),
    (ONNX_RUNTIME, "matches-reference", "SDPA-1.1", ONNX_RUNTIME_SCALE, True),
    (ONNX_RUNTIME, "gqa-mapping", "SDPA-6.1", ONNX_POSITIVE_SCALE, False),
    (ONNX_REFERENCE, "gqa-mapping", "SDPA-6.1", ONNX_NEGATIVE_SCALE, True),
    (ONNX_REFERENCE, "gqa-mapping", "SDPA-6.1", ONNX_POSITIVE_SCALE, False),
    (ONNX_REFERENCE, "mask-broadcast", "SDPA-3.1", ONNX_SHORT_MASK, True),
    (ONNX_REFERENCE, "mask-broadcast", "SDPA-3.1", ONNX_FULL_MASK, False),
    (ONNX_CACHE, "kv-cache-stale-positions", "KVCACHE-2", ONNX_EMPTY, True),
    (ONNX_CACHE, "kv-cache-nan-past-length", "KVCACHE-2", ONNX_EMPTY, True),
    (FLA_RECURRENT_GDN, "recurrent-matches-reference", "REC-6.2", FLA_FLOAT32_OUT, True),
    (FLA_RECURRENT_GDN, "recurrent-decode", "REC-2.2", FLA_FLOAT32_OUT, True),
    (FLA_RECURRENT_GDN, "recurrent-matches-reference", "REC-6.2", FLA_VALUE_OFF, False),
    (FLA_CHUNK_KDA, "recurrent-chunk-size", "REC-5.1", FLA_KDA_ASSERT, True),
    (FLA_CHUNK_KDA, "recurrent-chunk-size", "REC-5.1", FLA_VALUE_OFF, False),
]


def _row(name: str) -> dict[str, str]:
    adapter = f"attnspec.conformance.kernels.adapters.{name}"
    [entry] = [e for e in KNOWN_KERNELS if e.name in (name, adapter)]
    return write_ups(entry)


@pytest.mark.parametrize(("kernel", "prop", "clause", "evidence", "linked"), CASES)
def test_a_write_up_links_the_failure_it_describes_and_no_other(
    kernel: str, prop: str, clause: str, evidence: str, linked: bool
) -> None:
    link = _row(kernel)[prop]
    own = all_properties()[prop].clause
    assert confirms(link, own, clause, evidence) is linked, (kernel, prop, link, evidence)


def test_every_filed_write_up_has_its_anchor() -> None:
    """Each write-up known_kernels files (under any kernel and property) points at an
    anchor docs/divergences.md has, so a confirmed failure never links a missing entry."""
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', (ROOT / "docs/divergences.md").read_text()))
    links = {link for entries in _DIVERGENCES.values() for link in entries.values()}
    missing = sorted(link for link in links if link.split("#")[1].split()[0] not in anchors)
    assert not missing, missing
