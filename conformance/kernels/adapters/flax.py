"""Flax's ``dot_product_attention`` (``flax.nnx`` and ``flax.linen``) in the spec's
convention: Flax's (..., L, H, E) layout (``layouts.from_blhd``), dropout off
(``deterministic=True``).

Declared: an additive ``bias`` and a boolean ``mask`` (True = attend), no ``scale`` (Flax
divides q by sqrt(E)), ``is_causal`` for nnx only (linen has none), any batch dims.
"""

from __future__ import annotations

from typing import Any

from ...call.layouts import from_blhd
from ...claims.declaration import declare


def _nnx(
    q: Any, k: Any, v: Any, bias: Any = None, mask: Any = None, is_causal: bool = False
) -> Any:
    from flax import nnx

    return nnx.dot_product_attention(
        q, k, v, bias=bias, mask=mask, deterministic=True, is_causal=is_causal
    )


def _linen(q: Any, k: Any, v: Any, bias: Any = None, mask: Any = None) -> Any:
    from flax import linen

    return linen.dot_product_attention(q, k, v, bias=bias, mask=mask, deterministic=True)


nnx_dot_product_attention = from_blhd(declare(_nnx, bias=True, scale=False))
nnx_dot_product_attention.__name__ = "nnx_dot_product_attention"
nnx_dot_product_attention.__qualname__ = "nnx_dot_product_attention"
linen_dot_product_attention = from_blhd(declare(_linen, bias=True, scale=False, causal=False))
linen_dot_product_attention.__name__ = "linen_dot_product_attention"
linen_dot_product_attention.__qualname__ = "linen_dot_product_attention"
