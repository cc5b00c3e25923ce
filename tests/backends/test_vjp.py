"""Backend.vjp: each library's own automatic differentiation (spec/backward.md, BWD-1).

On torch, the vector-Jacobian product of the forward reference equals the reference's
analytic backward (BWD-1, BWD-10), within the BWD-17 bound of float64 (JAX's: in
tests/reference/test_backward.py, which runs it through Backend.vjp too); every backend with
automatic differentiation gives unused inputs a zero gradient and checks its cotangents, and
a backend without one (NumPy, array-api-strict) says so.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends import Backend, BackendError
from attnspec.reference import scaled_dot_product_attention
from attnspec.reference.tolerance_backward import gradient_error_bound


def test_vjp_of_the_forward_reference_is_its_backward(cpu_backend: Backend) -> None:
    """BWD-1, BWD-10: the library's VJP of the forward reference (output and log-sum-exp,
    a bias, GQA, causal) is the reference backward, within the float64 bound."""
    if not cpu_backend.differentiates:
        with pytest.raises(BackendError, match=cpu_backend.name):
            cpu_backend.vjp(lambda x: x, (cpu_backend.asarray(np.zeros(2)),), (None,))
        pytest.skip(f"{cpu_backend.name} has no automatic differentiation (checked it says so)")
    if cpu_backend.name == "jax":
        pytest.skip("JAX's VJP of the reference is tests/reference/test_backward.py's (slow eager)")
    rng = np.random.default_rng(31)
    q, k, v = (
        rng.standard_normal((4, 5, 3)),
        rng.standard_normal((2, 6, 3)),
        rng.standard_normal((2, 6, 2)),
    )
    bias = rng.standard_normal((5, 6))
    grad_out, grad_lse = rng.standard_normal((4, 5, 2)), rng.standard_normal((4, 5))
    b = cpu_backend

    def forward(q_: object, k_: object, v_: object, bias_: object) -> tuple[object, object]:
        out, lse = scaled_dot_product_attention(
            q_, k_, v_, bias=bias_, is_causal=True, causal_alignment="bottom_right", return_lse=True
        )
        return out, lse

    primals = tuple(b.asarray(a, "float64") for a in (q, k, v, bias))
    outputs, grads = b.vjp(
        forward, primals, (b.asarray(grad_out, "float64"), b.asarray(grad_lse, "float64"))
    )
    assert len(outputs) == 2 and len(grads) == 4
    bound = gradient_error_bound(
        q,
        k,
        v,
        grad_out,
        dtype="float64",
        grad_lse=grad_lse,
        bias=bias,
        is_causal=True,
        causal_alignment="bottom_right",
    )
    for grad, expected, tolerance in zip(grads, bound[:4], bound[4:], strict=True):
        got = np.asarray(b.to_numpy(grad), dtype=np.float64)
        assert got.shape == expected.shape
        assert np.all(np.abs(got - expected) <= tolerance)
    assert np.array_equal(b.to_numpy(primals[0]), q), "the caller's arrays are not changed"


def test_an_unused_primal_gets_a_zero_gradient(cpu_backend: Backend) -> None:
    """BWD-3: a primal the function does not read has a VJP of exactly 0, not None."""
    if not cpu_backend.differentiates:
        pytest.skip(f"{cpu_backend.name} has no automatic differentiation")
    b = cpu_backend
    x, y = b.asarray(np.arange(3.0), "float64"), b.asarray(np.ones(2), "float64")
    _, (dx, dy) = b.vjp(lambda x_, y_: x_ * 2.0, (x, y), (b.asarray(np.ones(3), "float64"),))
    assert np.array_equal(b.to_numpy(dx), [2.0, 2.0, 2.0])
    assert np.array_equal(b.to_numpy(dy), [0.0, 0.0])


def test_a_wrong_number_of_cotangents_is_rejected(cpu_backend: Backend) -> None:
    """BWD-1: one cotangent per result, or a ValueError that says how many."""
    if not cpu_backend.differentiates:
        pytest.skip(f"{cpu_backend.name} has no automatic differentiation")
    b = cpu_backend
    x = b.asarray(np.ones(2), "float64")
    with pytest.raises(ValueError, match="1 results, but 2 cotangents"):
        b.vjp(lambda x_: x_ * 2.0, (x,), (x, x))
