"""DROP-1 … DROP-6: dropout, checked through the indicators a kernel draws.

With q = 0 every allowed weight of a row is 1/|S(i)|, and with V = I the output row is
the weight row, so each allowed entry is 0 (dropped) or 1/(|S(i)|(1 - p)) (kept): the
indicators can be read off exactly for any kernel within TOL-6.  The statistical checks
(kept fraction, independence, unbiasedness) use Hoeffding's inequality with fixed seeds;
each states its false-failure probability, at most 1e-6 (CONF-4).  The derivations are in
spec/dense.md, "How the conformance suite checks dropout".
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.strategies import draw_dims, draw_problem, draw_rng
from ..assertions import assert_identical, assert_matches_reference, assert_within_bound
from ..bounds import dropout_bound
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest, identity_values
from ..registration import needs, register
from ._helpers import with_claimed_features

FALSE_FAILURE = 1e-6
KEPT_FRACTION_PROBABILITIES = (0.1, 0.3, 0.6)
INDEPENDENCE_P = 0.3
UNBIASED_P = 0.5
UNBIASED_COPIES = 1024
OBSERVED = (2, 4, 64, 64)  # batch, heads, queries, keys of an indicator observation
SEED = 20261201  # the suite's dropout seed; the runner's seed is added to it


def _seeded(declaration: KernelDeclaration) -> str | None:
    reason = needs("dropout")(declaration)
    if reason is None and not declaration.dropout_seeded:
        return "the kernel draws from its library's generator, not from a seed it is given"
    return reason


def _laid_out(
    kernel: KernelUnderTest, batch: int, heads: int, length: int, width: int
) -> tuple[int, ...]:
    """(batch, heads, length, width), or (batch * heads, length, width) for a kernel that
    takes no batch dim: independent copies either way (DROP-3)."""
    wanted = kernel.declaration.batch_ndim
    if wanted == 0:
        return (batch * heads, length, width)
    return (*(1,) * max((wanted or 1) - 1, 0), batch, heads, length, width)


def indicator_problem(
    kernel: KernelUnderTest,
    dropout_p: float,
    seed: int,
    mask: np.ndarray | None = None,
    n_queries: int = OBSERVED[2],
    n_keys: int = OBSERVED[3],
    heads: int = OBSERVED[1],
    batch: int = OBSERVED[0],
    is_causal: bool = False,
    general_columns: int = 0,
) -> Problem:
    """q = 0 and V = I: the output is the kept-and-rescaled weight matrix.  Always one
    call with V = I, never KernelUnderTest.observed_weights' column blocks (on a backend
    that compiles per shape): each call draws a dropout mask of its own, so blocks would
    read their columns off different masks.  ``general_columns`` > 0 appends that many
    columns of normal values to V = I: their outputs must use the indicators the identity
    columns show (one per weight, DROP-2)."""
    q = np.zeros(_laid_out(kernel, batch, heads, n_queries, 4))
    k = np.zeros(_laid_out(kernel, batch, heads, n_keys, 4))
    problem = Problem(
        q=q,
        k=k,
        v=k,
        dtype=kernel.widest_dtype,
        mask=mask,
        is_causal=is_causal,
        dropout_p=dropout_p,
        seed=seed,
    )
    observed = identity_values(problem)
    if general_columns == 0:
        return observed
    general = np.random.default_rng(seed).standard_normal((*k.shape[:-1], general_columns))
    general = kernel.rounded(general, problem.dtype)
    return observed.with_(v=np.concatenate([observed.v, general], axis=-1))


def observe_indicators(kernel: KernelUnderTest, problem: Problem) -> np.ndarray:
    """The keep indicators the kernel drew, read off its output's identity columns (the
    first Lk), after checking the whole output against DROP-2 with them within TOL-6
    (which makes the reading exact)."""
    out = kernel.output(problem)
    n_keys = problem.k.shape[-2]
    weights = out[..., :n_keys]
    expected_all_kept = dropout_bound(problem, kernel.declaration, all_kept(problem))[0]
    allowed = np.broadcast_to(np.asarray(expected_all_kept)[..., :n_keys] > 0, weights.shape)
    visible = np.maximum(allowed.sum(axis=-1, keepdims=True), 1)
    kept: np.ndarray = allowed & (weights > 0.5 / (visible * (1 - problem.dropout_p)))
    expected, tolerance = dropout_bound(problem, kernel.declaration, kept)
    assert_within_bound(
        out,
        np.asarray(expected),
        np.asarray(tolerance),
        f"out with dropout_p={problem.dropout_p} (q = 0, V = I: each allowed "
        "entry is 0 or 1/(|S(i)|(1 - p))"
        + (
            f"; V's last {problem.v.shape[-1] - n_keys} columns general: their outputs are "
            "the kept weights times those values)"
            if problem.v.shape[-1] > n_keys
            else ")"
        ),
        problem,
        kernel,
        clause="DROP-2, TOL-6",
    )
    return kept


def all_kept(problem: Problem) -> np.ndarray:
    """Indicators that keep every weight, ``(*batch, Hq, Lq, Lk)``."""
    batch = np.broadcast_shapes(problem.q.shape[:-3], problem.k.shape[:-3], problem.v.shape[:-3])
    return np.ones((*batch, *problem.q.shape[-3:-1], problem.k.shape[-2]), dtype=bool)


def hoeffding_radius(n: int, false_failure: float) -> float:
    """t with P(|mean - E| >= t) <= 2 exp(-2 n t^2) = false_failure, for n independent
    indicators."""
    return math.sqrt(math.log(2 / false_failure) / (2 * n))


@register("dropout-zero", "DROP-6", applies=needs("dropout"))
def dropout_zero(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With dropout probability 0 (and any seed) every indicator is 1 and the output is
    the definition within TOL-2 (DROP-6, DROP-2): dropout off means off."""
    dims = draw_dims(data, kernel)
    problem = with_claimed_features(data, kernel, draw_problem(data, kernel, dims=dims), dims)
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    assert_matches_reference(kernel, problem.with_(seed=seed))


@register("dropout-rescaling", "DROP-2", applies=needs("dropout"))
def dropout_rescaling(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Kept weights are multiplied by 1/(1 - p), dropped ones are 0, nothing is
    renormalised and excluded keys stay excluded: with q = 0 and V = I every allowed entry
    is 0 or 1/(|S(i)|(1 - p)) within TOL-6, for p from 0.1 to 0.8, masks and causal calls.
    Deterministic: no false failure."""
    dims = draw_dims(data, kernel, min_queries=1, min_keys=1, gqa=False, weights=True)
    p = data.draw(st.sampled_from([0.1, 0.3, 0.5, 0.8]), label="dropout_p")
    decl = kernel.declaration
    mask = None
    if decl.mask and data.draw(st.booleans(), label="with mask"):
        # one (Lq, Lk) mask for every batch element and head, sometimes with a blank row
        mask = draw_rng(data).random((dims.n_queries, dims.n_keys)) < 0.6
        if data.draw(st.booleans(), label="blank a row"):
            mask[data.draw(st.integers(0, dims.n_queries - 1), label="blank row")] = False
    causal = (
        decl.causal
        and (mask is None or decl.mask_and_causal)
        and data.draw(st.booleans(), label="causal")
    )
    problem = indicator_problem(
        kernel,
        p,
        data.draw(st.integers(0, 2**31 - 1), label="seed"),
        mask=mask,
        n_queries=dims.n_queries,
        n_keys=dims.n_keys,
        heads=dims.n_q_heads,
        batch=max(1, math.prod(dims.batch)),
        is_causal=causal,
    )
    observe_indicators(kernel, problem)


@register("dropout-general-values", "DROP-2", applies=needs("dropout"))
def dropout_general_values(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """One indicator per weight, shared by every value column: with V = [I | G] (G normal
    values) the identity columns show the kept weights and the other columns must be
    those weights times G within TOL-6 (DROP-2).  Dropout applied to the output after the
    value product, or to the values, draws an indicator per output element and fails;
    V = I alone cannot tell them apart.  Deterministic: no false failure."""
    dims = draw_dims(data, kernel, min_queries=1, min_keys=1, gqa=False, weights=True)
    problem = indicator_problem(
        kernel,
        data.draw(st.sampled_from([0.1, 0.5]), label="dropout_p"),
        data.draw(st.integers(0, 2**31 - 1), label="seed"),
        n_queries=dims.n_queries,
        n_keys=dims.n_keys,
        heads=dims.n_q_heads,
        batch=max(1, math.prod(dims.batch)),
        general_columns=data.draw(st.integers(1, 8), label="general value columns"),
    )
    observe_indicators(kernel, problem)


@register("dropout-kept-fraction", "DROP-3", kind="fixed", applies=needs("dropout"))
def dropout_kept_fraction(kernel: KernelUnderTest, seed: int) -> None:
    """Each indicator is kept with probability 1 - p: the kept fraction of N = 32768
    indicators lies within Hoeffding's radius of 1 - p for p = 0.1, 0.3, 0.6
    (false failure <= 1e-6 for the three together)."""
    for index, p in enumerate(KEPT_FRACTION_PROBABILITIES):
        problem = indicator_problem(kernel, p, SEED + seed + index)
        kept = observe_indicators(kernel, problem)
        n = kept.size
        radius = hoeffding_radius(n, FALSE_FAILURE / len(KEPT_FRACTION_PROBABILITIES))
        fraction = float(kept.mean())
        if abs(fraction - (1 - p)) > radius:
            raise PropertyFailure(
                f"with dropout_p={p} the kernel kept {fraction:.4f} of {n} weights, but should "
                f"keep 1 - p = {1 - p:g} (Hoeffding radius {radius:.4f}, false failure <= "
                f"{FALSE_FAILURE:g}); is p the keep probability? [DROP-3]",
                problem,
                kernel,
            )


def _pairs(kept: np.ndarray, axis: int, gap: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint pairs (x, x + gap) along ``axis``: blocks of 2 gap, first half with second."""
    size = kept.shape[axis] - kept.shape[axis] % (2 * gap)
    blocks = np.moveaxis(kept, axis, -1)[..., :size].reshape(
        *np.moveaxis(kept, axis, -1).shape[:-1], size // (2 * gap), 2, gap
    )
    return blocks[..., 0, :], blocks[..., 1, :]


@register("dropout-independence", "DROP-3", kind="fixed", applies=needs("dropout"))
def dropout_independence(kernel: KernelUnderTest, seed: int) -> None:
    """Indicators of neighbouring heads, batch elements, queries, keys and keys 16 apart
    are independent: over disjoint pairs both are kept with probability (1 - p)^2, within
    Hoeffding's radius for each of the five relations (false failure <= 1e-6 together).
    A mask shared by heads, by batch elements, or repeating along an axis gives 1 - p."""
    p = INDEPENDENCE_P
    problem = indicator_problem(kernel, p, SEED + seed)
    kept = observe_indicators(kernel, problem).reshape(OBSERVED)
    relations = {
        "heads h, h + 1": (1, 1),
        "batch elements b, b + 1": (0, 1),
        "queries i, i + 1": (2, 1),
        "keys j, j + 1": (3, 1),
        "keys j, j + 16": (3, 16),
    }
    expected = (1 - p) ** 2
    for name, (axis, gap) in relations.items():
        first, second = _pairs(kept, axis, gap)
        both = first & second
        radius = hoeffding_radius(both.size, FALSE_FAILURE / len(relations))
        if abs(float(both.mean()) - expected) > radius:
            raise PropertyFailure(
                f"indicators of {name} are both kept in {float(both.mean()):.4f} of "
                f"{both.size} disjoint pairs, but independent ones are with probability "
                f"(1 - p)^2 = {expected:.4f} (p = {p}, Hoeffding radius {radius:.4f}, false "
                f"failure <= {FALSE_FAILURE:g}) [DROP-3]",
                problem,
                kernel,
            )


def _copies(a: np.ndarray, copies: int) -> np.ndarray:
    """``copies`` copies of ``a`` along its batch axis (its heads axis when it has none)."""
    return np.repeat(a, copies, axis=-4 if a.ndim >= 4 else -3)


def _first_and_mean(a: np.ndarray, copies: int) -> tuple[np.ndarray, np.ndarray]:
    """The first copy and the mean over the copies of an output laid out by _copies."""
    if a.ndim == 3:
        grouped = a.reshape(-1, copies, *a.shape[-2:])
        return grouped[:, 0], grouped.mean(axis=1)
    return np.take(a, 0, axis=-4), a.mean(axis=-4)


@register("dropout-unbiased", "DROP-3", kind="fixed", applies=needs("dropout"))
def dropout_unbiased(kernel: KernelUnderTest, seed: int) -> None:
    """The expected output is the definition: the mean of 1024 independent copies of one
    problem (p = 0.5, positive values) lies within Hoeffding's radius, plus the kernel's
    largest TOL-6 rounding, of the output without dropout (false failure <= 1e-6 over all
    elements)."""
    rng = np.random.default_rng(SEED + seed)
    heads, n_queries, n_keys, value_dim, copies = 2, 4, 16, 4, UNBIASED_COPIES
    dtype = kernel.widest_dtype
    q, k = (rng.standard_normal(_laid_out(kernel, 1, heads, n, 8)) for n in (n_queries, n_keys))
    v = rng.uniform(1.0, 2.0, _laid_out(kernel, 1, heads, n_keys, value_dim))
    q, k, v = (kernel.rounded(_copies(a, copies), dtype) for a in (q, k, v))
    problem = Problem(q=q, k=k, v=v, dtype=dtype, dropout_p=UNBIASED_P, seed=SEED + seed)
    _, mean = _first_and_mean(kernel.output(problem), copies)
    # the definition, and the largest TOL-6 bound over all indicator patterns: with
    # positive values every term is largest when all are kept
    definition, _ = dropout_bound(
        problem.with_(dropout_p=0.0), kernel.declaration, all_kept(problem)
    )
    _, rounding = dropout_bound(problem, kernel.declaration, all_kept(problem))
    target, _ = _first_and_mean(np.asarray(definition), copies)
    slack, _ = _first_and_mean(np.asarray(rounding), copies)
    width = target / (1 - UNBIASED_P) + 2 * slack  # the range one copy's output can take
    radius = width * math.sqrt(math.log(2 * target.size / FALSE_FAILURE) / (2 * copies))
    assert_within_bound(
        mean,
        target,
        radius + slack,
        f"mean output of {copies} copies with dropout_p={UNBIASED_P}",
        problem,
        kernel,
        clause=f"DROP-3: E[out] = the definition; Hoeffding, false failure <= {FALSE_FAILURE:g}",
    )


@register("dropout-seed", "DROP-4", kind="fixed", applies=_seeded)
def dropout_seed(kernel: KernelUnderTest, seed: int) -> None:
    """The same seed gives bit-identical outputs; seeds s and s + 1 give different
    indicators (4096 independent ones coincide with probability < 1e-900 at p = 0.3)."""
    first_seed = SEED + seed
    problem = indicator_problem(kernel, INDEPENDENCE_P, first_seed, batch=1, heads=1)
    first, again = kernel.output(problem), kernel.output(problem)
    assert_identical(
        again, first, f"out of a second call with seed={problem.seed}", problem, kernel
    )
    other = problem.with_(seed=first_seed + 1)
    if np.array_equal(observe_indicators(kernel, other), observe_indicators(kernel, problem)):
        raise PropertyFailure(
            f"seeds {problem.seed} and {other.seed} gave the same {OBSERVED[2] * OBSERVED[3]} "
            "keep indicators: the kernel ignores the seed it is given [DROP-4]",
            other,
            kernel,
        )
