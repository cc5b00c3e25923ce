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

import torch

from attnspec.conformance import declare
from catalogue.backward import (
    BUGS,
    _alibi,
    _allowed,
    _scores,
    flash2_backward,
    numpy_softmax_backward,
)

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


def plain_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Any = None,
) -> tuple[Any, Any]:
    """SDPA-7.1 and its log-sum-exp (LSE-1) in float32 torch (rows without a key give 0 and
    -inf: SDPA-5.1, LSE-2); differentiable."""
    alpha = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[-3] // k.shape[-3]
    kk, vv = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    alibi = None if alibi_slopes is None else _alibi(alibi_slopes, n_queries, n_keys, "top_left")
    _, s = _scores(q, kk, bias, alpha, softcap, alibi)
    allowed = _allowed(n_queries, n_keys, mask, is_causal, "top_left")
    allowed = allowed & (s != -math.inf)
    s = s.masked_fill(~allowed, -math.inf)
    attends = allowed.any(-1, keepdim=True)
    safe = s.masked_fill(~attends, 0.0)
    weights = torch.softmax(safe, dim=-1) * attends
    lse = torch.logsumexp(safe, dim=-1).masked_fill(~attends[..., 0], -math.inf)
    return weights @ vv, lse


class _Backward(torch.autograd.Function):
    """Forward: :func:`plain_forward`; backward: the formulation in ``options``."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, bias: Any, options: dict[str, Any]) -> Any:
        ctx.save_for_backward(q, k, v, bias)
        ctx.options = options
        keywords = {key: value for key, value in options.items() if key != "backward"}
        return plain_forward(q, k, v, bias=bias, **keywords)

    @staticmethod
    def backward(ctx: Any, grad_out: Any, grad_lse: Any) -> Any:  # type: ignore[override]
        q, k, v, bias = ctx.saved_tensors
        options = dict(ctx.options)
        backward = options.pop("backward")
        dq, dk, dv, dbias = backward(q, k, v, grad_out, bias=bias, grad_lse=grad_lse, **options)
        return dq, dk, dv, dbias, None


def with_backward(backward: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A declared kernel whose backward pass is ``backward`` (``flash2_backward``'s
    signature), through a custom autograd.Function."""

    def kernel(q: Any, k: Any, v: Any, *, bias: Any = None, **options: Any) -> Any:
        return _Backward.apply(q, k, v, bias, {**options, "backward": backward})

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = f"plain_forward with the backward pass {name}"
    return declare(kernel, **CLAIMS)


def _buggy(bug: str) -> Callable[..., Any]:
    def backward(*args: Any, **kwargs: Any) -> Any:
        return flash2_backward(*args, bug=bug, **kwargs)

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
        else with_backward(_buggy(_bug.name), _name)
    )

CORRECT_KERNELS = {
    "flash2": "flash2",
    "autograd": "autograd_plain",
    "numpy": "numpy_split_kv",
    "explicit": "explicit_flash2",
}
