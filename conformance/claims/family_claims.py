"""The claims that choose a family of properties: a sparse pattern (spec/sparse.md), a
linear feature map (spec/linear.md), rotary position embedding (ROPE-1), the merge of two
attention states (MERGE-1), a paged batch (PAGED-1), and how each is read from its flags
(``--sparse``, ``--linear``, ``--rope``, ``--merge``, ``--paged-batch`` and the flags that
refine them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .flags import Getter, UsageError, key_values

FEATURE_MAPS = ("elu+1", "relu", "favor+")


@dataclass(frozen=True)
class SparseClaim:
    """The kernel computes attention restricted to one spec pattern (spec/sparse.md).

    ``params`` are the pattern's parameters as ``attnspec.reference.sparse_mask`` takes
    them; with ``pass_params`` the kernel receives them as keyword arguments on every
    call, otherwise they are baked into the kernel.
    """

    pattern: str
    params: Mapping[str, Any] = field(default_factory=dict)
    alignment: str = "top_left"
    causal: bool = False
    pass_params: bool = False


@dataclass(frozen=True)
class LinearClaim:
    """The kernel is kernelized (linear) attention with this feature map (spec/linear.md).

    ``feature_map`` is ``"elu+1"``, ``"relu"``, ``"favor+"`` or a callable phi.  A
    FAVOR+ kernel draws ``num_features`` random features from the integer it receives
    as ``seed_keyword``.
    """

    feature_map: str | Callable[[Any], Any]
    num_features: int | None = None
    orthogonal: bool = True
    seed_keyword: str = "seed"
    eps: float = 0.0
    causal_alignment: str = "top_left"


@dataclass(frozen=True)
class RopeClaim:
    """The function is rotary position embedding (ROPE-1), called ``fn(x, positions)``.

    ``pairing`` is "interleaved" (features 2i, 2i+1) or "half" (i, i + r/2); ``base`` and
    ``rotary_dim`` (default: every feature) are the values the function has built in.
    """

    pairing: str
    base: float = 10000.0
    rotary_dim: int | None = None


MERGE_BASES = ("e", "2")
MERGE_OUT_LAYOUTS = ("hld", "lhd")
MERGE_LSE_LAYOUTS = ("hl", "lh")


@dataclass(frozen=True)
class MergeClaim:
    """The function merges two attention states (MERGE-1), called ``fn(o_a, lse_a, o_b,
    lse_b) -> (o, lse)``.

    ``base`` is the log-sum-exps' base, "e" (natural, the spec's) or "2" (MERGE-2);
    ``out_layout`` is "hld" (outputs ``(H, L, Ev)``, the spec's) or "lhd" (``(L, H, Ev)``,
    FlashInfer's and vLLM's); ``lse_layout`` is "hl" (``(H, L)``, the spec's and vLLM's) or
    "lh" (``(L, H)``, FlashInfer's).
    """

    base: str = "e"
    out_layout: str = "hld"
    lse_layout: str = "hl"


def _chosen(
    get: Getter,
    family: str,
    metavar: str,
    refinements: tuple[str, ...],
    given: Callable[[Any], bool] = lambda value: value is not None,
) -> Any:
    """The value of the flag that chooses ``family`` (``--FAMILY METAVAR``), None when it
    was not given; a UsageError when a flag that refines it was given (``given`` says which
    values count) without it."""
    chosen = get(family)
    if chosen is None:
        refined = [f for f in refinements if given(get(f))]
        if refined:
            raise UsageError(
                f"--{refined[0].replace('_', '-')} needs --{family.replace('_', '-')} {metavar}"
            )
    return chosen


def merge_from_flags(get: Getter) -> MergeClaim | None:
    if _chosen(get, "merge", "BASE", ("merge_out_layout", "merge_lse_layout")) is None:
        return None
    return MergeClaim(
        get("merge"), get("merge_out_layout") or "hld", get("merge_lse_layout") or "hl"
    )


PAGED_CACHE_LAYOUTS = ("hnd", "nhd")
#: The options a paged-batch kernel may take beside its metadata, each passed in
#: FlashAttention's and FlashInfer's keywords: ``cache_leftpad (B)`` (PAGED-1),
#: ``window_size=(left, right)`` with -1 for unbounded (SPARSE-2.1), ``attention_chunk=C``
#: (CHUNK-1), ``softcap=c`` (SOFTCAP-1), ``custom_mask``, FlashInfer's flattened
#: per-sequence boolean mask (PAGED-8), ``sinks (Hq,)`` float32 (SINK-1; vLLM's
#: ``s_aux``), and ``n_sink_tokens=n``, StreamingLLM's sink tokens: each sequence's first n
#: keys kept beside the window (SINK-4; drawn with a window only).
PAGED_FEATURES = ("leftpad", "window", "chunk", "softcap", "mask", "sinks", "sink_tokens")


@dataclass(frozen=True)
class PagedBatchClaim:
    """The kernel attends a packed batch of sequences over a paged cache (PAGED-1), called
    ``fn(q, k_cache, v_cache, cu_seqlens_q=, seqused_k=, block_table=, ...)``.

    ``cache_layout`` is "hnd" (pages ``(N, Hkv, P, E)``, the spec's and FlashInfer's HND)
    or "nhd" (``(N, P, Hkv, E)``, vLLM's and FlashAttention's); ``page_size`` the only
    page size the kernel accepts (None: any); with ``max_seqlen`` the kernel also takes
    ``max_seqlen_q`` and ``max_seqlen_k``; ``features`` are the options of
    :data:`PAGED_FEATURES` it takes.
    """

    cache_layout: str = "hnd"
    page_size: int | None = None
    max_seqlen: bool = True
    features: tuple[str, ...] = ()


#: The options a --kv-cache kernel may take (KVCACHE-6), in flash_attn_with_kvcache's
#: keywords: ``cache_leftpad (B)``, ``window_size=(left, right)`` (-1 unbounded),
#: ``attention_chunk=C``, and ``n_sink_tokens=n`` (SINK-4; drawn with a window only).
KV_CACHE_FEATURES = ("leftpad", "window", "chunk", "sink_tokens")


def _feature_list(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise ValueError(f"{text!r}: {what} features should be some of {allowed}")
    return names


def paged_feature_list(text: str) -> tuple[str, ...]:
    """``--paged-batch-features leftpad,window`` as ``("leftpad", "window")``; argparse
    reports the ValueError as a usage error."""
    return _feature_list(text, PAGED_FEATURES, "paged-batch")


def kv_cache_feature_list(text: str) -> tuple[str, ...]:
    """``--kv-cache-features leftpad,window`` as ``("leftpad", "window")``."""
    return _feature_list(text, KV_CACHE_FEATURES, "KV-cache")


PAGED_FEATURE_KEYWORDS = {
    "leftpad": "cache_leftpad",
    "window": "window_size",
    "chunk": "attention_chunk",
    "softcap": "softcap",
    "mask": "custom_mask",
    "sinks": "sinks",
    "sink_tokens": "n_sink_tokens",
}


def paged_feature_keywords(features: tuple[str, ...], sinks: str = "sinks") -> tuple[str, ...]:
    """The keyword each paged-batch option is passed as; the sink logits' is ``sinks``
    (the declaration's ``sinks_keyword``: vLLM's ``s_aux``)."""
    return tuple(sinks if name == "sinks" else PAGED_FEATURE_KEYWORDS[name] for name in features)


def kv_cache_feature_keywords(features: tuple[str, ...]) -> tuple[str, ...]:
    """The keyword each KV-cache option is passed as (those of the paged batch)."""
    return tuple(PAGED_FEATURE_KEYWORDS[name] for name in features)


def paged_batch_from_flags(get: Getter) -> PagedBatchClaim | None:
    refinements = ("paged_batch_page_size", "paged_batch_features")
    if _chosen(get, "paged_batch", "LAYOUT", refinements) is None:
        return None
    return PagedBatchClaim(
        get("paged_batch"),
        get("paged_batch_page_size"),
        features=tuple(get("paged_batch_features") or ()),
    )


@dataclass(frozen=True)
class MlaClaim:
    """The kernel computes multi-head latent attention in its absorbed form (MLA-1), called
    ``fn(q (..., Hq, Lq, r + d_r), kv (..., 1, Lk, r + d_r), scale=, is_causal=)`` ->
    ``(..., Hq, Lq, r)``: keys ``kv``, values its first ``value_dim`` = r channels.
    ``value_dim`` and ``rope_dim`` are the kernel's built-in r and d_r (DeepSeek V3's
    512 and 64 by default).

    ``paged``: it reads paged latent pages instead (MLA-4), called as FlashMLA's
    ``flash_mla_with_kvcache``: ``fn(q (B, Lq, Hq, r + d_r), k_cache (N, P, 1, r + d_r),
    block_table=, cache_seqlens=, head_dim_v=r, softmax_scale=, causal=)`` -> ``out (B, Lq,
    Hq, r)``, or ``(out, lse (B, Hq, Lq))`` where it declares ``returns_lse``;
    ``page_size``: the only page size it takes (None: any); ``default_scale``: a caller may
    omit the scale (``softmax_scale=None``), which is then 1/sqrt(r + d_r) (MLA-5).
    """

    value_dim: int = 512
    rope_dim: int = 64
    paged: bool = False
    page_size: int | None = None
    default_scale: bool = False


#: The keywords of a paged MLA call (MLA-4), FlashMLA's names
MLA_PAGED_KEYWORDS = ("block_table", "cache_seqlens", "head_dim_v", "softmax_scale", "causal")


def mla_from_flags(get: Getter) -> MlaClaim | None:
    refinements = ("mla_rope_dim", "mla_paged", "mla_page_size", "mla_default_scale")
    if _chosen(get, "mla", "R", refinements, lambda value: value not in (None, False)) is None:
        return None
    rope_dim, page_size = get("mla_rope_dim"), get("mla_page_size")
    if page_size is not None and not get("mla_paged"):
        raise UsageError("--mla-page-size needs --mla-paged")
    return MlaClaim(
        get("mla"),
        64 if rope_dim is None else rope_dim,
        bool(get("mla_paged")),
        page_size,
        bool(get("mla_default_scale")),
    )


#: QUANT-1's float8 formats by their short names on the command line, and the granularities
#: of a descale: one number per tensor, or one per batch element and key/value head
FP8_FORMATS = ("e4m3fn", "e5m2")
FP8_DESCALES = ("tensor", "head")


@dataclass(frozen=True)
class Fp8Claim:
    """The kernel takes ``q``, ``k``, ``v`` stored in float8 with descale factors (QUANT-1),
    called as FlashAttention 3 is: ``fn(q, k, v, q_descale=, k_descale=, v_descale=,
    scale=, is_causal=)`` -> the attention of the real values (QUANT-2) in a declared output
    dtype.  ``formats``: the stored formats it takes (``"e4m3fn"``, ``"e5m2"``);
    ``descale``: ``"head"`` (float32 ``(B, H_kv)``) or ``"tensor"`` (float32 ``(1,)``);
    ``weights``: the float8 format it rounds the unnormalised weights P to before P V
    (QUANT-3), None when it keeps them; ``kv_only``: only ``k`` and ``v`` (the cache) are
    float8, ``q`` comes in the output dtype and the descales are FlashInfer's ``k_scale=``,
    ``v_scale=`` (QUANT-8).
    """

    formats: tuple[str, ...] = ("e4m3fn",)
    descale: str = "head"
    weights: str | None = None
    kv_only: bool = False

    @property
    def descale_keywords(self) -> dict[str, str]:
        """The keyword each descale is passed as, by the reference's name: FlashAttention
        3's ``q_descale``, ``k_descale``, ``v_descale``, or FlashInfer's ``k_scale``,
        ``v_scale`` for a float8 cache with queries in half precision (QUANT-8)."""
        if self.kv_only:
            return {"k_descale": "k_scale", "v_descale": "v_scale"}
        return {f"{name}_descale": f"{name}_descale" for name in ("q", "k", "v")}


def fp8_format_list(text: str) -> tuple[str, ...]:
    """``--fp8 e4m3fn,e5m2`` as ``("e4m3fn", "e5m2")``."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names or not set(names) <= set(FP8_FORMATS):
        raise ValueError(f"{text!r}: float8 formats should be some of {FP8_FORMATS}")
    return names


def fp8_from_flags(get: Getter) -> Fp8Claim | None:
    refinements = ("fp8_descale", "fp8_weights", "fp8_kv_only")
    if _chosen(get, "fp8", "FORMATS", refinements, given=lambda v: v not in (None, False)) is None:
        return None
    return Fp8Claim(
        get("fp8"), get("fp8_descale") or "head", get("fp8_weights"), bool(get("fp8_kv_only"))
    )


RECURRENT_RULES = ("linear", "gated", "delta", "gated_delta")
RECURRENT_GATES = ("head", "channel")
# narrower final-state dtypes a recurrent kernel may declare (REC-4.3)
RECURRENT_STATE_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class RecurrentClaim:
    """The kernel is linear attention as a recurrence (spec/recurrent.md) with one update
    rule, called ``fn(q (B, Hq, T, dk), k (B, Hk, T, dk), v (B, Hv, T, dv), g=, beta=,
    initial_state=)`` -> ``(out (B, Ho, T, dv), final_state (B, Hs, dk, dv))``: ``g`` only
    for the gated rules, per head ``(B, Hs, T)`` or per key channel ``(B, Hs, T, dk)``
    (``gate``), ``beta (B, Hs, T)`` only for the delta rules.  ``chunk_size`` is the largest
    chunk it evaluates at once (C_h of REC-6.2; 1 for a token-by-token kernel) and
    ``rounded_operands`` that it rounds its products' operands to the input dtype (u_p).
    ``varlen``: it also takes packed sequences, ``cu_seqlens=`` with one batch element and
    past and final states ``(N, Hs, dk, dv)`` (REC-3.3); ``chunk_sizes``: the values of a
    ``chunk_size=`` keyword it takes, each then the C_h of its call (REC-5.1);
    ``value_groups``: it takes more value heads than key and query heads (REC-3.1's reverse
    sharing, flash-linear-attention's GVA), ``v``, ``g``, ``beta`` and the state with
    ``Hs = G * Hk`` heads.  ``state_dtype``: the narrower dtype it returns its final state
    in and takes its past state in (REC-4.3; None: that of the carried state, float32 or
    float64), its state rounded once at the end of each call;
    ``qk_l2norm``: it L2-normalises q and k itself with this epsilon (REC-2.4;
    flash-linear-attention's ``use_qk_l2norm_in_kernel=True``, 1e-6), so it is given keys of
    any norm and compared on ``x / sqrt(|x|^2 + eps)``.
    """

    rule: str = "gated_delta"
    gate: str = "head"
    chunk_size: int = 64
    rounded_operands: bool = False
    varlen: bool = False
    chunk_sizes: tuple[int, ...] = ()
    value_groups: bool = False
    state_dtype: str | None = None
    qk_l2norm: float | None = None


def chunk_size_list(text: str) -> tuple[int, ...]:
    """``--recurrent-chunk-sizes 16,32,64`` as ``(16, 32, 64)``; argparse reports the
    ValueError of a word that is not an int >= 1."""
    sizes = tuple(int(word) for word in text.split(","))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"{text!r}: chunk sizes should be ints >= 1")
    return sizes


def recurrent_from_flags(get: Getter) -> RecurrentClaim | None:
    given = [
        f
        for f in (
            "recurrent_gate",
            "recurrent_chunk_size",
            "recurrent_rounded_operands",
            "recurrent_varlen",
            "recurrent_chunk_sizes",
            "recurrent_value_groups",
            "recurrent_state_dtype",
            "recurrent_qk_l2norm",
        )
        if get(f) not in (None, False)
    ]
    if get("recurrent") is None:
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} needs --recurrent RULE")
        return None
    chunk = get("recurrent_chunk_size")
    return RecurrentClaim(
        get("recurrent"),
        get("recurrent_gate") or "head",
        64 if chunk is None else chunk,
        bool(get("recurrent_rounded_operands")),
        bool(get("recurrent_varlen")),
        tuple(get("recurrent_chunk_sizes") or ()),
        bool(get("recurrent_value_groups")),
        get("recurrent_state_dtype"),
        get("recurrent_qk_l2norm"),
    )


def rope_from_flags(get: Getter) -> RopeClaim | None:
    if _chosen(get, "rope", "PAIRING", ("rope_base", "rope_dim")) is None:
        return None
    base = 10000.0 if get("rope_base") is None else get("rope_base")
    return RopeClaim(get("rope"), base, get("rope_dim"))


def sparse_from_flags(get: Getter) -> SparseClaim | None:
    refinements = ("sparse_param", "sparse_alignment", "sparse_causal", "sparse_pass_params")
    pattern = _chosen(get, "sparse", "PATTERN", refinements, given=bool)
    if pattern is None:
        return None
    # here, not at the top: a process that reads declarations only (the kernel's own,
    # run/kernel_process.py) need not import the whole reference for one tuple of names
    from ...reference.sparse.definition import PATTERN_NAMES

    if pattern not in PATTERN_NAMES:
        raise UsageError(
            f"--sparse {pattern!r} is not a spec pattern; expected one of "
            f"{', '.join(PATTERN_NAMES)}"
        )
    return SparseClaim(
        pattern,
        key_values(get("sparse_param"), "--sparse-param"),
        alignment=get("sparse_alignment") or "top_left",
        causal=bool(get("sparse_causal")),
        pass_params=bool(get("sparse_pass_params")),
    )


def _feature_map(name: str) -> str | Callable[..., Any]:
    """A named feature map, or the callable ``MODULE:FUNC`` names (--linear)."""
    if name in FEATURE_MAPS:
        return name
    if ":" not in name:
        raise UsageError(f"--linear {name!r} is neither {', '.join(FEATURE_MAPS)} nor MODULE:FUNC")
    from .loading import KernelLoadError, load_kernel

    try:
        return load_kernel(name)
    except KernelLoadError as exc:
        raise UsageError(f"--linear: {exc}") from None


def linear_from_flags(get: Getter) -> LinearClaim | None:
    refinements = (
        "linear_num_features",
        "linear_iid",
        "linear_seed_keyword",
        "linear_eps",
        "linear_causal_alignment",
    )
    feature_map = _chosen(
        get, "linear", "FEATURE_MAP", refinements, given=lambda value: value not in (None, False)
    )
    if feature_map is None:
        return None
    return LinearClaim(
        _feature_map(feature_map),
        get("linear_num_features"),
        orthogonal=not get("linear_iid"),
        seed_keyword=get("linear_seed_keyword") or "seed",
        eps=get("linear_eps") or 0.0,
        causal_alignment=get("linear_causal_alignment") or "top_left",
    )


#: Each family claim: its field of ``KernelDeclaration``, the family it chooses and its
#: class, in the order a declaration's family is decided (the first one set wins; a dense,
#: varlen or KV-cache kernel sets none of them).
FAMILY_CLAIMS: tuple[tuple[str, str, type], ...] = (
    ("rope", "rope", RopeClaim),
    ("merge", "merge", MergeClaim),
    ("paged_batch", "paged-batch", PagedBatchClaim),
    ("mla", "mla", MlaClaim),
    ("fp8", "fp8", Fp8Claim),
    ("recurrent", "recurrent", RecurrentClaim),
    ("sparse", "sparse", SparseClaim),
    ("linear", "linear", LinearClaim),
)
