"""CPU stand-ins for the GPU serving libraries the matrix's device rows call (FlashAttention 3's
``flash_attn_interface``, vLLM's ``vllm.vllm_flash_attn`` and ``merge_attn_states``,
``flashinfer``, FlashMLA's ``flash_mla``), for
tests/conformance/test_serving_gpu_adapters.py.

Each stand-in takes the library function's own parameters (names and order, as their
sources declare them: flash-attention ``hopper/flash_attn_interface.py``, vllm-project/
flash-attention ``vllm_flash_attn/flash_attn_interface.py``, flashinfer ``prefill.py``,
``cascade.py`` and ``mla.py``, FlashMLA ``flash_mla/flash_mla_interface.py``, vllm
``vllm/v1/attention/ops/merge_attn_states.py``), so a keyword the adapter misspells raises
TypeError; it checks what the library requires of its arguments (int32 metadata, the cache's
layout, descale shapes, q rows equal to ``qo_indptr[-1]``), turns the library's convention
back into the spec's and computes with the float64 oracle of tests/oracle_serving.py.  The
output is returned in the library's dtype (bfloat16 for FlashAttention 3's float8 path).
"""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import numpy as np
import torch
from oracle_serving import attend, causal, merge, paged

LN2 = math.log(2.0)


def _require(ok: bool, what: str) -> None:
    """The library's own checks (it raises RuntimeError from its C++ API)."""
    if not ok:
        raise RuntimeError(what)


def _int32(name: str, x: Any) -> list[int]:
    _require(x.dtype == torch.int32, f"{name} must have dtype int32, got {x.dtype}")
    return [int(a) for a in x.reshape(-1).tolist()]


def _real(x: Any, descale: Any, groups: int) -> np.ndarray:
    """(B, L, H, D) stored values times their (B, H_k) descale (a query head its key/value
    head's), float64."""
    values = x.to(torch.float64).numpy()
    if descale is None:
        return values
    _require(descale.dtype == torch.float32, "descales must be float32")
    _require(descale.shape == (x.shape[0], x.shape[2] // groups), "descale must be (B, H_k)")
    factors = np.repeat(descale.to(torch.float64).numpy(), groups, axis=1)
    return values * factors[:, None, :, None]


def _out(values: np.ndarray, q: Any) -> Any:
    dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    return torch.from_numpy(values).to(dtype)


def _window(window_size: Any) -> tuple[int | None, int | None]:
    left, right = (int(w) for w in window_size)
    return (None if left < 0 else left, None if right < 0 else right)


# The libraries' parameters, in order (their sources' signatures)
FA3_FUNC = (
    "q k v softmax_scale causal qv q_descale k_descale v_descale window_size attention_chunk "
    "softcap num_splits pack_gqa deterministic sm_margin return_attn_probs"
)
FA3_KVCACHE = (
    "q k_cache v_cache k v qv rotary_cos rotary_sin cache_seqlens cache_batch_idx "
    "cache_leftpad page_table cu_seqlens_q cu_seqlens_k_new max_seqlen_q rotary_seqlens "
    "q_descale k_descale v_descale softmax_scale causal window_size attention_chunk softcap "
    "rotary_interleaved scheduler_metadata num_splits pack_gqa sm_margin return_softmax_lse"
)
VLLM_VARLEN = (
    "q k v max_seqlen_q cu_seqlens_q max_seqlen_k cu_seqlens_k seqused_k q_v dropout_p "
    "softmax_scale causal window_size softcap alibi_slopes deterministic return_attn_probs "
    "block_table return_softmax_lse out scheduler_metadata q_descale k_descale v_descale "
    "num_splits fa_version s_aux cp_world_size cp_rank cp_tot_seqused_k"
)
FLASHINFER_PLAN = (
    "qo_indptr paged_kv_indptr paged_kv_indices paged_kv_last_page_len num_qo_heads "
    "num_kv_heads head_dim_qk page_size head_dim_vo custom_mask packed_custom_mask causal "
    "pos_encoding_mode use_fp16_qk_reduction sm_scale window_left logits_soft_cap rope_scale "
    "rope_theta q_data_type kv_data_type o_data_type non_blocking prefix_len_ptr "
    "token_pos_in_items_ptr token_pos_in_items_len max_item_len_ptr seq_lens seq_lens_q "
    "block_tables max_token_per_sequence max_sequence_kv fixed_split_size disable_split_kv"
)
# run(q, paged_kv_cache, *args, ...): the rest keyword-only
FLASHINFER_RUN = (
    "q_scale k_scale v_scale out lse return_lse enable_pdl window_left sinks kv_cache_sf "
    "skip_softmax_threshold_scale_factor use_fp16_softmax uses_spcompress"
)


def bind(
    function: str, names: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The arguments by the library's parameter names (positional ones in its order); a
    TypeError, as Python's, for a name it does not have or one given twice."""
    order = names.split()
    if len(args) > len(order):
        raise TypeError(f"{function}() takes {len(order)} positional arguments")
    bound = dict(zip(order, args, strict=False))
    for name, value in kwargs.items():
        if name not in order:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
        if name in bound:
            raise TypeError(f"{function}() got multiple values for argument {name!r}")
        bound[name] = value
    return bound


def fa3_flash_attn_func(*args: Any, **kwargs: Any) -> Any:
    """``flash_attn_interface.flash_attn_func``: (B, S, H, D), bottom-right causal."""
    a = bind("flash_attn_func", FA3_FUNC, args, kwargs)
    q, k, v = a["q"], a["k"], a["v"]
    multiple = 16 // min(q.element_size(), 2)  # 16 bytes: 8 half or 16 float8 columns
    _require(q.shape[-1] % multiple == 0, f"head_size should be a multiple of {multiple}")
    _require(v.shape[-1] == q.shape[-1], "hdim_v == hdim here")
    groups = q.shape[2] // k.shape[2]
    qs, ks, vs = (
        _real(x, a.get(f"{n}_descale"), g)
        for x, n, g in ((q, "q", groups), (k, "k", 1), (v, "v", 1))
    )
    n_q, n_k = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], n_q, q.shape[2], v.shape[-1]))
    allowed = causal_rows(n_q, n_k) if a.get("causal") else (lambda i: np.ones(n_k, bool))
    for b in range(q.shape[0]):
        o, _ = attend(
            qs[b].transpose(1, 0, 2),
            ks[b].transpose(1, 0, 2),
            vs[b].transpose(1, 0, 2),
            allowed,
            scale=a.get("softmax_scale"),
            softcap=a.get("softcap") or None,
        )
        out[b] = o.transpose(1, 0, 2)
    return _out(out, q)


def causal_rows(n_queries: int, n_keys: int) -> Any:
    return causal(n_queries, n_keys, n_keys - n_queries)


def _hnd(cache: Any) -> np.ndarray:
    """NHD pages (num_blocks, page, H_k, D) as the oracle's HND, float64."""
    return np.swapaxes(cache.to(torch.float64).numpy(), 1, 2)


def paged_descaled(
    a: dict[str, Any],
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    cu_q: list[int],
    used: list[int],
    table: list[list[int]],
    *,
    leftpad: list[int] | None = None,
    **options: Any,
) -> np.ndarray:
    """The oracle's paged output; with FlashAttention's float8 descales in ``a``
    (``(num_sequences, num_heads_k)`` float32) each sequence alone on its real values:
    its q rows, and the whole cache, times its own row (a query head its key/value head's)."""
    names = ("q_descale", "k_descale", "v_descale")
    if all(a.get(name) is None for name in names):
        return paged(q, k_cache, v_cache, cu_q, used, table, leftpad=leftpad, **options)[0]
    n_seqs, n_kv = len(used), k_cache.shape[1]
    rows = {}
    for name in names:
        d = a[name]
        _require(d.dtype == torch.float32 and d.shape == (n_seqs, n_kv), f"{name} (B, H_k)")
        rows[name] = d.to(torch.float64).numpy()
    groups = q.shape[1] // n_kv
    out = np.zeros((q.shape[0], q.shape[1], v_cache.shape[-1]))
    for b in range(n_seqs):
        first, last = cu_q[b], cu_q[b + 1]
        real_q = q[first:last] * np.repeat(rows["q_descale"][b], groups)[None, :, None]
        real_k = k_cache * rows["k_descale"][b][None, :, None, None]
        real_v = v_cache * rows["v_descale"][b][None, :, None, None]
        one, _ = paged(
            real_q,
            real_k,
            real_v,
            [0, last - first],
            [used[b]],
            [table[b]],
            leftpad=None if leftpad is None else [leftpad[b]],
            **options,
        )
        out[first:last] = one
    return out


def fa3_flash_attn_with_kvcache(*args: Any, **kwargs: Any) -> Any:
    """``flash_attn_interface.flash_attn_with_kvcache`` with ``page_table`` and packed
    queries (``cu_seqlens_q``): NHD pages, cache_seqlens the end of each sequence."""
    a = bind("flash_attn_with_kvcache", FA3_KVCACHE, args, kwargs)
    _require(a.get("page_table") is not None and a.get("cu_seqlens_q") is not None, "paged")
    _require(a.get("max_seqlen_q") is not None, "max_seqlen_q is needed with cu_seqlens_q")
    q, table = a["q"], a["page_table"]
    leftpad = a.get("cache_leftpad")
    out = paged_descaled(
        a,
        q.to(torch.float64).numpy(),
        _hnd(a["k_cache"]),
        _hnd(a["v_cache"]),
        _int32("cu_seqlens_q", a["cu_seqlens_q"]),
        _int32("cache_seqlens", a["cache_seqlens"]),
        np.asarray(_int32("page_table", table)).reshape(table.shape).tolist(),
        leftpad=None if leftpad is None else _int32("cache_leftpad", leftpad),
        is_causal=a.get("causal", False),
        window=_window(a.get("window_size", (-1, -1))),
        scale=a.get("softmax_scale"),
        softcap=a.get("softcap") or None,
        chunk=a.get("attention_chunk") or None,
    )
    return _out(out, q)


def vllm_flash_attn_varlen_func(*args: Any, **kwargs: Any) -> Any:
    """``vllm.vllm_flash_attn.flash_attn_varlen_func`` with ``block_table``: the whole NHD
    cache as k and v, ``seqused_k`` instead of ``cu_seqlens_k``; FA2 refuses ``s_aux``."""
    a = bind("flash_attn_varlen_func", VLLM_VARLEN, args, kwargs)
    _require(a.get("cu_seqlens_k") is None and a.get("seqused_k") is not None, "seqused_k")
    _require(a.get("block_table") is not None, "a paged call")
    if a.get("fa_version", 2) == 2 and a.get("s_aux") is not None:
        raise NotImplementedError("FA2 does not support s_aux")
    window = a.get("window_size")
    _require(window is None or len(window) == 2, "window_size is [left, right]")
    used = _int32("seqused_k", a["seqused_k"])
    _require(max(used, default=0) <= a["max_seqlen_k"], "max_seqlen_k below a length")
    table, sinks = a["block_table"], a.get("s_aux")
    result = paged_descaled(
        a,
        a["q"].to(torch.float64).numpy(),
        _hnd(a["k"]),
        _hnd(a["v"]),
        _int32("cu_seqlens_q", a["cu_seqlens_q"]),
        used,
        np.asarray(_int32("block_table", table)).reshape(table.shape).tolist(),
        is_causal=a.get("causal", False),
        window=_window((-1, -1) if window is None else window),
        scale=a.get("softmax_scale"),
        softcap=a.get("softcap") or None,
        sinks=None if sinks is None else sinks.to(torch.float64).numpy(),
    )
    return _out(result, a["q"])


class BatchPrefillWithPagedKVCacheWrapper:
    """``flashinfer.BatchPrefillWithPagedKVCacheWrapper``: plan, then run."""

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD", **more: Any) -> None:
        _require(kv_layout in ("NHD", "HND"), "kv_layout")
        self.kv_layout = kv_layout
        self.planned: dict[str, Any] = {}

    def plan(self, *args: Any, **kwargs: Any) -> None:
        a = bind("plan", FLASHINFER_PLAN, args, kwargs)
        page_size = a["page_size"]
        indptr = _int32("paged_kv_indptr", a["paged_kv_indptr"])
        indices = _int32("paged_kv_indices", a["paged_kv_indices"])
        last = _int32("paged_kv_last_page_len", a["paged_kv_last_page_len"])
        _require(len(indices) == indptr[-1], "paged_kv_indices has paged_kv_indptr[-1] entries")
        used, table = [], []
        for b, tail in enumerate(last):
            pages = indices[indptr[b] : indptr[b + 1]]
            _require(0 < tail <= page_size if pages else tail == 0, "last_page_len in [1, P]")
            used.append((len(pages) - 1) * page_size + tail if pages else 0)
            table.append(pages or [0])
        mask = a.get("custom_mask")
        self.planned = {
            "cu_q": _int32("qo_indptr", a["qo_indptr"]),
            "used": used,
            "table": table,
            "heads": (a["num_qo_heads"], a["num_kv_heads"], a["head_dim_qk"]),
            "dim_vo": a.get("head_dim_vo") or a["head_dim_qk"],
            "page_size": page_size,
            "mask": None if mask is None else mask.numpy(),
            "causal": a.get("causal", False) and mask is None,  # ignored with a mask
            "softcap": a.get("logits_soft_cap") or None,
            "scale": a.get("sm_scale"),
            "window_left": a.get("window_left", -1),
        }

    def run(self, q: Any, paged_kv_cache: Any, *args: Any, **kwargs: Any) -> Any:
        a = bind("run", FLASHINFER_RUN, (), kwargs)
        plan = self.planned
        _require(q.shape[0] == plan["cu_q"][-1], "q must have qo_indptr[-1] rows")
        k_cache, v_cache = paged_kv_cache
        n_qo, n_kv, dim_qk = plan["heads"]
        hnd = self.kv_layout == "HND"
        page_axis, head_axis = (2, 1) if hnd else (1, 2)
        for cache, dim in ((k_cache, dim_qk), (v_cache, plan["dim_vo"])):
            _require(cache.shape[page_axis] == plan["page_size"], "page_size")
            _require(cache.shape[head_axis] == n_kv and cache.shape[3] == dim, "kv heads, dims")
        _require(q.shape[1:] == (n_qo, dim_qk), "q (tokens, num_qo_heads, head_dim_qk)")
        sinks = a.get("sinks")
        _require(sinks is None or sinks.dtype == torch.float32, "sinks float32")

        def as_hnd(cache: Any) -> np.ndarray:
            c = cache.to(torch.float64).numpy()
            return c if hnd else np.swapaxes(c, 1, 2)

        window = a.get("window_left")
        window = plan["window_left"] if window is None else window
        # the float8 cache's calibration scales (1.0 when not given): k_scale multiplies the
        # scores' scale and v_scale the output, the same as scaling the pages
        k_scale, v_scale = (
            float(1.0 if a.get(n) is None else a[n]) for n in ("k_scale", "v_scale")
        )
        result, _ = paged(
            q.to(torch.float64).numpy(),
            as_hnd(k_cache) * k_scale,
            as_hnd(v_cache) * v_scale,
            plan["cu_q"],
            plan["used"],
            plan["table"],
            is_causal=plan["causal"],
            window=(None if window < 0 else window, None),
            flat_mask=plan["mask"],
            scale=plan["scale"],
            softcap=plan["softcap"],
            sinks=None if sinks is None else sinks.to(torch.float64).numpy(),
        )
        return _out(result, q)


def flashinfer_merge_state(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> tuple[Any, Any]:
    """``flashinfer.merge_state``: ``[seq_len, num_heads, head_dim]`` outputs and float32
    ``[seq_len, num_heads]`` log-sum-exps in base 2."""
    for s in (s_a, s_b):
        _require(s.dtype == torch.float32, "s must be float32")
        _require(s.shape == v_a.shape[:2], "s is [seq_len, num_heads]")
    o, lse = merge(
        v_a.to(torch.float64).numpy(),
        s_a.to(torch.float64).numpy() * LN2,
        v_b.to(torch.float64).numpy(),
        s_b.to(torch.float64).numpy() * LN2,
    )
    return torch.from_numpy(o).to(v_a.dtype), torch.from_numpy(lse / LN2).to(torch.float32)


# FlashMLA's flash_mla_interface (deepseek-ai/FlashMLA), and vLLM's merge_attn_states
FLASH_MLA = (
    "q k_cache block_table cache_seqlens head_dim_v tile_scheduler_metadata num_splits "
    "softmax_scale causal is_fp8_kvcache indices attn_sink extra_k_cache "
    "extra_indices_in_kvcache topk_length extra_topk_length"
)
VLLM_MERGE = (
    "output prefix_output prefix_lse suffix_output suffix_lse output_lse "
    "prefill_tokens_with_context output_scale"
)


class FlashMLASchedMeta:
    """``flash_mla.FlashMLASchedMeta``: empty until the first call fills it, then bound to
    that call's shapes."""

    def __init__(self) -> None:
        self.config: tuple[Any, ...] | None = None


def flash_mla_get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FlashMLASchedMeta, None]:
    """``flash_mla.get_mla_metadata``: the arguments are the old interface's and ignored."""
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``flash_mla.flash_mla_with_kvcache``, dense decoding: ``q (B, s_q, h_q, 576)``,
    ``k_cache (num_blocks, 64, 1, 576)`` bfloat16 or float16, int32 metadata, head_dim_v
    512; the default scale ``q.shape[-1] ** -0.5``; returns ``(out, lse (B, h_q, s_q))``."""
    a = bind("flash_mla_with_kvcache", FLASH_MLA, args, kwargs)
    q, k_cache, meta = a["q"], a["k_cache"], a.get("tile_scheduler_metadata")
    _require(isinstance(meta, FlashMLASchedMeta), "tile_scheduler_metadata: FlashMLASchedMeta")
    _require(a.get("num_splits") is None, "num_splits must be None")
    _require(q.dtype in (torch.bfloat16, torch.float16) and k_cache.dtype == q.dtype, "dtype")
    _require(q.shape[-1] == 576 and k_cache.shape[-1] == 576, "head_dim should be 576")
    _require(a["head_dim_v"] == 512, "head_dim_v must be 512")
    _require(k_cache.shape[1] == 64 and k_cache.shape[2] == 1, "page_block_size 64, h_k 1")
    config = (*q.shape[:3], *k_cache.shape[1:3], bool(a.get("causal", False)))
    _require(meta.config in (None, config), "inconsistent with sched_meta")
    meta.config = config
    table, used = a["block_table"], _int32("cache_seqlens", a["cache_seqlens"])
    rows = np.asarray(_int32("block_table", table)).reshape(table.shape).tolist()
    batch, n_queries, n_heads, head_dim = q.shape
    scale = a.get("softmax_scale")
    out, lse = paged(
        q.to(torch.float64).numpy().reshape(batch * n_queries, n_heads, head_dim),
        _hnd(k_cache),
        None,
        [b * n_queries for b in range(batch + 1)],
        used,
        rows,
        value_dim=512,
        is_causal=a.get("causal", False),
        scale=head_dim**-0.5 if scale is None else scale,
    )
    lse = lse.reshape(n_heads, batch, n_queries).transpose(1, 0, 2)
    out = out.reshape(batch, n_queries, n_heads, 512)
    return torch.from_numpy(out).to(q.dtype), torch.from_numpy(lse).to(torch.float32)


FLASHINFER_MLA_PLAN = (
    "qo_indptr kv_indptr kv_indices kv_len_arr num_heads head_dim_ckv head_dim_kpe page_size "
    "causal sm_scale q_data_type kv_data_type use_profiler"
)
FLASHINFER_MLA_RUN = (
    "q_nope q_pe ckv_cache kpe_cache out lse return_lse profiler_buffer kv_len page_table "
    "return_lse_base_on_e"
)


class BatchMLAPagedAttentionWrapper:
    """``flashinfer.mla.BatchMLAPagedAttentionWrapper``: plan, then run; ``[tokens,
    num_heads]`` log-sum-exps in base 2 unless ``return_lse_base_on_e``."""

    def __init__(
        self, float_workspace_buffer: Any, use_cuda_graph: bool = False, **more: Any
    ) -> None:
        self.planned: dict[str, Any] = {}

    def plan(self, *args: Any, **kwargs: Any) -> None:
        a = bind("plan", FLASHINFER_MLA_PLAN, args, kwargs)
        _require(isinstance(a["sm_scale"], float), "sm_scale is a float, required")
        indptr = _int32("kv_indptr", a["kv_indptr"])
        indices = _int32("kv_indices", a["kv_indices"])
        _require(len(indices) >= indptr[-1], "kv_indices holds kv_indptr[-1] pages")
        self.planned = {
            **a,
            "cu_q": _int32("qo_indptr", a["qo_indptr"]),
            "used": _int32("kv_len_arr", a["kv_len_arr"]),
            "table": [indices[indptr[b] : indptr[b + 1]] or [0] for b in range(len(indptr) - 1)],
        }

    def run(self, *args: Any, **kwargs: Any) -> Any:
        a, plan = bind("run", FLASHINFER_MLA_RUN, args, kwargs), self.planned
        q_nope, q_pe, ckv, kpe = (a[n] for n in ("q_nope", "q_pe", "ckv_cache", "kpe_cache"))
        tokens, heads = plan["cu_q"][-1], plan["num_heads"]
        _require(q_nope.shape == (tokens, heads, plan["head_dim_ckv"]), "q_nope [tokens, H, ckv]")
        _require(q_pe.shape == (tokens, heads, plan["head_dim_kpe"]), "q_pe [tokens, H, kpe]")
        for cache, dim in ((ckv, plan["head_dim_ckv"]), (kpe, plan["head_dim_kpe"])):
            _require(cache.shape[1:] == (plan["page_size"], dim), "caches [pages, page_size, dim]")
        for x in (q_nope, q_pe, ckv, kpe):
            _require(x.dtype in (plan["q_data_type"], plan["kv_data_type"]), "planned dtypes")
        q, latent = (
            torch.cat(x, dim=-1).to(torch.float64).numpy() for x in ((q_nope, q_pe), (ckv, kpe))
        )
        sequences = (plan["cu_q"], plan["used"], plan["table"])
        options = {"is_causal": plan["causal"], "scale": plan["sm_scale"]}
        out, lse = paged(
            q, latent[:, None], None, *sequences, value_dim=plan["head_dim_ckv"], **options
        )
        out = torch.from_numpy(out).to(q_nope.dtype)
        if not a.get("return_lse", False):
            return out
        base = 1.0 if a.get("return_lse_base_on_e", False) else LN2
        return out, torch.from_numpy(lse.T / base).to(torch.float32)


def vllm_merge_attn_states(*args: Any, **kwargs: Any) -> None:
    """``merge_attn_states``: writes into ``output`` ``[NUM_TOKENS, NUM_HEADS, HEAD_SIZE]``
    and ``output_lse`` ``[NUM_HEADS, NUM_TOKENS]``; float32 contiguous log-sum-exps in
    natural logarithms; prefix and suffix outputs with one head stride."""
    a = bind("merge_attn_states", VLLM_MERGE, args, kwargs)
    output, o_a, o_b = a["output"], a["prefix_output"], a["suffix_output"]
    _require(o_a.stride(1) == o_b.stride(1), "matching head strides")
    _require(o_a.shape == o_b.shape == output.shape, "outputs [NUM_TOKENS, NUM_HEADS, HEAD_SIZE]")
    lse_shape = (o_a.shape[1], o_a.shape[0])
    for name in ("prefix_lse", "suffix_lse", "output_lse"):
        lse = a.get(name)
        if lse is not None:
            _require(lse.dtype == torch.float32, f"{name} must be float32")
            _require(
                lse.shape == lse_shape and lse.is_contiguous(), f"{name} [NUM_HEADS, NUM_TOKENS]"
            )
    o, lse = merge(
        o_a.to(torch.float64).numpy(),
        a["prefix_lse"].to(torch.float64).numpy().T,
        o_b.to(torch.float64).numpy(),
        a["suffix_lse"].to(torch.float64).numpy().T,
    )
    output.copy_(torch.from_numpy(o))
    if a.get("output_lse") is not None:
        a["output_lse"].copy_(torch.from_numpy(lse.T))


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for attribute, value in attributes.items():
        setattr(module, attribute, value)
    return module


def modules() -> dict[str, types.ModuleType]:
    """The stand-in modules by the names the adapters import."""
    vllm_fa = _module("vllm.vllm_flash_attn", flash_attn_varlen_func=vllm_flash_attn_varlen_func)
    flashinfer_mla = _module(
        "flashinfer.mla", BatchMLAPagedAttentionWrapper=BatchMLAPagedAttentionWrapper
    )
    found = [
        _module(
            "flash_attn_interface",
            flash_attn_func=fa3_flash_attn_func,
            flash_attn_with_kvcache=fa3_flash_attn_with_kvcache,
        ),
        _module("vllm", vllm_flash_attn=vllm_fa),
        vllm_fa,
        _module(
            "flashinfer",
            BatchPrefillWithPagedKVCacheWrapper=BatchPrefillWithPagedKVCacheWrapper,
            merge_state=flashinfer_merge_state,
            mla=flashinfer_mla,
        ),
        flashinfer_mla,
        _module(
            "flash_mla",
            get_mla_metadata=flash_mla_get_mla_metadata,
            flash_mla_with_kvcache=flash_mla_with_kvcache,
        ),
        # vLLM's v1 merge, each package on its way a module of its own
        *(_module(name) for name in ("vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops")),
        _module(
            "vllm.v1.attention.ops.merge_attn_states", merge_attn_states=vllm_merge_attn_states
        ),
    ]
    return {module.__name__: module for module in found}


def install(monkeypatch: Any) -> None:
    """Put the stand-ins in sys.modules for one test."""
    for name, module in modules().items():
        monkeypatch.setitem(sys.modules, name, module)
