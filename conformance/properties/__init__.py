"""Property modules, one per spec area; importing them registers their properties."""

from . import (  # noqa: F401
    agreement,
    causal,
    invariance,
    masked_values,
    scale,
    softmax,
    sparse,
)
