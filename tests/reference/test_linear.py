"""Linear attention (spec/linear.md, the LIN clauses) against an independent NumPy oracle.

The oracle (tests/oracle_linear.py) is the quadratic form of LIN-1.2/LIN-2.1 written from
the spec in plain NumPy: it builds the full ``Lq x Lk`` matrix ``A = phi(Q) psi(K)^T``
(which the reference never does), masks it, and row-normalises it, with feature maps of its
own, so a shared bug cannot cancel.  Every reference call runs on numpy, torch, jax and
array_api_strict through the ``cpu_backend`` fixture.  LIN-5.2's underflow guard of the
linear properties: tests/conformance/properties/linear/.
"""

from __future__ import annotations

import random
import re
import tracemalloc
from typing import Any

import numpy as np
import oracle_linear
import pytest
from support import backend_or_skip

from attnspec.backends import Backend
from attnspec.reference.favor import (
    favor_attention,
    favor_feature_error,
    favor_feature_map,
    favor_features,
    favor_projection,
)
from attnspec.reference.linear import (
    elu_plus_one,
    linear_attention,
    linear_error_bound,
    relu_features,
)

FLOAT64_RELATIVE = 1e-12
ALIGNMENTS = ("top_left", "bottom_right")
# Shapes shared by the tests so JAX compiles each operation for few distinct shapes:
# batch 2, Hq = 4 = 2 * Hkv (GQA), E = 6 != Ev = 3, and Lq != Lk both ways.
BATCH, HQ, HKV, E, EV = 2, 4, 2, 6, 3
LENGTHS = ((5, 8), (8, 5))


def inputs(n_queries: int, n_keys: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((BATCH, HQ, n_queries, E)),
        rng.standard_normal((BATCH, HKV, n_keys, E)),
        rng.standard_normal((BATCH, HKV, n_keys, EV)),
    )


def assert_float64_close(actual: np.ndarray, expected: np.ndarray, v: np.ndarray) -> None:
    # Outputs are convex combinations of rows of v, so max|v| is their natural scale.
    scale = max(float(np.max(np.abs(v), initial=0.0)), 1.0)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=FLOAT64_RELATIVE * scale)


MAPS = {
    "elu+1": (elu_plus_one, lambda backend: oracle_linear.elu_plus_one),
    "relu": (relu_features, lambda backend: oracle_linear.relu),
}


def _maps(name: str, backend: Backend) -> tuple[Any, Any]:
    """(reference feature map on ``backend``, NumPy oracle map) for elu+1, relu, FAVOR+."""
    if name == "favor+":
        w = favor_projection(16, E, seed=3, xp=backend.xp, device=backend.device)
        w_np = backend.to_numpy(w)
        return favor_feature_map(w), lambda x: oracle_linear.favor(x, w_np)
    reference_map, oracle_map = MAPS[name]
    return reference_map, oracle_map(backend)


# --- LIN-1.2, LIN-2.1, LIN-4.1 … LIN-4.3: the reference equals the quadratic form -----------


@pytest.mark.parametrize("map_name", ["elu+1", "relu", "favor+"])
@pytest.mark.parametrize("causal", [None, *ALIGNMENTS])
def test_reference_equals_quadratic_form(cpu_backend: Backend, map_name: str, causal) -> None:
    """LIN-1.1, LIN-1.2, LIN-2.1, LIN-4.1, LIN-4.2, LIN-4.3: float64 linear attention equals
    the (masked) quadratic form row-normalised, to ~1e-12, for Lq < Lk and Lq > Lk, GQA and
    both causal alignments (bottom-right with Lq > Lk has rows that see nothing: LIN-1.4)."""
    reference_map, oracle_map = _maps(map_name, cpu_backend)
    for n_queries, n_keys in LENGTHS:
        q, k, v = inputs(n_queries, n_keys)
        out = linear_attention(
            *(cpu_backend.asarray(a, "float64") for a in (q, k, v)),
            feature_map=reference_map,
            is_causal=causal is not None,
            causal_alignment=causal or "top_left",
        )
        expected = oracle_linear.quadratic_form(oracle_map(q), oracle_map(k), v, alignment=causal)
        assert tuple(out.shape) == (BATCH, HQ, n_queries, EV)
        assert_float64_close(cpu_backend.to_numpy(out), expected, v)


def test_batch_dims_broadcast() -> None:
    """LIN-1.1 (batch broadcasting as SDPA-1.2): q with batch (2,), k with batch (1,) and v
    with no batch dim give the batch (2,), equal to the quadratic form on broadcast copies."""
    q, k, v = inputs(*LENGTHS[0], seed=6)
    k, v = k[:1], v[0]
    for causal in (None, "bottom_right"):
        out = linear_attention(
            q,
            k,
            v,
            feature_map=elu_plus_one,
            is_causal=causal is not None,
            causal_alignment=causal or "top_left",
        )
        expected = oracle_linear.quadratic_form(
            oracle_linear.elu_plus_one(q),
            oracle_linear.elu_plus_one(np.broadcast_to(k, (BATCH, *k.shape[1:]))),
            np.broadcast_to(v, (BATCH, *v.shape)),
            alignment=causal,
        )
        assert out.shape == (BATCH, HQ, LENGTHS[0][0], EV)
        assert_float64_close(out, expected, v)


def test_favor_attention_is_linear_attention_with_the_seeded_map(cpu_backend: Backend) -> None:
    """LIN-4.3, LIN-4.5: favor_attention draws one projection from its seed for all batch
    elements and heads and equals linear_attention with that projection's stabilised map."""
    q, k, v = (cpu_backend.asarray(a, "float64") for a in inputs(*LENGTHS[1]))
    w = favor_projection(16, E, seed=3, xp=cpu_backend.xp, device=cpu_backend.device)
    for causal in (None, "bottom_right"):
        options = dict(is_causal=causal is not None, causal_alignment=causal or "top_left")
        out = favor_attention(q, k, v, num_features=16, seed=3, **options)
        expected = linear_attention(q, k, v, feature_map=favor_feature_map(w), **options)
        assert np.array_equal(cpu_backend.to_numpy(out), cpu_backend.to_numpy(expected))


def test_output_dtype_is_q_dtype(cpu_backend: Backend) -> None:
    """LIN-1.1: the output has q's dtype and the layout's shape; the lowest precision each
    backend has (bfloat16, else float16, else float32) is computed in float32 and cast back."""
    dtype = next(d for d in ("bfloat16", "float16", "float32") if d in cpu_backend.dtype_names)
    q, k, v = inputs(*LENGTHS[0])
    out = linear_attention(
        *(cpu_backend.asarray(a, dtype) for a in (q, k, v)),
        feature_map=elu_plus_one,
        is_causal=True,
    )
    assert out.dtype == cpu_backend.dtype(dtype)
    assert tuple(out.shape) == (BATCH, HQ, LENGTHS[0][0], EV)
    assert np.all(np.isfinite(cpu_backend.to_numpy(out)))


def test_zero_denominators_give_zero(cpu_backend: Backend) -> None:
    """LIN-1.4, LIN-4.2: relu features with disjoint supports give D_i = 0 and an output of
    exactly 0 (no NaN), with and without a causal rule, while other rows are unaffected;
    L_k = 0 gives zeros too."""
    q, k, v = inputs(*LENGTHS[0])
    half = E // 2
    # Queries 0 and 2 are positive only where every key is negative: no shared support.
    k[..., :half] = -np.abs(k[..., :half])
    q[:, :, (0, 2), half:] = -np.abs(q[:, :, (0, 2), half:])
    q[:, :, (0, 2), :half] = np.abs(q[:, :, (0, 2), :half]) + 0.1
    k[..., half:] = np.abs(k[..., half:]) + 0.1
    for causal in (False, True):
        out = cpu_backend.to_numpy(
            linear_attention(
                *(cpu_backend.asarray(a, "float64") for a in (q, k, v)),
                feature_map=relu_features,
                is_causal=causal,
            )
        )
        assert np.all(out[:, :, (0, 2)] == 0)
        alignment = "top_left" if causal else None
        expected = oracle_linear.quadratic_form(
            oracle_linear.relu(q), oracle_linear.relu(k), v, alignment=alignment
        )
        assert_float64_close(out, expected, v)
    empty = [cpu_backend.asarray(a, "float64") for a in inputs(LENGTHS[0][0], 0)]
    for causal in (False, True):
        out = linear_attention(*empty, feature_map=elu_plus_one, is_causal=causal)
        assert tuple(out.shape) == (BATCH, HQ, LENGTHS[0][0], EV)
        assert np.all(cpu_backend.to_numpy(out) == 0)


def test_declared_eps_is_in_the_denominator(cpu_backend: Backend) -> None:
    """LIN-3.1, LIN-3.2: eps=0 is the definition; a declared eps gives N / (D + eps)."""
    q, k, v = inputs(*LENGTHS[1])
    arrays = [cpu_backend.asarray(a, "float64") for a in (q, k, v)]
    for causal in (None, "bottom_right"):
        for eps in (0.0, 0.5):
            out = linear_attention(
                *arrays,
                feature_map=elu_plus_one,
                eps=eps,
                is_causal=causal is not None,
                causal_alignment=causal or "top_left",
            )
            expected = oracle_linear.quadratic_form(
                oracle_linear.elu_plus_one(q),
                oracle_linear.elu_plus_one(k),
                v,
                alignment=causal,
                eps=eps,
            )
            assert_float64_close(cpu_backend.to_numpy(out), expected, v)


def test_linear_memory_at_a_length_where_the_quadratic_form_cannot_exist() -> None:
    """LIN-1.5: at L = 200000 the quadratic form needs 200000^2 * 8 bytes = 320 GB; the
    reference's peak allocation (measured with tracemalloc, which sees NumPy's buffers) stays
    O(L F Ev), and its first rows equal the quadratic form on the first keys (LIN-2.1)."""
    length, features, value_dim = 200_000, 2, 2
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, length, features))
    v = rng.standard_normal((1, length, value_dim))
    for causal in (False, True):
        tracemalloc.start()
        out = linear_attention(q, k, v, feature_map=elu_plus_one, is_causal=causal)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        # Inputs and a few (L, F, Ev) or (L, F) temporaries: well under 100 MB, 3000x below A.
        assert peak < 100e6, peak
        if causal:
            head = oracle_linear.quadratic_form(
                oracle_linear.elu_plus_one(q[:, :16]),
                oracle_linear.elu_plus_one(k[:, :16]),
                v[:, :16],
                alignment="top_left",
            )
            assert_float64_close(out[:, :16], head, v)
        assert np.all(np.isfinite(out))


# --- LIN-4.4 … LIN-4.6: the FAVOR+ projection and stabilisers ------------------------------


def test_projection_identical_on_every_backend(cpu_backend: Backend) -> None:
    """LIN-4.5: the same seed gives bit-identical float64 projections on every backend."""
    for orthogonal in (True, False):
        here = favor_projection(
            11, 4, seed=7, orthogonal=orthogonal, xp=cpu_backend.xp, device=cpu_backend.device
        )
        numpy_one = favor_projection(11, 4, seed=7, orthogonal=orthogonal, xp=Backend("numpy").xp)
        assert here.dtype == cpu_backend.xp.float64
        assert np.array_equal(cpu_backend.to_numpy(here), np.asarray(numpy_one))


def test_projection_follows_the_stated_draw_order() -> None:
    """LIN-4.4, LIN-4.5: re-drawing from random.Random(seed) in the order the spec states —
    iid rows; or blocks of E x E gauss draws orthonormalised (QR with a positive diagonal,
    here by NumPy) then m chi norms — reproduces the reference's projection."""
    m, dim, seed = 10, 4, 12
    xp = Backend("numpy").xp
    iid = np.asarray(favor_projection(m, dim, seed=seed, orthogonal=False, xp=xp))
    rng = random.Random(seed)

    def gaussian_rows(rows: int) -> np.ndarray:
        return np.array([[rng.gauss(0.0, 1.0) for _ in range(dim)] for _ in range(rows)])

    assert np.array_equal(iid, gaussian_rows(m))

    w = np.asarray(favor_projection(m, dim, seed=seed, xp=xp))
    rng = random.Random(seed)
    blocks = -(-m // dim)
    directions = []
    for _ in range(blocks):
        qmat, r = np.linalg.qr(gaussian_rows(dim).T)
        directions.append((qmat * np.sign(np.diag(r))).T)  # rows of G orthonormalised in order
    directions = np.concatenate(directions)[:m]
    norms = np.linalg.norm(gaussian_rows(m), axis=1)
    np.testing.assert_allclose(w, norms[:, None] * directions, rtol=0, atol=1e-12)


def test_orthogonal_rows_are_orthogonal_within_each_block() -> None:
    """LIN-4.4: rows of one block of E are orthogonal (the last block truncated), rows of
    different blocks are independent draws, and the norms are not all equal (chi)."""
    m, dim = 13, 5
    w = np.asarray(favor_projection(m, dim, seed=4, xp=Backend("numpy").xp))
    assert w.shape == (m, dim)
    for start in range(0, m, dim):
        block = w[start : start + dim]
        gram = block @ block.T
        off_diagonal = gram - np.diag(np.diag(gram))
        assert np.max(np.abs(off_diagonal)) <= 1e-12 * np.max(np.diag(gram))
    across = w[:dim] @ w[dim : 2 * dim].T
    assert np.max(np.abs(across)) > 1e-3
    assert np.ptp(np.linalg.norm(w, axis=1)) > 1e-3


def test_stabilisers_cancel_and_prevent_underflow(cpu_backend: Backend) -> None:
    """LIN-4.6, LIN-5.2: with the stabilised pair the output equals the unstabilised map's in
    float64 (~1e-12).  In float32 with |q|, |k| ten times larger the unstabilised exponents
    w.x - |x|^2/2 fall below -87, the features underflow to 0 and rows come out 0, while the
    stabilised features stay within the LIN-5.2 bound of the float64 result."""
    w = favor_projection(16, E, seed=5, xp=cpu_backend.xp, device=cpu_backend.device)
    q, k, v = inputs(*LENGTHS[0])
    arrays = [cpu_backend.asarray(a, "float64") for a in (q, k, v)]
    stabilised = linear_attention(*arrays, feature_map=favor_feature_map(w), is_causal=True)
    plain = linear_attention(*arrays, feature_map=lambda x: favor_features(x, w), is_causal=True)
    assert_float64_close(cpu_backend.to_numpy(stabilised), cpu_backend.to_numpy(plain), v)

    low = [cpu_backend.asarray(a, "float32") for a in (10 * q, 10 * k, v)]
    exact = [cpu_backend.to_numpy(a).astype(np.float64) for a in low]  # LIN-5.1 target inputs
    w_np = cpu_backend.to_numpy(w)
    bound = linear_error_bound(
        *exact,
        feature_map=favor_feature_map(w_np),
        dtype="float32",
        feature_error=favor_feature_error(exact[0], exact[1], w_np, dtype="float32"),
    )
    unstable = cpu_backend.to_numpy(
        linear_attention(*low, feature_map=lambda x: favor_features(x, w))
    )
    assert np.any(np.abs(unstable - bound.out) > bound.out_tolerance)
    stable = cpu_backend.to_numpy(linear_attention(*low, feature_map=favor_feature_map(w)))
    assert np.all(np.abs(stable - bound.out) <= bound.out_tolerance)


# --- LIN-2.2, LIN-3.1, LIN-5.2: the accuracy bound --------------------------------------------


def _representable(a: np.ndarray, backend: Backend, dtype: str) -> tuple[Any, np.ndarray]:
    """``a`` rounded to ``dtype`` on ``backend``, and the same values exactly in float64."""
    low = backend.asarray(a, dtype)
    return low, backend.to_numpy(low).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("map_name", ["elu+1", "relu", "favor+"])
def test_reference_in_low_precision_is_within_the_bound(dtype: str, map_name: str) -> None:
    """LIN-5.1, LIN-5.2: the reference computing in float16, bfloat16 and float32 (on torch,
    which has all three) lies within the bound around the float64 formula evaluated on the
    rounded inputs, non-causal and causal in both alignments."""
    torch_backend = backend_or_skip("torch")
    numpy_backend = Backend("numpy")
    reference_map, _ = _maps(map_name, torch_backend)
    bound_map, _ = _maps(map_name, numpy_backend)
    q, k, v = inputs(*LENGTHS[1], seed=2)
    (q_low, q64), (k_low, k64), (v_low, v64) = (
        _representable(a, torch_backend, dtype) for a in (q, k, v)
    )
    feature_error = None
    if map_name == "favor+":
        w = np.asarray(favor_projection(16, E, seed=3, xp=numpy_backend.xp))
        feature_error = favor_feature_error(q64, k64, w, dtype=dtype)
    for causal in (None, *ALIGNMENTS):
        options = dict(is_causal=causal is not None, causal_alignment=causal or "top_left")
        out = torch_backend.to_numpy(
            linear_attention(q_low, k_low, v_low, feature_map=reference_map, **options)
        ).astype(np.float64)
        bound = linear_error_bound(
            q64,
            k64,
            v64,
            feature_map=bound_map,
            dtype=dtype,
            feature_error=feature_error,
            **options,
        )
        assert np.all(np.abs(out - bound.out) <= bound.out_tolerance)


def test_float64_evaluation_orders_agree_within_the_bound() -> None:
    """LIN-5.2: in float64 the quadratic form (a different summation order: the full A, then
    row sums) lies within the bound around the reference's prefix-sum evaluation."""
    q, k, v = inputs(*LENGTHS[0], seed=3)
    for causal in (None, *ALIGNMENTS):
        bound = linear_error_bound(
            q,
            k,
            v,
            feature_map=elu_plus_one,
            dtype="float64",
            is_causal=causal is not None,
            causal_alignment=causal or "top_left",
        )
        other = oracle_linear.quadratic_form(
            oracle_linear.elu_plus_one(q), oracle_linear.elu_plus_one(k), v, alignment=causal
        )
        assert np.all(np.abs(other - bound.out) <= bound.out_tolerance)


def test_an_undeclared_eps_is_outside_the_bound() -> None:
    """LIN-3.1, LIN-3.2: with small features (elu+1 of inputs near -6, D ~ 1e-3) the
    pytorch-fast-transformers eps of 1e-6, undeclared, moves float32 outputs by ~1e-3
    relative, far outside the bound; declared, the same kernel is inside it."""
    torch_backend = backend_or_skip("torch")
    q, k, v = inputs(*LENGTHS[0], seed=4)
    (q_low, q64), (k_low, k64), (v_low, v64) = (
        _representable(a, torch_backend, "float32") for a in (q - 6, k - 6, v)
    )
    out = torch_backend.to_numpy(
        linear_attention(q_low, k_low, v_low, feature_map=elu_plus_one, eps=1e-6)
    )
    undeclared = linear_error_bound(q64, k64, v64, feature_map=elu_plus_one, dtype="float32")
    assert np.any(np.abs(out - undeclared.out) > 10 * undeclared.out_tolerance)
    declared = linear_error_bound(
        q64, k64, v64, feature_map=elu_plus_one, dtype="float32", eps=1e-6
    )
    assert np.all(np.abs(out - declared.out) <= declared.out_tolerance)


def test_later_keys_change_earlier_rows_by_rounding_only(cpu_backend: Backend) -> None:
    """LIN-2.2: with FAVOR+ (whose key stabiliser is a maximum over all keys of the head),
    changing the keys and values after the causal boundary of the first rows changes those
    rows by no more than the float64 bound of LIN-5.2."""
    w = favor_projection(16, E, seed=6, xp=cpu_backend.xp, device=cpu_backend.device)
    feature_map = favor_feature_map(w)
    q, k, v = inputs(*LENGTHS[0], seed=5)
    changed_k, changed_v = k.copy(), v.copy()
    boundary = 3  # top-left: rows 0..2 see keys 0..2 only
    changed_k[..., boundary:, :] = 3 * k[..., boundary:, :] + 1  # larger: moves the maximum
    changed_v[..., boundary:, :] = -v[..., boundary:, :]
    outs = [
        cpu_backend.to_numpy(
            linear_attention(
                *(cpu_backend.asarray(a, "float64") for a in arrays),
                feature_map=feature_map,
                is_causal=True,
            )
        )
        for arrays in ((q, k, v), (q, changed_k, changed_v))
    ]
    bound = linear_error_bound(
        q,
        k,
        v,
        feature_map=favor_feature_map(cpu_backend.to_numpy(w)),
        dtype="float64",
        is_causal=True,
    )
    head = slice(0, boundary)
    assert np.all(
        np.abs(outs[1][..., head, :] - outs[0][..., head, :]) <= bound.out_tolerance[..., head, :]
    )
    assert not np.allclose(outs[1][..., boundary:, :], outs[0][..., boundary:, :])


# --- bad input ---------------------------------------------------------------------------------


def _negative(x: Any) -> Any:
    return x - 10


def _drop_row(x: Any) -> Any:
    return elu_plus_one(x)[..., 1:, :]


def _wider(x: Any) -> Any:
    import array_api_compat

    xp = array_api_compat.array_namespace(x)
    return xp.concat([elu_plus_one(x), elu_plus_one(x)], axis=-1)


BAD_CALLS = {
    "feature_map not callable": (dict(feature_map="elu"), TypeError, "feature_map="),
    "negative features": (dict(feature_map=_negative), ValueError, "features >= 0 [LIN-1.3"),
    "map changes the length": (dict(feature_map=_drop_row), ValueError, "only change the last"),
    "query and key widths differ": (
        dict(feature_map=(elu_plus_one, _wider)),
        ValueError,
        "same number [LIN-1.1",
    ),
    "eps negative": (dict(eps=-1e-6), ValueError, "eps=-1e-06"),
    "eps nan": (dict(eps=float("nan")), ValueError, "eps=nan"),
    "eps bool": (dict(eps=True), TypeError, "eps=True"),
    "is_causal not bool": (dict(is_causal=1), TypeError, "is_causal=1"),
    "unknown alignment": (
        dict(is_causal=True, causal_alignment="lower_right"),
        ValueError,
        "causal_alignment='lower_right'",
    ),
}


@pytest.mark.parametrize("case", BAD_CALLS, ids=list(BAD_CALLS))
def test_bad_arguments_raise_naming_the_argument(case: str) -> None:
    """LIN-1.1, LIN-1.3, LIN-3.2: bad arguments raise TypeError/ValueError that name the
    argument, the value and what was expected."""
    overrides, error, message = BAD_CALLS[case]
    q, k, v = inputs(*LENGTHS[0])
    kwargs = {"feature_map": elu_plus_one, **overrides}
    with pytest.raises(error, match=re.escape(message)):
        linear_attention(q, k, v, **kwargs)


def test_bad_shapes_and_dtypes_raise_naming_the_argument() -> None:
    """LIN-1.1 (layout and dtypes as SDPA-1.1, SDPA-1.4, SDPA-6.2): mismatched head dims,
    indivisible heads and integer inputs are errors naming the argument."""
    q, k, v = inputs(*LENGTHS[0])
    with pytest.raises(ValueError, match=r"k\.shape\[-1\]=5"):
        linear_attention(q, k[..., :5], v, feature_map=elu_plus_one)
    with pytest.raises(ValueError, match="whole multiple"):
        linear_attention(q[:, :3], k, v, feature_map=elu_plus_one)
    with pytest.raises(TypeError, match=r"q\.dtype=int64"):
        linear_attention(q.astype(np.int64), k, v, feature_map=elu_plus_one)


def test_favor_and_bound_arguments_are_checked() -> None:
    """LIN-4.3, LIN-4.5, LIN-5.2: projection sizes, seeds and dtypes are validated."""
    xp = Backend("numpy").xp
    with pytest.raises(ValueError, match="num_features=0"):
        favor_projection(0, 4, seed=0, xp=xp)
    with pytest.raises(TypeError, match=r"head_dim=2\.5"):
        favor_projection(4, 2.5, seed=0, xp=xp)
    with pytest.raises(ValueError, match="seed=-1"):
        favor_projection(4, 4, seed=-1, xp=xp)
    with pytest.raises(TypeError, match="orthogonal=1"):
        favor_projection(4, 4, seed=0, orthogonal=1, xp=xp)
    q, k, v = inputs(*LENGTHS[0])
    w = favor_projection(8, E + 1, seed=0, xp=xp)
    with pytest.raises(ValueError, match=r"projection\.shape=\(8, 7\)"):
        linear_attention(q, k, v, feature_map=favor_feature_map(w))
    with pytest.raises(ValueError, match="num_features >= 1"):
        favor_feature_map(w[0])
    with pytest.raises(ValueError, match="dtype='half'"):
        linear_error_bound(q, k, v, feature_map=elu_plus_one, dtype="half")
    with pytest.raises(TypeError, match="should be float64"):
        linear_error_bound(
            *(a.astype(np.float32) for a in (q, k, v)), feature_map=elu_plus_one, dtype="float32"
        )
    with pytest.raises(ValueError, match="num_features=0"):
        favor_attention(q, k, v, num_features=0, seed=0)
