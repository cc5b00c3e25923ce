"""Variable-length (packed) attention of spec/features.md (VARLEN-1 … VARLEN-4).

Sequences of different lengths are packed along one token axis, ``q (T_q, Hq, E)``,
``k (T_k, Hkv, E)``, ``v (T_k, Hkv, Ev)``, and delimited by ``cu_seqlens_q`` and
``cu_seqlens_k``: int arrays of B + 1 cumulative offsets starting at 0 (FlashAttention's
``flash_attn_varlen_func``).  Each sequence is attended on its own, by the dense
definition: nothing here but slicing and :func:`~.attention.scaled_dot_product_attention`.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import array_api_compat

from ._array import Array
from ._checks import check_flag, namespace_of
from .options import CausalOptions, FeatureOptions, SinkLogits, filled, shows_options
from .sdpa import compute_dtype

if TYPE_CHECKING:
    from typing import Unpack

CALL = "varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k)"
PACKED = "(total_tokens, heads, head_dim)"


def sequence_offsets(
    cu_seqlens: Any, name: str, total: int, call: str, *, padding: bool = False
) -> list[int]:
    """``cu_seqlens`` as a list of Python ints, checked against VARLEN-1: a 1-d integer
    array of B + 1 non-decreasing offsets from 0 to ``total`` (with ``padding``, to at most
    ``total``: the tokens past the last offset are padding, VARLEN-5)."""
    xp = namespace_of(call, **{name: cu_seqlens})
    if cu_seqlens.ndim != 1 or not xp.isdtype(cu_seqlens.dtype, "integral"):
        raise TypeError(
            f"{name} has dtype {cu_seqlens.dtype} and shape "
            f"{tuple(cu_seqlens.shape)}, but should be a 1-d integer array of "
            f"B + 1 offsets [VARLEN-1, {call}]"
        )
    offsets = [int(cu_seqlens[i]) for i in range(cu_seqlens.shape[0])]
    if (
        not offsets
        or offsets[0] != 0
        or offsets[-1] > total
        or (offsets[-1] != total and not padding)
    ):
        end = "at most at" if padding else "at"
        raise ValueError(
            f"{name}={offsets}, but should start at 0 and end {end} the number of "
            f"packed tokens, {total} [VARLEN-1, {call}]"
        )
    if any(b < a for a, b in itertools.pairwise(offsets)):
        raise ValueError(
            f"{name}={offsets}, but should be non-decreasing (sequence lengths "
            f">= 0) [VARLEN-1, {call}]"
        )
    return offsets


def require_packed(call: str, **arrays: Array) -> None:
    """Each of ``arrays`` is packed: ``(total_tokens, heads, head_dim)`` (VARLEN-1)."""
    for name, a in arrays.items():
        if a.ndim != 3:
            raise ValueError(
                f"{name}.shape={tuple(a.shape)}, but should be {PACKED} [VARLEN-1, {call}]"
            )


def paired_offsets(
    cu_seqlens_q: Any, cu_seqlens_k: Any, q: Array, k: Array, call: str, *, padding: bool
) -> tuple[list[int], list[int]]:
    """The query and key offsets (:func:`sequence_offsets`), as many of each: B + 1."""
    starts_q = sequence_offsets(cu_seqlens_q, "cu_seqlens_q", q.shape[0], call, padding=padding)
    starts_k = sequence_offsets(cu_seqlens_k, "cu_seqlens_k", k.shape[0], call, padding=padding)
    if len(starts_q) != len(starts_k):
        raise ValueError(
            f"cu_seqlens_q has {len(starts_q)} offsets and cu_seqlens_k "
            f"{len(starts_k)}, but both should have B + 1 [VARLEN-1, {call}]"
        )
    return starts_q, starts_k


def heads_first(xp: Any, x: Any) -> Any:
    """A packed ``(tokens, heads, d)`` array as ``(heads, tokens, d)``, and back."""
    return xp.permute_dims(x, (1, 0, 2))


def sequence_masks(
    xp: Any, mask: Any, lengths: list[tuple[int, int]], call: str, clause: str
) -> list[Any]:
    """A flattened mask (VARLEN-6, PAGED-8) cut into each sequence's ``(L_q, L_k)`` mask:
    sequence b's entries row by row after the earlier sequences' ``L_q * L_k``."""
    size = sum(n_q * n_k for n_q, n_k in lengths)
    if mask.ndim != 1 or mask.shape[0] != size or not xp.isdtype(mask.dtype, "bool"):
        raise ValueError(
            f"mask has dtype {mask.dtype} and shape {tuple(mask.shape)}, but should be a "
            f"1-d boolean array of sum(L_q * L_k) = {size} elements [{clause}, {call}]"
        )
    masks, start = [], 0
    for n_q, n_k in lengths:
        masks.append(xp.reshape(mask[start : start + n_q * n_k], (n_q, n_k)))
        start += n_q * n_k
    return masks


class VarlenOptions(CausalOptions, FeatureOptions, SinkLogits, total=False):
    """``varlen_attention``'s keywords: no bias, a packed mask (VARLEN-6), sink logits."""

    mask: Array
    return_lse: bool


@shows_options(VarlenOptions)
def varlen_attention(
    q: Array,
    k: Array,
    v: Array,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    **given: Unpack[VarlenOptions],
) -> Any:
    """Packed attention (VARLEN-2): sequence b's output rows are the dense attention of
    its own queries ``q[cu_q[b]:cu_q[b+1]]`` and keys/values ``k[cu_k[b]:cu_k[b+1]]``, with
    causal alignment and ALiBi anchored per sequence (its own Lq, Lk).

    ``alibi_slopes`` is ``(Hq,)`` or ``(B, Hq)``; ``mask`` is flattened, sequence by
    sequence, ``(sum_b Lq_b * Lk_b,)`` boolean (VARLEN-6).  Offsets may end before the
    token counts: the tokens past them are padding, never read, and their output rows are
    0 (VARLEN-5).  ``sinks (Hq,)`` join every sequence's rows (SINK-6): a row that sees no
    key gives 0 and ``lse = sinks[h]``, a padding row 0 and -inf (it is no query).  Returns
    ``out (T_q, Hq, Ev)`` in q's dtype, or ``(out, lse)`` with ``lse (Hq, T_q)`` in the
    accumulation dtype (LSE-3; -inf for the padding rows).
    """
    # imported here: reference.serving imports this module (serving.paged's masks)
    from .serving.sinks import attention_with_sinks

    options = filled(VarlenOptions, given)
    mask, alibi_slopes, sinks = options["mask"], options["alibi_slopes"], options["sinks"]
    xp = namespace_of(CALL, q=q, k=k, v=v, alibi_slopes=alibi_slopes, mask=mask, sinks=sinks)
    return_lse = check_flag("return_lse", options["return_lse"], CALL)
    require_packed(CALL, q=q, k=k, v=v)
    if k.shape[0] != v.shape[0]:
        raise ValueError(
            f"k.shape[0]={k.shape[0]}, v.shape[0]={v.shape[0]}, but should be "
            f"equal: both hold the packed keys [VARLEN-1, {CALL}]"
        )
    starts_q, starts_k = paired_offsets(cu_seqlens_q, cu_seqlens_k, q, k, CALL, padding=True)
    if (
        alibi_slopes is not None
        and alibi_slopes.ndim == 2
        and alibi_slopes.shape[0] != len(starts_q) - 1
    ):
        raise ValueError(
            f"alibi_slopes.shape={tuple(alibi_slopes.shape)}, but should be "
            f"(Hq,) or (B, Hq) with B = {len(starts_q) - 1} [ALIBI-1, {CALL}]"
        )
    lengths = [
        (starts_q[b + 1] - starts_q[b], starts_k[b + 1] - starts_k[b])
        for b in range(len(starts_q) - 1)
    ]
    masks = (
        [None] * len(lengths)
        if mask is None
        else sequence_masks(xp, mask, lengths, CALL, "VARLEN-6")
    )
    outs, lses = [], []
    for b in range(len(starts_q) - 1):
        q_b = heads_first(xp, q[starts_q[b] : starts_q[b + 1], ...])
        k_b = heads_first(xp, k[starts_k[b] : starts_k[b + 1], ...])
        v_b = heads_first(xp, v[starts_k[b] : starts_k[b + 1], ...])
        slopes = (
            alibi_slopes if alibi_slopes is None or alibi_slopes.ndim == 1 else alibi_slopes[b, ...]
        )
        scores = dict(
            filled(CausalOptions, options),
            mask=masks[b],
            softcap=options["softcap"],
            alibi_slopes=slopes,
        )
        out_b, lse_b = attention_with_sinks(q_b, k_b, v_b, sinks, scores, CALL)
        outs.append(heads_first(xp, out_b))
        lses.append(lse_b)
    # the padding rows past cu_seqlens_q[-1] (all rows when B = 0) see no key (VARLEN-5)
    # and are no sequence's queries: no sink joins them (SINK-6)
    device, padding = array_api_compat.device(q), q.shape[0] - starts_q[-1]
    outs.append(xp.zeros((padding, q.shape[1], v.shape[2]), dtype=q.dtype, device=device))
    work = compute_dtype(xp, q.dtype)
    lses.append(xp.full((q.shape[1], padding), -xp.inf, dtype=work, device=device))
    out, lse = xp.concat(outs, axis=0), xp.concat(lses, axis=-1)
    return (out, lse) if return_lse else out
