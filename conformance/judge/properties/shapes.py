"""SDPA-1: output shape and dtype, empty sizes, inputs left unmodified, and results that
do not depend on the memory layout of the inputs (strided, transposed, stride-0)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import array_api_compat
import numpy as np
from hypothesis import strategies as st

from ...call.wire import float_bits
from ...claims.declaration import KernelDeclaration
from ...draw.input_features import scores_shape
from ...draw.sizes import current
from ...draw.strategies import draw_dims, draw_problem
from ..assertions import assert_matches_reference, assert_same_result, first_index
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import always, dense_only, register, takes_any_batch_dims
from ._helpers import (
    arrays_have_layouts,
    assert_output_shape_and_dtype,
    assert_output_shapes,
    awkward_key_counts,
    call_text,
    call_with,
    draw_any_problem,
    laid_out,
)

LAYOUTS = ("contiguous", "strided", "strided_rows", "transposed", "broadcast")


def _takes_unequal_head_dims(declaration: KernelDeclaration) -> str | None:
    reason = dense_only(declaration)
    if reason is None and declaration.equal_head_dims:
        reason = "the kernel declares equal_head_dims (needs E == Ev): the suite pads it"
    return reason


@register("value-head-dim", "SDPA-1.1", applies=_takes_unequal_head_dims)
def value_head_dim(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Ev != E (larger and smaller, with masks, bias, causal and GQA drawn) is accepted and
    gives a (*batch, Hq, Lq, Ev) output: the one finding of a kernel that rejects it, which
    every other property's failure on such inputs follows from (input_features)."""
    dims = draw_dims(data, kernel, where=lambda d: d.value_dim not in (0, d.head_dim))
    if dims.value_dim in (0, dims.head_dim):
        room = current().limits.max_head_dim
        other = dims.head_dim + 1 if dims.head_dim < room else max(dims.head_dim - 1, 1)
        if other == dims.head_dim:
            kernel.note("--max-head-dim 1 leaves no Ev != E to draw")
            return
        dims = replace(dims, value_dim=other)
    problem = draw_problem(data, kernel, dims=dims)
    out, weights = kernel.call_on(problem)
    assert_output_shapes(kernel, problem, out, weights)


@register("batch-broadcast", "SDPA-1.2", applies=takes_any_batch_dims)
def batch_broadcast(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """q, k and v whose batch shapes broadcast together (a size 1 or a missing leading dim
    in some of them: one key/value set for every query batch element, one query batch on
    per-element keys) give the definition on the broadcast batch shape, within TOL-2, as an
    output of that shape: a kernel that pairs batch elements by a flattened index, or reads
    the first element's keys for all, does not."""
    dims = draw_dims(data, kernel, where=lambda d: any(size > 1 for size in d.batch))
    if not any(size > 1 for size in dims.batch):
        if 2 * dims.batch_heads > current().limits.max_batch_heads:
            kernel.note("--max-batch-heads leaves no batch of 2 to broadcast at these heads")
            return
        dims = replace(dims, batch=(2, *dims.batch[-1:]))  # a batch dim to broadcast
    problem = draw_problem(data, kernel, dims=dims)
    shapes = _draw_broadcasting_batches(data, dims.batch)
    reduced = problem.with_(
        **{
            name: _batch_reduced(getattr(problem, name), dims.batch, shape)
            for name, shape in zip(("q", "k", "v"), shapes, strict=True)
        }
    )
    batches = ", ".join(f"{n} {s}" for n, s in zip(("q", "k", "v"), shapes, strict=True))
    assert_matches_reference(kernel, reduced, what=f"out (batch shapes {batches})")


def _draw_broadcasting_batches(
    data: st.DataObject, full: tuple[int, ...]
) -> tuple[tuple[int, ...], ...]:
    """Batch shapes of q, k and v that broadcast to ``full``: at each dim of size > 1 a
    nonempty set of them keeps the size and the others have 1 (one of them at least: the
    example is about broadcasting), and leading dims of size 1 may be left out."""
    kept = [[True] * 3 for _ in full]
    for i, size in enumerate(full):
        if size > 1:
            keepers = data.draw(
                st.sets(st.integers(0, 2), min_size=1, max_size=3), label="inputs keeping dim"
            )
            kept[i] = [t in keepers for t in range(3)]
    if all(all(row) for row in kept):  # something must broadcast: k and v on the first
        first = next(i for i, size in enumerate(full) if size > 1)
        kept[first] = [True, False, False]
    shapes = []
    for t in range(3):
        shape = [size if kept[i][t] else 1 for i, size in enumerate(full)]
        ones = next((i for i, size in enumerate(shape) if size != 1), len(shape))
        drop = data.draw(st.integers(0, ones), label="leading dims left out")
        shapes.append(tuple(shape[drop:]))
    return tuple(shapes)


def _batch_reduced(a: np.ndarray, full: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """``a`` (batch ``full``) cut to batch ``shape``, which broadcasts to ``full``: its first
    element along every dim ``shape`` has as 1, and the leading dims it leaves out."""
    left_out = len(full) - len(shape)
    index = tuple(
        0 if i < left_out else slice(0, 1) if shape[i - left_out] == 1 and size > 1 else slice(None)
        for i, size in enumerate(full)
    )
    return np.ascontiguousarray(a[index])


@register("output-shape-dtype", "SDPA-1.3")
def output_shape_dtype(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """For every claimed dtype the output is a (*batch, Hq, Lq, Ev) array of q's dtype,
    and returned weights a (*batch, Hq, Lq, Lk) array of q's dtype.  Where shapes are
    pooled (a backend compiling per shape), a realistic shape is checked in the dtype its
    pool ties to it, as every property meets it: each other dtype would be a compilation
    for this property alone.  Every dtype still meets every small shape and the anchors
    run in each dtype."""
    dims = draw_dims(data, kernel)
    for dtype in (None,) if current().pooled_realistic else kernel.dtypes:
        problem = draw_problem(data, kernel, dims=dims, dtype=dtype)
        out, weights = kernel.call_on(problem)
        assert_output_shape_and_dtype(kernel, problem, out, weights)


@register("empty-sizes", "SDPA-1.5")
def empty_sizes(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Lq = 0, a zero batch dim or Ev = 0 give an empty output of the right shape
    (and empty weights of the right shape), not an exception."""
    dims = draw_dims(data, kernel)
    axes = ["Lq", "Ev"] if kernel.declaration.batch_ndim == 0 else ["Lq", "batch", "Ev"]
    empty = data.draw(st.sampled_from(axes), label="empty axis")
    if empty == "Lq":
        dims = replace(dims, n_queries=0)
    elif empty == "Ev":
        dims = replace(dims, value_dim=0)
    else:
        axis = data.draw(st.integers(0, max(len(dims.batch) - 1, 0)), label="empty batch axis")
        batch = list(dims.batch) or [1]
        batch[axis] = 0
        dims = replace(dims, batch=tuple(batch))
    problem = draw_problem(data, kernel, dims=dims)
    out, weights = kernel.call_on(problem)
    assert_output_shapes(kernel, problem, out, weights)


@register("inputs-unmodified", "SDPA-1.6", applies=always)
def inputs_unmodified(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The call leaves q, k, v, the mask and the bias bit-for-bit as they were (kernels of
    every family)."""
    problem = draw_any_problem(data, kernel)
    args, kwargs = kernel.arguments(problem)
    named = {**dict(zip("qkv", args, strict=True)), **kwargs}
    arrays = {n: x for n, x in named.items() if array_api_compat.is_array_api_obj(x)}
    to_numpy = kernel.backend.to_numpy
    before = {n: np.array(to_numpy(x), copy=True) for n, x in arrays.items()}
    call_with(kernel, problem, args, kwargs)
    later = inputs_changed_later(kernel, arrays, before)
    if later:
        raise PropertyFailure(
            f"{', '.join(later)} changed after the call returned (re-read "
            f"{RECHECK_DELAY * 1000:g} ms later): the kernel kept working on its inputs "
            f"[SDPA-1.6, {call_text(kernel)}]",
            problem,
            kernel,
        )
    for name, x in arrays.items():
        after = to_numpy(x)
        changed = float_bits(after) != float_bits(before[name])
        if changed.any():
            at = first_index(changed)
            raise PropertyFailure(
                f"{name} was modified by the call: {name}{at} was {before[name][at].item()!r} "
                f"and is now {after[at].item()!r} ({int(changed.sum())} of {changed.size} "
                f"elements changed) "
                f"[SDPA-1.6, {call_text(kernel)}]",
                problem,
                kernel,
            )


# How long after a call the inputs are read again: a kernel that goes on writing them from
# a thread of its own (or a stream it did not wait for) is caught here, not only one that
# changes them before it returns.
RECHECK_DELAY = 0.05


def inputs_changed_later(
    kernel: KernelUnderTest, arrays: dict[str, Any], at_return: dict[str, np.ndarray]
) -> list[str]:
    """The inputs that changed within RECHECK_DELAY after the call returned: read in the
    kernel's process when it runs in its own (the judge holds copies there), here
    otherwise."""
    recheck = getattr(kernel.fn, "recheck_inputs", None)
    if recheck is not None:
        names: list[str] = recheck(RECHECK_DELAY)
        return names
    after_return = {n: np.array(kernel.backend.to_numpy(x), copy=True) for n, x in arrays.items()}
    time.sleep(RECHECK_DELAY)
    return [
        name
        for name, x in arrays.items()
        if not np.array_equal(
            float_bits(kernel.backend.to_numpy(x)), float_bits(after_return[name])
        )
        and np.array_equal(float_bits(after_return[name]), float_bits(at_return[name]))
    ]


def _one_along(data: st.DataObject, values: np.ndarray, label: str) -> np.ndarray:
    """``values`` cut to size 1 along some drawn axes (all but the innermost)."""
    index = tuple(
        slice(0, 1)
        if data.draw(st.booleans(), label=f"{label} stride-0 axis {axis}")
        else slice(None)
        for axis in range(values.ndim - 1)
    )
    return values[index]


@register("layout-independence", "SDPA-1.7", applies_on=arrays_have_layouts)
def layout_independence(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Non-contiguous inputs (every other element or row of a larger array, transposed
    storage) and stride-0 broadcast inputs (K/V over batch and heads, a broadcast mask)
    give the contiguous inputs' result within TOL-2 (each call within its bound of the
    definition); how close either is to the definition is matches-reference's (SDPA-7.3)."""
    decl = kernel.declaration
    dims = draw_dims(data, kernel)
    n_keys = data.draw(st.sampled_from((dims.n_keys, *awkward_key_counts())), label="Lk")
    problem = draw_problem(data, kernel, dims=replace(dims, n_keys=n_keys))
    full_scores = scores_shape(problem)

    layouts: dict[str, str] = {}
    small: dict[str, np.ndarray] = {}
    for name in "qkv":
        layouts[name] = data.draw(st.sampled_from(LAYOUTS), label=f"{name} layout")
        if layouts[name] == "broadcast":
            values = getattr(problem, name)
            small[name] = _one_along(data, values, name)
            problem = problem.with_(**{name: np.broadcast_to(small[name], values.shape).copy()})

    # Mask and bias arguments: a "broadcast" one is passed as a stride-0 expansion of its
    # (Lq, Lk) slice to the full (*batch, Hq, Lq, Lk).
    arguments = {"mask": decl.mask_keyword, "bias": decl.bias_keyword}
    for field in ("mask", "bias"):
        keyword = arguments[field]
        if getattr(problem, field) is None or keyword in layouts:
            continue
        layouts[keyword] = data.draw(st.sampled_from(LAYOUTS), label=f"{keyword} layout")
        if layouts[keyword] == "broadcast":
            for shared in ("mask", "bias"):
                a = getattr(problem, shared)
                if a is not None and arguments[shared] == keyword:
                    problem = problem.with_(**{shared: a[(0,) * (a.ndim - 2)]})

    # first, so that what the contiguous call shows (it raises, it is inaccurate) is found
    # as what it is, by the properties of those clauses, and not blamed on the layout
    contiguous = kernel.output(problem)
    args, kwargs = kernel.arguments(problem)
    backend = kernel.backend
    args = tuple(
        laid_out(
            backend,
            small.get(name, getattr(problem, name)),
            problem.dtype,
            layouts[name],
            getattr(problem, name).shape,
        )
        for name in "qkv"
    )
    for keyword, layout in layouts.items():
        if keyword in kwargs:
            values = backend.to_numpy(kwargs[keyword])
            # in the dtype it was passed in: a float32 bias of half inputs (--float32-bias)
            # and float32 ALiBi slopes stay float32
            dtype = None if values.dtype == bool else backend.dtype_name(kwargs[keyword])
            kwargs[keyword] = laid_out(backend, values, dtype, layout, full_scores)

    described = ", ".join(f"{n}: {lay}" for n, lay in layouts.items())
    out, _ = call_with(kernel, problem, args, kwargs, f" (input layouts {described})")
    strided = kernel.numpy(out)
    # SDPA-1.7: "the same result as contiguous copies ... within TOL-2"
    assert_same_result(
        kernel, problem, strided, contiguous, f"out with input layouts {described} vs contiguous"
    )
    same = (strided == contiguous) | (np.isnan(strided) & np.isnan(contiguous))
    if not same.all():  # SDPA-1.8 (SHOULD, split from SDPA-1.7): reported as a note
        differences = np.abs(strided - contiguous)[~same]
        differences = differences[~np.isnan(differences)]
        worst = (
            f"max difference {differences.max():.3g}"
            if differences.size
            else "NaN in one where the other has a number"
        )
        kernel.note(f"not bit-identical to contiguous inputs for layouts {described} ({worst})")
