"""The kernels the property tests of several spec areas share: the reference's sparse and
linear kernels, an independent NumPy FAVOR+, the P @ V of the independent dense and sparse
NumPy kernels (``allowed_values_sum``), and ``assert_status`` (a property's verdict on one
of them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from support import verdict_of

from attnspec.backends import Backend
from attnspec.conformance import LinearClaim, SparseClaim, declare
from attnspec.conformance.judge.verdict import FAILED
from attnspec.reference import elu_plus_one, linear_attention, sparse_attention

NUMPY = Backend("numpy")


def assert_status(
    fn: Callable[..., Any], property_id: str, status: str, backend: Backend = NUMPY
) -> None:
    # an expected failure is run unshrunk (shrink=False: the first failing example as
    # found, the same status); shrinking it only made the message smaller
    result = verdict_of(property_id, fn, backend=backend, shrink=status != FAILED)
    assert result.status == status, (property_id, result.detail, result.counterexample)


PATTERNS = {
    "sliding_window": ({"left": 2, "right": 1}, "top_left", False),
    "sliding_window_bottom_right": ({"left": 3, "right": 0}, "bottom_right", False),
    "strided": ({"stride": 3}, "top_left", True),
    "fixed": ({"stride": 4, "summary": 1}, "top_left", True),
    "block_sparse": ({"block_size": 3, "layout": [[True, False], [True, True]]}, "top_left", False),
    "longformer": ({"left": 1, "right": 1, "global_tokens": (0,)}, "top_left", False),
    "bigbird": (
        {"block_size": 2, "num_random": 1, "seed": 5, "global_blocks": (0,)},
        "top_left",
        False,
    ),
}


def pattern_of(case: str) -> str:
    return case.removesuffix("_bottom_right")


def reference_sparse(case: str) -> Any:
    params, alignment, causal = PATTERNS[case]

    def kernel(q, k, v, *, scale=None):
        return sparse_attention(
            q,
            k,
            v,
            pattern=pattern_of(case),
            alignment=alignment,
            causal=causal,
            scale=scale,
            **params,
        )

    return declare(
        kernel,
        gqa=True,
        mask=False,
        causal=False,
        sparse=SparseClaim(pattern_of(case), params, alignment, causal),
    )


def reference_linear(
    alignment: str = "top_left",
    eps: float = 0.0,
    declared_eps: float = 0.0,
    declared_alignment: str | None = None,
) -> Any:
    def kernel(q, k, v, *, is_causal=False):
        return linear_attention(
            q,
            k,
            v,
            feature_map=elu_plus_one,
            is_causal=is_causal,
            causal_alignment=alignment,
            eps=eps,
        )

    claim = LinearClaim("elu+1", eps=declared_eps, causal_alignment=declared_alignment or alignment)
    return declare(kernel, gqa=True, mask=False, scale=False, linear=claim)


def numpy_favor(num_features: int, *, key_factor: bool = True, drawn: int | None = None) -> Any:
    """FAVOR+ with iid features drawn by NumPy from the seed (independent of the reference);
    ``key_factor=False`` drops exp(-|y|^2/2) on keys, ``drawn`` uses fewer features."""

    def kernel(q, k, v, *, seed, is_causal=False):
        head_dim = q.shape[-1]
        w = np.random.default_rng(seed).standard_normal((drawn or num_features, head_dim))
        x, y = q / head_dim**0.25, k / head_dim**0.25
        phi_x = np.exp(x @ w.T - (x * x).sum(-1, keepdims=True) / 2)
        phi_y = np.exp(y @ w.T - (key_factor * (y * y).sum(-1, keepdims=True) / 2))
        a = phi_x @ np.swapaxes(phi_y, -1, -2)
        return (a @ v) / a.sum(axis=-1, keepdims=True)

    return declare(
        kernel, mask=False, scale=False, linear=LinearClaim("favor+", num_features=num_features)
    )


ZERO_FALSE_FAILURE_SEEDS = range(20)


def allowed_values_sum(weights: np.ndarray, allowed: np.ndarray, v: np.ndarray) -> np.ndarray:
    """sum_j weights_ij v_j over the allowed keys j (``weights`` 0 at the others): P @ V
    with the non-finite values set to 0 (an excluded key's value then adds exactly 0, the
    same bits whatever it was), and term by term in the rows where an allowed key's value
    is not finite, so its NaN or inf reaches the row."""
    finite = np.isfinite(v)
    out: np.ndarray = weights @ np.where(finite, v, 0.0)
    reached = (allowed & ~finite.all(axis=-1)[..., None, :]).any(axis=-1)  # (..., Lq)
    if reached.any():  # (..., Lq, Lk, Ev) terms: the NaN-propagation draws
        terms = np.where(allowed[..., None], weights[..., None] * v[..., None, :, :], 0.0)
        out = np.where(reached[..., None], terms.sum(axis=-2), out)
    return out
