"""Backward passes for spec/backward.md: three correct formulations and a family of buggy
ones, each one step of FlashAttention 2's backward done wrong, modelled on real bugs.

Every kernel takes float32 torch tensors in the spec's layout (SDPA-1.1) and returns
``(dq, dk, dv, dbias)`` (``dbias`` None without a bias), computing its own forward pass
first, as an explicit backward function does (FlashAttention's ``_flash_attn_backward``
receives the forward's ``out`` and ``lse``; here the kernel makes them).
``backward_kernels.py`` makes each a kernel ``attnspec check --backward`` checks;
``test_backward.py`` shows each bug caught by the property :attr:`BackwardBug.caught_by` names
and each correct formulation passing, through the check and by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from .entry import SPEC_KEYWORDS, SpecCall, spec_function

Gradients = tuple[Any, Any, Any, Any]
_CALLS = [0]  # calls of the non-deterministic kernel so far


@dataclass(frozen=True)
class BackwardBug:
    """A buggy backward: the step done wrong (``flash2_backward``'s ``bug``), the upstream
    report it is modelled on, and the check expected to catch it."""

    name: str
    upstream: str
    caught_by: str


def _allowed(
    n_queries: int,
    n_keys: int,
    mask: Any,
    is_causal: bool,
    causal_alignment: str,
    causal_in_backward: bool = True,
) -> Any:
    """SDPA-3.1 and SDPA-4: True where query i may attend key j (before -inf biases)."""
    allowed = torch.ones(n_queries, n_keys, dtype=torch.bool)
    if is_causal and causal_in_backward:
        offset = 0 if causal_alignment == "top_left" else n_keys - n_queries
        allowed = torch.arange(n_keys)[None, :] <= torch.arange(n_queries)[:, None] + offset
    return allowed if mask is None else allowed & mask


def _alibi(slopes: Any, n_queries: int, n_keys: int, causal_alignment: str) -> Any:
    """ALIBI-2's bias -m_h |i + d - j| of every query head, ``(..., Hq, Lq, Lk)`` for slopes
    ``(..., Hq)`` (ALIBI-1: ``(Hq)`` or ``(B, Hq)``), d the offset of the causal alignment
    (0 top-left, Lk - Lq bottom-right)."""
    offset = 0 if causal_alignment == "top_left" else n_keys - n_queries
    distance = (torch.arange(n_queries)[:, None] + offset - torch.arange(n_keys)[None, :]).abs()
    # the head axis last in the slopes, third from last in the scores: (B, Hq) -> (B, Hq, 1, 1)
    return -slopes.to(torch.float32)[..., None, None] * distance


def _scores(
    q: Any, k: Any, bias: Any, scale: float, softcap: float | None, alibi: Any = None
) -> tuple[Any, Any]:
    """Scaled products x and final scores s (softcap, then bias and ALiBi: SOFTCAP-1)."""
    x = q @ k.transpose(-1, -2) * scale
    s = x if softcap is None else softcap * torch.tanh(x / softcap)
    s = s if bias is None else s + bias
    return x, s if alibi is None else s + alibi


def _reduce(a: Any, shape: tuple[int, ...]) -> Any:
    """``a`` summed over the dimensions an array of ``shape`` was broadcast along (BWD-2)."""
    extra = a.ndim - len(shape)
    if extra:
        a = a.sum(dim=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and a.shape[i] != 1)
    return a.sum(dim=axes, keepdim=True) if axes else a


# The forward's keywords with their defaults (SDPA-1, SDPA-4.2, SOFTCAP-1, ALIBI-1): what
# the backward formulations and ``backward_kernels.plain_forward`` take besides the arrays,
# a backward function also the log-sum-exp's gradient (BWD-10).  ``spec_function`` writes
# each signature once from these.
FORWARD_KEYWORDS: Mapping[str, Any] = MappingProxyType(
    {**SPEC_KEYWORDS, "causal_alignment": "top_left", "softcap": None, "alibi_slopes": None}
)
BACKWARD_KEYWORDS: Mapping[str, Any] = MappingProxyType({**FORWARD_KEYWORDS, "grad_lse": None})
# a backward function's arrays, in the convention the suite calls
BACKWARD_ARRAYS = ("q", "k", "v", "grad_out")
backward_function = spec_function(BACKWARD_KEYWORDS, BACKWARD_ARRAYS)


def _forward_scores(
    q: Any, k: Any, v: Any, bias: Any, call: SpecCall
) -> tuple[float, Any, Any, Any, Any, Any]:
    """The forward of ``call``'s keywords on ``q, k, v, bias`` (passed apart, as leaves of
    a graph may be): the scale, keys and values repeated per query head (SDPA-6.1), scaled
    products x and final scores s (:func:`_scores`), and where s is allowed (SDPA-3,
    SDPA-4; a -inf score excluded: SDPA-3.3)."""
    alpha = 1 / math.sqrt(q.shape[-1]) if call.scale is None else call.scale
    group = q.shape[-3] // k.shape[-3]
    kk, vv = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    alibi = None
    if call.alibi_slopes is not None:
        alibi = _alibi(call.alibi_slopes, n_queries, n_keys, call.causal_alignment)
    x, s = _scores(q, kk, bias, alpha, call.softcap, alibi)
    allowed = _allowed(n_queries, n_keys, call.mask, call.is_causal, call.causal_alignment)
    return alpha, kk, vv, x, s, allowed & (s != -math.inf)


def forward(q: Any, k: Any, v: Any, bias: Any, call: SpecCall) -> tuple[Any, Any]:
    """SDPA-7.1 and its log-sum-exp (LSE-1) in float32 torch (rows without a key give 0 and
    -inf: SDPA-5.1, LSE-2) with ``call``'s other keywords; differentiable."""
    _, _, vv, _, s, allowed = _forward_scores(q, k, v, bias, call)
    s = s.masked_fill(~allowed, -math.inf)
    attends = allowed.any(-1, keepdim=True)
    safe = s.masked_fill(~attends, 0.0)
    weights = torch.softmax(safe, dim=-1) * attends
    lse = torch.logsumexp(safe, dim=-1).masked_fill(~attends[..., 0], -math.inf)
    return weights @ vv, lse


def _over_batch(a: Any) -> Any:
    """Every batch element given the sum over the batch (the first dim) of ``a``."""
    return a.sum(0, keepdim=True).expand_as(a).clone() if a.ndim > 3 else a


def _batch_shared_lse(s: Any) -> Any:
    """The log-sum-exp of ``s`` with one row maximum for every batch element (the first
    dim), as a kernel that reduces over a flattened batch x rows axis: a row whose scores
    lie far below another element's underflows to log 0 = -inf (no key)."""
    if not s.shape[-1]:  # no key: nothing to share
        return torch.logsumexp(s, dim=-1, keepdim=True)
    top = s.amax(dim=-1, keepdim=True)
    if top.ndim > 3:
        top = top.amax(dim=0, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    return top + torch.log(torch.exp(s - top).sum(-1, keepdim=True))


@spec_function({**BACKWARD_KEYWORDS, "key_block": 64, "bug": ""}, BACKWARD_ARRAYS)
def flash2_backward(call: SpecCall) -> Gradients:
    """FlashAttention 2's backward (Dao 2023, Algorithm 2) in float32: the forward's
    log-sum-exp and output, D = rowsum(dO * O), then per key block the weights recomputed
    as exp(s - lse), dV += P^T dO, dS = P (dP - D + dlse), dQ += scale dS K,
    dK = scale dS^T Q.  ``bug`` names one step done wrong (:data:`BUGS`); "" is the correct
    kernel."""
    q, k, v, mask, bias, is_causal, _ = call
    grad_out, grad_lse, softcap, bug = call.grad_out, call.grad_lse, call.softcap, call.bug
    key_block, causal_alignment = call.key_block, call.causal_alignment
    alpha, kk, vv, x, raw, allowed = _forward_scores(q, k, v, bias, call)
    n_kv_heads = k.shape[-3]
    group = q.shape[-3] // n_kv_heads
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    s = raw.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    if bug == "batch-shared-max":
        lse = _batch_shared_lse(s)
    if bug == "no-alibi-in-backward":  # the weights recomputed without the ALiBi term
        raw = _scores(q, kk, bias, alpha, softcap)[1]
    attends = torch.isfinite(lse)
    weights = torch.where(allowed & attends, torch.exp(s - torch.where(attends, lse, 0.0)), 0.0)
    out = weights @ vv
    delta = (grad_out * (out.half().float() if bug == "delta-in-half" else out)).sum(-1, True)
    if bug == "no-delta":
        delta = torch.zeros_like(delta)
    if grad_lse is not None and bug != "lse-not-differentiated":
        delta = delta - grad_lse[..., None]  # dS = P (dP - D + dlse) (BWD-10)
    used_lse = lse.half().float() if bug == "lse-in-half" else lse
    backward_allowed = allowed.expand(raw.shape)
    if bug == "no-causal-in-backward":
        backward_allowed = _allowed(n_queries, n_keys, mask, is_causal, causal_alignment, False)
        backward_allowed = backward_allowed & (raw != -math.inf)
    if bug == "padded-tile":  # cuDNN (PyTorch #196678): the key tail padded to 128, scored 0
        key_block = 128
        pad = -n_keys % key_block
        kk = torch.cat([kk, torch.zeros(*kk.shape[:-2], pad, kk.shape[-1])], dim=-2)
        vv = torch.cat([vv, torch.zeros(*vv.shape[:-2], pad, vv.shape[-1])], dim=-2)
        x = torch.cat([x, torch.zeros(*x.shape[:-1], pad)], dim=-1)
        raw = torch.cat([raw, torch.zeros(*raw.shape[:-1], pad)], dim=-1)
        ones = torch.ones(*raw.shape[:-1], pad, dtype=torch.bool)
        backward_allowed = torch.cat([backward_allowed.expand(*raw.shape[:-1], n_keys), ones], -1)
    if bug == "fill-outranks-min-bias":  # weights recomputed over JAX's fill of excluded keys
        raw = raw.masked_fill(~allowed, -0.7 * torch.finfo(raw.dtype).max)
        backward_allowed = torch.ones_like(backward_allowed)
    stops = list(range(0, kk.shape[-2], key_block))
    if bug == "last-block-dropped" and kk.shape[-2] % key_block:
        stops = stops[:-1]  # right only when the length is a multiple of the block
    if bug == "nondeterministic-dq":  # atomics: the order differs from call to call
        _CALLS[0] += 1
        stops = stops[::-1] if _CALLS[0] % 2 else stops
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(kk), torch.zeros_like(vv)
    d_scores = torch.zeros(*raw.shape[:-1], kk.shape[-2])
    safe_lse = used_lse if bug == "empty-rows-nan" else torch.where(attends, used_lse, 0.0)
    if bug == "fill-outranks-min-bias":  # its own log-sum-exp of the filled scores
        safe_lse = torch.where(attends, torch.logsumexp(raw, dim=-1, keepdim=True), 0.0)
    for start in stops:
        cols = slice(start, start + key_block)
        block_allowed = backward_allowed.expand(*raw.shape[:-1], kk.shape[-2])[..., cols]
        block = raw[..., cols].masked_fill(~block_allowed, -math.inf)
        p = torch.exp(block - safe_lse)  # exp(-inf - (-inf)) = NaN for the buggy one
        if bug != "empty-rows-nan":
            p = torch.where(attends & block_allowed, p, 0.0)
        dv[..., cols, :] += p.transpose(-1, -2) @ grad_out
        dp = grad_out @ vv[..., cols, :].transpose(-1, -2)
        ds = p * (dp - delta)
        dx = ds
        if softcap is not None and bug != "no-softcap-derivative":
            dx = ds * (1 - torch.tanh(x[..., cols] / softcap) ** 2)
        keys = vv[..., cols, :] if bug == "kv-swapped" else kk[..., cols, :]
        dq += dx @ keys * (1.0 if bug == "dq-unscaled" else alpha)
        dk[..., cols, :] += (
            dx.transpose(-1, -2) @ q * (alpha * alpha if bug == "dk-scaled-twice" else alpha)
        )
        d_scores[..., cols] = ds
    dk, dv = dk[..., :n_keys, :], dv[..., :n_keys, :]
    d_scores = d_scores[..., :n_keys]  # the padded tail (padded-tile) cut off
    shape = (*dk.shape[:-3], n_kv_heads, group, *dk.shape[-2:])
    value_shape = (*dv.shape[:-3], n_kv_heads, group, *dv.shape[-2:])
    if bug == "gqa-not-summed":  # the group's first query head only
        dk, dv = dk.reshape(shape)[..., 0, :, :], dv.reshape(value_shape)[..., 0, :, :]
    elif bug == "gqa-wrong-heads":  # summed over h mod Hkv, as `tile` instead of `repeat`
        dk = dk.reshape(*dk.shape[:-3], group, n_kv_heads, *dk.shape[-2:]).sum(-4)
        dv = dv.reshape(*dv.shape[:-3], group, n_kv_heads, *dv.shape[-2:]).sum(-4)
    else:
        dk, dv = dk.reshape(shape).sum(-3), dv.reshape(value_shape).sum(-3)
    if bug == "dkv-summed-over-batch":  # the batch folded into the reduction of the group
        dk, dv = _over_batch(dk), _over_batch(dv)
    dbias = None
    if bias is not None:
        if bug == "dbias-not-reduced":
            dbias = d_scores
        elif bug == "dbias-mean":
            dbias = _reduce(d_scores, tuple(bias.shape)) * bias.numel() / d_scores.numel()
        else:
            dbias = _reduce(d_scores, tuple(bias.shape))
        if bug == "dbias-summed-over-batch" and bias.ndim == d_scores.ndim:
            dbias = _over_batch(dbias)
    return (
        _reduce(dq, tuple(q.shape)),
        _reduce(dk, tuple(k.shape)),
        _reduce(dv, tuple(v.shape)),
        dbias,
    )


@backward_function
def autograd_backward(call: SpecCall) -> Gradients:
    """torch.autograd of a plain float32 forward (a softmax over the allowed scores, rows
    without a key set to 0): a correct backward written by nobody."""
    q, k, v, _, bias, _, _ = call
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    bias_leaf = None if bias is None else bias.detach().clone().requires_grad_(True)
    out, lse = forward(*leaves, bias_leaf, call)
    outputs, upstream = [out], [call.grad_out]
    if call.grad_lse is not None:  # rows without a key: -inf, no gradient (BWD-4, BWD-10)
        outputs.append(lse)
        upstream.append(call.grad_lse)
    wanted = [*leaves] + ([] if bias_leaf is None else [bias_leaf])
    grads = torch.autograd.grad(
        outputs, wanted, upstream, allow_unused=True, materialize_grads=True
    )
    return grads[0], grads[1], grads[2], None if bias is None else grads[3]


@backward_function
def numpy_softmax_backward(call: SpecCall) -> Gradients:
    """The softmax-backward form in float32 NumPy, a split-KV forward: the keys in two
    halves, each with its own maximum and sum, combined through their log-sum-exps (LSE-1),
    then D = rowsum(P * dP) rather than rowsum(dO * O)."""
    q, k, v, mask, bias, is_causal, scale = call
    grad_out, grad_lse, softcap, alibi_slopes = (
        call.grad_out,
        call.grad_lse,
        call.softcap,
        call.alibi_slopes,
    )
    causal_alignment = call.causal_alignment
    qn, kn, vn, dn = (t.numpy() for t in (q, k, v, grad_out))
    alpha = np.float32(1 / math.sqrt(qn.shape[-1]) if scale is None else scale)
    group = qn.shape[-3] // kn.shape[-3]
    kk, vv = np.repeat(kn, group, axis=-3), np.repeat(vn, group, axis=-3)
    x = np.matmul(qn, np.swapaxes(kk, -1, -2)) * alpha
    s = x if softcap is None else np.float32(softcap) * np.tanh(x / np.float32(softcap))
    if bias is not None:
        s = s + bias.numpy()
    if alibi_slopes is not None:
        s = s + _alibi(alibi_slopes, qn.shape[-2], kn.shape[-2], causal_alignment).numpy()
    allowed = _allowed(qn.shape[-2], kn.shape[-2], mask, is_causal, causal_alignment).numpy()
    allowed = allowed & (s != -np.inf)
    half = max(1, s.shape[-1] // 2)
    parts = []
    for cols in (slice(0, half), slice(half, None)):
        block = np.where(allowed[..., cols], s[..., cols], -np.inf)
        top = np.max(block, axis=-1, keepdims=True, initial=-np.inf)
        top = np.where(np.isfinite(top), top, 0)
        with np.errstate(divide="ignore"):  # a half without keys: log 0 = -inf (LSE-2)
            parts.append(top + np.log(np.sum(np.exp(block - top), -1, keepdims=True)))
    lse = np.logaddexp(parts[0], parts[1])
    finite = np.isfinite(lse)
    usable = allowed & finite
    shifted = np.where(usable, s - np.where(finite, lse, 0), -np.inf)  # excluded: exp(-inf) = 0
    weights = np.exp(shifted)
    weights = weights.astype(np.float32)
    dp = np.matmul(dn, np.swapaxes(vv, -1, -2))
    lse_term = 0.0 if grad_lse is None else grad_lse.numpy()[..., None]
    ds = weights * (dp - np.sum(weights * dp, -1, keepdims=True) + lse_term)
    dx = ds if softcap is None else ds * (1 - np.tanh(x / np.float32(softcap)) ** 2)
    dq = np.matmul(dx, kk) * alpha
    dk = np.matmul(np.swapaxes(dx, -1, -2), qn) * alpha
    dv = np.matmul(np.swapaxes(weights, -1, -2), dn)
    dk = dk.reshape(*dk.shape[:-3], kn.shape[-3], group, *dk.shape[-2:]).sum(-3)
    dv = dv.reshape(*dv.shape[:-3], vn.shape[-3], group, *dv.shape[-2:]).sum(-3)
    grads = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in (dq, dk, dv)]
    dbias = (
        None
        if bias is None
        else _reduce(torch.from_numpy(ds.astype(np.float32)), tuple(bias.shape))
    )
    return (
        _reduce(grads[0], tuple(q.shape)),
        _reduce(grads[1], tuple(k.shape)),
        _reduce(grads[2], tuple(v.shape)),
        dbias,
    )


CORRECT = {
    "flash2": flash2_backward,
    "autograd": autograd_backward,
    "numpy-softmax-split-kv": numpy_softmax_backward,
}

BUGS = (
    BackwardBug("no-delta", "the delta term rowsum(dO * O) dropped", "gradients-match-reference"),
    BackwardBug(
        "delta-in-half", "D from the output rounded to float16", "gradients-match-reference"
    ),
    BackwardBug(
        "lse-in-half",
        "the log-sum-exp rounded to float16 before P is recomputed",
        "gradients-match-reference",
    ),
    BackwardBug(
        "gqa-not-summed",
        "GQA dK/dV of the group's first query head only",
        "gradients-match-reference",
    ),
    BackwardBug(
        "gqa-wrong-heads",
        "GQA dK/dV summed over h mod Hkv (tile, not repeat)",
        "gradients-match-reference",
    ),
    BackwardBug(
        "no-causal-in-backward",
        "the causal mask missing in the backward only",
        "gradients-excluded-keys-zero",
    ),
    BackwardBug("dk-scaled-twice", "the scale applied twice to dK", "gradients-match-reference"),
    BackwardBug("dq-unscaled", "the scale missing from dQ", "gradients-match-reference"),
    BackwardBug(
        "dbias-not-reduced", "dbias returned at the scores' shape", "gradients-shape-dtype"
    ),
    BackwardBug(
        "dbias-mean", "dbias averaged, not summed, over broadcast dims", "gradients-match-reference"
    ),
    BackwardBug(
        "no-softcap-derivative",
        "the softcap's tanh derivative omitted",
        "gradients-match-reference",
    ),
    BackwardBug(
        "empty-rows-nan",
        "exp(s - lse) with lse = -inf for rows without keys",
        "gradients-empty-rows",
    ),
    BackwardBug(
        "padded-tile", "PyTorch #196678: the key tail scored 0, not -inf", "gradients-finite"
    ),
    BackwardBug(
        "last-block-dropped",
        "right only for L a multiple of the key block",
        "gradients-match-reference",
    ),
    BackwardBug(
        "nondeterministic-dq",
        "dQ accumulated in arbitrary order (atomics)",
        "gradients-deterministic",
    ),
    BackwardBug(
        "kv-swapped", "diffusers #14338: V used where K belongs in dQ", "gradients-match-reference"
    ),
    BackwardBug("no-alibi-in-backward", "the weights recomputed without ALiBi", "gradients-alibi"),
    BackwardBug(
        "dkv-summed-over-batch",
        "dK/dV summed over the batch as over a GQA group (the batch folded into the heads)",
        "gradients-batch-composition",
    ),
    BackwardBug(
        "batch-shared-max",
        "the recomputed weights' row maximum taken over the batch too",
        "gradients-batch-composition",
    ),
    BackwardBug(
        "dbias-summed-over-batch",
        "a per-element bias's gradient summed over the batch",
        "gradients-batch-composition",
    ),
    BackwardBug(
        "fill-outranks-min-bias",
        "the weights recomputed with excluded scores filled by -0.7 finfo.max, above a "
        "finfo.min bias (jax.nn's fill, docs/divergences.md#jax-fill-outranks-min-bias)",
        "gradients-excluded-keys-zero",
    ),
    BackwardBug(
        "lse-not-differentiated",
        "the returned log-sum-exp treated as a constant (its gradient dropped)",
        "gradients-log-sum-exp",
    ),
)


def varlen_backward(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: list[int],
    cu_seqlens_k: list[int],
    grad_out: Any,
    *,
    is_causal: bool = False,
    zero_tail: bool = True,
) -> tuple[Any, Any, Any]:
    """A packed backward ``(T, H, E)`` that, as FlashAttention 2 and 3 do, accepts arrays
    longer than ``cu_seqlens[-1]``: each sequence's rows from :func:`flash2_backward` on that
    sequence alone (VARLEN-2), into buffers that start as poisoned memory (NaN, as the test of
    flash-attention PR 2324 poisons the GPU). ``zero_tail`` False is the bug of PyTorch
    #176793: the rows past the last offset are never written."""
    buffers = [torch.full_like(a, math.nan) for a in (q, k, v)]
    if zero_tail:  # BWD-11: rows no sequence owns get exactly 0
        stops = (cu_seqlens_q[-1], cu_seqlens_k[-1], cu_seqlens_k[-1])
        for buffer, stop in zip(buffers, stops, strict=True):
            buffer[stop:] = 0.0
    for b in range(len(cu_seqlens_q) - 1):
        rows = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
        keys = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])

        def heads_first(a: Any) -> Any:
            return a.transpose(0, 1)[None]

        dq, dk, dv, _ = flash2_backward(
            heads_first(q[rows]),
            heads_first(k[keys]),
            heads_first(v[keys]),
            heads_first(grad_out[rows]),
            is_causal=is_causal,
            causal_alignment="bottom_right",
        )
        buffers[0][rows] = dq[0].transpose(0, 1)
        buffers[1][keys] = dk[0].transpose(0, 1)
        buffers[2][keys] = dv[0].transpose(0, 1)
    return buffers[0], buffers[1], buffers[2]
