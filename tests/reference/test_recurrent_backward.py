"""The gradients of the recurrences (spec/recurrent.md, REC-7) against an independent float64
oracle and against automatic differentiation of the forward reference, on every backend.

``tests/oracle_recurrent.py``'s ``gradients`` (plain NumPy, one head and one token at a time)
is itself checked against central differences of the forward oracle; the reference's
backward, whole and recomputed chunk by chunk, equals it on NumPy, PyTorch, JAX and
array-api-strict, and equals ``torch.autograd`` and ``jax.vjp`` of the forward reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle_recurrent
import pytest
from recurrent_problems import arrays_of, recurrent_problem
from support import backend_or_skip

from attnspec.backends import REFERENCE_CONFIG, Backend
from attnspec.reference.recurrent import (
    recurrent_attention,
    recurrent_attention_backward,
    varlen_recurrent_attention_backward,
)

RULES = ("linear", "gated", "delta", "gated_delta")
NAMES = ("q", "k", "v", "g", "beta", "initial_state")  # the order of RecurrentGradients


def _with_upstream(rng: np.random.Generator, problem: dict[str, Any]) -> dict[str, Any]:
    """``problem`` with random upstream gradients of the output and of the final state."""
    out, state = oracle_recurrent.recurrence(**problem)
    return {
        **problem,
        "grad_out": rng.standard_normal(out.shape),
        "grad_final_state": rng.standard_normal(state.shape),
    }


def _oracle(problem: dict[str, Any]) -> dict[str, np.ndarray]:
    return oracle_recurrent.gradients(**problem)


def _named(backend: Backend, grads: Any) -> dict[str, np.ndarray]:
    return {
        name: np.asarray(backend.to_numpy(a), dtype=np.float64)
        for name, a in zip(NAMES, grads, strict=True)
        if a is not None
    }


def _assert_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: Any) -> None:
    assert sorted(got) == sorted(want), what
    for name, expected in want.items():
        assert got[name].shape == expected.shape, (what, name)
        np.testing.assert_allclose(
            got[name], expected, rtol=1e-10, atol=1e-10, err_msg=f"{what} {name}"
        )


def _on(backend: Backend, problem: dict[str, Any]) -> dict[str, Any]:
    return {
        name: backend.asarray(a, "float64") if isinstance(a, np.ndarray) else a
        for name, a in problem.items()
    }


@pytest.mark.parametrize("rule", RULES)
def test_oracle_equals_central_differences(rule: str) -> None:
    """REC-7.1, REC-7.5: the oracle's gradients are the derivatives of the forward oracle,
    by central differences of each input element (with query and value groups, normalised
    q and k, per-channel gates, a past state and both upstream gradients)."""
    rng = np.random.default_rng(len(rule))
    problem = recurrent_problem(
        rng, rule=rule, length=4, d_k=3, d_v=2, heads=(2, 1, 2), batch=(1,), per_channel=True
    )
    problem = {**_with_upstream(rng, problem), "normalize_qk": True, "norm_eps": 0.1}
    forward = {n: a for n, a in problem.items() if not n.startswith("grad_")}

    def loss(values: dict[str, Any]) -> float:
        out, state = oracle_recurrent.recurrence(**values)
        return float(
            np.sum(out * problem["grad_out"]) + np.sum(state * problem["grad_final_state"])
        )

    grads, step = _oracle(problem), 1e-6
    for name, array in arrays_of(forward).items():
        numeric = np.zeros_like(array)
        for index in np.ndindex(*array.shape):
            up, down = array.copy(), array.copy()
            up[index] += step
            down[index] -= step
            numeric[index] = (loss({**forward, name: up}) - loss({**forward, name: down})) / (
                2 * step
            )
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("rule", RULES)
def test_reference_backward_equals_the_oracle_on_every_backend(
    cpu_backend: Backend, rule: str
) -> None:
    """REC-7.1, REC-7.2: both forms of the reference's backward (every state kept, and
    recomputed from each chunk's starting state) equal the oracle, per-head and per-channel
    gates, grouped queries and grouped values, on every backend.  A backend that compiles
    every shape (JAX: ~15 s here) is left to the jax.vjp test below, which runs the
    reference's backward on JAX."""
    if cpu_backend.compiles_per_shape:
        pytest.skip("a compiling backend runs the reference backward in the jax.vjp test (cost)")
    rng = np.random.default_rng(3 + len(rule))
    for per_channel, heads in ((False, (4, 2, 2)), (True, (2, 2, 4))):
        problem = recurrent_problem(
            rng, rule=rule, length=7, d_k=4, d_v=3, heads=heads, per_channel=per_channel
        )
        problem = _with_upstream(rng, problem)
        want = _oracle(problem)
        for chunk_size in (None, 3):
            got = recurrent_attention_backward(**_on(cpu_backend, problem), chunk_size=chunk_size)
            _assert_equal(_named(cpu_backend, got), want, (rule, per_channel, chunk_size))


def test_equals_torch_autograd_of_the_forward_reference() -> None:
    """REC-7.1, REC-7.5: torch.autograd of the forward reference (both of its forms, token
    and chunked) gives the reference backward's gradients, L2 normalisation in the call
    (the gradients of the q and k given, through the normalisation)."""
    torch = backend_or_skip("torch")
    import torch as th

    rng = np.random.default_rng(11)
    problem = recurrent_problem(
        rng, rule="gated_delta", length=9, heads=(4, 2, 2), per_channel=True
    )
    problem = _with_upstream(rng, problem)
    leaves = {
        n: th.tensor(a, requires_grad=True)
        for n, a in arrays_of(problem).items()
        if not n.startswith("grad_")
    }
    upstream = (th.tensor(problem["grad_out"]), th.tensor(problem["grad_final_state"]))
    want = _named(
        torch, recurrent_attention_backward(**_on(torch, problem), normalize_qk=True, norm_eps=1e-6)
    )
    for chunk_size in (None, 4):
        result = recurrent_attention(
            **leaves, rule="gated_delta", normalize_qk=True, norm_eps=1e-6, chunk_size=chunk_size
        )
        grads = th.autograd.grad(tuple(result), tuple(leaves.values()), upstream)
        _assert_equal({n: g.numpy() for n, g in zip(leaves, grads, strict=True)}, want, chunk_size)


def test_equals_jax_vjp_of_the_forward_reference() -> None:
    """REC-7.1: jax.vjp of the forward reference under jax.jit gives the oracle's gradients,
    which the reference backward equals on the other backends (a small problem with query
    groups: JAX compiles every shape)."""
    jax_backend = backend_or_skip("jax", REFERENCE_CONFIG.get("jax"))
    import jax

    rng = np.random.default_rng(13)
    problem = recurrent_problem(
        rng,
        rule="gated_delta",
        length=3,
        d_k=3,
        d_v=2,
        heads=(2, 1, 1),
        batch=(1,),
        per_channel=True,
    )
    problem = _with_upstream(rng, problem)
    names = [n for n in arrays_of(problem) if not n.startswith("grad_")]
    moved = _on(jax_backend, problem)

    def forward(*arrays: Any) -> tuple[Any, ...]:
        return tuple(
            recurrent_attention(*arrays[:3], **dict(zip(names[3:], arrays[3:], strict=True)))
        )

    _, pullback = jax.vjp(jax.jit(forward), *(moved[n] for n in names))
    grads = pullback((moved["grad_out"], moved["grad_final_state"]))
    want = _oracle(problem)  # the reference's own backward equals it on the other backends
    _assert_equal({n: np.asarray(g) for n, g in zip(names, grads, strict=True)}, want, "jax")


def test_packed_sequences_have_their_own_gradients() -> None:
    """REC-7.4: the packed backward gives each sequence the gradients of its own run (none
    crossing a boundary; an empty sequence's past state gets its final state's gradient)."""
    rng = np.random.default_rng(17)
    offsets = [0, 3, 3, 8]
    problem = _with_upstream(
        rng, recurrent_problem(rng, rule="gated_delta", length=8, batch=(1,), per_channel=True)
    )
    states = rng.standard_normal((3, 2, 8, 8))
    finals = rng.standard_normal((3, 2, 8, 8))

    def tokens_first(a: np.ndarray) -> np.ndarray:
        return np.swapaxes(a[0], 0, 1)

    packed = {n: tokens_first(problem[n]) for n in ("q", "k", "v", "g", "beta", "grad_out")}
    got = varlen_recurrent_attention_backward(
        packed["q"],
        packed["k"],
        packed["v"],
        np.asarray(offsets),
        packed["grad_out"],
        g=packed["g"],
        beta=packed["beta"],
        initial_state=states,
        grad_final_state=finals,
    )
    for b in range(3):
        start, stop = offsets[b], offsets[b + 1]
        alone = {n: problem[n][:, :, start:stop] for n in ("q", "k", "v", "g", "beta", "grad_out")}
        want = _oracle(
            {
                **alone,
                "rule": "gated_delta",
                "initial_state": states[b : b + 1],
                "grad_final_state": finals[b : b + 1],
            }
        )
        for name, gradient in zip(NAMES, got, strict=True):
            expected = want[name][0] if name == "initial_state" else tokens_first(want[name])
            part = gradient[b] if name == "initial_state" else gradient[start:stop]
            np.testing.assert_allclose(
                part, expected, rtol=1e-10, atol=1e-10, err_msg=f"{b} {name}"
            )


@pytest.mark.parametrize("low", ["float16", "float32"])
def test_gradients_have_their_inputs_dtypes(low: str) -> None:
    """REC-7.3: each gradient has its input's dtype (the past state's gradient float32 for
    a float32 past state with float16 inputs)."""
    rng = np.random.default_rng(19)
    problem = _with_upstream(rng, recurrent_problem(rng, rule="gated_delta", length=3))
    cast = {
        n: a.astype(low) if n != "initial_state" else a.astype(np.float32)
        for n, a in arrays_of(problem).items()
    }
    got = recurrent_attention_backward(**{**problem, **cast})
    for name, gradient in zip(NAMES, got, strict=True):
        assert gradient.dtype == cast[name].dtype, name


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"grad_out": np.zeros((2, 2, 3, 7))}, "grad_out.shape"),
        ({"grad_final_state": np.zeros((2, 2, 8, 7))}, "grad_final_state.shape"),
    ],
)
def test_bad_upstream_gradient_names_the_argument(change: dict[str, Any], named: str) -> None:
    """REC-7.1: an upstream gradient of the wrong shape raises a ValueError naming it."""
    rng = np.random.default_rng(23)
    problem = _with_upstream(rng, recurrent_problem(rng, rule="gated_delta", length=3))
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        recurrent_attention_backward(**{**problem, **change})
