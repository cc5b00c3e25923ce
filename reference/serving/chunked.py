"""Llama 4's chunked local attention (spec/serving.md, CHUNK-1): a mask."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from .._array import Array
from .._checks import check_size
from .._keywords import Creation, shows_creation
from .positions import query_and_key_positions

if TYPE_CHECKING:
    from typing import Unpack

CALL = "chunked_local_mask(n_queries, n_keys, chunk)"


def in_chunk(xp: ModuleType, t: Array, j: Array, chunk: int) -> Array:
    """CHUNK-1 for integer positions that broadcast: ``j <= t`` and both in one chunk of
    ``chunk`` positions counted from key position 0."""
    # floor division: t may be negative (rows that see nothing), and -1 // C is -1, chunk -1
    return xp.logical_and(j <= t, xp.floor_divide(j, chunk) == xp.floor_divide(t, chunk))


@shows_creation
def chunked_local_mask(
    n_queries: int,
    n_keys: int,
    chunk: int,
    alignment: str = "bottom_right",
    **where: Unpack[Creation],
) -> Array:
    """CHUNK-1's allowed set as a boolean ``(n_queries, n_keys)`` mask, query i at key
    position ``t_i = i + d`` for the alignment's offset d."""
    check_size("n_queries", n_queries, CALL)
    check_size("n_keys", n_keys, CALL)
    check_size("chunk", chunk, CALL, minimum=1)
    xp, t, j = query_and_key_positions(n_queries, n_keys, alignment, where, CALL, "CHUNK-1")
    return in_chunk(xp, t, j, chunk)
