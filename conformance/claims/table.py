"""The claims table: everything a kernel can claim, in one place (CONF-3, CONF-7).

Each :class:`Claim` is one field of :class:`~attnspec.conformance.KernelDeclaration`
(which gives its type, default and allowed values (``validation.py``) and the MUST
clauses a non-default value waives) with the command-line flag(s) that set it and their
help, the keyword(s) the suite passes the kernel because of it, and how it shows in the
conformance claim line.  The ``attnspec check`` flags, the pytest plugin's
``--attnspec-*`` options, ``suite_keywords`` (the signature pre-flight) and the claim line
all derive from :data:`CLAIMS`: adding a claim is adding a field there and a row here
(tests/conformance/cli/test_check_claims.py checks that they agree).

:data:`SETUP_FLAGS` are the other declarations the CLI and the plugin share: how the
kernel is called (layout, keyword renames), which dtypes are checked, and the JAX
configuration to check it in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...reference.masks import CAUSAL_ALIGNMENTS
from ...reference.positional import ROPE_LAYOUTS
from .declaration import WAIVES, KernelDeclaration
from .family_claims import (
    FEATURE_MAPS,
    FP8_DESCALES,
    FP8_FORMATS,
    KV_CACHE_FEATURES,
    MERGE_BASES,
    MERGE_LSE_LAYOUTS,
    MERGE_OUT_LAYOUTS,
    MLA_PAGED_KEYWORDS,
    PAGED_CACHE_LAYOUTS,
    PAGED_FEATURES,
    RECURRENT_GATES,
    RECURRENT_RULES,
    RECURRENT_STATE_DTYPES,
    chunk_size_list,
    fp8_format_list,
    fp8_from_flags,
    kv_cache_feature_keywords,
    kv_cache_feature_list,
    linear_from_flags,
    merge_from_flags,
    mla_from_flags,
    paged_batch_from_flags,
    paged_feature_keywords,
    paged_feature_list,
    recurrent_from_flags,
    rope_from_flags,
    sparse_from_flags,
)
from .flags import Flag, Getter, UsageError, alignment_name, comma_list, key_values

# Flag, Getter and UsageError are imported from here by conformance/run/ (kernel_setup,
# supervisor); their home is flags.py.
__all__ = [
    "CLAIMS",
    "CLAIM_FLAGS",
    "LAYOUTS",
    "SETUP_FLAGS",
    "Claim",
    "Flag",
    "Getter",
    "UsageError",
    "claim_features",
    "claims_from",
    "setup_from",
    "suite_keywords",
]

LAYOUTS = ("bhld", "blhd", "packed")


@dataclass(frozen=True)
class Claim:
    """One row of the claims table: a declaration field and everything derived from it."""

    field: str  # its name in KernelDeclaration, which gives its type and default
    flags: tuple[Flag, ...] = ()
    # the value from the flags (None: not given); default: the single flag's value
    from_flags: Callable[[Getter], Any] | None = None
    # claims a given flag also sets (unless set by their own flag): --bias-keyword -> bias
    # dataclasses.field: the class's own `field` attribute shadows the name for mypy
    implies: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # keywords the suite passes the kernel because of this claim, and how to stop it
    keywords: Callable[[KernelDeclaration], tuple[str, ...]] | None = None
    remedy: str = ""
    # the words this claim adds to the conformance claim line (None: nothing)
    shows_as: Callable[[KernelDeclaration], str | None] | None = None

    @property
    def waives(self) -> tuple[str, ...] | None:
        """The MUST clause(s) a kernel that does not keep the default does not follow
        (CONF-7): the declaration's :data:`~.declaration.WAIVES`."""
        return WAIVES.get(self.field)

    @property
    def waived_clauses(self) -> tuple[str, ...]:
        return self.waives or ()

    def value_from(self, get: Getter) -> Any:
        """This claim's value from the flags, or None when no flag of it was given."""
        if self.from_flags is not None:
            return self.from_flags(get)
        if not self.flags:
            return None
        flag = self.flags[0]
        value = get(flag.dest)
        if flag.kind == "switch":
            return True if value else None
        return value


def _dense(declaration: KernelDeclaration) -> bool:
    return bool(declaration.family == "dense")


def _when(
    name: str,
    text: str | Callable[[KernelDeclaration], str],
    families: tuple[str, ...] = ("dense",),
) -> Callable[..., Any]:
    """shows_as: ``text`` for a kernel of ``families`` claiming the boolean ``name``."""

    def shows(declaration: KernelDeclaration) -> str | None:
        if not (declaration.family in families and getattr(declaration, name)):
            return None
        return text(declaration) if callable(text) else text

    return shows


def _option(field: str) -> str:
    """The flag named after a claim: ``--mask-keyword`` for ``mask_keyword``."""
    return "--" + field.replace("_", "-")


def _flag_claim(
    field: str,
    help: str,
    kind: str,
    shows: str | Callable[[KernelDeclaration], str] | None = None,
    families: tuple[str, ...] = ("dense",),
    **claim: Any,
) -> Claim:
    """A claim set by one flag named after it: a switch or ``--x/--no-x`` (``kind``); for a
    kernel of ``families`` (default: dense) that claims it, the claim line says ``shows``."""
    if shows is not None:
        claim["shows_as"] = _when(field, shows, families)
    return Claim(field, flags=(Flag(_option(field), help, kind=kind),), **claim)


def _keyword_claim(field: str, of: str, help: str, **claim: Any) -> Claim:
    """The keyword that claim ``of``'s argument is passed as, set by ``--FIELD NAME``,
    which implies ``of``."""
    flag = Flag(_option(field), f"{help}; implies {_option(of)}", metavar="NAME")
    return Claim(field, flags=(flag,), implies={of: True}, **claim)


def _argument_claim(
    field: str,
    help: str,
    shows: str | Callable[[KernelDeclaration], str],
    families: tuple[str, ...] = ("dense",),
) -> Claim:
    """An optional argument of a kernel of ``families`` (default: dense),
    ``--FIELD/--no-FIELD``: when claimed the suite passes it by the keyword that the claim
    ``FIELD_keyword`` names, and their claim line says ``shows``."""
    keyword = f"{field}_keyword"
    return _flag_claim(
        field,
        help,
        "bool",
        shows,
        families,
        keywords=lambda d: (
            (getattr(d, keyword),) if d.family in families and getattr(d, field) else ()
        ),
        remedy=f"--no-{field.replace('_', '-')}, or {_option(keyword)} NAME",
    )


def _spec_argument_claim(
    field: str, keyword: str, help: str, shows: str | Callable[[KernelDeclaration], str]
) -> Claim:
    """A dense kernel's argument that the suite passes by the spec's own keyword
    (``is_causal``, ``scale``), ``--FIELD/--no-FIELD``; a kernel that names it otherwise
    is called through ``--rename``."""
    return _flag_claim(
        field,
        help,
        "bool",
        shows,
        keywords=lambda d: (keyword,) if _dense(d) and getattr(d, field) else (),
        remedy=f"--no-{field.replace('_', '-')}, or --rename {keyword}=NAME",
    )


def _linear_shows(declaration: KernelDeclaration) -> str | None:
    claim = declaration.linear
    if claim is None:
        return None
    return claim.feature_map if isinstance(claim.feature_map, str) else "custom feature map"


def _merge_shows(declaration: KernelDeclaration) -> str | None:
    claim = declaration.merge
    if claim is None:
        return None
    words = [
        word
        for word, differs in (
            ("base-2 log-sum-exp", claim.base == "2"),
            ("tokens-first outputs", claim.out_layout == "lhd"),
            ("tokens-first log-sum-exp", claim.lse_layout == "lh"),
        )
        if differs
    ]
    return ", ".join(words) or None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# Why the rows below look alike: it is a table, one row per claim, each spelled out so a
# reader finds a claim's flags, keywords and words in one place.
CLAIMS: tuple[Claim, ...] = (
    Claim("dtypes"),  # --dtype: SETUP_FLAGS
    Claim(
        "batch_ndim",
        flags=(
            Flag(
                "--batch-ndim",
                "the kernel takes exactly this many leading batch dims, the same in q, k "
                "and v (1 for (B, H, L, E) kernels; default: any number, broadcasting)",
                type=int,
                metavar="N",
            ),
        ),
        shows_as=lambda d: None if d.batch_ndim is None else _plural(d.batch_ndim, "batch dim"),
    ),
    _flag_claim(
        "equal_head_dims",
        "the kernel needs Ev == E (FlashAttention 2, JAX); the suite "
        "pads q, k or v with exact zero columns",
        "switch",
        shows_as=lambda d: "needs E == Ev" if d.equal_head_dims else None,
    ),
    # limitations: what a kernel cannot take, declared once instead of failing every
    # property whose drawn inputs touch it
    _flag_claim(
        "equal_lengths",
        "the kernel needs Lq == Lk (self-attention only, e.g. "
        "local-attention); the suite draws Lq = Lk, and the claim says so",
        "switch",
        shows_as=lambda d: "needs Lq == Lk" if d.equal_lengths else None,
    ),
    _flag_claim(
        "empty_sizes",
        "the kernel takes empty sizes (Lq = 0, Lk = 0; SDPA-1.5, "
        "SDPA-5.2); --no-empty-sizes: the suite draws none and the claim names both "
        "clauses as waived (CONF-7)",
        "bool",
    ),
    _argument_claim(
        "mask", "the kernel takes a boolean mask (default: read off its signature)", "mask"
    ),
    _keyword_claim("mask_keyword", "mask", "keyword of the boolean mask (default mask)"),
    _argument_claim("bias", "the kernel takes an additive float bias", "bias"),
    _keyword_claim(
        "bias_keyword",
        "bias",
        "keyword of the bias (default bias; PyTorch: attn_mask, a float mask added to the scores)",
    ),
    _flag_claim(
        "float32_bias",
        "float16 and bfloat16 calls get their bias in float32, not in the inputs' "
        "dtype (SDPA-1.4: PyTorch SDPA takes such a float attn_mask; Hugging Face "
        "models build float32 padding masks of finfo(float32).min); implies --bias",
        "switch",
        implies={"bias": True},
        shows="float32 bias",
    ),
    _flag_claim("gqa", "grouped-query attention: Hq a multiple of Hkv", "bool", shows="GQA"),
    _keyword_claim(
        "gqa_keyword",
        "gqa",
        "keyword set to True when Hq != Hkv (PyTorch: enable_gqa)",
        keywords=lambda d: (d.gqa_keyword,) if _dense(d) and d.gqa and d.gqa_keyword else (),
        remedy="--gqa-keyword NAME",
    ),
    _spec_argument_claim(
        "causal",
        "is_causal",
        "the kernel takes is_causal",
        lambda d: f"{d.causal_alignment.replace('_', '-')} causal",
    ),
    Claim(
        "causal_alignment",
        flags=(
            Flag(
                "--causal-alignment",
                "what is_causal means when Lq != Lk: top_left (PyTorch/JAX) "
                "or bottom_right (FlashAttention >= 2.1)",
                choices=CAUSAL_ALIGNMENTS,
                type=alignment_name,
            ),
        ),
    ),
    _flag_claim(
        "mask_and_causal",
        "mask and is_causal may be passed together",
        "bool",
        shows_as=lambda d: (
            "mask and causal not combined"
            if _dense(d) and d.mask and d.causal and not d.mask_and_causal
            else None
        ),
    ),
    _spec_argument_claim("scale", "scale", "the kernel takes scale=", "explicit scale"),
    _flag_claim(
        "returns_weights", "the kernel returns (out, weights)", "bool", shows="returned weights"
    ),
    _flag_claim(
        "empty_rows_zero",
        "fully masked rows give 0 as the spec says (SDPA-5.1); "
        "--no-empty-rows-zero for kernels that give mean(V): the claim then names "
        "SDPA-5.1 as waived (CONF-7)",
        "bool",
    ),
    Claim(
        "extra_kwargs",
        flags=(
            Flag(
                "--kwarg",
                "extra keyword passed on every call, e.g. dropout_p=0.0",
                kind="list",
                metavar="KEY=VALUE",
            ),
        ),
        from_flags=lambda get: key_values(get("kwarg"), "--kwarg") or None,
        keywords=lambda d: tuple(d.extra_kwargs),
        remedy="--kwarg",
    ),
    # --- the features of spec/features.md and dropout (DROP-2 ... DROP-5) ---
    _argument_claim(
        "softcap",
        "the kernel takes a logit softcap c > 0 and computes c tanh(x / c) of "
        "the scaled scores before bias and mask (SOFTCAP-1; FlashAttention, Gemma 2)",
        "softcap",
    ),
    _keyword_claim("softcap_keyword", "softcap", "keyword of the softcap (default softcap)"),
    _argument_claim(
        "alibi",
        "the kernel adds ALiBi biases -m_h |i + d - j| from per-query-head "
        "slopes, anchored at its causal alignment's corner (ALIBI-2); the slopes are "
        "passed as float32 (Hq,) or (..., Hq) arrays",
        lambda d: "ALiBi (standard slopes)" if d.alibi_builtin_slopes else "ALiBi",
    ),
    _keyword_claim("alibi_keyword", "alibi", "keyword of the ALiBi slopes (default alibi_slopes)"),
    _flag_claim(
        "alibi_builtin_slopes",
        "the kernel takes no slopes: it computes the standard "
        "slopes of Press et al. for its heads itself (ALIBI-3), and the ALiBi keyword "
        "(e.g. --alibi-keyword use_alibi) is a switch the suite sets to True; implies "
        "--alibi",
        "switch",
        implies={"alibi": True},
    ),
    _flag_claim(
        "returns_lse",
        "the kernel also returns the log-sum-exp of each query row: "
        "(out, lse), or (out, weights, lse) with --returns-weights (LSE-1 ... LSE-4)",
        "bool",
        shows="log-sum-exp",
    ),
    _keyword_claim(
        "lse_keyword",
        "returns_lse",
        "keyword set to True on every call to get the log-sum-exp (FlashAttention's kvcache: "
        "return_softmax_lse; FlexAttention: return_lse)",
        keywords=lambda d: (
            (d.lse_keyword,) if _dense(d) and d.returns_lse and d.lse_keyword else ()
        ),
        remedy="--lse-keyword NAME",
    ),
    _flag_claim(
        "dropout",
        "the kernel takes a dropout probability (0.0 is passed on every call "
        "but the dropout checks) and a seed: DROP-2 ... DROP-5 are checked statistically",
        "bool",
        keywords=lambda d: (
            (d.dropout_keyword, *((d.dropout_seed_keyword,) if d.dropout_seeded else ()))
            if _dense(d) and d.dropout
            else ()
        ),
        remedy="--no-dropout, --dropout-keyword NAME, --dropout-seed-keyword NAME or "
        "--no-dropout-seeded",
        shows="dropout",
    ),
    _keyword_claim(
        "dropout_keyword", "dropout", "keyword of the dropout probability (default dropout_p)"
    ),
    _keyword_claim(
        "dropout_seed_keyword", "dropout", "keyword of the integer dropout seed (default seed)"
    ),
    _flag_claim(
        "dropout_seeded",
        "the kernel takes its dropout seed as a keyword (default); "
        "--no-dropout-seeded: it draws from its library's own generator, so DROP-4 is "
        "not checked",
        "bool",
    ),
    _flag_claim(
        "varlen",
        "the kernel takes packed sequences (VARLEN-1): fn(q (total_q, Hq, E), "
        "k, v, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=) with int32 "
        "offsets, FlashAttention's varlen convention; only the varlen properties apply",
        "switch",
        keywords=lambda d: (
            (
                "cu_seqlens_q",
                "cu_seqlens_k",
                *(("max_seqlen_q", "max_seqlen_k") if d.varlen_max_seqlen else ()),
            )
            if d.varlen
            else ()
        ),
        remedy="--rename cu_seqlens_q=NAME ..., or --no-varlen-max-seqlen",
        # the family word says fp8 for a packed float8 kernel (QUANT-7); the claim says it here
        shows_as=lambda d: "packed sequences" if d.varlen and d.family == "fp8" else None,
    ),
    _flag_claim(
        "varlen_max_seqlen",
        "pass max_seqlen_q and max_seqlen_k to a --varlen kernel "
        "(default; --no-varlen-max-seqlen: it takes only the offsets)",
        "bool",
    ),
    _flag_claim(
        "varlen_mask",
        "the --varlen kernel takes a boolean mask flattened sequence by sequence, "
        "custom_mask (sum_b Lq_b * Lk_b,), FlashInfer's ragged convention (VARLEN-6)",
        "switch",
        keywords=lambda d: ("custom_mask",) if d.varlen and d.varlen_mask else (),
        remedy="--rename custom_mask=NAME",
        shows_as=lambda d: "mask" if d.varlen and d.varlen_mask and not _dense(d) else None,
        implies={"varlen": True},
    ),
    _flag_claim(
        "kv_cache",
        "the kernel attends over a KV cache (KVCACHE-1): fn(q, k_cache, "
        "v_cache, cache_seqlens=, k=, v=, [block_table=]) as FlashAttention's "
        "flash_attn_with_kvcache, bottom-right; only the KV-cache properties apply",
        "switch",
        keywords=lambda d: (
            (
                "cache_seqlens",
                *(("k", "v") if d.kv_cache_append else ()),
                *(("block_table",) if d.kv_cache_paged else ()),
            )
            if d.kv_cache
            else ()
        ),
        remedy="--rename cache_seqlens=NAME ..., --no-kv-cache-append",
        shows_as=lambda d: "paged" if d.kv_cache and d.kv_cache_paged else None,
    ),
    _flag_claim(
        "kv_cache_append",
        "the --kv-cache kernel takes new keys k=, v= and writes them "
        "into the cache in place at cache_seqlens (KVCACHE-4; default)",
        "bool",
    ),
    _flag_claim(
        "kv_cache_paged",
        "the --kv-cache kernel takes a paged cache (num_blocks, Hkv, "
        "block_size, E) and block_table= (KVCACHE-5)",
        "switch",
        implies={"kv_cache": True},
    ),
    Claim(
        "kv_cache_block_size",
        flags=(
            Flag(
                "--kv-cache-block-size",
                "the block size a paged cache must have (FlashAttention: "
                "a multiple of 256); default: the suite draws small ones",
                type=int,
                metavar="N",
            ),
        ),
        implies={"kv_cache": True, "kv_cache_paged": True},
    ),
    Claim(
        "kv_cache_features",
        flags=(
            Flag(
                "--kv-cache-features",
                "the options the --kv-cache kernel takes, comma-separated, of "
                f"{', '.join(KV_CACHE_FEATURES)}: cache_leftpad=, window_size=(left, right) "
                "(-1 unbounded), attention_chunk= (KVCACHE-6) and StreamingLLM's sink tokens "
                "n_sink_tokens= (kept beside the window, SINK-4)",
                type=kv_cache_feature_list,
                metavar="LIST",
            ),
        ),
        keywords=lambda d: kv_cache_feature_keywords(d.kv_cache_features) if d.kv_cache else (),
        implies={"kv_cache": True},
    ),
    Claim(
        "sparse",
        flags=(
            Flag(
                "--sparse",
                "the kernel implements this sparse pattern (spec/sparse.md)",
                metavar="PATTERN",
            ),
            Flag(
                "--sparse-param",
                "a parameter of the sparse pattern (repeatable)",
                kind="list",
                metavar="KEY=VALUE",
            ),
            Flag(
                "--sparse-alignment",
                "causal alignment of the sparse pattern",
                choices=CAUSAL_ALIGNMENTS,
                type=alignment_name,
            ),
            Flag("--sparse-causal", "the sparse pattern is causal", kind="switch"),
            Flag(
                "--sparse-pass-params",
                "pass the pattern's parameters to the kernel as keywords",
                kind="switch",
            ),
        ),
        from_flags=sparse_from_flags,
        keywords=lambda d: tuple(d.sparse.params) if d.sparse and d.sparse.pass_params else (),
        remedy="--sparse-pass-params",
        shows_as=lambda d: None if d.sparse is None else d.sparse.pattern,
    ),
    Claim(
        "linear",
        flags=(
            Flag(
                "--linear",
                "the kernel is linear attention with this feature map "
                f"(spec/linear.md): {', '.join(FEATURE_MAPS)}, or MODULE:FUNC of a feature-map "
                "callable",
                metavar="FEATURE_MAP",
            ),
            Flag(
                "--linear-num-features", "number of random features (FAVOR+)", type=int, metavar="M"
            ),
            Flag("--linear-iid", "FAVOR+ features are iid, not orthogonal", kind="switch"),
            Flag(
                "--linear-seed-keyword",
                "keyword the FAVOR+ seed is passed as (default seed)",
                metavar="NAME",
            ),
            Flag(
                "--linear-eps",
                "epsilon the kernel adds to its denominator",
                type=float,
                metavar="EPS",
            ),
            Flag(
                "--linear-causal-alignment",
                "causal alignment of the linear kernel",
                choices=CAUSAL_ALIGNMENTS,
                type=alignment_name,
            ),
        ),
        from_flags=linear_from_flags,
        keywords=lambda d: (
            (d.linear.seed_keyword,)
            if d.linear is not None and d.linear.feature_map == "favor+"
            else ()
        ),
        remedy="--linear-seed-keyword NAME",
        shows_as=_linear_shows,
    ),
    Claim(
        "rope",
        flags=(
            Flag(
                "--rope",
                "the function is rotary position embedding (ROPE-1) with this pairing, "
                "called fn(x (B, H, L, d), positions (B, 1, L) integers); only the RoPE "
                "properties apply",
                choices=ROPE_LAYOUTS,
                metavar="PAIRING",
            ),
            Flag(
                "--rope-base",
                "the RoPE function's base (default 10000)",
                type=float,
                metavar="BASE",
            ),
            Flag(
                "--rope-dim",
                "the RoPE function rotates only the first R features (default: all)",
                type=int,
                metavar="R",
            ),
        ),
        from_flags=rope_from_flags,
        shows_as=lambda d: None if d.rope is None else f"{d.rope.pairing} pairing",
    ),
    Claim(
        "merge",
        flags=(
            Flag(
                "--merge",
                "the function merges two attention states (MERGE-1), called fn(o_a, lse_a, "
                "o_b, lse_b) -> (o, lse), with log-sum-exps in this base (e or 2); only the "
                "merge properties apply",
                choices=MERGE_BASES,
                metavar="BASE",
            ),
            Flag(
                "--merge-out-layout",
                "the merge's outputs: hld (H, L, Ev), the spec's (default), or lhd (L, H, Ev)",
                choices=MERGE_OUT_LAYOUTS,
            ),
            Flag(
                "--merge-lse-layout",
                "the merge's log-sum-exps: hl (H, L), the spec's (default), or lh (L, H)",
                choices=MERGE_LSE_LAYOUTS,
            ),
        ),
        from_flags=merge_from_flags,
        shows_as=_merge_shows,
    ),
    Claim(
        "paged_batch",
        flags=(
            Flag(
                "--paged-batch",
                "the kernel attends packed queries of many sequences over a paged cache "
                "(PAGED-1), called fn(q (T, Hq, E), k_cache, v_cache, cu_seqlens_q=, "
                "seqused_k=, block_table=, max_seqlen_q=, max_seqlen_k=), its cache pages "
                "in this layout: hnd (N, Hkv, P, E) or nhd (N, P, Hkv, E); only the "
                "paged-batch properties apply",
                choices=PAGED_CACHE_LAYOUTS,
                metavar="LAYOUT",
            ),
            Flag(
                "--paged-batch-page-size",
                "the only page size the paged-batch kernel accepts (default: any)",
                type=int,
                metavar="P",
            ),
            Flag(
                "--paged-batch-features",
                "the options the paged-batch kernel takes, comma-separated, of "
                f"{', '.join(PAGED_FEATURES)}: cache_leftpad=, window_size=(left, right) "
                "(-1 unbounded), attention_chunk=, softcap=, FlashInfer's flattened "
                "custom_mask=, sink logits sinks= (Hq,) and StreamingLLM's sink tokens "
                "n_sink_tokens= (kept beside the window)",
                type=paged_feature_list,
                metavar="LIST",
            ),
        ),
        from_flags=paged_batch_from_flags,
        keywords=lambda d: (
            ()
            if d.paged_batch is None
            else (
                "cu_seqlens_q",
                "seqused_k",
                "block_table",
                *(("max_seqlen_q", "max_seqlen_k") if d.paged_batch.max_seqlen else ()),
                *paged_feature_keywords(d.paged_batch.features, d.sinks_keyword),
            )
        ),
        remedy="--rename (e.g. seqused_k=cache_seqlens)",
        shows_as=lambda d: (
            None
            if d.paged_batch is None or d.paged_batch.cache_layout == "hnd"
            else "tokens-first pages"
        ),
    ),
    _argument_claim(
        "sinks",
        "the kernel takes one sink logit per query head, float32 (Hq,), added to "
        "every row's softmax denominator unscaled and without a value (SINK-1; "
        "gpt-oss, vLLM's s_aux, FlashAttention 4's learnable_sink); a --varlen or "
        "--kv-cache kernel takes them for every sequence (SINK-6)",
        "sinks",
        families=("dense", "varlen", "kv-cache"),
    ),
    _keyword_claim("sinks_keyword", "sinks", "keyword of the sink logits (default sinks)"),
    _flag_claim(
        "sink_tokens",
        "the kernel keeps the first n_sink_tokens= keys visible beside a causal "
        "sliding window of window= keys to the left, measured from the declared "
        "causal alignment (SINK-4; StreamingLLM)",
        "bool",
        keywords=lambda d: ("n_sink_tokens", "window") if _dense(d) and d.sink_tokens else (),
        remedy="--no-sink-tokens, or --rename (e.g. n_sink_tokens=sink_token_length)",
        shows="sink tokens",
    ),
    _flag_claim(
        "chunk",
        "the kernel takes attention_chunk=C: a query sees the keys of its own chunk of C "
        "positions, counted from key position 0, up to itself, at its declared causal "
        "alignment's position (CHUNK-1; Llama 4, FlashAttention 3's attention_chunk)",
        "bool",
        keywords=lambda d: ("attention_chunk",) if _dense(d) and d.chunk else (),
        remedy="--no-chunk, or --rename attention_chunk=NAME",
        shows="chunked local",
    ),
    Claim(
        "mla",
        flags=(
            Flag(
                "--mla",
                "the kernel is multi-head latent attention in its absorbed form (MLA-1) with "
                "latent width R: fn(q (..., Hq, Lq, R + D), kv (..., 1, Lk, R + D), scale=, "
                "is_causal=) -> (..., Hq, Lq, R), the values kv's first R channels; only the "
                "MLA properties apply",
                type=int,
                metavar="R",
            ),
            Flag(
                "--mla-rope-dim",
                "the MLA kernel's rotary part D (default 64)",
                type=int,
                metavar="D",
            ),
            Flag(
                "--mla-paged",
                "the MLA kernel reads paged latent pages, called as FlashMLA: fn(q (B, Lq, "
                "Hq, R + D), k_cache (N, P, 1, R + D), block_table=, cache_seqlens=, "
                "head_dim_v=R, softmax_scale=, causal=) -> (B, Lq, Hq, R), with "
                "--returns-lse (out, lse (B, Hq, Lq)) (MLA-4)",
                kind="switch",
            ),
            Flag(
                "--mla-page-size",
                "the only page size the paged MLA kernel takes (FlashMLA: 64; default any)",
                type=int,
                metavar="P",
            ),
            Flag(
                "--mla-default-scale",
                "the MLA kernel also takes softmax_scale=None, meaning 1/sqrt(R + D) (MLA-5)",
                kind="switch",
            ),
        ),
        from_flags=mla_from_flags,
        keywords=lambda d: MLA_PAGED_KEYWORDS if d.mla is not None and d.mla.paged else (),
        remedy="--rename (e.g. cache_seqlens=seqlens_k)",
        shows_as=lambda d: "paged" if d.mla is not None and d.mla.paged else None,
    ),
    Claim(
        "fp8",
        flags=(
            Flag(
                "--fp8",
                "the kernel takes q, k, v stored in these float8 formats, comma-separated, of "
                "e4m3fn, e5m2 (QUANT-1), called as FlashAttention 3: fn(q, k, v, q_descale=, "
                "k_descale=, v_descale=, scale=, is_causal=) -> the attention of stored x "
                "descale in a --dtype output dtype; only the float8 properties apply",
                type=fp8_format_list,
                metavar="FORMATS",
            ),
            Flag(
                "--fp8-descale",
                "the float8 kernel's descales: head, float32 (B, H_kv) (default), or tensor, "
                "float32 (1,)",
                choices=FP8_DESCALES,
            ),
            Flag(
                "--fp8-weights",
                "the float8 format the kernel rounds its unnormalised weights P to before "
                "P V (QUANT-3; default: it keeps them)",
                choices=FP8_FORMATS,
            ),
            Flag(
                "--fp8-kv-only",
                "only k and v (the cache) are float8: q comes in the output dtype (float16, "
                "bfloat16) and the descales are FlashInfer's k_scale=, v_scale= (QUANT-8)",
                kind="switch",
            ),
        ),
        from_flags=fp8_from_flags,
        # a float8 paged batch (QUANT-6) gets the descales beside the paged keywords; the
        # float8 family's own call is checked on its own (run/kernel_setup.py)
        keywords=lambda d: (
            tuple(d.fp8.descale_keywords.values())
            if d.fp8 is not None and d.family == "paged-batch"
            else ()
        ),
        # the family word says fp8 for a float8 kernel; a paged batch's claim says it here,
        # and any claim says a float8 cache beside queries in half precision (QUANT-8)
        shows_as=lambda d: (
            None
            if d.fp8 is None
            else "float8 cache"
            if d.fp8.kv_only
            else "float8 inputs"
            if d.family == "paged-batch"
            else None
        ),
    ),
    Claim(
        "recurrent",
        flags=(
            Flag(
                "--recurrent",
                "the kernel is linear attention as a recurrence with this update rule "
                "(spec/recurrent.md): fn(q (B, Hq, T, dk), k, v, g=, beta=, initial_state=) "
                "-> (out, final_state); only the recurrence properties apply",
                choices=RECURRENT_RULES,
                metavar="RULE",
            ),
            Flag(
                "--recurrent-gate",
                "the recurrent kernel's gate g: per head (B, Hs, T) or per key channel "
                "(B, Hs, T, dk) (default head)",
                choices=RECURRENT_GATES,
            ),
            Flag(
                "--recurrent-chunk-size",
                "the largest chunk of tokens the recurrent kernel evaluates at once "
                "(C_h of REC-6.2; default 64, 1 for a token-by-token kernel)",
                type=int,
                metavar="C",
            ),
            Flag(
                "--recurrent-rounded-operands",
                "the recurrent kernel rounds its matrix products' operands to the input "
                "dtype (u_p of REC-6.2)",
                kind="switch",
            ),
            Flag(
                "--recurrent-varlen",
                "the recurrent kernel also takes packed sequences: cu_seqlens= with B = 1 and "
                "states (N, Hs, dk, dv) (REC-3.3)",
                kind="switch",
            ),
            Flag(
                "--recurrent-chunk-sizes",
                "the values of the recurrent kernel's chunk_size= keyword, comma-separated, "
                "each checked (REC-5.1), e.g. 16,32,64",
                type=chunk_size_list,
                metavar="C,C,...",
            ),
            Flag(
                "--recurrent-value-groups",
                "the recurrent kernel takes more value heads than key and query heads "
                "(flash-linear-attention's GVA): v, g, beta and the state with G * Hk heads "
                "(REC-3.1)",
                kind="switch",
            ),
            Flag(
                "--recurrent-state-dtype",
                "the narrower dtype the recurrent kernel returns its final state in and takes "
                "its past state in, rounded once per call (REC-4.3; default float32, float64 "
                "for float64 inputs)",
                choices=RECURRENT_STATE_DTYPES,
            ),
            Flag(
                "--recurrent-qk-l2norm",
                "the recurrent kernel L2-normalises q and k itself, x / sqrt(|x|^2 + EPS) "
                "(REC-2.4; flash-linear-attention's use_qk_l2norm_in_kernel=True: 1e-6): it "
                "is given keys of any norm",
                type=float,
                metavar="EPS",
            ),
        ),
        from_flags=recurrent_from_flags,
    ),
    _flag_claim(
        "backward",
        "check the kernel's backward pass too (spec/backward.md): its gradients by "
        "the framework's automatic differentiation (torch.autograd, a custom "
        "autograd.Function included; jax.vjp), or by --backward-fn; with "
        "--recurrent, the recurrence's gradients (REC-7)",
        "bool",
        shows="backward",
    ),
    Claim(
        "backward_fn",
        flags=(
            Flag(
                "--backward-fn",
                "an explicit backward function, FlashAttention's convention: "
                "bwd(dout, q, k, v, out, lse, **the forward's keywords) -> (dq, dk, dv) "
                "or (dq, dk, dv, dbias), out and lse those the kernel returned (lse None "
                "unless it declares --returns-lse); for a --recurrent kernel: "
                "bwd(d_out, d_final_state, q, k, v, out, final_state, **the forward's "
                "keywords) -> (dq, dk, dv, dg, dbeta, d_initial_state), None for an input "
                "not given (REC-7.1); implies --backward",
                metavar="MODULE:FUNC",
            ),
        ),
        implies={"backward": True},
    ),
    _flag_claim(
        "backward_dropout",
        "the backward pass takes dropout calls and uses the keep indicators its "
        "forward call drew (BWD-9): through the framework's differentiation of that "
        "call (autograd keeps the mask or the generator state; a JAX key is an "
        "argument held fixed), or a --backward-fn given the forward's keywords, "
        "dropout_p and the seed among them, that regenerates the indicators from "
        "the seed (FlashAttention's rng_state); implies --backward and --dropout",
        "bool",
        implies={"backward": True, "dropout": True},
        shows="dropout backward",
    ),
)
CLAIM_FLAGS: tuple[Flag, ...] = tuple(flag for claim in CLAIMS for flag in claim.flags)

SETUP_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--layout",
        "the kernel's array layout: bhld (the spec's, default), blhd "
        "(JAX/FlashAttention/flash-linear-attention (..., L, H, E)) or packed "
        "(ONNX's (..., L, H * E) with q_num_heads=, kv_num_heads=)",
        choices=LAYOUTS,
    ),
    Flag(
        "--rename",
        "the kernel takes a spec keyword under another name, e.g. "
        "is_causal=causal, scale=softmax_scale, g=decay, initial_state=past_state",
        kind="list",
        metavar="SPEC=KERNEL",
    ),
    Flag(
        "--dtype",
        "test only these dtypes (repeatable or comma list): float16, bfloat16, float32, float64",
        kind="list",
        metavar="DTYPE",
    ),
    Flag(
        "--jax-x64",
        "JAX backend: turn jax_enable_x64 on for this run, so float64 is "
        "checked too (JAX's default is off: float64 inputs become float32)",
        kind="switch",
    ),
)


def claims_from(get: Getter) -> dict[str, Any]:
    """Declaration overrides from the claim flags (only those given, and what they imply)."""
    claims: dict[str, Any] = {}
    implied: dict[str, Any] = {}
    for claim in CLAIMS:
        value = claim.value_from(get)
        if value is not None:
            claims[claim.field] = value
            implied.update(claim.implies)
    for name, value in implied.items():
        claims.setdefault(name, value)
    return claims


def setup_from(get: Getter) -> dict[str, Any]:
    """KernelSetup's layout, rename, dtypes and jax_x64 from the setup flags."""
    rename = {key: str(value) for key, value in key_values(get("rename"), "--rename").items()}
    dtypes = comma_list(get("dtype"))
    return {
        "layout": get("layout") or "bhld",
        "rename": rename,
        "dtypes": None if dtypes is None else tuple(dtypes),
        "jax_x64": True if get("jax_x64") else None,
    }


def suite_keywords(declaration: KernelDeclaration) -> dict[str, str]:
    """Each keyword the suite may pass the kernel, with the claim that makes it do so and
    how to change that."""
    keywords: dict[str, str] = {}
    for claim in CLAIMS:
        if claim.keywords is None:
            continue
        shown = repr(getattr(declaration, claim.field))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        for keyword in claim.keywords(declaration):
            keywords.setdefault(keyword, f"{claim.field}={shown} (change it with {claim.remedy})")
    return keywords


def claim_features(declaration: KernelDeclaration) -> list[str]:
    """The words of the claim line for what ``declaration`` claims, in table order."""
    words = [declaration.family]
    for claim in CLAIMS:
        if claim.shows_as is not None:
            shown = claim.shows_as(declaration)
            if shown:
                words.append(shown)
    return words
