"""FlashInfer in the spec's conventions: checked only where a GPU and the library are.

- ``batch_prefill_paged``: a mixed batch over a paged cache (PAGED-1) through
  ``BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="HND")``, whose ``plan(qo_indptr,
  paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
  head_dim_qk, page_size, head_dim_vo=, custom_mask=, causal=, logits_soft_cap=,
  q_data_type=, kv_data_type=)`` takes the pages of each sequence as a CSR list instead of a
  block table, and whose ``run(q, (k_cache, v_cache), sinks=)`` computes.  The translation:
  sequence b's pages are the first ceil(u_b / P) entries of its block-table row, and
  ``paged_kv_last_page_len[b]`` is how many slots of the last one it uses (PAGED-1 says the
  same pages).  FlashInfer has no ``cache_leftpad`` and only a left window, so neither is
  declared.  Its ``custom_mask`` is PAGED-8's layout, but with a mask it ignores ``causal``
  ("only effective when custom_mask is not provided"): a causal call with a mask gets the
  mask and the bottom-right causal rule combined, as FlashInfer's callers build it.  Its
  ``q`` must have exactly ``qo_indptr[-1]`` rows, so the rows past ``cu_seqlens_q[-1]``
  (memory no sequence owns, PAGED-5) are not passed, and their output rows are 0.  Head
  dims are zero-padded to 64, 128 or 256, the sizes its kernels are built for, with the
  unpadded problem's scale 1/sqrt(E) passed where a column was added.
- ``batch_prefill_paged_fp8_cache``: the same call over float8 pages beside float16 or
  bfloat16 queries, the pages' scales passed as ``run(..., k_scale=, v_scale=)``, Python
  floats (QUANT-8; FlashInfer folds ``k_scale`` into ``sm_scale`` and multiplies the output
  by ``v_scale``).
- ``merge_state``: ``flashinfer.merge_state(v_a, s_a, v_b, s_b)`` declared as it is
  (MERGE-2): outputs ``[seq_len, num_heads, head_dim]``, log-sum-exps ``[seq_len,
  num_heads]`` float32 in base 2 (its kernel uses exp2 and log2).
- ``batch_mla_paged``: absorbed MLA over paged latent pages (MLA-4) through
  ``flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace)``, whose ``plan(qo_indptr,
  kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal,
  sm_scale, q_data_type, kv_data_type)`` takes each sequence's pages as a CSR list (as for
  ``batch_prefill_paged``) and its cached length, and whose ``run(q_nope, q_pe, ckv_cache,
  kpe_cache, return_lse=True)`` takes the queries and the pages split at the latent width:
  the first ``head_dim_v`` channels (``ckv``) and the rotary rest (``kpe``), views of
  MLA-4's pages ``(N, P, 1, E)`` as SGLang passes them.  Every sequence has MLA-4's same
  ``Lq`` queries, so ``qo_indptr`` is ``[0, Lq, 2 Lq, ...]``.  FlashInfer has no default
  scale (``sm_scale`` is required), and its log-sum-exp is ``[tokens, num_heads]`` in base 2:
  the adapter returns it times ln 2 as ``(B, Hq, Lq)``.
"""

from __future__ import annotations

import math
from typing import Any

from ...claims.declaration import declare
from ...claims.family_claims import Fp8Claim, MergeClaim, MlaClaim, PagedBatchClaim
from .flash_attn3 import HALF_DTYPES, as_int32, zero_columns

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace
HEAD_DIMS = (64, 128, 256)  # the head dims FlashInfer's prefill kernels are built for


def flashinfer_width(head_dim: int) -> int:
    """The head dim FlashInfer gets: the smallest of HEAD_DIMS that holds ``head_dim``
    (zero columns added, the output cut back), ``head_dim`` itself past them."""
    return next((w for w in HEAD_DIMS if w >= head_dim), head_dim)


def page_lists(seqused_k: Any, block_table: Any, page_size: int) -> tuple[Any, Any, Any]:
    """FlashInfer's ``paged_kv_indptr (B + 1)``, ``paged_kv_indices`` and
    ``paged_kv_last_page_len (B)`` (int32) of a block table and the cached lengths."""
    import torch

    used = seqused_k.to(torch.int64)
    pages = (used + page_size - 1) // page_size
    indptr = torch.zeros(len(used) + 1, dtype=torch.int64, device=used.device)
    indptr[1:] = torch.cumsum(pages, 0)
    indices = torch.cat(
        [block_table[b, : int(n)].to(torch.int64) for b, n in enumerate(pages.tolist())]
        or [torch.zeros(0, dtype=torch.int64, device=used.device)]
    )
    last = torch.where(pages > 0, used - (pages - 1) * page_size, torch.zeros_like(used))
    return as_int32(indptr), as_int32(indices), as_int32(last)


def _with_causal(mask: Any, cu_seqlens_q: Any, seqused_k: Any) -> Any:
    """PAGED-8's flattened mask with each sequence's bottom-right causal rule folded in."""
    import torch

    parts, start = [], 0
    for b, n_k in enumerate(seqused_k.tolist()):
        n_q = int(cu_seqlens_q[b + 1] - cu_seqlens_q[b])
        rows = torch.arange(n_q, device=mask.device)[:, None] + (n_k - n_q)
        keep = torch.arange(n_k, device=mask.device)[None, :] <= rows
        parts.append(mask[start : start + n_q * n_k].reshape(n_q, n_k) & keep)
        start += n_q * n_k
    return torch.cat([p.reshape(-1) for p in parts]) if parts else mask


def batch_prefill_paged(q: Any, k_cache: Any, v_cache: Any, **call: Any) -> Any:
    """PAGED-1 through ``BatchPrefillWithPagedKVCacheWrapper`` (HND pages): ``call`` holds
    ``cu_seqlens_q``, ``seqused_k``, ``block_table``, ``is_causal`` and the declared options
    (``softcap``, ``custom_mask``, ``sinks``)."""
    import flashinfer
    import torch

    cu_seqlens_q, seqused_k = call["cu_seqlens_q"], call["seqused_k"]
    is_causal, custom_mask = call.get("is_causal", False), call.get("custom_mask")

    n_kv_heads, page_size, head_dim = (int(n) for n in k_cache.shape[1:])
    value_dim = int(v_cache.shape[-1])
    width, value_width = flashinfer_width(head_dim), flashinfer_width(value_dim)
    scale = None if width == head_dim else head_dim**-0.5  # the padding's, not FlashInfer's
    q, k_cache, v_cache = (
        zero_columns(x, w) for x, w in ((q, width), (k_cache, width), (v_cache, value_width))
    )
    owned = int(cu_seqlens_q[-1])
    indptr, indices, last = page_lists(seqused_k, call["block_table"], page_size)
    if custom_mask is not None and is_causal:
        custom_mask = _with_causal(custom_mask, cu_seqlens_q, seqused_k)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="HND")
    wrapper.plan(
        as_int32(cu_seqlens_q),
        indptr,
        indices,
        last,
        q.shape[1],
        n_kv_heads,
        width,
        page_size,
        head_dim_vo=value_width,
        custom_mask=custom_mask,
        causal=is_causal,
        sm_scale=scale,
        logits_soft_cap=call.get("softcap"),
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    scales = {name: call[name] for name in ("k_scale", "v_scale") if name in call}
    run = wrapper.run(q[:owned], (k_cache, v_cache), sinks=call.get("sinks"), **scales)
    out = run[..., :value_dim]
    if owned == q.shape[0]:
        return out
    padding = out.new_zeros((q.shape[0] - owned, *out.shape[1:]))
    return torch.cat([out, padding])


batch_prefill_paged = declare(
    batch_prefill_paged,
    dtypes=HALF_DTYPES,
    paged_batch=PagedBatchClaim("hnd", max_seqlen=False, features=("softcap", "mask", "sinks")),
)


def batch_prefill_paged_fp8_cache(q: Any, k_cache: Any, v_cache: Any, **call: Any) -> Any:
    """:func:`batch_prefill_paged` over float8 pages beside half-precision queries, with
    ``run(..., k_scale=, v_scale=)`` (QUANT-8)."""
    return batch_prefill_paged(q, k_cache, v_cache, **call)


# FlashInfer's float8 KV cache: e4m3 or e5m2 pages, per-tensor Python-float scales
batch_prefill_paged_fp8_cache = declare(
    batch_prefill_paged_fp8_cache,
    dtypes=HALF_DTYPES,
    paged_batch=PagedBatchClaim("hnd", max_seqlen=False, features=("softcap", "mask", "sinks")),
    fp8=Fp8Claim(("e4m3fn", "e5m2"), descale="tensor", kv_only=True),
)


def merge_state(o_a: Any, lse_a: Any, o_b: Any, lse_b: Any) -> Any:
    """``flashinfer.merge_state`` (no translation: its convention is declared)."""
    import flashinfer

    return flashinfer.merge_state(o_a, lse_a, o_b, lse_b)


merge_state = declare(
    merge_state,
    dtypes=HALF_DTYPES,
    merge=MergeClaim("2", "lhd", "lh"),
)


def batch_mla_paged(q: Any, k_cache: Any, **call: Any) -> Any:
    """MLA-4 through ``BatchMLAPagedAttentionWrapper``: ``call`` holds ``block_table``,
    ``cache_seqlens``, ``head_dim_v``, ``softmax_scale`` and ``causal``."""
    import torch
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    batch, n_queries, n_heads, head_dim = (int(n) for n in q.shape)
    value_dim, page_size = int(call["head_dim_v"]), int(k_cache.shape[1])
    indptr, indices, _ = page_lists(call["cache_seqlens"], call["block_table"], page_size)
    qo_indptr = torch.arange(0, (batch + 1) * n_queries, n_queries, device=q.device)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    wrapper = BatchMLAPagedAttentionWrapper(workspace)
    wrapper.plan(
        as_int32(qo_indptr),
        indptr,
        indices,
        as_int32(call["cache_seqlens"]),
        n_heads,
        value_dim,
        head_dim - value_dim,
        page_size,
        call.get("causal", False),
        call["softmax_scale"],
        q.dtype,
        k_cache.dtype,
    )
    tokens = q.reshape(batch * n_queries, n_heads, head_dim)
    latent = k_cache[:, :, 0, :]  # (N, P, E): the one latent head
    out, lse = wrapper.run(
        tokens[..., :value_dim],
        tokens[..., value_dim:],
        latent[..., :value_dim],
        latent[..., value_dim:],
        return_lse=True,
    )
    lse = (lse * math.log(2.0)).reshape(batch, n_queries, n_heads).permute(0, 2, 1)
    return out.reshape(batch, n_queries, n_heads, value_dim), lse.contiguous()


batch_mla_paged = declare(
    batch_mla_paged,
    dtypes=HALF_DTYPES,
    mla=MlaClaim(512, 64, paged=True),
    causal_alignment="bottom_right",
    returns_lse=True,
)
