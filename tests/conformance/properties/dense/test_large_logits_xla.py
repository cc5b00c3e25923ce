"""SDPA-7.4 on huge float32 scores: JAX under jax.jit diverges (docs/divergences.md
#jax-jit-large-scores), and large-logits tells that overflow from a missing max subtraction."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from support import TESTS

from attnspec.conformance import check
from attnspec.reference import scaled_dot_product_attention as sdpa

# NumPy models of two float32 softmaxes.  ``max_of_rounded_scores`` mimics what XLA:CPU
# compiles a jitted softmax to: the max is of the float32 scores, but exp gets the
# unrounded score minus that max (one fused multiply-add), so s - max is the score's
# rounding error, up to ~|s| 6e-8, not <= 0.  Within TOL-2 on the scores the property
# compares values on; non-finite on scores around 1e29.
KERNELS = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from catalogue.bugs_softmax import no_max_subtraction


def max_of_rounded_scores(q, k, v):
    q, k, v = (np.asarray(x) for x in (q, k, v))
    exact = (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)) * q.shape[-1] ** -0.5
    rounded_max = exact.astype(np.float32).max(axis=-1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp((exact - rounded_max).astype(np.float32))
        return ((e / e.sum(axis=-1, keepdims=True)) @ v).astype(np.float32)
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("large_logits") / "kernels.py"
    path.write_text(KERNELS.format(tests=str(TESTS)))  # where ``catalogue`` is
    return path


def test_large_logits_tells_an_inconsistent_max_from_a_missing_one(kernels: Path) -> None:
    """SDPA-7.4: a kernel that subtracts a max, but of differently rounded scores, fails on
    float32 scores of 1e30 (inside the clause's precondition) and is told that its max
    subtraction works on moderate scores; a softmax without max subtraction is still told
    it needs one.  Before MODERATE_SCORE both were told "needs max subtraction", because
    the moderate re-run used scores of 1e30 again in float32."""
    verdict = check(
        f"{kernels}:max_of_rounded_scores", dtypes=["float32"], only=["large-logits"]
    ).verdicts[0]
    assert verdict.status == "failed", verdict.detail
    assert "so max subtraction works: an intermediate of the kernel overflows" in verdict.detail
    assert "needs max subtraction" not in verdict.detail, verdict.detail
    verdict = check(
        f"{kernels}:no_max_subtraction", dtypes=["float32"], only=["large-logits"]
    ).verdicts[0]
    assert re.search(
        "where exp (over|under)flows but q k\\^T does not: the softmax needs max subtraction",
        verdict.detail,
    ), verdict.detail


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_upstream_jax_jit_overflows_on_huge_float32_scores() -> None:
    """docs/divergences.md#jax-jit-large-scores: SDPA-7.4 (MUST) requires a finite output for
    float32 scores of +-9e28 (finite in float32); the definition is exactly 1, eager
    jax.nn.dot_product_attention gives 1, under jax.jit it gives NaN because s - max(s) is
    the product's rounding error 2.468e21.  Fails when upstream changes it."""
    import jax
    import jax.numpy as jnp

    q = jnp.full((1, 1, 1, 1), 3e14, jnp.float32)
    k = jnp.asarray([3e14, -3e14], jnp.float32).reshape(1, 2, 1, 1)
    v = jnp.asarray([1.0, 2.0], jnp.float32).reshape(1, 2, 1, 1)
    want = sdpa(
        np.asarray(q, np.float64)[0].transpose(1, 0, 2),
        np.asarray(k, np.float64)[0].transpose(1, 0, 2),
        np.asarray(v, np.float64)[0].transpose(1, 0, 2),
    )
    assert want.ravel().tolist() == [1.0]
    assert np.asarray(jax.nn.dot_product_attention(q, k, v)).ravel().tolist() == [1.0]
    assert np.isnan(np.asarray(jax.jit(jax.nn.dot_product_attention)(q, k, v))).all()
    q2, k2 = q[0, :, 0], k[0, :, 0]
    shifted = jax.jit(lambda q, k: (q @ k.T) - (q @ k.T).max(axis=-1, keepdims=True))(q2, k2)
    exact = np.float64(np.float32(3e14)) ** 2  # exact: a 24-bit times a 24-bit significand
    assert float(shifted[0, 0]) == float(np.float32(exact - float(np.float32(exact))))
    assert float(shifted[0, 0]) > 88.0  # exp of it overflows float32
