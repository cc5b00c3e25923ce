"""Hypothesis strategies for attention problems, restricted to what a kernel claims.

Sizes, dtypes and structure (masks, bias, causal, scale) are drawn by Hypothesis and
shrink.  In the small stratum the q, k, v and bias values are drawn by Hypothesis too, a
byte per element mapped to normal-like values, so that a failing example shrinks towards
zeros and a few simple values (``small_values``).  The realistic strata's values, and
random masks, shuffles and subsets, come from a NumPy generator seeded by a drawn integer,
which keeps drawing fast.  Every example is reproducible.  Nothing is filtered, so no
health check can trip.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st

from ...reference.masks import causal_offset
from ..call.problem import Problem
from . import input_features, shape_pool, sizes
from . import realistic_values as values
from .repeated_normals import REPEATED_NORMALS
from .sizes import Dims
from .small_values import ValueGenerator
from .target import DrawTarget

if TYPE_CHECKING:
    from ..claims.declaration import KernelDeclaration

MAGNITUDES = (1.0, 0.25, 3.0, 1e-3, 10.0)
EXPLICIT_SCALES = (0.5, 1.0, 0.0, 2.0, -0.75, 0.125)
MAYBE, NEVER, ALWAYS = "maybe", "never", "always"
# Collections Hypothesis draws element by element (permutations, column sets) up to this
# size; longer ones come from the values seed, so a realistic example stays a few draws.
LARGEST_DRAWN_COLLECTION = 24
# The strategies every example draws from, made once: st.sampled_from builds (and
# validates) a new strategy on every call, and the others are looked up in Hypothesis's
# cache; ~3 % of a small example (issue 33).  The same strategies, so the same draws.
_BOOLEANS = st.booleans()
_VALUES_SEED = st.integers(0, 2**32 - 1)
_MAGNITUDE = st.sampled_from(MAGNITUDES)
_EXPLICIT_SCALE = st.sampled_from(EXPLICIT_SCALES)
_SMALL_MASK_KIND = st.sampled_from(["random", "window", "causal", "all"])
_MASK_DENSITY = st.sampled_from([0.5, 0.8, 0.2])
_MASK_ALIGNMENT = st.sampled_from(["top_left", "bottom_right"])


@functools.lru_cache(maxsize=64)
def _one_of(dtypes: tuple[str, ...]) -> st.SearchStrategy[str]:
    """``st.sampled_from(dtypes)``, made once per tuple of dtypes."""
    return st.sampled_from(dtypes)


@functools.lru_cache(maxsize=4096, typed=True)
def integers(min_value: int, max_value: int) -> st.SearchStrategy[int]:
    """``st.integers(min_value, max_value)``, made once per pair of bounds: the same
    strategy, so the same draws.  Making one costs ~15 us even where Hypothesis's own
    cache holds it (a lookup in a Python-level LRU cache), and a small example draws
    about ten; Hypothesis's cache returns the very object it made before, as this does."""
    return st.integers(min_value, max_value)


@functools.lru_cache(maxsize=64, typed=True)
def _batch_sizes(per_dim: int, ndim: int) -> st.SearchStrategy[list[int]]:
    """``ndim`` batch sizes from 1 to ``per_dim`` (:func:`integers`' reason)."""
    return st.lists(integers(1, per_dim), min_size=ndim, max_size=ndim)


def draw_dims(
    data: st.DataObject,
    kernel: DrawTarget,
    *,
    min_queries: int = 0,
    min_keys: int = 0,
    max_len: int = 9,
    max_batch_ndim: int = 2,
    gqa: bool | None = None,
    weights: bool = False,
    family: str = "dense",
    min_kv_heads: int = 1,
    min_groups: int = 1,
    where: Callable[[Dims], bool] | None = None,
) -> Dims:
    """Sizes of the runner's current stratum, GQA only when claimed.

    Small stratum: batch dims 0-2, Lq != Lk, E != Ev, odd sizes, empty axes, lengths up to
    ``max_len``.  Realistic strata (``sizes.draw_realistic_dims``): block-boundary lengths,
    decode, head dims to 256, wide GQA, many heads, within the stratum's cost cap
    (``weights``: the weights are observed through V = I; ``family``: "linear" costs
    differ).  Both stay within the user's limits.  ``where``: on a backend that compiles
    per shape, pooled shapes for which it holds come first (``shape_pool.pooled_dims``);
    elsewhere it is not consulted, so a caller still makes sure of what it needs.
    """
    use_gqa = kernel.declaration.gqa if gqa is None else gqa
    use_gqa = use_gqa and input_features.GQA not in sizes.avoided_now()
    drawing = sizes.current()
    # what the property asks of a realistic shape (and of a pooled one, with the rest)
    asks: dict[str, Any] = {
        "gqa": use_gqa,
        "weights": weights,
        "family": family,
        "min_kv_heads": min_kv_heads,
        "min_groups": min_groups,
    }
    if shape_pool.pooling(data):  # a backend that compiles per shape: a few shapes a run
        options = {
            "min_queries": min_queries,
            "min_keys": min_keys,
            "max_len": max_len,
            "max_batch_ndim": max_batch_ndim,
            **asks,
        }
        pooled: Dims = shape_pool.pooled_dims(data, kernel, draw_dims, options, where)
        return pooled
    if drawing.realistic:
        return within_limitations(kernel, sizes.draw_realistic_dims(data, kernel, **asks))
    limits = drawing.limits
    max_len = min(max_len, limits.max_len)
    max_head_dim = min(8, limits.max_head_dim)
    batch_ndim = kernel.declaration.batch_ndim
    if batch_ndim is None:
        batch_ndim = data.draw(integers(0, max_batch_ndim), label="batch ndim")
    # each batch dim up to 3, less only when --max-batch-heads is below 3 ** ndim
    per_dim = max(1, min(3, math.floor(limits.max_batch_heads ** (1 / max(batch_ndim, 1)))))
    batch = tuple(data.draw(_batch_sizes(per_dim, batch_ndim), label="batch"))
    # only a cap below the small sizes (9 batch x 9 heads) changes what is drawn
    heads_room = max(1, limits.max_batch_heads // math.prod(batch))
    n_kv_heads = data.draw(integers(1, max(1, min(3, heads_room))), label="Hkv")
    groups_room = max(1, min(3, heads_room // n_kv_heads))
    return within_limitations(
        kernel,
        Dims(
            batch=batch,
            n_kv_heads=n_kv_heads,
            groups=data.draw(integers(1, groups_room), label="G") if use_gqa else 1,
            n_queries=data.draw(integers(min_queries, max(max_len, min_queries)), label="Lq"),
            n_keys=data.draw(integers(min_keys, max(max_len, min_keys)), label="Lk"),
            head_dim=data.draw(integers(1, max_head_dim), label="E"),
            value_dim=data.draw(integers(1, max_head_dim), label="Ev"),
        ),
    )


def within_limitations(kernel: DrawTarget, dims: Dims) -> Dims:
    """``dims`` cut to what the kernel declares it can take: Lq = Lk (the shorter, so the
    cost never grows) for ``equal_lengths``, no empty length without ``empty_sizes`` (or
    while a re-run draws around SDPA-5.2 or SDPA-1.5)."""
    declaration, avoid = kernel.declaration, sizes.avoided_now()
    n_queries, n_keys = dims.n_queries, dims.n_keys
    if declaration.equal_lengths:
        n_queries = n_keys = min(n_queries, n_keys)
    if not declaration.empty_sizes or input_features.NO_KEYS in avoid:
        n_keys = max(n_keys, 1)
    if not declaration.empty_sizes or input_features.DEGENERATE in avoid:
        n_queries = max(n_queries, 1)
    if (n_queries, n_keys) == (dims.n_queries, dims.n_keys):
        return dims
    return replace(dims, n_queries=n_queries, n_keys=n_keys)


def draw_permutation(data: st.DataObject, n: int, label: str) -> list[int]:
    """A permutation of range(n): drawn by Hypothesis when short, else a reversal, a
    rotation or a shuffle from the values seed."""
    if n <= LARGEST_DRAWN_COLLECTION:
        return data.draw(st.permutations(range(n)), label=label)
    kind = data.draw(st.sampled_from(("reverse", "rotate", "shuffle")), label=f"{label} kind")
    if kind == "reverse":
        return list(range(n - 1, -1, -1))
    if kind == "rotate":
        shift = data.draw(integers(1, n - 1), label=f"{label} shift")
        return [(i + shift) % n for i in range(n)]
    return [int(i) for i in draw_rng(data).permutation(n)]


def draw_subset(data: st.DataObject, n: int, label: str) -> list[int]:
    """A non-empty sorted subset of range(n) (n >= 1): drawn by Hypothesis when short, else
    a block of consecutive indices or a random share from the values seed."""
    if n <= LARGEST_DRAWN_COLLECTION:
        return sorted(
            data.draw(
                st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True), label=label
            )
        )
    if data.draw(_BOOLEANS, label=f"{label} scattered"):
        chosen = np.flatnonzero(draw_rng(data).random(n) < 0.3)
        return [int(i) for i in chosen] or [n - 1]
    start = data.draw(integers(0, n - 1), label=f"{label} start")
    stop = data.draw(integers(start + 1, n), label=f"{label} stop")
    return list(range(start, stop))


def with_declared_batch(kernel: DrawTarget, a: np.ndarray) -> np.ndarray:
    """``a`` (..., H, L, D) with leading size-1 batch dims added up to the number the kernel
    declares (``batch_ndim``), for problems built by hand; unchanged otherwise."""
    wanted = kernel.declaration.batch_ndim
    missing = 0 if wanted is None else wanted - (a.ndim - 3)
    return a.reshape((1,) * missing + a.shape) if missing > 0 else a


def draw_rng(data: st.DataObject) -> ValueGenerator:
    """A NumPy generator seeded by a drawn integer; :func:`random_values` draws a small
    array's values from ``data`` through it."""
    return ValueGenerator(data, data.draw(_VALUES_SEED, label="values seed"))


def draw_dtype(data: st.DataObject, kernel: DrawTarget) -> str:
    """One of the kernel's dtypes; an anchor's: its own, or "widest" (the most precise)."""
    forced = sizes.current().stratum.option("dtype")
    # a re-run drawing around a dtype (SDPA-1.3) draws the others
    avoided = {input_features.avoided_dtype(name) for name in sizes.avoided_now()}
    dtypes = tuple(d for d in kernel.dtypes if d not in avoided) or kernel.dtypes
    if forced == "widest":
        return dtypes[-1]
    if forced in kernel.dtypes:
        return str(forced)
    return data.draw(_one_of(dtypes), label="dtype")


def random_values(
    kernel: DrawTarget,
    rng: np.random.Generator,
    shape: tuple[int, ...],
    dtype: str,
    magnitude: float = 1.0,
) -> np.ndarray:
    """Normal values times ``magnitude``, rounded to ``dtype`` as the kernel will see them:
    in the small stratum with ``rng`` from :func:`draw_rng`, drawn by Hypothesis a byte
    per element so that they shrink to simple values (``small_values``); in realistic
    strata from ``rng``."""
    if isinstance(rng, ValueGenerator) and not sizes.realistic():
        normal = rng.drawn_normal(shape)
    else:
        # a stratum's first example draws the same arrays in every property: a repeat
        # comes from memory, read-only (repeated_normals)
        normal = REPEATED_NORMALS.standard_normal(rng, shape)
    remembered = not normal.flags.writeable  # repeated_normals' values: never written to
    if magnitude != 1.0 and remembered:
        normal, remembered = normal * magnitude, False
    elif magnitude != 1.0:
        normal *= magnitude  # this call's own array: no copy of a million values
    rounded = kernel.rounded(normal, dtype)
    if remembered and np.may_share_memory(rounded, normal):  # a rounding that kept them
        return np.array(rounded, copy=True)  # the caller's own array, not the memo's
    return rounded


def random_problem(
    kernel: DrawTarget,
    rng: np.random.Generator,
    dims: Dims,
    dtype: str,
    magnitude: float = 1.0,
    **fields: Any,
) -> Problem:
    """q, k (scaled by ``magnitude``) and v of ``dims``, as the kernel will see them (drawn
    in that order)."""

    def values(heads: int, length: int, dim: int, scale: float = 1.0) -> np.ndarray:
        return random_values(kernel, rng, (*dims.batch, heads, length, dim), dtype, scale)

    return Problem(
        q=values(dims.n_q_heads, dims.n_queries, dims.head_dim, magnitude),
        k=values(dims.n_kv_heads, dims.n_keys, dims.head_dim, magnitude),
        v=values(dims.n_kv_heads, dims.n_keys, dims.value_dim),
        dtype=dtype,
        **fields,
    )


def broadcast_shape_for(data: st.DataObject, full: tuple[int, ...], label: str) -> tuple[int, ...]:
    """A shape that broadcasts to ``full``: leading dims dropped, some dims set to 1."""
    if shape_pool.pooling(data):  # a backend that compiles per shape: a few shapes a run
        return shape_pool.pooled_broadcast(data, full, label, broadcast_shape_for)
    keep = data.draw(integers(2, len(full)), label=f"{label} ndim")
    shape = list(full[len(full) - keep :])
    for axis in range(len(shape) - 2):
        if data.draw(_BOOLEANS, label=f"{label} broadcast axis {axis}"):
            shape[axis] = 1
    return tuple(shape)


def draw_mask(
    data: st.DataObject,
    rng: np.random.Generator,
    dims: Dims,
    *,
    empty_rows: bool = True,
) -> np.ndarray:
    """Random, windowed or causal-looking masks, often with fully-masked rows; in realistic
    strata also per-batch-element padding (``values.draw_padding``) and wide windows."""
    stratum = sizes.current().stratum
    if stratum.realistic:
        kind = stratum.option("mask") or data.draw(
            st.sampled_from(values.MASK_KINDS), label="mask kind"
        )
        if kind == "padding":
            return np.ascontiguousarray(values.draw_padding(data, rng, dims))
        shape = broadcast_shape_for(data, dims.scores_shape, "mask")
    else:
        shape = broadcast_shape_for(data, dims.scores_shape, "mask")
        kind = data.draw(_SMALL_MASK_KIND, label="mask kind")
    n_q, n_k = shape[-2], shape[-1]
    rows, cols = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    if kind == "random":
        density = data.draw(_MASK_DENSITY, label="mask density")
        mask = rng.random(shape) < density
    elif kind == "window":
        if stratum.realistic:
            left, right = values.draw_window(data)
        else:
            left, right = data.draw(integers(0, 3), label="left"), data.draw(integers(0, 3))
        mask = np.broadcast_to((cols >= rows - left) & (cols <= rows + right), shape).copy()
    elif kind == "causal":
        alignment = data.draw(_MASK_ALIGNMENT, label="alignment")
        mask = np.broadcast_to(cols <= rows + causal_offset(n_q, n_k, alignment), shape).copy()
    else:
        mask = np.ones(shape, dtype=bool)
    if empty_rows and n_q and data.draw(_BOOLEANS, label="blank a row"):
        mask[..., data.draw(integers(0, n_q - 1), label="blank row"), :] = False
    return mask


def with_a_key_per_row(problem: Problem, declaration: Any) -> np.ndarray:
    """``problem.mask``, in its own shape, with each row that the mask and the causal rule
    leave without a key given one the causal rule allows; a row the causal rule alone
    empties (bottom-right, Lq > Lk) stays empty.  A row of a broadcast mask serves several
    rows of the scores: it gets the last key the causal rule allows in all of those that
    have one (the causal rule allows a prefix of the keys, so key 0 at least).  The shape
    stays the drawn one, so that a re-run drawing around SDPA-5.1 calls a kernel that
    compiles per shape with the shapes the first run compiled (shape_pool)."""
    mask = problem.required("mask")
    shape = input_features.scores_shape(problem)
    if shape[-1] == 0:
        return mask.copy()  # no keys: SDPA-5.2's inputs, not a fully masked row
    own = mask.reshape((1,) * (len(shape) - mask.ndim) + mask.shape).copy()
    causal = input_features.allowed_keys(problem.with_(mask=None, bias=None), declaration)
    keyed = np.asarray(causal.any(axis=-1))
    empty = keyed & ~(np.broadcast_to(own, shape) & causal).any(axis=-1)
    shared = tuple(a for a in range(len(shape) - 1) if own.shape[a] == 1 < shape[a])
    needy = np.asarray(empty.any(axis=shared, keepdims=True))
    if own.shape[-1] == 1:  # a mask broadcast over the keys: its True allows them all
        own[needy, 0] = True
    else:
        common = np.asarray((causal | ~keyed[..., None]).all(axis=shared, keepdims=True))
        last = shape[-1] - 1 - np.argmax(common[..., ::-1], axis=-1)
        rows = np.nonzero(needy)
        own[(*rows, last[rows])] = True
    return own.reshape(mask.shape)


def _wanted(
    data: st.DataObject, choice: str, claimed: bool, label: str, forced: object = None
) -> bool:
    """Whether to use an option: never unless claimed; "always"; a stratum's forced
    option; else drawn."""
    if not claimed or choice == NEVER:
        return False
    if choice == ALWAYS or forced is not None:
        return True
    return data.draw(_BOOLEANS, label=label)


def draw_bias(
    data: st.DataObject,
    kernel: DrawTarget,
    rng: np.random.Generator,
    dims: Dims,
    dtype: str,
    *,
    tight: bool = False,
) -> np.ndarray:
    """N(0, 1) bias of a shape broadcasting to the scores; in realistic strata also
    ALiBi-like and padding biases (-1e4, -1e9, finfo.min) unless ``tight`` (a bias of a
    few units, e.g. so that no row's weights vanish).  A tight bias in a realistic
    stratum takes the shape the drawn kind has (N(0, 1) values in an ALiBi or padding
    shape), so that a property asking for one, or a re-run drawing around SDPA-7.4, calls
    a kernel compiling per shape with the shapes the other properties compiled."""
    stratum = sizes.current().stratum
    kind = "normal"
    if stratum.realistic:
        kind = stratum.option("bias") or data.draw(
            st.sampled_from(values.BIAS_KINDS), label="bias kind"
        )
    if kind == "normal":
        shape = broadcast_shape_for(data, dims.scores_shape, "bias")
        return random_values(kernel, rng, shape, dtype)
    bias = values.draw_bias_values(data, kernel, rng, dims, dtype, kind)
    # drawing around SDPA-7.4: no padding fill (-1e4 ... finfo.min)
    if tight or input_features.LARGE_BIAS in sizes.avoided_now():
        return random_values(kernel, rng, bias.shape, dtype)
    return bias


def _as_called(dims: Dims, declaration: KernelDeclaration) -> Dims:
    """``dims`` as a kernel that needs E == Ev gets them where Ev < E: v padded with zero
    columns to E (layouts.padding_plan), so that a problem with fewer value columns (Ev = 0
    among them) meets the options tied to the shape the kernel is called with, and its
    compilation."""
    if declaration.equal_head_dims and dims.value_dim < dims.head_dim:
        return replace(dims, value_dim=dims.head_dim)
    return dims


def draw_problem(
    data: st.DataObject,
    kernel: DrawTarget,
    *,
    dtype: str | None = None,
    dims: Dims | None = None,
    mask: str = MAYBE,
    bias: str = MAYBE,
    causal: str = MAYBE,
    scale: str = MAYBE,
    empty_rows: bool = True,
    magnitude: float | None = None,
    tight: bool = False,
    **dims_options: Any,
) -> Problem:
    """One problem the kernel claims to handle; ``mask``/``bias``/``causal``/``scale``
    are "maybe", "never" or "always" (always still requires the claim).

    In realistic strata the q/k values (outlier channels, scores near float16's limit),
    bias (ALiBi, padding fills) and mask (padding per batch element) are drawn too, and a
    stratum may force options: "maybe" options it forces are used.  ``tight``: only
    biases of a few units (see :func:`draw_bias`).
    """
    decl = kernel.declaration
    stratum = sizes.current().stratum
    dims = dims or draw_dims(data, kernel, **dims_options)
    if shape_pool.pooling(data):  # what the kernel compiles for follows the pooled shape
        data = shape_pool.tied_to(data, _as_called(dims, decl))
    dtype = dtype or draw_dtype(data, kernel)
    rng = draw_rng(data)
    if magnitude is None:
        magnitude = data.draw(_MAGNITUDE, label="magnitude")
        if stratum.realistic:
            qk_kind = values.draw_qk_kind(data)
            if qk_kind != "normal":
                magnitude = 1.0  # outliers and large scores start from unit channels
    else:
        qk_kind = "normal"
    problem = random_problem(kernel, rng, dims, dtype, magnitude)
    if stratum.realistic:
        problem = values.with_qk_values(data, kernel, rng, problem, qk_kind)
    use_causal = _wanted(data, causal, decl.causal, "causal", stratum.option("causal"))
    together = decl.mask_and_causal and (input_features.MASK_AND_CAUSAL not in sizes.avoided_now())
    use_mask = _wanted(
        data, mask, decl.mask and (together or not use_causal), "mask", stratum.option("mask")
    )
    if use_causal:
        problem.is_causal = True
    if use_mask:
        avoid_empty = input_features.FULLY_MASKED_ROW in sizes.avoided_now()
        problem.mask = draw_mask(data, rng, dims, empty_rows=empty_rows and not avoid_empty)
        if avoid_empty:  # drawing around SDPA-5.1: every row keeps a key it may attend
            problem.mask = with_a_key_per_row(problem, decl)
    if _wanted(
        data,
        bias,
        decl.bias and not (use_causal and decl.bias_shares_mask_argument),
        "bias",
        stratum.option("bias"),
    ):
        # in the dtype the kernel gets it in: finfo(float32).min fills for --float32-bias
        bias_dtype = decl.bias_dtype(dtype)
        problem.bias = draw_bias(data, kernel, rng, dims, bias_dtype, tight=tight)
    forced_scale = stratum.option("scale")
    if _wanted(data, scale, decl.scale, "explicit scale", forced_scale):
        problem.scale = (
            forced_scale if forced_scale is not None else data.draw(_EXPLICIT_SCALE, label="scale")
        )
    return problem
