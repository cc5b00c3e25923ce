"""The index sets S(i) of the sparse patterns (spec/sparse.md, SPARSE-1 … SPARSE-5).

Each pattern is one pointwise predicate ``allowed(xp, i, j)`` on broadcastable integer
arrays, so the same formula builds the dense boolean mask (on the whole Lq x Lk grid,
``masks.py``) and checks the candidate keys of the sparse kernels
(``kernels.py``) on their gathered grid: mask and kernels cannot disagree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import array_api_compat

from .._array import Array

PATTERN_NAMES = ("sliding_window", "strided", "fixed", "block_sparse", "longformer", "bigbird")


def index_dtype(xp: ModuleType, device: Any) -> Any:
    """The library's default integer dtype for indices (int32 on JAX without x64)."""
    return xp.__array_namespace_info__().default_dtypes(device=device)["indexing"]


def _member(xp: ModuleType, x: Any, values: Sequence[int]) -> Any:
    """Elementwise ``x in values`` for a short tuple of Python ints."""
    found = xp.zeros_like(x, dtype=xp.bool)
    for value in values:
        found = xp.logical_or(found, x == value)
    return found


def in_window(
    xp: ModuleType, distance: Array, left: int | None, right: int | None, dilation: int
) -> Array:
    """``-right <= t - j <= left`` and ``(t - j) mod dilation == 0`` (SPARSE-2.1)."""
    inside = xp.ones_like(distance, dtype=xp.bool)
    if left is not None:
        inside = xp.logical_and(inside, distance <= left)
    if right is not None:
        inside = xp.logical_and(inside, distance >= -right)
    if dilation > 1:
        inside = xp.logical_and(inside, distance % dilation == 0)
    return inside


@dataclass(frozen=True, eq=False)
class SparsePattern(ABC):
    """S(i) of one pattern for one (Lq, Lk, alignment, causal) (SPARSE-1).

    ``offset`` is d of SPARSE-1.2: query i sits at key position t_i = i + d.
    """

    name: ClassVar[str]
    clause: ClassVar[str]
    n_queries: int
    n_keys: int
    offset: int
    causal: bool

    def __init_subclass__(cls, *, name: str, clause: str, **kwargs: Any) -> None:
        """Each pattern gives its name and its clause in its class line."""
        super().__init_subclass__(**kwargs)
        cls.name, cls.clause = name, clause

    def allowed(self, xp: ModuleType, i: Any, j: Any) -> Any:
        """True where key j is in S(i); i, j are integer arrays that broadcast (SPARSE-1.3)."""
        t = i + self.offset
        inside = self.contains(xp, i, t, j)
        return xp.logical_and(inside, j <= t) if self.causal else inside

    @abstractmethod
    def contains(self, xp: ModuleType, i: Any, t: Any, j: Any) -> Any:
        """The pattern's own set, before the causal restriction."""


@dataclass(frozen=True, eq=False)
class SlidingWindow(SparsePattern, name="sliding_window", clause="SPARSE-2.1"):
    left: int | None
    right: int | None
    dilation: int

    def contains(self, xp: ModuleType, i: Any, t: Any, j: Any) -> Any:
        return in_window(xp, t - j, self.left, self.right, self.dilation)


@dataclass(frozen=True, eq=False)
class Strided(SparsePattern, name="strided", clause="SPARSE-3.1"):
    stride: int

    def contains(self, xp: ModuleType, i: Any, t: Any, j: Any) -> Any:
        distance = t - j
        recent = xp.logical_and(distance >= 0, distance <= self.stride)
        return xp.logical_or(recent, distance % self.stride == 0)


@dataclass(frozen=True, eq=False)
class Fixed(SparsePattern, name="fixed", clause="SPARSE-3.2"):
    stride: int
    summary: int

    def contains(self, xp: ModuleType, i: Any, t: Any, j: Any) -> Any:
        # floor_divide rounds towards -inf, so t < 0 (SPARSE-1.2) is in a block of its own.
        same_block = xp.floor_divide(j, self.stride) == xp.floor_divide(t, self.stride)
        return xp.logical_or(same_block, j % self.stride >= self.stride - self.summary)


@dataclass(frozen=True, eq=False)
class BlockSparse(SparsePattern, name="block_sparse", clause="SPARSE-4.1"):
    layout: Any
    block_q: int
    block_k: int

    def contains(self, xp: ModuleType, i: Any, t: Any, j: Any) -> Any:
        i, j = xp.broadcast_arrays(i, j)
        flat = (i // self.block_q) * self.layout.shape[1] + j // self.block_k
        picked = xp.take(xp.reshape(self.layout, (-1,)), xp.reshape(flat, (-1,)))
        return xp.reshape(picked, flat.shape)


@dataclass(frozen=True, eq=False)
class Longformer(SlidingWindow, name="longformer", clause="SPARSE-5.1"):
    """The sliding window and the global tokens (SPARSE-5.1)."""

    global_tokens: tuple[int, ...]

    def contains(self, xp: ModuleType, i: Any, t: Any, j: Any) -> Any:
        globals_ = xp.logical_or(
            _member(xp, j, self.global_tokens), _member(xp, t, self.global_tokens)
        )
        return xp.logical_or(super().contains(xp, i, t, j), globals_)


@dataclass(frozen=True, eq=False)
class BigBird(SparsePattern, name="bigbird", clause="SPARSE-5.2"):
    """``random_blocks[r]`` are the random key blocks of query block ``first_block + r``."""

    block_size: int
    window_blocks: int
    global_blocks: tuple[int, ...]
    first_block: int
    random_blocks: tuple[tuple[int, ...], ...]

    def random_table(self, xp: ModuleType, device: Any) -> Any:
        """``random_blocks`` as an integer array (query blocks, r), -1 where none was drawn."""
        width = len(self.random_blocks[0]) if self.random_blocks else 0
        flat = [block for row in self.random_blocks for block in row]
        return xp.reshape(
            xp.asarray(flat, dtype=index_dtype(xp, device), device=device),
            (len(self.random_blocks), width),
        )

    def contains(self, xp: ModuleType, i: Any, t: Any, j: Any) -> Any:
        query_block = xp.floor_divide(t, self.block_size)
        key_block = j // self.block_size
        inside = xp.abs(query_block - key_block) <= self.window_blocks
        inside = xp.logical_or(inside, _member(xp, key_block, self.global_blocks))
        inside = xp.logical_or(inside, _member(xp, query_block, self.global_blocks))
        if self.random_blocks and self.random_blocks[0]:
            table = self.random_table(xp, array_api_compat.device(j))
            row = xp.reshape(query_block - self.first_block, (-1,))
            for slot in range(table.shape[1]):
                drawn = xp.reshape(xp.take(table[:, slot], row), query_block.shape)
                inside = xp.logical_or(inside, drawn == key_block)
        return inside


def query_blocks(n_queries: int, offset: int, block_size: int) -> tuple[int, int]:
    """First block and number of blocks ``floor(t_i / b)`` the queries fall in (SPARSE-5.2)."""
    if n_queries == 0:
        return 0, 0
    first = offset // block_size
    return first, (n_queries - 1 + offset) // block_size - first + 1
