"""Keras's dot_product_attention on the inputs of docs/divergences.md#keras, as JSON.

Run as a script with KERAS_BACKEND set (Keras picks its backend once, at import); used by
tests/conformance/test_adapters.py to pin the upstream behaviour.  Each input is (B, T, N, H).
"""

import json
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

BACKEND = keras.backend.backend()


def arr(x: Any, dtype: str = "float32") -> Any:
    a = np.asarray(x, dtype=dtype)
    if BACKEND == "torch":
        import torch

        return torch.from_numpy(a)
    return a


def attention(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    out = keras.ops.dot_product_attention(q, k, v, **kwargs)
    return np.asarray(keras.ops.convert_to_numpy(out), dtype=np.float64).round(6).tolist()


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # the behaviour pinned is the exception's type
        return type(exc).__name__


one, v2 = arr(np.full((1, 1, 1, 1), 0.5)), arr([[[[2.0]], [[4.0]]]])
k2 = arr([[[[0.5]], [[1.0]]]])
q4, q1, kv2 = arr(np.ones((1, 1, 4, 1))), arr(np.ones((1, 1, 1, 1))), arr(np.ones((1, 1, 2, 1)))
q16 = arr([[[[1000.0]]]], "float16")
k16, v16 = arr([[[[1000.0]], [[-1000.0]]]], "float16"), arr([[[[1.0]], [[2.0]]]], "float16")
qc, vc = arr(np.ones((1, 3, 1, 2))), arr(np.arange(6.0).reshape(1, 3, 1, 2))
# key 1 is in the future of query 0 and both keys carry a float32 finfo.min padding bias
min_bias = arr(np.full((1, 1, 1, 2), np.finfo(np.float32).min))
k_pm = arr([[[[1.0]], [[-1.0]]]])
# key 1 masked out, its float16 score 5e4 (finite in float32, SDPA-8.1's precondition)
q16_1, k16_masked = arr([[[[1.0]]]], "float16"), arr([[[[0.5]], [[5.0e4]]]], "float16")
v16_12 = arr([[[[1.0]], [[2.0]]]], "float16")
# float16 scores 3 * 21.34375 = 64.03125 (rounds to 64 in float16) and 3 * 21.3125
q16_3, k16_round = arr([[[[3.0]]]], "float16"), arr([[[[21.34375]], [[21.3125]]]], "float16")
v16_01 = arr([[[[0.0]], [[1.0]]]], "float16")
key_0_masked, key_1_masked = arr([[[[False, True]]]], "bool"), arr([[[[True, False]]]], "bool")
key_0_excluded = arr([[[[-np.inf, 0.0]]]])  # by a -inf bias, not the mask
q_e2, k_e2, v_e3 = (
    arr(np.ones((1, 1, 1, 2))),
    arr(np.ones((1, 2, 1, 2))),
    arr(np.ones((1, 2, 1, 3))),
)
print(
    json.dumps(
        {
            "fully_masked": outcome(
                lambda: attention(one, k2, v2, mask=arr(np.zeros((1, 1, 1, 2)), "bool"))
            ),
            "nan_query": outcome(lambda: attention(arr([[[[np.nan]]]]), k2, v2)),
            "gqa_4_over_2": outcome(lambda: attention(q4, kv2, kv2)),
            "gqa_1_over_2": outcome(lambda: attention(q1, kv2, kv2)),
            "float16_scores_1e6": outcome(lambda: attention(q16, k16, v16)),
            "mask_1d": outcome(lambda: attention(one, k2, v2, mask=arr([True, False], "bool"))),
            "causal_scale_0": outcome(lambda: attention(qc, qc, vc, is_causal=True, scale=0.0)),
            "causal_min_bias": outcome(
                lambda: attention(q1, k_pm, v2, bias=min_bias, is_causal=True)
            ),
            "masked_score_5e4_float16": outcome(
                lambda: attention(q16_1, k16_masked, v16_12, mask=key_1_masked)
            ),
            "float16_score_rounding": outcome(lambda: attention(q16_3, k16_round, v16_01)),
            "masked_nan_value": outcome(
                lambda: attention(one, k2, arr([[[[np.nan]], [[4.0]]]]), mask=key_0_masked)
            ),
            "bias_excluded_nan_key": outcome(
                lambda: attention(one, arr([[[[np.nan]], [[1.0]]]]), v2, bias=key_0_excluded)
            ),
            "value_dim_3_head_dim_2": outcome(lambda: attention(q_e2, k_e2, v_e3)),
            "value_dim_3_no_queries_shape": outcome(
                lambda: list(keras.ops.dot_product_attention(q_e2[:, :0], k_e2, v_e3).shape)
            ),
        }
    )
)
