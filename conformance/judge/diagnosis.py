"""Diagnosis: cheap probes that test the usual root causes of failures directly.

When properties fail, a handful of extra kernel calls, each on a small problem built so
that one defect shows and its look-alikes do not, say *why*: float64 inputs computed in
float32, ``scale=0`` taken as the default, the other causal alignment, masking by a finite
value, a floor weight on excluded keys, a softmax over one key that gives weight 1 whatever
the score, what a row with no allowed key gives, scores that pass through float16, the
batch and head mapping.  Each probe is a function named for what it establishes; it
returns a :class:`~.verdict.Cause` (its explanation, the numbers that established it, and
the exact flag where a declaration would make the kernel pass) or None.  No explanation a
report shows comes from anywhere else: a failure no probe explains is listed as found.

Probes call the kernel through :class:`~.kernel.KernelUnderTest`, so they run wherever
the kernel runs (its worker process, or this one); :func:`diagnose` runs them all and
never raises.  Which failures a cause explains is :func:`explains`, read off a failure's
minimal case (``Verdict.counterexample``) on the report side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .verdict import Cause, Verdict

if TYPE_CHECKING:
    from ..call.problem import Problem
    from .kernel import KernelUnderTest

# A line that carries one established cause among the hint lines a worker returns
# (``run_hints``), so that the worker's protocol needs no new message.
CAUSE_LINE = "cause: "


def to_line(cause: Cause) -> str:
    return CAUSE_LINE + json.dumps(asdict(cause), sort_keys=True)


def from_lines(lines: list[str]) -> tuple[list[str], list[Cause]]:
    """(hints, causes) of the lines ``run_hints`` returned."""
    hints, causes = [], []
    for line in lines:
        if line.startswith(CAUSE_LINE):
            causes.append(Cause(**json.loads(line[len(CAUSE_LINE) :])))
        else:
            hints.append(line)
    return hints, causes


# --- running the kernel on a probe ---------------------------------------------------------


def _output(kernel: KernelUnderTest, problem: Problem) -> np.ndarray | None:
    """The kernel's output as float64, None when it raises or returns something else."""
    from .failures import KernelExited

    try:
        return kernel.output(problem)
    except (Exception, KernelExited):
        return None


def _returned_dtype(kernel: KernelUnderTest, problem: Problem) -> str | None:
    from .failures import KernelExited

    try:
        out = kernel.call_on(problem)[0]
    except (Exception, KernelExited):
        return None
    return str(out.dtype).rsplit(".", 1)[-1]


def _expected(
    kernel: KernelUnderTest, problem: Problem, **declared: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The definition's output for ``problem`` and its TOL-2 bound, under the kernel's
    declaration changed by ``declared`` (another causal alignment)."""
    from .bounds import reference_bound

    declaration = replace(kernel.declaration, **declared) if declared else kernel.declaration
    bound = reference_bound(problem, declaration)
    return np.asarray(bound.out, dtype=np.float64), np.asarray(bound.out_tolerance)


def _within(out: np.ndarray, expected: np.ndarray, tolerance: np.ndarray) -> bool:
    """Within TOL-2, NaN where NaN is expected (TOL-3)."""
    if out.shape != expected.shape:
        return False
    nan = np.isnan(expected)
    with np.errstate(invalid="ignore"):
        close = np.abs(out - expected) <= tolerance
    return bool(np.all(np.where(nan, np.isnan(out), close)))


def _passes(kernel: KernelUnderTest, problem: Problem, out: np.ndarray, **declared: Any) -> bool:
    return _within(out, *_expected(kernel, problem, **declared))


def _off_by(out: np.ndarray, expected: np.ndarray) -> float:
    """The largest difference; NaN on one side only counts as infinite, on both as 0."""
    if not out.size:
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(out - expected)
    both = np.isnan(out) & np.isnan(expected)
    return float(np.max(np.where(both, 0.0, np.where(np.isnan(diff), np.inf, diff))))


def _problem(
    kernel: KernelUnderTest,
    dtype: str,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    **options: object,
) -> Problem:
    """A problem of these (H, L, E) arrays with the batch dims the kernel declares,
    rounded to ``dtype`` (exact values stay exact)."""
    from ..call.problem import Problem
    from ..draw.strategies import with_declared_batch

    q, k, v = (with_declared_batch(kernel, kernel.rounded(a, dtype)) for a in (q, k, v))
    return Problem(q=q, k=k, v=v, dtype=dtype, **options)  # type: ignore[arg-type]


def _normal(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _plain(kernel: KernelUnderTest, dtype: str, **options: object) -> Problem:
    """Hq = Hkv = 2, Lq = 3, Lk = 5, E = 4, Ev = 6: sizes that all differ."""
    return _problem(
        kernel, dtype, _normal(0, 2, 3, 4), _normal(1, 2, 5, 4), _normal(2, 2, 5, 6), **options
    )


def _scores_shape(problem: Problem) -> tuple[int, ...]:
    from ..draw.input_features import scores_shape

    return scores_shape(problem)


# --- the probes -----------------------------------------------------------------------------


def float64_computed_in_float32(kernel: KernelUnderTest) -> Cause | None:
    """Float64 inputs computed (or returned) in float32: the output is outside float64's
    TOL-2 bound and inside float32's for the inputs rounded to float32."""
    if "float64" not in kernel.dtypes:
        return None
    problem = _plain(kernel, "float64")
    out = _output(kernel, problem)
    if out is None or _passes(kernel, problem, out):
        return None
    low = problem.with_(
        q=problem.q.astype(np.float32).astype(np.float64),
        k=problem.k.astype(np.float32).astype(np.float64),
        v=problem.v.astype(np.float32).astype(np.float64),
        dtype="float32",
    )
    if not _passes(kernel, low, out):
        return None
    # the crisp test: the kernel's output on the inputs rounded to float32 is the same to
    # the last bits, although the definition's moves (their float64 bits matter)
    returned = _returned_dtype(kernel, problem)
    out_low = _output(kernel, low.with_(dtype="float64"))
    moved = _off_by(_expected(kernel, problem)[0], _expected(kernel, low.with_(dtype="float64"))[0])
    if out_low is None or (
        returned != "float32" and (moved < 1e-12 or _off_by(out, out_low) > moved / 100)
    ):
        return None  # it sees the float64 bits: another error (an epsilon, an order)
    others = [d for d in kernel.dtypes if d != "float64"]
    expected, tolerance = _expected(kernel, problem)
    how = (
        "returns float32 for float64 inputs"
        if returned == "float32"
        else "computes float64 inputs in float32"
    )
    return Cause(
        name="float64-in-float32",
        clause="SDPA-1.3" if returned == "float32" else "SDPA-7.3",
        explanation=f"the kernel {how}: float64 inputs get float32 accuracy",
        evidence=(
            f"on a float64 probe (Lq=3, Lk=5, E=4) the output is off by "
            f"{_off_by(out, expected):.2e} (float64 TOL-2 allows {float(np.max(tolerance)):.1e}) "
            f"and within float32's TOL-2 bound of the inputs rounded to float32; on those "
            f"rounded inputs its output is the same (to {_off_by(out, out_low):.0e}), where the "
            f"definition's moves by {moved:.0e}"
            + (f"; its output dtype is {returned}" if returned else "")
        ),
        hint=(
            f"if it supports only lower precisions, declare them: --dtype {','.join(others)} "
            f"(dtypes={tuple(others)!r}); otherwise compute float64 "
            "inputs in float64"
            if others
            else "compute float64 inputs in float64"
        ),
    )


def scale_zero_taken_as_default(kernel: KernelUnderTest) -> Cause | None:
    """An explicit ``scale=0`` computed as the default 1/sqrt(E) (``scale or default``):
    the output is the default-scale one, not mean(V)."""
    if not kernel.declaration.scale:
        return None
    problem = _plain(kernel, kernel.widest_dtype, scale=0.0)
    out = _output(kernel, problem)
    if out is None or _passes(kernel, problem, out):
        return None
    if not _passes(kernel, problem.with_(scale=None), out):
        return None
    half = problem.with_(scale=0.3)  # not the default of E = 4, 0.5
    out_half = _output(kernel, half)
    if out_half is not None and not _passes(kernel, half, out_half):
        if _passes(kernel, half.with_(scale=None), out_half):
            return Cause(
                name="explicit-scale-ignored",
                clause="SDPA-2.2",
                explanation="the kernel ignores an explicit scale and uses the default",
                evidence="with scale=0.0 and scale=0.3 its output is the default scale's",
                hint="pass scale= through to the computation; if the kernel takes no "
                "scale, declare --no-scale",
            )
        return None
    return Cause(
        name="scale-zero-is-default",
        clause="SDPA-2.2",
        explanation=(
            "the kernel takes an explicit scale=0 as 'use the default' (e.g. `scale or "
            "1/sqrt(E)`): scale=0 must give uniform weights over the allowed keys"
        ),
        evidence="with scale=0.0 its output equals the definition's with the default scale",
        hint="test `scale is None`, not `not scale`, for the default (no flag changes it)",
    )


def causal_scale_zero_nan(kernel: KernelUnderTest) -> Cause | None:
    """``is_causal`` with ``scale=0`` giving NaN in the rows that exclude a key, where the
    definition gives uniform weights over the allowed keys (SDPA-2.2 allows scale 0), while
    the same call without ``is_causal``, and with scale 0.3, is right: the causal exclusion
    does not survive a zero scale."""
    if not (kernel.declaration.causal and kernel.declaration.scale):
        return None
    # E = Ev = 4 and a batch dim: a dispatcher may take its fused path only then
    # (PyTorch's takes its CPU flash path for 4-d inputs with E = Ev)
    batch = (1,) if kernel.declaration.batch_ndim is None else ()
    problem = _problem(
        kernel,
        kernel.widest_dtype,
        *(_normal(seed, *batch, 2, length, 4) for seed, length in ((0, 3), (1, 5), (2, 5))),
        is_causal=True,
        scale=0.0,
    )
    out = _output(kernel, problem)
    expected, _ = _expected(kernel, problem)
    if out is None or out.shape != expected.shape:
        return None
    broken = np.isnan(out) & ~np.isnan(expected)
    if not broken.any():
        return None
    for other in (problem.with_(is_causal=False), problem.with_(scale=0.3)):
        out_other = _output(kernel, other)
        if out_other is None or not _passes(kernel, other, out_other):
            return None  # wrong there too: another cause
    rows = int(np.any(broken, axis=-1).sum())
    return Cause(
        name="causal-scale-zero-nan",
        clause="SDPA-2.2",
        explanation=(
            "with is_causal and scale=0 the kernel gives NaN in the rows that exclude a key, "
            "where the definition gives uniform weights over the allowed keys; without "
            "is_causal, or with another scale, it is right (as when the -inf of an excluded "
            "key is multiplied by the scale: -inf x 0 = NaN)"
        ),
        evidence=(
            f"on a causal probe with Lq=3, Lk=5, E=Ev=4 and scale=0.0, {rows} of "
            f"{int(np.prod(out.shape[:-1]))} output rows are NaN; the same call without "
            "is_causal, and with scale=0.3, is within TOL-2"
        ),
        hint="exclude the keys after scaling (a scale of 0 or below is a valid scale, "
        "SDPA-2.2); no flag",
    )


def default_scale_other(kernel: KernelUnderTest) -> Cause | None:
    """A default scale other than 1/sqrt(E): with scale=None the output is the
    definition's with 1/E, 1/sqrt(Ev) or 1 (no scaling)."""
    problem = _plain(kernel, kernel.widest_dtype)
    out = _output(kernel, problem)
    if out is None or _passes(kernel, problem, out):
        return None
    if kernel.declaration.scale:  # the explicit scale must be right: only the default wrong
        explicit = problem.with_(scale=0.3)
        out_explicit = _output(kernel, explicit)
        if out_explicit is None or not _passes(kernel, explicit, out_explicit):
            return None
    head_dim, value_dim = problem.q.shape[-1], problem.v.shape[-1]
    for words, scale in (
        ("1/E", 1.0 / head_dim),
        ("1/sqrt(Ev), the value head dim", 1.0 / np.sqrt(value_dim)),
        ("1 (no scaling)", 1.0),
    ):
        if _passes(kernel, problem.with_(scale=float(scale)), out):
            return Cause(
                name="default-scale-other",
                clause="SDPA-2.1",
                explanation=f"the kernel's default scale is {words}, not 1/sqrt(E)",
                evidence=(
                    f"with scale=None (E={head_dim}, Ev={value_dim}) its output equals the "
                    f"definition's with scale={float(scale):.4g}"
                ),
                hint=(
                    "no flag declares another default (SDPA-2.1 fixes it): check a wrapper "
                    "that passes scale=1/sqrt(E) when scale is None"
                ),
            )
    return None


def causal_alignment_reversed(kernel: KernelUnderTest) -> Cause | None:
    """``is_causal`` in the other alignment than the declared one: with Lq < Lk the output
    is the definition's under the other alignment, not the declared one."""
    if not kernel.declaration.causal:
        return None
    problem = _plain(kernel, kernel.widest_dtype, is_causal=True)
    out = _output(kernel, problem)
    declared = kernel.declaration.causal_alignment
    other = "bottom_right" if declared == "top_left" else "top_left"
    if out is None or _passes(kernel, problem, out):
        return None
    if not _passes(kernel, problem, out, causal_alignment=other):
        return None
    return Cause(
        name="causal-alignment-reversed",
        clause="SDPA-4.2" if declared == "bottom_right" else "SDPA-4.1",
        explanation=(
            f"the kernel is declared {_words(declared)} causal but computes "
            f"{_words(other)} causal when Lq != Lk"
        ),
        evidence=(
            f"on a causal probe with Lq=3, Lk=5 its output is the definition's with "
            f"{_words(other)} alignment"
        ),
        hint=f"if it means {_words(other)}, declare it: --causal-alignment {other}",
    )


def _words(alignment: str) -> str:
    return alignment.replace("_", "-")


def _one_row_empty(kernel: KernelUnderTest, dtype: str) -> Problem | None:
    """A probe whose query 0 may attend no key (by the mask; else by a -inf bias), the
    other rows every key; None when the kernel takes neither."""
    problem = _plain(kernel, dtype)
    shape = _scores_shape(problem)
    if kernel.declaration.mask:
        mask = np.ones(shape, dtype=bool)
        mask[..., 0, :] = False
        return problem.with_(mask=mask)
    if kernel.declaration.bias:
        bias = np.zeros(shape)
        bias[..., 0, :] = -np.inf
        return problem.with_(bias=bias)
    return None


def empty_row_output(kernel: KernelUnderTest) -> Cause | None:
    """What a row with no allowed key gives instead of 0 (SDPA-5.1): NaN (a softmax over
    -inf scores), mean(V) (excluded scores replaced by a finite value: uniform weights),
    the unmasked softmax (a finite value added to the scores), or one key's value."""
    if not kernel.declaration.empty_rows_zero:
        return None  # declared: SDPA-5.1 is waived (CONF-7)
    problem = _one_row_empty(kernel, kernel.widest_dtype)
    if problem is None:
        return None
    out = _output(kernel, problem)
    if out is None:
        return None
    row = out[..., 0, :]
    if np.all(row == 0):
        return None
    v = np.broadcast_to(problem.v, (*out.shape[:-2], problem.v.shape[-2], out.shape[-1]))
    unmasked, _ = _expected(kernel, problem.with_(mask=None, bias=None))
    tolerance = 1e-3 * max(1.0, float(np.nanmax(np.abs(v))))
    declare = (
        "if the kernel leaves such rows to the caller, declare it: --no-empty-rows-zero "
        "(empty_rows_zero=False; the claim then names SDPA-5.1 as waived, CONF-7)"
    )
    if np.all(np.isnan(row)):
        what, name = "NaN (a softmax over scores that are all -inf: 0/0)", "empty-row-nan"
    elif np.allclose(row, v.mean(axis=-2), atol=tolerance, rtol=0):
        filled = _excluded_keys_kept(kernel)
        if filled:
            return Cause(
                name="excluded-keys-filled-finite",
                clause="SDPA-5.1",
                explanation=(
                    "the kernel replaces excluded scores by a finite value (such as -1e9 or "
                    "-0.7 finfo.max) instead of excluding the keys: a row with no allowed key "
                    "gets uniform weights, mean(V), and excluded keys stay in the softmax "
                    "and in P @ V (" + "; ".join(filled) + ")"
                ),
                evidence=(
                    "on a probe whose query 0 has every key excluded, row 0 of the output "
                    f"is mean(V) ({np.array2string(row.reshape(-1)[:4], precision=3)}...); "
                    + "; ".join(f"with key 0 excluded, {e}" for e in filled.values())
                ),
                hint=(
                    "exclude masked keys (-inf scores, 0 for a row with none allowed); "
                    "--no-empty-rows-zero waives only the empty rows (SDPA-5.1, CONF-7), not "
                    "what the excluded keys do to the other rows"
                ),
            )
        what = (
            "mean(V): uniform weights over every key, as when excluded scores are replaced "
            "by a finite value (-1e9, finfo.min) rather than excluded"
        )
        name = "empty-row-mean-v"
    elif np.allclose(row, unmasked[..., 0, :], atol=tolerance, rtol=0):
        return None  # the mask added as a finite value: masks_by_adding_finite_value's
    else:
        single = [
            j for j in range(v.shape[-2]) if np.allclose(row, v[..., j, :], atol=tolerance, rtol=0)
        ]
        if not single:
            return None
        what = f"the value of a single key (key {single[0]}: weight 1 on one excluded key)"
        name = "empty-row-single-key"
    return Cause(
        name=name,
        clause="SDPA-5.1",
        explanation=f"a query row that may attend no key outputs {what}, not 0",
        evidence=(
            "on a probe whose query 0 has every key excluded "
            f"({'by the mask' if problem.mask is not None else 'by a -inf bias'}), "
            f"row 0 of the output is {np.array2string(row.reshape(-1)[:4], precision=3)}..."
        ),
        hint=declare,
    )


def _excluded_keys_kept(kernel: KernelUnderTest) -> dict[str, str]:
    """What shows that excluded keys keep a finite score (a fill) rather than leaving the
    softmax, on probes with key 0 excluded from every row (by the mask, else a -inf bias):
    {what it does to the other rows: the evidence}; empty when nothing shows.

    * every allowed score far below any finite fill but finfo.min (-1e12 in float64, -1e10
      in float32; equal, so the definition is the mean of their values): the excluded key
      takes the whole weight, its value comes out (an additive fill would leave key 0's
      score lower still: its own score is twice as low);
    * a NaN in key 0's value: it reaches the output (weight 0 times NaN).
    """
    dtype = "float64" if "float64" in kernel.dtypes else kernel.widest_dtype
    shown: dict[str, str] = {}
    excluded = _one_key_excluded(kernel, _plain(kernel, dtype))
    if excluded is None:
        return shown
    if dtype in ("float32", "float64"):
        big = 1e12 if dtype == "float64" else 1e10
        k = np.full((2, 5, 4), -big / 2)  # scores 4 * (-big / 2) / 2 = -big
        k[:, 0, :] = -big  # key 0's own score, -2 big: below the allowed ones
        low = _one_key_excluded(
            kernel, _problem(kernel, dtype, np.ones((2, 3, 4)), k, _normal(2, 2, 5, 6))
        )
        out = None if low is None else _output(kernel, low)
        if low is not None and out is not None:
            v = np.broadcast_to(low.v, (*out.shape[:-2], low.v.shape[-2], out.shape[-1]))
            scale = max(1.0, float(np.max(np.abs(v))))
            if np.allclose(out, v[..., 0:1, :], atol=1e-3 * scale, rtol=0) and not np.allclose(
                out, v[..., 1:, :].mean(axis=-2, keepdims=True), atol=1e-3 * scale, rtol=0
            ):
                shown["an excluded key outranks allowed ones whose scores are lower"] = (
                    f"allowed scores of {-2 * big / 2:.0e} give key 0's value"
                )
    v = excluded.v.copy()
    v[..., 0, :] = np.nan
    out = _output(kernel, excluded.with_(v=v))
    if out is not None and np.any(np.isnan(out)):
        shown["NaN in an excluded value leaks into the output"] = (
            "a NaN in its value reaches the output"
        )
    return shown


def _one_key_excluded(kernel: KernelUnderTest, problem: Problem) -> Problem | None:
    """``problem`` with key 0 excluded from every row (by the mask; else by a -inf bias);
    None when the kernel takes neither."""
    shape = _scores_shape(problem)
    if kernel.declaration.mask:
        mask = np.ones(shape, dtype=bool)
        mask[..., 0] = False
        return problem.with_(mask=mask)
    if kernel.declaration.bias:
        bias = np.zeros(shape)
        bias[..., 0] = -np.inf
        return problem.with_(bias=bias)
    return None


def masks_by_adding_finite_value(kernel: KernelUnderTest) -> Cause | None:
    """The mask applied by adding a finite value (-1e4, -1e9) to the scores instead of
    excluding the key: an excluded key whose score exceeds that value takes the weight."""
    if not kernel.declaration.mask:
        return None
    q = np.ones((2, 3, 4))
    k = _normal(1, 2, 5, 4)
    dtype = "float64" if "float64" in kernel.dtypes else kernel.widest_dtype
    plain = _problem(kernel, dtype, q, k, _normal(2, 2, 5, 6))
    mask = np.ones(_scores_shape(plain), dtype=bool)
    mask[..., 0] = False
    plain = plain.with_(mask=mask)
    out = _output(kernel, plain)
    if out is None or not _passes(kernel, plain, out):
        return None  # wrong with ordinary scores: the mask is read otherwise (mask_sense)
    # q . k_0 * scale = 2e12 (2e6 in float32): beyond any finite fill but finfo.min
    k[:, 0, :] = 1e12 if dtype == "float64" else 1e6
    problem = _problem(kernel, dtype, q, k, _normal(2, 2, 5, 6)).with_(mask=mask)
    out = _output(kernel, problem)
    if out is None or _passes(kernel, problem, out):
        return None
    v0 = np.broadcast_to(problem.v[..., 0:1, :], out.shape)
    if not np.allclose(out, v0, atol=1e-3 * float(np.max(np.abs(problem.v))), rtol=0):
        return None
    score = float(np.abs(k[0, 0, 0]) * 4 * 0.5)
    return Cause(
        name="mask-added-as-finite-value",
        clause="SDPA-3.1",
        explanation=(
            "the kernel masks by adding a finite value (such as -1e4 or -1e9) to the scores "
            "instead of excluding the key: an excluded key whose score is larger still "
            "takes the weight, and a row with no allowed key gets the unmasked softmax"
        ),
        evidence=(
            f"on a probe with key 0 excluded from every row the output is right while key "
            f"0's score is ordinary, and is key 0's value once that score is {score:.0e}"
        ),
        hint="exclude masked keys (e.g. scores set to -inf, with 0 for empty rows); no flag",
    )


def floor_weight_on_excluded_keys(kernel: KernelUnderTest) -> Cause | None:
    """Excluded keys keep a tiny weight (a small finite fill such as -60, or a clamp): with
    a huge value on an excluded key, the output moves by weight x value, in proportion."""
    if not kernel.declaration.mask:
        return None
    dtype = "float64" if "float64" in kernel.dtypes else kernel.widest_dtype
    base = _plain(kernel, dtype)
    mask = np.ones(_scores_shape(base), dtype=bool)
    mask[..., 0] = False
    reference, tolerance = _expected(kernel, base.with_(mask=mask))
    weights = []
    for big in (1e30, 1e20) if dtype == "float64" else (1e30, 1e25):
        v = base.v.copy()
        v[..., 0, :] = big
        out = _output(kernel, base.with_(v=v, mask=mask))
        if out is None or not np.all(np.isfinite(out)):
            return None
        moved = _off_by(out, reference)
        if moved <= float(np.max(tolerance)):
            return None  # the excluded value did not reach the output
        weights.append(moved / big)
    if not all(0 < w < 1e-6 for w in weights):
        return None
    if not 0.1 < weights[0] / weights[1] < 10:
        return None  # not a weight times the value
    return Cause(
        name="floor-weight-on-excluded-keys",
        clause="SDPA-8.1",
        explanation=(
            f"excluded keys keep a tiny weight (about {weights[0]:.1e}) instead of 0: harmless "
            "unless an excluded key's value is huge or not finite"
        ),
        evidence=(
            "on a probe with key 0 excluded, setting its value to 1e30 and then 1e20 moves "
            f"the output by {weights[0]:.1e} and {weights[1]:.1e} times that value"
        ),
        hint="exclude masked keys exactly (weight 0), not with a small fill; no flag",
    )


def single_key_softmax_weight_one(kernel: KernelUnderTest) -> Cause | None:
    """A softmax over one key taken as weight 1 whatever the score: with Lk = 1 and a NaN
    query the output is that key's value, where NaN must propagate (SDPA-8.3)."""
    dtype = kernel.widest_dtype
    q = _normal(0, 2, 3, 4)
    q[:, 0, 0] = np.nan
    problem = _problem(kernel, dtype, q, _normal(1, 2, 1, 4), _normal(2, 2, 1, 6))
    out = _output(kernel, problem)
    if out is None or not np.all(np.isfinite(out[..., 0, :])):
        return None
    v0 = np.broadcast_to(problem.v[..., 0:1, :], out.shape)
    if not np.allclose(out[..., 0, :], v0[..., 0, :], atol=1e-6, rtol=1e-3):
        return None
    two = _problem(kernel, dtype, q, _normal(1, 2, 2, 4), _normal(2, 2, 2, 6))
    out_two = _output(kernel, two)
    if out_two is None or not np.all(np.isnan(out_two[..., 0, :])):
        return None  # NaN does not propagate with two keys either: the inputs are cleaned
    return Cause(
        name="single-key-weight-one",
        clause="SDPA-8.3",
        explanation=(
            "over a single key the kernel gives weight 1 whatever the score (NaN or -inf): "
            "the softmax over one key is short-cut to 1"
        ),
        evidence=(
            "on a probe with Lk=1 and a NaN in query 0, row 0 of the output is key 0's value, "
            "not NaN; with Lk=2 the same query gives NaN"
        ),
        hint="compute the softmax over one key like any other (no flag)",
    )


def _float16_score_probe(kernel: KernelUnderTest, q: np.ndarray, k: np.ndarray) -> Problem:
    return _problem(kernel, "float16", q, k, _normal(2, 1, k.shape[-2], 4).clip(-2, 2))


def _emulated_float16_scores(problem: Problem) -> np.ndarray:
    """The output with scores computed exactly, rounded to float16, then a float64
    softmax and P @ V: what a kernel that casts its scores to float16 gives."""
    s = np.matmul(problem.q, np.swapaxes(problem.k, -1, -2)) / np.sqrt(problem.q.shape[-1])
    s = s.astype(np.float16).astype(np.float64)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    out: np.ndarray = np.matmul(p / p.sum(axis=-1, keepdims=True), problem.v)
    return out


def scores_in_float16(kernel: KernelUnderTest) -> Cause | None:
    """Scores that pass through float16 for float16 inputs.  Two probes tell how:

    * q . k = 2048 + d (d = 1..5) is exact in float32 but not in float16, whose partial
      sums 512, 1024, 1536 are exact: the output follows the scores rounded to float16;
    * q . k = 2048 + 1 - 2048 = 1 has a partial sum 2049 that float16 cannot hold: a kernel
      that accumulates q . k in float16 gets 0 there, one that rounds only the finished
      scores gets 1.
    """
    if "float16" not in kernel.dtypes:
        return None
    q = np.ones((1, 2, 4))
    k = np.full((1, 5, 4), 512.0)
    k[0, :, 3] += np.arange(1, 6)
    rounded = _float16_score_probe(kernel, q, k)
    out = _output(kernel, rounded)
    if out is None:
        return None
    exact, tolerance = _expected(kernel, rounded)
    emulated = _emulated_float16_scores(rounded)
    step = float(np.max(np.abs(exact - emulated)))
    if step < 1e-2 or _off_by(out, emulated) > step / 4:
        return None  # the scores are not rounded to float16 (or not only)
    # q . k = a + 1 - a: exact 1 in float32, 0 when accumulated in float16
    q2 = np.zeros((1, 2, 4))
    q2[0, :, :3] = (2048.0, 1.0, 2048.0)
    k2 = np.zeros((1, 5, 4))
    k2[0, 0, :3] = (1.0, 1.0, -1.0)
    cancel = _float16_score_probe(kernel, q2, k2)
    out2 = _output(kernel, cancel)
    if out2 is None:
        return None
    exact2, _ = _expected(kernel, cancel)
    flat = cancel.with_(q=np.zeros_like(cancel.q))
    uniform, _ = _expected(kernel, flat)
    accumulated = _off_by(out2, uniform) < _off_by(out2, exact2) / 4
    how = (
        "computes its scores in float16 (q . k accumulated in float16)"
        if accumulated
        else "computes its scores in float32 but rounds them to float16 before the softmax"
    )
    return Cause(
        name="scores-accumulated-in-float16" if accumulated else "scores-rounded-to-float16",
        clause="SDPA-7.2",
        explanation=f"for float16 inputs the kernel {how}",
        evidence=(
            "on a float16 probe whose scores 1024.5 ... 1026.5 are exact in float32, the "
            "output is that of the scores rounded to float16 (the exact scores' output is "
            f"{step:.2e} away, TOL-2 allows {float(np.max(tolerance)):.1e}); "
            + (
                "with q . k = 2048 + 1 - 2048 it sees a score of 0, not 1"
                if accumulated
                else "with q . k = 2048 + 1 - 2048 it sees the score 1 exactly"
            )
        ),
        hint="keep the scores in float32 through the softmax (SDPA-7.2); no flag",
    )


def bias_added_in_float16(kernel: KernelUnderTest) -> Cause | None:
    """A bias added to the scores in float16: with a -65504 padding bias on every key of a
    row, the sums step by 32 there, so scores 0 ... 4 apart all round to -65504 and the
    row's weights become uniform (its output mean(V)), where the definition's softmax is
    that of the scores alone (a per-row constant does not change it)."""
    if "float16" not in kernel.dtypes or not kernel.declaration.bias:
        return None
    q = np.zeros((1, 2, 4))
    q[0, :, 0] = 1.0
    k = np.zeros((1, 5, 4))
    k[0, :, 0] = 2.0 * np.arange(5)  # scaled scores 0, 1, 2, 3, 4 (scale 1/2)
    problem = _problem(kernel, "float16", q, k, _normal(2, 1, 5, 4).clip(-2, 2))
    bias = np.zeros(_scores_shape(problem))
    bias[..., 0, :] = -65504.0
    problem = problem.with_(bias=bias)
    out = _output(kernel, problem)
    if out is None or _passes(kernel, problem, out):
        return None
    mean = np.broadcast_to(problem.v.mean(axis=-2), out[..., 0, :].shape)
    if not np.allclose(out[..., 0, :], mean, atol=4e-3, rtol=0):
        return None
    # float16's own: the same bias in float32 (exact there) gives the softmax of the scores
    # (a kernel that caps its scores, tanh, collapses the row in every dtype)
    wide = next((d for d in ("float32", "float64") if d in kernel.dtypes), None)
    if wide is None:
        return None  # no wider dtype to tell it from a dtype-blind collapse
    wide_problem = problem.with_(dtype=wide)
    out_wide = _output(kernel, wide_problem)
    if out_wide is None or not _passes(kernel, wide_problem, out_wide):
        return None
    return Cause(
        name="bias-added-in-float16",
        clause="SDPA-3.2",
        explanation=(
            "for float16 inputs the kernel adds the bias to the scores in float16: near a "
            "-65504 padding bias the sums round in steps of 32 (and past -65520 to -inf), so "
            "a padded row's weights collapse to uniform, mean(V)"
        ),
        evidence=(
            "on a float16 probe whose row 0 has the bias -65504 on every key and scores 0 ... "
            "4, row 0 of the output is mean(V), where the definition gives the softmax of the "
            f"scores (a per-row constant changes nothing); in {wide} it is right"
        ),
        hint="add the bias in float32 (SDPA-7.2); no flag",
    )


def batch_or_head_mapping(kernel: KernelUnderTest) -> Cause | None:
    """Query (batch, head) pairs reading another pair's keys and values: each output
    slice is matched against the definition with every (batch, head) of K and V; with
    GQA (declared), query head h reading head h mod Hkv is the interleaved mapping."""
    from ..call.problem import Problem

    if kernel.declaration.batch_ndim not in (None, 1):
        return None
    dtype = kernel.widest_dtype
    gqa = kernel.declaration.gqa
    n_q_heads, n_kv_heads = (4, 2) if gqa else (2, 2)
    q = _normal(0, 2, n_q_heads, 3, 4)
    k, v = _normal(1, 2, n_kv_heads, 5, 4), _normal(2, 2, n_kv_heads, 5, 6)
    q, k, v = (kernel.rounded(a, dtype) for a in (q, k, v))
    problem = Problem(q=q, k=k, v=v, dtype=dtype)
    out = _output(kernel, problem)
    if out is None or out.shape != (2, n_q_heads, 3, 6) or _passes(kernel, problem, out):
        return None
    group = n_q_heads // n_kv_heads
    moved: dict[tuple[int, int], tuple[int, int]] = {}
    for b in range(2):
        for h in range(n_q_heads):
            for b2 in range(2):
                for h2 in range(n_kv_heads):
                    one = Problem(
                        q=q[b, h : h + 1], k=k[b2, h2 : h2 + 1], v=v[b2, h2 : h2 + 1], dtype=dtype
                    )
                    if _passes(kernel, one, out[b, h : h + 1]):
                        moved[(b, h)] = (b2, h2)
    if len(moved) != 2 * n_q_heads:
        return None
    wrong = {key: src for key, src in moved.items() if src != (key[0], key[1] // group)}
    if not wrong:
        return None
    if gqa and all(src == (b, h % n_kv_heads) for (b, h), src in moved.items()):
        return Cause(
            name="gqa-interleaved-heads",
            clause="SDPA-6.1",
            explanation=(
                "query head h reads key/value head h mod Hkv (interleaved, `tile`), not "
                "h // (Hq/Hkv) (contiguous groups, `repeat_interleave`)"
            ),
            evidence=(
                f"on a probe with Hq={n_q_heads}, Hkv={n_kv_heads}, every output head matches "
                "the definition with key/value head h mod Hkv"
            ),
            hint=(
                "no flag declares the interleaved mapping (SDPA-6.1 fixes contiguous "
                "groups): check a wrapper that expands K and V with repeat_interleave"
            ),
        )
    (b, h), (b2, h2) = next(iter(wrong.items()))
    return Cause(
        name="batch-head-mixed",
        clause="SDPA-1.1" if b == b2 else "SDPA-1.2",
        explanation=(
            "query (batch, head) pairs read the keys and values of other pairs: the batch "
            "and head axes are mixed up"
        ),
        evidence=(
            f"on a probe with B=2, Hq={n_q_heads}, Hkv={n_kv_heads}, output (batch {b}, head "
            f"{h}) is the definition's for keys and values of (batch {b2}, head {h2}); "
            f"{len(wrong)} of {len(moved)} slices are moved so"
        ),
        hint=(
            "if the kernel takes (B, L, H, E) arrays, pass --layout blhd; otherwise its "
            "(batch, head) flattening differs between q and k/v"
        ),
    )


def mask_sense(kernel: KernelUnderTest) -> Cause | None:
    """The boolean mask read inverted (True = masked out, the key_padding_mask convention)
    or added to the scores as a float (PyTorch's float ``attn_mask``): the output is the
    definition's under that reading, on a random mask where every row keeps a key either
    way."""
    if not kernel.declaration.mask:
        return None
    problem = _plain(kernel, kernel.widest_dtype)
    shape = _scores_shape(problem)
    allowed = np.random.default_rng(2).random(shape) < 0.5
    allowed[..., 0] = True  # every row keeps key 0, and loses key 1 once inverted
    allowed[..., 1] = False
    problem = problem.with_(mask=allowed)
    out = _output(kernel, problem)
    if out is None or _passes(kernel, problem, out):
        return None
    keyword = kernel.declaration.mask_keyword
    if _passes(kernel, problem.with_(mask=~allowed), out):
        return Cause(
            name="mask-inverted",
            clause="SDPA-3.1",
            explanation=(
                'the kernel reads the mask inverted: True as "masked out" (the '
                'key_padding_mask convention), where True means "may attend"'
            ),
            evidence="on a probe with a random mask, the output is the definition's with "
            "the mask inverted",
            hint=(
                f"invert the mask before the kernel: check a wrapper calling fn(q, k, v, "
                f"{keyword}=None if {keyword} is None else ~{keyword}, ...) (no flag)"
            ),
        )
    if _passes(kernel, problem.with_(mask=None, bias=allowed.astype(np.float64)), out):
        return Cause(
            name="mask-is-additive-float",
            clause="SDPA-3.1",
            explanation=(
                "the kernel adds the mask to the scores as a float (True = +1, False = 0): "
                "it takes a PyTorch-style additive float mask, not a boolean one"
            ),
            evidence="on a probe with a random mask, the output is the definition's with "
            "the mask added to the scores as 0/1",
            hint=(
                f"declare it as an additive bias: --bias-keyword {keyword} --no-mask (the "
                f"suite then passes 0 / -inf float masks in {keyword})"
            ),
        )
    return None


# The probes in the order a failure is matched against their causes: the most specific
# inputs first (one key, scale=0, a causal call with Lq != Lk, an empty row), the broadest
# (any float64 input, any input at all) last.
PROBES: tuple[Callable[[KernelUnderTest], Cause | None], ...] = (
    single_key_softmax_weight_one,
    scale_zero_taken_as_default,
    causal_scale_zero_nan,
    causal_alignment_reversed,
    empty_row_output,
    masks_by_adding_finite_value,
    floor_weight_on_excluded_keys,
    mask_sense,
    batch_or_head_mapping,
    scores_in_float16,
    bias_added_in_float16,
    float64_computed_in_float32,
    default_scale_other,
)


def diagnose(kernel: KernelUnderTest) -> list[Cause]:
    """The causes the probes establish for ``kernel`` (dense kernels only), in the order
    of :data:`PROBES`; a probe that breaks establishes nothing."""
    if kernel.declaration.family != "dense":
        return []
    found = []
    for probe in PROBES:
        try:
            cause = probe(kernel)
        except Exception:  # a probe the kernel's conventions make impossible
            cause = None
        if cause is not None:
            found.append(cause)
    return _float16_bias_folded(found)


def _float16_bias_folded(found: list[Cause]) -> list[Cause]:
    """``found`` with a float16 bias folded into float16 scores: scores kept in float16
    round a -65504 padding bias's sums in steps of 32 wherever the bias is added, so the
    bias probe sees the same root cause (torch's MultiheadAttention with need_weights);
    its evidence joins the scores' cause."""
    names = [cause.name for cause in found]
    scores = next((n for n in names if n.startswith("scores-") and n.endswith("float16")), None)
    if scores is None or "bias-added-in-float16" not in names:
        return found
    bias = found[names.index("bias-added-in-float16")]
    return [
        replace(cause, evidence=f"{cause.evidence}; and {bias.evidence}")
        if cause.name == scores
        else cause
        for cause in found
        if cause is not bias
    ]


# --- which failures a cause explains -------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """What a failure's minimal case (``Problem.describe``) shows of its inputs."""

    q: tuple[int, ...]
    k: tuple[int, ...]
    dtype: str
    is_causal: bool
    scale: str
    masked: bool  # a mask with a False entry
    bias: bool


def case_of(counterexample: str) -> Case | None:
    """The :class:`Case` of a ``Problem.describe()`` text, None when it is none."""
    shapes = dict(re.findall(r"\b([qk])\(([\d, ]*)\)", counterexample))
    dtype = re.search(r"dtype=(\w+)", counterexample)
    if "q" not in shapes or "k" not in shapes or dtype is None:
        return None
    mask = re.search(r"mask\([\d, ]*\) \((\d+)/(\d+) True\)", counterexample)
    scale = re.search(r"scale=([^,]+)", counterexample)

    def shape(text: str) -> tuple[int, ...]:
        return tuple(int(n) for n in text.replace(",", " ").split())

    return Case(
        q=shape(shapes["q"]),
        k=shape(shapes["k"]),
        dtype=dtype.group(1),
        is_causal="is_causal=True" in counterexample,
        scale=scale.group(1).strip() if scale else "None",
        masked=bool(mask and mask.group(1) != mask.group(2)),
        bias=bool(re.search(r"\bbias\(", counterexample)),
    )


def _at_most_zero(scale: str) -> bool:
    """Whether a minimal case's ``scale=`` text is a number <= 0 (not None)."""
    try:
        return float(scale) <= 0
    except ValueError:
        return False


def _excludes(case: Case) -> bool:
    return case.masked or case.bias or (case.is_causal and case.k[-2] > 1)


# What inputs each cause acts on: a failure whose minimal case has them is explained by it.
_ACTS_ON: dict[str, Callable[[Case, Verdict], bool]] = {
    "single-key-weight-one": lambda c, v: c.k[-2] == 1,
    "scale-zero-is-default": lambda c, v: c.scale in ("0.0", "0", "-0.0"),
    "explicit-scale-ignored": lambda c, v: c.scale != "None",
    "causal-alignment-reversed": lambda c, v: c.is_causal and c.q[-2] != c.k[-2],
    "causal-scale-zero-nan": lambda c, v: c.is_causal and _at_most_zero(c.scale),
    "empty-row-nan": lambda c, v: "fully-masked-row" in v.features,
    "empty-row-mean-v": lambda c, v: "fully-masked-row" in v.features,
    "excluded-keys-filled-finite": lambda c, v: _excludes(c) or "fully-masked-row" in v.features,
    "empty-row-single-key": lambda c, v: "fully-masked-row" in v.features,
    "mask-added-as-finite-value": lambda c, v: _excludes(c),
    "floor-weight-on-excluded-keys": lambda c, v: _excludes(c),
    "mask-inverted": lambda c, v: c.masked,
    "mask-is-additive-float": lambda c, v: c.masked,
    "gqa-interleaved-heads": lambda c, v: c.q[-3] != c.k[-3],
    "batch-head-mixed": lambda c, v: len(c.q) > 3 and c.q[-3] * int(np.prod(c.q[:-3])) > 1,
    "scores-rounded-to-float16": lambda c, v: c.dtype == "float16",
    "scores-accumulated-in-float16": lambda c, v: c.dtype == "float16",
    "bias-added-in-float16": lambda c, v: c.dtype == "float16" and c.bias,
    "float64-in-float32": lambda c, v: c.dtype == "float64",
    "default-scale-other": lambda c, v: c.scale == "None",
}


def explains(cause: Cause, verdict: Verdict) -> bool:
    """Whether ``cause`` explains the failure ``verdict``: its minimal case has the inputs
    the cause acts on (a float64 input for float64 computed in float32, scale=0 for
    scale=0 taken as the default, ...)."""
    case = case_of(verdict.counterexample)
    acts_on = _ACTS_ON.get(cause.name)
    return case is not None and acts_on is not None and acts_on(case, verdict)
