"""PyTorch SDPA pinned to each of its CUDA backends, in float16 and bfloat16, with the inputs each
backend takes: what the device run (docs/gpu.md, issue #35) checks as

    attnspec check scripts/device_sdpa.py:sdpa_cuda_flash_half --backend torch --device cuda

The matrix rows ``sdpa_cuda_*`` claim everything PyTorch's SDPA documents, in every dtype, so
a backend that rejects an input (flash and float32, flash and an attn_mask) fails there on
its first such example and its half-precision numerics may go unchecked.  These claim what
each backend accepts, as PyTorch's dispatcher states its constraints
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; ``torch.backends.cuda`` docs):

- every backend here: float16 and bfloat16 only (the half-precision rows TOL-2 is about);
  flash, memory-efficient and cuDNN reject a zero-length sequence
  (``check_nonzero_sequence_lengths_dense``), so empty sizes are not drawn and SDPA-1.5
  and SDPA-5.2 are named as waived;
- flash: no ``attn_mask`` at all (``check_for_attn_mask``), so neither a mask nor a bias;
- math: everything SDPA documents.

A rejection of anything still claimed (a causal call with Lq != Lk on flash, GQA on a
backend whose build does not take it) is a finding to classify by hand, as every GPU
finding is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnspec.conformance.claims.declaration import torch_sdpa_declaration
from attnspec.conformance.kernels.torch_sdpa import sdpa_on

# what torch.nn.functional.scaled_dot_product_attention documents (the matrix rows' claims),
# in half precision only
_SDPA = {**torch_sdpa_declaration(), "dtypes": ("float16", "bfloat16")}
_ACCEPTS: dict[str, dict[str, Any]] = {
    "MATH": {},
    "EFFICIENT_ATTENTION": {"empty_sizes": False},
    "FLASH_ATTENTION": {"empty_sizes": False, "mask": False, "bias": False},
    "CUDNN_ATTENTION": {"empty_sizes": False},
}


def pinned(backend: str, name: str) -> Callable[..., Any]:
    """SDPA restricted to ``SDPBackend.<backend>``, declared as that backend accepts."""

    claims = {**_SDPA, **_ACCEPTS[backend]}
    if not claims.get("mask", True):
        claims.pop("mask_keyword")
    if not claims.get("bias", True):
        claims.pop("bias_keyword")
    doc = f"PyTorch SDPA restricted to its {backend} backend, float16 and bfloat16."
    return sdpa_on(backend, name, __name__, claims, doc)


sdpa_cuda_math_half = pinned("MATH", "sdpa_cuda_math_half")
sdpa_cuda_efficient_half = pinned("EFFICIENT_ATTENTION", "sdpa_cuda_efficient_half")
sdpa_cuda_flash_half = pinned("FLASH_ATTENTION", "sdpa_cuda_flash_half")
sdpa_cuda_cudnn_half = pinned("CUDNN_ATTENTION", "sdpa_cuda_cudnn_half")
