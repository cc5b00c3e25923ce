"""Property modules, one per spec area; importing them registers their properties."""

from . import (  # noqa: F401
    agreement,
    causal,
    empty_rows,
    gqa,
    invariance,
    linear,
    masked_values,
    masking,
    scale,
    shapes,
    softmax,
    sparse,
)
