"""SDPA-2: the score scale, recovered from the kernel's own weights.

The probe: one-hot query q = e_0 and keys k_j = j a e_0, so q . k_j = j a exactly in
every dtype (a is a power of two and j a is small).  Then
log(p_{j+1} / p_j) = s a, s being the scale the kernel really used.  With E != Ev and
GQA drawn, 1/E, 1/sqrt(Ev), s^2, a missing scale and an ignored ``scale=`` all give a
recovered s that TOL-2 cannot explain.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.shape_pool import pooled_sizes, tied_to
from ...draw.sizes import GROUPS, HEAD_DIMS, current
from ...draw.strategies import draw_dtype, with_declared_batch
from ..assertions import first_index
from ..bounds import reference_bound, weights_bound
from ..failures import PropertyFailure, distinct
from ..kernel import KernelUnderTest
from ..registration import needs, register
from ..statistics import round_outward, sum_of_squares_range, two_sided_chi_square_interval

SCORE_VARIANCE_PAIRS = 2000
SCORE_VARIANCE_FALSE_FAILURE = 1e-6
EXPLICIT_PROBE_SCALES = (0.0, 0.375, 1.5, -0.5, 0.0625)


def scale_probe(kernel: KernelUnderTest, data: st.DataObject, scale: float | None) -> Problem:
    """The probe problem: one-hot query, keys along it at dot products 0, a, 2a, ...; its
    sizes (and dtype) from a few per stratum on a backend that compiles per shape."""
    probe_sizes = pooled_sizes(data, "scale probe", lambda draws: _probe_sizes(kernel, draws))
    head_dim, n_keys, value_dim, n_kv_heads, groups, n_queries = probe_sizes
    effective = 1 / math.sqrt(head_dim) if scale is None else scale
    # a power of two near 1/s keeps s*a moderate and j*a exact in every dtype
    step = 2.0 ** round(-math.log2(abs(effective))) if effective else 1.0
    n_q_heads = n_kv_heads * groups
    q = np.zeros((n_q_heads, n_queries, head_dim))
    q[..., 0] = 1.0
    k = np.zeros((n_kv_heads, n_keys, head_dim))
    k[..., 0] = np.arange(n_keys) * step
    v = np.zeros((n_kv_heads, n_keys, value_dim))
    v[..., :n_keys] = np.eye(n_keys)
    q, k, v = (with_declared_batch(kernel, a) for a in (q, k, v))
    dtype = draw_dtype(tied_to(data, probe_sizes), kernel)
    return Problem(q=q, k=k, v=v, dtype=dtype, scale=scale)


def _probe_sizes(kernel: KernelUnderTest, data: st.DataObject) -> tuple[int, ...]:
    """E, Lk, Ev, Hkv, G and Lq of a scale probe."""
    decl = kernel.declaration
    drawing = current()
    if drawing.realistic:  # head dims kernels special-case, wide groups (the probe is cheap)
        limits = drawing.limits
        head_dim = data.draw(
            st.sampled_from([e for e in HEAD_DIMS if e <= limits.max_head_dim] or [2]), label="E"
        )
    else:
        head_dim = data.draw(st.integers(2, 24), label="E")
    n_keys = data.draw(st.integers(2, 5), label="Lk")
    value_dim = data.draw(
        st.sampled_from([d for d in (n_keys + 1, n_keys + 3) if d != head_dim]), label="Ev"
    )
    n_kv_heads = data.draw(st.integers(1, 2), label="Hkv")
    if decl.gqa and drawing.realistic:
        room = max(1, drawing.limits.max_batch_heads // n_kv_heads)
        groups = data.draw(st.sampled_from([g for g in GROUPS if g <= room]), label="G")
    else:
        groups = data.draw(st.integers(1, 3), label="G") if decl.gqa else 1
    n_queries = data.draw(st.integers(1, 3), label="Lq")
    return head_dim, n_keys, value_dim, n_kv_heads, groups, n_queries


def recovered_scale(kernel: KernelUnderTest, problem: Problem) -> None:
    """Compare the scale implied by the kernel's weights with the clause's."""
    n_keys = problem.k.shape[-2]
    head_dim, value_dim = problem.q.shape[-1], problem.v.shape[-1]
    step = float(problem.k[..., 0, 1, 0].flat[0])
    out = kernel.output(problem)[..., :n_keys]
    identity_problem = problem.with_(v=problem.v[..., :n_keys])
    expected, tolerance = (
        np.asarray(a) for a in weights_bound(identity_problem, kernel.declaration)
    )
    expected_scale = 1 / math.sqrt(head_dim) if problem.scale is None else problem.scale
    with np.errstate(divide="ignore", invalid="ignore"):
        implied = np.log(out[..., 1:] / out[..., :-1]) / step
        # first-order error of a log-ratio of weights each within its TOL-2 bound
        slack = (
            tolerance[..., 1:] / expected[..., 1:] + tolerance[..., :-1] / expected[..., :-1]
        ) / step
    bad = ~(np.abs(implied - expected_scale) <= slack)
    if bad.any():
        at = first_index(bad)
        found = float(implied[at])
        candidates = {
            "1/sqrt(E)": 1 / math.sqrt(head_dim),
            "1/E": 1 / head_dim,
            "1/sqrt(Ev)": 1 / math.sqrt(value_dim),
            "1 (no scale)": 1.0,
            "scale**2": expected_scale**2,
            "0": 0.0,
        }
        names = [n for n, c in candidates.items() if abs(found - c) <= float(slack[at])]
        looks = f" (looks like {', '.join(names)})" if names else ""
        shown, should = distinct(found, expected_scale)
        raise PropertyFailure(
            f"the kernel's weights imply scale={shown}{looks}, but should be {should} "
            f"(E={head_dim}, Ev={value_dim}, scale={problem.scale!r}): they differ by "
            f"{abs(found - expected_scale):.3g}, more than the {float(slack[at]):.3g} TOL-2 "
            f"allows",
            problem,
            kernel,
        )


@register("default-scale", "SDPA-2.1")
def default_scale(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With scale=None the scores are scaled by exactly 1/sqrt(E) — not 1/E, 1/sqrt(Ev),
    the model dim, or nothing — recovered by the closed-form probe, with GQA."""
    recovered_scale(kernel, scale_probe(kernel, data, None))


@register("explicit-scale", "SDPA-2.2", applies=needs("scale"))
def explicit_scale(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """An explicit scale (0 and negative included) replaces the default exactly."""
    scale = data.draw(st.sampled_from(EXPLICIT_PROBE_SCALES), label="scale")
    recovered_scale(kernel, scale_probe(kernel, data, scale))


@cache  # a constant: the root-finding behind it cost 3.5 ms a call, once per example
def score_variance_interval() -> tuple[float, float]:
    """The chi^2_N acceptance interval for W, false failure 1e-6, rounded outward to 0.1."""
    return round_outward(
        two_sided_chi_square_interval(SCORE_VARIANCE_PAIRS, SCORE_VARIANCE_FALSE_FAILURE)
    )


def log_ratio_slack(
    problem: Problem, exact_log_ratio: np.ndarray, declaration: KernelDeclaration
) -> np.ndarray:
    """Per pair, how far a kernel within TOL-2 can put log p_2 - log p_1 from the exact D.

    Three parts, all derived, none tuned: the inputs rounded to the dtype move D to the
    D~ of the rounded inputs (computed exactly here); TOL-2 lets each observed weight be
    off by tau/p relative, so its log by at most -log(1 - tau/p); and float64 evaluates D
    and D~ to within (E + 2) 2^-53 |alpha| sum|q||k| each, far below the 2^-40 allowed.
    """
    bound = reference_bound(problem, declaration)
    weights = np.asarray(bound.out)[..., 0, :].reshape(-1, 2)
    relative = np.asarray(bound.out_tolerance)[..., 0, :].reshape(-1, 2) / np.where(
        weights > 0, weights, np.nan
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        tol2 = np.where(relative < 1, -np.log1p(-np.minimum(relative, 1.0)), np.inf).sum(axis=1)
    head_dim = problem.q.shape[-1]
    q, k = problem.q.reshape(-1, head_dim), problem.k.reshape(-1, 2, head_dim)
    rounded_log_ratio = np.einsum("pe,pe->p", q, k[:, 1] - k[:, 0]) / math.sqrt(head_dim)
    magnitude = np.einsum("pe,pje->p", np.abs(q), np.abs(k)) / math.sqrt(head_dim)
    slack: np.ndarray = (
        np.abs(exact_log_ratio - rounded_log_ratio) + tol2 + 2.0**-40 * (1 + magnitude)
    )
    return slack


@register("score-variance", "SDPA-2.1", kind="fixed")
def score_variance(kernel: KernelUnderTest, seed: int) -> None:
    """Scaled scores of unit-variance inputs have variance 1: a chi-square test on
    N = 2000 independent key pairs, false-failure probability <= 1e-6 (CONF-4) in every
    dtype, the kernel's rounding included.

    With |q|^2 = E and keys iid N(0, I), the log-ratio of a pair's weights (V = I_2) is
    D = s q.(k_2 - k_1) ~ N(0, 2 E s^2) = N(0, 2) for s = 1/sqrt(E), so
    W = sum D^2 / 2 ~ chi^2_N.  The kernel shows D only to within a derived slack per pair
    (input rounding and TOL-2), so it fails only when no W within those slacks of its own
    log-ratios lies in the two-sided 1e-6 interval: a kernel within TOL-2 then fails only
    if the true W is outside, which has probability <= 1e-6.
    """
    head_dim, pairs = 16, SCORE_VARIANCE_PAIRS
    rng = np.random.default_rng(seed)
    dtype = kernel.widest_dtype
    # the pairs sit on the heads axis, so any declared number of batch dims fits
    direction = rng.standard_normal((pairs, 1, head_dim))
    q = direction / np.linalg.norm(direction, axis=-1, keepdims=True) * math.sqrt(head_dim)
    k = rng.standard_normal((pairs, 2, head_dim))
    exact_log_ratio = np.einsum("pe,pe->p", q[:, 0], k[:, 1] - k[:, 0]) / math.sqrt(head_dim)
    q, k, v = (
        with_declared_batch(kernel, a)
        for a in (q, k, np.broadcast_to(np.eye(2), (pairs, 2, 2)).copy())
    )
    problem = Problem(q=kernel.rounded(q, dtype), k=kernel.rounded(k, dtype), v=v, dtype=dtype)
    weights = kernel.output(problem).reshape(pairs, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(weights[:, 1]) - np.log(weights[:, 0])
    slack = log_ratio_slack(problem, exact_log_ratio, kernel.declaration)
    least, greatest = sum_of_squares_range(log_ratio, slack)
    low, high = score_variance_interval()
    if not (least <= high and greatest >= low):  # NaN fails too
        statistic = float(np.sum(log_ratio**2) / 2)
        raise PropertyFailure(
            f"sum of squared weight log-ratios / 2 = {statistic:.6g} (in [{least:.6g}, "
            f"{greatest:.6g}] after the rounding slack that {dtype} and TOL-2 allow), but a "
            f"kernel scaling by 1/sqrt(E) gives chi^2_{pairs}, accepted in [{low}, {high}] "
            f"(false failure <= {SCORE_VARIANCE_FALSE_FAILURE:g}); implied scale ~ "
            f"{math.sqrt(statistic / pairs / head_dim):.4g}, "
            f"expected {1 / math.sqrt(head_dim):.4g}",
            problem,
            kernel,
        )
