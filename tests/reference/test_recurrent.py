"""The recurrences of spec/recurrent.md against the independent float64 oracle, on every backend.

Both of the reference's forms, the token recurrence (REC-1.2) and the chunked WY / UT form
(REC-5.1), are compared with ``tests/oracle_recurrent.py`` (one head and one token at a time,
plain NumPy) on NumPy, PyTorch, JAX and array-api-strict, for the four rules, per-head and
per-key-channel gates, both directions of head sharing, packed sequences, and the dtypes the
spec fixes; bad input raises an error that names the argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle_recurrent
import pytest
from recurrent_problems import arrays_of, recurrent_problem

from attnspec.backends import Backend
from attnspec.reference.recurrent import recurrent_attention, varlen_recurrent_attention
from attnspec.reference.recurrent.tolerance import recurrent_error_bound

RULES = ("linear", "gated", "delta", "gated_delta")
# (Hq, Hk, Hv): plain, grouped queries (ONNX), grouped values (flash-linear-attention), both
SHARINGS = [(2, 2, 2), (4, 2, 2), (2, 2, 4), (4, 1, 2)]
# Every test not about the length runs T = 9 tokens (B = 2, dk = dv = 8, the problems'
# default heads where sharing is not the point): JAX compiles each operation once per shape,
# so the tests after the first reuse its compilations (issue 33: 420 -> 388 on JAX).


def _on(backend: Backend, problem: dict[str, Any], dtype: str = "float64") -> dict[str, Any]:
    moved = dict(problem)
    for name, a in arrays_of(problem).items():
        moved[name] = backend.asarray(a, dtype)
    return moved


def _numpy(backend: Backend, a: Any) -> np.ndarray:
    return np.asarray(backend.to_numpy(a), dtype=np.float64)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_both_forms_match_the_oracle_on_every_backend(
    cpu_backend: Backend, rule: str, chunk_size: int | None
) -> None:
    """REC-1.2, REC-1.5, REC-2.1, REC-5.1: output and final state of the four rules, per-head
    and per-channel gates, from a past state, in both forms, equal the oracle to ~1e-12.  A
    backend that compiles every new shape (JAX: ~10 s per rule's chunked shapes on 2 cores)
    runs the chunked form for gated_delta only; the other rules' chunked forms, which only
    leave out the gate or the correction, run on NumPy, PyTorch and array-api-strict."""
    if chunk_size is not None and rule != "gated_delta" and cpu_backend.compiles_per_shape:
        pytest.skip("a compiling backend runs only gated_delta's chunked form (cost)")
    rng = np.random.default_rng(len(rule) + (chunk_size or 0))
    for per_channel in (False, True):
        problem = recurrent_problem(rng, rule=rule, length=9, per_channel=per_channel)
        want_out, want_state = oracle_recurrent.recurrence(**problem)
        got = recurrent_attention(**_on(cpu_backend, problem), chunk_size=chunk_size)
        np.testing.assert_allclose(_numpy(cpu_backend, got.out), want_out, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(
            _numpy(cpu_backend, got.final_state), want_state, rtol=1e-11, atol=1e-11
        )


@pytest.mark.parametrize("heads", SHARINGS, ids=lambda h: f"q{h[0]}-k{h[1]}-v{h[2]}")
def test_head_sharing_in_both_directions(cpu_backend: Backend, heads: tuple[int, int, int]) -> None:
    """REC-3.1: Hs = max(Hk, Hv) states and Ho = max(Hq, Hs) output heads, query groups
    (ONNX) and value groups (flash-linear-attention), token by token (the chunked form's
    sharing: test_recurrent_properties.py, on NumPy and array-api-strict, where a new shape
    costs no compilation)."""
    rng = np.random.default_rng(sum(heads))
    problem = recurrent_problem(rng, rule="gated_delta", length=9, heads=heads, per_channel=True)
    want_out, want_state = oracle_recurrent.recurrence(**problem)
    got = recurrent_attention(**_on(cpu_backend, problem))
    assert tuple(got.out.shape) == want_out.shape == (2, max(heads), 9, 8)
    assert tuple(got.final_state.shape) == want_state.shape == (2, max(heads[1:]), 8, 8)
    np.testing.assert_allclose(_numpy(cpu_backend, got.out), want_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(
        _numpy(cpu_backend, got.final_state), want_state, rtol=1e-11, atol=1e-11
    )


def test_query_groups_read_one_state_as_if_repeated(cpu_backend: Backend) -> None:
    """REC-3.1: with Hq = 2 Hkv, output head h equals a run with the state's inputs repeated so
    that query head h has its own copy (ONNX's np.repeat of the state)."""
    rng = np.random.default_rng(7)
    problem = recurrent_problem(rng, rule="gated_delta", length=9, heads=(4, 2, 2))
    repeated = dict(problem)
    for name in ("k", "v", "g", "beta", "initial_state"):
        repeated[name] = np.repeat(problem[name], 2, axis=1)
    shared = recurrent_attention(**_on(cpu_backend, problem))
    copied = recurrent_attention(**_on(cpu_backend, repeated))
    np.testing.assert_allclose(
        _numpy(cpu_backend, shared.out), _numpy(cpu_backend, copied.out), rtol=1e-12, atol=1e-12
    )


def test_without_past_state_the_state_starts_at_zero(cpu_backend: Backend) -> None:
    """REC-2.2: no past state is a zero state; T = 0 returns the past state unchanged."""
    rng = np.random.default_rng(3)
    problem = recurrent_problem(rng, rule="delta", length=9, with_state=False)
    zero = dict(problem, initial_state=np.zeros((2, 2, 8, 8)))
    a = recurrent_attention(**_on(cpu_backend, problem))
    b = recurrent_attention(**_on(cpu_backend, zero))
    np.testing.assert_array_equal(_numpy(cpu_backend, a.out), _numpy(cpu_backend, b.out))
    empty = recurrent_problem(rng, rule="gated_delta", length=0)
    for chunk_size in (None, 4):
        got = recurrent_attention(**_on(cpu_backend, empty), chunk_size=chunk_size)
        assert tuple(got.out.shape) == (2, 2, 0, 8)
        np.testing.assert_array_equal(_numpy(cpu_backend, got.final_state), empty["initial_state"])


def test_default_and_explicit_scale(cpu_backend: Backend) -> None:
    """REC-2.3: the default scale is dk^-1/2; an explicit scale, 0 included, multiplies the
    output."""
    rng = np.random.default_rng(4)
    problem = recurrent_problem(rng, rule="gated", length=9, d_k=9)
    default = _numpy(cpu_backend, recurrent_attention(**_on(cpu_backend, problem)).out)
    one = _numpy(cpu_backend, recurrent_attention(**_on(cpu_backend, problem), scale=1.0).out)
    zero = _numpy(cpu_backend, recurrent_attention(**_on(cpu_backend, problem), scale=0.0).out)
    np.testing.assert_allclose(default, one / 3.0, rtol=1e-13, atol=1e-14)
    assert np.all(zero == 0)


def test_l2_normalisation_is_a_declared_step(cpu_backend: Backend) -> None:
    """REC-2.4: normalize_qk compares with the recurrence on q/sqrt(|q|^2+eps), k likewise;
    without it q and k are used as given (keys of norm 3 give a different result)."""
    rng = np.random.default_rng(5)
    problem = recurrent_problem(rng, rule="gated_delta", length=9, unit_keys=False)
    want_out, want_state = oracle_recurrent.recurrence(**problem, normalize_qk=True, norm_eps=1e-6)
    got = recurrent_attention(**_on(cpu_backend, problem), normalize_qk=True, norm_eps=1e-6)
    np.testing.assert_allclose(_numpy(cpu_backend, got.out), want_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(
        _numpy(cpu_backend, got.final_state), want_state, rtol=1e-11, atol=1e-11
    )
    raw_out, _ = oracle_recurrent.recurrence(**problem)
    assert np.max(np.abs(raw_out - want_out)) > 0.1


def test_packed_sequences_are_separate_runs(cpu_backend: Backend) -> None:
    """REC-3.3: each packed sequence (an empty one included) is its own run from its own past
    state; the final states are (N, Hs, dk, dv) (chunked: test_recurrent_properties.py)."""
    rng = np.random.default_rng(6)
    lengths = [9, 0, 4, 1]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    runs = [
        recurrent_problem(rng, rule="gated_delta", length=n, heads=(4, 2, 2), batch=(1,))
        for n in lengths
    ]

    def packed(name: str) -> np.ndarray:
        return np.concatenate([np.moveaxis(r[name][0], 0, 1) for r in runs], axis=0)

    states = np.stack([r["initial_state"][0] for r in runs])
    inputs = {
        name: cpu_backend.asarray(packed(name), "float64") for name in ("q", "k", "v", "g", "beta")
    }
    got = varlen_recurrent_attention(
        **inputs,
        cu_seqlens=cpu_backend.asarray(offsets),
        initial_state=cpu_backend.asarray(states, "float64"),
        rule="gated_delta",
    )
    assert tuple(got.out.shape) == (sum(lengths), 4, 8)
    assert tuple(got.final_state.shape) == (4, 2, 8, 8)
    out, final = _numpy(cpu_backend, got.out), _numpy(cpu_backend, got.final_state)
    for b, run in enumerate(runs):
        want_out, want_state = oracle_recurrent.recurrence(**run)
        rows = out[offsets[b] : offsets[b + 1]]
        np.testing.assert_allclose(np.moveaxis(rows, 0, 1), want_out[0], rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(final[b], want_state[0], rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("low", ["float16", "bfloat16", "float32"])
def test_output_has_q_dtype_and_the_state_float32(cpu_backend: Backend, low: str) -> None:
    """REC-4.1, REC-4.2, REC-4.3: half and single precision inputs give the output in q's
    dtype and the final state in float32 (the carried state's dtype), within REC-6.2's bound
    of the float64 run on the same (rounded) values (the chunked form in low precision:
    test_recurrent_tolerance.py)."""
    if low not in cpu_backend.dtype_names:
        pytest.skip(f"{cpu_backend.name} has no {low}")
    rng = np.random.default_rng(8)
    problem = recurrent_problem(rng, rule="gated_delta", length=9, per_channel=True)
    moved = _on(cpu_backend, problem, low)
    exact = {name: _numpy(cpu_backend, moved[name]) for name in arrays_of(problem)}
    got = recurrent_attention(**moved)
    assert got.out.dtype == cpu_backend.dtype(low)
    assert got.final_state.dtype == cpu_backend.dtype("float32")
    bound = recurrent_error_bound(**dict(problem, **exact), dtype=low)  # REC-6.2
    for result, want, tolerance in (
        (got.out, bound.out, bound.out_tolerance),
        (got.final_state, bound.final_state, bound.final_state_tolerance),
    ):
        assert np.all(np.abs(_numpy(cpu_backend, result) - want) <= tolerance)
    float64_state = recurrent_attention(**_on(cpu_backend, problem)).final_state
    assert float64_state.dtype == cpu_backend.xp.float64


BAD_INPUTS = [
    ({"rule": "mamba"}, ValueError, "rule='mamba'"),
    ({"g": None}, ValueError, "g is None"),
    ({"rule": "delta"}, ValueError, "g was given"),
    ({"rule": "gated"}, ValueError, "beta was given"),
    ({"g": np.zeros((2, 2, 9, 3))}, ValueError, "g.shape"),
    ({"beta": np.zeros((2, 2, 8))}, ValueError, "beta.shape"),
    ({"initial_state": np.zeros((2, 2, 8, 7))}, ValueError, "initial_state.shape"),
    ({"k": np.zeros((2, 3, 9, 8))}, ValueError, "v has 2 heads"),
    ({"q": np.zeros((2, 3, 9, 8))}, ValueError, "Ho=3"),
    ({"v": np.zeros((2, 2, 8, 8))}, ValueError, "v.shape"),
    ({"q": np.zeros((9, 8))}, ValueError, "q.shape"),
    ({"q": np.zeros((2, 2, 9, 8), dtype=np.int32)}, TypeError, "q.dtype"),
    ({"chunk_size": 0}, ValueError, "chunk_size=0"),
    ({"scale": float("nan")}, ValueError, "scale=nan"),
    ({"norm_eps": -1.0}, ValueError, "norm_eps=-1.0"),
    ({"normalize_qk": 1}, TypeError, "normalize_qk=1"),
]


@pytest.mark.parametrize(("change", "error", "named"), BAD_INPUTS, ids=[b[2] for b in BAD_INPUTS])
def test_bad_input_names_the_argument(change: dict[str, Any], error: type, named: str) -> None:
    """REC-1.1 … REC-4.1: bad input raises ValueError/TypeError naming the argument and the
    clause it violates."""
    rng = np.random.default_rng(9)
    problem = dict(recurrent_problem(rng, rule="gated_delta", length=9), **change)
    with pytest.raises(error, match=r"\[REC-") as raised:
        recurrent_attention(**problem)
    assert named in str(raised.value)
