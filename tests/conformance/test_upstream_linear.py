"""Pins of flash-linear-attention's divergences in docs/divergences.md (fla 0.6.0's naive
PyTorch forms on the CPU): each test runs the library's function on the write-up's minimal
case and asserts today's divergent answer next to the float64 recurrence of
tests/oracle_recurrent.py, so it fails when upstream changes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from oracle_recurrent import recurrence

torch = pytest.importorskip("torch", reason="flash-linear-attention is a PyTorch library")
pytest.importorskip("triton", reason="importing flash-linear-attention imports Triton")
with warnings.catch_warnings():  # "Triton is not supported on current platform": the CPU
    warnings.simplefilter("ignore")
    naive_gdn, naive_kda, naive_simple_gla = (
        pytest.importorskip(f"fla.ops.{name}.naive", reason="the functions pinned here are fla's")
        for name in ("gated_delta_rule", "kda", "simple_gla")
    )

F16 = torch.float16
# one token, q = k = v = 1, g = 0, beta = 1: the state and the output are 1
ONE = torch.ones(1, 1, 1, 1, dtype=F16)  # [B, T, H, K]
ZERO_GATE, UNIT_BETA = torch.zeros(1, 1, 1, dtype=F16), torch.ones(1, 1, 1, dtype=F16)


def _oracle(rule: str) -> tuple[list[float], list[float]]:
    ones = np.ones((1, 1, 1, 1))
    out, state = recurrence(
        ones, ones, ones, rule=rule, g=np.zeros((1, 1, 1)), beta=np.ones((1, 1, 1))
    )
    return out.ravel().tolist(), state.ravel().tolist()


@pytest.mark.parametrize(
    "form", ["naive_recurrent_gated_delta_rule", "naive_chunk_gated_delta_rule"]
)
def test_upstream_fla_gated_delta_naive_output_is_float32(form: str) -> None:
    """docs/divergences.md#fla-naive-float32-output: REC-4.2 gives the output in q's
    dtype; fla's naive gated delta rules return a float16 call's output in float32 (its
    value is the definition's)."""
    out, state = getattr(naive_gdn, form)(
        ONE, ONE, ONE, g=ZERO_GATE, beta=UNIT_BETA, output_final_state=True
    )
    assert _oracle("gated_delta") == ([1.0], [1.0])
    assert out.dtype == torch.float32 and out.ravel().tolist() == [1.0]
    assert state.dtype == torch.float32 and state.ravel().tolist() == [1.0]


def test_upstream_fla_chunk_simple_gla_output_is_float32() -> None:
    """docs/divergences.md#fla-naive-float32-output: the same in naive_chunk_simple_gla,
    where naive_recurrent_simple_gla casts back to q's dtype (REC-4.2)."""
    chunked, _ = naive_simple_gla.naive_chunk_simple_gla(
        ONE, ONE, ONE, ZERO_GATE, output_final_state=True
    )
    token_by_token, _ = naive_simple_gla.naive_recurrent_simple_gla(ONE, ONE, ONE, ZERO_GATE)
    assert _oracle("gated")[0] == [1.0]
    assert chunked.dtype == torch.float32 and chunked.ravel().tolist() == [1.0]
    assert token_by_token.dtype == F16 and token_by_token.ravel().tolist() == [1.0]


def test_upstream_fla_chunk_kda_refuses_a_partial_chunk() -> None:
    """docs/divergences.md#fla-naive-chunk-kda-length: REC-5.1 lets the chunk size have no
    effect whether or not it divides T; naive_chunk_kda asserts T % chunk_size == 0 (one
    token, chunks of 64), and gives the definition with chunks of 1."""
    gate = torch.zeros(1, 1, 1, 1, dtype=F16)  # per key channel
    with pytest.raises(AssertionError):
        naive_kda.naive_chunk_kda(ONE, ONE, ONE, gate, UNIT_BETA, output_final_state=True)
    out, state = naive_kda.naive_chunk_kda(
        ONE, ONE, ONE, gate, UNIT_BETA, output_final_state=True, chunk_size=1
    )
    assert (out.ravel().tolist(), state.ravel().tolist()) == _oracle("gated_delta")
    assert out.dtype == F16
