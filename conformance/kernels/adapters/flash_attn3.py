"""FlashAttention 3 (``flash_attn_interface``, the Hopper build of Dao-AILab/flash-attention)
in the spec's conventions: checked only where a GPU and the library are (the device run).

- ``flash_attn3_func``: ``flash_attn_func(q, k, v, softmax_scale=, causal=, softcap=)`` on
  ``(B, L, H, D)`` arrays, GQA by head counts, bottom-right causal, a softcap of 0.0 for none.
- ``flash_attn3_func_fp8``: the same function on ``float8_e4m3fn`` inputs with its
  ``q_descale``, ``k_descale``, ``v_descale`` of ``(batch_size, num_heads_k)`` float32
  (QUANT-1); its float8 forward returns bfloat16 and feeds the weights P to a float8 matrix
  product (QUANT-3, declared).
- ``flash_attn3_paged``: a mixed batch over a paged cache (PAGED-1) through
  ``flash_attn_with_kvcache(q (total_q, H, D), k_cache (num_blocks, page_block_size, H_k,
  D), v_cache, cache_seqlens=, cache_leftpad=, page_table=, cu_seqlens_q=, max_seqlen_q=,
  causal=, window_size=, attention_chunk=, softcap=)``: ``seqused_k`` is its
  ``cache_seqlens``, ``block_table`` its ``page_table``, and it takes no ``max_seqlen_k``.

The metadata FlashAttention reads as int32 (offsets, lengths, the page table) is passed as
int32, and head dims are zero-padded to FlashAttention's alignment (:func:`padded_call`);
nothing else is changed.  Only the Python calls are written here (the library's
documented keywords); tests/conformance/test_serving_gpu_adapters.py runs them on CPU against
stand-ins with the same signatures.
"""

from __future__ import annotations

from typing import Any

from ...call.layouts import from_blhd, pad_head_dims, rename_arguments
from ...claims.declaration import declare
from ...claims.family_claims import Fp8Claim, PagedBatchClaim

HALF_DTYPES = ("float16", "bfloat16")


def as_int32(x: Any) -> Any:
    """A torch integer tensor (or None) as the int32 FlashAttention's metadata must be."""
    import torch

    return None if x is None else x.to(torch.int32)


def head_dim_width(head_dim: int, multiple: int) -> int:
    """The head dim a kernel that takes multiples of ``multiple`` gets: ``head_dim`` rounded up."""
    return -(-head_dim // multiple) * multiple


def zero_columns(x: Any, width: int) -> Any:
    """``x`` with zero columns appended on its last axis up to ``width`` (exact: zeros add
    nothing to a score, and a zero value column is cut from the output)."""
    import torch

    if x.shape[-1] == width:
        return x
    return torch.cat([x, x.new_zeros((*x.shape[:-1], width - x.shape[-1]))], dim=-1)


def padded_call(
    call: Any, q: Any, k: Any, v: Any, multiple: int, scale: float | None, **kwargs: Any
) -> Any:
    """``call(q, k, v, softmax_scale=, **kwargs)`` with the head dims of q, k (and of v)
    padded by zero columns to multiples of ``multiple`` (FlashAttention's kernels take
    "head_size ... a multiple of 8", 16 in float8), the output cut back to ``Ev``.  Where
    a column is added, the scale 1/sqrt(E) of the unpadded problem is passed when none was:
    the kernel's default would be that of the padded width, a change made here, not by it."""
    head_dim, value_dim = q.shape[-1], v.shape[-1]
    width, value_width = head_dim_width(head_dim, multiple), head_dim_width(value_dim, multiple)
    if scale is None and width != head_dim:
        scale = head_dim**-0.5
    out = _first(
        call(
            zero_columns(q, width),
            zero_columns(k, width),
            zero_columns(v, value_width),
            softmax_scale=scale,
            **kwargs,
        )
    )
    return out[..., :value_dim]


def _first(result: Any) -> Any:
    """The output alone: FlashAttention 3 releases before 3.0.0b1 returned ``(out, lse)``."""
    return result[0] if isinstance(result, (tuple, list)) else result


def head_multiple(x: Any) -> int:
    """FlashAttention's head-dim alignment: 16 bytes, 8 half-precision or 16 float8 columns."""
    return 16 // min(int(x.element_size()), 2)


def _fa3(q: Any, k: Any, v: Any, *, softmax_scale: float | None = None, **kwargs: Any) -> Any:
    from flash_attn_interface import flash_attn_func

    return padded_call(flash_attn_func, q, k, v, head_multiple(q), softmax_scale, **kwargs)


def flash_attention_row(fn: Any, /, **claims: Any) -> Any:
    """``fn(q, k, v, causal=, softmax_scale=, ...)`` on ``(B, S, H, D)`` arrays (FlashAttention's
    convention) in the spec's layout and names, declared as FlashAttention's functions are:
    no mask, GQA by head counts, bottom-right causal; head dims made equal (E == Ev)."""
    return from_blhd(
        pad_head_dims(
            declare(
                rename_arguments(fn, is_causal="causal", scale="softmax_scale"),
                mask=False,
                gqa=True,
                causal_alignment="bottom_right",
                batch_ndim=1,
                **claims,
            )
        )
    )


flash_attn3_func = flash_attention_row(_fa3, dtypes=HALF_DTYPES, softcap=True)
flash_attn3_func.__name__ = flash_attn3_func.__qualname__ = "flash_attn3_func"

# float8_e4m3fn only (FlashAttention 3's float8 kernels), per (batch, key/value head)
# descales, P rounded to e4m3 before P V; the output is bfloat16
FA3_FP8 = Fp8Claim(("e4m3fn",), "head", "e4m3fn")

# its float8 kernels are built with a softcap too (hopper/instantiations: *_e4m3_softcap_sm90)
flash_attn3_func_fp8 = flash_attention_row(_fa3, dtypes=("bfloat16",), fp8=FA3_FP8, softcap=True)
flash_attn3_func_fp8.__name__ = flash_attn3_func_fp8.__qualname__ = "flash_attn3_func_fp8"


def descales(call: dict[str, Any]) -> dict[str, Any]:
    """The float8 descales a call holds (QUANT-6: ``(num_sequences, num_heads_k)``), by
    FlashAttention's keywords; none for a call in half precision."""
    names = ("q_descale", "k_descale", "v_descale")
    return {name: call[name] for name in names if call.get(name) is not None}


def flash_attn3_paged(q: Any, k_cache: Any, v_cache: Any, **call: Any) -> Any:
    """PAGED-1's call (``cu_seqlens_q``, ``seqused_k``, ``block_table``, ``max_seqlen_q``,
    ``is_causal`` and the declared options) as ``flash_attn_with_kvcache``'s with
    ``page_table``; ``max_seqlen_k`` it does not take (each sequence's bound is its
    ``cache_seqlens``)."""
    from flash_attn_interface import flash_attn_with_kvcache

    return padded_call(
        flash_attn_with_kvcache,
        q,
        k_cache,
        v_cache,
        head_multiple(q),
        None,
        cache_seqlens=as_int32(call["seqused_k"]),
        cache_leftpad=as_int32(call.get("cache_leftpad")),
        page_table=as_int32(call["block_table"]),
        cu_seqlens_q=as_int32(call["cu_seqlens_q"]),
        max_seqlen_q=call["max_seqlen_q"],
        causal=call.get("is_causal", False),
        window_size=tuple(call.get("window_size", (-1, -1))),
        attention_chunk=call.get("attention_chunk", 0),
        softcap=call.get("softcap", 0.0),
        **descales(call),
    )


flash_attn3_paged = declare(
    flash_attn3_paged,
    dtypes=HALF_DTYPES,
    paged_batch=PagedBatchClaim("nhd", features=("leftpad", "window", "chunk", "softcap")),
)


def flash_attn3_paged_fp8(q: Any, k_cache: Any, v_cache: Any, **call: Any) -> Any:
    """:func:`flash_attn3_paged` on float8 q and pages with their descales (QUANT-6)."""
    return flash_attn3_paged(q, k_cache, v_cache, **call)


# its float8 paged kernels (hopper/instantiations: *_e4m3_paged_*_sm90): q and the pages in
# e4m3fn, descales per sequence and key/value head, a bfloat16 output
flash_attn3_paged_fp8 = declare(
    flash_attn3_paged_fp8,
    dtypes=("bfloat16",),
    paged_batch=PagedBatchClaim("nhd", features=("leftpad", "window", "chunk", "softcap")),
    fp8=FA3_FP8,
)
