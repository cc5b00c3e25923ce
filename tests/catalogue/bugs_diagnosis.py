"""Buggy kernels with exactly one defect each that the diagnosis probes name, beside the
look-alikes the catalogue already has (issue 38): a floor weight on excluded keys, a
softmax over one key taken as 1, scores rounded to float16 after a float32 dot product,
and scores accumulated in float16.  Each is :func:`catalogue.blocks.attend` with that one
step done wrong; float32 and float64 inputs are computed correctly unless the docstring
says otherwise.
"""

from __future__ import annotations

import numpy as np

from .blocks import QUIET, Arranged, arrange, attend, combine, finish, scores, softmax_lse
from .entry import ALL, SpecCall, spec_kernel

Array = np.ndarray


@spec_kernel(**ALL)
def floor_weight_on_excluded(call: SpecCall) -> Array:
    """Clamps every weight to at least 1e-28 "to avoid log(0) later": excluded keys keep a
    weight of 1e-28, harmless unless an excluded value is huge or not finite."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    p = np.maximum(softmax_lse(s, allowed), a.q.dtype.type(1e-28))
    with np.errstate(**QUIET):
        return finish(np.matmul(p, a.v), a)


@spec_kernel(**ALL)
def single_key_weight_one(call: SpecCall) -> Array:
    """A fast path for one key: the softmax over one key is 1, so the output is v_0,
    whatever the score (NaN, or -inf from the mask or bias)."""
    a = call.pass_to(arrange)
    if a.k.shape[-2] == 1:
        shape = (*a.q.shape[:-1], a.v.shape[-1])
        return finish(np.broadcast_to(a.v, shape).copy(), a)
    return attend(a)


def _softmax_pv(a: Arranged, s: Array) -> Array:
    """The softmax over the allowed keys of float32 scores ``s``, then P @ V, in float32."""
    allowed = a.allowed & (s != -np.inf)
    s = np.where(allowed, s, -np.inf)
    return finish(combine(softmax_lse(s, allowed), allowed, a.v.astype(np.float32)), a)


def _float16_scores(a: Arranged, accumulate: bool) -> Array:
    """Scaled scores that pass through float16: the float32 dot product rounded to float16,
    or (``accumulate``) q . k summed term by term in float16; as float32."""
    q, k = a.q.astype(np.float16), a.k.astype(np.float16)
    if accumulate:
        dot = np.zeros((*q.shape[:-1], k.shape[-2]), dtype=np.float16)
        for e in range(q.shape[-1]):
            dot = dot + q[..., :, None, e] * k[..., None, :, e]  # float16 throughout
        s = (dot * np.float16(a.scale)).astype(np.float32)
    else:
        s = np.matmul(q.astype(np.float32), np.swapaxes(k.astype(np.float32), -1, -2))
        s = (s * np.float32(a.scale)).astype(np.float16).astype(np.float32)
    if a.bias is not None:
        s = s + a.bias.astype(np.float32)
    return s


def _with_float16_scores(call: SpecCall, accumulate: bool) -> Array:
    """The definition, but for float16 inputs on :func:`_float16_scores` (the softmax and
    P @ V in float32)."""
    a = call.pass_to(arrange)
    if call.q.dtype != np.float16:
        return attend(a)
    with np.errstate(**QUIET):
        return _softmax_pv(a, _float16_scores(a, accumulate))


@spec_kernel(**ALL)
def scores_cast_to_float16(call: SpecCall) -> Array:
    """For float16 inputs, computes the scores in float32 but stores them in a float16
    buffer before the softmax (the softmax and P @ V are float32)."""
    return _with_float16_scores(call, accumulate=False)


@spec_kernel(**ALL)
def scores_accumulated_in_float16(call: SpecCall) -> Array:
    """For float16 inputs, accumulates q . k in float16 (a half-precision MMA without a
    float32 accumulator); the softmax and P @ V are float32."""
    return _with_float16_scores(call, accumulate=True)


@spec_kernel(**ALL)
def bias_added_in_float16(call: SpecCall) -> Array:
    """For float16 inputs, computes the scores in float32 but adds the bias to them in
    float16 (a fused epilogue in the input dtype): near a -65504 padding bias the sums
    step by 32, so a padded row's weights collapse."""
    q, *_ = call
    a = call.pass_to(arrange)
    if q.dtype != np.float16 or a.bias is None:
        return attend(a)
    with np.errstate(**QUIET):
        s = np.matmul(a.q, np.swapaxes(a.k, -1, -2)) * np.float32(a.scale)
        s = (s.astype(np.float16) + a.bias.astype(np.float16)).astype(np.float32)
        return _softmax_pv(a, s)
