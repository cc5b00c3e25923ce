"""The PyTorch fallbacks of Hugging Face transformers' Gated DeltaNet layers (Qwen3-Next,
Qwen3.5) as matrix rows: ``torch_chunk_gated_delta_rule`` and
``torch_recurrent_gated_delta_rule`` of ``transformers.models.qwen3_next.modeling_qwen3_next``
and ``...qwen3_5.modeling_qwen3_5``, declared as ``attnspec check`` flags declare them.

They take flash-linear-attention's convention (``[B, T, H, K]``, ``g`` natural-log per value
head, ``beta``, ``initial_state [B, HV, K, V]``, ``output_final_state``, value-head groups by
``repeat_interleave``; the chunked one a ``chunk_size=``).  The models call them with
``use_qk_l2norm_in_kernel=True`` (fla's ``l2norm``, eps 1e-6), and so do the rows: each is
``--layout blhd --kwarg output_final_state=True --kwarg use_qk_l2norm_in_kernel=True
--recurrent gated_delta --recurrent-value-groups --recurrent-qk-l2norm 1e-06`` and, chunked,
``--recurrent-chunk-size 64 --recurrent-chunk-sizes 16,32,64``.  transformers decorates
them to dispatch to a hub kernel or to flash-linear-attention where one runs on the inputs'
device (fla: CUDA, XPU, MLU, NPU); on a CPU the object a model calls runs the PyTorch
function, which is what a row checks.  With the ``kernels`` package installed (a dependency
of transformers 5) that object is a ``torch.nn.Module`` without a name of its own, so the
rows are named by these adapters.
"""

from __future__ import annotations

import dataclasses

from ...claims.family_claims import RecurrentClaim
from .flash_linear import CHUNK_SIZES, Row, rows_by_name

# as the models call them: use_qk_l2norm_in_kernel=True, fla's l2norm (eps 1e-6, REC-2.4)
_RECURRENT = RecurrentClaim("gated_delta", "head", 1, value_groups=True, qk_l2norm=1e-6)
_CHUNKED = dataclasses.replace(_RECURRENT, chunk_size=64, chunk_sizes=CHUNK_SIZES)
MODELS = {"qwen3_next": "qwen3_next.modeling_qwen3_next", "qwen3_5": "qwen3_5.modeling_qwen3_5"}

ROWS: dict[str, Row] = {
    f"{model}_{form}": Row(
        f"transformers.models.{module}:torch_{form}_gated_delta_rule",
        _CHUNKED if form == "chunk" else _RECURRENT,
        keywords=("use_qk_l2norm_in_kernel",),
    )
    for model, module in MODELS.items()
    for form in ("chunk", "recurrent")
}


__getattr__ = rows_by_name(ROWS, __name__)  # the rows, by name
