"""Buggy kernels whose results depend on earlier calls (SDPA-7.8, issue 29), with evidence.

Each is the definition of :mod:`catalogue.feature_blocks` (or a packed, KV-cache or dropout
kernel of the catalogue) plus state: a term cached on the input shapes alone (ALiBi bias,
softcap, mask, the inputs' strides or dtype, varlen offsets, cache lengths, a block
table, a dropout mask), or a fault that depends on how many times the kernel has been
called.  Each entry's evidence calls the kernel as the bug needs
(twice at one shape, or N times) and compares with the reference; it makes a fresh kernel
for that (:func:`fresh`), so the counts of other tests do not matter.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from attnspec.conformance.call.problem import Problem
from attnspec.conformance.judge.bounds import reference_bound
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.packed_calls import Batch, call_kv_cache, call_varlen

from . import packed_kernels as packed
from .blocks import named
from .bugs_features import _dropout_bug
from .entry import SPEC_KEYWORDS, SpecCall, spec_kernel
from .feature_blocks import Features, arranged, attend_features, keep_mask
from .features_catalogue import (
    CACHE_BATCH,
    Evidence,
    FeatureBug,
    _observed,
    _outside,
    _problem,
    _sequences,
    cache_differs,
    varlen_differs,
)

Array = np.ndarray
# the call after which wrong_after_many_calls goes wrong, and wrong_every_nth_call's period
AFTER_CALLS = 3000
EVERY_NTH_CALL = 50


def _keeping(cache: dict[Any, Any], kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` with its ``cache`` as ``kernel.cache``, which :func:`fresh` empties."""
    kernel.cache = cache  # type: ignore[attr-defined]
    return kernel


def _cached_by_shape(name: str, doc: str, argument: str, **claims: Any) -> Callable[..., Any]:
    """The definition, but ``argument`` (alibi_slopes, softcap or mask) is the one of the
    first call of each input shape: a cache keyed on the shapes alone."""
    cache: dict[tuple[tuple[int, ...], ...], Any] = {}

    @spec_kernel(
        {**SPEC_KEYWORDS, "softcap": None, "alibi_slopes": None}, bias=True, gqa=True, **claims
    )
    def kernel(call: SpecCall) -> Array:
        given = {"mask": call.mask, **call.extras}
        shapes = (call.q.shape, call.k.shape, call.v.shape)
        if given[argument] is not None:  # the first value given at these shapes, kept
            given[argument] = cache.setdefault(shapes, given[argument])
        f = Features(softcap=given["softcap"], alibi_slopes=given["alibi_slopes"])
        return attend_features(arranged(*call._replace(mask=given["mask"]), f), f)

    return _keeping(cache, named(kernel, name, doc))


alibi_cached_by_shape = _cached_by_shape(
    "alibi_cached_by_shape",
    "Computes the ALiBi slopes' bias once per input shape and reuses it: a later call of the "
    "same shape with other slopes gets the first call's bias.",
    "alibi_slopes",
    alibi=True,
)
softcap_cached_by_shape = _cached_by_shape(
    "softcap_cached_by_shape",
    "Builds its softcapped score function once per input shape: a later call of the same "
    "shape with another cap is capped at the first call's.",
    "softcap",
    softcap=True,
)
mask_cached_by_shape = _cached_by_shape(
    "mask_cached_by_shape",
    "Converts the boolean mask once per input shape and reuses it: a later call of the same "
    "shape with another mask attends the first call's keys.",
    "mask",
)


def _definition_between(
    name: str,
    doc: str,
    inputs: Callable[[Array, Array, Array], tuple[Array, Array, Array]],
    output: Callable[[Array, Array], Array],
) -> Callable[..., Any]:
    """The definition on ``inputs(q, k, v)``, returned as ``output(out, q)``: where a
    stateful kernel below keeps its state and shows it."""

    @spec_kernel(bias=True, gqa=True)
    def kernel(call: SpecCall) -> Array:
        f = Features()
        q, k, v = inputs(call.q, call.k, call.v)
        out = attend_features(arranged(*call._replace(q=q, k=k, v=v), f), f)
        return output(out, call.q)

    return named(kernel, name, doc)


def _planned_by_shape(
    name: str, doc: str, plan: Callable[[Array], Any], use: Callable[[Any, Array], Array]
) -> Callable[..., Any]:
    """The definition on ``use(plan(x), x)`` for each of q, k and v, where ``plan(x)`` is
    made at the first call of each input shape and kept for every later one (a plan or
    compiled graph keyed on the shapes alone); the output in q's dtype."""
    cache: dict[tuple[tuple[int, ...], ...], tuple[Any, ...]] = {}

    def planned(q: Array, k: Array, v: Array) -> tuple[Array, Array, Array]:
        plans = cache.setdefault((q.shape, k.shape, v.shape), tuple(plan(x) for x in (q, k, v)))
        return use(plans[0], q), use(plans[1], k), use(plans[2], v)

    kernel = _definition_between(name, doc, planned, lambda out, q: out.astype(q.dtype))
    return _keeping(cache, kernel)


def _element_strides(x: Array) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


def _read_with(strides: tuple[int, ...], x: Array) -> Array:
    """``x``'s memory read with ``strides`` (in elements), as a kernel given only a data
    pointer does; ``x`` itself where that would read past the memory ``x`` spans (a
    stride-0 view), so the bug stays a wrong result and never a wild read."""
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, _element_strides(x), strict=True))
    need = 1 + sum((n - 1) * s for n, s in zip(x.shape, strides, strict=True))
    if x.size == 0 or min(strides, default=0) < 0 or need > span:
        return x
    return np.lib.stride_tricks.as_strided(
        x, x.shape, tuple(s * x.itemsize for s in strides), writeable=False
    )


strides_cached_by_shape = _planned_by_shape(
    "strides_cached_by_shape",
    "Plans its memory accesses at the first call of each input shape and keeps the plan: "
    "a later call of the same shape with strided or transposed views is read with the "
    "first call's strides.",
    _element_strides,
    _read_with,
)
dtype_cached_by_shape = _planned_by_shape(
    "dtype_cached_by_shape",
    "Builds its graph at the first call of each input shape in that call's dtype and "
    "keeps it: a later call of the same shape in a more precise dtype is computed in the "
    "first one's precision.",
    lambda x: x.dtype,
    lambda dtype, x: x.astype(dtype),
)


def _packed_cached_by_shape(
    name: str, doc: str, base: Callable[..., Any], kept: tuple[str, ...]
) -> Callable[..., Any]:
    """``base`` (a packed or KV-cache kernel of the catalogue), but its ``kept`` keyword
    arrays are those of the first call of each set of argument shapes."""
    cache: dict[tuple[Any, ...], dict[str, Array]] = {}

    @functools.wraps(base)
    def kernel(*args: Array, **kwargs: Any) -> Any:
        shapes = tuple(np.shape(a) for a in args) + tuple(
            (n, np.shape(a)) for n, a in sorted(kwargs.items()) if isinstance(a, np.ndarray)
        )
        first = {n: np.array(kwargs[n], copy=True) for n in kept if kwargs.get(n) is not None}
        return base(*args, **{**kwargs, **cache.setdefault(shapes, first)})

    return _keeping(cache, named(kernel, name, doc))


varlen_offsets_cached_by_shape = _packed_cached_by_shape(
    "varlen_offsets_cached_by_shape",
    "Keeps the cu_seqlens of the first call of each set of packed shapes: a later call "
    "with the same token totals but other sequence lengths is cut at the old offsets.",
    packed.varlen_block_diagonal,
    ("cu_seqlens_q", "cu_seqlens_k"),
)
kv_cache_lengths_cached_by_shape = _packed_cached_by_shape(
    "kv_cache_lengths_cached_by_shape",
    "Keeps the cache_seqlens of the first call of each set of argument shapes (a decode "
    "graph captured once): a later call with other cache lengths reads the old ones.",
    packed.kv_cache_in_place,
    ("cache_seqlens",),
)
kv_cache_table_cached_by_shape = _packed_cached_by_shape(
    "kv_cache_table_cached_by_shape",
    "Keeps the block table of the first call of each set of argument shapes: a later "
    "call with another table reads the old blocks.",
    packed.kv_cache_in_place,
    ("block_table",),
)

_seed_masks: dict[tuple[Any, ...], Array] = {}


def _mask_cached_by_shape(shape: tuple[int, ...], p: float, seed: int | None) -> Array:
    """The keep indicators of the first call of each (weights shape, p): the seed of a
    later call is ignored."""
    return _seed_masks.setdefault((shape, p), keep_mask(shape, p, seed))


dropout_mask_cached_by_shape = _dropout_bug(
    "dropout_mask_cached_by_shape",
    "Draws its dropout mask from the seed at the first call of each shape and keeps it: a "
    "later call with another seed drops the same weights.",
    keep=_mask_cached_by_shape,
)
dropout_mask_cached_by_shape.cache = _seed_masks  # type: ignore[attr-defined]


def counting(name: str, doc: str, wrong: Callable[[int], bool]) -> Callable[..., Any]:
    """The definition, but call number n (from 1) returns the output times 1.5 (and plus
    one, so zero outputs change too) where ``wrong(n)``."""
    calls = [0]

    def counted(q: Array, k: Array, v: Array) -> tuple[Array, Array, Array]:
        calls[0] += 1
        return q, k, v

    def output(out: Array, q: Array) -> Array:
        return (out * 1.5 + 1).astype(out.dtype) if wrong(calls[0]) else out

    kernel = _definition_between(name, doc, counted, output)
    kernel.calls = calls  # type: ignore[attr-defined]
    return kernel


wrong_every_50th_call = counting(
    "wrong_every_50th_call",
    f"Right on every call but every {EVERY_NTH_CALL}th (a race on a reused buffer, a "
    "periodic flush): 2 % of its calls are wrong.",
    lambda n: n % EVERY_NTH_CALL == 0,
)
wrong_after_3000_calls = counting(
    "wrong_after_3000_calls",
    f"Right for its first {AFTER_CALLS} calls, wrong from then on (a leak, a counter that "
    "wraps, a pool that runs dry).",
    lambda n: n > AFTER_CALLS,
)


def _second_call_differs(first: Problem, second: Problem) -> Callable[[KernelUnderTest], Any]:
    """Evidence: after a call on ``first``, a call on ``second`` (the same shapes, another
    argument) departs from the definition beyond TOL-2."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        fresh(kernel.fn)
        kernel.output(first)
        out = kernel.output(second)
        fresh(kernel.fn)  # as it was: the property's run starts from no state too
        bound = reference_bound(second, kernel.declaration)
        return _outside(out, np.asarray(bound.out), np.asarray(bound.out_tolerance), "out")

    return evidence


def _call_differs(calls: int) -> Callable[[KernelUnderTest], Any]:
    """Evidence: on a fresh count, call ``calls`` of one problem departs from the definition
    beyond TOL-2 (the earlier ones are not looked at)."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        problem = _problem()
        fresh(kernel.fn)
        for _ in range(calls - 1):
            kernel.fn(problem.q, problem.k, problem.v)
        out = kernel.output(problem)
        fresh(kernel.fn)  # as it was: the property's run starts from a count of 0 too
        bound = reference_bound(problem, kernel.declaration)
        return _outside(out, np.asarray(bound.out), np.asarray(bound.out_tolerance), "out")

    return evidence


def _after(first_call: Callable[[KernelUnderTest], object], evidence: Evidence) -> Evidence:
    """Evidence: ``evidence`` on a kernel whose state is that of ``first_call`` alone."""

    def after(kernel: KernelUnderTest) -> str | None:
        fresh(kernel.fn)
        first_call(kernel)
        found = evidence(kernel)
        fresh(kernel.fn)  # as it was: the property's run starts from no state too
        return found

    return after


def _strided_call_differs(first: Problem, second: Problem) -> Evidence:
    """Evidence: after a call on ``first``, ``second`` passed as views of every other
    element of a larger array (same shapes) departs from the definition beyond TOL-2."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        views = [np.repeat(getattr(second, n), 2, axis=-1)[..., ::2] for n in "qkv"]
        out = np.asarray(kernel.fn(*views), dtype=np.float64)
        bound = reference_bound(second, kernel.declaration)
        return _outside(out, np.asarray(bound.out), np.asarray(bound.out_tolerance), "out")

    return _after(lambda kernel: kernel.output(first), evidence)


def _second_seed_same_mask(kernel: KernelUnderTest) -> str | None:
    """Evidence: after a call with seed 4, seed 5 at the same shape keeps the same weights
    (independent masks of 32768 indicators agree with probability < 1e-3000)."""
    first = _observed(kernel, 0.3, 4)[1]
    second = _observed(kernel, 0.3, 5)[1]
    return "seeds 4 and 5 kept the same weights" if np.array_equal(first, second) else None


def fresh(fn: Callable[..., Any]) -> None:
    """Forget ``fn``'s state (its cache or its call count), as a new process would."""
    if hasattr(fn, "cache"):
        fn.cache.clear()
    if hasattr(fn, "calls"):
        fn.calls[0] = 0


_MASK_A = np.ones((5, 7), dtype=bool)
_MASK_B = np.tril(np.ones((5, 7), dtype=bool))
_SLOPES = np.asarray([0.5, 0.25, 0.125, 0.0625])

# The evidence batches' argument shapes with other lengths and another block table
# (features_catalogue's VARLEN_BATCH: token totals 14 and 16; CACHE_BATCH: 3 elements,
# 2 queries and 2 new keys each, 8 positions in 4 blocks of 2 of 13).
VARLEN_OTHER = Batch(_sequences([(5, 6), (2, 0), (4, 3), (0, 2), (3, 5)], seed=9))
CACHE_OTHER_LENGTHS = Batch(
    _sequences([(2, 7), (2, 5), (2, 2)], seed=9),
    cache=replace(CACHE_BATCH.kv_cache, lengths=[5, 3, 0], stale_seed=4),
)
CACHE_OTHER_TABLE = Batch(
    _sequences([(2, 5), (2, 2), (2, 7)], seed=9),
    cache=replace(CACHE_BATCH.kv_cache, table=np.arange(12).reshape(3, 4), stale_seed=4),
)

STATE_CATALOGUE = [
    FeatureBug(
        "alibi-cached-by-shape",
        alibi_cached_by_shape,
        "same-shape-new-arguments",
        _second_call_differs(
            _problem(alibi_slopes=_SLOPES), _problem(seed=1, alibi_slopes=4 * _SLOPES)
        ),
    ),
    FeatureBug(
        "softcap-cached-by-shape",
        softcap_cached_by_shape,
        "same-shape-new-arguments",
        _second_call_differs(
            _problem(magnitude=3.0, softcap=8.0), _problem(seed=1, magnitude=3.0, softcap=1.0)
        ),
    ),
    FeatureBug(
        "mask-cached-by-shape",
        mask_cached_by_shape,
        "same-shape-new-arguments",
        _second_call_differs(_problem(mask=_MASK_A), _problem(seed=1, mask=_MASK_B)),
    ),
    FeatureBug(
        "strides-cached-by-shape",
        strides_cached_by_shape,
        "same-shape-new-arguments",
        _strided_call_differs(_problem(), _problem(seed=1)),
    ),
    FeatureBug(
        "dtype-cached-by-shape",
        dtype_cached_by_shape,
        "same-shape-new-arguments",
        _second_call_differs(_problem(dtype="float16"), _problem(seed=1)),
    ),
    FeatureBug(
        "varlen-offsets-cached-by-shape",
        varlen_offsets_cached_by_shape,
        "packed-same-shape-new-arguments",
        _after(lambda kernel: call_varlen(kernel, VARLEN_OTHER), varlen_differs),
    ),
    FeatureBug(
        "kv-cache-lengths-cached-by-shape",
        kv_cache_lengths_cached_by_shape,
        "packed-same-shape-new-arguments",
        _after(lambda kernel: call_kv_cache(kernel, CACHE_OTHER_LENGTHS), cache_differs),
    ),
    FeatureBug(
        "kv-cache-table-cached-by-shape",
        kv_cache_table_cached_by_shape,
        "packed-same-shape-new-arguments",
        _after(lambda kernel: call_kv_cache(kernel, CACHE_OTHER_TABLE), cache_differs),
    ),
    FeatureBug(
        "dropout-mask-cached-by-shape",
        dropout_mask_cached_by_shape,
        "dropout-seed",
        _after(lambda kernel: None, _second_seed_same_mask),
    ),
    FeatureBug(
        "wrong-every-50th-call",
        wrong_every_50th_call,
        "many-calls",
        _call_differs(EVERY_NTH_CALL),
    ),
    FeatureBug(
        "wrong-after-3000-calls",
        wrong_after_3000_calls,
        "many-calls",
        _call_differs(AFTER_CALLS + 1),
        known_miss=(
            "the quick profile makes 160 calls of many-calls (CALLS_PER_SMALL_EXAMPLE x 20 "
            "small examples), the default one 800: fewer than 3000; the thorough one's 8000 "
            "catch it (tests/catalogue/test_state.py)"
        ),
    ),
]
