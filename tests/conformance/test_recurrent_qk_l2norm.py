"""REC-2.4 as a declaration (``--recurrent-qk-l2norm EPS``, RecurrentClaim.qk_l2norm): a
recurrent kernel that L2-normalises q and k itself, as flash-linear-attention's and
transformers' ``use_qk_l2norm_in_kernel=True`` do, is given keys of any norm and compared
with the recurrence on the normalised inputs; the declaration and the kernel must agree."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from attnspec.conformance import RecurrentClaim, check, declare
from attnspec.conformance.claims.declaration import KernelDeclaration
from attnspec.reference.recurrent import recurrent_attention

EPS = 1e-6


def _kernel(normalises: bool) -> Any:
    def kernel(
        q: Any, k: Any, v: Any, *, g: Any = None, beta: Any = None, initial_state: Any = None
    ) -> tuple[Any, Any]:
        wide = [None if a is None else np.asarray(a, np.float32) for a in (q, k, v, g, beta)]
        state = None if initial_state is None else np.asarray(initial_state, np.float32)
        out, final = recurrent_attention(
            *wide[:3],
            g=wide[3],
            beta=wide[4],
            initial_state=state,
            normalize_qk=normalises,
            norm_eps=EPS,
        )
        return out.astype(q.dtype), final.astype(np.float32)

    return kernel


def _verdict(normalises: bool, declared: float | None) -> str:
    claim = RecurrentClaim("gated_delta", chunk_size=1, qk_l2norm=declared)
    fn = declare(_kernel(normalises), recurrent=claim, dtypes=("float32",))
    report = check(
        fn, backend="numpy", only="recurrent-matches-reference", max_len=9, max_head_dim=8
    )
    return report.verdicts[0].status


@pytest.mark.parametrize(
    ("normalises", "declared", "status"),
    [(True, EPS, "passed"), (False, EPS, "failed"), (True, None, "failed")],
)
def test_in_kernel_normalisation_is_checked_as_declared(
    normalises: bool, declared: float | None, status: str
) -> None:
    """REC-2.4: a kernel that normalises passes when it declares it; one that declares it
    and does not (keys of any norm) fails, and so does one that normalises undeclared."""
    assert _verdict(normalises, declared) == status


def test_the_epsilon_is_a_finite_float_at_least_zero() -> None:
    """REC-2.4's epsilon >= 0; a bad one is named."""
    for eps in (-1.0, float("inf"), True):
        claim = RecurrentClaim("gated_delta", qk_l2norm=eps)
        with pytest.raises((TypeError, ValueError), match="qk_l2norm"):
            KernelDeclaration(recurrent=claim)
