"""Boolean masks of the sparse patterns (spec/sparse.md, SPARSE-1 … SPARSE-5).

``sparse_mask`` is the one entry point the conformance suite calls with a declared
pattern name and parameters; each pattern also has a named builder.  The mask passed
to the dense reference *defines* the pattern's attention (SPARSE-1.1); the kernels of
``kernels.py`` compute the same thing without building it.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import array_api_compat

from .._array import Array
from ..masks import creation_namespace
from .definition import PATTERN_NAMES, BigBird, SparsePattern
from .parameters import (
    LIBRARY_WINDOWS,
    Placement,
    build_pattern,
    draw_random_blocks,
    library_window,
    shows_placement,
)

if TYPE_CHECKING:
    from typing import Unpack

__all__ = [
    "LIBRARY_WINDOWS",
    "PATTERN_NAMES",
    "bigbird_mask",
    "block_sparse_mask",
    "draw_random_blocks",
    "fixed_mask",
    "library_window",
    "longformer_mask",
    "sliding_window_mask",
    "sparse_mask",
    "strided_mask",
]


def pattern_mask(sets: SparsePattern, xp: ModuleType, device: Any) -> Array:
    """The boolean (Lq, Lk) mask of S(i): True where query i may attend key j."""
    rows = xp.arange(sets.n_queries, device=device)[:, None]
    cols = xp.arange(sets.n_keys, device=device)[None, :]
    return sets.allowed(xp, rows, cols)


def _mask_of(
    pattern: str, n_queries: int, n_keys: int, params: dict[str, Any], call: str, at: Placement
) -> tuple[SparsePattern, Any, ModuleType, Any]:
    """The pattern's index set S(i), its mask, and the namespace and device the mask is
    made with: ``at``'s, else a block_sparse array ``layout``'s, else the default backend's."""
    xp, device, layout = at.get("xp"), at.get("device"), params.get("layout")
    if xp is None and pattern == "block_sparse" and array_api_compat.is_array_api_obj(layout):
        xp, device = array_api_compat.array_namespace(layout), array_api_compat.device(layout)
    xp, device = creation_namespace(xp, device)
    sets = build_pattern(
        pattern, n_queries, n_keys, params, call, {**at, "xp": xp, "device": device}
    )
    return sets, pattern_mask(sets, xp, device), xp, device


def _pattern_mask(
    pattern: str, n_queries: int, n_keys: int, at: Placement, **params: Any
) -> tuple[SparsePattern, Any, ModuleType, Any]:
    """:func:`_mask_of` for ``<pattern>_mask(n_queries, n_keys, ...)``: the named mask
    functions below differ only in their pattern's parameters, which help() shows each."""
    call = f"{pattern}_mask(n_queries, n_keys)"
    return _mask_of(pattern, n_queries, n_keys, params, call, at)


def sparse_mask(
    pattern: str,
    n_queries: int,
    n_keys: int,
    *,
    alignment: str = "top_left",
    causal: bool = False,
    xp: ModuleType | None = None,
    device: Any = None,
    **params: Any,
) -> Array:
    """Boolean ``(n_queries, n_keys)`` mask of a spec pattern, True = may attend.

    ``pattern`` is one of :data:`PATTERN_NAMES`; ``params`` are that pattern's
    parameters (spec/sparse.md).  Queries sit at key positions ``i + d`` with ``d``
    from ``alignment`` (SPARSE-1.2); ``causal`` keeps only keys ``j <= i + d``
    (SPARSE-1.3).  This mask passed to the dense reference defines the pattern's
    attention (SPARSE-1.1).
    """
    call = f"sparse_mask(pattern={pattern!r}, n_queries, n_keys)"
    at = Placement(alignment=alignment, causal=causal, xp=xp, device=device)
    return _mask_of(pattern, n_queries, n_keys, params, call, at)[1]


# The named mask functions below take their pattern's parameters and, as **placement, the
# placement keywords (alignment, causal, xp, device) that help() shows in each signature.
@shows_placement
def sliding_window_mask(
    n_queries: int,
    n_keys: int,
    *,
    left: int | None,
    right: int | None,
    dilation: int = 1,
    **placement: Unpack[Placement],
) -> Array:
    """Keys ``t_i - left .. t_i + right`` (inclusive; None = unbounded) with
    ``(t_i - j) mod dilation == 0`` (SPARSE-2.1)."""
    return _pattern_mask(
        "sliding_window",
        n_queries,
        n_keys,
        placement,
        left=left,
        right=right,
        dilation=dilation,
    )[1]


@shows_placement
def strided_mask(
    n_queries: int,
    n_keys: int,
    *,
    stride: int,
    **placement: Unpack[Placement],
) -> Array:
    """Sparse Transformer strided pattern with stride l (SPARSE-3.1)."""
    return _pattern_mask("strided", n_queries, n_keys, placement, stride=stride)[1]


@shows_placement
def fixed_mask(
    n_queries: int,
    n_keys: int,
    *,
    stride: int,
    summary: int,
    **placement: Unpack[Placement],
) -> Array:
    """Sparse Transformer fixed pattern: own block of ``stride`` keys plus the last
    ``summary`` keys of every block (SPARSE-3.2)."""
    return _pattern_mask("fixed", n_queries, n_keys, placement, stride=stride, summary=summary)[1]


@shows_placement
def block_sparse_mask(
    n_queries: int,
    n_keys: int,
    *,
    layout: Any,
    block_size: int | tuple[int, int],
    **placement: Unpack[Placement],
) -> Array:
    """Query block I attends key block J iff ``layout[I, J]``; last blocks may be ragged
    (SPARSE-4.1)."""
    return _pattern_mask(
        "block_sparse",
        n_queries,
        n_keys,
        placement,
        layout=layout,
        block_size=block_size,
    )[1]


@shows_placement
def longformer_mask(
    n_queries: int,
    n_keys: int,
    *,
    left: int | None,
    right: int | None,
    global_tokens: Sequence[int] = (),
    dilation: int = 1,
    **placement: Unpack[Placement],
) -> Array:
    """Sliding window plus global tokens that attend, and are attended by, every
    position (SPARSE-5.1)."""
    return _pattern_mask(
        "longformer",
        n_queries,
        n_keys,
        placement,
        left=left,
        right=right,
        global_tokens=global_tokens,
        dilation=dilation,
    )[1]


@shows_placement
def bigbird_mask(
    n_queries: int,
    n_keys: int,
    *,
    block_size: int,
    num_random: int = 0,
    seed: int | None = None,
    window_blocks: int = 1,
    global_blocks: Sequence[int] = (),
    random_blocks: Any = None,
    **placement: Unpack[Placement],
) -> tuple[Array, Array]:
    """BigBird: block window, global blocks and ``num_random`` random key blocks per
    query block drawn from ``seed`` (SPARSE-5.2, SPARSE-5.3).

    Returns ``(mask, random_blocks)``: ``random_blocks[r]`` are the key blocks drawn
    for query block ``floor(d / block_size) + r`` (-1 = none), ready to pass back as
    ``random_blocks=`` to reproduce the pattern without the seed.
    """
    sets, mask, xp, device = _pattern_mask(
        "bigbird",
        n_queries,
        n_keys,
        placement,
        block_size=block_size,
        num_random=num_random,
        seed=seed,
        window_blocks=window_blocks,
        global_blocks=global_blocks,
        random_blocks=random_blocks,
    )
    assert isinstance(sets, BigBird)  # build_pattern("bigbird", ...) builds one
    return mask, sets.random_table(xp, device)
