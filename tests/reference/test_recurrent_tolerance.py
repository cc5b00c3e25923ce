"""The bound of REC-6.2 (``attnspec.reference.recurrent.tolerance``): sound, useful, and sharp
enough to catch the bugs it exists for.

Correct implementations in float16, bfloat16 and float32 (the reference's two forms, run on
PyTorch, and a kernel that rounds its product operands to the input dtype, as
flash-linear-attention's Triton kernels do, under that declaration) stay within it; it is
non-vacuous at T = 8192 on flash-linear-attention's own test inputs and no looser there than
that project's RMS-ratio rule plus the output's rounding; a state kept in bfloat16
(ollama #15865) and an incomplete last chunk padded with positions that still decay the state
(transformers #46190) fail it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from recurrent_problems import recurrent_problem
from support import backend_or_skip

from attnspec.backends import Backend
from attnspec.reference.recurrent import recurrent_attention
from attnspec.reference.recurrent.tolerance import recurrent_error_bound
from attnspec.reference.tolerance import UNIT_ROUNDOFF

RULES = ("linear", "gated", "delta", "gated_delta")


def _fla_inputs(
    rng: np.random.Generator, rule: str, length: int, d: int, normalizer: float, heads: int = 2
) -> dict[str, Any]:
    """flash-linear-attention's test distribution: q, k uniform in [0, 1) then L2-normalised,
    v normal, g = logsigmoid(U) / normalizer, beta = sigmoid(U)."""
    q, k = rng.random((1, heads, length, d)), rng.random((1, heads, length, d))
    problem: dict[str, Any] = {
        "q": q / np.linalg.norm(q, axis=-1, keepdims=True),
        "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
        "v": rng.standard_normal((1, heads, length, d)),
        "rule": rule,
    }
    if rule in ("gated", "gated_delta"):
        problem["g"] = -np.log1p(np.exp(-rng.random((1, heads, length)))) / normalizer
    if rule in ("delta", "gated_delta"):
        problem["beta"] = 1.0 / (1.0 + np.exp(-rng.random((1, heads, length))))
    return problem


def _rounded(
    backend: Backend, problem: dict[str, Any], dtype: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The problem as ``dtype`` arrays on ``backend``, and the same values exactly in float64."""
    low, exact = dict(problem), dict(problem)
    for name, a in problem.items():
        if isinstance(a, np.ndarray):
            low[name] = backend.asarray(a, dtype)
            exact[name] = np.asarray(backend.to_numpy(low[name]), dtype=np.float64)
    return low, exact


def _excess(backend: Backend, got: Any, want: np.ndarray, tolerance: np.ndarray) -> float:
    """The largest |error| / tolerance (> 1: outside the bound)."""
    error = np.abs(np.asarray(backend.to_numpy(got), dtype=np.float64) - np.asarray(want))
    return float(np.max(error / np.asarray(tolerance)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("rule", RULES)
def test_correct_implementations_are_within_the_bound(dtype: str, rule: str) -> None:
    """REC-6.1, REC-6.2: the token recurrence and the chunked form (chunks of 64, T = 150 not
    a multiple) computed in float32 from inputs rounded to ``dtype`` are within the bound for
    every element of the output and the final state, past state included."""
    torch = backend_or_skip("torch")
    rng = np.random.default_rng(RULES.index(rule))
    problem = recurrent_problem(
        rng, rule=rule, length=150, d_k=32, d_v=16, per_channel=rule == "gated"
    )
    low, exact = _rounded(torch, problem, dtype)
    bound = recurrent_error_bound(**{n: a for n, a in exact.items()}, dtype=dtype, chunk_size=64)
    for chunk_size in (None, 64):
        got = recurrent_attention(**low, chunk_size=chunk_size)
        assert _excess(torch, got.out, bound.out, bound.out_tolerance) <= 1
        assert _excess(torch, got.final_state, bound.final_state, bound.final_state_tolerance) <= 1


def _operands_rounded(torch_backend: Backend, low: dict[str, Any], dtype: str) -> tuple[Any, Any]:
    """A correct kernel of the flash-linear-attention kind: float32 state and sums, but the
    corrections it writes and the state it reads for the output rounded to the input dtype
    first (chunk_delta_h.py's ``b_v.to(k.dtype)``), token by token."""
    torch = torch_backend.xp
    q, k, v = (torch.astype(low[n], torch.float32) for n in ("q", "k", "v"))
    g, beta = (torch.astype(low[n], torch.float32) for n in ("g", "beta"))
    state = torch.astype(low["initial_state"], torch.float32)
    narrow = torch_backend.dtype(dtype)
    outs = []
    for t in range(q.shape[-2]):
        state = torch.exp(g[..., t])[..., None, None] * state
        read = torch.matmul(k[..., t, None, :], state)[..., 0, :]
        update = beta[..., t, None] * (v[..., t, :] - read)
        update = torch.astype(torch.astype(update, narrow), torch.float32)
        state = state + k[..., t, :, None] * update[..., None, :]
        seen = torch.astype(torch.astype(state, narrow), torch.float32)
        outs.append(torch.matmul(q[..., t, None, :], seen) / q.shape[-1] ** 0.5)
    return torch.astype(torch.concat(outs, axis=-2), narrow), state


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_declared_operand_rounding_is_within_the_bound(dtype: str) -> None:
    """REC-6.2: a kernel that rounds its product operands to the input dtype is within the
    bound when it declares so (u_p = u_d), and that declaration is what admits it: without
    it the same kernel is outside the bound."""
    torch = backend_or_skip("torch")
    rng = np.random.default_rng(21)
    problem = recurrent_problem(rng, rule="gated_delta", length=200, d_k=64, d_v=32)
    low, exact = _rounded(torch, problem, dtype)
    out, state = _operands_rounded(torch, low, dtype)
    declared = recurrent_error_bound(**exact, dtype=dtype, operands_in_input_dtype=True)
    assert _excess(torch, out, declared.out, declared.out_tolerance) <= 1
    assert _excess(torch, state, declared.final_state, declared.final_state_tolerance) <= 1
    undeclared = recurrent_error_bound(**exact, dtype=dtype)
    assert _excess(torch, out, undeclared.out, undeclared.out_tolerance) > 1


def _rms(a: Any) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(a)))))


@pytest.mark.parametrize("normalizer", [1.0, 10.0])
def test_non_vacuous_at_8192_and_no_looser_than_the_rms_rule(normalizer: float) -> None:
    """REC-6.2, REC-6.3: on flash-linear-attention's test inputs (d = 128, gate normaliser 1
    and 10) at T = 8192 the bound's RMS is at most 0.002 of the output's in float32 (that
    project's tightest ratio) and adds only the output's own rounding, u_d, in bfloat16;
    the final state's bound is below 1% of the state; the map contracts (growth 1)."""
    rng = np.random.default_rng(int(normalizer))
    problem = _fla_inputs(rng, "gated_delta", 8192, 128, normalizer, heads=1)
    for dtype in ("float32", "bfloat16"):
        bound = recurrent_error_bound(**problem, dtype=dtype, chunk_size=64)
        ratio = _rms(bound.out_tolerance) / _rms(bound.out)
        assert ratio <= 0.002 + (UNIT_ROUNDOFF[dtype] if dtype != "float32" else 0.0), (
            dtype,
            ratio,
        )
        assert _rms(bound.final_state_tolerance) / _rms(bound.final_state) < 0.01
        assert bound.growth == 1.0


def _state_in_bfloat16(torch_backend: Backend, low: dict[str, Any]) -> tuple[Any, Any]:
    """ollama #15865: the gated delta rule with its state written back in bfloat16 after
    every token; everything else as the definition."""
    torch = torch_backend.xp
    bf16 = torch_backend.dtype("bfloat16")
    q, k, v, g, beta = (torch.astype(low[n], torch.float32) for n in ("q", "k", "v", "g", "beta"))
    state = torch.zeros((*k.shape[:-2], k.shape[-1], v.shape[-1]), dtype=torch.float32)
    outs = []
    for t in range(q.shape[-2]):
        state = torch.exp(g[..., t])[..., None, None] * state
        update = beta[..., t, None] * (
            v[..., t, :] - torch.matmul(k[..., t, None, :], state)[..., 0, :]
        )
        state = torch.astype(
            torch.astype(state + k[..., t, :, None] * update[..., None, :], bf16), torch.float32
        )
        outs.append(torch.matmul(q[..., t, None, :], state) / q.shape[-1] ** 0.5)
    return torch.astype(torch.concat(outs, axis=-2), bf16), state


def test_a_state_kept_in_bfloat16_fails() -> None:
    """REC-4.1, REC-6.2: keeping the state in bfloat16 between tokens (ollama #15865) puts
    the output and the final state outside the bound at T = 512."""
    torch = backend_or_skip("torch")
    rng = np.random.default_rng(31)
    problem = _fla_inputs(rng, "gated_delta", 512, 64, 10.0)
    low, exact = _rounded(torch, problem, "bfloat16")
    out, state = _state_in_bfloat16(torch, low)
    bound = recurrent_error_bound(**exact, dtype="bfloat16", chunk_size=64)
    assert _excess(torch, out, bound.out, bound.out_tolerance) > 1
    assert _excess(torch, state, bound.final_state, bound.final_state_tolerance) > 1


def test_padding_that_decays_the_state_fails() -> None:
    """REC-5.1, REC-6.2: a chunked kernel that pads an incomplete last chunk (T = 100 in
    chunks of 64) with positions that still decay the state (the pad repeating the last
    token's gate, with zero keys and values) leaves the outputs right but its final state
    outside the bound, so a decode after the prefill diverges (transformers #46190)."""
    rng = np.random.default_rng(41)
    problem = _fla_inputs(rng, "gated_delta", 100, 32, 10.0)
    bound = recurrent_error_bound(**problem, dtype="float32", chunk_size=64)
    padded = dict(problem)
    pad = 128 - 100
    for name in ("q", "k", "v"):
        padded[name] = np.concatenate([problem[name], np.zeros((1, 2, pad, 32))], axis=-2)
    padded["beta"] = np.concatenate([problem["beta"], np.zeros((1, 2, pad))], axis=-1)
    padded["g"] = np.concatenate(
        [problem["g"], np.repeat(problem["g"][..., -1:], pad, axis=-1)], axis=-1
    )
    got = recurrent_attention(
        **{
            n: (a.astype(np.float32) if isinstance(a, np.ndarray) else a) for n, a in padded.items()
        },
        chunk_size=64,
    )
    numpy = backend_or_skip("numpy")
    assert _excess(numpy, got.out[..., :100, :], bound.out, bound.out_tolerance) <= 1
    assert _excess(numpy, got.final_state, bound.final_state, bound.final_state_tolerance) > 1


def test_growth_reports_a_map_that_does_not_contract() -> None:
    """REC-6.3: keys of norm 2 with beta near 1 (|1 - beta |k|^2| near 3) make the per-step
    map expand; the bound reports the growth, and is 1 for unit keys, beta in [0, 1] and
    g <= 0."""
    rng = np.random.default_rng(51)
    problem = recurrent_problem(rng, rule="delta", length=20, d_k=8, d_v=4, unit_keys=True)
    assert recurrent_error_bound(**problem, dtype="float32").growth == 1.0
    problem["k"] = 2.0 * problem["k"]
    assert recurrent_error_bound(**problem, dtype="float32").growth > 100


def test_the_target_is_the_float64_definition() -> None:
    """REC-6.1: the bound's target is the float64 token recurrence on the inputs as given,
    and the bound takes only float64 inputs holding the kernel's values."""
    rng = np.random.default_rng(61)
    problem = recurrent_problem(
        rng, rule="gated_delta", length=30, per_channel=True, heads=(4, 2, 2)
    )
    bound = recurrent_error_bound(**problem, dtype="bfloat16")
    want = recurrent_attention(**problem)
    np.testing.assert_array_equal(np.asarray(bound.out), np.asarray(want.out))
    np.testing.assert_array_equal(np.asarray(bound.final_state), np.asarray(want.final_state))
    with pytest.raises(TypeError, match=r"q.dtype=float32.*REC-6.1"):
        recurrent_error_bound(
            **{
                n: (a.astype(np.float32) if isinstance(a, np.ndarray) else a)
                for n, a in problem.items()
            },
            dtype="float32",
        )
    with pytest.raises(ValueError, match="dtype='half'"):
        recurrent_error_bound(**problem, dtype="half")


@pytest.mark.parametrize("chunk", [1, 3, 16])
@pytest.mark.parametrize("length", [0, 2, 5, 40])
def test_token_factors_are_each_tokens_own_bit_for_bit(chunk: int, length: int) -> None:
    """REC-6.2: the bound's state-independent factors, evaluated for every token before the
    token loop (``token_terms``), are bit for bit what token t's own inputs give (exp(g_t),
    kappa_t, rho_t and gamma_t, the sum of |g| over the C_h tokens ending at t, each window
    summed alone), so hoisting them out of the loop changed no bound."""
    from attnspec.reference.recurrent._inputs import prepare
    from attnspec.reference.recurrent.tolerance import rounding, token_terms

    rng = np.random.default_rng(length * 100 + chunk)
    q, k, v = (rng.standard_normal((2, 3, length, 7)) for _ in range(3))
    g = -np.abs(rng.standard_normal((2, 3, length, 7))) * 3.0
    beta = rng.random((2, 3, length)) * 2.5
    p = prepare(q, k, v, "test", rule="gated_delta", g=g, beta=beta)
    r = rounding("float16", chunk, 7, p.scale, rounded_operands=False, normalize_qk=False)
    gate_sizes = np.max(np.abs(p.log_decay), axis=-1)
    terms = token_terms(p, r, gate_sizes)
    for t in range(length):
        decay = np.exp(p.log_decay[..., t, :])
        key_squared = np.sum(p.k[..., t, :] * p.k[..., t, :], axis=-1)
        kappa = np.maximum(np.abs(1 - p.beta[..., t] * key_squared), 1.0)
        gamma = np.sum(gate_sizes[..., max(0, t - chunk + 1) : t + 1], axis=-1) * (chunk > 1)
        for got, want in (
            (terms.decay[..., t, :], decay),
            (terms.kappa[..., t], kappa),
            (terms.rho[..., t], kappa * np.max(decay, axis=-1)),
            (terms.gamma[..., t], gamma),
        ):
            assert got.tobytes() == np.asarray(want, dtype=np.float64).tobytes(), t


def test_the_read_error_without_normalisation_is_the_written_sum_bit_for_bit() -> None:
    """REC-6.2: without normalisation (eta = 0) the bound leaves out a read's ``eta |S_:c|``
    where every |S_kc| is at most 2^500 (``_read_error``): bit for bit the written sum
    ``eps_tc + 0 * |S_:c|`` on states around that threshold, past it (columns whose sum of
    squares overflows, which make the sum NaN), with infinities, NaN and zeros, and on
    empty states; with eta > 0 the sum is always taken."""
    from attnspec.reference.recurrent.tolerance import (
        FINITE_SQUARES,
        _read_error,
        column_norms,
    )

    rng = np.random.default_rng(71)
    taken = {False: 0, True: 0}  # whether the written sum changed a bit: both are met
    for shape in [(2, 3, 7, 5), (1, 1, 1, 1), (2, 0, 7, 5), (2, 3, 0, 5), (2, 3, 7, 0)]:
        for scale in (1.0, FINITE_SQUARES / 4, FINITE_SQUARES, 2 * FINITE_SQUARES, 2.0**700):
            state = rng.standard_normal(shape) * scale
            if state.size and scale == 1.0:
                state.flat[rng.integers(state.size, size=3)] = [np.inf, np.nan, -0.0]
            # eps_tc after a step: at least the flush term, or NaN
            error = rng.random((*shape[:-2], shape[-1])) + 2.0**-1000
            if error.size:
                error.flat[0] = np.nan
            for eta in (0.0, 2.0**-20):
                with np.errstate(over="ignore", invalid="ignore"):
                    got = _read_error(np, eta, error, state, np.abs(state))
                    want = error + eta * column_norms(np, state)
                assert got.shape == want.shape and got.dtype == want.dtype
                assert got.tobytes() == want.tobytes(), (shape, scale, eta)
                taken[bool(np.isnan(want).sum() > np.isnan(error).sum())] += 1
    assert taken[False] and taken[True]
