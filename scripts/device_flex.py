"""FlexAttention compiled by ``torch.compile``: the Triton kernels it generates on CUDA, checked
by the device run (docs/gpu.md, issue #35) as

    attnspec check scripts/device_flex.py:flex_compiled_block_mask --device cuda

The known kernels ``torch.nn.attention.flex_attention:flex_attention`` and
``flex_attention_score_mod`` of the matrix call ``flex_attention`` eagerly: PyTorch's unfused
implementation, the only one on a CPU.  These two put the same conventions (the same code:
``flex_kernels`` of ``attnspec.conformance.kernels.adapters.torch``) through
``torch.compile(flex_attention)``, which on CUDA is the fused kernel users run:

- ``flex_compiled_block_mask``: the spec's boolean mask (True: may attend) and ``is_causal``
  (top-left, SDPA-4.1) as a ``mask_mod`` compiled into a ``BlockMask``; a bias as a
  ``score_mod`` that adds it;
- ``flex_compiled_score_mod``: mask, causal rule and bias in one ``score_mod`` that puts
  ``-inf`` where a key is masked out, with no block mask.

FlexAttention takes (B, H, L, E) arrays with E == Ev and no empty length, GQA through
``enable_gqa``; the declarations say so, so the suite pads head dims with exact zeros and
draws no empty sizes.  Only float16, bfloat16 and float32 are claimed: the dtypes the
generated kernels are for (float64 is the eager rows' on a CPU).

``ATTNSPEC_FLEX_COMPILE_BACKEND`` picks torch.compile's backend (default ``inductor``, the
Triton one; ``eager`` traces with Dynamo and runs the captured graph unfused, which is how
the CPU tests run these adapters in seconds).
"""

from __future__ import annotations

import os
from typing import Any

from attnspec.conformance import declare
from attnspec.conformance.kernels.adapters.torch import flex_kernels, raise_recompile_limits

_compiled: list[Any] = []


def compiled_flex_attention() -> Any:
    """``torch.compile(flex_attention)``, built once per process."""
    if not _compiled:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        raise_recompile_limits()
        backend = os.environ.get("ATTNSPEC_FLEX_COMPILE_BACKEND", "inductor")
        _compiled.append(torch.compile(flex_attention, backend=backend))
    return _compiled[0]


_flex_compiled_block_mask, _flex_compiled_score_mod = flex_kernels(
    compiled_flex_attention, ("_flex_compiled_block_mask", "_flex_compiled_score_mod"), __name__
)


_FLEX_COMPILED = {
    "dtypes": ("float16", "bfloat16", "float32"),
    "batch_ndim": 1,
    "equal_head_dims": True,
    "empty_sizes": False,
    "bias": True,
    "gqa": True,
    "gqa_keyword": "enable_gqa",
}
flex_compiled_block_mask = declare(_flex_compiled_block_mask, **_FLEX_COMPILED)
flex_compiled_block_mask.__name__ = flex_compiled_block_mask.__qualname__ = (
    "flex_compiled_block_mask"
)
flex_compiled_score_mod = declare(_flex_compiled_score_mod, **_FLEX_COMPILED)
flex_compiled_score_mod.__name__ = flex_compiled_score_mod.__qualname__ = "flex_compiled_score_mod"
