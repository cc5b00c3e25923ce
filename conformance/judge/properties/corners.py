"""SDPA-1.2, SDPA-1.5, SDPA-1.7 and SDPA-4.1 on fixed corner problems that every run checks,
whatever its seed.

The Hypothesis properties of those clauses (``batch-broadcast``, ``empty-sizes``) draw an
empty size and a broadcast batch shape independently, so an input that needs both (PyTorch
keeps q's batch shape when Lq = 0: docs/divergences.md#torch-empty-broadcast) was met on 6
seeds of 10 in the quick profile (issue 29).  These problems are cheap (a few elements
each), so every profile runs all of them, once, as fixed problems: a finding on them is met
on every seed.  Everything but the sizes and the features named is Hypothesis's simplest
choice (no mask, no bias, the default scale), drawn the same way in every run.

``layout-corners`` does the same for the option corners a dispatcher routes by layout: a
causal call with scale 0 or a negative scale (SDPA-2.2 allows both) on contiguous inputs and
on strided and transposed views.  PyTorch's dispatcher takes its flash path for the first and
its math path for the others, and only the flash path gives NaN there
(docs/divergences.md#torch-causal-scale-zero): ``layout-independence`` met that on 9 seeds
of 10, needing the option and a non-contiguous layout in one draw.  ``min-bias-corners``
gives a row whose every allowed key carries the dtype's most negative finite bias, beside a
causal call or a mask, and checks that the excluded key does not reach it: JAX's fill for
excluded logits outranks that bias (met on 9 seeds of 10 through the padded-batch anchor).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.input_features import scores_shape
from ...draw.realistic_values import LARGEST_FINITE
from ...draw.seeded import SeededDraws
from ...draw.sizes import Dims
from ...draw.strategies import ALWAYS, NEVER, draw_problem, within_limitations
from ..assertions import assert_identical, assert_matches_reference, assert_same_result
from ..kernel import KernelUnderTest
from ..registration import dense_only, register, takes_any_batch_dims
from ._helpers import arrays_have_layouts, assert_output_shapes, output_laid_out

# (Lq, Lk, Ev) of the corner sizes: no queries, no keys, no value channels, one query on
# one key (a single-key row), and a small problem with unequal lengths; E = 4 throughout.
CORNER_LENGTHS = ((0, 3, 4), (3, 0, 4), (3, 3, 0), (1, 1, 4), (2, 3, 4))
HEAD_DIM = 4
_FEATURES = ("mask", "bias", "causal")

# Batch shapes of (q, k, v) that broadcast together: each input alone keeping the batch
# dim or dropping it to 1, a leading dim left out, and two dims broadcasting crosswise.
BROADCAST_BATCHES: tuple[tuple[tuple[int, ...], ...], ...] = (
    ((2,), (1,), (1,)),
    ((1,), (2,), (2,)),
    ((1,), (2,), (1,)),
    ((1,), (1,), (2,)),
    ((2,), (2,), (1,)),
    ((2,), (1,), (2,)),
    ((), (2,), (2,)),
    ((2,), (), ()),
    ((2, 1), (1, 3), (1, 3)),
)


def _simplest_problem(kernel: KernelUnderTest, dims: Dims, **options: str) -> Problem:
    """The problem of ``dims`` with Hypothesis's simplest choice of everything else
    (values included): the same in every run, whatever its seed."""
    return draw_problem(SeededDraws(None), kernel, dims=dims, **options)  # type: ignore[arg-type]


def _batch_of(a: np.ndarray, source: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """``a`` (batch ``source``, no dim 0) cut to batch ``shape``, which broadcasts to
    ``source`` once its 0s are 1s: the first element along every dim ``shape`` has as 1,
    none along a dim it has as 0, without the leading dims it leaves out."""
    left_out = len(source) - len(shape)
    index = tuple(
        0
        if i < left_out
        else slice(0, 0)
        if shape[i - left_out] == 0
        else slice(0, 1)
        if shape[i - left_out] == 1
        else slice(None)
        for i in range(len(source))
    )
    return np.ascontiguousarray(a[index])


@dataclass(frozen=True)
class _Corner:
    dims: Dims
    shapes: tuple[tuple[int, ...], ...]  # batch shapes of q, k and v

    def text(self) -> str:
        d = self.dims
        batches = ", ".join(f"{n} {s}" for n, s in zip("qkv", self.shapes, strict=True))
        return f"batch shapes {batches}, Lq={d.n_queries}, Lk={d.n_keys}, Ev={d.value_dim}"


def broadcast_corners(declaration: KernelDeclaration, compiles: bool) -> Iterator[_Corner]:
    """Each broadcast pattern of BROADCAST_BATCHES at each of CORNER_LENGTHS, and each
    pattern with its batch dim of 2 made 0 (a zero batch dim broadcast against 1s): 54
    problems.  ``compiles``: a backend that compiles per shape (about a second each on a
    CPU) gets each pattern at one corner size, in turn, and the zero batch dim with the
    first: 10 problems, each pattern and each size met."""
    gqa = bool(declaration.gqa)
    for i, shapes in enumerate(BROADCAST_BATCHES):
        full = tuple(int(n) for n in np.broadcast_shapes(*shapes))
        lengths = CORNER_LENGTHS[i % len(CORNER_LENGTHS) :][:1] if compiles else CORNER_LENGTHS
        for n_queries, n_keys, value_dim in lengths:
            yield _Corner(_dims(full, gqa, n_queries, n_keys, value_dim), shapes)
        if compiles and i > 0:
            continue
        zero = tuple(tuple(0 if n > 1 else n for n in s) for s in shapes)
        zero_full = tuple(0 if n > 1 else n for n in full)
        yield _Corner(_dims(zero_full, gqa, 2, 3, HEAD_DIM), zero)


def _dims(batch: tuple[int, ...], gqa: bool, n_queries: int, n_keys: int, value_dim: int) -> Dims:
    return Dims(
        batch=batch,
        n_kv_heads=1,
        groups=2 if gqa else 1,  # GQA where claimed: the head mapping meets the corner too
        n_queries=n_queries,
        n_keys=n_keys,
        head_dim=HEAD_DIM,
        value_dim=value_dim,
    )


@register("batch-broadcast-corners", "SDPA-1.2", kind="fixed", applies=takes_any_batch_dims)
def batch_broadcast_corners(kernel: KernelUnderTest, seed: int) -> None:
    """Fixed problems, the same on every seed: q, k and v whose batch shapes broadcast
    (each input alone broadcast or not, a leading dim left out, two dims crosswise; GQA
    where claimed) at each corner size: Lq = 0, Lk = 0, Ev = 0, a zero batch dim, one
    query on one key, and 2 x 3 (on a backend that compiles per shape, each pattern at
    one of those sizes in turn).  The output has the broadcast batch shape (SDPA-1.2, kept
    for empty sizes by SDPA-1.5) and, where every row has a key, the definition's values
    within TOL-2; rows without keys are SDPA-5.1's and are judged by its properties."""
    del seed  # the problems do not depend on it: that is the point
    for corner in broadcast_corners(kernel.declaration, kernel.backend.compiles_per_shape):
        dims = within_limitations(kernel, corner.dims)
        if dims != corner.dims:
            continue  # an empty length the kernel does not claim (empty_sizes)
        # drawn with each 0 of the batch a 1 (values to cut from), then cut to the shapes
        source = tuple(max(n, 1) for n in dims.batch)
        full = _simplest_problem(
            kernel, replace(dims, batch=source), mask=NEVER, bias=NEVER, causal=NEVER
        )
        reduced = full.with_(
            **{
                name: _batch_of(getattr(full, name), source, shape)
                for name, shape in zip("qkv", corner.shapes, strict=True)
            }
        )
        what = f"out ({corner.text()})"
        if dims.n_keys == 0:
            out, weights = kernel.call_on(reduced)
            assert_output_shapes(kernel, reduced, out, weights)
        else:
            assert_matches_reference(kernel, reduced, what=what)


def empty_corners(declaration: KernelDeclaration, compiles: bool) -> Iterator[tuple[Dims, str]]:
    """Each empty axis (Lq, Lk, Ev and, with batch dims, a batch dim) with each claimed
    feature that changes the shapes a kernel handles: nothing, GQA, a mask, a bias, causal
    (as ``(dims, feature)``).  ``compiles``: a backend that compiles per shape gets each
    empty axis with GQA where claimed and no other feature (a compilation each)."""
    ndim = 1 if declaration.batch_ndim is None else declaration.batch_ndim
    features = ["plain"]
    if not compiles:
        features += [name for name in _FEATURES if getattr(declaration, name)]
    base = Dims(
        batch=(2,) * ndim,
        n_kv_heads=2,
        groups=2 if declaration.gqa else 1,
        n_queries=3,
        n_keys=5,
        head_dim=HEAD_DIM,
        value_dim=HEAD_DIM,
    )
    empties = [
        replace(base, n_queries=0),
        replace(base, n_keys=0),
        replace(base, value_dim=0),
    ]
    if ndim:
        empties.append(replace(base, batch=(0, *base.batch[1:])))
    for dims in empties:
        for feature in features:
            yield dims, feature


@register("empty-size-corners", "SDPA-1.5", kind="fixed")
def empty_size_corners(kernel: KernelUnderTest, seed: int) -> None:
    """Fixed problems, the same on every seed: Lq = 0, Lk = 0, Ev = 0 and a zero batch dim,
    each alone and with each claimed shape feature (GQA where claimed, a mask, a bias,
    causal; on a backend that compiles per shape, GQA only) give an output (and weights)
    of the right shape, not an exception (SDPA-1.5)."""
    del seed
    for dims, feature in empty_corners(kernel.declaration, kernel.backend.compiles_per_shape):
        if within_limitations(kernel, dims) != dims:
            continue  # an empty length the kernel does not claim (empty_sizes)
        options = {name: (ALWAYS if name == feature else NEVER) for name in _FEATURES}
        problem = _simplest_problem(kernel, dims, **options)
        out, weights = kernel.call_on(problem)
        assert_output_shapes(kernel, problem, out, weights)


# Scales a causal call may take that kernels special-case (SDPA-2.2 allows any finite one),
# and the layouts each is called with besides contiguous: every other element of v's rows,
# and q, k and v stored transposed.
CORNER_SCALES = (0.0, -0.75)
CORNER_LAYOUTS: tuple[dict[str, str], ...] = (
    {"v": "strided"},
    {"q": "transposed", "k": "transposed", "v": "transposed"},
)


def _causal_with_scale(declaration: KernelDeclaration) -> str | None:
    reason = dense_only(declaration)
    missing = [claim for claim in ("causal", "scale") if not getattr(declaration, claim)]
    if reason is None and missing:
        reason = f"the kernel does not claim {' and '.join(missing)}"
    return reason


@register(
    "layout-corners",
    "SDPA-1.7",
    kind="fixed",
    applies=_causal_with_scale,
    applies_on=arrays_have_layouts,
)
def layout_corners(kernel: KernelUnderTest, seed: int) -> None:
    """Fixed problems, the same on every seed: a causal call with scale 0 and with scale
    -0.75 (one batch element, one head, 3 queries on 3 keys, q = k = 1, v = 0 ... 5: every
    allowed score equal), on
    contiguous inputs and then with v strided, and with q, k and v transposed.  Each
    laid-out call gives the contiguous call's result within TOL-2 (SDPA-1.7; how close
    either is to the definition is SDPA-7.3's): a kernel that dispatches by layout to paths
    that treat these options differently fails on every seed."""
    del seed
    batch_ndim = kernel.declaration.batch_ndim
    # (B, H, L, E) where the kernel takes any batch dims: the shape fused paths take
    dims = _dims((1,) * (1 if batch_ndim is None else batch_ndim), False, 3, 3, 2)
    drawn = _simplest_problem(kernel, replace(dims, head_dim=2), mask=NEVER, bias=NEVER)
    problem = drawn.with_(
        q=np.ones_like(drawn.q),
        k=np.ones_like(drawn.k),
        v=np.arange(drawn.v.size, dtype=np.float64).reshape(drawn.v.shape),
        is_causal=True,
    )
    for scale in CORNER_SCALES:
        scaled = problem.with_(scale=scale)
        contiguous = kernel.output(scaled)
        for layouts in CORNER_LAYOUTS:
            described = ", ".join(f"{name}: {layout}" for name, layout in layouts.items())
            out = output_laid_out(kernel, scaled, layouts, f" (input layouts {described})")
            assert_same_result(
                kernel, scaled, out, contiguous, f"out with input layouts {described} vs contiguous"
            )


def _bias_beside_causal_or_mask(declaration: KernelDeclaration) -> str | None:
    reason = dense_only(declaration)
    if reason is None and not declaration.bias:
        reason = "the kernel does not claim a bias"
    elif reason is None and declaration.bias_shares_mask_argument:
        reason = "its bias travels in the mask's argument: no bias beside a causal call or a mask"
    elif reason is None and not (declaration.causal or declaration.mask):
        reason = "the kernel claims neither causal calls nor a mask"
    return reason


@register("min-bias-corners", "SDPA-4.1", kind="fixed", applies=_bias_beside_causal_or_mask)
def min_bias_corners(kernel: KernelUnderTest, seed: int) -> None:
    """Fixed problems, the same on every seed, in each dtype checked: 2 queries on 2 keys
    (q = 1, k = 1 and -1, v = 2 and 4) whose every bias entry is the dtype's most negative
    finite number (an HF-style additive padding fill), with is_causal (key 1 in query 0's
    future) and, where claimed, with a mask excluding it instead.  Query 0's output stays
    bit-identical when the excluded key 1 gets another key and value (SDPA-4.1, SDPA-3.1;
    a finite bias, however negative, keeps key 0 in S(0), SDPA-3.3; TOL-2 cannot judge
    such scores, so the excluded key's influence is what is checked, as causal-zeros does).
    A kernel that fills excluded logits with a finite number above that bias (JAX's
    -0.7 finfo.max, docs/divergences.md#jax-fill-outranks-min-bias) gives key 1 the weight:
    the quick profile met that on 9 seeds of 10 through an anchor, here on every seed."""
    del seed
    decl = kernel.declaration
    batch_ndim = decl.batch_ndim
    dims = _dims((1,) * (1 if batch_ndim is None else batch_ndim), False, 2, 2, 1)
    drawn = _simplest_problem(kernel, replace(dims, head_dim=1), mask=NEVER, bias=NEVER)
    base = drawn.with_(
        q=np.ones_like(drawn.q),
        k=np.reshape([1.0, -1.0], drawn.k.shape),
        v=np.reshape([2.0, 4.0], drawn.v.shape),
    )
    options: list[dict[str, Any]] = [{"is_causal": True}] if decl.causal else []
    options += [{"mask": np.array([[True, False], [True, True]])}] if decl.mask else []
    for dtype in kernel.dtypes:
        fill = np.full(scores_shape(base), -LARGEST_FINITE[dtype])
        for option in options:
            problem = base.with_(dtype=dtype, bias=fill, **option)
            other = problem.with_(
                k=np.reshape([1.0, 3.0], base.k.shape), v=np.reshape([2.0, 8.0], base.v.shape)
            )
            how = "is_causal" if "is_causal" in option else "a mask excluding it"
            assert_identical(
                kernel.output(other)[..., :1, :],
                kernel.output(problem)[..., :1, :],
                f"out of query 0 after changing the excluded key 1 ({how}; every bias entry "
                f"{-LARGEST_FINITE[dtype]:.4g}) [SDPA-4.1, SDPA-3.1]",
                other,
                kernel,
            )
