"""Buggy kernels, part 2: the softmax, the weighted sum, empty rows and non-finite values.

Each kernel is a correct formulation from :mod:`catalogue.blocks` with exactly one step
done wrong; the docstring says which, and where it happened upstream.
"""

from __future__ import annotations

import numpy as np

from .blocks import (
    QUIET,
    Arranged,
    arrange,
    attend,
    combine,
    finish,
    online_softmax,
    row_max,
    scores,
    softmax_lse,
)
from .entry import ALL, SpecCall, spec_kernel

Array = np.ndarray


def _with_weights(a: Arranged, p: Array, allowed: Array) -> Array:
    return finish(combine(p, allowed, a.v), a)


# --- the softmax (SDPA-7.1, SDPA-7.4) --------------------------------------------------


@spec_kernel(**ALL)
def softmax_over_query_axis(call: SpecCall) -> Array:
    """Normalises over the query axis (``softmax(dim=-2)``) instead of the key axis."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    p = np.swapaxes(softmax_lse(np.swapaxes(s, -1, -2), np.swapaxes(allowed, -1, -2)), -1, -2)
    return _with_weights(a, p, allowed)


@spec_kernel(**ALL)
def mask_after_softmax(call: SpecCall) -> Array:
    """Softmax over every key, then the excluded weights set to 0 without renormalising:
    rows with an excluded key sum to less than 1, and excluded keys still shape the rest."""
    a = call.pass_to(arrange)
    s, reachable = scores(a.with_(allowed=np.ones_like(a.allowed)))
    allowed = a.allowed & reachable
    p = np.where(allowed, softmax_lse(s, reachable), 0.0)
    return _with_weights(a, p, allowed)


@spec_kernel(**ALL)
def no_max_subtraction(call: SpecCall) -> Array:
    """exp(s) / sum exp(s) without subtracting the row max: overflows to inf/inf = NaN
    once a score passes ~88 in float32 or ~709 in float64 (pytorch #119131)."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    with np.errstate(**QUIET):
        e = np.where(allowed, np.exp(s), 0.0)
        total = np.sum(e, axis=-1, keepdims=True)
        p = e / np.where(total == 0, 1.0, total)
    return _with_weights(a, p, allowed)


@spec_kernel(**ALL)
def eps_in_denominator(call: SpecCall) -> Array:
    """Divides by sum + 1e-6 "for safety": a relative error of up to 1e-6 in every row,
    invisible in float16, far outside TOL-2 in float64."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    with np.errstate(**QUIET):
        e = np.where(allowed, np.exp(s - row_max(s)), 0.0)
        p = e / (np.sum(e, axis=-1, keepdims=True) + 1e-6)
    return _with_weights(a, p, allowed)


@spec_kernel(**ALL)
def top_k_weights(call: SpecCall) -> Array:
    """Keeps only the 8 largest scores of each row (a "sparse softmax" speed-up) and
    renormalises: exact whenever a row has at most 8 allowed keys."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    if s.shape[-1] > 8:
        eighth = -np.sort(-s, axis=-1)[..., 7:8]
        allowed = allowed & (s >= eighth)
        s = np.where(allowed, s, -np.inf)
    return _with_weights(a, softmax_lse(s, allowed), allowed)


@spec_kernel(**ALL)
def online_softmax_drops_tail(call: SpecCall) -> Array:
    """Online softmax over key blocks of 3 whose loop stops at the last full block:
    the ragged tail (Lk % 3 keys) is never read."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    return finish(online_softmax(s, allowed, a.v, block=3, tail=False), a)


@spec_kernel(**ALL)
def online_softmax_no_rescale(call: SpecCall) -> Array:
    """Online softmax that updates the running max but never rescales the accumulator
    and the running sum by exp(m_old - m_new): blocks before a new max are overweighted."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    return finish(online_softmax(s, allowed, a.v, block=3, rescale=False), a)


@spec_kernel(**ALL)
def missing_final_normalisation(call: SpecCall) -> Array:
    """Deferred normalisation (FlashAttention keeps acc and l) with the final acc / l
    forgotten: the output is sum_j exp(s_ij - m_i) v_j, outside the values' range."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    with np.errstate(**QUIET):
        e = np.where(allowed, np.exp(s - row_max(s)), 0.0)
    return _with_weights(a, e, allowed)


@spec_kernel(**ALL)
def row_sum_accumulated_in_float16(call: SpecCall) -> Array:
    """Sums each row's exponentials key by key in float16 for float16 inputs, where
    SDPA-7.2 asks for float32: once the sum is near 1 every term below half a unit in its
    last place (2**-11) is lost, so a long row with one top key drops the weight of all
    the others (a hand-written half-precision kernel's accumulator)."""
    q, *_ = call
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    with np.errstate(**QUIET):
        e = np.where(allowed, np.exp(s - row_max(s)), 0.0)
    if q.dtype == np.float16 and e.shape[-1]:
        running = np.cumsum(e.astype(np.float16), axis=-1, dtype=np.float16)  # key by key
        total = running[..., -1:].astype(e.dtype)
    else:
        total = e.sum(axis=-1, keepdims=True)
    return _with_weights(a, e / np.where(total == 0, 1.0, total), allowed)


@spec_kernel(**ALL)
def float64_computed_in_float32(call: SpecCall) -> Array:
    """Casts everything to float32 "for speed" and the result back: float64 inputs get
    float32 accuracy, far outside float64's TOL-2."""
    a = call.pass_to(arrange)
    low = a.with_(
        q=a.q.astype(np.float32),
        k=a.k.astype(np.float32),
        v=a.v.astype(np.float32),
        bias=None if a.bias is None else a.bias.astype(np.float32),
    )
    return attend(low)


@spec_kernel(**ALL)
def values_cached_in_float16(call: SpecCall) -> Array:
    """Stores V in a float16 KV cache whatever the input dtype: V is rounded (and
    overflows past 65504), so the output is no longer linear in V at float32/64 accuracy."""
    v16 = np.asarray(call.v).astype(np.float16).astype(call.v.dtype)
    return attend(call._replace(v=v16).pass_to(arrange))


@spec_kernel(**ALL)
def values_cached_in_int8(call: SpecCall) -> Array:
    """Stores V in an int8 KV cache with a fixed scale of 1/32 (calibrated on small
    activations): values are rounded to 1/32 and clipped to [-4, 127/32], so the output
    stops being linear in V as soon as a value leaves that range."""
    v8 = np.clip(np.round(np.asarray(call.v, dtype=np.float64) * 32), -128, 127) / 32
    return attend(call._replace(v=v8.astype(call.v.dtype)).pass_to(arrange))


@spec_kernel(**ALL)
def batch_and_heads_transposed(call: SpecCall) -> Array:
    """Flattens (batch, heads) of Q batch-major but of K/V head-major ('b h' vs 'h b' in
    a rearrange), so query head h of batch b attends another batch element's keys."""
    a = call.pass_to(arrange)
    lead = a.q.shape[:-2]
    if len(lead) >= 2:

        def mixed(x: Array) -> Array:
            return np.swapaxes(x, -3, -4).reshape(x.shape)

        a = a.with_(k=mixed(a.k), v=mixed(a.v))
    return attend(a)


@spec_kernel(**ALL)
def query_tail_block_skipped(call: SpecCall) -> Array:
    """Processes queries in blocks of 4 and launches Lq // 4 blocks (floor, not ceil):
    the ragged last block of queries is never written and stays 0."""
    q, *_ = call
    full = attend(call.pass_to(arrange))
    covered = (q.shape[-2] // 4) * 4
    out = np.zeros_like(full)
    out[..., :covered, :] = full[..., :covered, :]
    return out


# --- empty rows and no keys (SDPA-5) ---------------------------------------------------


def _filled(call: SpecCall, fill: float | None) -> Array:
    """Excluded scores replaced by ``fill`` (a finite number, or -inf when None), then a
    plain softmax over every key and a plain P @ V, as JAX/Keras/Flax and pre-2.5
    PyTorch do."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    value = -np.inf if fill is None else fill
    s = np.where(allowed, s, s.dtype.type(value))
    with np.errstate(**QUIET):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True, initial=-np.inf))
        p = e / np.sum(e, axis=-1, keepdims=True)
    return finish(np.matmul(p, a.v), a)


@spec_kernel(**ALL)
def finite_fill_minus_1e9(call: SpecCall) -> Array:
    """Masks with a finite -1e9: a fully-masked row gets a uniform softmax and outputs
    mean(V) instead of 0 (onnxruntime #28904)."""
    return _filled(call, -1e9)


@spec_kernel(**ALL)
def finite_fill_jax_style(call: SpecCall) -> Array:
    """Masks with -0.7 * finfo(dtype).max, as ``jax.nn.dot_product_attention`` does:
    a fully-masked row outputs mean(V) instead of 0."""
    fill = -0.7 * float(np.finfo(np.result_type(call.q.dtype, np.float32)).max)
    return _filled(call, fill)


@spec_kernel(**ALL)
def nan_on_empty_rows(call: SpecCall) -> Array:
    """Masks with -inf and takes a plain softmax: a fully-masked row is
    exp(-inf - -inf) = NaN (pytorch #41508, #103749 before ``_safe_softmax``)."""
    return _filled(call, None)


@spec_kernel(**ALL)
def no_keys_gives_nan(call: SpecCall) -> Array:
    """Deferred normalisation acc / l whose empty-row guard reads the mask argument:
    rows the mask empties give 0, but with Lk = 0 (and no mask) l = 0 and 0 / 0 = NaN."""
    mask = call.mask
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    with np.errstate(**QUIET):
        e = np.where(allowed, np.exp(s - row_max(s)), 0.0)
        acc = combine(e, allowed, a.v)
        out = acc / np.sum(e, axis=-1, keepdims=True)
    if mask is not None:
        out = np.where(allowed.any(axis=-1, keepdims=True), out, 0.0)
    return finish(out, a)


# --- non-finite values (SDPA-8) --------------------------------------------------------


@spec_kernel(**ALL)
def nan_leaks_through_matmul(call: SpecCall) -> Array:
    """Correct weights, then a plain P @ V: a masked key's NaN/inf value times its zero
    weight is NaN (pytorch #101967)."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    with np.errstate(**QUIET):
        return finish(np.matmul(softmax_lse(s, allowed), a.v), a)


@spec_kernel(**ALL)
def nan_inputs_sanitised(call: SpecCall) -> Array:
    """``nan_to_num`` on q, k and v "to be robust": an upstream NaN becomes a plausible
    finite output instead of propagating."""
    q, k, v, *_ = call
    q, k, v = (np.nan_to_num(x) for x in (call.q, call.k, call.v))
    return attend(call._replace(q=q, k=k, v=v).pass_to(arrange))
