"""CONF-7: a waived SDPA-5.1 leaves out only the rows it fixes.

For a kernel that declares ``empty_rows_zero=False``, rows-sum-to-one and the SDPA-7.6
invariances do not judge a row with no allowed key (catalogue kernel masked-fill-mean-v
passes them: tests/catalogue/test_correct_pass.py).  Each kernel here is that kernel with
a bug in the rows that have keys, and each property must still find it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from catalogue.correct import masked_fill_attention
from support import verdict_of

from attnspec.conformance import declaration_of
from attnspec.conformance.judge.verdict import FAILED

WAIVING = declaration_of(masked_fill_attention)


def _with_bias(extra: Callable[[int, int], np.ndarray]) -> Callable[..., Any]:
    """masked-fill-mean-v with ``extra(Lq, Lk)`` added to every score (a bias of its own)."""

    def kernel(q: Any, k: Any, v: Any, *, bias: Any = None, **options: Any) -> Any:
        own = extra(q.shape[-2], k.shape[-2]).astype(q.dtype)
        return masked_fill_attention(q, k, v, bias=own if bias is None else bias + own, **options)

    return kernel


def _last_key_boosted(n_q: int, n_k: int) -> np.ndarray:
    return np.where(np.arange(n_k) == n_k - 1, 0.5, 0.0)


def _first_query_boosted(n_q: int, n_k: int) -> np.ndarray:
    boost = np.zeros((n_q, n_k))
    boost[:1, :1] = 0.5
    return boost


def _squared(q: Any, k: Any, v: Any, **options: Any) -> Any:
    out = masked_fill_attention(q, k, v, **options)
    return out + (out * out / 8).astype(out.dtype)


def _scaled(q: Any, k: Any, v: Any, **options: Any) -> Any:
    return (masked_fill_attention(q, k, v, **options) * 1.0625).astype(q.dtype)


def _bias_clamped(q: Any, k: Any, v: Any, *, bias: Any = None, **options: Any) -> Any:
    clamped = None if bias is None else np.clip(bias, -64, 64)
    return masked_fill_attention(q, k, v, bias=clamped, **options)


BROKEN = [
    ("key-permutation", _with_bias(_last_key_boosted)),
    ("query-permutation", _with_bias(_first_query_boosted)),
    ("value-linearity", _squared),
    ("rows-sum-to-one", _scaled),
    ("bias-shift-invariance", _bias_clamped),
]


@pytest.mark.parametrize(("prop", "kernel"), BROKEN, ids=[p for p, _ in BROKEN])
def test_a_waiving_kernel_is_still_judged_on_rows_with_keys(
    prop: str, kernel: Callable[..., Any]
) -> None:
    """SDPA-7.1, SDPA-7.6, CONF-7: the property fails a kernel that waives SDPA-5.1 and is
    wrong on rows that have an allowed key."""
    # the first failing example decides the status: not shrunk (only the status is asserted,
    # as tests/catalogue/test_caught.py)
    verdict = verdict_of(prop, kernel, declaration=WAIVING, profile="quick", shrink=False)
    assert verdict.status == FAILED, (verdict.status, verdict.detail)
