"""MLA-1 … MLA-3: multi-head latent attention in its absorbed form, called
``fn(q (..., Hq, Lq, r + d_r), kv (..., 1, Lk, r + d_r), scale=, is_causal=)``.

The kernel's latent width r and rotary part d_r are declared (DeepSeek V3: 512 and 64, so
E = 576 and Ev = 512); the suite draws decode and short prefill rows against caches of up to
a few thousand latent positions, many query heads on the one latent head, and the model's
scale (192^-1/2 times a YaRN factor), never the 576^-1/2 a kernel's default would give.
The output is compared with the definition (multi-query attention whose values are kv's
first r channels) within TOL-2 (MLA-3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from ....reference.tolerance import error_bound
from ...draw import sizes
from ...draw.strategies import draw_dtype, random_values
from ..assertions import assert_elements_within, unlike_array
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import family_only, register

REALISTIC_HEADS = (16,)  # DeepSeek V3's 128 heads over 8 devices (E = 576 keeps it costly)
REALISTIC_QUERIES = (1, 2, 4)  # decode, and speculative decoding's few rows
REALISTIC_KEYS = (1, 64, 65, 1025)  # FlashMLA's pages are 64; past one block of 1024
# the un-absorbed heads' scale (128 + 64)^-1/2, and times a YaRN factor mscale^2
SCALES = (192**-0.5, 192**-0.5 * 1.3**2)


_mla_only = family_only("mla", "the kernel is not declared multi-head latent attention (--mla)")


@dataclass(frozen=True)
class MlaCall:
    """One call, float64 values exact in ``dtype``: ``q (B, Hq, Lq, E)``, ``kv (B, 1, Lk,
    E)``."""

    q: np.ndarray
    kv: np.ndarray
    scale: float
    is_causal: bool
    dtype: str

    def describe(self) -> str:
        return (
            f"q {self.q.shape} and kv {self.kv.shape} in {self.dtype}, scale {self.scale:.6g}, "
            f"{'causal' if self.is_causal else 'not causal'}"
        )


@register("mla-matches-reference", "MLA-3", applies=_mla_only)
def mla_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Decode and short prefill rows of many query heads against one latent head, with the
    model's explicit scale: the output (kv's first r channels as values) within TOL-2 of
    the definition.  A kernel that applies its own 1/sqrt(E), reads the values from other
    channels or aligns causal rows top-left is outside it."""
    claim = kernel.declaration.mla
    assert claim is not None  # the property applies only to an --mla declaration
    dtype = draw_dtype(data, kernel)
    head_dim = claim.value_dim + claim.rope_dim
    n_heads, n_queries, n_keys = sizes.draw_per_stratum(
        data,
        {
            "Hq": (REALISTIC_HEADS, (1, 3)),
            "Lq": (REALISTIC_QUERIES, (1, 3)),
            "Lk": (REALISTIC_KEYS, (1, 9)),
        },
    )
    batch = data.draw(st.integers(1, 2), label="B")
    is_causal = kernel.declaration.causal and data.draw(st.booleans(), label="is_causal")
    scale = data.draw(st.sampled_from(SCALES), label="scale")
    # E = r + d_r is in the hundreds: values from a seeded generator, not a Hypothesis
    # byte per element (which would cost thousands of draws per example)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))
    q = random_values(kernel, rng, (batch, n_heads, n_queries, head_dim), dtype)
    kv = random_values(kernel, rng, (batch, 1, n_keys, head_dim), dtype)
    call = MlaCall(q, kv, scale, is_causal, dtype)
    backend = kernel.backend
    keywords = {**kernel.declaration.extra_kwargs, "scale": scale}
    if kernel.declaration.causal:
        keywords["is_causal"] = is_causal
    try:
        out = kernel.call_raw((backend.asarray(q, dtype), backend.asarray(kv, dtype)), keywords)
    except Exception as exc:
        raise KernelRaised(
            f"the MLA kernel raised {type(exc).__name__}: {str(exc)[:300]} "
            f"[call: {call.describe()}]"
        ) from exc
    shape = (batch, n_heads, n_queries, claim.value_dim)
    shown = unlike_array(backend, out, shape, dtype)
    if shown:
        raise PropertyFailure(
            f"the MLA kernel returned {shown}, but should return one array of shape {shape} "
            f"(B, Hq, Lq, r) in {dtype} (MLA-1) [call: {call.describe()}]"
        )
    actual = kernel.numpy(out)
    bound = error_bound(
        q,
        kv,
        kv[..., : claim.value_dim],
        dtype=dtype,
        is_causal=is_causal,
        causal_alignment=kernel.declaration.causal_alignment,
        scale=scale,
        weights=False,
    )
    expected, tolerance = np.asarray(bound.out), np.asarray(bound.out_tolerance)
    note = (
        f"MLA-1, MLA-2, MLA-3: values kv[..., :{claim.value_dim}], the scale given, "
        f"not 1/sqrt({head_dim})"
    )
    assert_elements_within(
        "out", actual, expected, tolerance, lambda at: note, f" [call: {call.describe()}]"
    )
