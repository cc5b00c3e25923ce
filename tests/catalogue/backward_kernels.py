"""The backward catalogue (``catalogue.backward``) as kernels ``attnspec check --backward``
checks: each a declared forward ``fn(q, k, v, *, mask, bias, is_causal, scale, softcap,
alibi_slopes)`` returning the output and the log-sum-exp,
whose backward is one formulation, as a FlashAttention-style author writes it — a custom
``torch.autograd.Function`` whose ``backward`` calls the formulation — and one kernel whose
gradients are plain ``torch.autograd`` of its forward, and one with an explicit backward
function in FlashAttention's convention (``--backward-fn``).  The forward is right in every
one (a float32 softmax over the allowed scores); only the backward differs.

``BUGGY[name]`` is the kernel of ``catalogue.backward.BUGS``'s bug ``name``, also a module
attribute ``flash2_<name with _>`` so that the kernel's own process can load it by name; a bug
an autograd.Function cannot have (:data:`EXPLICIT_ONLY`) is in an explicit backward function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from attnspec.conformance import SparseClaim, declare
from attnspec.reference import sparse_mask
from catalogue.backward import (
    BUGS,
    FORWARD_KEYWORDS,
    flash2_backward,
    forward,
    numpy_softmax_backward,
    varlen_backward,
)
from catalogue.entry import SpecCall, spec_function

CLAIMS: dict[str, Any] = dict(
    bias=True,
    gqa=True,
    softcap=True,
    alibi=True,
    returns_lse=True,
    dtypes=("float32",),
    batch_ndim=1,
    backward=True,
)


@spec_function(FORWARD_KEYWORDS)
def plain_forward(call: SpecCall) -> tuple[Any, Any]:
    """SDPA-7.1 and its log-sum-exp (LSE-1) in float32 torch (rows without a key give 0 and
    -inf: SDPA-5.1, LSE-2); differentiable."""
    return forward(call.q, call.k, call.v, call.bias, call)


class _Backward(torch.autograd.Function):
    """Forward: ``options["forward"]`` (:func:`plain_forward`); backward: the formulation
    ``options["backward"]``."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, bias: Any, options: dict[str, Any]) -> Any:
        ctx.save_for_backward(q, k, v, bias)
        ctx.options = options
        keywords = {k: value for k, value in options.items() if k not in ("backward", "forward")}
        return options["forward"](q, k, v, bias=bias, **keywords)

    @staticmethod
    def backward(ctx: Any, grad_out: Any, grad_lse: Any) -> Any:  # type: ignore[override]
        q, k, v, bias = ctx.saved_tensors
        options = {k: value for k, value in ctx.options.items() if k != "forward"}
        backward = options.pop("backward")
        dq, dk, dv, dbias = backward(q, k, v, grad_out, bias=bias, grad_lse=grad_lse, **options)
        return dq, dk, dv, dbias, None


def with_backward(
    backward: Callable[..., Any],
    name: str,
    claims: dict[str, Any] = CLAIMS,
    forward: Callable[..., Any] = plain_forward,
) -> Callable[..., Any]:
    """A declared kernel (``claims``) whose forward is ``forward`` and whose backward pass
    is ``backward`` (``flash2_backward``'s signature), through a custom autograd.Function."""

    def kernel(q: Any, k: Any, v: Any, *, bias: Any = None, **options: Any) -> Any:
        return _Backward.apply(q, k, v, bias, {**options, "backward": backward, "forward": forward})

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = f"{forward.__name__} with the backward pass {name}"
    return declare(kernel, **claims)


def with_bug(bug: str, formulation: Callable[..., Any] = flash2_backward) -> Callable[..., Any]:
    """``formulation`` (FlashAttention 2's backward) with the bug ``bug``."""

    def backward(*args: Any, **kwargs: Any) -> Any:
        return formulation(*args, bug=bug, **kwargs)

    return backward


def _attribute(bug: str) -> str:
    return "flash2_" + bug.replace("-", "_")


def _explicit_backward(bug: str) -> Callable[..., Any]:
    """FlashAttention 2's backward (with ``bug``) in FlashAttention's explicit convention
    ``bwd(dout, q, k, v, out, lse, **keywords)`` (``--backward-fn``)."""

    def backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, **options: Any) -> Any:
        del out, lse  # flash2_backward recomputes them
        return flash2_backward(q, k, v, dout, bug=bug, **options)

    return backward


def with_backward_fn(bug: str, name: str) -> Callable[..., Any]:
    """A declared kernel (:func:`plain_forward`) whose explicit backward function is
    FlashAttention 2's with ``bug``, the module attribute ``<name>_backward``."""

    def kernel(q: Any, k: Any, v: Any, **options: Any) -> Any:
        return plain_forward(q, k, v, **options)

    globals()[f"{name}_backward"] = _explicit_backward(bug)
    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = f"plain_forward with the explicit backward function {name}_backward"
    return declare(kernel, **CLAIMS, backward_fn=f"catalogue.backward_kernels:{name}_backward")


# Bugs an autograd.Function cannot have: torch.autograd sums a gradient returned at a shape
# that broadcasts to its input's down to that shape, so an unreduced dbias is reduced for
# the kernel.  Only an explicit backward function (FlashAttention's convention) returns it.
EXPLICIT_ONLY = ("dbias-not-reduced",)

flash2 = with_backward(flash2_backward, "flash2")
numpy_split_kv = with_backward(numpy_softmax_backward, "numpy_split_kv")
autograd_plain = declare(plain_forward, **CLAIMS)
explicit_flash2 = with_backward_fn("", "explicit_flash2")

BUGGY: dict[str, Callable[..., Any]] = {}
for _bug in BUGS:
    _name = _attribute(_bug.name)
    BUGGY[_bug.name] = globals()[_name] = (
        with_backward_fn(_bug.name, _name)
        if _bug.name in EXPLICIT_ONLY
        else with_backward(with_bug(_bug.name), _name)
    )

CORRECT_KERNELS = {
    "flash2": "flash2",
    "autograd": "autograd_plain",
    "numpy": "numpy_split_kv",
    "explicit": "explicit_flash2",
}


class _PackedBackward(torch.autograd.Function):
    """Packed sequences ``(T, H, E)`` (VARLEN-1): each sequence's forward alone
    (:func:`plain_forward`, bottom-right causal), rows past the last offset 0; backward:
    ``catalogue.backward.varlen_backward``, which leaves those rows unwritten (NaN) unless
    ``zero_tail``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Any, k: Any, v: Any, offsets: tuple[list[int], list[int]], options: Any
    ) -> Any:
        ctx.save_for_backward(q, k, v)
        ctx.offsets, ctx.options = offsets, options
        out = torch.zeros(*q.shape[:-1], v.shape[-1])
        cu_q, cu_k = offsets
        for b in range(len(cu_q) - 1):
            rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            heads_first = [a.transpose(0, 1)[None] for a in (q[rows], k[keys], v[keys])]
            sequence, _ = plain_forward(
                *heads_first, is_causal=options["is_causal"], causal_alignment="bottom_right"
            )
            out[rows] = sequence[0].transpose(0, 1)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> Any:  # type: ignore[override]
        q, k, v = ctx.saved_tensors
        grads = varlen_backward(q, k, v, *ctx.offsets, grad_out, **ctx.options)
        return (*grads, None, None)


def _packed_kernel(name: str, zero_tail: bool) -> Callable[..., Any]:
    """A declared packed kernel (FlashAttention's varlen convention) whose backward zeroes the
    rows past ``cu_seqlens[-1]`` or, as PyTorch #176793's, leaves them unwritten."""

    def kernel(
        q: Any,
        k: Any,
        v: Any,
        *,
        cu_seqlens_q: Any,
        cu_seqlens_k: Any,
        max_seqlen_q: int,
        max_seqlen_k: int,
        is_causal: bool = False,
    ) -> Any:
        del max_seqlen_q, max_seqlen_k  # the offsets say it all
        offsets = ([int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k])
        options = {"is_causal": is_causal, "zero_tail": zero_tail}
        return _PackedBackward.apply(q, k, v, offsets, options)

    kernel.__name__ = kernel.__qualname__ = name
    return declare(
        kernel,
        varlen=True,
        causal_alignment="bottom_right",
        scale=False,
        mask=False,
        dtypes=("float32",),
        backward=True,
    )


packed_zeroed_tail = _packed_kernel("packed_zeroed_tail", zero_tail=True)
packed_unwritten_tail = _packed_kernel("packed_unwritten_tail", zero_tail=False)


WINDOW = SparseClaim("sliding_window", {"left": 2, "right": 0})


class _WindowBackward(torch.autograd.Function):
    """A sliding window of 2 keys back (spec/sparse.md), its forward and backward
    :func:`plain_forward` with the pattern's mask under torch.autograd; ``unwritten`` leaves
    the dk, dv rows of keys no query attends as a block-sparse backward that never visits
    their blocks would without zeroing them (NaN: uninitialised memory)."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, unwritten: bool) -> Any:  # type: ignore[override]
        mask = torch.from_numpy(
            np.asarray(sparse_mask("sliding_window", q.shape[-2], k.shape[-2], left=2, right=0))
        )
        ctx.save_for_backward(q, k, v, mask)
        ctx.unwritten = unwritten
        return plain_forward(q, k, v, mask=mask)[0]

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> Any:  # type: ignore[override]
        q, k, v, mask = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            out = plain_forward(*leaves, mask=mask)[0]
        dq, dk, dv = torch.autograd.grad(out, leaves, grad_out)
        if ctx.unwritten:
            unseen = ~mask.any(-2)
            dk, dv = (
                dk.masked_fill(unseen[:, None], math.nan),
                dv.masked_fill(unseen[:, None], math.nan),
            )
        return dq, dk, dv, None


def _window_kernel(name: str, unwritten: bool) -> Callable[..., Any]:
    def kernel(q: Any, k: Any, v: Any) -> Any:
        return _WindowBackward.apply(q, k, v, unwritten)

    kernel.__name__ = kernel.__qualname__ = name
    return declare(kernel, sparse=WINDOW, dtypes=("float32",), batch_ndim=1, backward=True)


window_written = _window_kernel("window_written", unwritten=False)
window_unwritten = _window_kernel("window_unwritten", unwritten=True)
