"""Llama 4's chunked local attention (spec/serving.md, CHUNK-1): a mask."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .._array import Array
from .._checks import check_choice, check_size
from ..masks import CAUSAL_ALIGNMENTS, causal_offset, creation_namespace

CALL = "chunked_local_mask(n_queries, n_keys, chunk)"


def in_chunk(xp: ModuleType, t: Array, j: Array, chunk: int) -> Array:
    """CHUNK-1 for integer positions that broadcast: ``j <= t`` and both in one chunk of
    ``chunk`` positions counted from key position 0."""
    # floor division: t may be negative (rows that see nothing), and -1 // C is -1, chunk -1
    return xp.logical_and(j <= t, xp.floor_divide(j, chunk) == xp.floor_divide(t, chunk))


def chunked_local_mask(
    n_queries: int,
    n_keys: int,
    chunk: int,
    alignment: str = "bottom_right",
    *,
    xp: ModuleType | None = None,
    device: Any = None,
) -> Array:
    """CHUNK-1's allowed set as a boolean ``(n_queries, n_keys)`` mask, query i at key
    position ``t_i = i + d`` for the alignment's offset d."""
    check_size("n_queries", n_queries, CALL)
    check_size("n_keys", n_keys, CALL)
    check_size("chunk", chunk, CALL, minimum=1)
    check_choice("alignment", alignment, CAUSAL_ALIGNMENTS, CALL, "CHUNK-1")
    xp, device = creation_namespace(xp, device)
    t = xp.arange(n_queries, device=device)[:, None] + causal_offset(n_queries, n_keys, alignment)
    return in_chunk(xp, t, xp.arange(n_keys, device=device)[None, :], chunk)
