"""ONNX's standard ``Attention`` operator (opset 23 and 24) as functions in the spec's
convention, and their declarations.

The operator's 4-D form is the spec's layout: ``Q`` (B, H_q, L_q, E), ``K`` (B, H_kv, L_k, E),
``V`` (B, H_kv, L_k, E_v), GQA by the head counts.  One ``attn_mask`` input is a boolean mask
(True = attend) or a float bias added to the scores, as PyTorch's ``attn_mask``; the
attributes ``is_causal``, ``scale`` and ``softcap`` are passed as keywords.  Each call builds
(once per opset, inputs, dtypes and attributes; cached) a one-node model and runs it with the
onnx package's ``onnx.reference.ReferenceEvaluator`` or ONNX Runtime's CPU provider.

Causal alignment: the operator aligns ``is_causal`` to the keys that precede the query
block, ``past_key``'s length or ``nonpad_kv_seqlen - L_q`` (onnx PR #8068, onnx 1.23's
text); without a cache that offset is 0, so a plain call is top-left (SDPA-4.1) and is
declared so.  The ``kv_cache`` functions give opset 24's external cache, ``K`` and ``V``
the whole cache and ``nonpad_kv_seqlen`` its valid lengths, which is the suite's KV-cache
convention without appending (KVCACHE-1, KVCACHE-2: bottom-right over the valid keys).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...claims.declaration import declare
from ..convention import REQUIRED, convention

Runner = Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]]
INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
Key = tuple[int, tuple[tuple[str, str], ...], tuple[tuple[str, Any], ...]]


def _model(key: Key) -> Any:
    """A one-node ``Attention`` model of opset ``key[0]`` with the inputs and dtypes of
    ``key[1]`` (absent optional inputs as empty names) and the attributes of ``key[2]``."""
    import onnx

    opset, feeds, attributes = key
    helper = onnx.helper
    present = dict(feeds)
    names = [n if n in present else "" for n in INPUTS]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Attention", names, ["Y"], **dict(attributes))

    def typed(name: str, dtype: str) -> Any:
        element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        return helper.make_tensor_value_info(name, element, None)

    inputs = [typed(n, present[n]) for n in names if n]
    graph = helper.make_graph([node], "attention", inputs, [typed("Y", present["Q"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@functools.lru_cache(maxsize=64)
def _reference_runner(key: Key) -> Runner:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(_model(key)).run  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=64)
def _runtime_runner(key: Key) -> Runner:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # a refused attribute raises; its log line is noise
    session = onnxruntime.InferenceSession(
        _model(key).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run  # type: ignore[no-any-return]


def run_attention(
    runner: Callable[[Key], Runner],
    opset: int,
    arrays: dict[str, Any],
    attributes: dict[str, Any],
) -> np.ndarray:
    """``Attention``'s output ``Y`` for the given inputs (None: absent) and attributes."""
    feeds = {n: np.ascontiguousarray(a) for n, a in arrays.items() if a is not None}
    key = (
        opset,
        tuple((n, feeds[n].dtype.str) for n in INPUTS if n in feeds),
        tuple(sorted((n, a) for n, a in attributes.items() if a is not None)),
    )
    return runner(key)(None, feeds)[0]


# the operator's attributes, keywords of the functions, and their defaults
_ATTRIBUTES = {"is_causal": False, "scale": None, "softcap": None}


def _attributes(call: SimpleNamespace) -> dict[str, Any]:
    return {
        "is_causal": int(bool(call.is_causal)),
        "scale": None if call.scale is None else float(call.scale),
        "softcap": float(call.softcap) if call.softcap else None,
    }


def _dense(runner: Callable[[Key], Runner], opset: int, name: str) -> Callable[..., Any]:
    """``Attention`` of ``opset`` on a plain call (no cache), run by ``runner``."""

    @convention(optional={"attn_mask": None}, keywords=_ATTRIBUTES, name=name)
    def attention(call: SimpleNamespace) -> np.ndarray:
        arrays = {"Q": call.q, "K": call.k, "V": call.v, "attn_mask": call.attn_mask}
        return run_attention(runner, opset, arrays, _attributes(call))

    return attention


def _external_cache(runner: Callable[[Key], Runner], name: str) -> Callable[..., Any]:
    """Opset 24's ``Attention`` over an external cache: ``K``/``V`` the cache, its valid
    lengths ``nonpad_kv_seqlen`` (int64), run by ``runner``."""

    @convention(
        ("q", "k_cache", "v_cache"),
        keywords={"cache_seqlens": REQUIRED, **_ATTRIBUTES},
        name=name,
    )
    def attention(call: SimpleNamespace) -> np.ndarray:
        lengths = np.asarray(call.cache_seqlens).astype(np.int64)
        arrays = {"Q": call.q, "K": call.k_cache, "V": call.v_cache, "nonpad_kv_seqlen": lengths}
        return run_attention(runner, 24, arrays, _attributes(call))

    return attention


# What the operator documents: one attn_mask argument, boolean (True = attend) or an
# additive float bias; is_causal composed with it; GQA by head counts; a logit softcap
# after scaling and before the mask (onnx's text: "softcap (if provided)" then "Add");
# 4-D inputs only (one batch dim); a fully masked row gives zeros (onnx 1.23's errata).
ATTENTION = {
    "mask_keyword": "attn_mask",
    "bias": True,
    "bias_keyword": "attn_mask",
    "gqa": True,
    "softcap": True,
    "batch_ndim": 1,
    "dtypes": ("float16", "float32"),
}


def _declared_dense(runner: Callable[[Key], Runner], opset: int, name: str) -> Any:
    return declare(_dense(runner, opset, name), **ATTENTION)


def _declared_cache(runner: Callable[[Key], Runner], name: str) -> Any:
    claims = {"kv_cache": True, "kv_cache_append": False, "gqa": True, "softcap": True}
    return declare(_external_cache(runner, name), **claims, dtypes=ATTENTION["dtypes"])


# The matrix rows (module-level, so that a check's worker loads them by name).
reference_attention_23 = _declared_dense(_reference_runner, 23, "reference_attention_23")
runtime_attention_23 = _declared_dense(_runtime_runner, 23, "runtime_attention_23")
reference_attention_kv_cache = _declared_cache(_reference_runner, "reference_attention_kv_cache")
runtime_attention_kv_cache = _declared_cache(_runtime_runner, "runtime_attention_kv_cache")
