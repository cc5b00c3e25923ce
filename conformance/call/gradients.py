"""One backward call of a kernel (spec/backward.md): where the kernel runs, in its framework.

:func:`kernel_gradients` is what the kernel's process runs for a ``"vjp"`` request (and
what the judge runs itself when the kernel is not isolated): given the forward call's
arguments and an upstream gradient ``dO`` of the output, it returns ``(dq, dk, dv, dbias)``
as arrays of the kernel's library, on its device, in the kernel's own arithmetic.  Either
by the framework's automatic differentiation (``Backend.vjp``: ``torch.autograd``, which
runs a custom ``torch.autograd.Function``'s own backward, or ``jax.vjp``, through
``jax.jit``), or by the kernel's declared explicit backward function in FlashAttention's
convention ``bwd(dout, q, k, v, out, lse, **keywords)``.  Nothing here judges: the
gradients go back to the judge as plain data, which compares them with the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ...backends import Backend
from ..claims.declaration import KernelDeclaration
from ..claims.loading import load_kernel

Gradients = tuple[Any, Any, Any, Any]


class BackwardCall(NamedTuple):
    """One backward call: the forward call's arguments ``fn(*args, **kwargs)``, the upstream
    gradient ``grad_out`` of its output, the keyword of the bias whose gradient is wanted
    (None: no bias gradient), and the upstream gradient ``grad_lse`` of the log-sum-exp the
    kernel returns last (None: the log-sum-exp is not differentiated; BWD-10).  A
    recurrence (spec/recurrent.md, REC-7) also names the keywords whose gradients are
    wanted after the bias's (``wrt``: its ``g``, ``beta`` and ``initial_state``) and gives
    ``grad_state``, the upstream gradient of its second output, the final state (None: not
    a recurrence).  ``with_output`` asks for the output of the forward call the gradients
    are of as a fifth result: with dropout it shows the keep indicators that call drew,
    which its backward must use (BWD-9)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad_out: Any
    bias_keyword: str | None
    grad_lse: Any = None
    wrt: tuple[str, ...] = ()
    grad_state: Any = None
    with_output: bool = False


def _output(result: Any) -> Any:
    """The output of a raw result: the result, or its first item (out, weights, lse)."""
    return result[0] if isinstance(result, (tuple, list)) else result


def backward_function(declaration: KernelDeclaration) -> Callable[..., Any] | None:
    """The declared explicit backward function (loaded from ``MODULE:FUNC``), or None for
    a kernel differentiated by its framework."""
    found = declaration.backward_fn
    if isinstance(found, str):
        return load_kernel(found)
    return found


def _recurrent_gradients(
    backend: Backend, fn: Callable[..., Any], declaration: KernelDeclaration, call: BackwardCall
) -> tuple[Any, ...]:
    """REC-7.1: ``(dq, dk, dv, None, *gradients of call.wrt)`` of a recurrence ``fn(q, k, v,
    **keywords) -> (out, final_state)`` for the upstream gradients of both outputs; by the
    declared explicit backward function ``bwd(d_out, d_final_state, q, k, v, out,
    final_state, **keywords) -> (dq, dk, dv, dg, dbeta, d_initial_state)`` (None where the
    input is not given) or by the framework's automatic differentiation."""
    args, kwargs = call.args, call.kwargs
    explicit = backward_function(declaration)
    if explicit is not None:
        out, state = fn(*args, **kwargs)[:2]
        found = tuple(explicit(call.grad_out, call.grad_state, *args[:3], out, state, **kwargs))
        if len(found) != 6:
            raise TypeError(
                f"the backward function returned {len(found)} values, but should return "
                "(dq, dk, dv, dg, dbeta, d_initial_state) [REC-7.1]"
            )
        named = dict(zip(("g", "beta", "initial_state"), found[3:], strict=True))
        return (*found[:3], None, *(named[name] for name in call.wrt))

    def forward(q: Any, k: Any, v: Any, *differentiated: Any) -> Any:
        keywords = {**kwargs, **dict(zip(call.wrt, differentiated, strict=True))}
        out, state = fn(q, k, v, *args[3:], **keywords)[:2]
        return out, state

    primals = (*args[:3], *(kwargs[name] for name in call.wrt))
    _, grads = backend.vjp(forward, primals, (call.grad_out, call.grad_state))
    return (*grads[:3], None, *grads[3:])


def kernel_gradients(
    backend: Backend, fn: Callable[..., Any], declaration: KernelDeclaration, call: BackwardCall
) -> Gradients | tuple[Any, ...]:
    """``(dq, dk, dv, dbias)`` of the kernel ``fn`` called as ``fn(*call.args,
    **call.kwargs)``, for the upstream gradient ``call.grad_out`` of its output (BWD-1):
    ``dbias`` is the gradient of the keyword ``call.bias_keyword`` (None when it is None);
    the mask, the scale and every other argument are held fixed.  With ``call.grad_lse``,
    the log-sum-exp the kernel returns last is an output too (BWD-10), pulled back along it
    by the framework (FlashAttention's explicit convention has no such argument).  With
    ``call.grad_state`` (a recurrence, REC-7.1) the gradients of ``call.wrt`` follow; with
    ``call.with_output``, the output of the forward call differentiated (BWD-9: one call,
    one draw of the dropout indicators)."""
    if call.grad_state is not None:
        return _recurrent_gradients(backend, fn, declaration, call)
    args, kwargs, grad_out, bias_keyword, grad_lse = call[:5]
    explicit = backward_function(declaration)
    if explicit is not None and grad_lse is not None:
        raise TypeError(
            "an explicit backward function bwd(dout, q, k, v, out, lse, ...) takes no gradient "
            "of the log-sum-exp; BWD-10 is checked through the framework's differentiation"
        )
    if explicit is not None:
        result = fn(*args, **kwargs)
        out = _output(result)
        lse = result[-1] if declaration.returns_lse else None
        gradients = tuple(explicit(grad_out, *args[:3], out, lse, *args[3:], **kwargs))
        if len(gradients) not in (3, 4):
            raise TypeError(
                f"the backward function returned {len(gradients)} values, but should return "
                "(dq, dk, dv) or (dq, dk, dv, dbias) [BWD-1]"
            )
        dbias = gradients[3] if len(gradients) == 4 and bias_keyword is not None else None
        return (*gradients[:3], dbias, *((out,) if call.with_output else ()))

    def forward(q: Any, k: Any, v: Any, *bias: Any) -> Any:
        keywords = dict(kwargs)
        if bias:
            keywords[str(bias_keyword)] = bias[0]
        result = fn(q, k, v, *args[3:], **keywords)
        return _output(result) if grad_lse is None else (_output(result), result[-1])

    primals = (*args[:3], *(() if bias_keyword is None else (kwargs[bias_keyword],)))
    upstream = (grad_out,) if grad_lse is None else (grad_out, grad_lse)
    results, grads = backend.vjp(forward, primals, upstream)
    dbias = grads[3] if bias_keyword is not None else None
    return (*grads[:3], dbias, *((results[0],) if call.with_output else ()))


__all__ = ["BackwardCall", "Gradients", "backward_function", "kernel_gradients"]
