"""The recurrence catalogue (tests/catalogue/recurrent.py) against REC-6.2's bound: the two
correct formulations are within it on 20 seeds of problems across the rules, gates, head
sharings, lengths around the chunk size and strong decay; every catalogued bug is outside it
on its witness (test_recurrent_conformance.py runs the conformance properties on them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from recurrent_problems import recurrent_problem

from attnspec.reference.recurrent.tolerance import recurrent_error_bound
from catalogue import recurrent as catalogue

RULES = ("linear", "gated", "delta", "gated_delta")
SHARINGS = ((2, 2, 2), (4, 2, 2), (2, 2, 4), (4, 1, 2))
LENGTHS = (1, 15, 16, 17, 33, 64, 65)


def _problem(seed: int, **changes: Any) -> dict[str, Any]:
    """A float32-representable problem (float64 arrays holding float32 values)."""
    strong = changes.pop("strong_decay", None)
    rng = np.random.default_rng(seed)
    settings: dict[str, Any] = {"rule": "gated_delta", "length": 33, "d_k": 16, "d_v": 8}
    settings.update(changes)
    problem = recurrent_problem(rng, **settings)
    if strong is not None:
        problem["g"] = -strong * (1.0 + rng.random(problem["g"].shape))
    return {
        n: (a.astype(np.float32).astype(np.float64) if isinstance(a, np.ndarray) else a)
        for n, a in problem.items()
    }


def _outside(fn: Any, problem: dict[str, Any]) -> float:
    """The largest |error| / tolerance of the kernel's output and final state (inf for a
    non-finite result where the definition is finite, as TOL-3 judges it)."""
    out, state = fn(**problem)
    bound = recurrent_error_bound(**problem, dtype="float32", chunk_size=catalogue.CHUNK)
    worst = 0.0
    for got, want, tolerance in (
        (out, bound.out, bound.out_tolerance),
        (state, bound.final_state, bound.final_state_tolerance),
    ):
        got = np.asarray(got, dtype=np.float64)
        if got.shape != want.shape or not np.all(np.isfinite(got)):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(got - want) / tolerance, initial=0.0)))
    return worst


@pytest.mark.parametrize("fn", catalogue.CORRECT, ids=lambda fn: fn.__name__)
def test_correct_formulations_are_within_the_bound_over_20_seeds(fn: Any) -> None:
    """REC-1.2, REC-3.1, REC-5.1, REC-5.2, REC-6.2: both correct kernels, 20 seeds of
    problems (every rule, per-head and per-channel gates, both sharings, lengths around the
    chunk of 16, past state or none, strong decay), are within the bound."""
    for seed in range(20):
        rule = RULES[seed % 4]
        changes: dict[str, Any] = {
            "rule": rule,
            "length": LENGTHS[seed % len(LENGTHS)],
            "heads": SHARINGS[seed % len(SHARINGS)],
            "per_channel": seed % 3 == 0,
            "with_state": seed % 5 != 0,
        }
        if seed % 7 == 3 and rule in ("gated", "gated_delta"):
            changes["strong_decay"] = 60.0
        assert _outside(fn, _problem(seed, **changes)) <= 1, (seed, changes)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_bug_is_outside_the_bound_on_its_witness(bug: catalogue.RecurrentBug) -> None:
    """REC-6.2 (and the clause each bug breaks: REC-1.2, REC-1.5, REC-2.2, REC-2.3, REC-3.1,
    REC-4.1, REC-5.1, REC-5.2): each catalogued kernel is outside the bound on its witness,
    while the correct kernels are within it there."""
    problem = _problem(1, **bug.witness)
    with np.errstate(over="ignore", invalid="ignore"):  # exp_inverse overflows: its bug
        assert _outside(bug.fn, problem) > 1, bug.upstream
    assert all(_outside(fn, problem) <= 1 for fn in catalogue.CORRECT)


@pytest.mark.parametrize("rule", RULES)
def test_bfloat16_operands_are_within_the_bound_they_declare(rule: str) -> None:
    """REC-6.2: the chunked kernel that rounds every product's operands to bfloat16, as
    flash-linear-attention's Triton kernels do, is within the bound with u_p = u_d declared
    (bfloat16 inputs, chunks of 16, T = 129 across three chunks and a partial one, query
    groups) and outside it without the declaration."""
    rng = np.random.default_rng(RULES.index(rule))
    problem = recurrent_problem(
        rng, rule=rule, length=129, d_k=64, d_v=32, heads=(4, 2, 2), per_channel=rule == "gated"
    )
    problem = {
        n: (catalogue.to_bfloat16(a).astype(np.float64) if isinstance(a, np.ndarray) else a)
        for n, a in problem.items()
    }
    out, state = catalogue.chunked_bfloat16_operands(**problem)
    excess = []
    for declared in (True, False):
        bound = recurrent_error_bound(
            **problem, dtype="bfloat16", chunk_size=16, operands_in_input_dtype=declared
        )
        excess.append(float(np.max(np.abs(out - bound.out) / bound.out_tolerance)))
        excess.append(
            float(np.max(np.abs(state - bound.final_state) / bound.final_state_tolerance))
        )
    assert max(excess[:2]) <= 1 and excess[2] > 1, excess


def test_the_catalogue_has_at_least_twelve_bugs() -> None:
    """REC-6.2: issue 37 asks for twelve; each names where it happened or what it breaks."""
    assert len(catalogue.BUGS) >= 12
    assert len({bug.fn.__name__ for bug in catalogue.BUGS}) == len(catalogue.BUGS)
