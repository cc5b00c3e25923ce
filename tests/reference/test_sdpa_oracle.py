"""The reference against the independent NumPy oracle, on every backend and dtype: the
plain form (``plain_attention``, with its weights) and the entry point
(``scaled_dot_product_attention``, which without weights takes the blocked form).

float64 must agree with the oracle to ~1e-12 relative; lower precisions must lie within
the TOL-2 bound computed on the dtype-rounded inputs (TOL-1); JAX runs float64 on a
subset of the cases (support.dtypes_checked), every other dtype on all of them.  The
``backend`` fixture covers numpy, torch, jax and array_api_strict here, and CuPy where a
GPU is present (``scripts/gpu-check``).  Problems are drawn by Hypothesis (shapes, masks,
biases with -inf entries, options and the values themselves, so that a failure shrinks to
the smallest problem and the simplest values); the hand-written problems run first as
examples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle
import pytest
from hypothesis import example, given
from problems import problem_of_shapes, problems, redrawn
from support import as64, drawn, dtypes_checked, on_backend, seen_by_kernel

from attnspec.backends import Backend
from attnspec.reference import plain_attention, scaled_dot_product_attention
from attnspec.reference.tolerance import error_bound

FLOAT64_RELATIVE = 1e-12

# The hand-written problems (tests/problems.py: problem_of_shapes), each run first as an
# explicit example of the drawn test; the comment names the clauses it exists for.
# Cases share shape families (A, B, D) on purpose: JAX compiles every operation anew
# for each new shape, and sharing keeps the JAX run within the CI budget.  SHAPES_B is
# test_features.py's SHAPES_GQA too: an xdist worker runs that file before this one, in
# the same process, and JAX reuses its compilations here.
SHAPES_A = dict(q=(6, 4, 1), k=(3, 6, 1), v=(3, 6, 5))  # no batch, G = 2, E = 1 != Ev
SHAPES_B = dict(q=(2, 4, 5, 4), k=(2, 2, 3, 4), v=(2, 2, 3, 3))  # G = 2, Lq > Lk
SHAPES_D = dict(q=(2, 1, 2, 4, 8), k=(1, 3, 1, 6, 8), v=(1, 3, 1, 6, 3))  # batch (2, 3), Lq < Lk
CASES: dict[str, dict[str, Any]] = {
    # SDPA-1.1, SDPA-2.1, SDPA-6.1: no batch dim, default scale with E = 1, h // G.
    "no-batch-gqa-e1": problem_of_shapes(**SHAPES_A),
    # SDPA-2.2: scale 0 gives uniform weights over the allowed keys; negative scales.
    "scale-zero": problem_of_shapes(**SHAPES_A, mask=(4, 6), scale=0.0),
    "scale-negative": problem_of_shapes(**SHAPES_A, bias=(4, 6), scale=-0.7),
    # SDPA-6.1, SDPA-4.2, SDPA-4.3, SDPA-5.1: Lq > Lk bottom-right leaves rows empty.
    "gqa-lq>lk-bottom-right-mask": problem_of_shapes(
        **SHAPES_B, mask=(5, 3), is_causal=True, causal_alignment="bottom_right"
    ),
    # SDPA-3.3, SDPA-3.4, SDPA-4.1, SDPA-5.1: mask AND causal, bias, fully-masked rows.
    "gqa-lq>lk-top-left-mask-bias-empty-rows": problem_of_shapes(
        **SHAPES_B,
        mask=(2, 1, 5, 3),
        empty_rows=(1,),
        bias=(5, 3),
        is_causal=True,
        causal_alignment="top_left",
    ),
    # SDPA-3.3, SDPA-5.1: -inf bias entries exclude keys; an all -inf row is empty.
    "bias-minus-inf": problem_of_shapes(
        **SHAPES_B, bias=(2, 4, 5, 3), minus_inf=True, empty_rows=(1,)
    ),
    # SDPA-1.2, SDPA-3.2, SDPA-4.1: two broadcast batch dims, Lq < Lk top-left, bias.
    "batch2-top-left-bias": problem_of_shapes(
        **SHAPES_D, bias=(3, 1, 4, 6), is_causal=True, causal_alignment="top_left"
    ),
    # SDPA-3.1, SDPA-3.3, SDPA-4.2: a per-head key mask (Hq, 1, Lk), full bias, Lq < Lk.
    "batch2-bottom-right-head-mask-bias": problem_of_shapes(
        **SHAPES_D,
        mask=(2, 1, 6),
        bias=(2, 3, 2, 4, 6),
        is_causal=True,
        causal_alignment="bottom_right",
    ),
    # SDPA-5.2: Lk = 0 gives zeros, also with a mask and causal (test_features.py's lk0
    # shapes, G = 2: JAX reuses its compilations of the empty key axis).
    "lk0": problem_of_shapes(
        q=(1, 2, 3, 6),
        k=(1, 1, 0, 6),
        v=(1, 1, 0, 2),
        mask=(3, 0),
        is_causal=True,
        causal_alignment="bottom_right",
    ),
    # SDPA-1.5: Lq = 0, a zero batch dim, Ev = 0, each on SHAPES_B's other sizes, so that
    # JAX reuses the compilations of what is not empty (Ev = 0: the scores and weights).
    "lq0": problem_of_shapes(q=(2, 4, 0, 4), k=(2, 2, 3, 4), v=(2, 2, 3, 3), is_causal=True),
    "zero-batch": problem_of_shapes(q=(0, 4, 5, 4), k=(0, 2, 3, 4), v=(0, 2, 3, 3)),
    "ev0": problem_of_shapes(q=(2, 4, 5, 4), k=(2, 2, 3, 4), v=(2, 2, 3, 0)),
}


def assert_matches_oracle(backend: Backend, problem: dict[str, Any], dtype: str) -> None:
    moved = on_backend(backend, problem, dtype)
    out, weights = plain_attention(**moved, return_weights=True)
    entry = as64(backend, scaled_dot_product_attention(**moved))
    seen = seen_by_kernel(backend, moved)
    expected_out, expected_weights = oracle.sdpa(**seen)
    where = f"{backend.name} {dtype}"
    # SDPA-1.3: shape and dtype.
    assert tuple(out.shape) == expected_out.shape, where
    assert tuple(weights.shape) == expected_weights.shape, where
    assert out.dtype == backend.dtype(dtype) and weights.dtype == out.dtype, where
    got_out, got_weights = as64(backend, out), as64(backend, weights)
    # SDPA-5.1 / SDPA-5.2: a row with no allowed key is exactly 0, weights too.
    empty = np.sum(expected_weights, axis=-1) == 0
    assert np.all(got_out[empty] == 0) and np.all(got_weights[empty] == 0), where
    assert np.all(entry[empty] == 0), f"{where}: entry point"
    if dtype == "float64":
        magnitude = np.max(np.abs(seen["v"]), initial=1.0)
        assert np.all(np.abs(got_out - expected_out) <= FLOAT64_RELATIVE * magnitude), where
        assert np.all(np.abs(entry - expected_out) <= FLOAT64_RELATIVE * magnitude), where
        assert np.all(np.abs(got_weights - expected_weights) <= FLOAT64_RELATIVE), where
        return
    bound = error_bound(**seen, dtype=dtype)
    entry_ratio = np.abs(entry - expected_out) / bound.out_tolerance
    assert np.all(entry_ratio <= 1), f"{where}: entry point {np.max(entry_ratio):.3g} x TOL-2"
    out_ratio = np.abs(got_out - expected_out) / bound.out_tolerance
    weight_ratio = np.abs(got_weights - expected_weights) / bound.weights_tolerance
    assert np.all(out_ratio <= 1), f"{where}: out error {np.max(out_ratio):.3g} x TOL-2"
    assert np.all(weight_ratio <= 1), f"{where}: weights error {np.max(weight_ratio):.3g} x TOL-2"


# Generated problems per backend, on top of the 13 hand-written cases; NumPy is cheapest
# per call, so it explores most.  JAX draws values on the cases' shapes only: a new shape
# costs seconds of compilation per operation, which the drawn shapes of the other
# backends already cover on the same (backend-independent) reference code.
DRAWN_PROBLEMS = {"numpy": 60, "array_api_strict": 25, "torch": 25, "jax": 10, "cupy": 25}


def with_hand_written_cases(test: Any) -> Any:
    """Every case of :data:`CASES` as an explicit example, run before the drawn ones."""
    for name, case in reversed(CASES.items()):
        test = example(problem=case).via(f"hand-written case {name!r}")(test)
    return test


def test_reference_matches_oracle(backend: Backend) -> None:
    """SDPA-7.1, SDPA-7.3, TOL-1, TOL-2 on every dtype (JAX: float64 on the SHAPES_D
    cases), and the clauses each case names.

    (SDPA-1.1, 1.2, 1.3, 1.5, 2.1, 2.2, 3.1-3.4, 4.1-4.3, 5.1, 5.2, 6.1.)
    """

    @drawn(DRAWN_PROBLEMS.get(backend.name, 25))
    @given(problem=redrawn(list(CASES.values())) if backend.name == "jax" else problems())
    @with_hand_written_cases
    def matches_oracle(problem: dict[str, Any]) -> None:
        # JAX checks float64 on the SHAPES_D cases (SDPA-1.2, 3.1-3.3, 4.1, 4.2) and their
        # redraws, whose compilations the other tests of SHAPES_D reuse, and every other
        # dtype on every case (support.dtypes_checked says why).
        float64 = problem["q"].shape == SHAPES_D["q"]
        for dtype in dtypes_checked(backend, float64):
            assert_matches_oracle(backend, problem, dtype)

    matches_oracle()


def test_scale_zero_gives_uniform_weights(cpu_backend: Backend) -> None:
    """SDPA-2.2: scale=0 weighs every allowed key 1/|S(i)|, whatever q and k are."""
    # a per-head key mask on SHAPES_D, whose float64 compilations JAX has (float64 alone
    # holds the 1e-12 asked; the scale-zero case's shapes run in float64 only here)
    problem = problem_of_shapes(**SHAPES_D, mask=(2, 1, 6), scale=0.0)
    moved = on_backend(cpu_backend, problem, "float64")
    _, weights = plain_attention(**moved, return_weights=True)
    mask = np.broadcast_to(problem["mask"], weights.shape)
    counts = np.sum(mask, axis=-1, keepdims=True)
    expected = np.where(mask, 1.0 / np.maximum(counts, 1), 0.0)
    assert np.all(np.abs(as64(cpu_backend, weights) - expected) <= FLOAT64_RELATIVE)


def test_decode_consistency(backend: Backend) -> None:
    """SDPA-4.4: bottom-right, the last query row alone equals the full result's last row."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(SHAPES_D[n]) for n in ("q", "k", "v"))
    causal = {"is_causal": True, "causal_alignment": "bottom_right"}
    for dtype in backend.dtype_names:
        qb, kb, vb = (backend.asarray(a, dtype=dtype) for a in (q, k, v))
        full = as64(backend, scaled_dot_product_attention(qb, kb, vb, **causal))
        seen = [as64(backend, a) for a in (qb, kb, vb)]
        # The KV-cache decode step: the last query alone (bottom-right puts it at key Lk-1).
        alone = as64(backend, scaled_dot_product_attention(qb[..., -1:, :], kb, vb, **causal))
        tol = error_bound(seen[0][..., -1:, :], *seen[1:], dtype=dtype, **causal)
        # Each is within TOL-2 of the same float64 value, hence within twice it of each other.
        assert np.all(np.abs(alone - full[..., -1:, :]) <= 2 * tol.out_tolerance), dtype


def disallowed_problem() -> dict[str, Any]:
    """SHAPES_D (Lq=4 < Lk=6), top-left causal, a mask whose key column 2 is all False.

    Keys 2, 4 and 5 are disallowed for every query; key 3 only for queries 0-2; key 0
    is allowed for every query, so no row is empty.
    """
    rng = np.random.default_rng(5)
    problem = {n: rng.standard_normal(SHAPES_D[n]) for n in ("q", "k", "v")}
    mask = rng.random((2, 3, 2, 4, 6)) < 0.8
    mask[..., 2] = False
    mask[..., 0] = True
    problem.update(bias=rng.standard_normal(mask.shape), mask=mask, is_causal=True)
    return problem


def copied(problem: dict[str, Any]) -> dict[str, Any]:
    return {n: a.copy() if isinstance(a, np.ndarray) else a for n, a in problem.items()}


def run(backend: Backend, problem: dict[str, Any], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    out, weights = plain_attention(**on_backend(backend, problem, dtype), return_weights=True)
    return as64(backend, out), as64(backend, weights)


def with_disallowed_replaced(problem: dict[str, Any], fill: Any) -> dict[str, Any]:
    """Keys/values 2, 4, 5 and every disallowed bias entry replaced by ``fill``."""
    changed = copied(problem)
    for name in ("k", "v"):
        changed[name][..., [2, 4, 5], :] = fill(changed[name][..., [2, 4, 5], :].shape)
    allowed = problem["mask"] & oracle.causal_matrix(4, 6, "top_left")
    changed["bias"][~allowed] = fill(changed["bias"][~allowed].shape)
    return changed


@pytest.mark.parametrize(
    ("clause", "fill"),
    [
        ("SDPA-8.1", lambda shape: np.full(shape, 1e3)),
        ("SDPA-8.1", lambda shape: np.random.default_rng(6).standard_normal(shape) * 30),
        ("SDPA-8.2", lambda shape: np.full(shape, np.nan)),
        ("SDPA-8.2", lambda shape: np.full(shape, np.inf)),
        ("SDPA-8.2", lambda shape: np.full(shape, -np.inf)),
    ],
    ids=["8.1-large", "8.1-random", "8.2-nan", "8.2-inf", "8.2-minus-inf"],
)
# q . k with an infinite masked key is inf or NaN before the mask removes it: expected.
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_disallowed_values_change_nothing(cpu_backend: Backend, clause: str, fill: Any) -> None:
    """SDPA-8.1 (finite) / SDPA-8.2 (non-finite): keys, values and bias entries a query
    may not attend leave its output and weights bit-identical."""
    problem = disallowed_problem()
    changed = with_disallowed_replaced(problem, fill)
    for dtype in cpu_backend.dtype_names:
        before, after = run(cpu_backend, problem, dtype), run(cpu_backend, changed, dtype)
        assert np.array_equal(before[0], after[0]), (clause, dtype)
        assert np.array_equal(before[1], after[1]), (clause, dtype)


def test_key_beyond_causal_boundary_changes_nothing_before_it(cpu_backend: Backend) -> None:
    """SDPA-8.1, SDPA-4.1: key 3 is disallowed for queries 0-2 only; changing it (NaN
    included, SDPA-8.2) leaves rows 0-2 bit-identical."""
    problem = disallowed_problem()
    for value in (7.0, np.nan):
        changed = copied(problem)
        changed["k"][..., 3, :] = value
        changed["v"][..., 3, :] = value
        for dtype in cpu_backend.dtype_names:
            before, after = run(cpu_backend, problem, dtype), run(cpu_backend, changed, dtype)
            assert np.array_equal(before[0][..., :3, :], after[0][..., :3, :]), (value, dtype)
            assert not np.array_equal(before[0][..., 3, :], after[0][..., 3, :]), (value, dtype)


def test_nan_propagates(cpu_backend: Backend) -> None:
    """SDPA-8.3: NaN in q_i, or in bias_ij of an allowed key, makes out_i NaN and leaves
    other rows alone; NaN in the shared k_0 makes every row NaN; NaN in one column of
    the allowed v_0 makes that column NaN and no other."""
    problem = disallowed_problem()
    row = (..., 1, 2)  # head 1, query 2, in every batch element
    for dtype in cpu_backend.dtype_names:
        base_out = run(cpu_backend, problem, dtype)[0]
        assert np.all(np.isfinite(base_out))
        for name in ("q", "bias"):
            changed = copied(problem)
            changed[name][(*row, 0)] = np.nan  # q feature 0, or the bias of key 0
            out = run(cpu_backend, changed, dtype)[0]
            assert np.all(np.isnan(out[..., 1, 2, :])), (name, dtype)
            others = np.ones(out.shape[:-1], dtype=bool)
            others[row] = False
            assert np.array_equal(out[others], base_out[others]), (name, dtype)
        changed = copied(problem)
        changed["k"][..., 0, 5] = np.nan
        assert np.all(np.isnan(run(cpu_backend, changed, dtype)[0])), dtype
        changed = copied(problem)
        changed["v"][..., 0, 1] = np.nan
        out = run(cpu_backend, changed, dtype)[0]
        assert np.all(np.isnan(out[..., 1])), dtype
        assert np.all(np.isfinite(out[..., [0, 2]])), dtype


def test_inputs_not_modified(backend: Backend) -> None:
    """SDPA-1.6: q, k, v, mask and bias hold the same values after the call, of either
    form."""
    problem = disallowed_problem()
    for dtype in backend.dtype_names:
        moved = on_backend(backend, problem, dtype)
        before = {n: backend.to_numpy(moved[n]).copy() for n in ("q", "k", "v", "bias", "mask")}
        plain_attention(**moved, return_weights=True)
        scaled_dot_product_attention(**moved)
        for name, copy in before.items():
            assert np.array_equal(backend.to_numpy(moved[name]), copy), (name, dtype)


def test_large_scores_stay_finite(backend: Backend) -> None:
    """SDPA-7.4: scores around 1.4e4 (exp overflows in every float) give finite outputs,
    within TOL-2 of the oracle; the inputs are exact in every dtype."""
    q = np.full(SHAPES_D["q"], 100.0)
    k = np.where(np.arange(6)[:, None] < 3, 50.0, 48.0) * np.ones(SHAPES_D["k"])
    v = np.random.default_rng(8).integers(-8, 8, SHAPES_D["v"]).astype(np.float64)
    expected, _ = oracle.sdpa(q, k, v)
    assert np.all(np.isfinite(expected))
    for dtype in backend.dtype_names:
        moved = [backend.asarray(a, dtype=dtype) for a in (q, k, v)]
        out = as64(backend, scaled_dot_product_attention(*moved))
        tol = error_bound(q, k, v, dtype=dtype).out_tolerance
        assert np.all(np.isfinite(out)), dtype
        assert np.all(np.abs(out - expected) <= tol), dtype


def test_determinism(cpu_backend: Backend) -> None:
    """SDPA-7.5: the same call on the same inputs returns identical values twice."""
    problem = CASES["batch2-bottom-right-head-mask-bias"]
    for dtype in cpu_backend.dtype_names:
        first, second = run(cpu_backend, problem, dtype), run(cpu_backend, problem, dtype)
        assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
