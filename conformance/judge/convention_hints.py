"""Hints: recognising the common convention mismatches, and the exact flag that fixes each.

A kernel written for another convention fails property after property for one reason: a
(B, L, H, E) layout, FlashAttention's keyword names, a tuple return, a PyTorch-style float
``attn_mask``, a mask whose True means "masked out".  These functions recognise such a
cause, from the kernel's signature before anything runs or by calling it once more on
the failing input, and say in one line what to pass instead.  A hint is advice: the
verdicts stay what the properties found.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..call.problem import Problem
    from .kernel import KernelUnderTest

# keyword names other libraries use for the spec's, and the flag that maps them
KEYWORD_SYNONYMS = {
    "causal": ("is_causal", "--rename is_causal=causal"),
    "softmax_scale": ("scale", "--rename scale=softmax_scale"),
    "sm_scale": ("scale", "--rename scale=sm_scale"),
    "attn_bias": ("bias", "--bias-keyword attn_bias"),
}


def _parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def signature_hints(fn: Callable[..., Any], rename: dict[str, str] | None = None) -> list[str]:
    """Hints read off the kernel's own signature before anything runs: keywords under
    another library's name (FlashAttention's ``causal``/``softmax_scale``, which also
    suggest its (B, L, H, D) layout)."""
    parameters = _parameters(fn)
    if parameters is None:
        return []
    renamed = set((rename or {}).values())
    flags = [
        flag
        for name, (spec_name, flag) in KEYWORD_SYNONYMS.items()
        if name in parameters and spec_name not in parameters and name not in renamed
    ]
    if not flags:
        return []
    names = [
        name
        for name in KEYWORD_SYNONYMS
        if name in parameters
        and name not in renamed
        and KEYWORD_SYNONYMS[name][0] not in parameters
    ]
    hint = (
        f"the kernel takes {', '.join(f'{n}=' for n in names)} (another library's "
        f"name{'s' if len(names) > 1 else ''} for the spec's keywords): pass "
        f"{' '.join(flags)} so the suite checks {'them' if len(names) > 1 else 'it'}"
    )
    if {"causal", "softmax_scale"} & set(names):
        hint += "; FlashAttention-style kernels also take (B, L, H, D) arrays: --layout blhd"
    return [hint]


def class_target_hint(obj: Any, target: str) -> str | None:
    """A one-line error for a class given as the kernel (e.g. a torch ``nn.Module``
    subclass): the suite would construct it with (q, k, v) instead of calling it."""
    if not inspect.isclass(obj):
        return None
    kind = (
        "an nn.Module class"
        if any(base.__module__.startswith("torch.nn") for base in inspect.getmro(obj))
        else "a class"
    )
    if not (
        hasattr(obj, "forward")
        or "__call__" in vars(obj)
        or any("__call__" in vars(base) for base in inspect.getmro(obj)[1:-1])
    ):
        return None
    module, _, name = target.rpartition(":")
    return (
        f"{target!r} is {kind}, not a kernel: calling it with (q, k, v) would construct "
        f"it. Pass an instance: in a file, `from {module.removesuffix('.py')} import "
        f"{name.split('.')[-1]}` and `attention = {name.split('.')[-1]}(...)`, then check "
        f"that_file.py:attention (or pass an instance to assert_conforms)"
    )


def _matches(out: np.ndarray, problem: Problem, kernel: KernelUnderTest) -> bool:
    """The kernel's ``out`` lies within TOL-2 of the definition for ``problem``."""
    from .bounds import reference_bound

    bound = reference_bound(problem, kernel.declaration)
    expected, tolerance = np.asarray(bound.out), np.asarray(bound.out_tolerance)
    if out.shape != expected.shape:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.abs(out - expected) <= tolerance))


def probe_problem(kernel: KernelUnderTest, dtype: str | None = None) -> Problem:
    """A small fixed problem whose sizes all differ (Hq = 2, Lq = 3, Lk = 5, E = 4, Ev = 6),
    so that a convention mismatch cannot hide behind equal sizes; seeded, in the kernel's
    widest dtype unless given."""
    from ..call.problem import Problem
    from ..draw.strategies import with_declared_batch

    dtype = dtype or kernel.widest_dtype
    rng = np.random.default_rng(0)
    q, k, v = (
        with_declared_batch(kernel, kernel.rounded(rng.standard_normal(shape), dtype))
        for shape in ((2, 3, 4), (2, 5, 4), (2, 5, 6))
    )
    return Problem(q=q, k=k, v=v, dtype=dtype)


def _run(kernel: KernelUnderTest, problem: Problem) -> np.ndarray | None:
    """The kernel's output, or None when it raises, returns something unreadable or tries
    to end the process (``sys.exit``: a verdict has already said so)."""
    from .failures import KernelExited

    try:
        return kernel.output(problem)
    except (Exception, KernelExited):
        return None


def mask_convention(
    kernel: KernelUnderTest, problem: Problem, out: np.ndarray
) -> tuple[str, str] | None:
    """(finding, hint) when a kernel's output does not follow a boolean mask (SDPA-3.1) but
    follows another convention exactly: the mask inverted (True = masked out) or the mask
    added to the scores as a float (PyTorch's float ``attn_mask``).

    ``problem`` and ``out`` are the failing case; when it is too small to tell (a row
    with one key has nothing left when inverted), a probe with one allowed key of five
    per row is run instead.
    """
    if problem.mask is None:
        return None
    seen = ""
    if problem.k.shape[-2] < 2:
        seen = " (seen on a probe with Lk = 5 and one allowed key per row)"
        problem = probe_problem(kernel, problem.dtype)
        chosen = np.random.default_rng(1).integers(0, 5, size=(2, 3))
        problem = problem.with_(mask=np.arange(5) == chosen[..., None])
        probe = _run(kernel, problem)
        if probe is None:
            return None
        out = probe
    mask, keyword = problem.required("mask"), kernel.declaration.mask_keyword
    # every row keeps an allowed key once inverted, so SDPA-5.1 plays no part
    if np.all(np.logical_not(mask).any(axis=-1)) and _matches(
        out, problem.with_(mask=np.logical_not(mask)), kernel
    ):
        return (
            'the output follows the mask inverted: the kernel reads True as "masked '
            'out" (the key_padding_mask convention), but True means "may attend"' + seen,
            f"invert the mask before the kernel, e.g. check a wrapper calling "
            f"fn(q, k, v, {keyword}=None if {keyword} is None else ~{keyword}, ...)",
        )
    if _matches(out, problem.with_(mask=None, bias=mask.astype(np.float64)), kernel):
        return (
            "the output is that of the mask added to the scores as a float (True = +1, "
            "False = 0): the kernel takes a PyTorch-style additive float mask, not a "
            "boolean one" + seen,
            f"declare it as an additive bias: --bias-keyword {keyword} --no-mask (the "
            f"suite then passes 0 / -inf float masks in {keyword})",
        )
    return None


def run_hints(
    kernel: KernelUnderTest, layout: str, failures: int, raised: bool = False
) -> list[str]:
    """Hints from probing a kernel that failed ``failures`` properties: when it ``raised``
    in some and is right on a probe with some numbers of leading batch dims and not
    others, say --batch-ndim; when it gets a plain problem (no mask, no causal, default
    scale) wrong but is right once its arrays are read in the (..., L, H, E) layout, say
    --layout blhd.  Otherwise the causes the diagnosis probes establish
    (:func:`.diagnosis.diagnose`), each as one :data:`.diagnosis.CAUSE_LINE` line (they
    travel back from a worker with the hints; :func:`.diagnosis.from_lines` splits them)."""
    if not failures or kernel.declaration.family != "dense":
        return []
    found = _convention_hints(kernel, layout, failures, raised)
    if found:
        return found  # a convention that explains every failure: the probes would too
    from .diagnosis import diagnose, to_line

    return [to_line(cause) for cause in diagnose(kernel)]


def _convention_hints(
    kernel: KernelUnderTest, layout: str, failures: int, raised: bool
) -> list[str]:
    """--batch-ndim and --layout blhd, as :func:`run_hints` says."""
    problem = probe_problem(kernel)
    hints, problem = _batch_ndim_hint(kernel, problem, failures) if raised else ([], problem)
    if layout != "bhld":
        return hints
    out = _run(kernel, problem)
    if out is not None and _matches(out, problem, kernel):
        return hints
    # as layouts.from_blhd would call it, but through the kernel's own (guarded) calls
    swapped = problem.with_(
        **{name: np.swapaxes(getattr(problem, name), -2, -3) for name in ("q", "k", "v")}
    )
    reordered = _run(kernel, swapped)
    if (
        reordered is None
        or reordered.ndim < 3
        or not _matches(np.swapaxes(reordered, -2, -3), problem, kernel)
    ):
        return hints
    return [
        *hints,
        f"the kernel is right on a probe once its q, k, v and output are read as "
        f"(..., L, H, E): it takes the (B, L, H, D) layout of JAX and FlashAttention, "
        f"so pass --layout blhd (the {_failures(failures)} above may all come from this)",
    ]


# Leading batch dims the probe tries on a kernel that declares none (the suite draws 0-2).
PROBED_BATCH_NDIMS = (0, 1, 2)


def _batch_ndim_hint(
    kernel: KernelUnderTest, problem: Problem, failures: int
) -> tuple[list[str], Problem]:
    """--batch-ndim N when a kernel that declares no batch_ndim is right on ``problem`` with
    N leading batch dims (of size 2) and wrong or raising with some other number (a kernel
    written for (B, H, L, E) arrays only, or calling torch.bmm on (B*H, L, E)); with the
    problem to probe further (``problem`` with N batch dims where the hint applies)."""
    if kernel.declaration.batch_ndim is not None:
        return [], problem
    batched = {ndim: _with_batch(problem, (2,) * ndim) for ndim in PROBED_BATCH_NDIMS}
    right = [
        ndim
        for ndim, each in batched.items()
        if (out := _run(kernel, each)) is not None and _matches(out, each, kernel)
    ]
    if not right or len(right) == len(batched):
        return [], problem
    chosen = 1 if 1 in right else right[0]
    wrong = [ndim for ndim in batched if ndim not in right]
    return [
        f"the kernel is right on a probe with {_ndims(right)} and not with "
        f"{_ndims(wrong)} (it raises or differs): if it takes exactly {chosen} "
        f"({_example_shape(chosen)}), pass --batch-ndim {chosen} (the {_failures(failures)} "
        f"above may all come from this)"
    ], batched[chosen]


def _with_batch(problem: Problem, batch: tuple[int, ...]) -> Problem:
    """``problem`` with q, k and v repeated over the leading batch dims ``batch``."""

    def repeated(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(a, (*batch, *a.shape)))

    return problem.with_(q=repeated(problem.q), k=repeated(problem.k), v=repeated(problem.v))


def _ndims(ndims: list[int]) -> str:
    """ "1 leading batch dim", "0 or 2 leading batch dims"."""
    return " or ".join(str(n) for n in ndims) + (
        " leading batch dim" if ndims == [1] else " leading batch dims"
    )


def _example_shape(ndim: int) -> str:
    return (
        "(" + ", ".join([*(f"B{i + 1}" if ndim > 1 else "B" for i in range(ndim)), "H, L, E"]) + ")"
    )


def _failures(failures: int) -> str:
    return f"{failures} failure{'s' if failures > 1 else ''}"
