"""The recurrence of spec/recurrent.md evaluated token by token (REC-1.2), the definition.

For each state head: ``S <- exp(g_t) S`` (row ``i`` of the state, key channel ``i``, scaled
by ``exp(g_t)`` or ``exp(g_{t,i})``), then for the delta rules ``u_t = beta_t (v_t - S^T
k_t)`` on that decayed state (``u_t = v_t`` otherwise), ``S <- S + k_t u_t^T`` and ``o_t =
scale * S^T q_t``: the output reads the state that already holds token t.
"""

from __future__ import annotations

from typing import NamedTuple

import array_api_compat

from .._array import Array
from ._inputs import Recurrence


class Token(NamedTuple):
    """One token's step of REC-1.2 for every state head: the decay ``exp(g_t)`` ``(...,
    Hs, 1 or dk)``, the decayed state ``S'_t``, the residual ``v_t - S'^T_t k_t`` (None for
    the rules without a correction), the update ``u_t`` and the new state ``S_t``."""

    decay: Array
    decayed: Array
    residual: Array | None
    update: Array
    state: Array


def token_step(p: Recurrence, state: Array, t: int, decay: Array | None = None) -> Token:
    """Token ``t`` of REC-1.2 from the state ``S_{t-1}`` (the backward pass recomputes it
    from a saved state, so both passes share this one definition); ``decay``, if given, is
    ``exp(g_t)``, evaluated beforehand."""
    xp = p.xp
    if decay is None:
        decay = xp.exp(p.log_decay[..., t, :])  # (..., Hs, 1) or (..., Hs, dk)
    decayed = decay[..., :, None] * state
    key, update = p.k[..., t, :], p.v[..., t, :]
    residual = None
    if p.beta is not None:  # REC-1.2: the correction reads the decayed state
        residual = update - xp.matmul(key[..., None, :], decayed)[..., 0, :]
        update = p.beta[..., t, None] * residual
    return Token(
        decay, decayed, residual, update, decayed + key[..., :, None] * update[..., None, :]
    )


def token_recurrence(p: Recurrence) -> tuple[Array, Array]:
    """``(out (..., Ho, T, dv) in q's dtype, final state (..., Hs, dk, dv))``, one token at
    a time: T steps of ``O(dk dv)`` work and ``O(dk dv)`` memory per head."""
    xp, state, outs = p.xp, p.state, []
    for t in range(p.length):
        state = token_step(p, state, t).state
        queries = p.q[..., t, :]  # (..., Hs, G, dk): every output head of this state
        outs.append(p.scale * xp.matmul(queries[..., :, None, :], state[..., None, :, :]))
    if not outs:
        empty = (*p.q.shape[:-2], 0, p.v.shape[-1])
        return p.output_heads(
            xp.zeros(empty, dtype=state.dtype, device=array_api_compat.device(state))
        ), state
    out = xp.concat(outs, axis=-2)  # each (..., Hs, G, 1, dv)
    return p.output_heads(out), state
