"""Property modules, one per spec area; importing them registers their properties."""

from . import (  # noqa: F401
    agreement,
    causal,
    dropout,
    empty_rows,
    features,
    gqa,
    invariance,
    linear,
    masked_values,
    masking,
    merge,
    mla,
    paged_batch,
    rope,
    scale,
    shapes,
    sinks,
    softmax,
    sparse,
    varlen_kv_cache,
)
