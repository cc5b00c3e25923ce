"""One attention call in spec terms: the inputs a property draws and a kernel is called on.

A :class:`Problem` holds NumPy float64 arrays whose values are exactly representable in the
dtype under test; the kernel's process turns them into the backend's arrays in that dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np


@dataclass
class Problem:
    """One attention call in spec terms (SDPA-1.1), with float64 NumPy inputs."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dtype: str
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # spec/features.md: the logit softcap, ALiBi slopes (float64 values exact in float32,
    # passed as float32), and dropout (DROP-2) with the kernel's seed
    softcap: float | None = None
    alibi_slopes: np.ndarray | None = None
    dropout_p: float = 0.0
    seed: int | None = None
    # spec/serving.md: the chunk size of chunked local attention (CHUNK-1), attention_chunk=
    chunk: int | None = None

    def with_(self, **changes: Any) -> Problem:
        return replace(self, **changes)

    def required(self, name: Literal["mask", "bias", "alibi_slopes"]) -> np.ndarray:
        """The optional input ``name`` of a problem drawn with one (mask="always" ...)."""
        value: np.ndarray | None = getattr(self, name)
        if value is None:
            raise ValueError(f"{name}: expected a problem that has one, got {self.describe()}")
        return value

    def describe(self) -> str:
        """Shapes, dtype and mask summary for a failure message."""
        parts = [
            f"q{tuple(self.q.shape)}",
            f"k{tuple(self.k.shape)}",
            f"v{tuple(self.v.shape)}",
            f"dtype={self.dtype}",
            f"is_causal={self.is_causal}",
            f"scale={self.scale!r}",
        ]
        if self.mask is not None:
            parts.append(
                f"mask{tuple(self.mask.shape)} ({int(self.mask.sum())}/{self.mask.size} True)"
            )
        if self.bias is not None:
            parts.append(f"bias{tuple(self.bias.shape)}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap!r}")
        if self.alibi_slopes is not None:
            parts.append(f"alibi_slopes{tuple(self.alibi_slopes.shape)}")
        if self.dropout_p or self.seed is not None:
            parts.append(f"dropout_p={self.dropout_p!r}, seed={self.seed!r}")
        if self.chunk is not None:
            parts.append(f"attention_chunk={self.chunk!r}")
        parts.extend(f"{key}={value!r}" for key, value in self.extra.items())
        return ", ".join(parts)
