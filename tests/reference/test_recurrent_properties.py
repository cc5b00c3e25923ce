"""Consequences of spec/recurrent.md that a kernel is checked on, shown of the reference.

In float64 on NumPy (array-api-strict where the point is the Array API itself): the chunked
form equals the token recurrence and the independent oracle at the lengths chunked kernels
break at (T in {1, 63, 64, 65, 75, 129, 1000}, head dims 60, 64, 100, 128); a split run with
its state passed equals the whole run; a decode step equals the prefill's last row; zero gates
reduce the gated rules; equal per-channel gates are the per-head gate; beta = 0 only decays;
strong decay stays finite; the result is linear in (V, S0) jointly; batch elements and heads
are independent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle_recurrent
import pytest
from recurrent_problems import recurrent_problem
from support import backend_or_skip

from attnspec.reference.recurrent import recurrent_attention, varlen_recurrent_attention

RULES = ("linear", "gated", "delta", "gated_delta")
LENGTHS = (1, 63, 64, 65, 75, 129, 1000)
HEAD_DIMS = (60, 64, 100, 128)


def _close(got: Any, want: np.ndarray, scale: float = 1.0) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * scale)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("length", LENGTHS)
def test_chunked_equals_the_recurrence_and_the_oracle(rule: str, length: int) -> None:
    """REC-5.1: chunks of 64 (and 16) tokens, the last one incomplete where 64 does not divide
    T, give the token recurrence's output and final state, and the oracle's, at head dims
    60, 64, 100 and 128 (d_v != d_k), per-head and per-channel gates."""
    index = LENGTHS.index(length) + RULES.index(rule)
    d_k, d_v = HEAD_DIMS[index % 4], HEAD_DIMS[(index + 1) % 4]
    rng = np.random.default_rng(index * 7 + length)
    problem = recurrent_problem(
        rng, rule=rule, length=length, d_k=d_k, d_v=d_v, batch=(1,), per_channel=index % 2 == 1
    )
    want_out, want_state = oracle_recurrent.recurrence(**problem)
    scale = float(np.max(np.abs(want_state)))
    token = recurrent_attention(**problem)
    _close(token.out, want_out, scale)
    _close(token.final_state, want_state, scale)
    for chunk_size in (64, 16) if length <= 129 else (64,):
        chunked = recurrent_attention(**problem, chunk_size=chunk_size)
        _close(chunked.out, want_out, scale)
        _close(chunked.final_state, want_state, scale)


@pytest.mark.parametrize("split", [1, 63, 64, 65, 128])
@pytest.mark.parametrize("with_state", [False, True])
def test_passing_the_state_at_a_split_equals_the_whole_run(split: int, with_state: bool) -> None:
    """REC-2.2: tokens [0, s) then [s, T) from the first run's final state give the whole
    run's outputs and final state, with and without a past state, chunked in 64."""
    rng = np.random.default_rng(split)
    problem = recurrent_problem(
        rng, rule="gated_delta", length=129, d_k=16, d_v=12, per_channel=True, with_state=with_state
    )
    whole = recurrent_attention(**problem, chunk_size=64)

    def part(start: int, stop: int, state: Any) -> Any:
        cut = dict(problem, initial_state=state)
        for name in ("q", "k", "v", "beta"):
            cut[name] = (
                problem[name][..., start:stop]
                if name == "beta"
                else problem[name][..., start:stop, :]
            )
        cut["g"] = problem["g"][..., start:stop, :]
        return recurrent_attention(**cut, chunk_size=64)

    first = part(0, split, problem.get("initial_state"))
    second = part(split, 129, first.final_state)
    joined = np.concatenate([first.out, second.out], axis=-2)
    _close(joined, whole.out)
    _close(second.final_state, whole.final_state)


@pytest.mark.parametrize("rule", RULES)
def test_a_decode_step_equals_the_last_row_of_the_prefill(rule: str) -> None:
    """REC-2.2, REC-1.5: a chunked prefill of T - 1 tokens, then one token-by-token step
    from its state, gives the last output row and the final state of one chunked run of T
    tokens (transformers #46190); a one-token prefill works in both forms."""
    rng = np.random.default_rng(len(rule))
    length = 65
    problem = recurrent_problem(rng, rule=rule, length=length, d_k=32, d_v=16)
    full = recurrent_attention(**problem, chunk_size=64)

    def tokens(start: int, stop: int) -> dict[str, Any]:
        cut = dict(problem)
        for name in ("q", "k", "v"):
            cut[name] = problem[name][..., start:stop, :]
        for name in ("g", "beta"):
            if name in problem:
                cut[name] = problem[name][..., start:stop]
        return cut

    prefill = recurrent_attention(**tokens(0, length - 1), chunk_size=64)
    step = recurrent_attention(
        **dict(tokens(length - 1, length), initial_state=prefill.final_state)
    )
    _close(step.out[..., 0, :], full.out[..., -1, :])
    _close(step.final_state, full.final_state)
    one = recurrent_attention(**tokens(0, 1), chunk_size=64)
    _close(one.out, recurrent_attention(**tokens(0, 1)).out)


@pytest.mark.parametrize(("gated", "plain"), [("gated", "linear"), ("gated_delta", "delta")])
@pytest.mark.parametrize("chunk_size", [None, 16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_a_zero_gate_reduces_to_the_ungated_rule(
    gated: str, plain: str, chunk_size: int | None, per_channel: bool
) -> None:
    """REC-1.3: g = 0 leaves the state unscaled, so gated is linear and gated_delta is
    delta."""
    rng = np.random.default_rng(11)
    problem = recurrent_problem(rng, rule=gated, length=40, d_k=16, d_v=8, per_channel=per_channel)
    zero = dict(problem, g=np.zeros_like(problem["g"]))
    ungated = {name: a for name, a in zero.items() if name != "g"}
    ungated["rule"] = plain
    a = recurrent_attention(**zero, chunk_size=chunk_size)
    b = recurrent_attention(**ungated, chunk_size=chunk_size)
    _close(a.out, np.asarray(b.out))
    _close(a.final_state, np.asarray(b.final_state))


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
@pytest.mark.parametrize("chunk_size", [None, 16])
def test_equal_per_channel_gates_are_the_per_head_gate(rule: str, chunk_size: int | None) -> None:
    """REC-1.3: a per-key-channel gate whose entries are all equal is that per-head gate."""
    rng = np.random.default_rng(12)
    problem = recurrent_problem(rng, rule=rule, length=40, d_k=16, d_v=8)
    channels = dict(problem, g=np.repeat(problem["g"][..., None], 16, axis=-1))
    a = recurrent_attention(**problem, chunk_size=chunk_size)
    b = recurrent_attention(**channels, chunk_size=chunk_size)
    _close(a.out, np.asarray(b.out))
    _close(a.final_state, np.asarray(b.final_state))


@pytest.mark.parametrize("chunk_size", [None, 16])
def test_beta_zero_leaves_the_state_only_decayed(chunk_size: int | None) -> None:
    """REC-1.4: with beta = 0 the state is the past state decayed, S_t = e^{sum g} S_{-1},
    and the output reads it; with beta = 1 and unit keys the new state recalls v_t exactly."""
    rng = np.random.default_rng(13)
    problem = recurrent_problem(rng, rule="gated_delta", length=40, d_k=16, d_v=8, per_channel=True)
    still = recurrent_attention(
        **dict(problem, beta=np.zeros_like(problem["beta"])), chunk_size=chunk_size
    )
    decay = np.exp(np.cumsum(problem["g"], axis=-2))  # (B, H, T, dk)
    states = decay[..., :, :, None] * problem["initial_state"][..., None, :, :]
    expected = np.einsum("bhtk,bhtkv->bhtv", problem["q"], states) / 4.0
    _close(still.final_state, states[..., -1, :, :])
    _close(still.out, expected)
    one = dict(problem, beta=np.ones_like(problem["beta"]), g=np.zeros_like(problem["g"]), length=1)
    one.pop("length")
    for name in ("q", "k", "v"):
        one[name] = problem[name][..., :1, :]
    one["beta"], one["g"] = one["beta"][..., :1], one["g"][..., :1, :]
    state = np.asarray(recurrent_attention(**one, chunk_size=chunk_size).final_state)
    _close(np.einsum("bhkv,bhk->bhv", state, one["k"][..., 0, :]), one["v"][..., 0, :])


@pytest.mark.parametrize("strength", [50.0, 1000.0])
@pytest.mark.parametrize("chunk_size", [None, 64])
def test_strong_decay_gives_no_nan(strength: float, chunk_size: int | None) -> None:
    """REC-5.2: gates g <= -50 (whose decays over a chunk underflow, and whose inverse
    e^{-sum g} would overflow: executorch PR #21417, tt-metal #56550) give a finite result
    equal to the oracle's: each token nearly resets the state."""
    rng = np.random.default_rng(int(strength))
    problem = recurrent_problem(
        rng, rule="gated_delta", length=100, d_k=16, d_v=8, per_channel=True
    )
    problem["g"] = -strength * (1.0 + rng.random(problem["g"].shape))
    want_out, want_state = oracle_recurrent.recurrence(**problem)
    with np.errstate(over="raise", invalid="raise"):  # not even an intermediate overflow
        got = recurrent_attention(**problem, chunk_size=chunk_size)
    _close(got.out, want_out)
    _close(got.final_state, want_state)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("chunk_size", [None, 16])
def test_linear_in_values_and_past_state_jointly(rule: str, chunk_size: int | None) -> None:
    """REC-1.2: for fixed q, k, g and beta the output and the final state are linear in
    (V, S_{-1}) jointly."""
    rng = np.random.default_rng(14)
    first = recurrent_problem(rng, rule=rule, length=40, d_k=16, d_v=8)
    second = dict(
        first,
        v=rng.standard_normal(first["v"].shape),
        initial_state=rng.standard_normal(first["initial_state"].shape),
    )
    a, b = 0.75, -2.5
    mixed = dict(
        first,
        v=a * first["v"] + b * second["v"],
        initial_state=a * first["initial_state"] + b * second["initial_state"],
    )
    one, two, both = (
        recurrent_attention(**p, chunk_size=chunk_size) for p in (first, second, mixed)
    )
    _close(both.out, a * np.asarray(one.out) + b * np.asarray(two.out), 10.0)
    _close(
        both.final_state, a * np.asarray(one.final_state) + b * np.asarray(two.final_state), 10.0
    )


def test_batch_elements_and_heads_are_independent() -> None:
    """REC-3.2: permuting batch elements, or state heads with their inputs and query heads,
    permutes the results; changing one batch element changes no other."""
    rng = np.random.default_rng(15)
    problem = recurrent_problem(
        rng, rule="gated_delta", length=20, d_k=8, d_v=8, heads=(4, 2, 2), batch=(3,)
    )
    base = recurrent_attention(**problem, chunk_size=8)
    order = [2, 0, 1]
    shuffled = {n: (a[order] if isinstance(a, np.ndarray) else a) for n, a in problem.items()}
    moved = recurrent_attention(**shuffled, chunk_size=8)
    _close(moved.out, np.asarray(base.out)[order])
    heads = [1, 0]
    swapped = {
        n: (a[:, heads] if isinstance(a, np.ndarray) and n != "q" else a)
        for n, a in problem.items()
    }
    swapped["q"] = problem["q"][:, [2, 3, 0, 1]]
    moved = recurrent_attention(**swapped, chunk_size=8)
    _close(moved.out, np.asarray(base.out)[:, [2, 3, 0, 1]])
    _close(moved.final_state, np.asarray(base.final_state)[:, heads])
    poked = dict(problem, v=problem["v"].copy())
    poked["v"][1] += 100.0
    changed = recurrent_attention(**poked, chunk_size=8)
    np.testing.assert_array_equal(np.asarray(changed.out)[[0, 2]], np.asarray(base.out)[[0, 2]])


@pytest.mark.parametrize("library", ["numpy", "array_api_strict"])
@pytest.mark.parametrize("heads", [(4, 2, 2), (2, 2, 4), (4, 1, 2)])
def test_chunked_head_sharing_and_packing_on_the_array_api(
    library: str, heads: tuple[int, int, int]
) -> None:
    """REC-3.1, REC-3.3, REC-5.1: the chunked form shares heads in both directions and runs
    packed sequences (chunks crossing no boundary) exactly as the oracle, on NumPy and on
    array-api-strict (nothing beyond the standard)."""
    backend = backend_or_skip(library)
    rng = np.random.default_rng(sum(heads))
    problem = recurrent_problem(rng, rule="gated_delta", length=21, heads=heads, per_channel=True)
    want_out, want_state = oracle_recurrent.recurrence(**problem)
    moved = {
        n: (backend.asarray(a, "float64") if isinstance(a, np.ndarray) else a)
        for n, a in problem.items()
    }
    got = recurrent_attention(**moved, chunk_size=8)
    _close(backend.to_numpy(got.out), want_out)
    _close(backend.to_numpy(got.final_state), want_state)
    lengths = [13, 0, 8]
    runs = [
        recurrent_problem(rng, rule="gated_delta", length=n, heads=heads, batch=(1,))
        for n in lengths
    ]

    def packed(name: str) -> Any:
        return backend.asarray(
            np.concatenate([np.moveaxis(r[name][0], 0, 1) for r in runs]), "float64"
        )

    result = varlen_recurrent_attention(
        *(packed(n) for n in ("q", "k", "v")),
        backend.asarray(np.array([0, 13, 13, 21], dtype=np.int64)),
        g=packed("g"),
        beta=packed("beta"),
        initial_state=backend.asarray(np.stack([r["initial_state"][0] for r in runs]), "float64"),
        chunk_size=8,
    )
    out, final = backend.to_numpy(result.out), backend.to_numpy(result.final_state)
    starts = [0, 13, 13, 21]
    for b, run in enumerate(runs):
        run_out, run_state = oracle_recurrent.recurrence(**run)
        _close(np.moveaxis(np.asarray(out)[starts[b] : starts[b + 1]], 0, 1), run_out[0])
        _close(np.asarray(final)[b], run_state[0])
