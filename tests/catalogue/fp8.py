"""Float8 attention (QUANT-1 … QUANT-4) in PyTorch on the CPU: correct formulations and the
bugs float8 ports have (a descale applied twice, to the wrong tensor, to the wrong head of a
GQA group, weights rounded to float8 without saying so).

Every kernel is FlashAttention 3's convention, ``fn(q, k, v, *, q_descale, k_descale,
v_descale, scale, is_causal=False, mask=None)`` with ``q``, ``k``, ``v`` float8 tensors and
float32 descales ``(B, H_kv)`` (or ``(1,)`` per tensor), returning float32; it dequantises
to float32 and evaluates attention there, as the float8 kernels do after their float8
matrix products (which are exact in float32 accumulators for these sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from attnspec.conformance import Fp8Claim, PagedBatchClaim, declare

from .entry import REQUIRED, CaughtBug, SpecCall, namespace, required, signed, spec_function
from .paged_batch import PAGED_ARRAYS, PAGED_REQUIRED

torch: Any = None  # imported when first called: the catalogue imports without torch

CLAIMS: dict[str, Any] = dict(
    fp8=Fp8Claim(formats=("e4m3fn", "e5m2")), gqa=True, dtypes=("float32",)
)
Tensor = Any
# FlashAttention 3's float8 keywords, the convention every kernel here mimics
DESCALES = required("q_descale", "k_descale", "v_descale")
FP8_KEYWORDS = {
    **DESCALES,
    "scale": REQUIRED,
    "is_causal": False,
    "mask": None,
    "softcap": None,
    "sinks": None,
}


def _torch() -> Any:
    global torch
    if torch is None:
        import torch as module

        torch = module
    return torch


def _per_head(descale: Tensor | float, groups: int) -> Tensor:
    """A ``(B, H_kv)`` or ``(1,)`` descale (or a Python float, FlashInfer's per-tensor scale)
    broadcasting to ``(B, H, 1, 1)`` for heads that are ``groups`` per key/value head (query
    heads share their key/value head's)."""
    t = _torch()
    descale = t.as_tensor(descale, dtype=t.float32)
    if descale.ndim <= 1:
        return descale.reshape(1, 1, 1, 1)
    return descale.repeat_interleave(groups, dim=1)[:, :, None, None]


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    is_causal: bool,
    mask: Tensor | None,
    round_weights: str | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    after_cap: Any = 1.0,
) -> Tensor:
    """float32 attention of real-valued q (B, Hq, Lq, E), k, v (B, Hk, Lk, E): GQA by
    repetition, top-left causal, a boolean mask, the softcap of the scaled scores and each
    head's sink logit in the denominator (QUANT-5); with ``round_weights`` the unnormalised
    weights rounded to that float8 dtype before P V (QUANT-3).  ``after_cap`` multiplies the
    scores after the cap (1 in a correct kernel)."""
    t = _torch()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = softcap * t.tanh(scores / softcap)
    scores = scores * after_cap
    n_queries, n_keys = scores.shape[-2:]
    allowed = t.ones((n_queries, n_keys), dtype=t.bool)
    if is_causal:
        allowed = t.tril(allowed)
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    sink = None if sinks is None else sinks.reshape(1, -1, 1, 1)
    if sink is not None:
        top = t.maximum(top, sink)
    top = top.masked_fill(top == float("-inf"), 0.0)  # a row without keys (PAGED-3) gives 0
    exps = t.exp(scores - top)
    total = exps.sum(-1, keepdim=True)
    if sink is not None:
        total = total + t.exp(sink - top)
    if round_weights is not None:
        exps = exps.to(getattr(t, round_weights)).to(t.float32)
    return (exps @ v) / t.where(total > 0, total, 1.0)


def _kernel(
    dequantise: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, ...]],
    round_weights: str | None = None,
    *,
    descales_after_cap: bool = False,
    sinks_as_scores: bool = False,
) -> Callable[..., Tensor]:
    """FlashAttention 3's convention around ``dequantise`` (stored values and descales ->
    the q, k, v attended); the bugs' hooks: ``descales_after_cap`` multiplies the (capped)
    scores by dq dk, ``sinks_as_scores`` the sinks by alpha dq dk (of the first batch
    element)."""

    @spec_function(FP8_KEYWORDS)
    def kernel(call: SpecCall) -> Tensor:
        q, k, v, mask, _, is_causal, scale = call
        real = dequantise(q, k, v, call.q_descale, call.k_descale, call.v_descale)
        groups = q.shape[1] // k.shape[1]
        folded = _per_head(call.q_descale, groups) * _per_head(call.k_descale, groups)
        sinks = call.sinks
        if sinks_as_scores and sinks is not None:
            sinks = sinks * scale * folded.reshape(folded.shape[0], -1)[0]
        after_cap = folded if descales_after_cap else 1.0
        return _attention(
            *real, scale, is_causal, mask, round_weights, call.softcap, sinks, after_cap
        )

    return kernel


def _named(name: str, doc: str, kernel: Callable[..., Tensor], claims: dict[str, Any]) -> Any:
    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return declare(**claims)(kernel)


def _times(q: Tensor, k: Tensor, v: Tensor, *factors: Any) -> tuple[Any, ...]:
    """q, k, v widened to float32 and multiplied by one factor each."""
    f32 = _torch().float32
    return tuple(x.to(f32) * factor for x, factor in zip((q, k, v), factors, strict=True))


def _real(
    q: Tensor, k: Tensor, v: Tensor, dq: Tensor | None, dk: Tensor, dv: Tensor
) -> tuple[Any, ...]:
    """q, k, v times their descales in float32; q as given where it has none (QUANT-8)."""
    groups = q.shape[1] // k.shape[1]
    q_factor = 1.0 if dq is None else _per_head(dq, groups)
    return _times(q, k, v, q_factor, _per_head(dk, 1), _per_head(dv, 1))


fp8_dequantised = _named(
    "fp8_dequantised",
    "Dequantise to float32 (stored x descale), then attention (QUANT-2).",
    _kernel(_real),
    CLAIMS,
)
fp8_weights_e4m3 = _named(
    "fp8_weights_e4m3",
    "FlashAttention 3's form: P rounded to e4m3fn before P V, declared (QUANT-3); per-tensor "
    "descales.",
    _kernel(_real, round_weights="float8_e4m3fn"),
    {**CLAIMS, "fp8": Fp8Claim(("e4m3fn", "e5m2"), descale="tensor", weights="e4m3fn")},
)


def _folded(q: Tensor, k: Tensor, v: Tensor, dq: Tensor, dk: Tensor, dv: Tensor) -> tuple[Any, ...]:
    """FlashAttention 3's arrangement: dq dk folded into the scores' scale (here into q, per
    query head), dv into the output (here into v): the same function."""
    groups = q.shape[1] // k.shape[1]
    folded = _per_head(dq, groups) * _per_head(dk, groups)
    return _times(q, k, v, folded, 1.0, _per_head(dv, 1))


fp8_folded_descales = _named(
    "fp8_folded_descales",
    "The descales folded into the scale and the output (QUANT-2).",
    _kernel(_folded),
    CLAIMS,
)

# QUANT-5: a softcap on the real values' scaled scores and sink logits taken as given
FEATURE_CLAIMS = {**CLAIMS, "softcap": True, "sinks": True}
fp8_softcap_sinks = _named(
    "fp8_softcap_sinks",
    "Dequantise, then attention with the softcap and the sink logits (QUANT-5).",
    _kernel(_real),
    FEATURE_CLAIMS,
)

CORRECT = (fp8_dequantised, fp8_folded_descales, fp8_weights_e4m3, fp8_softcap_sinks)


def _stored_scores(
    q: Tensor, k: Tensor, v: Tensor, dq: Tensor, dk: Tensor, dv: Tensor
) -> tuple[Any, ...]:
    """q and k as stored (their descales left for after the cap), v's real values."""
    return _times(q, k, v, 1.0, 1.0, _per_head(dv, 1))


def _twice(q: Tensor, k: Tensor, v: Tensor, dq: Tensor, dk: Tensor, dv: Tensor) -> tuple[Any, ...]:
    real_q, real_k, real_v = _real(q, k, v, dq, dk, dv)
    return real_q * _per_head(dq, q.shape[1] // k.shape[1]), real_k, real_v


def _k_on_v(q: Tensor, k: Tensor, v: Tensor, dq: Tensor, dk: Tensor, dv: Tensor) -> tuple[Any, ...]:
    return _real(q, k, v, dq, dk, dk)


def _query_head_indexed(
    q: Tensor, k: Tensor, v: Tensor, dq: Tensor, dk: Tensor, dv: Tensor
) -> tuple[Any, ...]:
    """q's descale tiled over the groups (head h gets dq[h mod H_kv]) instead of shared by
    each group (head h gets dq[h // groups])."""
    groups = q.shape[1] // k.shape[1]
    tiled = dq.reshape(1, 1, 1, 1) if dq.ndim == 1 else dq.repeat(1, groups)[:, :, None, None]
    return _times(q, k, v, tiled, _per_head(dk, 1), _per_head(dv, 1))


def _paged_fp8(
    first_sequence_descales: bool = False, kv_only: bool = False
) -> Callable[..., Tensor]:
    """A paged batch (PAGED-1, HND pages) on float8 q and pages (QUANT-6): each sequence's
    positions gathered through its block table, dequantised with its own row of the
    ``(S, H_kv)`` descales, attended bottom-right; rows past the last offset 0.  The bug
    dequantises every sequence with the first sequence's descales.  ``kv_only``:
    FlashInfer's float8 cache, q in half precision and the pages' ``k_scale``, ``v_scale``
    (QUANT-8), the output in q's dtype."""
    scales = KV_SCALES if kv_only else DESCALES

    @signed({**PAGED_REQUIRED, **scales, "is_causal": False}, PAGED_ARRAYS, namespace)
    def kernel(call: SimpleNamespace) -> Tensor:
        q, k_cache, v_cache = call.q, call.k_cache, call.v_cache
        cu_seqlens_q, seqused_k, block_table = call.cu_seqlens_q, call.seqused_k, call.block_table
        descales = (
            (None, call.k_scale, call.v_scale)
            if kv_only
            else (call.q_descale, call.k_descale, call.v_descale)
        )
        t = _torch()
        out = t.zeros((*q.shape[:2], v_cache.shape[-1]), dtype=t.float32)
        page = k_cache.shape[2]
        for b in range(len(seqused_k)):
            first, last, n_k = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(seqused_k[b])
            positions = t.arange(n_k)
            pages, slots = block_table[b][positions // page], positions % page
            row = slice(0, 1) if first_sequence_descales else slice(b, b + 1)
            dq, dk, dv = (d[row] if getattr(d, "ndim", 0) == 2 else d for d in descales)
            real = _real(
                q[first:last].transpose(0, 1)[None],
                k_cache[pages, :, slots].transpose(0, 1)[None],
                v_cache[pages, :, slots].transpose(0, 1)[None],
                dq,
                dk,
                dv,
            )
            n_q = last - first
            if n_k == 0:  # no key: rows of 0 (PAGED-3)
                continue
            keep = t.arange(n_k)[None, :] <= t.arange(n_q)[:, None] + (n_k - n_q)
            allowed = keep if call.is_causal else None
            attended = _attention(*real, q.shape[-1] ** -0.5, False, allowed)
            out[first:last] = attended[0].transpose(0, 1)
        return out.to(q.dtype) if kv_only else out

    return kernel


PAGED_CLAIMS = {**CLAIMS, "paged_batch": PagedBatchClaim()}
fp8_paged = _named(
    "fp8_paged",
    "A paged batch on float8 q and pages, each sequence with its own descales (QUANT-6).",
    _paged_fp8(),
    PAGED_CLAIMS,
)

# QUANT-8: FlashInfer's float8 cache, half-precision q beside float8 k, v and their scales
KV_SCALES = required("k_scale", "v_scale")
KV_KEYWORDS = {
    **KV_SCALES,
    "scale": REQUIRED,
    "is_causal": False,
    "mask": None,
    "softcap": None,
    "sinks": None,
}
KV_ONLY = Fp8Claim(("e4m3fn", "e5m2"), kv_only=True)
KV_CLAIMS: dict[str, Any] = dict(
    fp8=KV_ONLY, gqa=True, dtypes=("float16", "bfloat16"), softcap=True, sinks=True
)


def _float8_cache(bug: str | None = None) -> Callable[..., Tensor]:
    """FlashInfer's arithmetic on a float8 cache (QUANT-8): q as given, k times k_scale in
    float32, P rounded to q's dtype before P V on the stored v, the output rounded to q's
    dtype and then multiplied by v_scale in it (``out *= v_scale``).  ``bug``:
    "q-quantised" rounds q to e4m3 too, "k-scale-on-v" multiplies the output by k_scale."""

    @spec_function(KV_KEYWORDS)
    def kernel(call: SpecCall) -> Tensor:
        q, k, v, mask, _, is_causal, scale = call
        t = _torch()
        query = q.to(t.float8_e4m3fn) if bug == "q-quantised" else q
        keys = k.to(t.float32) * _per_head(call.k_scale, 1)
        out = _attention(
            query.to(t.float32),
            keys,
            v.to(t.float32),
            scale,
            is_causal,
            mask,
            str(q.dtype).removeprefix("torch."),
            call.softcap,
            call.sinks,
        ).to(q.dtype)
        value_scale = call.k_scale if bug == "k-scale-on-v" else call.v_scale
        return out * _per_head(value_scale, q.shape[1] // k.shape[1]).to(q.dtype)

    return kernel


fp8_float8_cache = _named(
    "fp8_float8_cache",
    "FlashInfer's float8 cache: half-precision q, float8 k and v with k_scale, v_scale (QUANT-8).",
    _float8_cache(),
    KV_CLAIMS,
)
fp8_float8_cache_tensor = _named(
    "fp8_float8_cache_tensor",
    "The same with per-tensor scales, Python floats as FlashInfer's run takes them.",
    _float8_cache(),
    {**KV_CLAIMS, "fp8": Fp8Claim(("e4m3fn",), descale="tensor", kv_only=True)},
)
PAGED_KV_CLAIMS = {
    "fp8": KV_ONLY,
    "gqa": True,
    "dtypes": ("float16",),
    "paged_batch": PagedBatchClaim(),
}
fp8_paged_float8_cache = _named(
    "fp8_paged_float8_cache",
    "A paged batch over float8 pages with half-precision q, FlashInfer's convention (QUANT-8).",
    _paged_fp8(kv_only=True),
    PAGED_KV_CLAIMS,
)


# QUANT-7: packed sequences (FlashAttention 3's flash_attn_varlen_func with descales)
VARLEN_ARRAYS = ("q", "k", "v")
VARLEN_REQUIRED = required("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def _varlen_fp8(bug: str | None = None) -> Callable[..., Tensor]:
    """Packed sequences (VARLEN-1) of float8 q, k, v (QUANT-7): each sequence's rows
    dequantised with its own row of the ``(B, H_kv)`` descales and attended, top-left.
    ``bug``: "first-sequence" reads every sequence's descales from row 0 (the packed
    tensor's batch index), "v-twice" applies v's descale to the values and again to the
    output."""

    @signed(
        {**VARLEN_REQUIRED, **DESCALES, "scale": REQUIRED, "is_causal": False},
        VARLEN_ARRAYS,
        namespace,
    )
    def kernel(call: SimpleNamespace) -> Tensor:
        t = _torch()
        offsets_q, offsets_k = call.cu_seqlens_q, call.cu_seqlens_k
        out = t.zeros((*call.q.shape[:2], call.v.shape[-1]), dtype=t.float32)
        for b in range(len(offsets_q) - 1):
            rows = slice(int(offsets_q[b]), int(offsets_q[b + 1]))
            keys = slice(int(offsets_k[b]), int(offsets_k[b + 1]))
            row = slice(0, 1) if bug == "first-sequence" else slice(b, b + 1)
            dq, dk, dv = (
                d[row] if d.ndim == 2 else d
                for d in (call.q_descale, call.k_descale, call.v_descale)
            )
            q, k, v = _real(
                *(x.transpose(0, 1)[None] for x in (call.q[rows], call.k[keys], call.v[keys])),
                dq,
                dk,
                dv,
            )
            attended = _attention(q, k, v, call.scale, call.is_causal, None)
            if bug == "v-twice":
                attended = attended * _per_head(dv, q.shape[1] // k.shape[1])
            out[rows] = attended[0].transpose(0, 1)
        return out

    return kernel


VARLEN_CLAIMS = {**CLAIMS, "varlen": True}
fp8_varlen = _named(
    "fp8_varlen",
    "Packed float8 sequences, each dequantised with its own row of the descales (QUANT-7).",
    _varlen_fp8(),
    VARLEN_CLAIMS,
)

HEAD_CLAIMS = {**CLAIMS, "fp8": Fp8Claim(("e4m3fn",), descale="head")}
BUGS = (
    CaughtBug(
        _named("fp8_descale_twice", "Bug: q's descale applied twice.", _kernel(_twice), CLAIMS),
        "fp8-matches-reference",
    ),
    CaughtBug(
        _named("fp8_k_descale_on_v", "Bug: v scaled by k's descale.", _kernel(_k_on_v), CLAIMS),
        "fp8-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_descale_by_query_head",
            "Bug: q's per-head descale indexed by query head (tiled), not by key/value head.",
            _kernel(_query_head_indexed),
            HEAD_CLAIMS,
        ),
        "fp8-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_softcap_before_descale",
            "Bug: the softcap applied to the stored values' scores, the descales after it.",
            _kernel(_stored_scores, descales_after_cap=True),
            FEATURE_CLAIMS,
        ),
        "fp8-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_sink_descaled",
            "Bug: the sink logits scaled by alpha dq dk like a score (QUANT-5: taken as given).",
            _kernel(_real, sinks_as_scores=True),
            FEATURE_CLAIMS,
        ),
        "fp8-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_paged_first_sequence_descales",
            "Bug: every sequence of a paged batch dequantised with the first one's descales.",
            _paged_fp8(first_sequence_descales=True),
            PAGED_CLAIMS,
        ),
        "paged-batch-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_varlen_first_sequence_descales",
            "Bug: every packed sequence dequantised with the first one's descales (row 0).",
            _varlen_fp8("first-sequence"),
            VARLEN_CLAIMS,
        ),
        "fp8-varlen-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_varlen_v_descale_twice",
            "Bug: in the packed path v's descale applied to the values and to the output.",
            _varlen_fp8("v-twice"),
            VARLEN_CLAIMS,
        ),
        "fp8-varlen-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_float8_cache_q_quantised",
            "Bug: beside a float8 cache, q rounded to e4m3 too (QUANT-8: q is taken as given).",
            _float8_cache("q-quantised"),
            KV_CLAIMS,
        ),
        "fp8-cache-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_float8_cache_k_scale_on_v",
            "Bug: the output multiplied by k_scale where v_scale belongs.",
            _float8_cache("k-scale-on-v"),
            KV_CLAIMS,
        ),
        "fp8-cache-matches-reference",
    ),
    CaughtBug(
        _named(
            "fp8_weights_rounded_undeclared",
            "Bug: P rounded to e4m3fn before P V without declaring QUANT-3.",
            _kernel(_real, round_weights="float8_e4m3fn"),
            CLAIMS,
        ),
        "fp8-matches-reference",
    ),
)

# the correct kernels of the packed call and the float8 cache (QUANT-7, QUANT-8), recorded
# over seeds as a family of their own (scripts/measure-correct-seeds)
SERVING_CORRECT = (fp8_varlen, fp8_float8_cache, fp8_float8_cache_tensor)
