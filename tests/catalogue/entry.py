"""What a catalogue entry is: a buggy kernel, the property that should catch it, and a
witness input on which the bug shows against the reference."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Witness:
    """An input (float64 values, rounded to ``dtype`` when used) that exposes a bug.

    ``strided`` passes q, k and v as transposed (non-contiguous) views of the same values.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dtype: str = "float64"
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    strided: bool = False

    def with_(self, **changes: Any) -> Witness:
        return replace(self, **changes)

    @property
    def scores_shape(self) -> tuple[int, ...]:
        batch = np.broadcast_shapes(self.q.shape[:-3], self.k.shape[:-3], self.v.shape[:-3])
        return (*batch, self.q.shape[-3], self.q.shape[-2], self.k.shape[-2])


def witness(
    *,
    seed: int = 0,
    batch: tuple[int, ...] = (2,),
    heads: tuple[int, int] = (2, 2),
    n_queries: int = 5,
    n_keys: int = 7,
    head_dim: int = 4,
    value_dim: int = 3,
    magnitude: float = 1.0,
    **options: Any,
) -> Witness:
    """Random normal q, k (times ``magnitude``) and v: Lq != Lk, E != Ev, a batch dim."""
    rng = np.random.default_rng(seed)
    n_q_heads, n_kv_heads = heads
    return Witness(
        q=rng.standard_normal((*batch, n_q_heads, n_queries, head_dim)) * magnitude,
        k=rng.standard_normal((*batch, n_kv_heads, n_keys, head_dim)) * magnitude,
        v=rng.standard_normal((*batch, n_kv_heads, n_keys, value_dim)),
        **options,
    )


@dataclass(frozen=True)
class BuggyKernel:
    """A kernel with one bug, the property id expected to catch it, and where it runs."""

    name: str
    fn: Callable[..., Any]
    catches: str
    backend: str = "numpy"
    witness: Witness = field(default_factory=witness)
    # Why the named property does not (yet) catch it in the quick profile; empty when it does.
    known_miss: str = ""
