"""Rotary position embeddings (ROPE-1, ROPE-3) as people write them, in NumPy: three
correct formulations and the bugs that real implementations had.

Every function is ``fn(x (B, H, L, d), positions (B, 1, L)) -> (B, H, L, d)`` and declares
its pairing (``RopeClaim``).  The correct ones follow the precision ROPE-3 assumes: angles in
the accumulation precision (float32 for float16, the dtype itself otherwise), cosines and
sines then stored in the input dtype and the rotation done in it, as Hugging Face does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnspec.conformance import RopeClaim, declare

from .entry import CaughtBug

Array = np.ndarray
PROBE_DTYPES = ("float16", "float32", "float64")


def _accumulation(dtype: np.dtype) -> type:
    return np.float32 if dtype == np.float16 else dtype.type


def _angles(
    positions: Array, r: int, base: float, work: type, *, exponent_scale: float = 2.0
) -> Array:
    """p * theta_i, theta_i = 1 / base^(2i/r), the way Hugging Face's inv_freq computes it."""
    exponents = np.arange(0, r // 2, dtype=work) * work(exponent_scale) / work(r)
    inverse = work(1) / np.power(work(base), exponents)
    return positions.astype(work)[..., None] * inverse  # (B, 1, L, r/2)


def _rotate_half_style(x: Array, angles: Array, r: int) -> Array:
    """GPT-NeoX / Hugging Face LLaMA: cos, sin cached in x's dtype, x*cos + rotate_half(x)*sin."""
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb).astype(x.dtype), np.sin(emb).astype(x.dtype)
    head = x[..., :r]
    rotated = np.concatenate([-head[..., r // 2 :], head[..., : r // 2]], axis=-1)
    out = head * cos + rotated * sin
    return np.concatenate([out, x[..., r:]], axis=-1)


def _interleaved_style(x: Array, angles: Array, r: int) -> Array:
    """Meta's LLaMA: feature pairs as complex numbers times e^{i angle}, in the
    accumulation precision, back to x's dtype."""
    work = angles.dtype
    head = x[..., :r].astype(work)
    pairs = head[..., 0::2] + 1j * head[..., 1::2]
    turned = pairs * np.exp(1j * angles)
    out = np.stack([turned.real, turned.imag], axis=-1).reshape(head.shape).astype(x.dtype)
    return np.concatenate([out, x[..., r:]], axis=-1)


# --- correct ------------------------------------------------------------------------------


@declare(rope=RopeClaim("half"))
def rope_rotate_half(x: Array, positions: Array) -> Array:
    """(r1) Hugging Face LLaMA's ``apply_rotary_pos_emb`` with ``rotate_half``."""
    return _rotate_half_style(
        x, _angles(positions, x.shape[-1], 10000.0, _accumulation(x.dtype)), x.shape[-1]
    )


@declare(rope=RopeClaim("interleaved"))
def rope_complex(x: Array, positions: Array) -> Array:
    """(r2) Meta's LLaMA ``apply_rotary_emb``: pairs (2i, 2i+1) as complex numbers."""
    work = np.float32 if x.dtype == np.float16 else x.dtype.type
    return _interleaved_style(x, _angles(positions, x.shape[-1], 10000.0, work), x.shape[-1])


@declare(rope=RopeClaim("half", base=500000.0, rotary_dim=16))
def rope_partial(x: Array, positions: Array) -> Array:
    """(r3) GPT-NeoX's partial rotary (``rotary_pct``): the first 16 features rotated with
    frequencies from 16, the rest passed through; LLaMA 3's base 500000."""
    return _rotate_half_style(x, _angles(positions, 16, 500000.0, _accumulation(x.dtype)), 16)


@declare(rope=RopeClaim("half"))
def rope_rotate_half_torch(x: Any, positions: Any) -> Any:
    """(r4) Hugging Face LLaMA's ``LlamaRotaryEmbedding`` and ``apply_rotary_pos_emb`` in
    PyTorch, bfloat16 included: ``inv_freq`` and the angles in float32 (float64 for float64
    inputs), ``cos``/``sin`` cast to x's dtype, the rotation in x's dtype."""
    import torch

    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    d = x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=work) / d))
    freqs = positions.to(work)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rotated = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * cos + rotated * sin


CORRECT = (rope_rotate_half, rope_complex, rope_partial)  # NumPy functions


# --- buggy --------------------------------------------------------------------------------


@declare(rope=RopeClaim("half"))
def rope_wrong_pairing(x: Array, positions: Array) -> Array:
    """Declares GPT-NeoX's half pairing but rotates GPT-J's interleaved pairs."""
    return rope_complex(x, positions)


@declare(rope=RopeClaim("half"))
def rope_ignores_positions(x: Array, positions: Array) -> Array:
    """Rotates by 0 .. L-1 whatever the positions: every decoding step at position 0."""
    own = np.broadcast_to(np.arange(x.shape[-2]), positions.shape)
    return rope_rotate_half(x, own)


@declare(rope=RopeClaim("half"))
def rope_position_off_by_one(x: Array, positions: Array) -> Array:
    """Counts the decode step's positions from the cache length plus one."""
    return rope_rotate_half(x, positions + 1)


@declare(rope=RopeClaim("half"))
def rope_exponent_i_over_d(x: Array, positions: Array) -> Array:
    """theta_i = base^(-i/d) instead of base^(-2i/d): frequencies fall half as fast."""
    d = x.shape[-1]
    return _rotate_half_style(
        x, _angles(positions, d, 10000.0, _accumulation(x.dtype), exponent_scale=1.0), d
    )


@declare(rope=RopeClaim("half"))
def rope_negative_angle(x: Array, positions: Array) -> Array:
    """Rotates by -p theta_i (rotate_half with the sign on the wrong half)."""
    return rope_rotate_half(x, -positions)


@declare(rope=RopeClaim("half"), dtypes=("float16",))
def rope_half_precision_angles(x: Array, positions: Array) -> Array:
    """Computes the angles in x's dtype (inv_freq and positions in float16): a whole
    radian off at positions in the thousands (and infinite past 65504)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _rotate_half_style(
            x, _angles(positions, x.shape[-1], 10000.0, x.dtype.type), x.shape[-1]
        )


@declare(rope=RopeClaim("interleaved"))
def rope_returns_float32(x: Array, positions: Array) -> Array:
    """Meta's complex-pair rotation without its final ``type_as(x)``: float16 inputs come
    back as float32."""
    work = np.float32 if x.dtype == np.float16 else x.dtype.type
    head = x.astype(work)
    return _interleaved_style(head, _angles(positions, x.shape[-1], 10000.0, work), x.shape[-1])


@declare(rope=RopeClaim("half", rotary_dim=16))
def rope_rotates_every_feature(x: Array, positions: Array) -> Array:
    """Declares a rotary dim of 16 but rotates all d features with frequencies from d."""
    return rope_rotate_half(x, positions)


@declare(rope=RopeClaim("half", rotary_dim=16))
def rope_frequencies_from_d(x: Array, positions: Array) -> Array:
    """Rotates the first 16 features, but with theta_i = base^(-2i/d) taken from the head dim."""
    d = x.shape[-1]
    angles = _angles(positions, d, 10000.0, _accumulation(x.dtype))[..., :8]
    return _rotate_half_style(x, angles, 16)


BUGS = (
    CaughtBug(rope_wrong_pairing, "rope-matches-reference"),
    CaughtBug(rope_ignores_positions, "rope-matches-reference"),
    CaughtBug(rope_position_off_by_one, "rope-matches-reference"),
    CaughtBug(rope_exponent_i_over_d, "rope-matches-reference"),
    CaughtBug(rope_negative_angle, "rope-matches-reference"),
    CaughtBug(rope_half_precision_angles, "rope-matches-reference"),
    CaughtBug(rope_rotates_every_feature, "rope-matches-reference"),
    CaughtBug(rope_frequencies_from_d, "rope-matches-reference"),
    CaughtBug(rope_returns_float32, "rope-shape-and-dtype"),
)
