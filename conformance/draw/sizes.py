"""The sizes the suite draws: small problems that shrink well, and realistic ones.

Real kernels tile keys and queries in blocks of 16-256, keep one code path per head dim,
split long key ranges, special-case decode (Lq of a few queries) and wide GQA groups, and
launch one program per (batch, head): their bugs live at block tails, past the first
block and where one path hands over to another.  So besides the small problems of the
``small`` stratum, every profile runs *realistic* strata whose lengths, head dims, head
counts and batch sizes come from sorted lists of the sizes kernels care about.

Each size is drawn as an index into a sorted list (filtered to what the stratum's cost
cap and the user's limits allow, always a prefix), so Hypothesis shrinks a failure down
the list to the smallest failing size.  The runner sets the stratum and the limits for
every example through :func:`drawing`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

# Hypothesis is imported by the functions that draw, not here: this module's sizes and
# drawing context (SizeLimits, avoided_now) are read in a kernel's own process too
# (run/kernel_process.py), which draws nothing and started ~0.1 s of CPU slower with it.
if TYPE_CHECKING:
    from hypothesis import strategies as st

from .seeded import ShapePool
from .target import DrawTarget

# Lengths at block boundaries (powers of two and one either side) and primes or odd sizes
# from FlashAttention's and aotriton's test grids (113 x 203, 1023 x 1024, 2063, ...).
LENGTHS = (
    16,
    17,
    31,
    32,
    33,
    63,
    64,
    65,
    113,
    127,
    128,
    129,
    203,
    255,
    256,
    257,
    511,
    512,
    513,
    523,
    1023,
    1024,
    1025,
    1033,
    2047,
    2048,
    2049,
    2063,
    4095,
    4096,
)
DECODE_QUERIES = (1, 2, 3, 4)
# Head dims kernels special-case (32 ... 256) and the non-powers of two their tests use.
HEAD_DIMS = (8, 16, 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 241, 256)
KV_HEADS = (1, 2, 3, 4, 8, 16)
GROUPS = (1, 2, 3, 4, 6, 8, 16, 32)  # with Hkv = 1 the large ones are multi-query attention
BATCH = (1, 2, 3, 5, 8)
MANY = (5, 8, 16, 32, 64, 128, 256)  # batch sizes of the "batched" shape: small L, many heads
BATCHED_MAX_LEN = 129
# self: Lq = Lk; cross: Lq and Lk drawn apart (either larger); decode: Lq of 1-4 against a
# long Lk; batched: short rows, batch x heads in the hundreds.
SHAPE_KINDS = ("self", "cross", "decode", "batched")
# The elementwise work per score of the comparison (the float64 definition and its TOL-2
# bound, bounds.py -> reference/tolerance.py: error_bound, in row chunks), in units of one
# head-dim column; measured on one core: ~210 ns per score, plus ~0.3 ns per E column and
# ~1 ns per Ev column (its matrix products with V): one score costs about 320 columns.
SCORE_COST = 320


@dataclass(frozen=True)
class Dims:
    """Sizes of one problem (SDPA-1.1)."""

    batch: tuple[int, ...]
    n_kv_heads: int
    groups: int
    n_queries: int
    n_keys: int
    head_dim: int
    value_dim: int

    @property
    def n_q_heads(self) -> int:
        return self.n_kv_heads * self.groups

    @property
    def scores_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.n_q_heads, self.n_queries, self.n_keys)

    @property
    def batch_heads(self) -> int:
        return math.prod(self.batch) * self.n_q_heads


def problem_cost(dims: Dims, *, weights: bool = False, family: str = "dense") -> int:
    """Work to check one problem, ~ B Hq Lq Lk (E + Ev + SCORE_COST): the TOL-2
    comparison's matmuls and its elementwise passes over the scores.  ``weights``: the
    weights are observed through V = I, so Ev is Lk.  Linear attention's prefix states cost
    B H L E Ev."""
    if family == "linear":
        length = dims.n_queries + dims.n_keys
        return dims.batch_heads * length * (dims.head_dim + 1) * (dims.value_dim + 1)
    value_dim = max(dims.value_dim, dims.n_keys) if weights else dims.value_dim
    per_score = dims.head_dim + value_dim + SCORE_COST
    rows = (dims.n_queries + dims.n_keys) * (dims.head_dim + value_dim)
    return dims.batch_heads * (dims.n_queries * dims.n_keys * per_score + rows)


def refit(dims: Dims, *, weights: bool = False, family: str = "dense") -> Dims:
    """``dims`` whose lengths a property rewrote (e.g. Lq = Lk + 3 for rows that see no
    key), brought back within the current stratum's cost cap and --max-len: both lengths
    shortened by the same, smallest amount that fits, so Lq - Lk (what the rewrite is
    about) stays.  The small stratum has no cap; dims that fit come back unchanged."""
    drawing = current()
    cap, longest = drawing.stratum.max_cost, drawing.limits.max_len

    def cut(by: int) -> Dims:
        return replace(dims, n_queries=dims.n_queries - by, n_keys=dims.n_keys - by)

    def fits(by: int) -> bool:
        candidate = cut(by)
        return max(candidate.n_queries, candidate.n_keys) <= longest and (
            cap is None or problem_cost(candidate, weights=weights, family=family) <= cap
        )

    # the shorter length keeps at least one element (none if it had none)
    most = max(0, min(dims.n_queries, dims.n_keys) - 1)
    if fits(0):
        return dims
    low, high = 1, most  # the cost falls as both lengths shrink: bisect the smallest cut
    if not fits(high):
        return cut(high)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    return cut(low)


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}, but should be a positive integer")
    return value


@dataclass(frozen=True)
class SizeLimits:
    """The user's caps on what is drawn (``--max-len``, ``--max-head-dim``,
    ``--max-batch-heads``); larger values than the defaults extend the size lists."""

    max_len: int = 4096
    max_head_dim: int = 256
    max_batch_heads: int = 512
    # input features (conformance/input_features.py) the draws leave out: a re-run that
    # draws around a clause the kernel already failed (conformance/root_causes.py)
    avoid: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_len", "max_head_dim", "max_batch_heads"):
            _positive(getattr(self, name), name)
        if self.avoid:  # input_features imports NumPy: not for the plain caps (shared_flags)
            from .input_features import feature

            for name in self.avoid:
                feature(name)  # ValueError for an unknown one


def _extended(base: Sequence[int], limit: int) -> tuple[int, ...]:
    """``base`` up to ``limit``, then powers of two and one either side up to it, and the
    limit itself (a cap is a boundary a user cares about)."""
    values = {v for v in base if v <= limit}
    power = 2 ** max(1, math.ceil(math.log2(max(base))))
    while power - 1 <= limit:
        values.update(v for v in (power - 1, power, power + 1) if max(base) < v <= limit)
        power *= 2
    values.add(limit)
    return tuple(sorted(values))


@dataclass(frozen=True)
class Stratum:
    """A share of a profile's examples: the small draws (``max_cost`` None) or realistic
    draws of at most ``max_cost`` (see :func:`problem_cost`) with at least ``min_len``
    keys, each with the ``forced`` options where the kernel claims them and the property
    draws them.  Hypothesis starts every stratum from its simplest example, so a stratum
    of one example draws its smallest problem (e.g. 65 or 257 keys: one past a block); a
    random one draws everything but its sizes from a seeded source (one_example)."""

    name: str
    examples: int
    max_cost: int | None = None
    forced: tuple[tuple[str, Any], ...] = ()
    min_len: int = 1  # the fewest keys (and queries of "self" shapes) of its lengths
    min_head_dim: int = 1  # the smallest E of its head dims
    anchor: Any = None  # an anchors.Anchor: its fixed sizes instead of drawn ones
    # the examples its shape pools are sized for, when more than ``examples``: the part of
    # a larger profile's stratum past a smaller profile's (runner._nested_parts)
    pool_examples: int = 0

    @property
    def realistic(self) -> bool:
        return self.max_cost is not None

    def option(self, name: str) -> Any:
        return dict(self.forced).get(name)


SMALL = Stratum("small", 0)


@dataclass(frozen=True)
class Drawing:
    """What the current example draws from: a stratum, within the user's limits."""

    stratum: Stratum = SMALL
    limits: SizeLimits = field(default_factory=SizeLimits)
    # shapes come from a few per stratum when the backend compiles per shape (shape_pool)
    pool: ShapePool | None = None

    @property
    def realistic(self) -> bool:
        return self.stratum.realistic

    @property
    def pooled_realistic(self) -> bool:
        """A realistic stratum's shapes from a pool (a backend compiling per shape): what
        a property checks per example there should compile nothing for it alone."""
        return self.pool is not None and self.stratum.realistic


_CURRENT: ContextVar[Drawing | None] = ContextVar("attnspec_drawing", default=None)
_OUTSIDE_A_RUN = Drawing()  # a property called directly draws small problems


def current() -> Drawing:
    return _CURRENT.get() or _OUTSIDE_A_RUN


def realistic() -> bool:
    """True while the runner draws from a realistic stratum."""
    return current().realistic


def draw_per_stratum(
    data: st.DataObject, choices: dict[str, tuple[Sequence[int], tuple[int, int]]]
) -> list[int]:
    """One size per label of ``choices``, in its order: from its realistic values in a
    realistic stratum, else from its small inclusive range (a serving family's sizes)."""
    from hypothesis import strategies as st  # here, not at the top: see there

    real = realistic()
    return [
        data.draw(st.sampled_from(values) if real else st.integers(*small), label=label)
        for label, (values, small) in choices.items()
    ]


@contextlib.contextmanager
def drawing(
    stratum: Stratum, limits: SizeLimits | None = None, pool: ShapePool | None = None
) -> Iterator[Drawing]:
    """Draw from ``stratum`` within ``limits`` (shapes from ``pool``) until the block ends."""
    now = Drawing(stratum, limits or SizeLimits(), pool)
    token = _CURRENT.set(now)
    try:
        yield now
    finally:
        _CURRENT.reset(token)


def _fitting(
    values: Sequence[int], fits: Callable[[int], bool], fallback: int | None = None
) -> tuple[int, ...]:
    """The prefix of sorted ``values`` that ``fits``; when none does, ``fallback`` (default
    the smallest value): a cap below the smallest size gives the smallest, not nothing."""
    prefix = tuple(v for v in values if fits(v))
    return prefix or ((values[0] if fallback is None else fallback),)


def _pick(data: st.DataObject, values: Sequence[int], label: str, choices: int) -> int:
    """One of ``values`` (a sorted list cut to what fits) through an index of a fixed range
    of ``choices``: every example makes the same draws whatever fits, which Hypothesis
    needs to shrink (a shorter list must not remove a draw), and index 0 is the smallest."""
    from hypothesis import strategies as st  # here, not at the top: see there

    index = data.draw(st.integers(0, max(choices, len(values)) - 1), label=label)
    return values[index % len(values)]


@dataclass
class _Sizer:
    """Draws one realistic Dims size by size, each within the cost cap given the sizes
    already drawn and the smallest of those still to come."""

    data: st.DataObject
    dims: Dims
    cap: int
    limits: SizeLimits
    weights: bool
    family: str

    def fits(self, **changes: Any) -> bool:
        candidate = replace(self.dims, **changes)
        return (
            candidate.batch_heads <= self.limits.max_batch_heads
            and problem_cost(candidate, weights=self.weights, family=self.family) <= self.cap
        )

    def draw(
        self, name: str, values: Sequence[int], label: str, together: Sequence[str] = ()
    ) -> int:
        """Draw ``name`` (and set ``together`` to the same value) from what fits."""

        def fits(v: int) -> bool:
            return self.fits(**{name: v, **{t: v for t in together}})

        value = _pick(self.data, _fitting(values, fits), label, len(values))
        changes: dict[str, Any] = {name: value, **{t: value for t in together}}
        self.dims = replace(self.dims, **changes)
        return value


def draw_realistic_dims(
    data: st.DataObject,
    kernel: DrawTarget,
    *,
    gqa: bool,
    weights: bool = False,
    family: str = "dense",
    min_kv_heads: int = 1,
    min_groups: int = 1,
) -> Dims:
    """Dims of the current realistic stratum: a shape kind, then lengths, head dims, heads
    and batch, each from its sorted list cut to the cost cap and the user's limits."""
    from hypothesis import strategies as st  # here, not at the top: see there

    drawing = current()
    limits, cap = drawing.limits, drawing.stratum.max_cost
    assert cap is not None, "draw_realistic_dims outside a realistic stratum"
    if drawing.stratum.anchor is not None:
        anchored: Dims = drawing.stratum.anchor.dims(
            kernel.declaration.batch_ndim,
            limits,
            cap,
            gqa=gqa,
            weights=weights,
            family=family,
            min_kv_heads=min_kv_heads,
            min_groups=min_groups,
        )
        return anchored
    all_lengths = _extended(LENGTHS, limits.max_len)
    lengths = [n for n in all_lengths if n >= drawing.stratum.min_len] or all_lengths[-1:]
    all_head_dims = _extended(HEAD_DIMS, limits.max_head_dim)
    head_dims = [e for e in all_head_dims if e >= drawing.stratum.min_head_dim] or all_head_dims[
        -1:
    ]
    batch_ndim = kernel.declaration.batch_ndim
    batch_ndim = 1 if batch_ndim is None else batch_ndim  # realistic inputs are (B, H, L, E)
    smallest = Dims(
        batch=(1,) * batch_ndim,
        n_kv_heads=min_kv_heads,
        groups=min_groups if gqa else 1,
        n_queries=1,
        n_keys=1,
        head_dim=head_dims[0],
        value_dim=head_dims[0],
    )
    sizer = _Sizer(data, smallest, cap, limits, weights, family)
    # batched shapes have short rows whatever the stratum's min_len, up to BATCHED_MAX_LEN
    short = (
        [n for n in all_lengths if LENGTHS[0] <= n <= BATCHED_MAX_LEN]
        if drawing.stratum.min_len <= BATCHED_MAX_LEN
        else []
    )
    kinds = SHAPE_KINDS if short else tuple(k for k in SHAPE_KINDS if k != "batched")
    kind = drawing.stratum.option("shape") or data.draw(st.sampled_from(kinds), label="shape kind")
    if kind in ("self", "batched"):
        sizer.draw(
            "n_keys",
            (short or lengths[:1]) if kind == "batched" else lengths,
            "L",
            together=("n_queries",),
        )
    elif kind == "cross":
        sizer.dims = replace(sizer.dims, n_queries=all_lengths[0])
        sizer.draw("n_keys", lengths, "Lk")
        sizer.draw("n_queries", all_lengths, "Lq")
    else:
        sizer.draw("n_queries", [n for n in DECODE_QUERIES if n <= limits.max_len], "Lq")
        sizer.draw("n_keys", lengths, "Lk")
    sizer.draw("head_dim", head_dims, "E", together=("value_dim",))
    if data.draw(st.sampled_from(("same", "other")), label="Ev") == "other":
        sizer.draw("value_dim", all_head_dims, "Ev")
    if gqa:
        at_least = max(min_groups, 2 if drawing.stratum.option("gqa") else 1)
        sizer.draw("groups", [g for g in GROUPS if g >= at_least], "G")
    sizer.draw("n_kv_heads", [h for h in KV_HEADS if h >= min_kv_heads], "Hkv")
    sizes: Sequence[int] = BATCH
    fallback = 1
    if kind == "batched":  # the stratum's forced batch x heads, over the cost cap if need be
        heads = sizer.dims.n_q_heads
        at_least = min(drawing.stratum.option("batch_heads") or 1, limits.max_batch_heads)
        sizes = [b for b in MANY if b * heads >= at_least] or list(MANY[-1:])
        fallback = max(1, min(sizes[0], limits.max_batch_heads // heads)) if at_least > 1 else 1
    for axis in range(batch_ndim):
        batch = list(sizer.dims.batch)

        def with_batch(b: int, axis: int = axis, batch: list[int] = batch) -> bool:
            return sizer.fits(batch=(*batch[:axis], b, *batch[axis + 1 :]))

        candidates = sizes if axis == 0 else BATCH
        batch[axis] = _pick(
            data,
            _fitting(candidates, with_batch, fallback if axis == 0 else 1),
            f"batch {axis}",
            len(MANY if kind == "batched" and not axis else BATCH),
        )
        sizer.dims = replace(sizer.dims, batch=tuple(batch))
    return sizer.dims


def avoided_now() -> tuple[str, ...]:
    """The features the current draw must avoid (``SizeLimits.avoid`` of the running
    stratum; none outside a run)."""
    return current().limits.avoid
