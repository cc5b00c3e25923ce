"""ONNX's LinearAttention (ai.onnx opset 27) through the onnx package's reference evaluator
agrees with spec/recurrent.md: its outputs and present state lie within REC-6.2's bound of the
float64 definition, with its packed layout unpacked, for the four rules, per-head and
per-key-channel decays, query head groups and a past state (section 7's ONNX column).

onnx is not a dependency of attnspec (its wheel and protobuf's are tens of MB); the test
skips, saying so, where it is not installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from recurrent_problems import recurrent_problem

from attnspec.reference.recurrent.tolerance import recurrent_error_bound

onnx = pytest.importorskip("onnx", reason="onnx (>= 1.22, opset 27) is not installed here")
reference_evaluator = pytest.importorskip(
    "onnx.reference", reason="onnx has no reference evaluator"
)


def _packed(a: np.ndarray) -> np.ndarray:
    """(B, H, T, d) -> ONNX's (B, T, H * d)."""
    b, h, t, d = a.shape
    return np.ascontiguousarray(np.moveaxis(a, 1, 2).reshape(b, t, h * d)).astype(np.float32)


def _onnx_run(
    problem: dict[str, Any], q_heads: int, kv_heads: int
) -> tuple[np.ndarray, np.ndarray]:
    helper, proto = onnx.helper, onnx.TensorProto
    feeds = {
        "query": _packed(problem["q"]),
        "key": _packed(problem["k"]),
        "value": _packed(problem["v"]),
        "past_state": problem["initial_state"].astype(np.float32),
    }
    if "g" in problem:
        g = problem["g"]
        feeds["decay"] = _packed(g if g.ndim == 4 else g[..., None])
    if "beta" in problem:
        feeds["beta"] = _packed(problem["beta"][..., None])
    names = [
        "query",
        "key",
        "value",
        "past_state",
        "decay" if "g" in problem else "",
        "beta" if "beta" in problem else "",
    ]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(
        "LinearAttention",
        names,
        ["output", "present_state"],
        q_num_heads=q_heads,
        kv_num_heads=kv_heads,
        update_rule=problem["rule"],
    )
    inputs = [
        helper.make_tensor_value_info(n, proto.FLOAT, list(a.shape)) for n, a in feeds.items()
    ]
    outputs = [
        helper.make_tensor_value_info(n, proto.FLOAT, None) for n in ("output", "present_state")
    ]
    graph = helper.make_graph([node], "linear_attention", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    out, state = reference_evaluator.ReferenceEvaluator(model).run(None, feeds)
    b, t = out.shape[:2]
    return np.moveaxis(out.reshape(b, t, q_heads, -1), 1, 2), state


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_onnx_reference_evaluator_is_within_the_bound(rule: str, per_channel: bool) -> None:
    """REC-1.2, REC-1.3, REC-3.1, REC-6.2: ONNX's evaluator (float32 throughout) on GQA 4:2
    with a past state gives the definition within the bound, element by element."""
    if per_channel and rule in ("linear", "delta"):
        pytest.skip("the ungated rules take no decay")
    rng = np.random.default_rng(len(rule) + per_channel)
    problem = recurrent_problem(
        rng, rule=rule, length=70, d_k=16, d_v=8, heads=(4, 2, 2), per_channel=per_channel
    )
    exact = {
        n: (a.astype(np.float32).astype(np.float64) if isinstance(a, np.ndarray) else a)
        for n, a in problem.items()
    }
    out, state = _onnx_run(problem, 4, 2)
    bound = recurrent_error_bound(**exact, dtype="float32")
    assert np.all(np.abs(out - bound.out) <= bound.out_tolerance)
    assert np.all(np.abs(state - bound.final_state) <= bound.final_state_tolerance)


@pytest.mark.parametrize(
    "name",
    [
        "gated_delta",
        "gated_delta_per_channel",
        "runtime_gated_delta",
        "runtime_gated_delta_per_channel",
    ],
)
def test_the_onnx_adapters_conform(name: str) -> None:
    """REC-2.2, REC-5.1, REC-6.2: the known kernels of ``adapters.onnx`` (ONNX
    LinearAttention through its reference evaluator and through ONNX Runtime's CPU kernel,
    per-head and per-key-channel decay; matrix rows), called in the operator's own
    convention through the suite's packed layout, pass every recurrence property that
    applies in the quick profile, float16 and float32: one call, a split run, decode steps
    and the chunk_size attribute at 16 and 64."""
    from attnspec.conformance import check
    from attnspec.conformance.kernels.adapters import onnx as adapters

    if name.startswith("runtime"):
        pytest.importorskip("onnxruntime", reason="onnxruntime is not installed here")
    report = check(getattr(adapters, name), backend="numpy", profile="quick", seed=0)
    statuses = {v.property: v.status for v in report.verdicts if v.property.startswith("rec")}
    # The operator takes no packed sequences and has no backward pass; REC-1.3's equal
    # per-channel gates apply only to the per-channel operator.
    not_applicable = {"recurrent-varlen"} | {p for p in statuses if "gradients" in p}
    if not name.endswith("per_channel"):
        not_applicable.add("recurrent-equal-channel-gates")
    assert {p for p, s in statuses.items() if s == "not applicable"} == not_applicable, statuses
    assert {s for p, s in statuses.items() if p not in not_applicable} == {"passed"}, statuses
