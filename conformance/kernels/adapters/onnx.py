"""ONNX's ``LinearAttention`` (ai.onnx, opset 27; spec/recurrent.md, section 7) run by the
onnx package's reference evaluator, in the spec's convention.

The adapter packs the heads-first arrays into ONNX's ``(B, T, H * d)`` layout, builds a
one-node model for the update rule (``q_num_heads``, ``kv_num_heads``; ``decay`` per head;
``beta`` per head), runs ``onnx.reference.ReferenceEvaluator`` and unpacks the output.  An
absent past state is passed as zeros in float32: ONNX returns ``present_state`` in the past
state's dtype, or in the query's when none is given (a float16 state, REC-4.3), which this
convention sidesteps and the matrix note records.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ...claims.declaration import declare
from ...claims.family_claims import RecurrentClaim


def _packed(a: np.ndarray) -> np.ndarray:
    """(B, H, T, d) -> (B, T, H * d)."""
    b, h, t, d = a.shape
    return np.ascontiguousarray(np.moveaxis(a, 1, 2).reshape(b, t, h * d))


@functools.lru_cache(maxsize=64)
def _evaluator(rule: str, q_heads: int, kv_heads: int, names: tuple[str, ...], dtype: str) -> Any:
    import onnx
    from onnx.reference import ReferenceEvaluator

    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    float32 = onnx.TensorProto.FLOAT
    node = onnx.helper.make_node(
        "LinearAttention",
        list(names),
        ["output", "present_state"],
        q_num_heads=q_heads,
        kv_num_heads=kv_heads,
        update_rule=rule,
    )
    inputs = [
        onnx.helper.make_tensor_value_info(n, float32 if n == "past_state" else elem, None)
        for n in names
        if n
    ]
    outputs = [
        onnx.helper.make_tensor_value_info("output", elem, None),
        onnx.helper.make_tensor_value_info("present_state", float32, None),
    ]
    graph = onnx.helper.make_graph([node], "linear_attention", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 27)])
    return ReferenceEvaluator(model)


def _run(
    rule: str, q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any
) -> tuple[Any, Any]:
    q, k, v = (np.asarray(a) for a in (q, k, v))
    b, q_heads, t, _ = q.shape
    kv_heads, d_k, d_v = k.shape[1], k.shape[-1], v.shape[-1]
    state = (
        np.zeros((b, kv_heads, d_k, d_v), np.float32)
        if initial_state is None
        else np.asarray(initial_state)
    )
    feeds = {"query": _packed(q), "key": _packed(k), "value": _packed(v), "past_state": state}
    names = ["query", "key", "value", "past_state", "", ""]
    if g is not None:
        feeds["decay"] = _packed(np.asarray(g)[..., None])
        names[4] = "decay"
    if beta is not None:
        feeds["beta"] = _packed(np.asarray(beta)[..., None])
        names[5] = "beta"
    while names[-1] == "":
        names.pop()
    evaluator = _evaluator(rule, q_heads, kv_heads, tuple(names), str(q.dtype))
    out, present = evaluator.run(None, feeds)
    return np.moveaxis(out.reshape(b, t, q_heads, d_v), 1, 2), present


@declare(
    recurrent=RecurrentClaim("gated_delta", chunk_size=1), gqa=True, dtypes=("float16", "float32")
)
def gated_delta(
    q: Any, k: Any, v: Any, *, g: Any = None, beta: Any = None, initial_state: Any = None
) -> tuple[Any, Any]:
    """ONNX LinearAttention, update_rule "gated_delta", per-head decay, GQA."""
    return _run("gated_delta", q, k, v, g, beta, initial_state)
