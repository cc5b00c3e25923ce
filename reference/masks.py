"""Mask builders for the dense clauses (SDPA-3, SDPA-4).

Builders create arrays from nothing, so they take ``xp=``/``device=``; without them
they use the selected backend (``attnspec.get_backend()``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ._array import Array
from ._checks import check_choice, check_size

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def creation_namespace(xp: ModuleType | None, device: Any) -> tuple[ModuleType, Any]:
    """The namespace and device a builder creates arrays with."""
    if xp is None:
        from ..backends import get_backend

        backend = get_backend()
        return backend.xp, backend.device if device is None else device
    return xp, device


def causal_offset(n_queries: int, n_keys: int, alignment: str) -> int:
    """d such that query i may attend key j iff j <= i + d (SDPA-4.1, SDPA-4.2)."""
    return 0 if alignment == "top_left" else n_keys - n_queries


def causal_mask(
    n_queries: int,
    n_keys: int,
    alignment: str = "top_left",
    *,
    xp: ModuleType | None = None,
    device: Any = None,
) -> Array:
    """Boolean ``(n_queries, n_keys)`` mask, True where query i may attend key j.

    ``top_left``: j <= i (SDPA-4.1).  ``bottom_right``: j <= i + n_keys - n_queries
    (SDPA-4.2); when n_queries > n_keys its first rows are all False (SDPA-4.3).
    """
    call = "causal_mask(n_queries, n_keys, alignment)"
    n_queries = check_size("n_queries", n_queries, call)
    n_keys = check_size("n_keys", n_keys, call)
    check_choice("alignment", alignment, CAUSAL_ALIGNMENTS, call, "SDPA-4.3")
    xp, device = creation_namespace(xp, device)
    rows = xp.arange(n_queries, device=device)[:, None]
    cols = xp.arange(n_keys, device=device)[None, :]
    return cols <= rows + causal_offset(n_queries, n_keys, alignment)


def padding_mask(
    key_lengths: Array, n_keys: int, *, xp: ModuleType | None = None, device: Any = None
) -> Array:
    """Boolean ``(batch, 1, 1, n_keys)`` mask keeping the first ``key_lengths[b]`` keys."""
    call = "padding_mask(key_lengths, n_keys)"
    n_keys = check_size("n_keys", n_keys, call)
    xp, device = creation_namespace(xp, device)
    lengths = xp.asarray(key_lengths, device=device)
    if lengths.ndim != 1 or not xp.isdtype(lengths.dtype, "integral"):
        raise ValueError(f"key_lengths should be a 1-d sequence of ints [{call}]")
    cols = xp.arange(n_keys, device=device)
    return (cols[None, :] < lengths[:, None])[:, None, None, :]
