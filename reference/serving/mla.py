"""Multi-head latent attention in its absorbed form (spec/serving.md, MLA-1 … MLA-3).

Multi-query attention over one latent head whose first ``value_dim`` channels are the
values: nothing here but slicing the cache and the dense definition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from .._array import Array
from .._checks import check_scale, check_size, namespace_of
from ..attention import scaled_dot_product_attention
from ..options import ReturnLse, ScoreOptions, filled, shows_options

if TYPE_CHECKING:
    from typing import Unpack

CALL = "mla_attention(q, kv, value_dim=, scale=)"


def check_value_dim(value_dim: Any, head_dim: int, call: str) -> int:
    """MLA-1: 1 <= value_dim <= the latent cache's head dim (r <= r + d_r)."""
    checked = check_size("value_dim", value_dim, call, minimum=1)
    if checked > head_dim:
        raise ValueError(
            f"value_dim={checked}, but should be at most the latent head dim {head_dim}: "
            f"the values are its first value_dim channels [MLA-1, {call}]"
        )
    return checked


def require_scale(scale: Any, call: str) -> float:
    """MLA-2: the scale is the model's, given explicitly; no default applies."""
    checked = check_scale(scale, call)
    if checked is None:
        raise ValueError(
            f"scale=None, but should be the model's scale, e.g. (128 + 64)**-0.5 for "
            f"DeepSeek V3: 1/sqrt(576) is not it [MLA-2, {call}]"
        )
    return checked


class _MlaScores(TypedDict, total=False):
    mask: Array
    bias: Array
    is_causal: bool
    causal_alignment: str
    softcap: float | None


class MlaOptions(_MlaScores, ReturnLse, total=False):
    """``mla_attention``'s keywords beside ``value_dim`` and the required ``scale``: the
    dense definition's mask, bias, causal rule and softcap, and ``return_lse``."""


@shows_options(MlaOptions)
def mla_attention(
    q: Array, kv: Array, *, value_dim: int, scale: float, **given: Unpack[MlaOptions]
) -> Any:
    """Absorbed MLA (MLA-1): ``q (..., Hq, Lq, r + d_r)`` against one latent head ``kv
    (..., 1, Lk, r + d_r)``; keys are ``kv``, values its first ``value_dim`` = r channels.
    ``scale`` is required (MLA-2).  Returns ``out (..., Hq, Lq, r)`` in q's dtype, or
    ``(out, lse)``."""
    namespace_of(CALL, q=q, kv=kv)
    scale = require_scale(scale, CALL)
    if kv.ndim < 3 or kv.shape[-3] != 1:
        raise ValueError(
            f"kv.shape={tuple(kv.shape)}, but should be (..., 1, Lk, r + d_r): one latent "
            f"head shared by every query head [MLA-1, {CALL}]"
        )
    value_dim = check_value_dim(value_dim, kv.shape[-1], CALL)
    options = filled(MlaOptions, given)
    scores = filled(ScoreOptions, {**options, "scale": scale})
    return scaled_dot_product_attention(
        q, kv, kv[..., :value_dim], **scores, return_lse=options["return_lse"]
    )
