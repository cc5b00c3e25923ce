"""What a catalogue entry is: a buggy kernel, the property that should catch it, and a
witness input on which the bug shows against the reference (a suite ``Problem``: the one
shape an attention call's inputs have in the suite and its tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from attnspec.conformance import declare
from attnspec.conformance.call.problem import Problem


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
    dtype: str = "float64",
    **options: Any,
) -> Problem:
    """A witness: random normal q, k (times ``magnitude``) and v with Lq != Lk, E != Ev and
    a batch dim, as the suite's :class:`~attnspec.conformance.judge.kernel.Problem` (float64
    values, rounded to ``dtype`` when used)."""
    rng = np.random.default_rng(seed)
    n_q_heads, n_kv_heads = heads
    return Problem(
        q=rng.standard_normal((*batch, n_q_heads, n_queries, head_dim)) * magnitude,
        k=rng.standard_normal((*batch, n_kv_heads, n_keys, head_dim)) * magnitude,
        v=rng.standard_normal((*batch, n_kv_heads, n_keys, value_dim)),
        dtype=dtype,
        **options,
    )


@dataclass(frozen=True)
class BuggyKernel:
    """A kernel with one bug, the property id expected to catch it, and where it runs."""

    name: str
    fn: Callable[..., Any]
    catches: str
    backend: str = "numpy"
    witness: Problem = field(default_factory=witness)
    # pass the witness's q, k and v as transposed (non-contiguous) views of its values
    strided_witness: bool = False
    # Why the named property does not (yet) catch it in the quick profile; empty when it does.
    known_miss: str = ""


@dataclass(frozen=True)
class CaughtBug:
    """A buggy kernel of one of the serving families (merge, MLA, paged batch, RoPE, sinks)
    and the property that must catch it."""

    fn: Callable[..., Any]
    catches: str


class SpecCall(NamedTuple):
    """One call of a kernel in the spec's convention (SDPA-1): the arrays and the keywords."""

    q: Any
    k: Any
    v: Any
    mask: Any = None
    bias: Any = None
    is_causal: bool = False
    scale: float | None = None

    def pass_to(self, fn: Callable[..., Any]) -> Any:
        """``fn(q, k, v, mask=, bias=, is_causal=, scale=)``: the same call of ``fn``."""
        q, k, v, mask, bias, is_causal, scale = self
        return fn(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)


# Why the known kernels' adapters (conformance/kernels) and the oracle stay parallel to the
# signature below: the suite reads each kernel's own signature, and the oracle depends on
# nothing of the suite.
def spec_kernel(**claims: Any) -> Callable[[Callable[[SpecCall], Any]], Callable[..., Any]]:
    """A decorator: ``body(call)`` as a kernel declared with ``claims`` that has the spec's
    signature ``fn(q, k, v, *, mask=None, bias=None, is_causal=False, scale=None)``, written
    once here; it keeps ``body``'s name, docstring and module, by which reports show it and
    worker processes load it."""

    def make(body: Callable[[SpecCall], Any]) -> Callable[..., Any]:
        def kernel(
            q: Any,
            k: Any,
            v: Any,
            *,
            mask: Any = None,
            bias: Any = None,
            is_causal: bool = False,
            scale: float | None = None,
        ) -> Any:
            return body(SpecCall(q, k, v, mask, bias, is_causal, scale))

        kernel.__name__, kernel.__qualname__ = body.__name__, body.__qualname__
        kernel.__doc__, kernel.__module__ = body.__doc__, body.__module__
        return declare(kernel, **claims)

    return make
