"""Gated / delta-rule recurrence kernels (spec/recurrent.md) as libraries write them, in
NumPy float32: two correct formulations and the bugs real kernels had, one step wrong each.

Every kernel is ``fn(q, k, v, *, rule, g=None, beta=None, scale=None, initial_state=None)``
-> ``(out, final_state)`` in the layout of REC-1.1 (heads first), computing in float32 with a
float32 state.  ``token`` is the recurrence of REC-1.2 token by token; ``chunked`` the
chunked form a kernel author writes (chunks of ``CHUNK`` tokens, the last one shorter, the
chunk-local triangular system solved with ``numpy.linalg.solve``), written independently of
``attnspec.reference.recurrent``.  ``test_recurrent_catalogue.py`` shows each bug of
``BUGS`` outside REC-6.2's bound on its witness and the correct kernels within it;
``test_recurrent_conformance.py`` runs the conformance suite on the declared kernels (also
taking ``cu_seqlens=`` and ``chunk_size=``), with ``CONTRACT_BUGS`` for the properties of
state passing, packed sequences and chunk sizes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np

from .entry import namespace, required, signed

Array = np.ndarray
CHUNK = 16
FLOAT16_MAX = np.float32(65504.0)
DELTA = ("delta", "gated_delta")


def _heads(q: Array, k: Array, v: Array, bug: str | None) -> tuple[Array, Array, Array, int]:
    """k, v repeated to the Hs = max(Hk, Hv) states, q to the Ho = max(Hq, Hs) outputs; and
    the number of output heads per state (REC-3.1)."""
    states = max(k.shape[-3], v.shape[-3])
    outputs = max(q.shape[-3], states)
    if bug == "key_heads_modulo":  # state s reads key head s % Hk, not s // G
        k = np.tile(k, (states // k.shape[-3], 1, 1))
    else:
        k = np.repeat(k, states // k.shape[-3], axis=-3)
    v = np.repeat(v, states // v.shape[-3], axis=-3)
    if bug == "query_heads_modulo":  # output head h reads state h % Hs, not h // G
        index = np.arange(outputs) % states
        q = np.repeat(q, outputs // q.shape[-3], axis=-3)
        order = np.argsort(index, kind="stable")
        return q[..., order, :, :], k, v, outputs // states
    return np.repeat(q, outputs // q.shape[-3], axis=-3), k, v, outputs // states


def _read_contiguous(x: Any, bug: str | None) -> Any:
    """``x`` as a kernel that ignores strides reads it under ``strides_ignored``: its
    elements in row-major order from its first element on (for a view of a wider buffer,
    the memory past the view's last channel or token; every suite view holds as many
    elements from its first on)."""
    if bug != "strides_ignored" or x is None:
        return x
    x = np.asarray(x)
    contiguous = np.cumprod((1, *x.shape[:0:-1]))[::-1] * x.itemsize
    return np.lib.stride_tricks.as_strided(x, x.shape, tuple(int(s) for s in contiguous))


def _inputs(call: SimpleNamespace) -> tuple[Any, ...]:
    """The call's arrays in float32 as a kernel reads them: q, k, v shared out to the heads
    (:func:`_heads`), the gate (per key channel), the strength, the state, and the number of
    output heads per state."""
    bug, initial_state = call.bug, call.initial_state
    q, k, v, g, beta = (
        _read_contiguous(a, bug) for a in (call.q, call.k, call.v, call.g, call.beta)
    )
    q, k, v, groups = _heads(*(np.asarray(a, dtype=np.float32) for a in (q, k, v)), bug)
    states, length = k.shape[-3], k.shape[-2]
    shape = (*k.shape[:-3], states, length)
    gate = np.zeros((*shape, 1), np.float32) if g is None else np.asarray(g, np.float32)
    gate = gate if gate.ndim == len(shape) + 1 else gate[..., None]
    if bug == "log2_gate":  # the gate read as a base-2 logarithm
        gate = gate * np.float32(np.log(2.0))
    if bug == "equal_channel_gates_base2" and np.all(gate == gate[..., :1]):
        # every key channel's gate equal: the per-head path, whose gate misses its
        # conversion to base 2 (done on the per-channel path only) before exp2
        gate = gate[..., :1] * np.float32(np.log(2.0))
    strength = None if beta is None else np.asarray(beta, np.float32)
    if bug == "beta_first_head" and strength is not None:  # every head reads head 0's beta
        strength = np.repeat(strength[..., :1, :], states, axis=-2)
    state = np.zeros((*k.shape[:-2], k.shape[-1], v.shape[-1]), np.float32)
    if initial_state is not None and bug != "initial_state_ignored":
        state = np.asarray(initial_state, np.float32) * np.float32(
            2 if bug == "initial_state_twice" else 1
        )
    return q, k, v, gate, strength, state, groups


def _scale(scale: Any, d_k: int, bug: str | None) -> np.float32:
    if scale is not None:
        return np.float32(scale)
    return np.float32(1.0 / d_k if bug == "default_scale_one_over_dk" else d_k**-0.5)


# REC-1.2's keywords besides the rule (gate, strength, scale, past state), as the kernels
# take them; the catalogue's recurrences also take the rule, the chunk length and the bug
RECURRENCE = {"g": None, "beta": None, "scale": None, "initial_state": None}
ARRAYS = ("q", "k", "v")


@signed({**required("rule"), **RECURRENCE, "chunk": 1, "bug": None}, ARRAYS, namespace)
def _token(call: SimpleNamespace) -> tuple[Array, Array]:
    rule, bug = call.rule, call.bug
    if bug == "batch_shared_state" and np.shape(call.q)[0] > 1:
        return _one_state_slot(call)
    q, k, v, gate, strength, state, groups = _inputs(call)
    alpha = _scale(call.scale, q.shape[-1], bug)
    decode = k.shape[-2] == 1  # a one-token call: where kernels take a decode path
    if bug == "empty_call_loses_state" and k.shape[-2] == 0:  # written only by the token loop
        state = np.zeros_like(state)
    if bug == "zero_gate_fast_path" and not np.any(gate):  # "no gate": the linear rule
        rule = "linear"
    outs = []
    for t in range(k.shape[-2]):
        before = state
        if bug == "zero_beta_skips_token" and strength is not None:  # beta = 0: skipped
            keep = (strength[..., t] != 0)[..., None, None]
            state = np.where(keep, np.exp(gate[..., t, :])[..., :, None] * state, state)
        elif not (decode and bug == "decode_skips_gate"):  # the decode path forgets the gate
            state = np.exp(gate[..., t, :])[..., :, None] * state
        update = v[..., t, :]
        if rule in DELTA:
            read_from = before if bug == "correction_before_decay" else state
            read = np.einsum("...kv,...k->...v", read_from, k[..., t, :])
            update = strength[..., t, None] * (update - read)
        new = state + k[..., t, :, None] * update[..., None, :]
        if bug == "state_bfloat16":  # written back in the input dtype (ollama #15865)
            new = to_bfloat16(new)
        if bug == "state_float16":  # kept in float16 between tokens
            new = new.astype(np.float16).astype(np.float32)
        if bug == "state_clamped":  # saturated to float16's range, as for a float16 cache
            new = np.clip(new, -FLOAT16_MAX, FLOAT16_MAX)
        stale = bug == "output_before_update" or (decode and bug == "decode_output_before_update")
        seen = before if stale else new
        state = new
        # (a state per output head only where query heads share it: a copy per token else)
        shared = np.repeat(seen, groups, axis=-3) if groups > 1 else seen
        outs.append(alpha * np.einsum("...kv,...k->...v", shared, q[..., t, :]))
    out = np.stack(outs, axis=-2) if outs else np.zeros((*q.shape[:-1], v.shape[-1]), np.float32)
    return out, state


def _one_state_slot(call: SimpleNamespace) -> tuple[Array, Array]:
    """``batch_shared_state``: the batch elements run one after another on one state slot
    per head (a state offset that forgets the batch stride), so that each element starts
    from the previous one's final state; the first from its own past state."""
    outs, finals = [], []
    state, arrays = call.initial_state, (call.q, call.k, call.v, call.g, call.beta)
    carried = None if state is None else np.asarray(state)[:1]
    for b in range(np.shape(call.q)[0]):
        qb, kb, vb, gb, betab = (None if a is None else np.asarray(a)[b : b + 1] for a in arrays)
        out, carried = _token(
            qb, kb, vb, rule=call.rule, g=gb, beta=betab, scale=call.scale, initial_state=carried
        )
        outs.append(out)
        finals.append(carried)
    return np.concatenate(outs), np.concatenate(finals)


def to_bfloat16(x: Array) -> Array:
    """``x`` rounded to bfloat16 (to nearest, ties to even), as float32: the top 16 bits of
    the float32 pattern, so that no bfloat16 library is needed (finite values only)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + ((bits >> 16) & 1) + np.uint32(0x7FFF)) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def _narrow(x: Array, mode: str | None) -> Array:
    """With ``mode`` "bfloat16_operands", a product's operand rounded to bfloat16 first, as
    flash-linear-attention's Triton kernels store w, u, the corrections, the chunk states
    and the intra-chunk scores in the input dtype (chunk_delta_h.py's ``b_v.to(k.dtype)``);
    the state carried from chunk to chunk stays float32."""
    if mode != "bfloat16_operands":
        return x
    return to_bfloat16(x)


@signed({**required("rule"), **RECURRENCE, "chunk": CHUNK, "bug": None}, ARRAYS, namespace)
def _chunked(call: SimpleNamespace) -> tuple[Array, Array]:
    rule, chunk, bug = call.rule, call.chunk, call.bug
    q, k, v, gate, strength, state, groups = _inputs(call)
    alpha = _scale(call.scale, q.shape[-1], bug)
    length = k.shape[-2]
    if strength is None:
        strength = np.zeros(k.shape[:-1], np.float32)
    outs = []
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        kc, vc, bc, gc = (
            k[..., start:stop, :],
            v[..., start:stop, :],
            strength[..., start:stop],
            gate[..., start:stop, :],
        )
        qc = q[..., start:stop, :]
        if bug == "chunk_edge_gate_twice" and start > 0:  # the edge token's gate, once more
            state = np.exp(gc[..., 0, :])[..., :, None] * state
        if bug == "pad_decays" and stop - start < chunk:  # pads repeat the last gate, k = v = 0
            pad = chunk - (stop - start)
            gc = np.concatenate([gc, np.repeat(gc[..., -1:, :], pad, axis=-2)], axis=-2)
        cumulative = np.cumsum(gc, axis=-2)  # (..., c', e)
        c = stop - start
        own = cumulative[..., :c, :]
        if bug == "exp_inverse":  # e^{G_t} e^{-G_j}: overflows for strong decay
            pairs = np.exp(own)[..., :, None, :] * np.exp(-own)[..., None, :, :]
        causal = np.tril(np.ones((c, c), bool))[..., None]
        if bug != "exp_inverse":  # differences, and only where j <= t: nothing overflows
            pairs = np.exp(np.where(causal, own[..., :, None, :] - own[..., None, :, :], 0))
        pairs = np.where(causal, pairs, 0)
        decay = np.exp(own)  # (..., c, e)
        if rule in DELTA:
            lower = np.einsum(
                "...te,...tje,...je->...tj",
                kc,
                np.where(np.tril(np.ones((c, c), bool), -1)[..., None], pairs, 0),
                kc,
            )
            system = np.eye(c, dtype=np.float32) + bc[..., :, None] * lower
            values = bc[..., None] * vc
            keys = bc[..., None] * kc * decay
            if bug == "wy_both_decayed":  # the decay applied to both WY factors (shainet PR #170)
                values = values * decay[..., :1]
            u_tilde = _narrow(np.linalg.solve(system, values), bug)
            w = _narrow(np.linalg.solve(system, keys), bug)
            update = u_tilde - w @ _narrow(state, bug)
        else:
            update = vc
        update = _narrow(update, bug)
        shared_state = np.repeat(_narrow(state, bug), groups, axis=-3)
        shared_update = np.repeat(update, groups, axis=-3)
        shared_pairs = np.repeat(pairs, groups, axis=-4)
        shared_keys = np.repeat(kc, groups, axis=-3)
        shared_decay = np.repeat(decay, groups, axis=-3)
        scores = _narrow(np.einsum("...te,...tje,...je->...tj", qc, shared_pairs, shared_keys), bug)
        out = _narrow(qc * shared_decay, bug) @ shared_state + scores @ shared_update
        outs.append(alpha * out)
        dropped = bug == "last_chunk_dropped" or (bug == "other_sizes_drop_tail" and chunk != CHUNK)
        if dropped and stop - start < chunk:
            continue  # the partial last chunk never reaches the final state
        last = cumulative[..., -1:, :]  # the padded chunk's end under pad_decays
        to_end = np.exp(last - own)
        state = (
            np.exp(last[..., 0, :])[..., :, None] * state
            + np.swapaxes(kc * to_end, -1, -2) @ update
        )
    out = (
        np.concatenate(outs, axis=-2)
        if outs
        else np.zeros((*q.shape[:-1], v.shape[-1]), np.float32)
    )
    return out, state


def token(q: Array, k: Array, v: Array, **kwargs: Any) -> tuple[Array, Array]:
    """Correct: REC-1.2 token by token in float32."""
    return _token(q, k, v, **kwargs)


def chunked(q: Array, k: Array, v: Array, **kwargs: Any) -> tuple[Array, Array]:
    """Correct: the chunked form, chunks of 16, a shorter last chunk, decays as
    differences of cumulative log gates."""
    return _chunked(q, k, v, **kwargs)


def chunked_bfloat16_operands(q: Array, k: Array, v: Array, **kwargs: Any) -> tuple[Array, Array]:
    """Correct under its declaration (REC-6.2's u_p = u_d, for bfloat16 inputs): the chunked
    form with every product's operands rounded to bfloat16, the state carried in float32."""
    return _chunked(q, k, v, bug="bfloat16_operands", **kwargs)


CORRECT = (token, chunked)


@dataclass(frozen=True)
class RecurrentBug:
    """A kernel with one step wrong, where that happened upstream, and the problem it is
    shown wrong on (keyword changes to a default witness problem)."""

    fn: Callable[..., tuple[Array, Array]]
    upstream: str
    witness: dict[str, Any]


def _bug(base: Callable[..., tuple[Array, Array]], name: str) -> Callable[..., tuple[Array, Array]]:
    fn = partial(base, bug=name)
    fn.__name__ = name  # type: ignore[attr-defined]
    return fn


BUGS = (
    RecurrentBug(
        _bug(_token, "state_bfloat16"),
        "ollama #15865: the state written back in bfloat16",
        {"length": 300, "gate_normalizer": 10.0},
    ),
    RecurrentBug(
        _bug(_token, "correction_before_decay"),
        "the correction read from the undecayed state (fla #885 asks whether it should)",
        {},
    ),
    RecurrentBug(
        _bug(_token, "output_before_update"),
        "the output read before the current token's update (REC-1.5)",
        {},
    ),
    RecurrentBug(_bug(_token, "initial_state_ignored"), "a past state ignored", {}),
    RecurrentBug(_bug(_token, "initial_state_twice"), "a past state counted twice", {}),
    RecurrentBug(
        _bug(_token, "query_heads_modulo"),
        "query head h reads state h % Hs instead of h // G",
        {"heads": (4, 2, 2)},
    ),
    RecurrentBug(
        _bug(_token, "key_heads_modulo"),
        "value-head groups: state s reads key head s % Hk instead of s // G",
        {"heads": (2, 2, 4)},
    ),
    RecurrentBug(
        _bug(_token, "beta_first_head"),
        "every head reads the first head's beta (beta through the wrong pointer)",
        {},
    ),
    RecurrentBug(
        _bug(_token, "default_scale_one_over_dk"), "default scale 1/dk instead of dk^-1/2", {}
    ),
    RecurrentBug(_bug(_token, "log2_gate"), "the natural-log gate read as base 2", {}),
    RecurrentBug(
        _bug(_chunked, "pad_decays"),
        "transformers #46190: a padded last chunk that still updates the state",
        {"length": 40},
    ),
    RecurrentBug(
        _bug(_chunked, "exp_inverse"),
        "executorch PR #21417, tt-metal #56550: exp(-cumsum) overflows",
        {"strong_decay": 60.0},
    ),
    RecurrentBug(
        _bug(_chunked, "wy_both_decayed"),
        "shainet PR #170: the decay applied to both WY factors",
        {},
    ),
    RecurrentBug(
        _bug(_chunked, "last_chunk_dropped"),
        "fla #1142: the incomplete last chunk's term dropped",
        {"length": 40},
    ),
)


# Bugs of the state-passing contract (REC-2.2), of packed sequences (REC-3.3) and of chunk
# sizes (REC-5.1): (kernel, the catalogue kernel it is a variant of, where it happened or
# what it breaks, the property that must catch it).  Each shows only in calls that
# recurrent-matches-reference makes rarely or never (a one-token call from a past state,
# cu_seqlens, a chunk_size other than the default), so each has its own property.
CONTRACT_BUGS = (
    ("decode_skips_gate", _token, "a one-token decode path that forgets the gate", "decode"),
    (
        "decode_output_before_update",
        _token,
        "a decode step whose output reads the state before its own token (off by one)",
        "decode",
    ),
    (
        "varlen_state_carried",
        _token,
        "a packed sequence starting from the previous one's final state (vLLM #21783 kind)",
        "varlen",
    ),
    (
        "varlen_offsets_ignored",
        _token,
        "caller-provided cu_seqlens ignored: the packed batch run as one sequence (fla #838)",
        "varlen",
    ),
    (
        "chunk_edge_gate_twice",
        _chunked,
        "the first gate of each chunk applied to the incoming state twice",
        "chunk-size",
    ),
    (
        "other_sizes_drop_tail",
        _chunked,
        "chunk sizes other than the tuned 16 drop the incomplete last chunk (fla #1142 kind)",
        "chunk-size",
    ),
)
CONTRACT_BUGS += (
    (
        "zero_gate_fast_path",
        _token,
        "g = 0 everywhere taken as no gate, on a path without the delta correction (fla f636f5a)",
        "zero-gate",
    ),
    (
        "zero_beta_skips_token",
        _token,
        "a token with beta = 0 skipped altogether, its decay too",
        "zero-beta",
    ),
)
CONTRACT_BUGS += (
    (
        "state_clamped",
        _token,
        "the state saturated to float16's range after each token, as for a float16 cache",
        "linearity",
    ),
    (
        "batch_shared_state",
        _token,
        "one state slot per head for the whole batch (SGLang #31833 kind: the wrong grid)",
        "independence",
    ),
    (
        "strides_ignored",
        _token,
        "inputs read as contiguous whatever their strides (no input_guard)",
        "views",
    ),
    (
        "varlen_strides_ignored",
        _token,
        "the packed path reads its buffers as contiguous: NaN past cu_seqlens[-1] or d_k",
        "views",
    ),
    (
        "empty_call_loses_state",
        _token,
        "a call of no tokens returns zeros, not its past state (state written by the loop)",
        "state-passing",
    ),
    (
        "state_in_q_dtype",
        _token,
        "the final state returned in q's dtype (ONNX's reference without a past state)",
        "matches-reference",
    ),
    (  # declared with a per-key-channel gate, as every kernel of the property
        "equal_channel_gates_base2",
        _chunked,
        "equal per-channel gates sent to the per-head path, which misses the base-2 conversion",
        "equal-channel-gates",
    ),
)
CHUNK_SIZES = (2, 3, CHUNK)  # what the declared kernels take as chunk_size=


def _packed(
    base: Callable[..., tuple[Array, Array]], cu_seqlens: Any, bug: str | None, **kwargs: Any
) -> tuple[Array, Array]:
    """REC-3.3 with ``base``: q, k, v, g, beta of one batch element cut at ``cu_seqlens``,
    each sequence from its own past state (``initial_state (N, Hs, dk, dv)``)."""
    offsets = [int(n) for n in np.asarray(cu_seqlens)]
    states = kwargs.pop("initial_state")
    per_token = {n: kwargs.pop(n) for n in ("q", "k", "v", "g", "beta")}
    per_token = {n: a for n, a in per_token.items() if a is not None}
    if bug == "varlen_strides_ignored":  # the packed path indexes its buffers as contiguous
        per_token = {n: _read_contiguous(a, "strides_ignored") for n, a in per_token.items()}
    if bug == "varlen_offsets_ignored":
        first = None if states is None else states[:1]
        out, state = base(**per_token, initial_state=first, **kwargs)
        return out, np.repeat(state, len(offsets) - 1, axis=0)
    outs, finals, state = [], [], None
    for b, (start, stop) in enumerate(itertools.pairwise(offsets)):
        own = None if states is None else np.asarray(states)[b : b + 1]
        if bug != "varlen_state_carried" or state is None:
            state = own
        piece = {n: np.asarray(a)[:, :, start:stop] for n, a in per_token.items()}
        out, state = base(**piece, initial_state=state, **kwargs)
        outs.append(out)
        finals.append(state)
    return np.concatenate(outs, axis=2), np.concatenate(finals, axis=0)


# the declared kernels' keywords: REC-1.2's but the rule and scale, packed sequences
# (REC-3.3) and the chunk size (REC-5.1)
DECLARED_KEYWORDS = {
    "g": None,
    "beta": None,
    "initial_state": None,
    "cu_seqlens": None,
    "chunk_size": CHUNK,
}


def _declared(
    base: Callable[..., tuple[Array, Array]],
    name: str,
    bug: str | None = None,
    state_dtype: str | None = None,
    gate: str = "head",
) -> Callable[..., Any]:
    """``base`` as a gated delta rule kernel the conformance suite can call, declared
    (``--recurrent gated_delta --recurrent-chunk-size 16 --recurrent-varlen
    --recurrent-chunk-sizes 2,3,16 --recurrent-value-groups --gqa``, float16 and float32:
    it computes in float32), returning the output in q's dtype and a float32 state; ``bug``
    is one of
    CONTRACT_BUGS' (None: ``base`` as it is); ``state_dtype`` a narrower final-state dtype
    it declares and returns (``--recurrent-state-dtype``, REC-4.3); ``gate`` the gate's
    declared shape (``--recurrent-gate``: "head" or "channel")."""
    from attnspec.conformance import RecurrentClaim, declare

    @signed(DECLARED_KEYWORDS, ARRAYS, namespace)
    def kernel(call: SimpleNamespace) -> tuple[Array, Array]:
        run = partial(base, bug=bug) if bug else base
        arguments = {n: getattr(call, n) for n in ("q", "k", "v", "g", "beta")}
        arguments.update(
            rule="gated_delta", initial_state=call.initial_state, chunk=call.chunk_size
        )
        if call.cu_seqlens is None:
            out, state = run(**arguments)
        else:
            out, state = _packed(run, call.cu_seqlens, bug, **arguments)
        # state_in_q_dtype: ONNX's reference returns present_state in q's dtype when no
        # past state is given (REC-4.3)
        q = call.q
        final = q.dtype if bug == "state_in_q_dtype" else (state_dtype or np.float32)
        return out.astype(q.dtype), state.astype(final)

    kernel.__name__ = kernel.__qualname__ = name
    claim = RecurrentClaim(
        "gated_delta",
        gate,
        chunk_size=CHUNK,
        varlen=True,
        chunk_sizes=CHUNK_SIZES,
        value_groups=True,
        state_dtype=state_dtype,
    )
    return declare(kernel, recurrent=claim, gqa=True, dtypes=("float16", "float32"))


# Module-level, so that a check's worker process loads them by name.
declared_token = _declared(token, "declared_token")
declared_chunked = _declared(chunked, "declared_chunked")
DECLARED_CORRECT = (declared_token, declared_chunked)
DECLARED_BUGS = tuple(_declared(bug.fn, f"declared_{bug.fn.__name__}") for bug in BUGS)
DECLARED_CONTRACT_BUGS = tuple(
    (
        _declared(
            base,
            f"declared_{name}",
            name,
            gate="channel" if prop == "equal-channel-gates" else "head",
        ),
        f"recurrent-{prop}",
    )
    for name, base, _, prop in CONTRACT_BUGS
)
# The two correct formulations declared with a per-key-channel gate (GLA's, KDA's)
declared_token_channel = _declared(token, "declared_token_channel", gate="channel")
declared_chunked_channel = _declared(chunked, "declared_chunked_channel", gate="channel")
globals().update({fn.__name__: fn for fn in DECLARED_BUGS})
globals().update({fn.__name__: fn for fn, _ in DECLARED_CONTRACT_BUGS})
# A float16 final state, declared (REC-4.3): correct when the state is rounded once per
# call, wrong when it is kept in float16 from token to token (REC-4.1, ollama #15865's kind)
declared_token_float16_state = _declared(token, "declared_token_float16_state", None, "float16")
declared_float16_state_every_token = _declared(
    _token, "declared_float16_state_every_token", "state_float16", "float16"
)


def _heads_first(a: Any) -> Any:
    """(B, T, H, ...) -> (B, H, T, ...), None as it is."""
    return None if a is None else np.swapaxes(np.asarray(a), 1, 2)


# flash-linear-attention's chunk_gated_delta_rule takes these after q, k, v, by position too
FLA_OPTIONAL = {**RECURRENCE, "output_final_state": False, "cu_seqlens": None}


@signed({}, ARRAYS, namespace, optional=FLA_OPTIONAL)
def fla_convention(call: SimpleNamespace) -> tuple[Array, Any]:
    """The token kernel in flash-linear-attention's convention (``chunk_gated_delta_rule``):
    q, k, v ``(B, T, H, K)``, g and beta ``(B, T, H)``, ``initial_state (N, H, K, V)``, the
    final state only with ``output_final_state=True``, packed sequences as ``B = 1`` and
    ``cu_seqlens``.  Checked with ``--layout blhd --kwarg output_final_state=True``."""
    arguments = {n: _heads_first(getattr(call, n)) for n in ("q", "k", "v", "g", "beta")}
    arguments.update(rule="gated_delta", scale=call.scale, initial_state=call.initial_state)
    if call.cu_seqlens is None:
        out, state = _token(**arguments)
    else:
        out, state = _packed(_token, call.cu_seqlens, None, **arguments)
    final = state.astype(np.float32) if call.output_final_state else None
    return np.swapaxes(out, 1, 2).astype(call.q.dtype), final


@signed(
    required("q_num_heads", "kv_num_heads"),
    ("query", "key", "value"),
    namespace,
    optional={"past_state": None, "decay": None, "beta": None},
)
def onnx_convention(call: SimpleNamespace) -> tuple[Array, Array]:
    """The token kernel in the convention of ONNX's ``LinearAttention`` (``gated_delta``,
    per-head decay): ``(B, T, H * d)`` inputs with the head counts as ``q_num_heads`` and
    ``kv_num_heads``, ``decay`` and ``beta`` ``(B, T, H)``, ``past_state (B, H, dk, dv)``;
    returns ``(output (B, T, Hq * dv), present_state)``.  Checked with ``--layout packed
    --rename g=decay --rename initial_state=past_state``."""

    def unpacked(a: Array, heads: int) -> Array:
        b, t, width = a.shape
        return np.swapaxes(np.asarray(a).reshape(b, t, heads, width // heads), 1, 2)

    out, state = _token(
        unpacked(call.query, call.q_num_heads),
        unpacked(call.key, call.kv_num_heads),
        unpacked(call.value, call.kv_num_heads),
        rule="gated_delta",
        g=_heads_first(call.decay),
        beta=_heads_first(call.beta),
        initial_state=call.past_state,
    )
    b, heads, t, d_v = out.shape
    return np.swapaxes(out, 1, 2).reshape(b, t, heads * d_v).astype(call.query.dtype), state
