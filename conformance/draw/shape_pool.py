"""Shape pools: for backends that compile once per input shape, draw shapes from a few.

JAX (XLA) compiles a kernel anew for every new combination of input shapes, dtype and
static options: about half a second each on a CPU (a second or more op by op), against
milliseconds for running a small problem.  Drawing every
example's sizes afresh made the quick profile of ``jax.nn.dot_product_attention`` take
~15 minutes.  For a backend that says it compiles per shape
(:attr:`attnspec.backends.Backend.compiles_per_shape`), the runner gives each stratum a
:class:`ShapePool`: an example draws an *index* into a small list of shapes instead of
each size, so every property of the run meets the same few shapes and the kernel's
compilations are reused.

* The pool is a deterministic function of the run's seed, the stratum and what the
  property asks of the draw (its minimum lengths, GQA, ...): the same in every worker
  process (``--jobs``), whatever order the properties run in, and on every re-run of an
  example (Hypothesis replays failures).
* Its members are drawn by the suite's own drawing code (:func:`.strategies.draw_dims`,
  the realistic strata of :mod:`.sizes`) from seeded choices, so a realistic stratum's
  members are realistic shapes within its cost cap and the user's limits, as before.
* They are sorted by size, and the index is a Hypothesis draw: a failure shrinks to the
  smallest member that fails, and the values, magnitudes and the rest shrink as always.
* A property that asks for other sizes (at least one key, two key/value heads, ...) takes
  the members drawn for a plain request that meet what it asks (:data:`PLAIN_REQUEST`,
  :func:`meets_request`), and one that would rewrite the sizes it was given (Lq != Lk for
  the causal alignments, two heads to tell apart) first looks for members where its
  rewrite is not needed (``draw_dims(where=...)``); only when none fits does it draw a pool
  of its own.  A kernel that needs E == Ev gets members with E == Ev (the suite's zero
  padding, done on the host where the backend compiles per shape, is rarely needed).
* What the suite itself does to a kernel's arrays (zero padding and the output's cut) is
  done on the host for such a backend (:func:`.layouts.pad_head_dims_on_host`,
  :meth:`Backend.on_host`): only the kernel compiles.  (JAX's arrays have no strides, so
  layout-independence does not apply there: ``Backend.has_strides``.)  A problem with
  fewer value columns than E, for a kernel that needs E == Ev, takes the options tied to
  the shape it is called with (v padded).  A re-run drawing around a failed clause meets
  the same pools unless it draws around sizes (:func:`limits_key`).
* A mask or bias broadcasts from one of BROADCAST_POOL shapes per problem size, the same
  one in every property (but mask-broadcast, which is about them), and the dtype and the
  options that a compiled kernel is compiled for (mask, bias, causal, explicit scale:
  TIED_LABELS) follow the pooled shape (:class:`TiedDraws`), so that they too repeat from
  property to property; so do the realistic mask and bias kinds that have shapes of
  their own (padding, ALiBi) and the broadcastable mask shape mask-broadcast draws.  A
  bias a property wants of a few units (``tight``), or a re-run drawing around a large
  bias, takes the drawn kind's shape with small values; a re-run drawing around a fully
  masked row gives each row a key in the mask's own shape
  (:func:`.strategies.with_a_key_per_row`): both meet the signatures compiled already.
* Probes a property builds itself draw their sizes through :func:`pooled_sizes` (the
  scale probe of default-scale and explicit-scale), a few per stratum as well.
* The weights a property observes through V = I are read in column blocks of the identity,
  each a call on the problem's own shapes (:meth:`.kernel.KernelUnderTest.observed_weights`),
  not with values of Lk x Lk (and, for ``equal_head_dims``, q and k padded to Lk).

What is lost is variety within one run (a dozen shapes and option sets instead of one per
example); ``--seed`` draws other pools.  What still compiles per property: the options a
property forces (no mask, always causal, ...) on a pooled shape, the empty sizes and
broadcast masks that some properties are about, each dtype of output-shape-dtype on the
small stratum's shapes (a realistic one is checked in its tied dtype), and the
weights observed through V = I in one call where blocks would be more than
:data:`.kernel.MAX_WEIGHT_BLOCKS` calls (Ev tiny against Lk) or Ev = 0.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from .seeded import SeededDraws, ShapePool, T

# Members per pool: the small stratum's examples spread over this many shapes; a realistic
# stratum gets as many as it has examples (1-3 in the quick profile), at most this.
SMALL_POOL = 3
LARGEST_REALISTIC_POOL = 3
# Shapes a mask or bias of one problem size broadcasts from: (Lq, Lk) and one more.
BROADCAST_POOL = 2


def choose(data: Any, pool: list[T], label: str) -> T:
    """One of ``pool``, by an index Hypothesis draws: a fixed number of choices for one
    pool, so that a shrunk example replays."""
    index: int = data.draw(st.integers(0, len(pool) - 1), label=f"{label} (pooled)")
    return pool[index]


_RUNS: dict[int | None, ShapePool] = {}


def pool_for_run(seed: int | None) -> ShapePool:
    """The pools of a run with ``seed``, shared by its properties in this process."""
    return _RUNS.setdefault(seed, ShapePool(seed))


def pooling(data: Any) -> bool:
    """Whether a draw with ``data`` should come from the current stratum's pool."""
    from . import sizes

    return sizes.current().pool is not None and not isinstance(data, SeededDraws)


def members_for(examples: int, realistic: bool) -> int:
    """How many shapes a stratum of ``examples`` examples draws from."""
    return max(1, min(examples, LARGEST_REALISTIC_POOL)) if realistic else SMALL_POOL


def pool_size(stratum: Any) -> int:
    """How many shapes ``stratum`` draws from (its ``pool_examples`` when set)."""
    return members_for(max(stratum.examples, stratum.pool_examples), stratum.realistic)


def pool_key(stratum: Any) -> Any:
    """``stratum`` as its pools are keyed: without ``pool_examples``, so the later parts of
    a nesting profile's stratum draw the members of its first part first."""
    return replace(stratum, pool_examples=0)


def limits_key() -> Any:
    """The current draw's limits as pools are keyed: of the features a re-run avoids
    (``SizeLimits.avoid``), only those that change the sizes drawn (GQA, empty lengths:
    input_features.DRAWN_AROUND_IN_SIZES), so that a re-run drawing around a fully masked
    row or a large bias meets the shapes, and reuses the compilations, of the first run."""
    from . import input_features, sizes

    limits = sizes.current().limits
    drawn_around = input_features.DRAWN_AROUND_IN_SIZES
    return replace(limits, avoid=tuple(a for a in limits.avoid if a in drawn_around))


# What draw_dims is asked for when nothing is asked of it (its defaults): every request
# first looks among the members drawn so, and only when none of them fits (a property
# needing two key/value heads, more keys than the small members have) draws a pool of its
# own.  Kernels' compilations are then shared by properties that ask for different
# minimum sizes (a pool per request gave each of them shapes of its own).
PLAIN_REQUEST = dict(
    min_queries=0,
    min_keys=0,
    max_len=9,
    max_batch_ndim=2,
    weights=False,
    min_kv_heads=1,
    min_groups=1,
)


def pooled_dims(
    data: Any,
    kernel: Any,
    draw_dims: Callable[..., Any],
    options: dict[str, Any],
    where: Callable[[Any], bool] | None = None,
) -> Any:
    """``draw_dims(data, kernel, **options)`` from the current stratum's pool: one of the
    Dims that seeded draws give for a plain request (PLAIN_REQUEST, the kernel's own GQA
    claim) in the same stratum and limits that meet ``options``
    (:func:`meets_request`); where none does, one of those drawn for ``options`` itself.
    A kernel that needs E == Ev (``equal_head_dims``: the suite pads its inputs with zero
    columns) gets E == Ev.
    ``where``: members for which it holds come first (a property that would otherwise
    rewrite the sizes it was given, e.g. to make Lq != Lk, finds them among the shapes
    compiled already)."""
    from . import sizes

    drawing = sizes.current()
    assert drawing.pool is not None, "pooled_dims outside a pooled stratum"
    stratum = drawing.stratum
    count = pool_size(stratum)

    def pool(request: dict[str, Any]) -> list[Any]:
        def make(draws: Any) -> Any:
            dims = draw_dims(draws, kernel, **request)
            if kernel.declaration.equal_head_dims:
                width = min(dims.head_dim, dims.value_dim)
                dims = replace(dims, head_dim=width, value_dim=width)
            return dims

        # what other clauses' failures make draws avoid in sizes (GQA, empty lengths)
        # changes the members, so such a pool is not reused after a failure (limits_key)
        limits = limits_key()
        key = (
            "dims",
            pool_key(stratum),
            limits,
            kernel.declaration.batch_ndim,
            kernel.declaration.equal_head_dims,
            limits.avoid,
            tuple(sorted(request.items())),
        )
        assert drawing.pool is not None  # checked above; mypy does not carry it into closures
        return drawing.pool.members(
            key,
            make,
            lambda dims: sizes.problem_cost(
                dims, weights=request["weights"], family=request["family"]
            ),
            count,
        )

    plain = {**options, **PLAIN_REQUEST, "gqa": kernel.declaration.gqa}
    batch_ndim = kernel.declaration.batch_ndim
    wanted = where or (lambda dims: True)
    fitting = [dims for dims in pool(plain) if meets_request(dims, options, batch_ndim)]
    choices = [dims for dims in fitting if wanted(dims)]
    if not choices:
        own = pool(options)
        choices = [dims for dims in own if wanted(dims)] or fitting or own
    return choose(data, choices, "shape")


def meets_request(dims: Any, options: dict[str, Any], batch_ndim: int | None) -> bool:
    """Whether ``draw_dims(**options)`` could have drawn ``dims`` in the current stratum
    for a kernel declaring ``batch_ndim``: at least the minimum lengths and heads asked
    for, no GQA when not asked for, batch dims and (small stratum) lengths within the
    maxima, and (realistic strata) within the cost cap for what is asked (weights
    observed through V = I cost more)."""
    from . import sizes

    drawing = sizes.current()
    stratum = drawing.stratum
    if (
        dims.n_queries < options["min_queries"]
        or dims.n_keys < options["min_keys"]
        or dims.n_kv_heads < options["min_kv_heads"]
        or dims.groups < options["min_groups"]
        or (not options["gqa"] and dims.groups != 1)
        or (batch_ndim is None and len(dims.batch) > options["max_batch_ndim"])
    ):
        return False
    if not stratum.realistic:
        longest = max(options["max_len"], options["min_queries"], options["min_keys"])
        return bool(max(dims.n_queries, dims.n_keys) <= min(longest, drawing.limits.max_len))
    cost = sizes.problem_cost(dims, weights=options["weights"], family=options["family"])
    return stratum.max_cost is not None and cost <= stratum.max_cost


def pooled_sizes(data: Any, name: str, draw: Callable[[Any], T]) -> T:
    """``draw(data)``, the sizes (a tuple of ints, say) of a probe that a property builds
    itself: in a pooled stratum, one of the few that seeded draws give for ``name`` in
    this stratum (the smallest first), so that the probes of every example, and of every
    property that shares ``name``, reuse a few compilations; else drawn as usual."""
    from . import sizes

    drawing = sizes.current()
    if not pooling(data):
        return draw(data)
    stratum = drawing.stratum
    assert drawing.pool is not None
    key = ("probe", name, pool_key(stratum), limits_key())
    members: list[T] = drawing.pool.members(key, draw, lambda made: made, pool_size(stratum))
    return choose(data, members, name)


def pooled_broadcast(
    data: Any,
    full: tuple[int, ...],
    label: str,
    broadcast_shape_for: Callable[..., tuple[int, ...]],
) -> tuple[int, ...]:
    """``broadcast_shape_for(data, full, label)`` from a pool of BROADCAST_POOL shapes
    (the simplest first: the last two dims of ``full``), the same one for every mask (or
    bias) of scores ``full`` in the stratum, whichever property draws it: no property but
    mask-broadcast (which draws its own shapes) is about the shape a mask broadcasts from,
    and each other choice would be one more compilation of the kernel.  Which member it is
    is a seeded draw fixed by ``full``, so both members appear in a run, for different
    shapes."""
    from . import sizes

    drawing = sizes.current()
    pool = drawing.pool
    assert pool is not None, "pooled_broadcast outside a pooled stratum"
    key = ("broadcast", drawing.stratum.name, full, label)
    members = pool.members(
        key,
        lambda draws: broadcast_shape_for(draws, full, label),
        lambda shape: (len(shape), math.prod(shape)),
        BROADCAST_POOL,
    )
    return choose(SeededDraws(zlib.crc32(f"{pool.seed}:{key!r}".encode())), members, label)


REDUCIBLE_MASK_SHAPE = "reducible mask shape"  # mask-broadcast's own broadcastable mask
# Draws besides sizes that change what a compiled kernel is compiled for: its dtype, which
# optional inputs it gets (mask, bias, scale), static flags (is_causal), the mask form
# mask-broadcast checks in a realistic example, and the shapes of masks and biases that
# are not BROADCAST_POOL's (mask-broadcast's own; the realistic padding and ALiBi kinds).
# (Which of BROADCAST_POOL shapes a mask or bias broadcasts from is fixed by the scores'
# shape: pooled_broadcast.)
TIED_LABELS = frozenset(
    {
        "dtype",
        "causal",
        "mask",
        "bias",
        "explicit scale",
        "mask form",
        REDUCIBLE_MASK_SHAPE,
        "mask kind",
        "bias kind",
        "queries padded too",
        "ALiBi inside the padding",
    }
)


class TiedDraws:
    """Hypothesis's ``data`` for one pooled problem, except that the draws named in
    TIED_LABELS are answered by seeded draws fixed by the problem's Dims (and the run's
    seed and stratum): every property meets a pooled shape with the same dtype and
    options, so the kernel's compilation for it is reused.  They shrink with the shape."""

    def __init__(self, data: Any, dims: Hashable, pool: ShapePool, stratum: Hashable) -> None:
        self._data, self._dims, self._pool, self._stratum = data, dims, pool, stratum

    def draw(self, strategy: st.SearchStrategy[Any], label: str | None = None) -> Any:
        if label not in TIED_LABELS:
            return self._data.draw(strategy, label=label)
        key = f"{self._pool.seed}:{self._stratum!r}:{self._dims!r}:{label}:{strategy!r}"
        return self._pool.tied(key, strategy, label)


def tied_to(data: Any, dims: Hashable) -> Any:
    """``data`` with the TIED_LABELS draws fixed by ``dims`` (see :class:`TiedDraws`);
    ``data`` itself outside a pooled stratum."""
    from . import sizes

    drawing = sizes.current()
    if not pooling(data) or drawing.pool is None:
        return data
    return TiedDraws(data, dims, drawing.pool, drawing.stratum.name)
