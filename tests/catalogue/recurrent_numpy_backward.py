"""Gated delta rule kernels with an explicit backward function, in NumPy float32: packed
sequences (REC-3.3, REC-7.4) and in-kernel L2 normalisation of q and k (REC-2.4, REC-7.5),
correct and with one step of the backward wrong each.

Every kernel is ``fn(q, k, v, *, g, beta, initial_state=None, cu_seqlens=None)`` ->
``(out, final_state)`` in the layout of REC-1.1 (heads first, per-head gates, no head
sharing), computing token by token in float32, declared ``--recurrent gated_delta
--recurrent-chunk-size 1 --backward-fn MODULE:FUNC`` (and ``--recurrent-varlen`` or
``--recurrent-qk-l2norm 1e-6``).  Its backward function is REC-7's explicit convention
``bwd(d_out, d_final_state, q, k, v, out, final_state, **keywords) -> (dq, dk, dv, dg,
dbeta, d_initial_state)``: the adjoint recurrence written here, independently of
``attnspec.reference`` (and of the torch catalogue, ``recurrent_backward.py``).  NumPy's
loops are a few times cheaper than torch's on the small arrays of the quick profile.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from attnspec.conformance import RecurrentClaim, declare

Array = np.ndarray
F32 = np.float32
EPS = 1e-6  # flash-linear-attention's l2norm epsilon (REC-2.4)


class GradientBug(NamedTuple):
    name: str
    what: str  # the step done wrong, and where such a bug was seen


VARLEN_BUGS = (
    GradientBug(
        "varlen_adjoint_carried",
        "the adjoint carried across a packed boundary: sequence b + 1's past-state gradient "
        "added to sequence b's final one (the backward of vLLM #21783's kind)",
    ),
    GradientBug(
        "varlen_dh0_shifted",
        "each sequence's past-state gradient written to the next sequence's slot (dh0 "
        "indexed by the chunk's sequence off by one)",
    ),
)
NORM_BUGS = (
    GradientBug(
        "l2norm_gradient_unprojected",
        "dq and dk of the normalised vectors divided by the norm, the projection "
        "-x_n (x_n . dx_n) dropped",
    ),
    GradientBug(
        "l2norm_gradient_of_normalised",
        "the gradients of the normalised q and k returned as those of the inputs",
    ),
)


def _normalized(x: Array) -> tuple[Array, Array]:
    """REC-2.4: x / sqrt(|x|^2 + eps) in float32, and the norm sqrt(|x|^2 + eps)."""
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + F32(EPS))
    return (x / norm).astype(F32), norm.astype(F32)


def _forward(
    q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array
) -> tuple[Array, Array, list[Array], list[Array]]:
    """REC-1.2 (gated_delta, per-head gate) of one packed sequence or batch, token by
    token in float32: ``(out, final_state, states S_{-1} .. S_{T-1}, decayed S'_t)``."""
    scale = F32(q.shape[-1] ** -0.5)
    states, decayed, outs = [state], [], []
    for t in range(k.shape[-2]):
        decayed.append(np.exp(g[..., t])[..., None, None] * states[-1])
        key = k[..., t, :]
        read = np.einsum("...kv,...k->...v", decayed[-1], key)
        update = beta[..., t, None] * (v[..., t, :] - read)
        states.append(decayed[-1] + key[..., :, None] * update[..., None, :])
        outs.append(scale * np.einsum("...kv,...k->...v", states[-1], q[..., t, :]))
    out = np.stack(outs, axis=-2) if outs else np.zeros((*q.shape[:-1], v.shape[-1]), F32)
    return out, states[-1], states, decayed


def _adjoint(
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    state: Array,
    d_out: Array,
    d_final: Array,
) -> tuple[Array, ...]:
    """REC-7.1 by hand for one sequence (or batch): the states kept, the adjoint carried
    from the last token to the first; ``(dq, dk, dv, dg, dbeta, d_state)`` in float32."""
    scale = F32(q.shape[-1] ** -0.5)
    _, _, states, decayed = _forward(q, k, v, g, beta, state)
    grads = [np.zeros_like(a) for a in (q, k, v, g, beta)]
    dq, dk, dv, dg, dbeta = grads
    adjoint = d_final.astype(F32)
    for t in range(k.shape[-2] - 1, -1, -1):
        dq[..., t, :] = scale * np.einsum("...kv,...v->...k", states[t + 1], d_out[..., t, :])
        adjoint = adjoint + scale * q[..., t, :, None] * d_out[..., t, None, :]
        key = k[..., t, :]
        w = np.einsum("...kv,...k->...v", adjoint, key)
        residual = v[..., t, :] - np.einsum("...kv,...k->...v", decayed[t], key)
        update = beta[..., t, None] * residual
        dv[..., t, :] = beta[..., t, None] * w
        dbeta[..., t] = np.sum(w * residual, axis=-1)
        dk[..., t, :] = np.einsum("...kv,...v->...k", adjoint, update) - np.einsum(
            "...kv,...v->...k", decayed[t], dv[..., t, :]
        )
        corrected = adjoint - key[..., :, None] * dv[..., t, None, :]
        dg[..., t] = np.sum(corrected * decayed[t], axis=(-1, -2))
        adjoint = np.exp(g[..., t])[..., None, None] * corrected
    return dq, dk, dv, dg, dbeta, adjoint


def _f32(*arrays: Any) -> list[Array]:
    return [np.asarray(a, dtype=F32) for a in arrays]


class _Problem(NamedTuple):
    """A call's inputs in float32 (q and k normalised if the kernel normalises), its packed
    sequences' token spans and the past states, one per sequence (per batch element
    unpacked)."""

    inputs: list[Array]  # q, k, v, g, beta
    spans: list[tuple[int, int]]
    states: Array


@dataclass(frozen=True)
class _Keywords:
    """A call's keywords: REC-1.2's gate and strength, the past states, REC-3.3's packed
    sequences, and whether the kernel normalises q and k (REC-2.4); making one of an
    unknown keyword is a TypeError that names it."""

    g: Any
    beta: Any
    initial_state: Any = None
    cu_seqlens: Any = None
    normalize: bool = False


def _problem(q: Any, k: Any, v: Any, **keywords: Any) -> _Problem:
    call = _Keywords(**keywords)
    initial_state, cu_seqlens = call.initial_state, call.cu_seqlens
    q, k, v, g, beta = _f32(q, k, v, call.g, call.beta)
    if call.normalize:
        q, k = _normalized(q)[0], _normalized(k)[0]
    length = k.shape[-2]
    offsets = [0, length] if cu_seqlens is None else [int(n) for n in np.asarray(cu_seqlens)]
    spans = list(itertools.pairwise(offsets))
    count = k.shape[0] if cu_seqlens is None else len(spans)
    states = np.zeros((count, k.shape[1], k.shape[-1], v.shape[-1]), F32)
    if initial_state is not None:
        states = np.asarray(initial_state, F32)
    return _Problem([q, k, v, g, beta], spans, states)


def _run(q: Any, k: Any, v: Any, **keywords: Any) -> tuple[Array, Array]:
    """The forward pass, each packed sequence from its own past state (keywords those of
    :func:`_problem`)."""
    p = _problem(q, k, v, **keywords)
    if keywords.get("cu_seqlens") is None:
        out, final, _, _ = _forward(*p.inputs, p.states)
        return out, final
    outs, finals = [], []
    for b, (start, stop) in enumerate(p.spans):
        piece = [a[:, :, start:stop] for a in p.inputs]
        out, final, _, _ = _forward(*piece, p.states[b : b + 1])
        outs.append(out)
        finals.append(final)
    return np.concatenate(outs, axis=2), np.concatenate(finals, axis=0)


def _normalization_vjp(x: Array, grad: Array, bug: str) -> Array:
    """REC-7.5: the gradient of the input x from that of x / sqrt(|x|^2 + eps)."""
    normal, norm = _normalized(x)
    if bug == "l2norm_gradient_of_normalised":
        return grad
    if bug == "l2norm_gradient_unprojected":
        return (grad / norm).astype(F32)
    along = np.sum(normal * grad, axis=-1, keepdims=True)
    return ((grad - normal * along) / norm).astype(F32)


def _backward(
    d_out: Any,
    d_final: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    bug: str = "",
    **keywords: Any,
) -> tuple[Array, ...]:
    """The explicit backward function: per packed sequence, the adjoint from its own final
    state's upstream gradient; with ``normalize``, through the normalisation (REC-7.5)."""
    p = _problem(q, k, v, **keywords)
    d_out, d_final = _f32(d_out, d_final)
    grads = [np.zeros_like(a) for a in p.inputs]
    d_states = np.zeros_like(p.states)
    if keywords.get("cu_seqlens") is None:
        *grads, d_states = _adjoint(*p.inputs, p.states, d_out, d_final)
    else:
        carried = np.zeros_like(p.states[:1])
        for b in range(len(p.spans) - 1, -1, -1):  # last sequence first: a carried adjoint
            start, stop = p.spans[b]
            piece = [a[:, :, start:stop] for a in p.inputs]
            upstream = d_final[b : b + 1]
            if bug == "varlen_adjoint_carried":
                upstream = upstream + carried
            *found, carried = _adjoint(
                *piece, p.states[b : b + 1], d_out[:, :, start:stop], upstream
            )
            for total, part in zip(grads, found, strict=True):
                total[:, :, start:stop] = part
            d_states[b : b + 1] = carried
        if bug == "varlen_dh0_shifted":
            d_states = np.roll(d_states, 1, axis=0)
    if keywords.get("normalize"):
        grads[0] = _normalization_vjp(np.asarray(q, F32), grads[0], bug)
        grads[1] = _normalization_vjp(np.asarray(k, F32), grads[1], bug)
    dtype = np.asarray(d_out).dtype
    return (*(a.astype(dtype) for a in grads), d_states.astype(F32))


def _declared(
    name: str, bug: str = "", *, varlen: bool = False, normalize: bool = False
) -> Callable[..., Any]:
    """A declared kernel and its explicit backward function ``<name>_backward`` (module
    level, so that the kernel's process loads it by name)."""

    def kernel(q: Any, k: Any, v: Any, **keywords: Any) -> tuple[Array, Array]:
        out, state = _run(q, k, v, normalize=normalize, **keywords)
        return out.astype(np.asarray(q).dtype), state

    def backward(
        d_out: Any, d_final: Any, q: Any, k: Any, v: Any, out: Any, final: Any, **keywords: Any
    ) -> tuple[Array, ...]:
        del out, final  # recomputed from the inputs
        return _backward(d_out, d_final, q, k, v, normalize=normalize, bug=bug, **keywords)

    for fn, fn_name in ((kernel, name), (backward, f"{name}_backward")):
        fn.__name__ = fn.__qualname__ = fn_name
        fn.__module__ = __name__
        globals()[fn_name] = fn
    claim = RecurrentClaim(
        "gated_delta", chunk_size=1, varlen=varlen, qk_l2norm=EPS if normalize else None
    )
    return declare(
        kernel,
        recurrent=claim,
        dtypes=("float32",),
        backward=True,
        backward_fn=f"{__name__}:{name}_backward",
    )


varlen_adjoint = _declared("varlen_adjoint", varlen=True)
VARLEN_BUGGY = {bug.name: _declared(bug.name, bug.name, varlen=True) for bug in VARLEN_BUGS}
l2norm_adjoint = _declared("l2norm_adjoint", normalize=True)
NORM_BUGGY = {bug.name: _declared(bug.name, bug.name, normalize=True) for bug in NORM_BUGS}
