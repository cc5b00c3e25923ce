"""What serving kernels compute (spec/serving.md): attention sinks, chunked local attention,
merged attention states, absorbed multi-head latent attention, mixed batches over a paged
cache and float8 inputs.  Pure Array API, built on the dense reference (``..attention``)."""

from .chunked import chunked_local_mask
from .fp8 import FP8_FORMATS, fp8_attention, round_to_fp8
from .merge import merge_attention_states
from .mla import mla_attention
from .paged import paged_attention
from .sinks import sink_attention, streaming_mask, with_sinks

__all__ = [
    "FP8_FORMATS",
    "chunked_local_mask",
    "fp8_attention",
    "merge_attention_states",
    "mla_attention",
    "paged_attention",
    "round_to_fp8",
    "sink_attention",
    "streaming_mask",
    "with_sinks",
]
