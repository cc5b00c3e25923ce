"""PyTorch kernels whose convention a declaration cannot say: FlexAttention (the mask is a
function) and ``nn.MultiheadAttention`` (a module with projections).

- ``flex_attention_block_mask``: the spec's boolean mask (and ``is_causal``, top-left) as a
  ``mask_mod`` compiled into a ``BlockMask``; an additive bias as a ``score_mod``.
- ``flex_attention_score_mod``: mask, causal and bias all in one ``score_mod`` that puts
  ``-inf`` where a key is masked out, the way FlexAttention's documentation shows masking
  without a block mask.
- ``flex_attention_sinks``: the same ``score_mod`` with gpt-oss's sink logits (SINK-1) as the
  score of one more key of zeros appended to k and v.
- ``multihead_attention`` / ``multihead_attention_no_weights``: ``nn.MultiheadAttention``
  with identity input and output projections and no biases, so that the layer is pure
  attention over heads concatenated along the features (head h reads features h E ...
  (h + 1) E); its masks say True = masked out, so the spec's mask is inverted; a mask that
  depends on the key only goes in as ``key_padding_mask``, any other as ``attn_mask``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ...call.layouts import pad_head_dims
from ...claims.declaration import declare
from ..convention import SPEC_KEYWORDS, convention
from ..torch_sdpa import sdpa_on


def _index(tensor: Any) -> Any:
    """``tensor[b, h, q, kv]`` of a (B|1, H|1, Lq|1, Lk|1) tensor, broadcasting size-1 dims
    the way FlexAttention's mods are called (with index tensors)."""

    def at(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        index = [b, h, q_idx, kv_idx]
        return tensor[
            tuple(0 if size == 1 else i for size, i in zip(tensor.shape, index, strict=True))
        ]

    return at


def _as_4d(x: Any) -> Any:
    return x.reshape((1,) * (4 - x.ndim) + tuple(x.shape)) if x.ndim < 4 else x


def _bias_mod(bias: Any) -> Any:
    if bias is None:
        return None
    at = _index(_as_4d(bias))

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return score + at(b, h, q_idx, kv_idx).to(score.dtype)

    return score_mod


def _allowed(mask: Any, is_causal: bool) -> Any:
    """mask_mod: the spec's mask AND (top-left) causality; None when neither is given."""
    if mask is None and not is_causal:
        return None
    at = None if mask is None else _index(_as_4d(mask))

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        allowed = q_idx >= kv_idx if is_causal else None
        if at is not None:
            by_mask = at(b, h, q_idx, kv_idx)
            allowed = by_mask if allowed is None else allowed & by_mask
        return allowed

    return mask_mod


# Mods: what a FlexAttention kernel gives flex_attention for the spec's mask, bias and
# causal rule, (score_mod, block_mask), from (q, k, mask, bias, is_causal).
Mods = Callable[[Any, Any, Any, Any, bool], tuple[Any, Any]]


def _block_mask_mods(q: Any, k: Any, mask: Any, bias: Any, is_causal: bool) -> tuple[Any, Any]:
    """The mask and the causal rule in a ``BlockMask``, the bias in a ``score_mod``."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask_mod = _allowed(mask, is_causal)
    block_mask = (
        None
        if mask_mod is None
        else create_block_mask(
            mask_mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], device=str(q.device)
        )
    )
    return _bias_mod(bias), block_mask


def _score_mod_only(q: Any, k: Any, mask: Any, bias: Any, is_causal: bool) -> tuple[Any, Any]:
    """Mask, causal rule and bias all in one ``score_mod`` (-inf where a key is masked out)."""
    biased, allowed = _bias_mod(bias), _allowed(mask, is_causal)

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if biased is not None:
            score = biased(score, b, h, q_idx, kv_idx)
        if allowed is not None:
            score = score.masked_fill(~allowed(b, h, q_idx, kv_idx), float("-inf"))
        return score

    no_mod = biased is None and allowed is None
    return None if no_mod else score_mod, None


def _flex_kernel(flex: Callable[[], Any], mods: Mods, name: str, module: str) -> Callable[..., Any]:
    """A FlexAttention kernel in the spec's convention, its keywords by position too, and
    FlexAttention's ``enable_gqa``, calling ``flex()`` with ``mods``; named ``module.name``
    (where it is bound, so that it loads and pickles by that name)."""

    @convention(optional={**SPEC_KEYWORDS, "enable_gqa": False}, name=name, module=module)
    def kernel(call: SimpleNamespace) -> Any:
        q, k, v = call.q, call.k, call.v
        score_mod, block_mask = mods(q, k, call.mask, call.bias, call.is_causal)
        return flex()(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            scale=call.scale,
            enable_gqa=call.enable_gqa,
        )

    return kernel


def flex_kernels(
    flex: Callable[[], Any], names: tuple[str, str], module: str
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The two FlexAttention kernels in the spec's convention, calling ``flex()``: eager
    ``flex_attention`` here, ``torch.compile`` of it in scripts/device_flex.py.  The first
    puts the mask and the causal rule in a ``BlockMask`` and the bias in a ``score_mod``,
    the second all three in one ``score_mod``; they are named ``module.names[i]`` (where
    they are bound, so that they load and pickle by that name)."""
    block_mask_name, score_mod_name = names
    return (
        _flex_kernel(flex, _block_mask_mods, block_mask_name, module),
        _flex_kernel(flex, _score_mod_only, score_mod_name, module),
    )


# Every new shape, dtype or mod closure may compile once more; past Dynamo's default limit
# of 8 recompilations a compiled function falls back to running eagerly without saying so
# in the result, and a check would no longer be of the compiled kernel.
RECOMPILE_LIMIT = 512


def raise_recompile_limits() -> None:
    """Dynamo's recompilation limits raised to :data:`RECOMPILE_LIMIT` (never lowered)."""
    import torch

    for option in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        current = getattr(torch._dynamo.config, option, None)
        if isinstance(current, int) and current < RECOMPILE_LIMIT:
            setattr(torch._dynamo.config, option, RECOMPILE_LIMIT)


def _eager_flex_attention() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


_flex_block_mask, _flex_score_mod = flex_kernels(
    _eager_flex_attention, ("_flex_block_mask", "_flex_score_mod"), __name__
)


# FlexAttention takes (B, H, L, E) with E == Ev and no empty length, mask and bias through
# mods, GQA through enable_gqa.
_FLEX = {
    "batch_ndim": 1,
    "bias": True,
    "gqa": True,
    "gqa_keyword": "enable_gqa",
    "empty_sizes": False,
}
flex_attention_block_mask = pad_head_dims(declare(_flex_block_mask, **_FLEX))
flex_attention_block_mask.__name__ = flex_attention_block_mask.__qualname__ = (
    "flex_attention_block_mask"
)
flex_attention_score_mod = pad_head_dims(declare(_flex_score_mod, **_FLEX))
flex_attention_score_mod.__name__ = flex_attention_score_mod.__qualname__ = (
    "flex_attention_score_mod"
)


def _with_sink_column(score_mod: Any, sinks: Any, n_keys: int) -> Any:
    """``score_mod`` over keys ``0 .. n_keys - 1``, and the head's sink logit as the score of
    one more key at index ``n_keys`` (SINK-1: a logit, not scaled, biased or masked; with a
    value of 0 it joins the denominator only).  The other mods are read at an index clamped
    into the real keys, since FlexAttention calls them for the appended key as well."""
    import torch

    per_head = sinks.reshape(-1, sinks.shape[-1])  # (1 | B, Hq)

    def score_mod_with_sink(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        real = torch.clamp(kv_idx, max=n_keys - 1)
        scored = score if score_mod is None else score_mod(score, b, h, q_idx, real)
        sink = per_head[b if per_head.shape[0] > 1 else 0, h].to(scored.dtype)
        return torch.where(kv_idx == n_keys, sink, scored)

    return score_mod_with_sink


@convention(
    optional={**SPEC_KEYWORDS, "enable_gqa": False, "sinks": None},
    name="_flex_sink_score_mod",
    module=__name__,
)
def _flex_sink_score_mod(call: SimpleNamespace) -> Any:
    """Eager FlexAttention with gpt-oss's sink logits as a ``score_mod``: flex_attention
    cannot add a term to the denominator, so k and v get one more key of zeros whose score
    the ``score_mod`` sets to the head's sink (mask, causal rule and bias as in
    ``flex_attention_score_mod``); without sinks, that kernel's call."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v, sinks = call.q, call.k, call.v, call.sinks
    score_mod, _ = _score_mod_only(q, k, call.mask, call.bias, call.is_causal)
    if sinks is not None:
        score_mod = _with_sink_column(score_mod, sinks, k.shape[-2])
        k, v = (torch.cat([x, x.new_zeros((*x.shape[:-2], 1, x.shape[-1]))], -2) for x in (k, v))
    return flex_attention(
        q, k, v, score_mod=score_mod, scale=call.scale, enable_gqa=call.enable_gqa
    )


flex_attention_sinks = pad_head_dims(declare(_flex_sink_score_mod, **_FLEX, sinks=True))
flex_attention_sinks.__name__ = flex_attention_sinks.__qualname__ = "flex_attention_sinks"


def _identity_mha(embed_dim: int, num_heads: int, dtype: Any, device: Any) -> Any:
    import torch

    layer = torch.nn.MultiheadAttention(
        embed_dim, num_heads, bias=False, batch_first=True, dtype=dtype, device=device
    )
    eye = torch.eye(embed_dim, dtype=dtype, device=device)
    with torch.no_grad():
        layer.in_proj_weight.copy_(torch.cat([eye, eye, eye]))
        layer.out_proj.weight.copy_(eye)
    # inference, as a user runs it: no autograd graph (and the fast path may be taken)
    return layer.eval().requires_grad_(False)


def _key_only(mask: Any) -> bool:
    """A (..., 1|H==1, 1, Lk) mask: one row of keys for every query and head."""
    return bool(mask.ndim >= 2 and mask.shape[-2] == 1 and (mask.ndim < 3 or mask.shape[-3] == 1))


# Heads go through the layer in groups, so its (H E)^2 identity projections stay small
# however many heads the suite draws; each group is the same multi-head code path.
HEADS_PER_CALL = 8


def _mha(q: Any, k: Any, v: Any, attn_mask: Any = None, need_weights: bool = True) -> Any:
    import torch

    batch, heads, n_queries, head_dim = q.shape
    n_keys = k.shape[2]
    key_padding, attention_mask = None, None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        masked_out = ~attn_mask
        if _key_only(masked_out):
            key_padding = _as_4d(masked_out).expand(batch, 1, 1, n_keys)[:, 0, 0, :]
        else:
            attention_mask = masked_out
    elif attn_mask is not None:  # float: an additive bias, as in SDPA
        attention_mask = attn_mask
    if attention_mask is not None:
        attention_mask = _as_4d(attention_mask).expand(batch, heads, n_queries, n_keys)
    outs, weights = [], []
    for first in range(0, heads, HEADS_PER_CALL):
        group = slice(first, min(first + HEADS_PER_CALL, heads))
        out, weight = _mha_group(
            q[:, group],
            k[:, group],
            v[:, group],
            key_padding,
            None if attention_mask is None else attention_mask[:, group],
            need_weights,
        )
        outs.append(out)
        weights.append(weight)
    out = torch.cat(outs, dim=1) if outs else q.new_zeros(batch, 0, n_queries, head_dim)
    if not need_weights:
        return out
    weight = torch.cat(weights, dim=1) if weights else q.new_zeros(batch, 0, n_queries, n_keys)
    return out, weight


def _mha_group(
    q: Any, k: Any, v: Any, key_padding: Any, attention_mask: Any, need_weights: bool
) -> tuple[Any, Any]:
    batch, heads, n_queries, head_dim = q.shape

    def concat_heads(x: Any) -> Any:  # (B, H, L, E) -> (B, L, H E)
        return x.transpose(1, 2).reshape(batch, x.shape[2], heads * head_dim)

    if attention_mask is not None:  # (B H, Lq, Lk): batch-major, then heads
        attention_mask = attention_mask.reshape(batch * heads, n_queries, k.shape[2])
    layer = _identity_mha(heads * head_dim, heads, q.dtype, q.device)
    out, weights = layer(
        concat_heads(q),
        concat_heads(k),
        concat_heads(v),
        key_padding_mask=key_padding,
        attn_mask=attention_mask,
        need_weights=need_weights,
        average_attn_weights=False,
    )
    return out.reshape(batch, n_queries, heads, head_dim).transpose(1, 2), weights


def _mha_weights(q: Any, k: Any, v: Any, attn_mask: Any = None) -> Any:
    return _mha(q, k, v, attn_mask, need_weights=True)


def _mha_no_weights(q: Any, k: Any, v: Any, attn_mask: Any = None) -> Any:
    return _mha(q, k, v, attn_mask, need_weights=False)


# Scale fixed at 1/sqrt(E), no is_causal of its own (its is_causal is a hint about
# attn_mask), one batch dim, E == Ev (the heads share one embedding); a boolean or float
# attn_mask, as SDPA's, so mask and bias are never combined by the kernel.
_MHA = {
    "batch_ndim": 1,
    "mask_keyword": "attn_mask",
    "bias": True,
    "bias_keyword": "attn_mask",
    "causal": False,
    "scale": False,
}
multihead_attention = pad_head_dims(declare(_mha_weights, returns_weights=True, **_MHA))
multihead_attention.__name__ = multihead_attention.__qualname__ = "multihead_attention"
# need_weights=False with an attn_mask raises for Lk = 0 (docs/divergences.md#mha-empty-keys)
multihead_attention_no_weights = pad_head_dims(declare(_mha_no_weights, empty_sizes=False, **_MHA))
multihead_attention_no_weights.__name__ = multihead_attention_no_weights.__qualname__ = (
    "multihead_attention_no_weights"
)


# SDPA pinned to one of its CUDA backends (the CPU ones: ``torch_kernels``)
sdpa_cuda_math = sdpa_on("MATH", "sdpa_cuda_math", __name__)
sdpa_cuda_efficient = sdpa_on("EFFICIENT_ATTENTION", "sdpa_cuda_efficient", __name__)
sdpa_cuda_flash = sdpa_on("FLASH_ATTENTION", "sdpa_cuda_flash", __name__)
sdpa_cuda_cudnn = sdpa_on("CUDNN_ATTENTION", "sdpa_cuda_cudnn", __name__)
