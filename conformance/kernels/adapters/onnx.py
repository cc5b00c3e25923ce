"""ONNX's ``LinearAttention`` (spec/recurrent.md, section 7) as functions in the operator's
own convention, and their declarations.

``reference_linear_attention`` builds a one-node model of the default domain's operator
(opset 27) and runs the onnx package's ``onnx.reference.ReferenceEvaluator``;
``runtime_linear_attention`` runs ONNX Runtime's CPU kernel of the operator, the
``com.microsoft`` contrib op (ONNX Runtime implements opset 27's only by inlining its
function body, which needs static shapes).  Both take the operator's inputs, ``(B, T, H *
d)`` arrays, ``past_state``, ``decay`` and ``beta``, its attributes ``q_num_heads``,
``kv_num_heads`` and ``chunk_size`` as keywords, and return ``(output, present_state)``; the
suite calls them through its ``packed`` layout with ``g`` and ``initial_state`` renamed, a
declaration and no wrapper of their own.  An absent past state is passed as float32 zeros:
ONNX returns ``present_state`` in the past state's dtype, or in the query's when none is
given (a float16 state, REC-4.3), which this sidesteps and the matrix note records.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...call.layouts import from_packed, rename_arguments
from ...claims.family_claims import RecurrentClaim
from ..convention import REQUIRED, convention

Runner = Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]]
INPUTS = ("query", "key", "value", "past_state", "decay", "beta")


def _model(
    domain: str, rule: str, attributes: tuple[tuple[str, int], ...], names: tuple[str, ...]
) -> Any:
    """A one-node model of ``LinearAttention`` (``domain``'s) with float32 past and present
    states and inputs of whatever type the feeds have."""
    import onnx

    helper = onnx.helper
    node = helper.make_node(
        "LinearAttention",
        list(names),
        ["output", "present_state"],
        domain=domain,
        update_rule=rule,
        **dict(attributes),
    )
    inputs = [
        helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in names if n
    ]
    outputs = [
        helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
        for n in ("output", "present_state")
    ]
    graph = helper.make_graph([node], "linear_attention", inputs, outputs)
    opsets = [helper.make_opsetid("", 27)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def _typed(model: Any, feeds: dict[str, np.ndarray]) -> Any:
    """``model`` with its inputs typed as the feeds and its outputs as ONNX says: the output
    in the query's type, the present state in the (float32) past state's."""
    import onnx

    def tensor_type(name: str) -> int:
        return int(onnx.helper.np_dtype_to_tensor_dtype(feeds[name].dtype))

    for value in model.graph.input:
        value.type.tensor_type.elem_type = tensor_type(value.name)
    model.graph.output[0].type.tensor_type.elem_type = tensor_type("query")
    model.graph.output[1].type.tensor_type.elem_type = tensor_type("past_state")
    return model


@functools.lru_cache(maxsize=64)
def _reference_runner(key: tuple[Any, ...]) -> Runner:
    from onnx.reference import ReferenceEvaluator

    rule, attributes, names, feed_types = key
    feeds = {n: np.zeros(0, t) for n, t in feed_types}
    evaluator = ReferenceEvaluator(_typed(_model("", rule, attributes, names), feeds))
    return evaluator.run  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=64)
def _runtime_runner(key: tuple[Any, ...]) -> Runner:
    import onnxruntime

    rule, attributes, names, feed_types = key
    feeds = {n: np.zeros(0, t) for n, t in feed_types}
    model = _typed(_model("com.microsoft", rule, attributes, names), feeds)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run  # type: ignore[no-any-return]


def _run(
    runner: Callable[[tuple[Any, ...]], Runner],
    rule: str,
    arrays: dict[str, Any],
    attributes: dict[str, int],
) -> tuple[np.ndarray, np.ndarray]:
    feeds = {n: np.asarray(a) for n, a in arrays.items() if a is not None}
    if "past_state" not in feeds:
        b, _, width = feeds["key"].shape
        heads = attributes["kv_num_heads"]
        d_v = feeds["value"].shape[-1] // heads
        feeds["past_state"] = np.zeros((b, heads, width // heads, d_v), np.float32)
    names = [n if n in feeds else "" for n in INPUTS]
    while names[-1] == "":
        names.pop()
    key = (
        rule,
        tuple(sorted(attributes.items())),
        tuple(names),
        tuple((n, feeds[n].dtype.str) for n in names if n),
    )
    out, present = runner(key)(None, feeds)
    return out, present


def _operator(runner: Callable[[tuple[Any, ...]], Runner], name: str) -> Callable[..., Any]:
    """``LinearAttention`` (``gated_delta``) in the operator's convention, run by ``runner``."""

    @convention(
        ("query", "key", "value"),
        optional={"past_state": None, "decay": None, "beta": None},
        keywords={"q_num_heads": REQUIRED, "kv_num_heads": REQUIRED, "chunk_size": 64},
        name=name,
    )
    def linear_attention(call: SimpleNamespace) -> tuple[np.ndarray, np.ndarray]:
        names = ("query", "key", "value", "past_state", "decay", "beta")
        arrays = {n: getattr(call, n) for n in names}
        attributes = {n: getattr(call, n) for n in ("q_num_heads", "kv_num_heads", "chunk_size")}
        return _run(runner, "gated_delta", arrays, attributes)

    return linear_attention


# ONNX LinearAttention (opset 27) by the onnx reference evaluator, and ONNX Runtime's CPU
# LinearAttention (com.microsoft).
reference_linear_attention = _operator(_reference_runner, "reference_linear_attention")
runtime_linear_attention = _operator(_runtime_runner, "runtime_linear_attention")


def _declared(fn: Callable[..., Any], gate: str, chunk_size: int) -> Callable[..., Any]:
    """``fn`` in the spec's convention by the suite's own layout and renames (what
    ``--layout packed --rename g=decay --rename initial_state=past_state`` does)."""
    claim = RecurrentClaim("gated_delta", gate, chunk_size, chunk_sizes=(16, 64))
    renamed = rename_arguments(fn, g="decay", initial_state="past_state")
    return from_packed(renamed, recurrent=claim, gqa=True, dtypes=("float16", "float32"))


# The matrix rows (module-level, so that a check's worker loads them by name).  The
# reference evaluator runs the recurrence token by token (C_h = 1); ONNX Runtime's CPU
# kernel is declared with its chunk_size attribute's default, 64.
gated_delta = _declared(reference_linear_attention, "head", 1)
gated_delta_per_channel = _declared(reference_linear_attention, "channel", 1)
runtime_gated_delta = _declared(runtime_linear_attention, "head", 64)
runtime_gated_delta_per_channel = _declared(runtime_linear_attention, "channel", 64)
