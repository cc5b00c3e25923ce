"""``jax.nn.dot_product_attention`` in the spec's convention: JAX's (B, T, N, H) layout
(``layouts.from_blhd``) and E == Ev (``layouts.pad_head_dims``, exact zero columns), on its
portable XLA implementation (``implementation="xla"``; "cudnn" needs a GPU).

Declared: an additive ``bias`` and a boolean ``mask`` (True = attend) in separate
arguments, ``is_causal`` (top-left, combinable with the mask), ``scale``, GQA by head
counts, one batch dim (JAX takes (B, T, N, H) or (T, N, H)).  SDPA-5.1 is waived: a fully
masked row gives mean(V), confirmed in docs/divergences.md#jax-empty-rows.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Literal

from ...call.layouts import from_blhd, pad_head_dims
from ...claims.declaration import declare
from ..convention import convention


def _as_4d(x: Any) -> Any:
    return None if x is None else x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))


def _on(implementation: Literal["xla", "cudnn"], name: str) -> Callable[..., Any]:
    """``jax.nn.dot_product_attention`` on ``implementation``, as the kernel ``name`` (bound
    under that name here: reports and worker processes load it by name)."""

    @convention(
        optional={"bias": None, "mask": None},
        keywords={"scale": None, "is_causal": False},
        name=name,
    )
    def kernel(call: SimpleNamespace) -> Any:
        import jax

        # JAX wants 4-d masks and biases with 4-d inputs; prepending 1s is plain broadcasting
        q, bias, mask = call.q, call.bias, call.mask
        four = q.ndim == 4
        return jax.nn.dot_product_attention(
            q,
            call.k,
            call.v,
            bias=_as_4d(bias) if four else bias,
            mask=_as_4d(mask) if four else mask,
            scale=call.scale,
            is_causal=call.is_causal,
            implementation=implementation,
        )

    return kernel


_xla = _on("xla", "_xla")
_cudnn = _on("cudnn", "_cudnn")

JAX_NN = {
    "bias": True,
    "gqa": True,
    "batch_ndim": 1,
    "equal_head_dims": True,
    "empty_rows_zero": False,
}
dot_product_attention = from_blhd(pad_head_dims(declare(_xla, **JAX_NN)))
dot_product_attention.__name__ = dot_product_attention.__qualname__ = "dot_product_attention"
# cuDNN (GPU only): half precision only
dot_product_attention_cudnn = from_blhd(
    pad_head_dims(declare(_cudnn, **JAX_NN, dtypes=("float16", "bfloat16")))
)
dot_product_attention_cudnn.__name__ = "dot_product_attention_cudnn"
dot_product_attention_cudnn.__qualname__ = "dot_product_attention_cudnn"
