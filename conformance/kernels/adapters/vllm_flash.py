"""vLLM's FlashAttention (``vllm.vllm_flash_attn``, vLLM's fork of flash-attention) in the
spec's paged-batch convention (PAGED-1): checked only where a GPU and vLLM are.

vLLM's attention backend calls ``flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q,
max_seqlen_k, seqused_k=, block_table=, softmax_scale=, causal=, window_size=[left, right],
softcap=, fa_version=, s_aux=)`` with the whole paged cache as ``k`` and ``v``
(``(num_blocks, block_size, num_kv_heads, head_size)``, the ``nhd`` pages) and no
``cu_seqlens_k``; its FlashAttention 2 path (``fa_version=2``) refuses sink logits, its
FlashAttention 3 path takes them as ``s_aux`` ``(num_heads,)`` float32.  vLLM allocates its
cache in blocks of a multiple of 16 positions, the page size declared here.  Head dims are
zero-padded to FlashAttention's alignment as for FlashAttention 3 (``flash_attn3.padded_call``).

``merge_attn_states`` is vLLM's merge of cascade and chunked-prefill states (MERGE-1),
``merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
output_lse=None)`` in ``vllm.v1.attention.ops.merge_attn_states`` (``vllm.attention.ops``
before vLLM's v1 move): it writes into the ``output`` and ``output_lse`` buffers it is given
and returns None, so the adapter allocates them and returns them.  Its outputs are
``[NUM_TOKENS, NUM_HEADS, HEAD_SIZE]`` and its log-sum-exps ``[NUM_HEADS, NUM_TOKENS]``
float32, natural logarithms (its kernels use exp and log): MERGE-2's declared
``(e, lhd, hl)``, no translation.
"""

from __future__ import annotations

from typing import Any

from ...claims.declaration import declare
from ...claims.family_claims import MergeClaim, PagedBatchClaim
from .flash_attn3 import FA3_FP8, HALF_DTYPES, as_int32, descales, head_multiple, padded_call

# vLLM's FlashAttention backend: block sizes a multiple of 16 (get_kv_cache_shape)
VLLM_PAGE_SIZE = 16


def _calling(fa_version: int, fp8: bool = False) -> Any:
    """PAGED-1's call as vLLM's ``flash_attn_varlen_func(..., fa_version=fa_version)``."""

    def varlen(q: Any, k_cache: Any, v_cache: Any, **call: Any) -> Any:
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        window = call.get("window_size")
        return padded_call(
            flash_attn_varlen_func,
            q,
            k_cache,
            v_cache,
            head_multiple(q),
            None,
            max_seqlen_q=call["max_seqlen_q"],
            cu_seqlens_q=as_int32(call["cu_seqlens_q"]),
            max_seqlen_k=call["max_seqlen_k"],
            seqused_k=as_int32(call["seqused_k"]),
            causal=call.get("is_causal", False),
            window_size=None if window is None else list(window),
            softcap=call.get("softcap", 0.0),
            block_table=as_int32(call["block_table"]),
            fa_version=fa_version,
            s_aux=call.get("sinks"),
            **descales(call),
        )

    name = "vllm_flash_attn_varlen" + ("" if fa_version == 2 else f"_fa{fa_version}")
    name += "_fp8" if fp8 else ""
    varlen.__name__ = varlen.__qualname__ = name
    return varlen


# vLLM's default FlashAttention 2 path (no sinks: it raises for s_aux)
vllm_flash_attn_varlen = declare(
    _calling(2),
    dtypes=HALF_DTYPES,
    paged_batch=PagedBatchClaim("nhd", VLLM_PAGE_SIZE, features=("window", "softcap")),
)
# the Hopper path, with gpt-oss's sink logits as s_aux
vllm_flash_attn_varlen_fa3 = declare(
    _calling(3),
    dtypes=HALF_DTYPES,
    paged_batch=PagedBatchClaim("nhd", VLLM_PAGE_SIZE, features=("window", "softcap", "sinks")),
)
# the FlashAttention 3 path on float8 q and pages: vLLM passes its per-layer scales expanded
# to (num_sequences, num_kv_heads) as q_descale, k_descale, v_descale (QUANT-6)
vllm_flash_attn_varlen_fa3_fp8 = declare(
    _calling(3, fp8=True),
    dtypes=("bfloat16",),
    paged_batch=PagedBatchClaim("nhd", VLLM_PAGE_SIZE, features=("window", "softcap", "sinks")),
    fp8=FA3_FP8,
)


def _vllm_merge() -> Any:
    try:
        from vllm.v1.attention.ops.merge_attn_states import merge_attn_states as merge
    except ImportError:  # vLLM before the v1 move
        from vllm.attention.ops.merge_attn_states import merge_attn_states as merge
    return merge


def merge_attn_states(o_a: Any, lse_a: Any, o_b: Any, lse_b: Any) -> Any:
    """MERGE-1 through vLLM's ``merge_attn_states``, into buffers allocated here; its
    kernels index the tokens and heads densely, so the states are made contiguous."""
    import torch

    output = torch.empty_like(o_a, memory_format=torch.contiguous_format)
    output_lse = torch.empty_like(lse_a, memory_format=torch.contiguous_format)
    states = (x.contiguous() for x in (o_a, lse_a, o_b, lse_b))
    _vllm_merge()(output, *states, output_lse)
    return output, output_lse


merge_attn_states = declare(
    merge_attn_states,
    dtypes=(*HALF_DTYPES, "float32"),
    merge=MergeClaim("e", "lhd", "hl"),
)
