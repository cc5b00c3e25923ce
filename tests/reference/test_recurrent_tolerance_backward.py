"""REC-7.7, the gradients' error bound: it holds for correct backward passes in every dtype
and is small beside the gradients, on unit-norm keys from weak to strong decay.

The kernels are ``torch.autograd`` of the forward reference evaluated in float32 (the token
recurrence, and the chunked form with chunks of 16), on inputs rounded to the dtype, the
state in float32, gradients rounded to the dtype (REC-7.3), compared with the bound's float64
target (REC-7.6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import support
from recurrent_problems import arrays_of, recurrent_problem

from attnspec.reference.recurrent import recurrent_attention, recurrent_attention_backward
from attnspec.reference.recurrent.tolerance_backward import recurrent_gradient_error_bound

torch = pytest.importorskip("torch", reason="the correct kernels are torch.autograd's")

NAMES = ("q", "k", "v", "g", "beta", "initial_state")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


_one_torch_thread = pytest.fixture(autouse=True, scope="module")(support.one_torch_thread)


def _received(problem: dict[str, Any], dtype: str) -> dict[str, np.ndarray]:
    """The arrays as the kernel receives them, exactly in float64 (the past state and its
    gradient in float32)."""
    return {
        name: torch.tensor(a)
        .to(torch.float32 if name in ("initial_state", "grad_final_state") else DTYPES[dtype])
        .double()
        .numpy()
        for name, a in arrays_of(problem).items()
    }


def _problem(
    seed: int, rule: str, dtype: str, *, any_norm: bool = False, **drawn: Any
) -> dict[str, Any]:
    """A problem as the kernel receives it, drawn by ``recurrent_problem`` with ``drawn``'s
    keywords (length, per_channel, gate_normalizer) and 8 x 8 heads (4, 2, 2) of batch 1;
    with ``any_norm``, keys of norms 1/4 to 4 (for a kernel that normalises q and k itself,
    REC-2.4)."""
    rng = np.random.default_rng(seed)
    problem = recurrent_problem(rng, rule=rule, d_k=8, d_v=8, heads=(4, 2, 2), batch=(1,), **drawn)
    if any_norm:
        problem["k"] = problem["k"] * rng.uniform(0.25, 4.0, (*problem["k"].shape[:-1], 1))
    out, state = recurrent_attention(**problem)
    problem["grad_out"] = rng.standard_normal(out.shape)
    problem["grad_final_state"] = rng.standard_normal(state.shape)
    return {**problem, **_received(problem, dtype)}


def _autograd(
    problem: dict[str, Any],
    dtype: str,
    chunk_size: int | None,
    normalize: Callable[[Any], Any] | None = None,
) -> dict[str, np.ndarray]:
    """torch.autograd of the forward reference, in float32, on the received values; with
    ``normalize``, q and k go through it first (in float32)."""
    leaves = {
        name: torch.tensor(a)
        .to(torch.float32 if name == "initial_state" else DTYPES[dtype])
        .requires_grad_(True)
        for name, a in problem.items()
        if name in NAMES
    }
    inputs = dict(leaves)
    if normalize is not None:
        for name in ("q", "k"):
            inputs[name] = normalize(leaves[name].float()).to(leaves[name].dtype)
    out, state = recurrent_attention(**inputs, rule=problem["rule"], chunk_size=chunk_size)
    upstream = (
        torch.tensor(problem["grad_out"]).to(out.dtype),
        torch.tensor(problem["grad_final_state"]).to(state.dtype),
    )
    grads = torch.autograd.grad((out, state), tuple(leaves.values()), upstream)
    by_name = dict(zip(leaves, grads, strict=True))
    return {name: by_name[name].double().numpy() for name in NAMES if name in by_name}


def _bound(problem: dict[str, Any], dtype: str, chunk_size: int, **more: Any) -> Any:
    keywords = {n: problem[n] for n in ("g", "beta", "initial_state") if n in problem}
    keywords.update(more)
    return recurrent_gradient_error_bound(
        *(problem[name] for name in ("q", "k", "v", "grad_out")),
        dtype=dtype,
        rule=problem["rule"],
        grad_final_state=problem["grad_final_state"],
        chunk_size=chunk_size,
        **keywords,
    )


def _present(bound: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    pairs = zip(NAMES, bound.gradients, bound.tolerances, strict=True)
    return {name: (g, t) for name, g, t in pairs if g is not None}


def test_the_target_is_the_reference_backward() -> None:
    """REC-7.6: the bound's float64 gradients are the reference backward's."""
    problem = _problem(1, "gated_delta", "float32", length=9, gate_normalizer=1.0, per_channel=True)
    bound = _bound(problem, "float32", 1)
    want = recurrent_attention_backward(**problem)
    for got, expected in zip(bound.gradients, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("chunk_size", [None, 16])
def test_correct_backward_passes_are_within_the_bound(dtype: str, chunk_size: int | None) -> None:
    """REC-7.7: torch.autograd of the token recurrence and of the chunked form (chunks of
    16, 33 tokens: a partial last chunk) is within the bound for the four rules, per-head and
    per-channel gates, weak, moderate and strong decay (e^-30 per token and below), query
    groups and a past state; every gradient and the past state's (the chunked form on the
    gated, delta and strongly decaying cases: autograd through it costs ~3 s a case)."""
    cases = [
        ("gated_delta", 1.0, False),
        ("gated_delta", 0.01, True),
        ("gated", 10.0, True),
        ("delta", 1.0, False),
        ("linear", 1.0, False),
    ]
    if chunk_size is not None:  # autograd through the chunked form is slow: its three cases
        cases = cases[1:4]
    for seed, (rule, normalizer, per_channel) in enumerate(cases):
        problem = _problem(
            seed, rule, dtype, length=33, gate_normalizer=normalizer, per_channel=per_channel
        )
        bound = _bound(problem, dtype, chunk_size or 1)
        got = _autograd(problem, dtype, chunk_size)
        for name, (expected, tolerance) in _present(bound).items():
            excess = np.max(np.abs(got[name] - expected) / tolerance)
            assert excess <= 1, (rule, normalizer, name, float(excess))


def test_non_vacuous_at_a_thousand_tokens() -> None:
    """REC-7.7 at T = 1000 (gated_delta, weak decay: the adjoint's memory is longest) in
    float32: the median tolerance is below 5% of the gradient for dq, dk, dv, dbeta and the
    past state's, and below the gradient itself for dg of a kernel in chunks of 64 (whose
    cumulative sums the bound charges; token by token it is smaller)."""
    problem = _problem(
        7, "gated_delta", "float32", length=1000, gate_normalizer=10.0, per_channel=False
    )
    bound = _bound(problem, "float32", 64)
    for name, (gradient, tolerance) in _present(bound).items():
        ratio = float(np.median(tolerance / np.abs(gradient)))
        assert ratio < (1.0 if name == "g" else 0.05), (name, ratio)


EPS = 1e-6  # flash-linear-attention's l2norm epsilon


def _l2norm(x: Any) -> Any:
    """REC-2.4's normalisation, differentiated through (a correct in-kernel l2norm)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS)


def _l2norm_detached(x: Any) -> Any:
    """The norm held constant: the gradient d / n, without REC-7.5's projection."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS).detach()


def _normalizing(seed: int, rule: str, dtype: str, per_channel: bool) -> dict[str, Any]:
    return _problem(
        seed, rule, dtype, length=33, gate_normalizer=1.0, per_channel=per_channel, any_norm=True
    )


def test_the_target_through_the_normalisation() -> None:
    """REC-7.5, REC-7.6: with the normalisation declared, the bound's float64 gradients are
    the reference backward's with ``normalize_qk`` (itself checked against the NumPy oracle
    and autograd in test_recurrent_backward.py)."""
    problem = _problem(
        3, "gated_delta", "float32", length=9, gate_normalizer=1.0, per_channel=True, any_norm=True
    )
    bound = _bound(problem, "float32", 1, normalize_qk=True, norm_eps=EPS)
    want = recurrent_attention_backward(**problem, normalize_qk=True, norm_eps=EPS)
    for got, expected in zip(bound.gradients, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_normalising_backward_passes_are_within_the_bound(dtype: str) -> None:
    """REC-7.7 with its normalisation terms (REC-7.5): torch.autograd of the token
    recurrence after an in-kernel l2norm (keys of norms 1/4 to 4, queries as drawn) is
    within the bound for the gated delta and the gated rule, per-head and per-channel
    gates, query groups and a past state."""
    for seed, (rule, per_channel) in enumerate((("gated_delta", False), ("gated", True))):
        problem = _normalizing(seed, rule, dtype, per_channel)
        bound = _bound(problem, dtype, 1, normalize_qk=True, norm_eps=EPS)
        got = _autograd(problem, dtype, None, _l2norm)
        for name, (expected, tolerance) in _present(bound).items():
            excess = np.max(np.abs(got[name] - expected) / tolerance)
            assert excess <= 1, (rule, name, float(excess))


def test_a_gradient_without_the_projection_is_outside_the_bound() -> None:
    """REC-7.5, REC-7.7: an l2norm whose norm is held constant in the backward pass (its
    gradient d / n, without -x^ (x^ . d) / n) is outside the bound in float32 for dq and
    dk."""
    problem = _normalizing(5, "gated_delta", "float32", False)
    bound = _bound(problem, "float32", 1, normalize_qk=True, norm_eps=EPS)
    got = _autograd(problem, "float32", None, _l2norm_detached)
    present = _present(bound)
    for name in ("q", "k"):
        expected, tolerance = present[name]
        assert np.max(np.abs(got[name] - expected) / tolerance) > 1, name


def test_the_normalisation_terms_on_array_api_strict() -> None:
    """REC-7.7 is pure Array API: with the normalisation terms, the bound evaluated on
    array-api-strict arrays equals NumPy's."""
    strict = pytest.importorskip("array_api_strict", reason="the strict namespace checks it")
    problem = _problem(
        6, "gated_delta", "float32", length=9, gate_normalizer=1.0, per_channel=True, any_norm=True
    )
    arrays = {n: a for n, a in problem.items() if isinstance(a, np.ndarray)}
    on_numpy = _bound(problem, "float32", 4, normalize_qk=True, norm_eps=EPS)
    converted = {**problem, **{n: strict.asarray(a) for n, a in arrays.items()}}
    on_strict = _bound(converted, "float32", 4, normalize_qk=True, norm_eps=EPS)
    for got, want in zip(on_strict.tolerances, on_numpy.tolerances, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
