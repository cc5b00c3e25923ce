"""Sparse attention (spec/sparse.md): one definition, the masks it builds, the fast kernels.

- ``definition.py``: the index sets S(i) of each pattern, one pointwise predicate per
  pattern (SPARSE-1 … SPARSE-5); everything else is built on it.
- ``parameters.py``: a pattern's parameters validated into its index set (SPARSE-1.4),
  BigBird's random blocks (SPARSE-5.3), the libraries' window conventions (SPARSE-2.2).
- ``masks.py``: the dense boolean masks that *define* each pattern's attention
  (SPARSE-1.1) when passed to the dense reference.
- ``kernels.py``: the same attention computed on the allowed pairs only (SPARSE-6).
"""

from .kernels import block_sparse_attention, sparse_attention

# the package's public names (tests/reference/sparse/test_masks.py imports the same list)
from .masks import (
    LIBRARY_WINDOWS,
    PATTERN_NAMES,
    bigbird_mask,
    block_sparse_mask,
    fixed_mask,
    library_window,
    longformer_mask,
    sliding_window_mask,
    sparse_mask,
    strided_mask,
)

__all__ = [
    "LIBRARY_WINDOWS",
    "PATTERN_NAMES",
    "bigbird_mask",
    "block_sparse_attention",
    "block_sparse_mask",
    "fixed_mask",
    "library_window",
    "longformer_mask",
    "sliding_window_mask",
    "sparse_attention",
    "sparse_mask",
    "strided_mask",
]
