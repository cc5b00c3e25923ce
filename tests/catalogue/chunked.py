"""Chunked local attention (CHUNK-1) in a dense call, ``attention_chunk=C`` as FlashAttention 3
takes it (0 for no chunk), in NumPy: two correct formulations and the bugs chunked kernels
have.

The correct ones differ as real kernels do: a mask of "same chunk as the query's key
position, and not past it" (Llama 4's model code), bottom-right; and FlashAttention 3's
arrangement, a causal window whose left edge is the query's offset inside its chunk
(``t mod C`` keys to the left), top-left.  Both take GQA, a bias, a mask and a softcap,
and build their scores with the catalogue's feature blocks (nothing of the reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .entry import ALL, SPEC_KEYWORDS, CaughtBug, SpecCall, spec_kernel
from .feature_blocks import Features, arranged, attend_features

Array = np.ndarray
KEYWORDS = {**SPEC_KEYWORDS, "softcap": None, "attention_chunk": 0}
CLAIMS = {**ALL, "chunk": True, "softcap": True}
PROPERTY = "chunk-matches-reference"


def _positions(call: SpecCall, alignment: str) -> tuple[Array, Array, Array]:
    """Query index i ``(Lq, 1)``, its key position t_i = i + d ``(Lq, 1)`` and the key
    positions j ``(1, Lk)``, d = 0 top-left or Lk - Lq bottom-right."""
    n_queries, n_keys = call.q.shape[-2], call.k.shape[-2]
    i = np.arange(n_queries)[:, None]
    offset = 0 if alignment == "top_left" else n_keys - n_queries
    return i, i + offset, np.arange(n_keys)[None, :]


def _same_chunk(call: SpecCall, alignment: str, bug: str | None) -> Array:
    """Llama 4's rule: key j in the query's chunk and not past t_i; ``bug`` does one step
    wrong: "query-index" counts the query's chunk from i, "no-causal-bound" lets a query
    see its whole chunk, "dropped-when-causal" keeps only the causal rule in causal calls."""
    chunk = call.attention_chunk
    i, t, j = _positions(call, alignment)
    own = (i if bug == "query-index" else t) // chunk
    allowed = j // chunk == own
    if bug != "no-causal-bound":
        allowed = allowed & (j <= t)
    if bug == "dropped-when-causal" and call.is_causal:
        allowed = np.ones_like(allowed)
    return allowed


def _window_in_chunk(call: SpecCall, alignment: str) -> Array:
    """FlashAttention 3's arrangement: a causal window reaching ``t mod C`` keys to the
    left, so it starts at the chunk's first position C floor(t / C)."""
    _, t, j = _positions(call, alignment)
    return (j <= t) & (t - j <= t % call.attention_chunk)


def _attend(call: SpecCall, alignment: str, allowed: Callable[[], Array]) -> Array:
    """The feature blocks' attention with the chunk's allowed set joined to the mask (no
    chunk for attention_chunk 0)."""
    q, k, v, mask, bias, is_causal, scale = call
    if call.attention_chunk:
        chunk = allowed()
        mask = chunk if mask is None else np.asarray(mask) & chunk
    f = Features(softcap=call.softcap, alignment=alignment)
    return attend_features(arranged(q, k, v, mask, bias, is_causal, scale, f), f)


@spec_kernel(KEYWORDS, **CLAIMS, causal_alignment="bottom_right")
def chunk_masked_bottom_right(call: SpecCall) -> Array:
    """Llama 4's chunk mask, bottom-right (a decoder's queries are the newest keys)."""
    return _attend(call, "bottom_right", lambda: _same_chunk(call, "bottom_right", None))


@spec_kernel(KEYWORDS, **CLAIMS)
def chunk_window_top_left(call: SpecCall) -> Array:
    """FlashAttention 3's arrangement, a causal window of t mod C keys, top-left."""
    return _attend(call, "top_left", lambda: _window_in_chunk(call, "top_left"))


CORRECT = (chunk_masked_bottom_right, chunk_window_top_left)


def _bug(name: str, doc: str) -> Callable[..., Any]:
    bug = name.replace("_", "-")

    @spec_kernel(KEYWORDS, **CLAIMS, causal_alignment="bottom_right")
    def kernel(call: SpecCall) -> Array:
        return _attend(call, "bottom_right", lambda: _same_chunk(call, "bottom_right", bug))

    kernel.__name__ = kernel.__qualname__ = "chunk_" + name
    kernel.__doc__ = doc
    return kernel


chunk_query_index = _bug(
    "query_index",
    "Bug: the query's chunk counted from its index i, not its key position t_i = i + Lk - Lq "
    "(right only when Lq == Lk; CHUNK-1's rationale).",
)
chunk_no_causal_bound = _bug(
    "no_causal_bound", "Bug: a query sees its whole chunk, the keys after it included."
)
chunk_dropped_when_causal = _bug(
    "dropped_when_causal",
    "Bug: in a causal call only the bottom-right causal rule applies, the chunk is ignored.",
)

BUGS = (
    CaughtBug(chunk_query_index, PROPERTY),
    CaughtBug(chunk_no_causal_bound, PROPERTY),
    CaughtBug(chunk_dropped_when_causal, PROPERTY),
)
