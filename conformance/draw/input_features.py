"""What a drawn problem contains that one clause governs: the table of input features.

A kernel that fails one clause fails, as a consequence, every property whose drawn inputs
happen to meet that clause's inputs (mean(V) for a fully masked row breaks permutation,
linearity and accuracy properties alike).  Each :class:`InputFeature` names such inputs,
the clause that governs them and how to tell them in a :class:`~.kernel.Problem`.  The
runner re-runs a failed property with the features of its minimal case that belong to
other failed (or waived) clauses left out of the draws (``SizeLimits.avoid``, honoured by
:mod:`.strategies` and, for problems a property builds itself, by :func:`.kernel.reject_avoided`
on every kernel call); see :mod:`.root_causes`.

The clauses come from the spec (spec/dense.md) and the claims table (conformance/claims/table.py:
the waivers ``empty_rows_zero`` and ``empty_sizes``, the claims ``gqa``, ``mask_and_causal``,
``dtypes``, ``equal_head_dims``): one row per governed input, in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...backends import FLOAT_DTYPE_NAMES
from ...reference.masks import causal_offset

if TYPE_CHECKING:
    from ..call.problem import Problem
    from ..claims.declaration import KernelDeclaration

# A finite bias at least this large in magnitude is a padding fill (-1e4, -1e9, finfo.min,
# values.FILLS): beyond exp's range, so SDPA-7.4 governs it.
LARGE_FINITE_BIAS = 1e4


@dataclass(frozen=True)
class InputFeature:
    """Inputs one clause governs: ``name`` (as ``SizeLimits.avoid`` and reports spell it),
    the governing ``clause``, what it is in words, and whether a problem has it."""

    name: str
    clause: str
    description: str
    present: Callable[[Problem, KernelDeclaration], bool]
    # one of several features that split every input between them (the dtypes): drawn
    # around only where a failure of its clause had it, since every failure has one of them
    # (SDPA-1.3 failing in float16 says nothing about float32 inputs)
    partitions: bool = False


def scores_shape(problem: Problem) -> tuple[int, ...]:
    """(*batch, Hq, Lq, Lk) of ``problem`` (SDPA-1.1, SDPA-1.2)."""
    batch = np.broadcast_shapes(problem.q.shape[:-3], problem.k.shape[:-3], problem.v.shape[:-3])
    return (*batch, problem.q.shape[-3], problem.q.shape[-2], problem.k.shape[-2])


def allowed_keys(problem: Problem, declaration: KernelDeclaration) -> np.ndarray:
    """S(i) as a boolean ``(*batch, Hq, Lq, Lk)`` array: mask, causal rule (in the declared
    alignment) and -inf bias together (SDPA-3.3, SDPA-3.4, SDPA-4.1/4.2)."""
    shape = scores_shape(problem)
    allowed = np.ones(shape, dtype=bool)
    if problem.mask is not None:
        allowed &= np.broadcast_to(problem.mask, shape)
    if problem.bias is not None:
        allowed &= np.broadcast_to(problem.bias != -np.inf, shape)
    if problem.is_causal:
        n_q, n_k = shape[-2], shape[-1]
        offset = causal_offset(n_q, n_k, declaration.causal_alignment)
        allowed &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset
    return allowed


def _fully_masked_row(problem: Problem, declaration: KernelDeclaration) -> bool:
    if problem.k.shape[-2] == 0 or problem.q.shape[-2] == 0:
        return False  # no keys at all is SDPA-5.2, no rows SDPA-1.5
    return bool((~allowed_keys(problem, declaration).any(axis=-1)).any())


def _no_keys(problem: Problem, declaration: KernelDeclaration) -> bool:
    return bool(problem.k.shape[-2] == 0)


def _unequal_head_dims(problem: Problem, declaration: KernelDeclaration) -> bool:
    # a kernel declaring equal_head_dims is called on zero-padded inputs: it never sees one;
    # Ev = 0 is an empty size (SDPA-1.5)
    value_dim = problem.v.shape[-1]
    return not declaration.equal_head_dims and value_dim not in (0, problem.q.shape[-1])


def _degenerate(problem: Problem, declaration: KernelDeclaration) -> bool:
    batch = (*problem.q.shape[:-3], *problem.k.shape[:-3], *problem.v.shape[:-3])
    return problem.q.shape[-2] == 0 or 0 in batch or problem.v.shape[-1] == 0


def _gqa(problem: Problem, declaration: KernelDeclaration) -> bool:
    return bool(problem.q.shape[-3] != problem.k.shape[-3])


def _mask_and_causal(problem: Problem, declaration: KernelDeclaration) -> bool:
    return problem.mask is not None and problem.is_causal


def _large_finite_bias(problem: Problem, declaration: KernelDeclaration) -> bool:
    if problem.bias is None:
        return False
    bias = np.asarray(problem.bias)
    return bool((np.isfinite(bias) & (np.abs(bias) >= LARGE_FINITE_BIAS)).any())


def _in_dtype(dtype: str) -> Callable[[Problem, KernelDeclaration], bool]:
    def present(problem: Problem, declaration: KernelDeclaration) -> bool:
        return problem.dtype == dtype

    return present


FULLY_MASKED_ROW, NO_KEYS, DEGENERATE = "fully-masked-row", "no-keys", "degenerate-size"
GQA, MASK_AND_CAUSAL, LARGE_BIAS = "gqa", "mask-and-causal", "large-finite-bias"
UNEQUAL_HEAD_DIMS = "unequal-head-dims"
# Features a re-run leaves out by changing how the kernel is called, not what is drawn:
# Ev != E is zero-padded away as ``equal_head_dims`` does (the judge pads the call), so
# weights observed through V = I (Ev = Lk) stay drawable
CALLED_AROUND = frozenset({UNEQUAL_HEAD_DIMS})
# Features a re-run leaves out by drawing other sizes (strategies.draw_dims and
# within_limitations); the others are left out by the values, masks and options drawn for
# the same sizes, so a pooled shape drawn before a failure serves the re-run too
DRAWN_AROUND_IN_SIZES = frozenset({GQA, NO_KEYS, DEGENERATE})

FEATURES: tuple[InputFeature, ...] = (
    InputFeature(
        FULLY_MASKED_ROW,
        "SDPA-5.1",
        "a query row with no allowed key (an all-False "
        "mask row, an all -inf bias row, bottom-right causal rows with Lq > Lk)",
        _fully_masked_row,
    ),
    InputFeature(NO_KEYS, "SDPA-5.2", "no keys (Lk = 0)", _no_keys),
    InputFeature(
        UNEQUAL_HEAD_DIMS,
        "SDPA-1.1",
        "a value head dim other than q's and k's (Ev != E); drawn around by zero-padding "
        "the kernel's inputs to E = Ev, as equal_head_dims does",
        _unequal_head_dims,
    ),
    InputFeature(
        DEGENERATE, "SDPA-1.5", "an empty size (Lq = 0, a batch dim of 0, Ev = 0)", _degenerate
    ),
    InputFeature(GQA, "SDPA-6.1", "grouped heads (Hq != Hkv)", _gqa),
    InputFeature(MASK_AND_CAUSAL, "SDPA-3.4", "a mask together with is_causal", _mask_and_causal),
    InputFeature(
        LARGE_BIAS,
        "SDPA-7.4",
        f"a finite bias of magnitude >= {LARGE_FINITE_BIAS:g} "
        "(a padding fill such as -1e9 or finfo.min)",
        _large_finite_bias,
    ),
    # SDPA-1.3: the output has q's dtype, so a kernel that computes or returns float64
    # inputs in float32 fails every float64 accuracy check as a consequence
    *(
        InputFeature(
            f"{dtype}-inputs", "SDPA-1.3", f"{dtype} inputs", _in_dtype(dtype), partitions=True
        )
        for dtype in FLOAT_DTYPE_NAMES
    ),
)
BY_NAME = {feature.name: feature for feature in FEATURES}


def feature(name: str) -> InputFeature:
    """The feature called ``name``; ValueError naming the known ones otherwise."""
    if name not in BY_NAME:
        raise ValueError(f"avoid={name!r}, but should be one of {', '.join(BY_NAME)}")
    return BY_NAME[name]


def avoided_dtype(name: str) -> str | None:
    """The dtype a ``*-inputs`` feature names, None for other features."""
    return name.removesuffix("-inputs") if name.endswith("-inputs") else None


def features_of(problem: Problem | None, declaration: KernelDeclaration | None) -> list[str]:
    """The names of the features ``problem`` has ([] when there is none to look at)."""
    if problem is None or declaration is None:
        return []
    found = []
    for row in FEATURES:
        try:
            if row.present(problem, declaration):
                found.append(row.name)
        except Exception:  # a malformed problem (a shape error): no feature to name
            continue
    return found


def describe(names: Iterable[str]) -> str:
    """``names`` with their clauses, for reports: "fully-masked-row (SDPA-5.1)"."""
    return ", ".join(f"{name} ({BY_NAME[name].clause})" for name in names if name in BY_NAME)
