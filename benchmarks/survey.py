"""The backend survey behind ``attnspec backends``: the reference on every backend here.

For every backend usable on this machine (and the reason for each that is not) and each
dtype it supports, the reference computes one fixed random problem that touches the
hard parts of the spec at once (grouped-query heads, bottom-right causal with Lq != Lk,
a boolean mask, E != Ev), and the row reports how far the result is from the float64
evaluation of the definition on the same rounded inputs (TOL-1), absolutely and as a
fraction of the TOL-2 bound.  A ratio <= 1 means the reference met its own spec there.
(The float64 target is computed by the reference on NumPy, so NumPy's float64 row is 0
by construction; the other rows compare two different libraries or dtypes.)  Each library
runs in ``REFERENCE_CONFIG`` (JAX: x64 on, float32 matmuls in true float32).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..backends import BACKEND_NAMES, REFERENCE_CONFIG, Backend, BackendError
from ..reference.attention import scaled_dot_product_attention
from ..reference.tolerance import error_bound

# (batch, Hq, Hkv, Lq, Lk, E, Ev): GQA with G = 2, Lq < Lk so bottom-right matters.
PROBLEM_SHAPE = (2, 4, 2, 5, 9, 16, 8)
MASK_DENSITY = 0.8


class SurveyRow(NamedTuple):
    """One backend and dtype; or, with ``reason`` set, a backend that cannot run here."""

    backend: str
    device: str
    dtype: str | None
    max_abs_error: float | None
    bound_ratio: float | None  # max over output elements of |out - out64| / TOL-2 bound
    reason: str | None = None

    @property
    def within_bound(self) -> bool:
        return self.reason is None and self.bound_ratio is not None and self.bound_ratio <= 1.0


def survey_problem(seed: int = 0) -> dict[str, np.ndarray]:
    """The fixed float64 problem of the survey: q, k, v and a boolean mask."""
    batch, n_q_heads, n_kv_heads, n_queries, n_keys, head_dim, value_dim = PROBLEM_SHAPE
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((batch, n_q_heads, n_queries, head_dim)),
        "k": rng.standard_normal((batch, n_kv_heads, n_keys, head_dim)),
        "v": rng.standard_normal((batch, n_kv_heads, n_keys, value_dim)),
        "mask": rng.random((batch, 1, n_queries, n_keys)) < MASK_DENSITY,
    }


def _measure(backend: Backend, dtype: str, problem: dict[str, np.ndarray]) -> SurveyRow:
    q, k, v = (backend.asarray(problem[n], dtype=dtype) for n in ("q", "k", "v"))
    mask = backend.asarray(problem["mask"])
    out = scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=True, causal_alignment="bottom_right"
    )
    # TOL-1: the target is the definition on the values the computation actually saw.
    seen = [np.asarray(backend.to_numpy(a), dtype=np.float64) for a in (q, k, v)]
    bound = error_bound(
        *seen, dtype=dtype, mask=problem["mask"], is_causal=True, causal_alignment="bottom_right"
    )
    error = np.abs(np.asarray(backend.to_numpy(out), dtype=np.float64) - bound.out)
    return SurveyRow(
        backend=backend.name,
        device=str(backend.device),
        dtype=dtype,
        max_abs_error=float(np.max(error)),
        bound_ratio=float(np.max(error / bound.out_tolerance)),
    )


def survey(seed: int = 0) -> list[SurveyRow]:
    """One row per usable backend and supported dtype, one per unusable backend."""
    problem = survey_problem(seed)
    rows: list[SurveyRow] = []
    for name in BACKEND_NAMES:
        try:
            backend = Backend(name, config=REFERENCE_CONFIG.get(name))
        except BackendError as exc:
            rows.append(SurveyRow(name, "", None, None, None, reason=str(exc)))
            continue
        rows.extend(_measure(backend, dtype, problem) for dtype in backend.dtype_names)
    return rows


def format_survey(rows: list[SurveyRow]) -> str:
    """A plain-text table of :func:`survey`'s rows, unusable backends last."""
    header = ("backend", "device", "dtype", "max |out - out64|", "/ TOL-2 bound", "verdict")
    table = [header]
    for row in rows:
        if row.reason is None:
            table.append(
                (
                    row.backend,
                    row.device,
                    row.dtype or "",
                    f"{row.max_abs_error:.3e}",
                    f"{row.bound_ratio:.3f}",
                    "within TOL-2" if row.within_bound else "OUTSIDE TOL-2",
                )
            )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    unusable = [row for row in rows if row.reason is not None]
    if unusable:
        lines.append("")
        lines.extend(f"{row.backend}: not usable here: {row.reason}" for row in unusable)
    return "\n".join(lines)
