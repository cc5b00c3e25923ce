"""Half-precision backward passes for BWD-18 (spec/backward.md): FlashAttention 2's backward
with the roundings FlashAttention makes in float16 and bfloat16, and bugs of half-precision
arithmetic that stay within BWD-17's bound but not within FlashAttention's comparative rule.

:func:`flash2_half_backward` computes in float32 and rounds to the input dtype where
FlashAttention 2 does: P before ``P V`` and ``P^T dO``, dS before its products, the output
and the gradients (Dao 2023, Algorithm 2; BWD-14).  ``bug`` names one step done in the input
dtype that BWD-14 keeps in float32 (:data:`HALF_BUGS`).  :func:`in_input_dtype` makes any
float32 formulation of ``catalogue.backward`` a kernel of half-precision inputs: it computes
in float32 and rounds its results, a correct kernel.  ``half_kernel`` declares either as a
kernel ``attnspec check --backward`` checks in float16 and bfloat16.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from attnspec.conformance import declare
from attnspec.conformance.claims.declaration import torch_sdpa_declaration
from attnspec.conformance.kernels.torch_sdpa import sdpa_on
from catalogue.backward import (
    BACKWARD_ARRAYS,
    BACKWARD_KEYWORDS,
    CORRECT,
    BackwardBug,
    Gradients,
    _forward_scores,
    _reduce,
)
from catalogue.backward_kernels import plain_forward, with_backward, with_bug
from catalogue.entry import SpecCall, spec_function

HALF_CLAIMS: dict[str, Any] = dict(
    bias=True, gqa=True, softcap=True, dtypes=("float16", "bfloat16"), batch_ndim=1, backward=True
)

HALF_BUGS = (
    BackwardBug(
        "dp-in-half",
        "dP = dO V^T accumulated in the input dtype over the value dimension",
        "gradients-within-flash-rule",
    ),
    BackwardBug(
        "delta-in-half",
        "D = rowsum(dO * O) accumulated in the input dtype",
        "gradients-within-flash-rule",
    ),
    BackwardBug(
        "dv-rows-in-half",
        "dV accumulated query row by query row in the input dtype (a float16 accumulator)",
        "gradients-within-flash-rule",
    ),
    BackwardBug(
        "dq-keys-in-half",
        "dQ accumulated key by key in the input dtype (a float16 accumulator)",
        "gradients-within-flash-rule",
    ),
)


def _accumulated(a: Any, b: Any, low: torch.dtype) -> Any:
    """The sum over the last axis of ``a[..., :, None, :] * b[..., None, :, :]`` (``a @ b^T``),
    each product and partial sum rounded to ``low`` (an accumulator in the input dtype)."""
    total = torch.zeros(*a.shape[:-1], b.shape[-2])
    for c in range(a.shape[-1]):
        product = (a[..., :, c, None] * b[..., None, :, c]).to(low).float()
        total = (total + product).to(low).float()
    return total


def _running_sum(term: Callable[[int], Any], count: int, low: torch.dtype) -> Any:
    """``term(0) + ... + term(count - 1)``, the running sum rounded to ``low`` after each
    term (an accumulator in the input dtype)."""
    total = torch.zeros_like(term(0))
    for index in range(count):
        total = (total + term(index)).to(low).float()
    return total


@spec_function({**BACKWARD_KEYWORDS, "bug": ""}, BACKWARD_ARRAYS)
def flash2_half_backward(call: SpecCall) -> Gradients:
    """FlashAttention 2's backward of float16 or bfloat16 inputs: float32 arithmetic, P, dS,
    the output and the gradients rounded to the input dtype (BWD-14); ``bug`` one step
    done in the input dtype instead (:data:`HALF_BUGS`; "" is the correct kernel)."""
    low = call.q.dtype
    q, k, v, bias, grad_out = (
        None if a is None else a.float() for a in (call.q, call.k, call.v, call.bias, call.grad_out)
    )
    bug = call.bug

    def rounded(a: Any) -> Any:
        return a.to(low).float()

    alpha, kk, vv, x, raw, allowed = _forward_scores(q, k, v, bias, call)
    s = raw.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    attends = torch.isfinite(lse)
    weights = torch.where(allowed & attends, torch.exp(s - torch.where(attends, lse, 0.0)), 0.0)
    out = rounded(rounded(weights) @ vv)
    if bug == "delta-in-half":
        delta = _accumulated(grad_out[..., :, None, :], out[..., :, None, :], low)[..., 0]
    else:
        delta = (grad_out * out).sum(-1, keepdim=True)
    if call.grad_lse is not None:
        delta = delta - call.grad_lse.float()[..., None]  # dS = P (dP - D + dlse) (BWD-10)
    if bug == "dp-in-half":
        grad_weights = _accumulated(grad_out, vv, low)
    else:
        grad_weights = grad_out @ vv.transpose(-1, -2)
    grad_scores = weights * (grad_weights - delta)
    grad_x = grad_scores
    if call.softcap is not None:
        grad_x = grad_scores * (1 - torch.tanh(x / call.softcap) ** 2)
    grad_x, p = rounded(grad_x), rounded(weights)
    dv = p.transpose(-1, -2) @ grad_out
    if bug == "dv-rows-in-half" and q.shape[-2]:
        dv = _running_sum(
            lambda i: p[..., i, :, None] * grad_out[..., i, None, :], q.shape[-2], low
        )
    dq = grad_x @ kk
    if bug == "dq-keys-in-half" and kk.shape[-2]:
        dq = _running_sum(
            lambda j: grad_x[..., :, j, None] * kk[..., j, None, :], kk.shape[-2], low
        )
    dq, dk = dq * alpha, grad_x.transpose(-1, -2) @ q * alpha
    n_kv_heads, group = k.shape[-3], q.shape[-3] // k.shape[-3]
    dk, dv = (a.reshape(*a.shape[:-3], n_kv_heads, group, *a.shape[-2:]).sum(-3) for a in (dk, dv))
    dbias = None if bias is None else _reduce(grad_scores, tuple(bias.shape)).to(call.bias.dtype)
    return (
        _reduce(dq, tuple(q.shape)).to(low),
        _reduce(dk, tuple(k.shape)).to(low),
        _reduce(dv, tuple(v.shape)).to(low),
        dbias,
    )


def in_input_dtype(formulation: Callable[..., Gradients]) -> Callable[..., Gradients]:
    """``formulation`` (a float32 backward of ``catalogue.backward``) for inputs of any
    dtype: computed in float32, its gradients rounded to their inputs' dtypes (BWD-13)."""

    def backward(q: Any, k: Any, v: Any, grad_out: Any, **options: Any) -> Gradients:
        bias = options.pop("bias", None)
        wide = bias if bias is None else bias.float()
        grad_lse = options.pop("grad_lse", None)
        got = formulation(
            q.float(),
            k.float(),
            v.float(),
            grad_out.float(),
            bias=wide,
            grad_lse=grad_lse,
            **options,
        )
        like = (q, k, v, bias)
        return tuple(None if g is None else g.to(a.dtype) for g, a in zip(got, like, strict=True))  # type: ignore[return-value]

    return backward


def half_kernel(backward: Callable[..., Gradients], name: str) -> Callable[..., Any]:
    """A kernel declared in float16 and bfloat16 (:func:`half_forward`) whose backward pass
    is ``backward``, through a custom autograd.Function; named ``catalogue.half_backward:name``
    (where a module-level kernel of that name loads, and its reproductions with it)."""
    kernel = with_backward(backward, name, HALF_CLAIMS, half_forward)
    kernel.__module__ = __name__
    return kernel


def explicit_flash2_half_backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, **options: Any
) -> Gradients:
    """``catalogue.backward``'s FlashAttention 2 backward in FlashAttention's explicit
    convention (``--backward-fn``), for inputs of any dtype (computed in float32)."""
    del out, lse  # recomputed
    return in_input_dtype(CORRECT["flash2"])(q, k, v, dout, **options)


def half_forward(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """:func:`plain_forward` in float32 on inputs of any dtype, its output rounded to theirs
    (differentiable: torch.autograd through the conversions is autograd in float32)."""
    bias = options.pop("bias", None)
    wide = None if bias is None else bias.float()
    out, lse = plain_forward(q.float(), k.float(), v.float(), bias=wide, **options)
    return out.to(q.dtype), lse


@declare(**HALF_CLAIMS, backward_fn="catalogue.half_backward:explicit_flash2_half_backward")
def explicit_flash2_half(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """:func:`half_forward` with FlashAttention 2's backward as an explicit backward function
    (``--backward-fn``), computed in float32 and rounded."""
    return half_forward(q, k, v, **options)


@declare(**HALF_CLAIMS)
def autograd_half(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """:func:`half_forward` differentiated by torch.autograd (in float32 through the
    conversions)."""
    return half_forward(q, k, v, **options)


# The correct formulations, module-level kernels (``attnspec check`` and
# scripts/measure-correct-seeds load them by name): those of ``catalogue.backward``
# computed in float32, their results rounded; FlashAttention 2's with its own roundings;
# PyTorch's math SDPA (autograd in the input dtype), declared in float16 and bfloat16 as a
# kernel of its own (declaring ``sdpa_math`` itself would change its declaration for every
# user of it in the process)
flash2_half = half_kernel(flash2_half_backward, "flash2_half")
flash2_in_float32 = half_kernel(in_input_dtype(CORRECT["flash2"]), "flash2_in_float32")
split_kv_in_float32 = half_kernel(
    in_input_dtype(CORRECT["numpy-softmax-split-kv"]), "split_kv_in_float32"
)
sdpa_math_half = sdpa_on(
    "MATH",
    "sdpa_math_half",
    module=__name__,
    claims={**torch_sdpa_declaration(), "dtypes": ("float16", "bfloat16"), "backward": True},
    doc="PyTorch SDPA restricted to its MATH backend, checked in float16 and bfloat16.",
)
HALF_CORRECT: dict[str, Callable[..., Any]] = {
    "flash2-half": flash2_half,
    "flash2": flash2_in_float32,
    "numpy-split-kv": split_kv_in_float32,
    "autograd": autograd_half,
    "explicit": explicit_flash2_half,
    "torch-math": sdpa_math_half,
}
HALF_BUGGY = {
    bug.name: half_kernel(with_bug(bug.name, flash2_half_backward), bug.name) for bug in HALF_BUGS
}
