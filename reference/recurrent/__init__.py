"""Gated and delta-rule linear attention, the recurrences of spec/recurrent.md (REC-*).

``recurrent_attention`` evaluates the definition token by token (REC-1.2) or, with a
``chunk_size``, in the chunked WY / UT form (REC-5.1), which equals it in exact arithmetic;
``varlen_recurrent_attention`` runs packed sequences, each with its own initial and final
state (REC-3.3); ``recurrent_attention_backward`` and ``varlen_recurrent_attention_backward``
are their gradients (REC-7).  Pure Array API: the same code on every array library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .._array import Array
from .._checks import namespace_of
from ..varlen import sequence_offsets
from ._inputs import (
    UPDATE_RULES,
    RecurrentInputs,
    check_chunk_size,
    l2_normalized,
    optional_arrays,
    prepare,
    shows_inputs,
)
from .backward import (
    RecurrentGradients,
    recurrent_attention_backward,
    varlen_recurrent_attention_backward,
)
from .chunked import chunked_recurrence
from .definition import token_recurrence

if TYPE_CHECKING:
    from typing import Unpack

CALL = "recurrent_attention(q, k, v)"
VARLEN_CALL = "varlen_recurrent_attention(q, k, v, cu_seqlens)"

__all__ = [
    "UPDATE_RULES",
    "RecurrentGradients",
    "RecurrentOutput",
    "l2_normalized",
    "recurrent_attention",
    "recurrent_attention_backward",
    "varlen_recurrent_attention",
    "varlen_recurrent_attention_backward",
]


class RecurrentOutput(NamedTuple):
    """``out (..., Ho, T, dv)`` in q's dtype (REC-4.2) and ``final_state (..., Hs, dk,
    dv)`` in the computation dtype, float32 or float64 (REC-4.1)."""

    out: Array
    final_state: Array


@shows_inputs
def recurrent_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    chunk_size: int | None = None,
    **inputs: Unpack[RecurrentInputs],
) -> RecurrentOutput:
    """One of the four update rules of REC-1.2 over ``T`` tokens.

    ``q (..., Hq, T, dk)``, ``k (..., Hk, T, dk)``, ``v (..., Hv, T, dv)`` with
    ``Hs = max(Hk, Hv)`` states and ``Ho = max(Hq, Hs)`` output heads (REC-3.1); ``g`` the
    natural-log decay, ``(..., Hs, T)`` per head or ``(..., Hs, T, dk)`` per key channel
    (rules ``gated``, ``gated_delta``; REC-1.3); ``beta (..., Hs, T)`` (rules ``delta``,
    ``gated_delta``; REC-1.4); ``scale`` defaults to ``dk ** -0.5`` (REC-2.3);
    ``initial_state (..., Hs, dk, dv)`` defaults to zeros (REC-2.2); ``normalize_qk``
    divides q and k by ``sqrt(|x|^2 + norm_eps)`` first (REC-2.4).  ``chunk_size=None``
    evaluates token by token, an int in chunks of that many tokens (REC-5.1).
    """
    problem = prepare(q, k, v, CALL, **inputs)
    if chunk_size is None:
        return RecurrentOutput(*token_recurrence(problem))
    return RecurrentOutput(*chunked_recurrence(problem, check_chunk_size(chunk_size, CALL)))


@shows_inputs
def varlen_recurrent_attention(
    q: Array,
    k: Array,
    v: Array,
    cu_seqlens: Any,
    *,
    chunk_size: int | None = None,
    **inputs: Unpack[RecurrentInputs],
) -> RecurrentOutput:
    """Packed sequences (REC-3.3): ``q (T, Hq, dk)``, ``k (T, Hk, dk)``, ``v (T, Hv, dv)``,
    ``g (T, Hs)`` or ``(T, Hs, dk)``, ``beta (T, Hs)``, tokens first as FlashAttention's
    varlen functions and flash-linear-attention take them; ``cu_seqlens`` the ``N + 1``
    offsets of VARLEN-1; ``initial_state (N, Hs, dk, dv)``.  Sequence ``b`` is
    :func:`recurrent_attention` of its own tokens from its own initial state.  Returns
    ``out (T, Ho, dv)`` and ``final_state (N, Hs, dk, dv)``.
    """
    g, beta, initial_state = optional_arrays(inputs)
    xp = namespace_of(VARLEN_CALL, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim != 3:
            raise ValueError(
                f"{name}.shape={tuple(a.shape)}, but should be (T, heads, head_dim) "
                f"[REC-3.3, {VARLEN_CALL}]"
            )
    offsets = sequence_offsets(cu_seqlens, "cu_seqlens", int(q.shape[0]), VARLEN_CALL)
    count = len(offsets) - 1
    if initial_state is not None and (initial_state.ndim != 4 or initial_state.shape[0] != count):
        raise ValueError(
            f"initial_state.shape={tuple(initial_state.shape)}, but should be "
            f"(N, Hs, dk, dv) with N = {count} sequences [REC-3.3, {VARLEN_CALL}]"
        )
    for name, a in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        if a is not None and (a.ndim < 2 or a.shape[0] != q.shape[0]):
            raise ValueError(
                f"{name}.shape={tuple(a.shape)}, but should hold q's {q.shape[0]} packed "
                f"tokens on its first axis [REC-3.3, {VARLEN_CALL}]"
            )

    def heads_first(a: Array, start: int, stop: int) -> Array:
        window = a[start:stop, ...]
        return xp.permute_dims(window, (1, 0, *range(2, a.ndim)))

    outs, states = [], []
    for b in range(count):
        start, stop = offsets[b], offsets[b + 1]
        own: RecurrentInputs = {
            **inputs,
            "g": None if g is None else heads_first(g, start, stop),
            "beta": None if beta is None else heads_first(beta, start, stop),
            "initial_state": None if initial_state is None else initial_state[b, ...],
        }
        result = recurrent_attention(
            *(heads_first(a, start, stop) for a in (q, k, v)), chunk_size=chunk_size, **own
        )
        outs.append(xp.permute_dims(result.out, (1, 0, 2)))
        states.append(result.final_state)
    if not states:
        raise ValueError(f"cu_seqlens has no sequence [REC-3.3, {VARLEN_CALL}]")
    return RecurrentOutput(xp.concat(outs, axis=0), xp.stack(states, axis=0))
