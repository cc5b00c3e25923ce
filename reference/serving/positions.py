"""The positions a serving mask compares: each query's key position and each key's."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .._array import Array
from .._checks import check_choice
from .._keywords import Creation
from ..masks import CAUSAL_ALIGNMENTS, causal_offset, creation_namespace


def query_and_key_positions(
    n_queries: int, n_keys: int, alignment: Any, where: Creation, call: str, clause: str
) -> tuple[ModuleType, Array, Array]:
    """The namespace of ``where`` and the key positions ``t_i = i + d (n_queries, 1)`` of
    the queries, for the alignment's offset d (SDPA-4.1, SDPA-4.2), and ``j (1, n_keys)``
    of the keys; ``alignment`` checked, its errors citing ``clause``."""
    check_choice("alignment", alignment, CAUSAL_ALIGNMENTS, call, clause)
    xp, device = creation_namespace(where.get("xp"), where.get("device"))
    t = xp.arange(n_queries, device=device)[:, None] + causal_offset(n_queries, n_keys, alignment)
    return xp, t, xp.arange(n_keys, device=device)[None, :]
