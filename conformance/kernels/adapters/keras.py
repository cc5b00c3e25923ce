"""``keras.ops.dot_product_attention`` on each Keras backend, in the spec's convention
((B, T, N, H) layout via ``layouts.from_blhd``).

Keras picks its backend once per process, from ``KERAS_BACKEND`` when it is first
imported; ``dot_product_attention_jax`` / ``_torch`` / ``_numpy`` set it (and fail with a
clear message if Keras was already imported with another), so check each in its own
process (``attnspec check`` and ``attnspec matrix`` do: every check runs in a worker).

Declared: an additive bias or a boolean mask (True = attend) in one argument, as
PyTorch's ``attn_mask`` (Keras refuses both at once), ``is_causal``,
``scale``, GQA by head counts, one batch dim (Keras takes 4-d inputs); the dtypes of its
default floatx (float64 inputs are computed and returned as float32, see
docs/divergences.md#keras-float64); no empty lengths on the numpy backend.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ...call.layouts import from_blhd
from ...claims.declaration import declare
from ..convention import convention

FLOATX_DTYPES = ("float16", "bfloat16", "float32")


def _keras_on(backend: str) -> Any:
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = backend
    import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(
            f"keras was imported with backend {keras.backend.backend()!r} in "
            f"this process, so its {backend} backend cannot be checked here; "
            f"run with KERAS_BACKEND={backend}"
        )
    return keras


def _on(backend: str) -> Callable[..., Any]:
    @convention(optional={"mask": None, "scale": None, "is_causal": False})
    def kernel(call: SimpleNamespace) -> Any:
        keras = _keras_on(backend)
        # Keras refuses a mask and a bias together ("Only one of `bias` and `mask` can be
        # provided"): they travel in one argument, as PyTorch's attn_mask, a bool a mask,
        # a float a bias
        mask = call.mask
        is_bias = mask is not None and "bool" not in str(mask.dtype)
        return keras.ops.dot_product_attention(
            call.q,
            call.k,
            call.v,
            bias=mask if is_bias else None,
            mask=None if is_bias else mask,
            scale=call.scale,
            is_causal=call.is_causal,
        )

    # Keras computes in its floatx (float32): float64 inputs come back float32, so float64 is
    # outside what it supports; the numpy backend also rejects empty lengths
    limits = {"dtypes": FLOATX_DTYPES, **({"empty_sizes": False} if backend == "numpy" else {})}
    adapted = from_blhd(
        declare(kernel, bias=True, bias_keyword="mask", gqa=True, batch_ndim=1, **limits)
    )
    adapted.__name__ = adapted.__qualname__ = f"dot_product_attention_{backend}"
    return adapted


dot_product_attention_jax = _on("jax")
dot_product_attention_torch = _on("torch")
dot_product_attention_numpy = _on("numpy")
