"""Buggy kernels, part 3: plumbing — dtypes, memory, strides, sizes, determinism.

Each kernel computes correct attention values (:func:`catalogue.blocks.attend`) but
gets one thing around it wrong; the docstring says which, and where it happened upstream.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .blocks import arrange, attend, check_heads
from .entry import ALL, SpecCall, spec_kernel

Array = np.ndarray


@spec_kernel(**ALL)
def value_dim_must_equal_head_dim(call: SpecCall) -> Array:
    """Checks v against q's head dim, so Ev != E raises (flax.nnx and keras on JAX, through
    ``jax.nn.dot_product_attention``: "value shape should be [...]")."""
    q, v = call.q, call.v
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"value shape should be {[*v.shape[:-1], q.shape[-1]]}: but got {v.shape}")
    return attend(call.pass_to(arrange))


@spec_kernel(**ALL)
def tail_keys_kept_in_float16(call: SpecCall) -> Array:
    """Keeps the keys and values past the first block of 32 in a float16 buffer (a tail
    block of the wrong type): float32 and float64 results are inaccurate once Lk > 32,
    whatever the inputs' memory layout (SDPA-7.3, not SDPA-1.7)."""
    q, k, v, mask, bias, is_causal, scale = call
    if k.shape[-2] > 32:
        k, v = k.copy(), v.copy()
        k[..., 32:, :] = k[..., 32:, :].astype(np.float16)
        v[..., 32:, :] = v[..., 32:, :].astype(np.float16)
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale))


@spec_kernel(**ALL)
def dtype_not_preserved(call: SpecCall) -> Array:
    """Returns its float32 result as is: float16 and float64 inputs get a float32 output."""
    return attend(call.pass_to(arrange)).astype(np.float32)


@spec_kernel(**ALL)
def scales_q_in_place(call: SpecCall) -> Array:
    """Pre-scales the queries with ``q *= scale``, writing into the caller's array."""
    q, k, v, mask, bias, is_causal, scale = call
    alpha = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q *= q.dtype.type(alpha)
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=1.0))


@spec_kernel(**ALL)
def random_key_order(call: SpecCall) -> Array:
    """Visits the keys in a different order on every call (split-K partial results
    combined as they arrive, like atomics; the order comes from NumPy's global random
    state): the same call twice gives different last bits."""
    a = call.pass_to(arrange)
    order = np.random.permutation(a.k.shape[-2])
    return attend(
        a.with_(
            k=a.k[..., order, :],
            v=a.v[..., order, :],
            allowed=a.allowed[..., order],
            bias=None if a.bias is None else a.bias[..., order],
        )
    )


def _as_if_contiguous(x: Array) -> Array:
    """What a kernel that takes the data pointer and assumes C-contiguity reads: the
    underlying buffer from the view's first element on, in memory order.  Past the end
    of the buffer (broadcast, stride-0 inputs) it wraps around instead of reading
    beyond the allocation, standing in for whatever memory lies there."""
    if x.flags.c_contiguous:
        return x
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    start = x.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    flat = np.ascontiguousarray(root).reshape(-1).view(x.dtype)[start // x.itemsize :]
    if flat.size == 0:
        flat = np.ascontiguousarray(root).reshape(-1).view(x.dtype)
    return np.resize(flat, x.size).reshape(x.shape)


@spec_kernel(**ALL)
def strides_ignored(call: SpecCall) -> Array:
    """Reads q, k and v through their data pointers as if they were contiguous, so
    transposed, sliced or broadcast (stride-0) views are read wrongly (pytorch #191937,
    PR #187506, flash-attn #355)."""
    q, k, v, mask, bias, is_causal, scale = call
    q, k, v = (_as_if_contiguous(x) for x in (q, k, v))
    return attend(arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale))


@spec_kernel(**ALL)
def empty_batch_crashes(call: SpecCall) -> Array:
    """Loops over the flattened batch and ``np.stack``s the per-element results, which
    raises for a batch of size 0 ("need at least one array to stack")."""
    q, k, v, mask, bias, is_causal, scale = call
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    full = (*batch, q.shape[-3], q.shape[-2], k.shape[-2])

    def per_element(x: Any, shape: tuple[int, ...]) -> Any:
        count = math.prod(batch)
        return None if x is None else np.broadcast_to(x, (*batch, *shape)).reshape(count, *shape)

    qs, ks, vs = (per_element(x, x.shape[-3:]) for x in (q, k, v))
    masks, biases = per_element(mask, full[-3:]), per_element(bias, full[-3:])
    outs = [
        attend(
            arrange(
                qs[b],
                ks[b],
                vs[b],
                mask=None if masks is None else masks[b],
                bias=None if biases is None else biases[b],
                is_causal=is_causal,
                scale=scale,
            )
        )
        for b in range(qs.shape[0])
    ]
    stacked = np.stack(outs)
    return stacked.reshape(*batch, *stacked.shape[1:])


@spec_kernel(**ALL)
def batch_paired_by_flat_index(call: SpecCall) -> Array:
    """Flattens each input's own batch dims and pairs query batch element n with element
    n % (its count) of k and v, which is the broadcast partner only when k and v have q's
    batch shape or none: for q of batch (2, 2) and k, v of batch (2, 1) it pairs q[0, 1]
    with k[1, 0] (SDPA-1.2)."""
    q, k, v, mask, bias, is_causal, scale = call
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    full = (*batch, q.shape[-3], q.shape[-2], k.shape[-2])
    count = math.prod(batch)

    def flat(x: Any) -> Any:
        return x.reshape(-1, *x.shape[-3:])

    def per_element(x: Any, shape: tuple[int, ...]) -> Any:
        return None if x is None else np.broadcast_to(x, (*batch, *shape)).reshape(count, *shape)

    qs, ks, vs = flat(np.broadcast_to(q, (*batch, *q.shape[-3:]))), flat(k), flat(v)
    masks, biases = per_element(mask, full[-3:]), per_element(bias, full[-3:])
    outs = [
        attend(
            arrange(
                qs[n],
                ks[n % ks.shape[0]],
                vs[n % vs.shape[0]],
                mask=None if masks is None else masks[n],
                bias=None if biases is None else biases[n],
                is_causal=is_causal,
                scale=scale,
            )
        )
        for n in range(count)
    ]
    stacked = np.stack(outs) if outs else np.zeros((0, *q.shape[-3:-1], v.shape[-1]), q.dtype)
    return stacked.reshape(*batch, *stacked.shape[1:])


def _torch_attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    bias: Any,
    is_causal: bool,
    scale: float | None,
    *,
    scores_in_input_dtype: bool = False,
) -> Any:
    """Correct attention in PyTorch, computed in float32 (float64 for float64 inputs) and
    returned in that dtype; ``scores_in_input_dtype`` forms Q K^T before upcasting."""
    import torch

    n_q_heads, n_queries, head_dim = q.shape[-3:]
    n_kv_heads, n_keys = k.shape[-3], k.shape[-2]
    check_heads(n_q_heads, n_kv_heads)
    group = n_q_heads // n_kv_heads
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    alpha = 1.0 / math.sqrt(head_dim) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    if scores_in_input_dtype:
        s = ((q @ k.transpose(-1, -2)) * alpha).to(work)
    else:
        s = (q.to(work) @ k.to(work).transpose(-1, -2)) * alpha
    if bias is not None:
        s = s + bias.to(work)
    allowed = s != -math.inf
    if mask is not None:
        allowed = allowed & mask
    if is_causal:
        rows = torch.arange(n_queries)[:, None]
        allowed = allowed & (torch.arange(n_keys)[None, :] <= rows)
    s = torch.where(allowed, s, -math.inf)
    m = torch.amax(s, dim=-1, keepdim=True) if n_keys else s.sum(-1, keepdim=True)
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    e = torch.where(allowed, torch.exp(s - m), torch.zeros_like(s))
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total == 0, torch.ones_like(total), total)
    terms = p[..., :, :, None] * v.to(work)[..., None, :, :]
    return torch.where(allowed[..., None], terms, torch.zeros_like(terms)).sum(-2)


@spec_kernel(**ALL)
def torch_scores_in_input_dtype(call: SpecCall) -> Any:
    """A PyTorch kernel that forms Q K^T in the input dtype before upcasting: float16
    scores overflow to inf past 65504 and the row turns NaN, although the float32
    accumulation SDPA-7.2/7.4 ask for keeps them finite (pytorch #119131)."""
    out = _torch_attention(*call, scores_in_input_dtype=True)
    return out.to(call.q.dtype)


@spec_kernel(**ALL)
def torch_bfloat16_left_in_float32(call: SpecCall) -> Any:
    """A PyTorch kernel that upcasts half precision to float32 and casts the result back
    for float16 only (``if q.dtype == torch.float16: out = out.half()``): bfloat16
    inputs get a float32 output."""
    import torch

    out = _torch_attention(*call)
    return out.to(call.q.dtype) if call.q.dtype != torch.bfloat16 else out
