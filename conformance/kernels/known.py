"""Well-known third-party kernels, so they check with no configuration.

Each entry states what the library documents; the suite then verifies it.  A kernel whose
convention a declaration can say (PyTorch's SDPA) has a declaration here; one whose
convention it cannot (a layout, a module with weights, a mask given as a function) has a
thin adapter in ``attnspec.conformance.kernels.adapters`` that only translates the convention,
with its declaration attached.  :data:`KNOWN_KERNELS` lists them all: ``attnspec check
jax.nn:dot_product_attention`` finds the adapter and the backend there, and ``attnspec
matrix`` checks every installed one.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from ...backends import SHAPE_POOLS_VARIABLE
from ..claims.declaration import qualified_name
from .adapters.flash_linear import ROWS as FLA_ROWS
from .adapters.flash_linear import Row
from .adapters.transformers_linear import ROWS as TRANSFORMERS_ROWS

_ADAPTERS = "attnspec.conformance.kernels.adapters"


@dataclass(frozen=True)
class KnownKernel:
    """One row of the conformance matrix: a kernel people use, and how to check it.

    ``name`` is what a user types (``attnspec check NAME``); ``adapter`` the declared
    callable in the spec's convention that is checked in its place (the same target when
    a declaration suffices); ``qualified_names`` the ``module.qualname`` of the library
    object(s) that ``name`` loads, by which ``attnspec check`` recognises it under any
    spelling; ``requires`` the modules that must be importable; ``device`` "cpu" or
    "cuda" (checked only where a GPU is); ``note`` what the adapter does beyond calling;
    ``gpu_only_here`` why a "cpu" row is nonetheless checked only where a GPU is (its CPU
    path costs hours on this machine), "" for none.
    """

    name: str
    adapter: str
    backend: str
    qualified_names: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    device: str = "cpu"
    note: str = ""
    env: tuple[tuple[str, str], ...] = ()
    gpu_only_here: str = ""

    def missing(self) -> str | None:
        """Why this kernel cannot be checked here (a module not installed), or None."""
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"{module} does not import here"
        return None


def _adapter(module: str, name: str) -> str:
    return f"{_ADAPTERS}.{module}:{name}"


def _recurrent_row_note(row: Row) -> str:
    """What a recurrence's row declares, in the flags that declare it."""
    return f"the library's function declared by flags, no wrapper: {' '.join(row.flags())}"


_SDPA_QUALNAMES = (
    "torch.nn.functional.scaled_dot_product_attention",
    "torch._C._nn.scaled_dot_product_attention",
)
# Why the rows look alike: a table, one row per kernel a user may name, each spelled out so
# that a reader finds a kernel's adapter, backend, names and device in one place.
KNOWN_KERNELS: tuple[KnownKernel, ...] = (
    KnownKernel(
        "torch.nn.functional:scaled_dot_product_attention",
        "torch.nn.functional:scaled_dot_product_attention",
        "torch",
        _SDPA_QUALNAMES,
        ("torch",),
        note="declaration only; the dispatcher's choice",
    ),
    KnownKernel(
        "attnspec.conformance.kernels.torch_sdpa:sdpa_math",
        "attnspec.conformance.kernels.torch_sdpa:sdpa_math",
        "torch",
        (),
        ("torch",),
        note="SDPA pinned to its math backend",
    ),
    KnownKernel(
        "attnspec.conformance.kernels.torch_sdpa:sdpa_flash",
        "attnspec.conformance.kernels.torch_sdpa:sdpa_flash",
        "torch",
        (),
        ("torch",),
        note="SDPA pinned to its CPU flash backend; batch dims flattened, head dims padded",
    ),
    KnownKernel(
        "torch.nn.attention.flex_attention:flex_attention",
        _adapter("torch", "flex_attention_block_mask"),
        "torch",
        ("torch.nn.attention.flex_attention.flex_attention",),
        ("torch",),
        note="mask and is_causal as a mask_mod in a BlockMask, bias as a score_mod",
    ),
    KnownKernel(
        _adapter("torch", "flex_attention_score_mod"),
        _adapter("torch", "flex_attention_score_mod"),
        "torch",
        (),
        ("torch",),
        note="mask, is_causal and bias all in one score_mod (-inf where masked)",
    ),
    KnownKernel(
        _adapter("torch", "flex_attention_sinks"),
        _adapter("torch", "flex_attention_sinks"),
        "torch",
        (),
        ("torch",),
        note="gpt-oss's sink logits (--sinks) in a score_mod: k and v get one more key of "
        "zeros whose score is the head's sink; mask, is_causal and bias as in "
        "flex_attention_score_mod",
    ),
    KnownKernel(
        "torch.nn:MultiheadAttention",
        _adapter("torch", "multihead_attention"),
        "torch",
        ("torch.nn.modules.activation.MultiheadAttention",),
        ("torch",),
        note="identity projections, no bias: pure attention; heads concatenated; "
        "mask inverted (True = masked out), key-only masks as key_padding_mask; "
        "need_weights=True",
    ),
    KnownKernel(
        _adapter("torch", "multihead_attention_no_weights"),
        _adapter("torch", "multihead_attention_no_weights"),
        "torch",
        (),
        ("torch",),
        note="as nn.MultiheadAttention, need_weights=False (the fast path)",
    ),
    KnownKernel(
        "jax.nn:dot_product_attention",
        _adapter("jax", "dot_product_attention"),
        "jax",
        ("jax._src.nn.functions.dot_product_attention",),
        ("jax",),
        note="(B, T, N, H) layout; head dims padded to E == Ev; implementation='xla'",
    ),
    KnownKernel(
        "flax.nnx:dot_product_attention",
        _adapter("flax", "nnx_dot_product_attention"),
        "jax",
        ("flax.nnx.nn.attention.dot_product_attention",),
        ("flax",),
        note="(..., L, H, E) layout; deterministic=True",
    ),
    KnownKernel(
        "flax.linen:dot_product_attention",
        _adapter("flax", "linen_dot_product_attention"),
        "jax",
        ("flax.linen.attention.dot_product_attention",),
        ("flax",),
        note="(..., L, H, E) layout; deterministic=True",
    ),
    *(
        KnownKernel(
            _adapter("keras", f"dot_product_attention_{backend}"),
            _adapter("keras", f"dot_product_attention_{backend}"),
            backend,
            (),
            ("keras", backend),
            env=(("KERAS_BACKEND", backend),),
            note=f"keras.ops.dot_product_attention with KERAS_BACKEND={backend}; "
            "(B, T, N, H) layout",
        )
        for backend in ("jax", "torch", "numpy")
    ),
    KnownKernel(
        _adapter("thirdparty", "local_attention"),
        _adapter("thirdparty", "local_attention"),
        "torch",
        (),
        ("local_attention",),
        note="LocalAttention(window_size=4, causal=True, exact_windowsize=True, "
        "look_backward=1) as a causal sliding window of 4 keys back",
    ),
    *(
        KnownKernel(
            _adapter("onnx", f"{prefix}gated_delta{suffix}"),
            _adapter("onnx", f"{prefix}gated_delta{suffix}"),
            "numpy",
            (),
            requires,
            note=f"LinearAttention gated_delta, {decay} decay, {how}; its own (B, T, H * d) "
            "convention through --layout packed; an absent past state passed as float32 "
            "zeros (without one ONNX returns the state in the query's dtype, REC-4.3)",
        )
        for prefix, requires, how in (
            ("", ("onnx",), "opset 27 through onnx.reference.ReferenceEvaluator"),
            ("runtime_", ("onnx", "onnxruntime"), "ONNX Runtime's CPU kernel (com.microsoft)"),
        )
        for suffix, decay in (("", "per-head"), ("_per_channel", "per-key-channel"))
    ),
    *(
        KnownKernel(
            row.target,
            _adapter("flash_linear", name),
            "torch",
            (row.target.replace(":", "."),),
            ("fla", "triton"),
            device=row.device,
            note=_recurrent_row_note(row),
        )
        for name, row in FLA_ROWS.items()
    ),
    # transformers' functions are kernels' nn.Module objects with no name of their own
    # (adapters.transformers_linear): the row is the adapter's
    *(
        KnownKernel(
            _adapter("transformers_linear", name),
            _adapter("transformers_linear", name),
            "torch",
            (),
            ("transformers",),
            note=f"{row.target}, {_recurrent_row_note(row)}",
        )
        for name, row in TRANSFORMERS_ROWS.items()
    ),
    *(
        KnownKernel(
            _adapter("onnx_attention", f"{prefix}attention_{form}"),
            _adapter("onnx_attention", f"{prefix}attention_{form}"),
            "numpy",
            (),
            requires,
            note=f"Attention {what}, {how}; 4-D (B, H, L, E) inputs, GQA by head counts, softcap",
        )
        for prefix, requires, how in (
            ("reference_", ("onnx",), "through onnx.reference.ReferenceEvaluator"),
            ("runtime_", ("onnx", "onnxruntime"), "through ONNX Runtime's CPU provider"),
        )
        for form, what in (
            ("23", "opset 23, one attn_mask (bool mask or float bias), causal top-left (no cache)"),
            (
                "kv_cache",
                "opset 24, K and V the whole cache, nonpad_kv_seqlen its valid lengths "
                "(--kv-cache --no-kv-cache-append)",
            ),
        )
    ),
    *(
        KnownKernel(
            _adapter("transformers_attention", name),
            _adapter("transformers_attention", name),
            "torch",
            (),
            ("transformers",),
            note=f"transformers' {what}; (B, H, L, E) in, its (B, L, H, Ev) output transposed "
            "back; a stand-in module (num_key_value_groups = Hq // Hkv, training=False)",
        )
        for name, what in (
            (
                "sdpa_attention",
                "integrations.sdpa_attention.sdpa_attention_forward (attn_mask "
                "bool or float; is_causal only without a mask)",
            ),
            ("eager_attention", "Llama's eager_attention_forward (an additive float mask)"),
            ("gpt_oss_eager_attention", "gpt-oss's eager_attention_forward (module.sinks)"),
        )
    ),
    KnownKernel(
        _adapter("transformers_attention", "flex_attention"),
        _adapter("transformers_attention", "flex_attention"),
        "torch",
        (),
        ("transformers",),
        note="transformers' integrations.flex_attention.flex_attention_forward (compiled by "
        "torch.compile, recompilation limits raised; a float mask broadcast to (B, H, Lq, Lk); "
        "softcap); (B, H, L, E) in, its (B, L, H, Ev) output transposed back; shape pools "
        "(ATTNSPEC_SHAPE_POOLS=1), as for a library that compiles per shape",
        env=((SHAPE_POOLS_VARIABLE, "1"),),
        gpu_only_here="torch.compile compiles it per shape, dtype and mask: 30-100 s a "
        "compilation on this machine's 2 shared cores, about 5 hours for the quick profile, "
        "and Inductor's CPU FlexAttention aborts the process on a captured mask "
        "(docs/divergences.md#transformers-flex-cpu-mask-abort); attnspec check runs it",
    ),
    KnownKernel(
        _adapter("thirdparty", "performer_favor"),
        _adapter("thirdparty", "performer_favor"),
        "torch",
        (),
        ("performer_pytorch",),
        note="FastAttention(nb_features=M) with its projection drawn from the seed "
        "on every call (the redraw)",
    ),
    KnownKernel(
        _adapter("thirdparty", "fast_transformers_linear"),
        _adapter("thirdparty", "fast_transformers_linear"),
        "torch",
        (),
        ("fast_transformers",),
        note="LinearAttention (elu(x) + 1), eps declared",
    ),
    *(
        KnownKernel(
            _adapter("torch", f"sdpa_cuda_{backend}"),
            _adapter("torch", f"sdpa_cuda_{backend}"),
            "torch",
            (),
            ("torch",),
            device="cuda",
            note=f"SDPA pinned to its CUDA {backend} backend",
        )
        for backend in ("math", "efficient", "flash", "cudnn")
    ),
    KnownKernel(
        _adapter("jax", "dot_product_attention_cudnn"),
        _adapter("jax", "dot_product_attention_cudnn"),
        "jax",
        (),
        ("jax",),
        device="cuda",
        note="jax.nn.dot_product_attention(implementation='cudnn')",
    ),
    KnownKernel(
        "flash_attn:flash_attn_func",
        _adapter("thirdparty", "flash_attn_func"),
        "torch",
        ("flash_attn.flash_attn_interface.flash_attn_func",),
        ("flash_attn",),
        device="cuda",
        note="(B, S, H, D) layout; bottom-right causal",
    ),
    # the serving libraries (issue 32): adapters written for the device run, wired on CPU
    # against stand-ins (tests/conformance/test_serving_gpu_adapters.py)
    KnownKernel(
        "flash_attn_interface:flash_attn_func",
        _adapter("flash_attn3", "flash_attn3_func"),
        "torch",
        ("flash_attn_interface.flash_attn_func",),
        ("flash_attn_interface",),
        device="cuda",
        note="FlashAttention 3; (B, S, H, D) layout; bottom-right causal; softcap; "
        "head dims zero-padded to multiples of 8",
    ),
    *(
        KnownKernel(
            _adapter("flash_attn3", name),
            _adapter("flash_attn3", name),
            "torch",
            (),
            ("flash_attn_interface",),
            device="cuda",
            note=note,
        )
        for name, note in (
            (
                "flash_attn3_func_fp8",
                "FlashAttention 3's float8 forward: e4m3fn q, k, v with (B, H_kv) descales, "
                "bfloat16 output, P rounded to e4m3fn (--fp8-weights); softcap (QUANT-5)",
            ),
            (
                "flash_attn3_paged",
                "flash_attn_with_kvcache(page_table=, cache_seqlens=, cu_seqlens_q=): a paged "
                "mixed batch, NHD pages; cache_leftpad, window, attention_chunk, softcap",
            ),
            (
                "flash_attn3_paged_fp8",
                "flash_attn_with_kvcache(page_table=, ...) on e4m3fn q and pages with "
                "(num_sequences, H_kv) descales (QUANT-6); bfloat16 output",
            ),
        )
    ),
    *(
        KnownKernel(
            name,
            _adapter("vllm_flash", adapter),
            "torch",
            qualified,
            ("vllm",),
            device="cuda",
            note=f"vLLM's flash_attn_varlen_func(block_table=, seqused_k=), {how}; NHD "
            "pages of 16; window, softcap",
        )
        for name, adapter, qualified, how in (
            (
                "vllm.vllm_flash_attn:flash_attn_varlen_func",
                "vllm_flash_attn_varlen",
                ("vllm.vllm_flash_attn.flash_attn_interface.flash_attn_varlen_func",),
                "fa_version=2",
            ),
            (
                _adapter("vllm_flash", "vllm_flash_attn_varlen_fa3"),
                "vllm_flash_attn_varlen_fa3",
                (),
                "fa_version=3, sinks as s_aux",
            ),
            (
                _adapter("vllm_flash", "vllm_flash_attn_varlen_fa3_fp8"),
                "vllm_flash_attn_varlen_fa3_fp8",
                (),
                "fa_version=3 on e4m3fn q and pages with (num_sequences, H_kv) descales "
                "(QUANT-6), sinks as s_aux",
            ),
        )
    ),
    KnownKernel(
        "flashinfer:BatchPrefillWithPagedKVCacheWrapper",
        _adapter("flashinfer", "batch_prefill_paged"),
        "torch",
        ("flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper",),
        ("flashinfer",),
        device="cuda",
        note="plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, ...)"
        " from the block table, run(q, (k_cache, v_cache)); HND pages; softcap, custom_mask "
        "(causal folded in), sinks; head dims zero-padded to 64, 128 or 256",
    ),
    KnownKernel(
        _adapter("flashinfer", "batch_prefill_paged_fp8_cache"),
        _adapter("flashinfer", "batch_prefill_paged_fp8_cache"),
        "torch",
        (),
        ("flashinfer",),
        device="cuda",
        note="the same wrapper over e4m3 or e5m2 pages beside float16 or bfloat16 q, "
        "run(..., k_scale=, v_scale=) with Python-float scales (QUANT-8)",
    ),
    KnownKernel(
        "flashinfer:merge_state",
        _adapter("flashinfer", "merge_state"),
        "torch",
        ("flashinfer.cascade.merge_state",),
        ("flashinfer",),
        device="cuda",
        note="declaration only: --merge 2 --merge-out-layout lhd --merge-lse-layout lh",
    ),
    # FlashMLA's and FlashInfer's paged MLA (MLA-4) and vLLM's merge (MERGE-1), by adapters
    *(
        KnownKernel(name, _adapter(module, adapter), "torch", qualified, (library,), "cuda", note)
        for name, module, adapter, qualified, library, note in (
            (
                "flash_mla:flash_mla_with_kvcache",
                "flash_mla",
                "flash_mla_with_kvcache",
                ("flash_mla.flash_mla_interface.flash_mla_with_kvcache",),
                "flash_mla",
                "FlashMLA's absorbed MLA over paged latent pages (MLA-4) with get_mla_metadata "
                "added per call; pages of 64, E = 576, Ev = 512, (out, lse); no softmax_scale "
                "means 1/sqrt(576) (MLA-5)",
            ),
            (
                "flashinfer:BatchMLAPagedAttentionWrapper",
                "flashinfer",
                "batch_mla_paged",
                ("flashinfer.mla.BatchMLAPagedAttentionWrapper",),
                "flashinfer",
                "plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, ...) from the block table, "
                "run(q_nope, q_pe, ckv, kpe) on the latent pages split at 512 (MLA-4); "
                "sm_scale required; its base-2 lse returned natural",
            ),
            (
                "vllm.v1.attention.ops.merge_attn_states:merge_attn_states",
                "vllm_flash",
                "merge_attn_states",
                (
                    "vllm.v1.attention.ops.merge_attn_states.merge_attn_states",
                    "vllm.attention.ops.merge_attn_states.merge_attn_states",
                ),
                "vllm",
                "merge_attn_states(output, prefix_output, prefix_lse, suffix_output, "
                "suffix_lse, output_lse) into buffers allocated here; --merge e "
                "--merge-out-layout lhd (lse [num_heads, num_tokens], natural log)",
            ),
        )
    ),
    KnownKernel(
        "xformers.ops:memory_efficient_attention",
        _adapter("thirdparty", "xformers_memory_efficient"),
        "torch",
        ("xformers.ops.fmha.memory_efficient_attention",),
        ("xformers",),
        device="cuda",
        note="(B, M, H, K) layout; mask as an additive bias",
    ),
)


def _entry_of_target(target: str) -> KnownKernel | None:
    for entry in KNOWN_KERNELS:
        if target in (entry.name, entry.adapter):
            return entry
    return None


def known_kernel(fn_or_target: Any) -> KnownKernel | None:
    """The matrix row of a loaded kernel (by qualified name) or of a target string."""
    if isinstance(fn_or_target, str):
        return _entry_of_target(fn_or_target)
    name = qualified_name(fn_or_target)
    for entry in KNOWN_KERNELS:
        if name in entry.qualified_names:
            return entry
    return None


_KERAS_OPS = "keras.src.ops.nn.dot_product_attention"


def known_backend(target: Any) -> str | None:
    """The backend a known kernel is checked on, when none was asked for."""
    entry = known_kernel(target) if isinstance(target, str) else None
    if entry is None and isinstance(target, str):
        module, _, attribute = target.rpartition(":")
        if module == "keras.ops" and attribute == "dot_product_attention":
            return os.environ.get("KERAS_BACKEND") or None
    return None if entry is None else entry.backend


def known_adapter(fn: Any) -> Any:
    """The declared adapter checked in place of a known library kernel (``fn`` itself
    when it needs none, or is not known)."""
    from ..claims.loading import load_kernel

    if qualified_name(fn) == _KERAS_OPS:  # whichever backend keras was imported with
        import keras

        return load_kernel(_adapter("keras", f"dot_product_attention_{keras.backend.backend()}"))
    entry = known_kernel(fn)
    if entry is None or entry.adapter == entry.name:
        return fn
    return load_kernel(entry.adapter)


# Failures of well-known kernels confirmed by hand against the float64 oracle and written up
# in docs/divergences.md; the demo reports them as such instead of as unexplained failures.
_CAUSAL_SCALE_ZERO = "docs/divergences.md#torch-causal-scale-zero"
# --backward: FlexAttention refuses inputs that require grad on the CPU, so every gradients-*
# property fails with that NotImplementedError (checked by hand, torch 2.13.0)
_FLEX_CPU_BACKWARD = "docs/divergences.md#flex-cpu-backward"


def _empty_row_gradients(link: str) -> dict[str, str]:
    """--backward: a kernel whose fully masked row is mean(V) (SDPA-5.1) has that row's
    gradients, not 0: they fail linearity (the definition's bound there is 0), BWD-3, BWD-4."""
    return dict.fromkeys(
        ("gradients-linear-in-upstream", "gradients-excluded-keys-zero", "gradients-empty-rows"),
        link,
    )


_FLEX_NO_CPU_BACKWARD = {
    f"gradients-{name}": _FLEX_CPU_BACKWARD
    for name in (
        *("linear-in-upstream", "softmax-identity", "layout-independence", "gqa-reduction"),
        *("bias-reduction", "excluded-keys-zero", "empty-rows", "finite", "alibi"),
        *("log-sum-exp", "shape-dtype", "deterministic", "match-reference"),
        *("within-flash-rule", "batch-composition"),
    )
}
# excluded logits filled above s + finfo.min: rows whose allowed keys all carry finfo.min
_FILL_OUTRANKS_MIN_BIAS = "docs/divergences.md#jax-fill-outranks-min-bias"
_JAX_MASKED_NAN = "docs/divergences.md#jax-masked-nan"
_FLAX_NNX_HEAD_DIMS = "docs/divergences.md#flax-nnx-head-dims"
_FLAX_BATCH_BROADCAST = "docs/divergences.md#flax-batch-broadcast"
_LINEN_FLOAT16_ACCURACY = "docs/divergences.md#flax-linen-float16-accuracy"
_KERAS_JAX_HEAD_DIMS = "docs/divergences.md#keras-jax-head-dims"
_KERAS_NUMPY_FLOAT16 = "docs/divergences.md#keras-numpy-float16"
_KERAS_TORCH_MASK_FILL = "docs/divergences.md#keras-torch-mask-fill"
_TORCH_SDPA_DIVERGENCES = {
    "nan-propagates": "docs/divergences.md#torch-nan-query (pytorch #141128)",
    "mask-broadcast": "docs/divergences.md#torch-1d-mask",
    "batch-broadcast": "docs/divergences.md#torch-empty-broadcast",
    # the same empty-query shortcut on the fixed corner shapes (q's batch (1,), k's (2,))
    "batch-broadcast-corners": "docs/divergences.md#torch-empty-broadcast",
    # the quick profile's "causal with scale 0" and "causal with a negative scale"
    # combinations meet it in these (layout-independence where a strided input takes the
    # math backend, which gives the definition, against the NaN of the contiguous call;
    # same-shape-new-arguments where its second call is causal with scale 0)
    "matches-reference": _CAUSAL_SCALE_ZERO,
    "output-in-value-hull": _CAUSAL_SCALE_ZERO,
    "layout-independence": _CAUSAL_SCALE_ZERO,
    "layout-corners": _CAUSAL_SCALE_ZERO,
    "gqa-mapping": _CAUSAL_SCALE_ZERO,
    "same-shape-new-arguments": _CAUSAL_SCALE_ZERO,
    "masked-nonfinite-ignored": "docs/divergences.md#torch-masked-nan (pytorch #101967)",
    # --backward: the NaN rows' gradients (spec/backward.md); BWD-18's and BWD-19's quick
    # problems meet them too (causal with scale 0, checked by hand, 2026-12-07)
    "gradients-match-reference": _CAUSAL_SCALE_ZERO,
    "gradients-within-flash-rule": _CAUSAL_SCALE_ZERO,
    "gradients-batch-composition": _CAUSAL_SCALE_ZERO,
}
# ONNX's Attention (adapters.onnx_attention): sqrt(scale), empty lengths, mask shapes,
# float16 scores, and the masked NaN / head-count SHOULDs
_ONNX_SCALE = "docs/divergences.md#onnx-scale-sqrt"
_ONNX_EMPTY = "docs/divergences.md#onnx-empty-lengths"
_ONNX_MASK_SHAPES = "docs/divergences.md#onnx-mask-shapes"
_ONNX_FLOAT16 = "docs/divergences.md#onnx-float16-scores"
_ONNX_MASKED_NAN = "docs/divergences.md#onnx-masked-nan"
# ONNX Runtime refuses a scale <= 0 when the session is created: the first failure of these
_ONNX_RUNTIME_SCALE_FIRST = (
    "value-head-dim",
    "output-shape-dtype",
    "inputs-unmodified",
    "layout-independence",
    "explicit-scale",
    "mask-polarity",
    "bias-semantics",
    "causal-zeros",
    "causal-alignment",
    "empty-rows-zero",
    "gqa-mapping",
    "rows-sum-to-one",
    "output-in-value-hull",
    "matches-reference",
    "deterministic",
    "query-permutation",
    "batch-head-independence",
    "value-linearity",
    "same-shape-new-arguments",
    "many-calls",
    "masked-values-ignored",
    "nan-propagates",
    "softcap-matches-reference",
)
_ONNX_REFERENCE_SCALE_FIRST = (
    "explicit-scale",
    "mask-polarity",
    "bias-semantics",
    "mask-and-causal",
    "causal-alignment",
    "gqa-mapping",
    "rows-sum-to-one",
    "output-in-value-hull",
    "matches-reference",
    "same-shape-new-arguments",
    "many-calls",
    "softcap-matches-reference",
)
_ONNX_KV_CACHE = {
    "kv-cache-matches-reference": _ONNX_EMPTY,
    "kv-cache-stale-positions": _ONNX_EMPTY,
    # the empty cache fails first; NaN past the lengths leaks too (#onnx-cache-nan)
    "kv-cache-nan-past-length": _ONNX_EMPTY,
    "packed-same-shape-new-arguments": _ONNX_EMPTY,
}
_ONNX = "attnspec.conformance.kernels.adapters.onnx_attention."
# transformers' attention functions (adapters.transformers_attention)
_HF_FLOAT32_SOFTMAX = "docs/divergences.md#transformers-eager-float32-softmax"
_HF_FLOAT16 = "docs/divergences.md#transformers-eager-float16-scores"
_HF = "attnspec.conformance.kernels.adapters.transformers_attention."
_HF_ONE_QUERY = "docs/divergences.md#transformers-sdpa-one-query"
# sdpa_attention_forward: its own one-query causal rule and empty-query reshape, and
# PyTorch's SDPA's divergences through it
_HF_SDPA = {
    **dict.fromkeys(
        ("causal-zeros", "causal-alignment", "output-in-value-hull", "matches-reference"),
        _HF_ONE_QUERY,
    ),
    "many-calls": _HF_ONE_QUERY,
    "empty-size-corners": "docs/divergences.md#transformers-sdpa-empty-queries",
    "empty-sizes": "docs/divergences.md#transformers-sdpa-empty-queries",
    **dict.fromkeys(
        ("layout-corners", "layout-independence", "gqa-mapping", "same-shape-new-arguments"),
        _CAUSAL_SCALE_ZERO,
    ),
    "mask-broadcast": _TORCH_SDPA_DIVERGENCES["mask-broadcast"],
    "nan-propagates": _TORCH_SDPA_DIVERGENCES["nan-propagates"],
    "masked-nonfinite-ignored": _TORCH_SDPA_DIVERGENCES["masked-nonfinite-ignored"],
    "gqa-rejects-bad-heads": "docs/divergences.md#transformers-gqa-heads",
    # --backward: its forward raises on no queries (BWD-18's and BWD-19's too, 2026-12-07)
    **dict.fromkeys(
        (
            *("gradients-match-reference", "gradients-within-flash-rule"),
            "gradients-batch-composition",
        ),
        "docs/divergences.md#transformers-sdpa-empty-queries",
    ),
}
_HF_EAGER = {
    **dict.fromkeys(
        (
            *("default-scale", "explicit-scale", "bias-semantics", "gqa-mapping"),
            *("rows-sum-to-one", "matches-reference", "key-permutation"),
            *("bias-shift-invariance", "same-shape-new-arguments", "many-calls"),
        ),
        _HF_FLOAT32_SOFTMAX,
    ),
    "empty-rows-zero": "docs/divergences.md#transformers-eager-empty-rows",
    "large-logits": _HF_FLOAT16,
    "gqa-rejects-bad-heads": "docs/divergences.md#transformers-gqa-heads",
    # --backward: the float32 softmax of float64 scores, in the gradients (checked by hand)
    **dict.fromkeys(
        (
            *("gradients-linear-in-upstream", "gradients-softmax-identity"),
            *("gradients-layout-independence", "gradients-gqa-reduction"),
            *("gradients-bias-reduction", "gradients-match-reference"),
            # the float64 padded anchor: finfo(float64).min is -inf in float32, a NaN row
            "gradients-batch-composition",
        ),
        _HF_FLOAT32_SOFTMAX,
    ),
    # BWD-18's float16 problem: q . k beyond 65504 in its float16 matmul, a NaN row
    # (checked by hand, 2026-12-07)
    "gradients-within-flash-rule": _HF_FLOAT16,
}
# flash-linear-attention's naive forms (adapters.flash_linear): a float32 output for half
# precision inputs, met by every property's first call; naive_chunk_kda's length assertion
_FLA_FLOAT32_OUTPUT = "docs/divergences.md#fla-naive-float32-output"
_FLA_KDA_LENGTH = "docs/divergences.md#fla-naive-chunk-kda-length"
_RECURRENT_CONTRACT = (
    *("recurrent-zero-gate", "recurrent-state-passing", "recurrent-decode"),
    *("recurrent-linearity", "recurrent-independence", "recurrent-views"),
)
_RECURRENT_CHUNKED = (*_RECURRENT_CONTRACT, "recurrent-chunk-size", "recurrent-matches-reference")
_FLA_NAIVE = "fla.ops.gated_delta_rule.naive."
# jax.nn.dot_product_attention, jitted or not.  SDPA-5.1 is waived by its adapters; these two
# failed only on fully masked rows (their minimal cases' masks are all False), the waived
# divergence
_JAX_NN = {
    "rows-sum-to-one": "docs/divergences.md#jax-empty-rows",
    "value-linearity": "docs/divergences.md#jax-empty-rows",
    "masked-nonfinite-ignored": _JAX_MASKED_NAN,
    # its anchor "padded batch ..., finfo.min bias, an element padded entirely"
    "causal-zeros": _FILL_OUTRANKS_MIN_BIAS,
    # the fixed corner: every bias entry finfo.min, is_causal (checked by hand, 2026-12-06)
    "min-bias-corners": _FILL_OUTRANKS_MIN_BIAS,
    # --backward, the same anchor: dv of a key that the mask and the causal rule exclude from
    # every row of the element padded entirely (checked by hand, 2026-12-07)
    "gradients-match-reference": _FILL_OUTRANKS_MIN_BIAS,
    # --backward, its fixed problems with every bias entry finfo.min beside a mask or the
    # causal rule: dv of a key no query may attend (as in the minimal case of the write-up)
    "gradients-excluded-keys-zero": _FILL_OUTRANKS_MIN_BIAS,
}
_DIVERGENCES: dict[str, dict[str, str]] = {
    _FLA_NAIVE + "naive_recurrent_gated_delta_rule": dict.fromkeys(
        (*_RECURRENT_CONTRACT, "recurrent-zero-beta", "recurrent-matches-reference"),
        _FLA_FLOAT32_OUTPUT,
    ),
    _FLA_NAIVE + "naive_chunk_gated_delta_rule": dict.fromkeys(
        (*_RECURRENT_CHUNKED, "recurrent-zero-beta"), _FLA_FLOAT32_OUTPUT
    ),
    "fla.ops.simple_gla.naive.naive_chunk_simple_gla": dict.fromkeys(
        _RECURRENT_CHUNKED, _FLA_FLOAT32_OUTPUT
    ),
    "fla.ops.kda.naive.naive_chunk_kda": dict.fromkeys(
        (*_RECURRENT_CHUNKED, "recurrent-zero-beta", "recurrent-equal-channel-gates"),
        _FLA_KDA_LENGTH,
    ),
    _HF + "eager_attention": _HF_EAGER,
    _HF + "sdpa_attention": _HF_SDPA,
    _HF + "gpt_oss_eager_attention": {
        "empty-rows-zero": _HF_EAGER["empty-rows-zero"],  # its -inf sink: no sink
        "large-logits": _HF_FLOAT16,
        "sinks-matches-reference": _HF_FLOAT16,
        "bias-semantics": _HF_FLOAT16,  # bfloat16 scores rounded with the bias
    },
    _ONNX + "reference_attention_23": {
        **dict.fromkeys(_ONNX_REFERENCE_SCALE_FIRST, _ONNX_SCALE),
        "empty-size-corners": _ONNX_EMPTY,
        "no-keys-zero": _ONNX_EMPTY,
        "mask-broadcast": _ONNX_MASK_SHAPES,
        "large-logits": _ONNX_FLOAT16,
        "masked-values-ignored": _ONNX_FLOAT16,
        "masked-nonfinite-ignored": _ONNX_MASKED_NAN,
        "gqa-rejects-bad-heads": "docs/divergences.md#onnx-gqa-heads",
    },
    _ONNX + "runtime_attention_23": {
        **dict.fromkeys(_ONNX_RUNTIME_SCALE_FIRST, _ONNX_SCALE),
        "empty-size-corners": _ONNX_EMPTY,
        "empty-sizes": _ONNX_EMPTY,
        "no-keys-zero": _ONNX_EMPTY,
        "mask-broadcast": _ONNX_MASK_SHAPES,
        "mask-and-causal": _ONNX_MASK_SHAPES,
        # the padded anchor's (B, 1, 1, Lk) bias
        "key-permutation": _ONNX_MASK_SHAPES,
        "bias-shift-invariance": _ONNX_MASK_SHAPES,
        "masked-nonfinite-ignored": _ONNX_MASKED_NAN,
    },
    _ONNX + "reference_attention_kv_cache": _ONNX_KV_CACHE,
    _ONNX + "runtime_attention_kv_cache": _ONNX_KV_CACHE,
    "torch.nn.functional.scaled_dot_product_attention": _TORCH_SDPA_DIVERGENCES,
    "torch._C._nn.scaled_dot_product_attention": _TORCH_SDPA_DIVERGENCES,
    "attnspec.conformance.kernels.torch_sdpa.sdpa_math": {
        "masked-nonfinite-ignored": _TORCH_SDPA_DIVERGENCES["masked-nonfinite-ignored"],
        "batch-broadcast": _TORCH_SDPA_DIVERGENCES["batch-broadcast"],
        "batch-broadcast-corners": _TORCH_SDPA_DIVERGENCES["batch-broadcast-corners"],
    },
    "attnspec.conformance.kernels.torch_sdpa.sdpa_flash": {
        "nan-propagates": _TORCH_SDPA_DIVERGENCES["nan-propagates"],
        "masked-nonfinite-ignored": _TORCH_SDPA_DIVERGENCES["masked-nonfinite-ignored"],
        "matches-reference": _CAUSAL_SCALE_ZERO,
        "rows-sum-to-one": _CAUSAL_SCALE_ZERO,
        "output-in-value-hull": _CAUSAL_SCALE_ZERO,
        "causal-alignment": _CAUSAL_SCALE_ZERO,
        "gqa-mapping": _CAUSAL_SCALE_ZERO,
        # its broadcast batch is expanded and flattened: causal with scale 0 again
        "batch-broadcast": _CAUSAL_SCALE_ZERO,
        "layout-independence": "docs/divergences.md#torch-flash-strided",
        # its fixed strided-v corner: "No available kernel" (checked by hand, 2026-12-06)
        "layout-corners": "docs/divergences.md#torch-flash-strided",
        # repeated calls whose later call is causal with scale 0 (SDPA-7.8): NaN again
        "same-shape-new-arguments": _CAUSAL_SCALE_ZERO,
        "many-calls": _CAUSAL_SCALE_ZERO,
        # masked-values-ignored (SDPA-8.1) is gone: it was this adapter's own padding
        # (docs/divergences.md#torch-masked-overflow, torch_sdpa.scale_for_padding)
        # --backward: no gradient for an additive mask, strided inputs refused as forward
        "gradients-bias-reduction": "docs/divergences.md#torch-flash-bias-grad",
        "gradients-finite": "docs/divergences.md#torch-flash-bias-grad",
        "gradients-match-reference": "docs/divergences.md#torch-flash-bias-grad",
        "gradients-layout-independence": "docs/divergences.md#torch-flash-strided",
        # its float16 problem with a bias (checked by hand: "No available kernel" in float16)
        "gradients-shape-dtype": "docs/divergences.md#torch-flash-bias-grad",
        # BWD-18's and BWD-19's float16 problems with a bias: the same refusal (2026-12-07)
        "gradients-within-flash-rule": "docs/divergences.md#torch-flash-bias-grad",
        "gradients-batch-composition": "docs/divergences.md#torch-flash-bias-grad",
        # its 5 x 9 problem with every bias entry finfo.min: the same refusal (2026-12-07)
        "gradients-excluded-keys-zero": "docs/divergences.md#torch-flash-bias-grad",
    },
    # need_weights=False goes through SDPA's CPU flash path: its NaN query and masked NaN
    "attnspec.conformance.kernels.adapters.torch.multihead_attention_no_weights": {
        "nan-propagates": _TORCH_SDPA_DIVERGENCES["nan-propagates"],
        "masked-nonfinite-ignored": _TORCH_SDPA_DIVERGENCES["masked-nonfinite-ignored"],
        # the V = I anchor of Ev = 2063 through the identity projections: the adapter's cost
        "rows-sum-to-one": "docs/divergences.md#mha-no-weights-memory",
        "empty-rows-zero": "docs/divergences.md#mha-no-weights-memory",
        "bias-semantics": "docs/divergences.md#mha-no-weights-memory",
    },
    "attnspec.conformance.kernels.adapters.torch.flex_attention_score_mod": {
        "masked-nonfinite-ignored": "docs/divergences.md#flex-masked-nan",
        **_FLEX_NO_CPU_BACKWARD,
    },
    # the sink's key of zeros changes nothing of it: 0 * NaN from a masked value
    "attnspec.conformance.kernels.adapters.torch.flex_attention_sinks": {
        "masked-nonfinite-ignored": "docs/divergences.md#flex-masked-nan",
    },
    "torch.nn.attention.flex_attention.flex_attention": {
        "masked-nonfinite-ignored": "docs/divergences.md#flex-masked-nan",
        **_FLEX_NO_CPU_BACKWARD,
    },
    "attnspec.conformance.kernels.adapters.keras.dot_product_attention_torch": {
        "empty-rows-zero": "docs/divergences.md#keras-empty-rows",
        # drawn around fully masked rows they still fail on causal with scale 0 (SDPA's)
        "layout-independence": "docs/divergences.md#keras-torch-sdpa",
        "matches-reference": "docs/divergences.md#keras-torch-sdpa",
        "gqa-rejects-bad-heads": "docs/divergences.md#keras-gqa-heads",
        "nan-propagates": "docs/divergences.md#keras-torch-sdpa",
        "mask-broadcast": "docs/divergences.md#keras-torch-sdpa",
        "output-in-value-hull": "docs/divergences.md#keras-torch-sdpa",
        "gqa-mapping": "docs/divergences.md#keras-torch-sdpa",
        "masked-nonfinite-ignored": "docs/divergences.md#keras-torch-sdpa",
        # the boolean mask becomes a finite additive fill that large masked scores pass
        "masked-values-ignored": _KERAS_TORCH_MASK_FILL,
        # --backward: the gradients of its mean(V) rows, not even those of its forward
        # (checked by hand), drawn ones too
        **_empty_row_gradients("docs/divergences.md#keras-empty-rows"),
        "gradients-match-reference": "docs/divergences.md#keras-empty-rows",
        # BWD-18's float16 row of no key: dv = dO of the uniform row (2026-12-07)
        "gradients-within-flash-rule": "docs/divergences.md#keras-empty-rows",
    },
    "attnspec.conformance.kernels.adapters.keras.dot_product_attention_numpy": {
        "empty-rows-zero": "docs/divergences.md#keras-empty-rows",
        "gqa-rejects-bad-heads": "docs/divergences.md#keras-gqa-heads",
        "gqa-mapping": "docs/divergences.md#keras-numpy-gqa",
        # float16 scores: overflowing, and rounded beyond TOL-2 (contiguous calls too)
        "large-logits": _KERAS_NUMPY_FLOAT16,
        "matches-reference": _KERAS_NUMPY_FLOAT16,
        "layout-independence": _KERAS_NUMPY_FLOAT16,
        # q.k beyond 65504 in float16 (78510 on the quick case): an inf score, a NaN row
        "rows-sum-to-one": _KERAS_NUMPY_FLOAT16,
        # float16 P V on long rows of one top key (exact scores)
        "long-peaked-rows": "docs/divergences.md#keras-numpy-float16-pv",
        # float16 scores: rounded under a bias, and a masked key's overflow (inf - inf)
        "bias-semantics": _KERAS_NUMPY_FLOAT16,
        "mask-polarity": _KERAS_NUMPY_FLOAT16,
        # a copy of jax.nn's XLA path: its fill and its masked NaN value
        "causal-zeros": _FILL_OUTRANKS_MIN_BIAS,
        "masked-nonfinite-ignored": _JAX_MASKED_NAN,
    },
    "jax._src.nn.functions.dot_product_attention": _JAX_NN,
    # the same function under jax.jit (conformance/kernels/jax_jitted.py), not a matrix row
    "attnspec.conformance.kernels.jax_jitted.jitted_dot_product_attention": _JAX_NN,
    # flax 0.12.8 (docs/divergences.md#flax-empty-rows ... #flax-linen-float16-accuracy)
    "flax.nnx.dot_product_attention": {
        "empty-rows-zero": "docs/divergences.md#flax-empty-rows",
        "batch-broadcast": _FLAX_BATCH_BROADCAST,
        "value-head-dim": _FLAX_NNX_HEAD_DIMS,
        "score-variance": _FLAX_NNX_HEAD_DIMS,  # its V = I_2: Ev = 2, E = 16
        "masked-nonfinite-ignored": _JAX_MASKED_NAN,
        # it calls jax.nn.dot_product_attention
        "causal-zeros": _FILL_OUTRANKS_MIN_BIAS,
        # --backward: the gradients of its mean(V) rows (checked by hand); Ev != E refused
        **_empty_row_gradients("docs/divergences.md#flax-empty-rows"),
        "gradients-match-reference": _FLAX_NNX_HEAD_DIMS,
        # BWD-18's float16 problem with a row of no key: its dv is that of a uniform row
        # (checked by hand against float64, 2026-12-07)
        "gradients-within-flash-rule": "docs/divergences.md#flax-empty-rows",
    },
    "flax.linen.dot_product_attention": {
        "empty-rows-zero": "docs/divergences.md#flax-empty-rows",
        "batch-broadcast": _FLAX_BATCH_BROADCAST,
        "large-logits": "docs/divergences.md#flax-linen-float16",
        "masked-nonfinite-ignored": _JAX_MASKED_NAN,
        # float16 scores rounded to float16 (contiguous calls, the -inf bias call, too)
        "matches-reference": _LINEN_FLOAT16_ACCURACY,
        # a shifted bias moves s + b to another float16 spacing (its unshifted call alone
        # is outside TOL-2)
        "bias-shift-invariance": _LINEN_FLOAT16_ACCURACY,
        "mask-wins-over-bias": _LINEN_FLOAT16_ACCURACY,
        # its mask fill finfo(float16).min ties with or outranks s + finfo.min (fixed corners)
        "min-bias-corners": "docs/divergences.md#flax-linen-fill-ties-min-bias",
        # --backward: the gradients of its mean(V) rows (checked by hand), drawn ones too
        **_empty_row_gradients("docs/divergences.md#flax-empty-rows"),
        "gradients-match-reference": "docs/divergences.md#flax-empty-rows",
        # BWD-18's float16 problem with a row of no key, as flax.nnx's (2026-12-07)
        "gradients-within-flash-rule": "docs/divergences.md#flax-empty-rows",
    },
    "attnspec.conformance.kernels.adapters.keras.dot_product_attention_jax": {
        "empty-rows-zero": "docs/divergences.md#keras-empty-rows",
        # jax.nn rejects Ev != E; Keras's fallback reshapes the output to q's shape (or
        # fails first on a mask of fewer than 4 dims); score-variance's V = I_2 has Ev = 2
        "value-head-dim": _KERAS_JAX_HEAD_DIMS,
        "score-variance": _KERAS_JAX_HEAD_DIMS,
        # it calls jax.nn.dot_product_attention
        "causal-zeros": _FILL_OUTRANKS_MIN_BIAS,
        "masked-nonfinite-ignored": _JAX_MASKED_NAN,
        # --backward: the gradients of its mean(V) rows (checked by hand); Ev != E refused
        **_empty_row_gradients("docs/divergences.md#keras-empty-rows"),
        "gradients-match-reference": _KERAS_JAX_HEAD_DIMS,
        # BWD-18's and BWD-19's problem of Ev != E: the same reshape (2026-12-07)
        "gradients-within-flash-rule": _KERAS_JAX_HEAD_DIMS,
        "gradients-batch-composition": _KERAS_JAX_HEAD_DIMS,
    },
    "attnspec.conformance.kernels.adapters.thirdparty.local_attention": {
        "sparse-masked-nonfinite-ignored": "docs/divergences.md#local-attention-masked-nan",
    },
    # need_weights=True (MHA's own math path) only; need_weights=False goes through SDPA
    "torch.nn.modules.activation.MultiheadAttention": {
        "empty-rows-zero": "docs/divergences.md#mha-empty-rows",
        "large-logits": "docs/divergences.md#mha-float16-overflow",
        # the same float16 scores, rounded: weights off by just over the TOL-2 bound
        "matches-reference": "docs/divergences.md#mha-float16-overflow",
        "bias-semantics": "docs/divergences.md#mha-float16-overflow",
        # its float16 padded-batch anchor: s + finfo.min rounded in float16
        "layout-independence": "docs/divergences.md#mha-float16-overflow",
        # the example of torch-masked-nan through MHA's adapter gives [nan, nan] too
        "masked-nonfinite-ignored": _TORCH_SDPA_DIVERGENCES["masked-nonfinite-ignored"],
        # --backward: the NaN row's gradients (every dk with them)
        "gradients-linear-in-upstream": "docs/divergences.md#mha-empty-rows",
        "gradients-softmax-identity": "docs/divergences.md#mha-empty-rows",
        "gradients-excluded-keys-zero": "docs/divergences.md#mha-empty-rows",
        "gradients-empty-rows": "docs/divergences.md#mha-empty-rows",
        "gradients-match-reference": "docs/divergences.md#mha-float16-overflow",
        # BWD-18's and BWD-19's problems with a row of no key: its NaN gradients (2026-12-07)
        "gradients-within-flash-rule": "docs/divergences.md#mha-empty-rows",
        "gradients-batch-composition": "docs/divergences.md#mha-empty-rows",
    },
}


@dataclass(frozen=True)
class Confirms:
    """What one write-up confirms: the clauses a failure it explains is listed under (by
    default the own clause of the property the write-up is filed under), text that
    failure's finding or minimal case shows (one of ``shows``; any text when empty) and
    text that marks another failure (none of ``hides``)."""

    clauses: tuple[str, ...] = ()
    shows: tuple[str, ...] = ()  # any one of them
    hides: tuple[str, ...] = ()  # none of them


# Write-ups whose failure is listed under a clause besides the property's own (a waived
# clause they follow from) or that name what their failures show.
_EMPTY_ROW = "should be 0.0 within"  # an accuracy finding whose definition is exactly 0
_CONFIRMS: dict[str, Confirms] = {
    # the output's dtype, whatever the property; not an error of the values
    _FLA_FLOAT32_OUTPUT: Confirms(shows=("dtype torch.float32, but should have shape",)),
    _FLA_KDA_LENGTH: Confirms(shows=("raised AssertionError",)),
    _HF_FLOAT32_SOFTMAX: Confirms(shows=("float64",)),
    _HF_FLOAT16: Confirms(shows=("float16",)),
    # one causal query over more keys: every key attended
    _HF_ONE_QUERY: Confirms(
        ("SDPA-4.1", "SDPA-7.1", "SDPA-7.3", "SDPA-7.8"), shows=("is_causal=True",)
    ),
    # NaN from sqrt(scale < 0) (the reference) or the session's refusal of scale <= 0 (ONNX
    # Runtime, listed under the first clause it failed, SDPA-1.1 or SDPA-1.3)
    _ONNX_SCALE: Confirms(
        (
            *("SDPA-1.1", "SDPA-1.3", "SDPA-2.2", "SDPA-3.1", "SDPA-3.2", "SDPA-3.4"),
            *("SDPA-4.1", "SDPA-6.1", "SDPA-7.1", "SDPA-7.3", "SDPA-7.8", "SOFTCAP-1"),
        ),
        shows=("scale=-", "scale_ > 0"),
    ),
    # NumPy's empty maximum, ONNX Runtime's length checks; a cache of capacity 0, met
    # first by every cache property (KVCACHE-2, -3, -7) and the repeated packed calls
    _ONNX_EMPTY: Confirms(
        (*("SDPA-1.5", "SDPA-5.2", "SDPA-7.8"), *("KVCACHE-2", "KVCACHE-3", "KVCACHE-7")),
        shows=("zero-size array", "checkParameters"),
    ),
    # the reference's padded (1,) mask; ONNX Runtime's refused mask and bias shapes
    _ONNX_MASK_SHAPES: Confirms(
        ("SDPA-3.1", "SDPA-3.2", "SDPA-7.6"),
        shows=("(broadcast mask)", "ComputeOutputShapeForAttention"),
    ),
    _ONNX_FLOAT16: Confirms(shows=("float16",)),
    _ONNX_MASKED_NAN: Confirms(shows=("nan into",)),
    # its NaN rows (0 in float16) show on "causal with scale 0" or a negative scale only
    _CAUSAL_SCALE_ZERO: Confirms(shows=("scale=0.0", "scale=-")),
    _FLEX_CPU_BACKWARD: Confirms(shows=("does not support backward on CPU",)),
    # rows-sum-to-one (SDPA-7.1) and value-linearity (SDPA-7.6) on fully masked rows:
    # distinct failures, or consequences of the waived SDPA-5.1
    "docs/divergences.md#jax-empty-rows": Confirms(("SDPA-5.1", "SDPA-7.1", "SDPA-7.6")),
    "docs/divergences.md#mha-float16-overflow": Confirms(shows=("float16",)),
    # float16 scores overflow (SDPA-7.4) or are rounded beyond TOL-2 (SDPA-7.3; found as
    # layout-independence, SDPA-1.7, when the contiguous call is as inaccurate); a
    # definition of exactly 0 is a row without allowed keys (SDPA-5.1), not rounding
    _KERAS_NUMPY_FLOAT16: Confirms(
        ("SDPA-7.4", "SDPA-7.3", "SDPA-1.7", "SDPA-7.1", "SDPA-3.1", "SDPA-3.2"),
        shows=("float16",),
        hides=(_EMPTY_ROW,),
    ),
    _LINEN_FLOAT16_ACCURACY: Confirms(
        ("SDPA-7.3", "SDPA-3.3", "SDPA-7.6"), shows=("float16",), hides=(_EMPTY_ROW,)
    ),
    # a row whose allowed keys all carry a finfo.min bias: keys the causal rule excludes
    # take its weight; only a failure with a bias can show it, and a call that timed out
    # (CONF-5) shows no weight at all, whatever its bias (the matrix's BWD run, 2026-12-07)
    _FILL_OUTRANKS_MIN_BIAS: Confirms(shows=("bias(",), hides=("did not return within",)),
    # masked scores beyond Keras's fill (-45850 in float16): masked-values-ignored's largest
    # magnitudes, which it prints as 1.41e+04, not its 1 and 10
    _KERAS_TORCH_MASK_FILL: Confirms(shows=("e+",)),
    # a non-finite value at a masked position (0 * NaN), or key where a -inf bias, not the
    # mask, excludes it (NaN + -inf): a NaN key the mask excludes does not leak
    _JAX_MASKED_NAN: Confirms(shows=("into v at", "into k at")),
    # jax.nn's check of v's shape
    _FLAX_NNX_HEAD_DIMS: Confirms(shows=("value shape should be",)),
    _FLAX_BATCH_BROADCAST: Confirms(shows=("batch dims must match",)),
    "docs/divergences.md#keras-numpy-float16-pv": Confirms(shows=("dtype=float16",)),
    # the output's shape on empty queries, not a value of a broadcast batch
    "docs/divergences.md#torch-empty-broadcast": Confirms(shows=(").shape=(",)),
    # the fallback's reshape to q's shape, or its mask expansion that meets Ev != E first
    _KERAS_JAX_HEAD_DIMS: Confirms(shows=("cannot reshape", "incompatible shapes")),
    # numpy broadcasting refusing Hq != Hkv
    "docs/divergences.md#keras-numpy-gqa": Confirms(shows=("could not be broadcast",)),
    "docs/divergences.md#flax-linen-float16": Confirms(shows=("float16",)),
    # PyTorch SDPA's: NaN query, the 1-d mask's IndexError, causal with scale 0, masked NaN
    "docs/divergences.md#keras-torch-sdpa": Confirms(
        shows=("nan", "the NaN at q", "IndexError", "scale=0.0", "scale=-")
    ),
    # a fully masked row meets layout-independence first (its padded anchor) as well
    "docs/divergences.md#keras-empty-rows": Confirms(
        ("SDPA-5.1", "SDPA-1.7", "BWD-1", "BWD-3", "BWD-4", "BWD-17", "BWD-18")
    ),
}


def confirms(link: str, own_clause: str, clause: str, evidence: str) -> bool:
    """Whether the write-up ``link``, filed under a property of ``own_clause``, explains
    a failure listed under ``clause`` whose finding and minimal case read ``evidence``:
    a property that fails for another reason than the one written up stays unconfirmed."""
    scope = _CONFIRMS.get(link, Confirms())
    shown = not scope.shows or any(text in evidence for text in scope.shows)
    hidden = any(text in evidence for text in scope.hides)
    return clause in (scope.clauses or (own_clause,)) and shown and not hidden


def known_divergences(fn: Any) -> dict[str, str]:
    """Property id -> where the confirmed divergence of this kernel is written up."""
    return dict(_DIVERGENCES.get(qualified_name(fn), {}))


def write_ups(entry: KnownKernel) -> dict[str, str]:
    """Property id -> the confirmed write-up, for a row of the matrix."""
    for name in (entry.name, entry.adapter, *entry.qualified_names):
        found = _DIVERGENCES.get(name.replace(":", "."))
        if found:
            return dict(found)
    return {}


def target_write_ups(target: str) -> dict[str, str]:
    """Property id -> the confirmed write-up, for ``attnspec check TARGET`` (a known
    kernel's name or adapter, or a library object's ``module:qualname``)."""
    entry = _entry_of_target(target)
    if entry is not None:
        return write_ups(entry)
    return dict(_DIVERGENCES.get(target.replace(":", "."), {}))
