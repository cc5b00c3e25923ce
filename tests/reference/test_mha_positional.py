"""Multi-head attention (MHA-1, MHA-2) and position encodings (POS-1, ROPE-1, ROPE-2)
against the independent oracle and closed forms, on every CPU backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle
import pytest

from attnspec.backends import Backend
from attnspec.reference.mha import multi_head_attention
from attnspec.reference.positional import apply_rope, sinusoidal_positional_encoding
from attnspec.reference.tolerance import UNIT_ROUNDOFF, accumulation_roundoff

FLOAT64_RELATIVE = 1e-12
U64 = UNIT_ROUNDOFF["float64"]


def as64(backend: Backend, a: Any) -> np.ndarray:
    return np.asarray(backend.to_numpy(a), dtype=np.float64)


# --- multi-head attention ----------------------------------------------------------------


def mha_problem(seed: int, *, cross: bool, num_heads: int, num_kv_heads: int) -> dict[str, Any]:
    """x (2, 5, 12) and, for cross-attention, y (2, 7, 10); E = 3, Ev = 2, d_out = 7."""
    rng = np.random.default_rng(seed)
    d_kv = 10 if cross else 12
    problem: dict[str, Any] = {
        "x": rng.standard_normal((2, 5, 12)),
        "w_q": rng.standard_normal((12, num_heads * 3)),
        "w_k": rng.standard_normal((d_kv, num_kv_heads * 3)),
        "w_v": rng.standard_normal((d_kv, num_kv_heads * 2)),
        "w_o": rng.standard_normal((num_heads * 2, 7)),
        "b_q": rng.standard_normal(num_heads * 3),
        "b_v": rng.standard_normal(num_kv_heads * 2),
        "b_o": rng.standard_normal(7),
    }
    if cross:
        problem["y"] = rng.standard_normal((2, 7, d_kv))
    return problem


def run_mha(
    backend: Backend, problem: dict[str, Any], dtype: str = "float64", **options: Any
) -> tuple[np.ndarray, np.ndarray]:
    arrays = {n: backend.asarray(a, dtype=dtype) for n, a in problem.items()}
    for name in ("mask", "bias"):
        if name in options and not isinstance(options[name], type(arrays["x"])):
            options[name] = backend.asarray(options[name], dtype=None if name == "mask" else dtype)
    out, weights = multi_head_attention(**arrays, **options, return_weights=True)
    return out, weights


def assert_close_float64(got: np.ndarray, expected: np.ndarray) -> None:
    scale = np.max(np.abs(expected), initial=1.0)
    assert np.all(np.abs(got - expected) <= FLOAT64_RELATIVE * scale)


def test_mha_self_attention_matches_oracle(cpu_backend: Backend) -> None:
    """MHA-1, MHA-2 (self: y = x): projections with biases, 4 heads, concat, W_O."""
    problem = mha_problem(0, cross=False, num_heads=4, num_kv_heads=4)
    out, weights = run_mha(cpu_backend, problem, num_heads=4, is_causal=True)
    expected, expected_weights = oracle.mha(**problem, num_heads=4, is_causal=True)
    assert tuple(out.shape) == (2, 5, 7) and tuple(weights.shape) == (2, 4, 5, 5)
    assert_close_float64(as64(cpu_backend, out), expected)
    assert_close_float64(as64(cpu_backend, weights), expected_weights)


def test_mha_cross_attention_gqa_matches_oracle(cpu_backend: Backend) -> None:
    """MHA-2, MHA-1, SDPA-6.1: cross-attention Lq=5 != Lk=7, d_kv != d_model, 4 query
    heads on 2 key/value heads, mask + bias + bottom-right causal + explicit scale."""
    problem = mha_problem(1, cross=True, num_heads=4, num_kv_heads=2)
    rng = np.random.default_rng(2)
    options = {
        "mask": rng.random((2, 1, 5, 7)) < 0.7,
        "bias": rng.standard_normal((4, 5, 7)),
        "is_causal": True,
        "causal_alignment": "bottom_right",
        "scale": 0.3,
    }
    out, weights = run_mha(cpu_backend, problem, num_heads=4, num_kv_heads=2, **options)
    expected, expected_weights = oracle.mha(**problem, num_heads=4, num_kv_heads=2, **options)
    assert tuple(out.shape) == (2, 5, 7) and tuple(weights.shape) == (2, 4, 5, 7)
    assert_close_float64(as64(cpu_backend, out), expected)
    assert_close_float64(as64(cpu_backend, weights), expected_weights)


def test_mha_gqa_equals_repeated_heads() -> None:
    """SDPA-6.1 in MHA-1: 4 query heads on 2 key/value heads equal 4 full heads whose
    K/V projections repeat key/value head g for query heads 2g and 2g+1 (h // G)."""
    problem = mha_problem(3, cross=True, num_heads=4, num_kv_heads=2)
    grouped, _ = run_mha(Backend("numpy"), problem, num_heads=4, num_kv_heads=2)
    repeated = dict(problem)
    for name, width in (("w_k", 3), ("w_v", 2), ("b_v", 2)):
        columns = [problem[name][..., g * width : (g + 1) * width] for g in (0, 0, 1, 1)]
        repeated[name] = np.concatenate(columns, axis=-1)
    full, _ = run_mha(Backend("numpy"), repeated, num_heads=4)
    assert_close_float64(np.asarray(grouped), np.asarray(full))


def test_mha_self_is_cross_with_y_equal_x() -> None:
    """MHA-2: y=None is self-attention, the same as passing y = x."""
    problem = mha_problem(4, cross=False, num_heads=2, num_kv_heads=1)
    alone, _ = run_mha(Backend("numpy"), problem, num_heads=2, num_kv_heads=1)
    crossed, _ = run_mha(
        Backend("numpy"), {**problem, "y": problem["x"]}, num_heads=2, num_kv_heads=1
    )
    assert np.array_equal(np.asarray(alone), np.asarray(crossed))


def test_mha_keeps_dtype(cpu_backend: Backend) -> None:
    """MHA-1 with SDPA-1.3: output and weights come back in x's dtype, for every dtype."""
    problem = mha_problem(1, cross=True, num_heads=4, num_kv_heads=2)
    for dtype in cpu_backend.dtype_names:
        out, weights = run_mha(cpu_backend, problem, dtype=dtype, num_heads=4, num_kv_heads=2)
        assert out.dtype == weights.dtype == cpu_backend.dtype(dtype), dtype
        assert np.all(np.isfinite(as64(cpu_backend, out))), dtype


# --- sinusoidal positional encoding ---------------------------------------------------

PE_SIZES = [(0, 4), (9, 1), (9, 5), (9, 8)]  # n = 9 shared: each shape costs JAX compiles


def test_sinusoidal_matches_oracle(cpu_backend: Backend) -> None:
    """POS-1: the table equals the oracle's entry-by-entry definition (odd d, d = 1, n = 0
    included) in float64, and every other dtype within its rounding of that value."""
    for n, d in PE_SIZES:
        expected = oracle.sinusoidal(n, d)
        # Angles are at most n; their float64 error is ~n*u, the sin/cos error ~u.
        float64_error = (n + 4) * U64
        for dtype in cpu_backend.dtype_names:
            table = sinusoidal_positional_encoding(
                n, d, dtype=dtype, xp=cpu_backend.xp, device=cpu_backend.device
            )
            assert table.dtype == cpu_backend.dtype(dtype) and tuple(table.shape) == (n, d)
            rounding = UNIT_ROUNDOFF[dtype] * np.abs(expected) if dtype != "float64" else 0
            assert np.all(np.abs(as64(cpu_backend, table) - expected) <= rounding + float64_error)


def test_sinusoidal_closed_form(cpu_backend: Backend) -> None:
    """POS-1: with base 10000 and d = 5, columns are sin p, cos p, sin(p/10000^(2/5)),
    cos(p/10000^(2/5)), and the odd last column sin(p/10000^(4/5)); row 0 is 0,1,0,1,0."""
    n = 9
    table = as64(
        cpu_backend,
        sinusoidal_positional_encoding(
            n, 5, dtype="float64", xp=cpu_backend.xp, device=cpu_backend.device
        ),
    )
    p = np.arange(n, dtype=np.float64)
    slow, slowest = 10000.0 ** (2 / 5), 10000.0 ** (4 / 5)
    expected = np.stack(
        [np.sin(p), np.cos(p), np.sin(p / slow), np.cos(p / slow), np.sin(p / slowest)], axis=1
    )
    assert np.all(np.abs(table - expected) <= (n + 4) * U64)
    assert np.array_equal(table[0], [0.0, 1.0, 0.0, 1.0, 0.0])


def test_sinusoidal_base(cpu_backend: Backend) -> None:
    """POS-1: ``base`` replaces 10000: with base 100 and d = 4, column 2 is sin(p/10)."""
    table = as64(
        cpu_backend,
        sinusoidal_positional_encoding(
            9, 4, base=100.0, dtype="float64", xp=cpu_backend.xp, device=cpu_backend.device
        ),
    )
    assert np.all(np.abs(table[:, 2] - np.sin(np.arange(9) / 10.0)) <= 13 * U64)


# --- rotary position embedding ----------------------------------------------------------


def pair_magnitude(x: np.ndarray, layout: str) -> np.ndarray:
    """|a| + |b| of the feature pair each feature belongs to (ROPE-1 pairing)."""
    half = x.shape[-1] // 2
    if layout == "interleaved":
        pairs = np.abs(x[..., 0::2]) + np.abs(x[..., 1::2])
        return np.repeat(pairs, 2, axis=-1)
    pairs = np.abs(x[..., :half]) + np.abs(x[..., half:])
    return np.concatenate([pairs, pairs], axis=-1)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_matches_oracle(cpu_backend: Backend, layout: str) -> None:
    """ROPE-1: both layouts equal the oracle with default positions and with per-sequence
    integer positions (B, 1, L); float64 to 1e-12, other dtypes within the rounding of
    one rotation (cos/sin, two products and a sum in the work dtype, then the cast)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 6, 8))
    starts = np.array([0, 90])[:, None, None] + np.arange(6)  # (2, 1, 6)
    positions_b = cpu_backend.asarray(starts)
    for dtype in cpu_backend.dtype_names:
        xb = cpu_backend.asarray(x, dtype=dtype)
        seen = as64(cpu_backend, xb)
        for positions, given in ((None, None), (positions_b, starts)):
            out = apply_rope(xb, positions, layout=layout)
            assert out.dtype == xb.dtype and tuple(out.shape) == x.shape, dtype
            expected = oracle.rope(seen, given, layout=layout)
            got = as64(cpu_backend, out)
            if dtype == "float64":
                assert np.all(np.abs(got - expected) <= FLOAT64_RELATIVE * np.max(np.abs(x)))
                continue
            u_work = accumulation_roundoff(dtype)
            tol = 4 * u_work * pair_magnitude(seen, layout) + UNIT_ROUNDOFF[dtype] * np.abs(
                expected
            )
            assert np.all(np.abs(got - expected) <= tol), (dtype, layout)


def test_rope_default_positions_are_arange(cpu_backend: Backend) -> None:
    """ROPE-1: positions=None means 0..L-1."""
    x = cpu_backend.asarray(np.random.default_rng(7).standard_normal((3, 6, 8)), "float64")
    explicit = apply_rope(x, cpu_backend.asarray(np.arange(6)))
    assert np.array_equal(as64(cpu_backend, apply_rope(x)), as64(cpu_backend, explicit))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_relative_property(cpu_backend: Backend, layout: str) -> None:
    """ROPE-2: <RoPE(q, m), RoPE(k, n)> depends only on m - n: shifting both positions
    by t changes the dot product by no more than the rounding of the two rotations
    (angle error ~ u*p, sin/cos/product error ~ u per component) and of the dot."""
    rng = np.random.default_rng(8)
    d = 8
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    m = np.array([0, 3, 17, 40])
    n = np.array([0, 9, 2, 40])
    shifts = np.array([5, 1, 60, 33])
    positions_q = np.concatenate([m, m + shifts])
    positions_k = np.concatenate([n, n + shifts])
    rows = len(positions_q)
    for dtype in ("float32", "float64"):
        qs = cpu_backend.asarray(np.tile(q, (rows, 1)), dtype=dtype)
        ks = cpu_backend.asarray(np.tile(k, (rows, 1)), dtype=dtype)
        rq = as64(cpu_backend, apply_rope(qs, cpu_backend.asarray(positions_q), layout=layout))
        rk = as64(cpu_backend, apply_rope(ks, cpu_backend.asarray(positions_k), layout=layout))
        dots = np.sum(rq * rk, axis=-1)
        u = UNIT_ROUNDOFF[dtype]
        p_max = max(positions_q.max(), positions_k.max())
        per_dot = (8 + 2 * p_max * U64 / u + d) * u * np.sum(np.abs(q)) * np.sum(np.abs(k))
        assert np.all(np.abs(dots[:4] - dots[4:]) <= 2 * per_dot), (dtype, layout)
        # The property is not vacuous: other offsets m - n give other products.
        assert np.ptp(dots[:4]) > 100 * per_dot
