"""Scale (SDPA-2.1, SDPA-2.2), sparse (SPARSE-6) and linear (LIN-2.1, LIN-5.2, LIN-6.2)
properties: each passes on correct kernels and fails on a realistic buggy one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support import backend_or_skip, compiling, verdict_of

import attnspec
from attnspec.backends import Backend
from attnspec.conformance import KernelUnderTest, LinearClaim, SparseClaim, declare
from attnspec.conformance.judge.verdict import FAILED, PASSED, WARNING
from attnspec.conformance.run.property_runner import PROFILES, Profile
from attnspec.reference import elu_plus_one, linear_attention, sparse_attention, sparse_mask

NUMPY = Backend("numpy")


def assert_status(
    fn: Callable[..., Any], property_id: str, status: str, backend: Backend = NUMPY
) -> None:
    result = verdict_of(property_id, fn, backend=backend)
    assert result.status == status, (property_id, result.detail, result.counterexample)


# --- SDPA-2: the score scale ---------------------------------------------------------------


def reference_with_scale(choose: Callable[[int, int, float | None], float | None]) -> Any:
    def kernel(q, k, v, *, mask=None, is_causal=False, scale=None):
        chosen = choose(q.shape[-1], v.shape[-1], scale)
        return attnspec.scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=is_causal, scale=chosen
        )

    return declare(kernel, gqa=True)


def _default(head_dim: int) -> float:
    return 1 / math.sqrt(head_dim)


SCALE_BUGS = {
    "divides by E": lambda e, ev, s: 1 / e if s is None else s,
    "divides by sqrt(Ev)": lambda e, ev, s: 1 / math.sqrt(ev) if s is None else s,
    "no scale at all": lambda e, ev, s: 1.0 if s is None else s,
    "scale applied twice": lambda e, ev, s: (_default(e) if s is None else s) ** 2,
}


@pytest.mark.parametrize("property_id", ["default-scale", "explicit-scale", "score-variance"])
def test_scale_properties_pass_on_the_reference_and_torch(property_id: str) -> None:
    """SDPA-2.1, SDPA-2.2: the reference and PyTorch SDPA scale exactly as specified."""
    torch = pytest.importorskip("torch", reason="torch is an optional backend")
    assert_status(reference_with_scale(lambda e, ev, s: s), property_id, PASSED)
    assert_status(
        torch.nn.functional.scaled_dot_product_attention,
        property_id,
        PASSED,
        backend_or_skip("torch"),
    )


@pytest.mark.parametrize("bug", sorted(SCALE_BUGS))
@pytest.mark.parametrize("property_id", ["default-scale", "score-variance"])
def test_default_scale_bugs_are_caught(bug: str, property_id: str) -> None:
    """SDPA-2.1: 1/E, 1/sqrt(Ev), no scale and scale squared are all rejected."""
    assert_status(reference_with_scale(SCALE_BUGS[bug]), property_id, FAILED)


def test_an_ignored_explicit_scale_is_caught() -> None:
    """SDPA-2.2: a kernel that drops scale= fails explicit-scale but not default-scale."""
    ignores = reference_with_scale(lambda e, ev, s: None)
    assert_status(ignores, "explicit-scale", FAILED)
    assert_status(ignores, "default-scale", PASSED)
    detail = verdict_of("default-scale", reference_with_scale(SCALE_BUGS["divides by E"])).detail
    assert "looks like 1/E" in detail


# --- SPARSE-6 --------------------------------------------------------------------------------

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
SPARSE_PROPERTIES = (
    "sparse-matches-dense",
    "sparse-weights-exactly-zero",
    "sparse-masked-ignored",
    "sparse-masked-nonfinite-ignored",
)


def _pattern(case: str) -> str:
    return case.removesuffix("_bottom_right")


def reference_sparse(case: str) -> Any:
    params, alignment, causal = PATTERNS[case]

    def kernel(q, k, v, *, scale=None):
        return sparse_attention(
            q,
            k,
            v,
            pattern=_pattern(case),
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
        sparse=SparseClaim(_pattern(case), params, alignment, causal),
    )


def masked_softmax_kernel(
    case: str, *, fill: float | None = None, zero_after_softmax: bool = False, left_shift: int = 0
) -> Any:
    """Dense NumPy attention over the pattern's mask, written independently of the
    reference; the keyword arguments inject one realistic bug each."""
    params, alignment, causal = PATTERNS[case]
    params = dict(params)
    if left_shift:
        params["left"] += left_shift

    def kernel(q, k, v, *, scale=None):
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = np.asarray(
            sparse_mask(
                _pattern(case), n_q, n_k, alignment=alignment, causal=causal, xp=np, **params
            )
        )
        groups = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, groups, axis=-3), np.repeat(v, groups, axis=-3)
        s = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
        if fill is not None:
            s = np.where(mask, s, fill)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            return ((p / p.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)
        masked = np.where(mask, s, -np.inf)
        peak = np.max(masked, axis=-1, keepdims=True, initial=-np.inf)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        with np.errstate(over="ignore"):  # a row whose peak is +inf: exp is inf either way
            e = np.where(mask, np.exp(np.where(mask, s, 0.0) - peak), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        p = e / np.where(total == 0, 1.0, total)
        if zero_after_softmax:
            return (p @ v).astype(q.dtype)  # 0 * NaN of masked values leaks
        out = np.zeros((*p.shape[:-1], v.shape[-1]))
        for index in np.ndindex(*p.shape[:-1]):
            keep = mask[index[-1]]
            out[index] = p[index][keep] @ v[(*index[:-1], keep)] if keep.any() else 0.0
        return out.astype(q.dtype)

    return declare(
        kernel,
        gqa=True,
        mask=False,
        causal=False,
        sparse=SparseClaim(_pattern(case), PATTERNS[case][0], alignment, causal),
    )


@pytest.mark.parametrize("case", sorted(PATTERNS))
@pytest.mark.parametrize("property_id", SPARSE_PROPERTIES)
def test_sparse_properties_pass_on_correct_kernels(case: str, property_id: str) -> None:
    """SPARSE-6.1..6.4: the reference's gather kernels and an independent dense-masked
    NumPy kernel both pass for every pattern."""
    assert_status(reference_sparse(case), property_id, PASSED)
    assert_status(masked_softmax_kernel(case), property_id, PASSED)


def test_family_kernels_must_keep_the_dtype() -> None:
    """SDPA-1.3 for sparse and linear kernels: an output upcast to float64 fails the family's
    matching property, not just a dense-only one."""
    sparse = reference_sparse("sliding_window")

    def upcast_sparse(q, k, v, *, scale=None):
        return sparse(q, k, v, scale=scale).astype(np.float64)

    upcast_sparse.__attnspec__ = sparse.__attnspec__
    assert "dtype" in verdict_of("sparse-matches-dense", upcast_sparse).detail
    linear = reference_linear()

    def upcast_linear(q, k, v, *, is_causal=False):
        return linear(q, k, v, is_causal=is_causal).astype(np.float64)

    upcast_linear.__attnspec__ = linear.__attnspec__
    assert "dtype" in verdict_of("linear-matches-formula", upcast_linear).detail


def test_sparse_bugs_are_caught() -> None:
    """SPARSE-6: a window one key too wide, a finite -1e9 fill (tiny weights, mean(V) on
    empty rows) and a 0 * NaN leak are each caught by the property of their clause; the
    weights' leaks with the weights observed in column blocks too (SDPA-7.1, as on a
    backend that compiles per shape)."""
    assert_status(
        masked_softmax_kernel("sliding_window", left_shift=1), "sparse-matches-dense", FAILED
    )
    assert_status(
        masked_softmax_kernel("sliding_window", left_shift=1), "sparse-weights-exactly-zero", FAILED
    )
    assert_status(
        masked_softmax_kernel("sliding_window", left_shift=1), "sparse-masked-ignored", FAILED
    )
    assert_status(
        masked_softmax_kernel("sliding_window", fill=-1e9), "sparse-weights-exactly-zero", FAILED
    )
    # the weights observed in column blocks, as on a backend that compiles per shape
    for bug in (dict(left_shift=1), dict(fill=-1e9)):
        assert_status(
            masked_softmax_kernel("sliding_window", **bug),
            "sparse-weights-exactly-zero",
            FAILED,
            compiling(),
        )
    assert_status(
        masked_softmax_kernel("strided", zero_after_softmax=True),
        "sparse-masked-nonfinite-ignored",
        WARNING,
    )


# --- LIN: linear attention -------------------------------------------------------------------


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


def quadratic_linear(q, k, v, *, is_causal=False):
    """elu+1 linear attention as the explicit quadratic form, written independently."""
    groups = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, groups, axis=-3), np.repeat(v, groups, axis=-3)
    phi_q, phi_k = (np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))) for x in (q, k))
    a = phi_q @ np.swapaxes(phi_k, -1, -2)
    if is_causal:
        a = a * np.tril(np.ones(a.shape[-2:], dtype=bool))
    total = a.sum(axis=-1, keepdims=True)
    return ((a @ v) / np.where(total == 0, 1, total)).astype(q.dtype)


@pytest.mark.parametrize("property_id", ["linear-matches-formula", "linear-causal-prefix"])
def test_linear_properties_pass_on_correct_kernels(property_id: str) -> None:
    """LIN-5.2, LIN-2.1: the reference (both alignments) and an independent quadratic form."""
    assert_status(reference_linear(), property_id, PASSED)
    assert_status(reference_linear("bottom_right"), property_id, PASSED)
    assert_status(
        declare(quadratic_linear, gqa=True, mask=False, scale=False, linear=LinearClaim("elu+1")),
        property_id,
        PASSED,
    )


def test_linear_bugs_are_caught() -> None:
    """LIN-3.1 via LIN-5.2: an undeclared eps=1e-6; LIN-2.1: the other causal alignment;
    LIN-4.2: relu declared while elu+1 is computed."""
    assert_status(reference_linear(eps=1e-6), "linear-matches-formula", FAILED)
    assert_status(reference_linear(eps=1e-6, declared_eps=1e-6), "linear-matches-formula", PASSED)
    assert_status(
        reference_linear("bottom_right", declared_alignment="top_left"),
        "linear-causal-prefix",
        FAILED,
    )
    wrong_map = declare(quadratic_linear, mask=False, scale=False, linear=LinearClaim("relu"))
    assert_status(wrong_map, "linear-matches-formula", FAILED)


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


def test_favor_acceptance_passes_a_correct_estimator_and_rejects_biased_ones() -> None:
    """LIN-6.2: an independent NumPy FAVOR+ passes; a missing key factor exp(-|y|^2/2) and
    drawing 4 features while declaring 4096 are rejected."""
    assert_status(numpy_favor(4096), "favor-error-bound", PASSED)
    assert_status(numpy_favor(4096, key_factor=False), "favor-error-bound", FAILED)
    assert_status(numpy_favor(4096, drawn=4), "favor-error-bound", FAILED)


ZERO_FALSE_FAILURE_SEEDS = range(20)


@pytest.mark.parametrize("case", sorted(PATTERNS))
def test_sparse_reference_passes_over_20_seeds(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPARSE-6.1..6.4, zero false failures: the reference's sparse kernels pass every sparse
    property on 20 seeds (2 examples each, a fresh Hypothesis stream per seed)."""
    monkeypatch.setitem(PROFILES, "seeded", Profile(2))
    kernel = KernelUnderTest(reference_sparse(case), NUMPY)
    for property_id in SPARSE_PROPERTIES:
        for seed in ZERO_FALSE_FAILURE_SEEDS:
            result = verdict_of(property_id, kernel, profile="seeded", seed=seed)
            assert result.status == PASSED, (property_id, seed, result.detail)


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_linear_reference_passes_over_20_seeds(
    alignment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LIN-5.2, LIN-2.1, zero false failures: the reference's linear attention passes on
    20 seeds (2 examples each)."""
    monkeypatch.setitem(PROFILES, "seeded", Profile(2))
    kernel = KernelUnderTest(reference_linear(alignment), NUMPY)
    for property_id in ("linear-matches-formula", "linear-causal-prefix"):
        for seed in ZERO_FALSE_FAILURE_SEEDS:
            result = verdict_of(property_id, kernel, profile="seeded", seed=seed)
            assert result.status == PASSED, (property_id, seed, result.detail)


@pytest.mark.parametrize("property_id", ["deterministic", "inputs-unmodified"])
def test_generic_properties_apply_to_every_family(property_id: str) -> None:
    """SDPA-7.5, SDPA-1.6 hold for sparse, linear and FAVOR+ kernels too (CONF-3: claimed by
    being an attention kernel at all); block-sparse layouts get lengths they allow."""
    for case in ("block_sparse", "bigbird"):
        assert_status(reference_sparse(case), property_id, PASSED)
    assert_status(reference_linear(), property_id, PASSED)
    assert_status(numpy_favor(64), property_id, PASSED)


def test_generic_property_bugs_in_other_families_are_caught() -> None:
    """SDPA-7.5: a FAVOR+ kernel that ignores its seed (fresh features each call) is not
    deterministic; SDPA-1.6: a linear kernel that rescales q in place modifies its input."""
    seeded = numpy_favor(64)

    def ignores_seed(q, k, v, *, seed, is_causal=False):
        return seeded(q, k, v, seed=int(np.random.default_rng().integers(1 << 30)))

    ignores_seed.__attnspec__ = seeded.__attnspec__
    assert_status(ignores_seed, "deterministic", FAILED)
    linear = reference_linear()

    def scales_q_in_place(q, k, v, *, is_causal=False):
        q *= 0.5
        return linear(q, k, v, is_causal=is_causal)

    scales_q_in_place.__attnspec__ = linear.__attnspec__
    assert_status(scales_q_in_place, "inputs-unmodified", FAILED)
