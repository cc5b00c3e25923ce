"""Absorbed multi-head latent attention (MLA-1 … MLA-3) in NumPy at DeepSeek V3's sizes
(latent width 512, rotary part 64): a correct kernel and the bugs MLA ports had.

The dense kernels are ``fn(q (..., Hq, Lq, 576), kv (..., 1, Lk, 576), *, scale,
is_causal=False)`` -> ``(..., Hq, Lq, 512)``; the paged ones FlashMLA's (MLA-4, below).  All
are bottom-right causal and accumulate in float32 for float16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnspec.conformance import MlaClaim, declare

from .entry import CaughtBug

Array = np.ndarray
RANK = 512
CLAIMS = dict(mla=MlaClaim(), causal_alignment="bottom_right")


def _mla(
    q: Array, kv: Array, scale: float, is_causal: bool, values: Callable[[Array], Array]
) -> Array:
    work = np.float32 if q.dtype == np.float16 else q.dtype.type
    k = kv.astype(work)
    scores = (q.astype(work) @ np.swapaxes(k, -1, -2)) * work(scale)
    n_queries, n_keys = scores.shape[-2:]
    if is_causal:
        allowed = np.arange(n_keys)[None, :] <= np.arange(n_queries)[:, None] + n_keys - n_queries
        scores = np.where(allowed, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    exps = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = exps.sum(-1, keepdims=True)
    out = (exps @ values(k)) / np.where(total == 0, 1, total)
    return out.astype(q.dtype)


@declare(**CLAIMS)
def mla_absorbed(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Keys the latent cache, values its first 512 channels, the given scale."""
    return _mla(q, kv, scale, is_causal, lambda k: k[..., :RANK])


@declare(**CLAIMS)
def mla_default_scale(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Bug: the kernel's own 1/sqrt(576) instead of the model's scale (MLA-2)."""
    return _mla(q, kv, q.shape[-1] ** -0.5, is_causal, lambda k: k[..., :RANK])


@declare(**CLAIMS)
def mla_values_from_the_end(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Bug: the values read as the last 512 channels, the rotary part among them."""
    return _mla(q, kv, scale, is_causal, lambda k: k[..., -RANK:])


@declare(**CLAIMS)
def mla_top_left(q: Array, kv: Array, *, scale: float, is_causal: bool = False) -> Array:
    """Bug: causal rows aligned top-left, so speculative decoding's rows miss the newest
    latent positions."""
    work = np.float32 if q.dtype == np.float16 else q.dtype.type
    n_queries, n_keys = q.shape[-2], kv.shape[-2]
    if not is_causal or n_queries == n_keys:
        return _mla(q, kv, scale, is_causal, lambda k: k[..., :RANK])
    k = kv.astype(work)
    scores = (q.astype(work) @ np.swapaxes(k, -1, -2)) * work(scale)
    scores = np.where(np.tril(np.ones((n_queries, n_keys), bool)), scores, -np.inf)
    exps = np.exp(scores - scores.max(-1, keepdims=True))
    return ((exps @ k[..., :RANK]) / exps.sum(-1, keepdims=True)).astype(q.dtype)


# MLA-4, MLA-5: FlashMLA's paged form, fn(q (B, Lq, Hq, 576), k_cache (N, P, 1, 576),
# block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=False) -> (out (B, Lq,
# Hq, 512), lse (B, Hq, Lq) float32), its default scale 1/sqrt(576)
PAGED_CLAIMS = dict(
    mla=MlaClaim(paged=True, default_scale=True),
    causal_alignment="bottom_right",
    returns_lse=True,
)
Pages = Callable[[Array, int, int], Array]  # (block_table row, positions, page size) -> pages


def _table_pages(row: Array, positions: Array, page: int) -> Array:
    return row[positions // page]


def _attend_latents(
    q: Array,
    latents: list[Array],
    lengths: list[int],
    scale: float,
    causal: bool,
    values: Callable[[Array], Array],
    offset: Callable[[int, int], int],
) -> tuple[Array, Array]:
    """Each sequence on its own, ``latents[b]`` its latent vectors in order, of which the
    first ``lengths[b]`` are its keys (the rest masked, but multiplied by their zero
    weights): keys the whole vectors, values what ``values`` takes of them, the causal
    offset ``offset(keys, queries)``."""
    work = np.float32 if q.dtype == np.float16 else q.dtype.type
    outs, lses = [], []
    for q_b, latent, n_keys in zip(q.astype(work), latents, lengths, strict=True):
        latent = latent.astype(work)
        scores = np.einsum("lhe,ke->hlk", q_b, latent) * work(scale)
        keys = np.arange(len(latent))[None, :]
        allowed = keys < n_keys
        if causal:
            allowed = allowed & (
                keys <= np.arange(q_b.shape[0])[:, None] + offset(n_keys, len(q_b))
            )
        scores = np.where(allowed, scores, -np.inf)
        top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
        exps = np.exp(scores - np.where(top == -np.inf, 0, top))
        total = exps.sum(-1, keepdims=True)
        outs.append(np.swapaxes((exps @ values(latent)) / np.where(total == 0, 1, total), 0, 1))
        with np.errstate(divide="ignore"):  # log 0 = -inf: a row that sees no key (LSE-2)
            lses.append((top + np.log(total))[..., 0])
    return np.stack(outs).astype(q.dtype), np.stack(lses)


def _flash_mla_style(
    name: str,
    doc: str,
    values: Callable[[Array, int], Array],
    pages: Pages = _table_pages,
    default: Callable[[Array, int], float] = lambda q, head_dim_v: q.shape[-1] ** -0.5,
    read: Callable[[int, int], int] = lambda length, page: length,
    offset: Callable[[int, int], int] = lambda keys, queries: keys - queries,
) -> Callable[..., tuple[Array, Array]]:
    """A kernel called as FlashMLA (MLA-4), ``fn(q, k_cache, block_table=, cache_seqlens=,
    head_dim_v=, softmax_scale=None, causal=False)``: ``values(latent, head_dim_v)`` the
    values, ``pages`` the pages read, ``default(q, head_dim_v)`` the scale when none is
    passed, ``read(length, page)`` the positions gathered (the sequence's own by default),
    ``offset(keys, queries)`` the causal offset (bottom-right)."""

    def kernel(q: Array, k_cache: Array, **call: Any) -> tuple[Array, Array]:
        page, head_dim_v = k_cache.shape[1], call["head_dim_v"]
        lengths = [int(length) for length in call["cache_seqlens"]]
        latents = []
        for row, length in zip(call["block_table"], lengths, strict=True):
            positions = np.arange(read(length, page))
            latents.append(k_cache[pages(row, positions, page), positions % page, 0])
        scale = call.get("softmax_scale")
        return _attend_latents(
            q,
            latents,
            lengths,
            default(q, head_dim_v) if scale is None else scale,
            call.get("causal", False),
            lambda latent: values(latent, head_dim_v),
            offset,
        )

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return declare(kernel, **PAGED_CLAIMS)


def _first_channels(latent: Array, head_dim_v: int) -> Array:
    return latent[:, :head_dim_v]


mla_paged = _flash_mla_style(
    "mla_paged",
    "FlashMLA's call: values the first head_dim_v channels of each latent vector, the "
    "default scale 1/sqrt(576) of q's head dim.",
    _first_channels,
)

CORRECT = (mla_absorbed, mla_paged)


def _last_page_from_row_end(row: Array, positions: Array, page: int) -> Array:
    """A partial last page taken from the row's last entry, as if every row held exactly
    its sequence's pages."""
    pages = row[positions // page]
    if len(positions) % page:
        pages = np.where(positions // page == len(positions) // page, row[-1], pages)
    return pages


mla_paged_values_after_rope = _flash_mla_style(
    "mla_paged_values_after_rope",
    "Bug: the values read as the latent vector's last head_dim_v channels, the rotary part "
    "among them (a slice from the wrong end).",
    lambda latent, head_dim_v: latent[:, -head_dim_v:],
)
mla_paged_last_page_from_row_end = _flash_mla_style(
    "mla_paged_last_page_from_row_end",
    "Bug: the partial last page read from the block-table row's last entry.",
    _first_channels,
    _last_page_from_row_end,
)
mla_paged_default_from_value_dim = _flash_mla_style(
    "mla_paged_default_from_value_dim",
    "Bug: with no scale given, 1/sqrt(head_dim_v) = 1/sqrt(512) instead of 1/sqrt(576).",
    _first_channels,
    default=lambda q, head_dim_v: head_dim_v**-0.5,
)

mla_paged_whole_pages = _flash_mla_style(
    "mla_paged_whole_pages",
    "Bug: every page a sequence reaches gathered whole, the slots past its length masked "
    "to zero weights that still multiply their values (0 * NaN = NaN; PAGED-5).",
    _first_channels,
    read=lambda length, page: -(-length // page) * page,
)
mla_paged_offset_clamped = _flash_mla_style(
    "mla_paged_offset_clamped",
    "Bug: the causal offset clamped at 0, so a sequence with more queries than cached keys "
    "has its first rows see the first keys instead of none (PAGED-3).",
    _first_channels,
    offset=lambda keys, queries: max(keys - queries, 0),
)


BUGS = (
    CaughtBug(mla_default_scale, "mla-matches-reference"),
    CaughtBug(mla_values_from_the_end, "mla-matches-reference"),
    CaughtBug(mla_top_left, "mla-matches-reference"),
    CaughtBug(mla_paged_values_after_rope, "mla-paged-matches-reference"),
    CaughtBug(mla_paged_last_page_from_row_end, "mla-paged-matches-reference"),
    CaughtBug(mla_paged_default_from_value_dim, "mla-paged-matches-reference"),
    CaughtBug(mla_paged_whole_pages, "mla-paged-matches-reference"),
    CaughtBug(mla_paged_offset_clamped, "mla-paged-matches-reference"),
)
