"""The reference implementation: pure Python Array API, one module per spec area."""

from .masks import CAUSAL_ALIGNMENTS, causal_mask, padding_mask
from .sdpa import scaled_dot_product_attention

__all__ = [
    "CAUSAL_ALIGNMENTS",
    "causal_mask",
    "padding_mask",
    "scaled_dot_product_attention",
]
