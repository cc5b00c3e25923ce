"""Problems for the tests of spec/recurrent.md: plain NumPy float64 inputs of one update rule.

Keys are L2-normalised unless asked otherwise (the regime of REC-6.3, and what models feed),
gates are log-sigmoids of uniform draws divided by a normaliser (as flash-linear-attention's
tests draw them: weak decay for a large normaliser), beta a sigmoid.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GATED = ("gated", "gated_delta")
DELTA = ("delta", "gated_delta")


def recurrent_problem(
    rng: np.random.Generator,
    *,
    rule: str,
    length: int,
    d_k: int = 8,
    d_v: int = 8,
    heads: tuple[int, int, int] = (2, 2, 2),
    batch: tuple[int, ...] = (2,),
    per_channel: bool = False,
    with_state: bool = True,
    unit_keys: bool = True,
    gate_normalizer: float = 1.0,
) -> dict[str, Any]:
    """Keyword arguments of ``recurrent_attention`` (and of the oracle) as float64 NumPy."""
    h_q, h_k, h_v = heads
    h_s = max(h_k, h_v)
    keys = rng.standard_normal((*batch, h_k, length, d_k))
    if unit_keys:
        keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    problem: dict[str, Any] = {
        "q": rng.standard_normal((*batch, h_q, length, d_k)),
        "k": keys,
        "v": rng.standard_normal((*batch, h_v, length, d_v)),
        "rule": rule,
    }
    if rule in GATED:
        shape = (*batch, h_s, length, d_k) if per_channel else (*batch, h_s, length)
        problem["g"] = -np.log1p(np.exp(-rng.random(shape))) / gate_normalizer
    if rule in DELTA:
        problem["beta"] = 1.0 / (1.0 + np.exp(-rng.standard_normal((*batch, h_s, length))))
    if with_state:
        problem["initial_state"] = rng.standard_normal((*batch, h_s, d_k, d_v))
    return problem


def arrays_of(problem: dict[str, Any]) -> dict[str, Any]:
    """The array-valued entries, for moving them to a backend."""
    return {name: a for name, a in problem.items() if isinstance(a, np.ndarray)}
