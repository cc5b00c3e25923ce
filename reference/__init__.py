"""The reference implementation: pure Python Array API, one module per spec area.

May import: backends.
"""

from ._array import Array
from .attention import scaled_dot_product_attention
from .backward import (
    Gradients,
    blocked_attention_backward,
    scaled_dot_product_attention_backward,
    varlen_attention_backward,
)
from .blocked import blocked_attention, default_block_sizes
from .favor import favor_attention, favor_feature_map, favor_projection
from .features import alibi_slopes
from .kv_cache import append_to_cache, kv_cache_attention
from .linear import elu_plus_one, linear_attention, relu_features
from .masks import CAUSAL_ALIGNMENTS, causal_mask, padding_mask
from .mha import multi_head_attention
from .positional import apply_rope, sinusoidal_positional_encoding
from .recurrent import recurrent_attention, varlen_recurrent_attention
from .sdpa import plain_attention
from .sparse import (
    LIBRARY_WINDOWS,
    PATTERN_NAMES,
    bigbird_mask,
    block_sparse_attention,
    block_sparse_mask,
    fixed_mask,
    library_window,
    longformer_mask,
    sliding_window_mask,
    sparse_attention,
    sparse_mask,
    strided_mask,
)
from .varlen import varlen_attention

__all__ = [
    "CAUSAL_ALIGNMENTS",
    "LIBRARY_WINDOWS",
    "PATTERN_NAMES",
    "Array",
    "Gradients",
    "alibi_slopes",
    "append_to_cache",
    "apply_rope",
    "bigbird_mask",
    "block_sparse_attention",
    "block_sparse_mask",
    "blocked_attention",
    "blocked_attention_backward",
    "causal_mask",
    "default_block_sizes",
    "elu_plus_one",
    "favor_attention",
    "favor_feature_map",
    "favor_projection",
    "fixed_mask",
    "kv_cache_attention",
    "library_window",
    "linear_attention",
    "longformer_mask",
    "multi_head_attention",
    "padding_mask",
    "plain_attention",
    "recurrent_attention",
    "relu_features",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "sinusoidal_positional_encoding",
    "sliding_window_mask",
    "sparse_attention",
    "sparse_mask",
    "strided_mask",
    "varlen_attention",
    "varlen_attention_backward",
    "varlen_recurrent_attention",
]
