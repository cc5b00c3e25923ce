"""Hypothesis strategies for attention problems, restricted to what a kernel claims.

Sizes, dtypes and structure (masks, bias, causal, scale) are drawn by Hypothesis and
shrink; array values come from a NumPy generator seeded by a drawn integer, which keeps
drawing fast and every example reproducible.  Nothing is filtered, so no health check
can trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..reference.masks import causal_offset
from .kernel import KernelUnderTest, Problem

MAGNITUDES = (1.0, 0.25, 3.0, 1e-3, 10.0)
EXPLICIT_SCALES = (0.5, 1.0, 0.0, 2.0, -0.75, 0.125)
MAYBE, NEVER, ALWAYS = "maybe", "never", "always"


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


def draw_dims(
    data: st.DataObject,
    kernel: KernelUnderTest,
    *,
    min_queries: int = 0,
    min_keys: int = 0,
    max_len: int = 9,
    max_batch_ndim: int = 2,
    gqa: bool | None = None,
) -> Dims:
    """Batch dims 0-2, GQA only when claimed, Lq != Lk, E != Ev, odd sizes, empty axes."""
    use_gqa = kernel.declaration.gqa if gqa is None else gqa
    batch_ndim = kernel.declaration.batch_ndim
    if batch_ndim is None:
        batch_ndim = data.draw(st.integers(0, max_batch_ndim), label="batch ndim")
    return Dims(
        batch=tuple(data.draw(st.lists(st.integers(1, 3), min_size=batch_ndim,
                                       max_size=batch_ndim), label="batch")),
        n_kv_heads=data.draw(st.integers(1, 3), label="Hkv"),
        groups=data.draw(st.integers(1, 3), label="G") if use_gqa else 1,
        n_queries=data.draw(st.integers(min_queries, max(max_len, min_queries)), label="Lq"),
        n_keys=data.draw(st.integers(min_keys, max(max_len, min_keys)), label="Lk"),
        head_dim=data.draw(st.integers(1, 8), label="E"),
        value_dim=data.draw(st.integers(1, 8), label="Ev"),
    )


def with_declared_batch(kernel: KernelUnderTest, a: np.ndarray) -> np.ndarray:
    """``a`` (..., H, L, D) with leading size-1 batch dims added up to the number the kernel
    declares (``batch_ndim``), for problems built by hand; unchanged otherwise."""
    wanted = kernel.declaration.batch_ndim
    missing = 0 if wanted is None else wanted - (a.ndim - 3)
    return a.reshape((1,) * missing + a.shape) if missing > 0 else a


def draw_rng(data: st.DataObject) -> np.random.Generator:
    return np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))


def draw_dtype(data: st.DataObject, kernel: KernelUnderTest) -> str:
    return data.draw(st.sampled_from(kernel.dtypes), label="dtype")


def random_values(
    kernel: KernelUnderTest, rng: np.random.Generator, shape: tuple[int, ...], dtype: str,
    magnitude: float = 1.0,
) -> np.ndarray:
    """Normal values times ``magnitude``, rounded to ``dtype`` as the kernel will see them."""
    return kernel.rounded(rng.standard_normal(shape) * magnitude, dtype)


def random_problem(
    kernel: KernelUnderTest, rng: np.random.Generator, dims: Dims, dtype: str,
    magnitude: float = 1.0, **fields: Any,
) -> Problem:
    """q, k (scaled by ``magnitude``) and v of ``dims``, as the kernel will see them."""
    return Problem(
        q=random_values(kernel, rng, (*dims.batch, dims.n_q_heads, dims.n_queries,
                                      dims.head_dim), dtype, magnitude),
        k=random_values(kernel, rng, (*dims.batch, dims.n_kv_heads, dims.n_keys,
                                      dims.head_dim), dtype, magnitude),
        v=random_values(kernel, rng, (*dims.batch, dims.n_kv_heads, dims.n_keys,
                                      dims.value_dim), dtype),
        dtype=dtype,
        **fields,
    )


def broadcast_shape_for(data: st.DataObject, full: tuple[int, ...], label: str) -> tuple[int, ...]:
    """A shape that broadcasts to ``full``: leading dims dropped, some dims set to 1."""
    keep = data.draw(st.integers(2, len(full)), label=f"{label} ndim")
    shape = list(full[len(full) - keep:])
    for axis in range(len(shape) - 2):
        if data.draw(st.booleans(), label=f"{label} broadcast axis {axis}"):
            shape[axis] = 1
    return tuple(shape)


def draw_mask(
    data: st.DataObject, rng: np.random.Generator, dims: Dims, *, empty_rows: bool = True,
) -> np.ndarray:
    """Random, windowed or causal-looking masks, often with fully-masked rows."""
    shape = broadcast_shape_for(data, dims.scores_shape, "mask")
    kind = data.draw(st.sampled_from(["random", "window", "causal", "all"]), label="mask kind")
    n_q, n_k = shape[-2], shape[-1]
    rows, cols = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    if kind == "random":
        density = data.draw(st.sampled_from([0.5, 0.8, 0.2]), label="mask density")
        mask = rng.random(shape) < density
    elif kind == "window":
        left, right = data.draw(st.integers(0, 3), label="left"), data.draw(st.integers(0, 3))
        mask = np.broadcast_to((cols >= rows - left) & (cols <= rows + right), shape).copy()
    elif kind == "causal":
        alignment = data.draw(st.sampled_from(["top_left", "bottom_right"]), label="alignment")
        mask = np.broadcast_to(cols <= rows + causal_offset(n_q, n_k, alignment), shape).copy()
    else:
        mask = np.ones(shape, dtype=bool)
    if empty_rows and n_q and data.draw(st.booleans(), label="blank a row"):
        mask[..., data.draw(st.integers(0, n_q - 1), label="blank row"), :] = False
    return mask


def _wanted(data: st.DataObject, choice: str, claimed: bool, label: str) -> bool:
    if not claimed or choice == NEVER:
        return False
    return choice == ALWAYS or data.draw(st.booleans(), label=label)


def draw_problem(
    data: st.DataObject,
    kernel: KernelUnderTest,
    *,
    dtype: str | None = None,
    dims: Dims | None = None,
    mask: str = MAYBE,
    bias: str = MAYBE,
    causal: str = MAYBE,
    scale: str = MAYBE,
    empty_rows: bool = True,
    magnitude: float | None = None,
    **dims_options: Any,
) -> Problem:
    """One problem the kernel claims to handle; ``mask``/``bias``/``causal``/``scale``
    are "maybe", "never" or "always" (always still requires the claim)."""
    decl = kernel.declaration
    dims = dims or draw_dims(data, kernel, **dims_options)
    dtype = dtype or draw_dtype(data, kernel)
    rng = draw_rng(data)
    if magnitude is None:
        magnitude = data.draw(st.sampled_from(MAGNITUDES), label="magnitude")
    problem = random_problem(kernel, rng, dims, dtype, magnitude)
    use_causal = _wanted(data, causal, decl.causal, "causal")
    use_mask = _wanted(data, mask, decl.mask and (decl.mask_and_causal or not use_causal), "mask")
    if use_causal:
        problem.is_causal = True
    if use_mask:
        problem.mask = draw_mask(data, rng, dims, empty_rows=empty_rows)
    if _wanted(data, bias, decl.bias and not (use_causal and decl.bias_shares_mask_argument),
               "bias"):
        shape = broadcast_shape_for(data, dims.scores_shape, "bias")
        problem.bias = random_values(kernel, rng, shape, dtype)
    if _wanted(data, scale, decl.scale, "explicit scale"):
        problem.scale = data.draw(st.sampled_from(EXPLICIT_SCALES), label="scale")
    return problem


def draw_any_problem(data: st.DataObject, kernel: KernelUnderTest) -> Problem:
    """A problem of the kernel's own family: dense (``draw_problem``), sparse (its declared
    pattern, at lengths the pattern allows) or linear (no mask, bias or scale; a seed for
    FAVOR+ kernels), for properties that hold for every attention kernel."""
    declaration = kernel.declaration
    if declaration.sparse is not None:
        from .properties.sparse import draw_sparse_problem

        return draw_sparse_problem(kernel, data)[0]
    if declaration.linear is None:
        return draw_problem(data, kernel)
    problem = draw_problem(data, kernel, mask="never", bias="never", scale="never")
    if declaration.linear.feature_map == "favor+":
        problem.extra[declaration.linear.seed_keyword] = data.draw(st.integers(0, 2**16),
                                                                   label="seed")
    return problem
