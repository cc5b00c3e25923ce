"""Hugging Face transformers' attention functions as functions in the spec's convention,
and their declarations.

A model's attention layer calls ``attention_interface(self, query, key, value,
attention_mask, scaling=..., dropout=..., ...)``: the layer object itself is passed as
``module`` and read for ``num_key_value_groups`` (GQA), ``is_causal``, ``training`` (dropout)
and, in gpt-oss, ``sinks``.  These adapters pass a stand-in holding just those attributes
(``H_q // H_kv`` groups, ``training=False``), take (B, H, L, E) inputs as transformers does,
and transpose the (B, L, H, E_v) output back.  The scale defaults to ``E ** -0.5``, as every
model's ``self.scaling`` is ``head_dim ** -0.5`` (the eager functions have no default).

- ``sdpa_attention_forward`` (``transformers.integrations.sdpa_attention``): PyTorch's SDPA
  with the model's ``attention_mask`` (bool or additive float) as ``attn_mask``; ``is_causal``
  only without a mask (transformers builds causal masks itself), top-left.
- ``eager_attention_forward`` of Llama (``transformers.models.llama.modeling_llama``), the
  function most models copy: an additive float mask only, no ``is_causal``.
- gpt-oss's ``eager_attention_forward`` (``transformers.models.gpt_oss.modeling_gpt_oss``):
  Llama's with a learned sink logit per head (``module.sinks``, SINK-1).
- ``flex_attention_forward`` (``transformers.integrations.flex_attention``): PyTorch's
  FlexAttention, compiled by transformers with ``torch.compile`` (Dynamo's recompilation
  limits raised, so that the compiled kernel, not an eager fallback, is what is checked), the
  (float) mask added in a score_mod that reads it as ``(B, 1, Lq, Lk)``
  (``score_mask[batch_idx][0]``: the adapter broadcasts a bias to ``(B, H, Lq, Lk)``, as the
  spec means it, and transformers reads head 0), its ``softcap`` applied before the mask;
  sinks (``s_aux``) it refuses on the CPU.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...claims.declaration import declare
from ..convention import convention


def _module(q: Any, k: Any, is_causal: bool = False, sinks: Any = None) -> SimpleNamespace:
    """The attributes of an attention layer that transformers' functions read."""
    groups = q.shape[1] // k.shape[1] if k.shape[1] else 1
    return SimpleNamespace(
        num_key_value_groups=groups, is_causal=is_causal, training=False, sinks=sinks
    )


def _scaling(q: Any, scale: float | None) -> float:
    return float(q.shape[-1] ** -0.5) if scale is None else float(scale)


@convention(optional={"attn_mask": None}, keywords={"is_causal": False, "scale": None})
def sdpa_attention(call: SimpleNamespace) -> Any:
    """``transformers.integrations.sdpa_attention.sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, is_causal = call.q, call.k, call.v, call.is_causal
    module = _module(q, k, is_causal)
    out, _ = sdpa_attention_forward(
        module, q, k, v, call.attn_mask, scaling=call.scale, is_causal=is_causal
    )
    return out.transpose(1, 2)


@convention(optional={"attention_mask": None}, keywords={"scale": None})
def eager_attention(call: SimpleNamespace) -> Any:
    """Llama's ``eager_attention_forward``."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    q, k, v, scaling = call.q, call.k, call.v, _scaling(call.q, call.scale)
    out, _ = eager_attention_forward(_module(q, k), q, k, v, call.attention_mask, scaling)
    return out.transpose(1, 2)


@convention(optional={"attention_mask": None}, keywords={"sinks": None, "scale": None})
def gpt_oss_eager_attention(call: SimpleNamespace) -> Any:
    """gpt-oss's ``eager_attention_forward``: ``sinks`` (H_q) as ``module.sinks``; without
    sinks, sink logits of -inf (a term e^-inf = 0 in the denominator: plain attention)."""
    import torch
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v, sinks = call.q, call.k, call.v, call.sinks
    if sinks is None:
        sinks = torch.full((q.shape[1],), -torch.inf, dtype=q.dtype, device=q.device)
    module = _module(q, k, sinks=sinks)
    out, _ = eager_attention_forward(module, q, k, v, call.attention_mask, _scaling(q, call.scale))
    return out.transpose(1, 2)


@convention(optional={"attention_mask": None}, keywords={"scale": None, "softcap": None})
def flex_attention(call: SimpleNamespace) -> Any:
    """``transformers.integrations.flex_attention.flex_attention_forward``."""
    import torch
    from transformers.integrations.flex_attention import flex_attention_forward

    from .torch import raise_recompile_limits

    raise_recompile_limits()
    q, k, v, mask = call.q, call.k, call.v, call.attention_mask
    if mask is not None:  # its score_mod indexes a 4-d mask by batch element
        mask = torch.broadcast_to(mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    out, _ = flex_attention_forward(
        _module(q, k), q, k, v, mask, scaling=_scaling(q, call.scale), softcap=call.softcap
    )
    return out.transpose(1, 2)


# transformers passes 4-d (B, H, L, E) tensors; GQA by head counts
_COMMON = {"gqa": True, "batch_ndim": 1}
# a bool or float attention_mask through SDPA's attn_mask; is_causal ignored with a mask
sdpa_attention = declare(
    sdpa_attention,
    **_COMMON,
    mask_keyword="attn_mask",
    bias=True,
    bias_keyword="attn_mask",
    mask_and_causal=False,
)
# the eager functions add the (float) attention_mask to the scores and have no is_causal
_EAGER = {
    **_COMMON,
    "mask": False,
    "bias": True,
    "bias_keyword": "attention_mask",
    "causal": False,
}
eager_attention = declare(eager_attention, **_EAGER)
gpt_oss_eager_attention = declare(gpt_oss_eager_attention, **_EAGER, sinks=True)
flex_attention = declare(flex_attention, **_EAGER, softcap=True)
