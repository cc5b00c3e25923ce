"""FlashMLA (deepseek-ai/FlashMLA) in the spec's paged MLA convention (MLA-4): checked only
where a GPU and the library are.

``flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
tile_scheduler_metadata, num_splits, softmax_scale=None, causal=False, ...)`` returns ``(out,
softmax_lse)``: ``q (batch_size, seq_len_q, num_heads_q, head_dim)``, ``k_cache (num_blocks,
page_block_size, num_heads_k, head_dim)``, int32 ``block_table`` and ``cache_seqlens``, ``out
(batch_size, seq_len_q, num_heads_q, head_dim_v)``, ``softmax_lse (batch_size, num_heads_q,
seq_len_q)`` float32, for DeepSeek V3's head dims 576 and 512 and pages of 64; without a
``softmax_scale`` it uses ``q.shape[-1] ** -0.5`` (MLA-5).  That is MLA-4's call already; the
adapter adds only the scheduler metadata of ``get_mla_metadata``, which older releases compute
from ``(cache_seqlens, seq_len_q * num_heads_q // num_heads_k, num_heads_k)`` and return as
two tensors, and newer ones return as ``(FlashMLASchedMeta(), None)`` whatever the arguments
(filled on the first call): the adapter passes the old arguments, which both take, and both
results on.
"""

from __future__ import annotations

from typing import Any

from ...claims.declaration import declare
from ...claims.family_claims import MlaClaim
from .flash_attn3 import HALF_DTYPES, as_int32

FLASH_MLA_PAGE_SIZE = 64  # FlashMLA's page_block_size


def flash_mla_with_kvcache(q: Any, k_cache: Any, **call: Any) -> Any:
    """MLA-4 through ``flash_mla_with_kvcache`` with fresh scheduler metadata per call:
    ``call`` holds ``block_table``, ``cache_seqlens``, ``head_dim_v`` and, where given,
    ``softmax_scale`` and ``causal``, FlashMLA's own keywords."""
    from flash_mla import flash_mla_with_kvcache as paged_mla
    from flash_mla import get_mla_metadata

    seqlens = as_int32(call["cache_seqlens"])
    n_kv_heads = int(k_cache.shape[2])
    metadata, splits = get_mla_metadata(
        seqlens, int(q.shape[1]) * int(q.shape[2]) // n_kv_heads, n_kv_heads
    )
    return paged_mla(
        q,
        k_cache,
        as_int32(call["block_table"]),
        seqlens,
        call["head_dim_v"],
        metadata,
        splits,
        softmax_scale=call.get("softmax_scale"),
        causal=call.get("causal", False),
    )


flash_mla_with_kvcache = declare(
    flash_mla_with_kvcache,
    dtypes=HALF_DTYPES,
    mla=MlaClaim(512, 64, paged=True, page_size=FLASH_MLA_PAGE_SIZE, default_scale=True),
    causal_alignment="bottom_right",
    returns_lse=True,
)
