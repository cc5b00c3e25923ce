"""REC-1 … REC-7: linear attention as a gated / delta-rule recurrence, called
``fn(q (B, Hq, T, dk), k (B, Hk, T, dk), v (B, Hv, T, dv), g=, beta=, initial_state=)`` ->
``(out (B, Ho, T, dv), final_state (B, Hs, dk, dv))`` with the declared update rule.

The suite draws unit-norm keys (REC-2.4's normalised inputs, the regime of REC-6.3; keys of
norm 1/4 to 4 for a kernel that declares it normalises them itself, --recurrent-qk-l2norm), gates
from weak decay to decays of e^-30 and below per token (REC-5.2), beta in (0, 1), a past
state, query groups where the kernel declares GQA, and lengths around and past the chunk
sizes kernels use (1, 63, 64, 65, 75, 129, 1000) at head dims 60, 64, 100 and 128.  The
output and the final state are compared, element by element, with the float64 recurrence
within the bound of REC-6.2 for the declared chunk size and operand precision: for one call
(``recurrent-matches-reference``), for a run split into calls that pass the state on
(``recurrent-state-passing``, ``recurrent-decode``: REC-2.2), for packed sequences
(``recurrent-varlen``: REC-3.3) and for every chunk size the kernel takes
(``recurrent-chunk-size``: REC-5.1).  With ``--backward`` the gradients (REC-7), computed
where the kernel runs for upstream gradients of the output and of the final state, are
judged within REC-7.7 of the float64 vector-Jacobian product, for one call
(``recurrent-gradients-match-reference``), for a split run that passes the state forward
and its gradient back (``recurrent-gradients-state-passing``) and for packed sequences
(``recurrent-gradients-varlen``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.recurrent import RecurrentGradients
from ....reference.recurrent.tolerance import RecurrentBound, recurrent_error_bound
from ....reference.recurrent.tolerance_backward import (
    RecurrentGradientBound,
    recurrent_gradient_error_bound,
)
from ...call.gradients import BackwardCall
from ...claims.declaration import KernelDeclaration
from ...claims.family_claims import RecurrentClaim
from ...draw import shape_pool, sizes
from ...draw.strategies import draw_dtype, random_values
from ..assertions import assert_elements_within, unlike_array
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import family_only, register
from ._helpers import arrays_have_layouts

REALISTIC_LENGTHS = (1, 63, 64, 65, 75, 129, 1000)  # around chunks of 16, 32, 64 and past them
# A contract (state passing, packed boundaries, chunk sizes) breaks at chunk edges, not with
# length: its properties run to 129 tokens; matches-reference checks the long runs.
CONTRACT_LENGTHS = tuple(n for n in REALISTIC_LENGTHS if n <= 129)
# Linearity and independence do not depend on the length: they run to one chunk of 64
SHORT_LENGTHS = tuple(n for n in REALISTIC_LENGTHS if n <= 65)
REALISTIC_HEAD_DIMS = (60, 64, 100, 128)  # flash-linear-attention's test grid
# where a split or a packed boundary falls in a realistic run: at and around chunk edges
REALISTIC_CUTS = (1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100)
# g = logsigmoid(U) / n: weak decay (n = 10), moderate (1), and e^-30 or less per token
GATE_NORMALIZERS = (10.0, 1.0, 0.01)
GATED, DELTA = ("gated", "gated_delta"), ("delta", "gated_delta")
PER_TOKEN = ("q", "k", "v", "g", "beta")  # (B, H, T, ...)


_recurrent_only = family_only("recurrent", "the kernel is not declared a recurrence (--recurrent)")


# the narrower of two state dtypes is the one of fewer bits (REC-4.3)
STATE_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def _carried(dtype: str) -> str:
    """REC-4.1's state dtype for inputs of ``dtype``."""
    return "float64" if dtype == "float64" else "float32"


def _state_dtype(claim: RecurrentClaim, dtype: str) -> str:
    """The final state's dtype (REC-4.3): the carried state's, or the declared one where
    that is narrower."""
    carried = _carried(dtype)
    declared = claim.state_dtype
    return declared if declared and STATE_BITS[declared] < STATE_BITS[carried] else carried


def _recurrent_claim(declaration: KernelDeclaration) -> RecurrentClaim:
    claim = declaration.recurrent
    assert claim is not None  # the properties apply only to a --recurrent declaration
    return claim


def _claiming(
    holds: Callable[[RecurrentClaim], object], missing: str
) -> Callable[[KernelDeclaration], str | None]:
    """Applicable to a recurrence whose claim ``holds``; ``missing`` says why not."""

    def applies(declaration: KernelDeclaration) -> str | None:
        reason = _recurrent_only(declaration)
        if reason is None and not holds(_recurrent_claim(declaration)):
            reason = missing
        return reason

    return applies


_takes_cu_seqlens = _claiming(
    lambda claim: claim.varlen,
    "the recurrent kernel does not take packed sequences (--recurrent-varlen)",
)
_takes_chunk_sizes = _claiming(
    lambda claim: claim.chunk_sizes,
    "the recurrent kernel takes no chunk_size (--recurrent-chunk-sizes)",
)


def _takes(name: str, rules: tuple[str, ...]) -> Callable[[KernelDeclaration], str | None]:
    """Applicable to a recurrence whose rule takes ``name`` (g: the gated rules, beta: the
    delta rules)."""
    return _claiming(
        lambda claim: claim.rule in rules, f"the recurrent kernel's rule takes no {name}"
    )


@dataclass(frozen=True)
class RecurrentCall:
    """One problem in float64 values exact in the dtypes the kernel received."""

    arrays: dict[str, np.ndarray]
    rule: str
    dtype: str
    state_dtype: str

    @property
    def length(self) -> int:
        return int(self.arrays["q"].shape[2])

    def tokens(self, start: int, stop: int, batch: slice = slice(None)) -> dict[str, np.ndarray]:
        """The per-token inputs of tokens ``start .. stop - 1`` (no past state)."""
        return {
            name: a[batch][:, :, start:stop] for name, a in self.arrays.items() if name in PER_TOKEN
        }

    def describe(self, how: str = "") -> str:
        shapes = ", ".join(f"{n} {a.shape}" for n, a in self.arrays.items())
        gate = self.arrays.get("g")
        strongest = f", g >= {float(gate.min()):.3g}" if gate is not None and gate.size else ""
        return (
            f"rule {self.rule}, {shapes} in {self.dtype} (state {self.state_dtype}){strongest}{how}"
        )


def _as_received(kernel: KernelUnderTest, values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` rounded to ``dtype`` as the kernel receives them, exactly in float64."""
    return np.asarray(kernel.numpy(kernel.backend.asarray(values, dtype)), dtype=np.float64)


def _draw_call(
    data: st.DataObject,
    kernel: KernelUnderTest,
    least: int = 1,
    batch: int | None = None,
    lengths: tuple[int, ...] = CONTRACT_LENGTHS,
    past_state: bool | None = None,
) -> RecurrentCall:
    """A problem of at least ``least`` tokens (and ``batch`` elements, if given; with a
    past state if ``past_state``, drawn if None); a realistic one of one of ``lengths``."""
    claim = _recurrent_claim(kernel.declaration)
    dtype = draw_dtype(data, kernel)
    state_dtype = _state_dtype(claim, dtype)
    drawing = sizes.current()
    head_dims: tuple[int, ...] = ()
    if drawing.realistic:  # within the user's --max-len and --max-head-dim
        cap, widest = drawing.limits.max_len, drawing.limits.max_head_dim
        lengths = tuple(n for n in lengths if least <= n <= cap) or (max(least, min(cap, 9)),)
        head_dims = tuple(d for d in REALISTIC_HEAD_DIMS if d <= widest) or (widest,)

    def draw_sizes(d: Any) -> tuple[int, ...]:
        """(T, dk, dv, Hk, G, Gv, B)"""
        if drawing.realistic:
            length = d.draw(st.sampled_from(lengths), label="T")
            d_k = d.draw(st.sampled_from(head_dims), label="dk")
            d_v = d.draw(st.sampled_from(head_dims), label="dv")
            heads = d.draw(st.integers(1, 4), label="Hk")
        else:
            length = d.draw(st.integers(least, max(least, 9)), label="T")
            d_k = d.draw(st.integers(1, 8), label="dk")
            d_v = d.draw(st.integers(1, 8), label="dv")
            heads = d.draw(st.integers(1, 2), label="Hk")
        group = d.draw(st.sampled_from((1, 2)), label="G") if kernel.declaration.gqa else 1
        # value-head groups (REC-3.1's reverse sharing): Gv states per key and query head
        values = d.draw(st.sampled_from((1, 2)), label="Gv") if claim.value_groups else 1
        elements = d.draw(st.integers(1, 2), label="B") if batch is None else batch
        return length, d_k, d_v, heads, group, values, elements

    # a backend that compiles per shape (JAX) meets a few of them a run (draw.shape_pool)
    request = f"recurrent sizes: T >= {least}, T in {lengths}, B = {batch}"
    length, d_k, d_v, heads, group, values, batch = shape_pool.pooled_sizes(
        data, request, draw_sizes
    )
    normalizer = data.draw(st.sampled_from(GATE_NORMALIZERS), label="gate normaliser")
    with_state = data.draw(st.booleans(), label="past state") if past_state is None else past_state
    # head dims up to 128 and T up to 1000: values from a seeded generator
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))
    keys = rng.standard_normal((batch, heads, length, d_k))
    norms = np.linalg.norm(keys, axis=-1, keepdims=True)
    if claim.qk_l2norm is not None:  # a kernel that normalises (REC-2.4) gets keys of any norm
        norms = norms * rng.uniform(0.25, 4.0, norms.shape)
    arrays: dict[str, np.ndarray] = {
        "q": random_values(kernel, rng, (batch, heads * group, length, d_k), dtype),
        "k": _as_received(kernel, keys / np.where(norms == 0, 1, norms), dtype),
        "v": random_values(kernel, rng, (batch, heads * values, length, d_v), dtype),
    }
    if claim.rule in GATED:
        shape = (batch, heads * values, length) + ((d_k,) if claim.gate == "channel" else ())
        gate = -np.log1p(np.exp(-rng.random(shape))) / normalizer
        arrays["g"] = _as_received(kernel, gate, dtype)
    if claim.rule in DELTA:
        strength = 1 / (1 + np.exp(-rng.standard_normal((batch, heads * values, length))))
        arrays["beta"] = _as_received(kernel, strength, dtype)
    if with_state:
        state = rng.standard_normal((batch, heads * values, d_k, d_v))
        arrays["initial_state"] = _as_received(kernel, state, state_dtype)
    return RecurrentCall(arrays, claim.rule, dtype, state_dtype)


def _invoke(
    kernel: KernelUnderTest,
    call: RecurrentCall,
    tokens: dict[str, np.ndarray],
    state: np.ndarray | None,
    how: str,
    sequences: int | None = None,
    build: Callable[[np.ndarray, str], Any] | None = None,
    **extra: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's ``(out, final_state)`` for ``tokens`` from the past ``state`` (None:
    none given), as float64 NumPy, after checking their shapes and dtypes; ``extra``
    keywords (``cu_seqlens``, ``chunk_size``) are passed as given; ``sequences`` is the
    number of final states (packed sequences; default the batch size); ``build`` makes
    the per-token backend arrays (default: contiguous ones)."""
    backend = kernel.backend
    build = backend.asarray if build is None else build
    positional = tuple(build(tokens[n], call.dtype) for n in ("q", "k", "v"))
    keywords: dict[str, Any] = dict(kernel.declaration.extra_kwargs)
    for name in ("g", "beta"):
        if name in tokens:
            keywords[name] = build(tokens[name], call.dtype)
    keywords["initial_state"] = None if state is None else backend.asarray(state, call.state_dtype)
    keywords.update(extra)
    shown = call.describe(how)
    try:
        result = kernel.call_raw(positional, keywords)
    except Exception as exc:
        raise KernelRaised(
            f"the recurrent kernel raised {type(exc).__name__}: {str(exc)[:300]} [call: {shown}]"
        ) from exc
    batch, queries, length, d_k = tokens["q"].shape
    states, d_v = tokens["v"].shape[1], tokens["v"].shape[-1]  # Hs = max(Hk, Hv) = Hv
    heads = max(queries, states)  # Ho (REC-3.1)
    sequences = batch if sequences is None else sequences
    wanted = (
        ((batch, heads, length, d_v), call.dtype),
        ((sequences, states, d_k, d_v), call.state_dtype),
    )
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise PropertyFailure(
            f"the recurrent kernel returned {type(result).__name__}, but should return "
            f"(out, final_state) (REC-2.2) [call: {shown}]"
        )
    for name, got, (shape, dtype) in zip(("out", "final_state"), result, wanted, strict=True):
        what = unlike_array(backend, got, shape, dtype)
        if what:
            raise PropertyFailure(
                f"the recurrent kernel's {name} has {what}, but should have shape {shape} "
                f"and dtype {dtype} (REC-1.1, REC-4.2, REC-4.3) [call: {shown}]"
            )
    return kernel.numpy(result[0]), kernel.numpy(result[1])


def _bound(
    kernel: KernelUnderTest,
    call: RecurrentCall,
    tokens: dict[str, np.ndarray],
    state: np.ndarray | None,
    chunk_size: int | None = None,
) -> RecurrentBound:
    """REC-6.2 for one run of ``tokens`` from ``state``, for the declared chunk size (or
    ``chunk_size``) and operand precision."""
    claim = _recurrent_claim(kernel.declaration)
    return recurrent_error_bound(
        tokens["q"],
        tokens["k"],
        tokens["v"],
        dtype=call.dtype,
        rule=call.rule,
        g=tokens.get("g"),
        beta=tokens.get("beta"),
        initial_state=state,
        chunk_size=claim.chunk_size if chunk_size is None else chunk_size,
        state_dtype=call.state_dtype,
        operands_in_input_dtype=claim.rounded_operands,
        normalize_qk=claim.qk_l2norm is not None,
        norm_eps=claim.qk_l2norm or 0.0,
    )


def _judge(
    results: tuple[np.ndarray, np.ndarray],
    bound: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    clauses: str,
    shown: str,
) -> None:
    """PropertyFailure at the first element of out or final_state outside the bound."""
    out, out_tolerance, state, state_tolerance = bound
    for name, actual, expected, tolerance in (
        ("out", results[0], out, out_tolerance),
        ("final_state", results[1], state, state_tolerance),
    ):
        assert_elements_within(
            name, actual, expected, tolerance, lambda at: f"{clauses}, REC-6.2", f" [call: {shown}]"
        )


def _whole(bound: RecurrentBound) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return tuple(  # type: ignore[return-value]
        np.asarray(a)
        for a in (bound.out, bound.out_tolerance, bound.final_state, bound.final_state_tolerance)
    )


def _with_zeros(data: st.DataObject, call: RecurrentCall, name: str) -> tuple[RecurrentCall, str]:
    """``call`` with ``name`` (g or beta) exactly 0 at every token, or at a random half of
    them (every key channel of a token), and how, for the failure's text."""
    everywhere = data.draw(st.booleans(), label=f"{name} = 0 at every token")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="zeros seed"))
    values = call.arrays[name].copy()
    tokens = values.shape[:3]
    values[np.ones(tokens, bool) if everywhere else rng.random(tokens) < 0.5] = 0.0
    how = f"; {name} = 0 at {'every token' if everywhere else 'about half the tokens'}"
    return RecurrentCall(
        {**call.arrays, name: values}, call.rule, call.dtype, call.state_dtype
    ), how


def _zeros_match_reference(kernel: KernelUnderTest, data: st.DataObject, name: str) -> None:
    """The kernel within REC-6.2 of the float64 recurrence with ``name`` zeroed."""
    call, how = _with_zeros(data, _draw_call(data, kernel), name)
    tokens, state = call.tokens(0, call.length), call.arrays.get("initial_state")
    results = _invoke(kernel, call, tokens, state, how)
    clause = "REC-1.3" if name == "g" else "REC-1.4"
    _judge(results, _whole(_bound(kernel, call, tokens, state)), clause, call.describe(how))


@register("recurrent-zero-gate", "REC-1.3", applies=_takes("g", GATED))
def recurrent_zero_gate(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-1.3: a gate of exactly 0 leaves the state unscaled, so with g = 0 at every token
    `gated` is `linear` and `gated_delta` is `delta`, and at some tokens those tokens are
    not decayed: a fast path for a zero gate that drops the delta correction
    (flash-linear-attention f636f5a's, for g=None) shows, against the float64 recurrence
    within REC-6.2."""
    _zeros_match_reference(kernel, data, "g")


def _takes_channel_gates(declaration: KernelDeclaration) -> str | None:
    reason: str | None = _takes("g", GATED)(declaration)
    if reason is None and _recurrent_claim(declaration).gate != "channel":
        reason = "the recurrent kernel's gate is per head (not --recurrent-gate channel)"
    return reason


@register("recurrent-equal-channel-gates", "REC-1.3", applies=_takes_channel_gates)
def recurrent_equal_channel_gates(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-1.3: a per-key-channel gate whose d_k entries are equal at every token (a
    per-head gate broadcast over the key channels, as models pass one to a per-channel
    kernel) gives the per-head gate's result: the kernel's output and final state are
    within REC-6.2 of the float64 recurrence run with the per-head gate.  A per-channel
    kernel that takes another path for such a gate (its per-head path), which differs
    from the per-channel one, shows; recurrent-matches-reference draws channels that
    differ, so never takes that path."""
    call = _draw_call(data, kernel)
    channel = data.draw(st.integers(0, call.arrays["g"].shape[-1] - 1), label="channel taken")
    per_head = call.arrays["g"][..., channel]  # (B, Hs, T)
    equal = np.ascontiguousarray(np.broadcast_to(per_head[..., None], call.arrays["g"].shape))
    broadcast = RecurrentCall({**call.arrays, "g": equal}, call.rule, call.dtype, call.state_dtype)
    how = f"; every key channel's gate that of channel {channel}"
    tokens, state = broadcast.tokens(0, call.length), call.arrays.get("initial_state")
    results = _invoke(kernel, broadcast, tokens, state, how)
    bound = _bound(kernel, broadcast, {**tokens, "g": per_head}, state)
    _judge(results, _whole(bound), "REC-1.3", broadcast.describe(how))


@register("recurrent-zero-beta", "REC-1.4", applies=_takes("beta", DELTA))
def recurrent_zero_beta(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-1.4: beta = 0 leaves the state only decayed, S_t = S'_t: a kernel that skips
    such a token altogether (its decay too) shows, against the float64 recurrence within
    REC-6.2 (where the state is all decayed history, so that REC-6.2's gamma_t, a chunked
    kernel's rounded cumulative log decays, is what a correct kernel needs)."""
    _zeros_match_reference(kernel, data, "beta")


@register("recurrent-matches-reference", "REC-6.2", applies=_recurrent_only)
def recurrent_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The output and the final state within REC-6.2 of the float64 recurrence: the rule,
    the gate's shape and base, beta, the default scale, the past state, query groups, the
    output reading the updated state, incomplete last chunks and strong decay all show."""
    call = _draw_call(data, kernel, lengths=REALISTIC_LENGTHS)
    tokens, state = call.tokens(0, call.length), call.arrays.get("initial_state")
    results = _invoke(kernel, call, tokens, state, "")
    _judge(results, _whole(_bound(kernel, call, tokens, state)), "REC-1.2", call.describe())


def _judge_in_pieces(
    kernel: KernelUnderTest, call: RecurrentCall, cuts: Sequence[int], how: str
) -> None:
    """One run cut at ``cuts``, each call from the final state the previous call returned
    (the first from the problem's past state), judged as one run against the float64 run
    within REC-6.2 (REC-2.2).  A kernel that declares a narrower state dtype rounds the
    state it returns (REC-4.3), so each of its calls is judged against the float64 run of
    its tokens from the state it was given: a state returned wrong shows in that call's
    final state, a state ignored in the next call's results."""
    state = call.arrays.get("initial_state")
    narrowed = call.state_dtype != _carried(call.dtype)
    outs = []
    for start, stop in itertools.pairwise([0, *cuts, call.length]):
        tokens, shown = call.tokens(start, stop), f"{how}; tokens {start}..{stop - 1}"
        results = _invoke(kernel, call, tokens, state, shown)
        if narrowed:
            bound = _whole(_bound(kernel, call, tokens, state))
            _judge(results, bound, "REC-2.2, REC-4.3", call.describe(shown))
        outs.append(results[0])
        state = results[1]
    if not narrowed:
        assert state is not None  # at least one piece ran
        bound = _whole(
            _bound(kernel, call, call.tokens(0, call.length), call.arrays.get("initial_state"))
        )
        _judge((np.concatenate(outs, axis=2), state), bound, "REC-2.2", call.describe(how))


def _draw_cut(data: st.DataObject, length: int, label: str, ends: bool = True) -> int:
    """A token index in 0 .. T: at and around chunk edges in a realistic run, and, with
    ``ends``, at the ends (a call of T = 0 tokens, REC-2.2's empty run) in one draw of
    eight; on a backend that compiles per shape, one of a few for each length."""

    def draw(d: Any) -> int:
        if ends and d.draw(st.integers(0, 7), label=f"{label}: an end") == 0:
            return int(d.draw(st.sampled_from((0, length)), label=label))
        if sizes.current().realistic:
            cuts = [c for c in (*REALISTIC_CUTS, length - 1) if 1 <= c < length]
            return int(d.draw(st.sampled_from(cuts), label=label))
        return int(d.draw(st.integers(1, length - 1), label=label))

    request = f"recurrent {label}: of {length} tokens, ends {ends}"
    return shape_pool.pooled_sizes(data, request, draw)


@register("recurrent-state-passing", "REC-2.2", applies=_recurrent_only)
def recurrent_state_passing(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-2.2: tokens 0 .. s-1 in one call, then tokens s .. T-1 in a second from the
    final state the first returned, give the outputs and the final state of one run over
    all T tokens (within REC-6.2 of the float64 run), with and without a past state, for
    0 <= s <= T (s = 0 or T: one call has no tokens, and returns its past state and an
    empty output): a state not returned, not read, or read twice, a last chunk that pads
    with tokens that still update the state, and an empty call that loses the state, all
    show."""
    call = _draw_call(data, kernel, least=2)
    split = _draw_cut(data, call.length, "split at")
    _judge_in_pieces(kernel, call, [split], f"; split at token {split}")


@register("recurrent-decode", "REC-2.2", applies=_recurrent_only)
def recurrent_decode(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-2.2: a prefill of T - n tokens, then n one-token decode steps (n <= 3), each
    from the state the previous call returned, give the last n output rows and the final
    state of one run over all T tokens: a decode path that skips the gate, reads the state
    before the update or ignores the state it is given shows."""
    call = _draw_call(data, kernel, least=2)
    steps = data.draw(st.integers(1, min(3, call.length - 1)), label="decode steps")
    prefill = call.length - steps
    how = f"; prefill of {prefill} tokens, then {steps} decode step(s)"
    _judge_in_pieces(kernel, call, range(prefill, call.length), how)


@register("recurrent-varlen", "REC-3.3", applies=_takes_cu_seqlens)
def recurrent_varlen(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-3.3: N sequences packed into one batch element with ``cu_seqlens`` (empty ones
    among them) and past states ``(N, Hs, dk, dv)``: each sequence's output rows and final
    state are those of its own run from its own past state (within REC-6.2); a state
    carried across a boundary, or offsets ignored, shows."""
    _packed_run(kernel, data, _draw_call(data, kernel, batch=1), "REC-3.3")


def _packing(
    data: st.DataObject, call: RecurrentCall
) -> tuple[list[int], tuple[int, ...], np.random.Generator]:
    """``cu_seqlens`` cutting ``call`` (one batch element) into up to four packed sequences,
    empty ones among them; the shape of their states, ``(N, Hs, dk, dv)``; and a generator
    for values drawn per sequence."""
    cuts = sorted(
        data.draw(st.lists(st.integers(0, call.length), max_size=3), label="packed boundaries")
    )
    offsets = [0, *cuts, call.length]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="states seed"))
    q, v = call.arrays["q"], call.arrays["v"]
    return offsets, (len(offsets) - 1, v.shape[1], q.shape[-1], v.shape[-1]), rng


def _packed_run(
    kernel: KernelUnderTest,
    data: st.DataObject,
    call: RecurrentCall,
    clauses: str,
    build: Callable[[np.ndarray, str], Any] | None = None,
    how: str = "",
) -> None:
    """``call`` (one batch element) cut into up to four packed sequences by drawn
    ``cu_seqlens``, each with its own drawn past state if ``call`` has one, judged against
    each sequence's own float64 run; ``build`` makes the per-token arrays."""
    offsets, shape, rng = _packing(data, call)
    sequences = len(offsets) - 1
    states = None
    if "initial_state" in call.arrays:
        states = _as_received(kernel, rng.standard_normal(shape), call.state_dtype)
    how = f"{how}; packed, cu_seqlens {offsets}"
    cu_seqlens = kernel.backend.asarray(np.asarray(offsets, dtype=np.int32))
    whole = call.tokens(0, call.length)
    results = _invoke(
        kernel, call, whole, states, how, sequences, build=build, cu_seqlens=cu_seqlens
    )
    parts = [
        _whole(
            _bound(
                kernel,
                call,
                call.tokens(start, stop),
                None if states is None else states[b : b + 1],
            )
        )
        for b, (start, stop) in enumerate(itertools.pairwise(offsets))
    ]
    out, out_tolerance, final, final_tolerance = (
        np.concatenate([part[i] for part in parts], axis=2 if i < 2 else 0) for i in range(4)
    )
    _judge(results, (out, out_tolerance, final, final_tolerance), clauses, call.describe(how))


@register("recurrent-chunk-size", "REC-5.1", applies=_takes_chunk_sizes)
def recurrent_chunk_size(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-5.1: called with every chunk size it declares (``chunk_size=``), the kernel's
    output and final state are within REC-6.2 (for that chunk size) of the one float64
    run, so within twice the bound of each other: a path of one chunk size that drops
    the incomplete last chunk, or applies a gate twice at a chunk edge, shows."""
    call = _draw_call(data, kernel)
    tokens, state = call.tokens(0, call.length), call.arrays.get("initial_state")
    for size in _recurrent_claim(kernel.declaration).chunk_sizes:
        how = f"; chunk_size={size}"
        results = _invoke(kernel, call, tokens, state, how, chunk_size=size)
        bound = _bound(kernel, call, tokens, state, chunk_size=size)
        _judge(results, _whole(bound), "REC-5.1", call.describe(how))


# The powers of two (V, S_-1) are scaled by in recurrent-linearity, by q's dtype and the
# state's: float16's outputs and states overflow past about 2^4 times the suite's values;
# the others reach the magnitudes where a state clamped or renormalised to a fixed range
# shows.
LINEARITY_EXPONENTS = {"float16": 4, "bfloat16": 24, "float32": 24, "float64": 48}


def _scaled_call(call: RecurrentCall, values: np.ndarray, state: np.ndarray) -> RecurrentCall:
    return RecurrentCall(
        {**call.arrays, "v": values, "initial_state": state},
        call.rule,
        call.dtype,
        call.state_dtype,
    )


@register("recurrent-linearity", "REC-1.2", applies=_recurrent_only)
def recurrent_linearity(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-1.2, REC-2.2: with q, k, g and beta fixed, the output and the final state are
    linear in the values and the past state jointly, o(a V1 + b V2, a S1 + b S2) =
    a o(V1, S1) + b o(V2, S2), for powers of two a, b of either sign from 2^-24 to 2^24
    (2^-4 to 2^4 where q or a declared state is float16): the three calls' results
    satisfy it within the sum of their REC-6.2 bounds (scaled by |a|, |b|), up to the
    float64 effect of rounding a V1 + b V2 to the input dtype.  A state clamped or
    renormalised to a fixed range, or a bias in the state path, shows at the magnitudes
    the other properties never draw."""
    first = _draw_call(data, kernel, past_state=True, lengths=SHORT_LENGTHS)
    top = min(LINEARITY_EXPONENTS[first.dtype], LINEARITY_EXPONENTS[first.state_dtype])
    a, b = (
        data.draw(st.sampled_from((1.0, -1.0)), label=f"sign of {name}")
        * 2.0 ** data.draw(st.integers(-top, top), label=f"log2 |{name}|")
        for name in ("a", "b")
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="V2, S2 seed"))
    values, state = first.arrays["v"], first.arrays["initial_state"]
    second = _scaled_call(
        first,
        random_values(kernel, rng, values.shape, first.dtype),
        _as_received(kernel, rng.standard_normal(state.shape), first.state_dtype),
    )
    combined = _scaled_call(
        first,
        _as_received(kernel, a * values + b * second.arrays["v"], first.dtype),
        _as_received(kernel, a * state + b * second.arrays["initial_state"], first.state_dtype),
    )
    how = f"; o(a V1 + b V2, a S1 + b S2) - a o1 - b o2, a = {a:g}, b = {b:g}"
    runs = []
    for n, call in enumerate((first, second, combined), 1):
        tokens, past = call.tokens(0, call.length), call.arrays["initial_state"]
        results = _invoke(kernel, call, tokens, past, f"{how}; call {n} of 3")
        runs.append((results, _whole(_bound(kernel, call, tokens, past))))
    (o1, s1), b1 = runs[0]
    (o2, s2), b2 = runs[1]
    (o3, s3), b3 = runs[2]
    with np.errstate(invalid="ignore", over="ignore"):
        differences = (o3 - a * o1 - b * o2, s3 - a * s1 - b * s2)
        expected = tuple(b3[i] - a * b1[i] - b * b2[i] for i in (0, 2))
        tolerance = tuple(b3[i] + abs(a) * b1[i] + abs(b) * b2[i] for i in (1, 3))
    bound = (expected[0], tolerance[0], expected[1], tolerance[1])
    _judge(differences, bound, "REC-1.2, REC-2.2", first.describe(how))


def _permuted(a: np.ndarray, batch: Sequence[int], heads: Sequence[int]) -> np.ndarray:
    """``a`` (B, H, ...) with its batch elements in the order ``batch`` and its heads in
    blocks of H / len(heads) (the heads that share one key head, REC-3.1) in the order
    ``heads``."""
    blocks = a.reshape(a.shape[0], len(heads), a.shape[1] // len(heads), *a.shape[2:])
    return blocks[list(batch)][:, list(heads)].reshape(a.shape)


@register("recurrent-independence", "REC-3.2", applies=_recurrent_only)
def recurrent_independence(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-3.2: with the batch elements and the key heads (with the query, value, gate,
    beta and past-state heads that go with them) permuted, and one batch element's q, v
    and past state drawn anew, every other element's output and final state are the
    first call's, permuted, within twice REC-6.2's bound: a state shared between batch
    elements or heads, or a batch or head offset taken from the wrong grid, shows."""
    batch = data.draw(st.integers(2, 3), label="B")
    call = _draw_call(data, kernel, batch=batch, lengths=SHORT_LENGTHS)
    heads = call.arrays["k"].shape[1]
    order = data.draw(st.permutations(range(batch)), label="batch order")
    head_order = data.draw(st.permutations(range(heads)), label="key head order")
    fresh = data.draw(st.integers(0, batch - 1), label="element drawn anew")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="new values seed"))
    arrays = {n: _permuted(a, order, head_order) for n, a in call.arrays.items()}
    for name in ("q", "v", "initial_state"):
        if name in arrays:
            dtype = call.state_dtype if name == "initial_state" else call.dtype
            shape = arrays[name][fresh].shape
            arrays[name][fresh] = random_values(kernel, rng, shape, dtype)
    moved = RecurrentCall(arrays, call.rule, call.dtype, call.state_dtype)
    how = (
        f"; batch order {list(order)}, key head order {list(head_order)}, "
        f"element {fresh} drawn anew"
    )
    tokens, state = call.tokens(0, call.length), call.arrays.get("initial_state")
    first = _invoke(kernel, call, tokens, state, f"{how}; the first call")
    second = _invoke(kernel, moved, moved.tokens(0, call.length), arrays.get("initial_state"), how)
    _, out_tolerance, _, final_tolerance = _whole(_bound(kernel, call, tokens, state))
    kept = [i for i in range(batch) if i != fresh]
    expected = [_permuted(a, order, head_order)[kept] for a in (first[0], first[1])]
    tolerances = [
        2 * _permuted(a, order, head_order)[kept] for a in (out_tolerance, final_tolerance)
    ]
    _judge(
        (second[0][kept], second[1][kept]),
        (expected[0], tolerances[0], expected[1], tolerances[1]),
        "REC-3.2",
        moved.describe(f"{how}; indices among the elements kept, {kept}"),
    )


def _with_poisoned_memory(
    kernel: KernelUnderTest, dims: int, tokens: int
) -> Callable[[np.ndarray, str], Any]:
    """A maker of backend arrays that are views: the first T tokens and the first d
    channels (the last axis of a 4-d array) of a buffer with ``tokens`` more tokens and
    ``dims`` more channels, all NaN."""

    def build(values: np.ndarray, dtype: str) -> Any:
        # (B, H, T, d) or, a per-head gate or beta, (B, H, T)
        wider = (0, 0, tokens, dims)[: values.ndim]
        buffer = np.full([n + m for n, m in zip(values.shape, wider, strict=True)], np.nan)
        view = tuple(slice(0, n) for n in values.shape)
        buffer[view] = values
        return kernel.backend.asarray(buffer, dtype)[view]

    return build


@register("recurrent-views", "REC-1.6", applies=_recurrent_only, applies_on=arrays_have_layouts)
def recurrent_views(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-1.6: q, k, v, g and beta given as views, the first T tokens and the first d_k
    (d_v) channels of buffers whose other tokens and channels are NaN, give the result
    of contiguous arrays (within REC-6.2 of the float64 run): a kernel that ignores an
    input's strides, or reads past a head's tokens or past the head dim, reads NaN.
    A kernel that takes packed sequences is also called packed, with NaN past
    ``cu_seqlens[-1]``, in one draw of two.  Not applicable where the backend's arrays have
    no strides."""
    packed = _recurrent_claim(kernel.declaration).varlen and data.draw(
        st.booleans(), label="packed"
    )
    call = _draw_call(data, kernel, batch=1 if packed else None)
    dims = data.draw(st.integers(0, 8), label="NaN channels past the head dim")
    tokens = data.draw(st.integers(0 if dims else 1, 17), label="NaN tokens past T")
    how = f"; q, k, v, g, beta views with {dims} NaN channels and {tokens} NaN tokens past them"
    build = _with_poisoned_memory(kernel, dims, tokens)
    if packed:
        _packed_run(kernel, data, call, "REC-1.6, REC-3.3", build, how)
        return
    whole, state = call.tokens(0, call.length), call.arrays.get("initial_state")
    results = _invoke(kernel, call, whole, state, how, build=build)
    _judge(results, _whole(_bound(kernel, call, whole, state)), "REC-1.6", call.describe(how))


# REC-7: the gradients (--backward).  The inputs whose gradients REC-7.1 returns, in order
GRADIENT_INPUTS = ("q", "k", "v", "g", "beta", "initial_state")


def _recurrent_backward(declaration: KernelDeclaration) -> str | None:
    reason = _recurrent_only(declaration)
    if reason is None and not declaration.backward:
        reason = "the recurrent kernel does not claim a backward pass (--backward)"
    return reason


def _takes_cu_seqlens_backward(declaration: KernelDeclaration) -> str | None:
    return _recurrent_backward(declaration) or _takes_cu_seqlens(declaration)


def _gradient_upstream(
    kernel: KernelUnderTest, call: RecurrentCall, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random upstream gradients of the output (q's dtype) and of the final state (the
    state's dtype), as the kernel receives them (REC-7.6)."""
    q, v = call.arrays["q"], call.arrays["v"]
    states, d_k = v.shape[1], q.shape[-1]
    out = (q.shape[0], max(q.shape[1], states), q.shape[2], v.shape[-1])
    state = (q.shape[0], states, d_k, v.shape[-1])
    return (
        _as_received(kernel, rng.standard_normal(out), call.dtype),
        _as_received(kernel, rng.standard_normal(state), call.state_dtype),
    )


def _gradients(
    kernel: KernelUnderTest,
    call: RecurrentCall,
    tokens: dict[str, np.ndarray],
    state: np.ndarray,
    upstream: tuple[np.ndarray, np.ndarray],
    how: str,
    **extra: Any,
) -> dict[str, np.ndarray]:
    """The kernel's gradients for ``tokens`` from the past ``state`` and the upstream
    gradients ``(dO, dS)``, computed where it runs, each checked to have its input's shape
    and dtype (REC-7.2, REC-7.3), as float64 NumPy by input name; ``extra`` keywords
    (``cu_seqlens``) are passed as given and not differentiated."""
    backend = kernel.backend
    passed = {n: backend.asarray(a, call.dtype) for n, a in tokens.items()}
    passed["initial_state"] = backend.asarray(state, call.state_dtype)
    keywords: dict[str, Any] = dict(kernel.declaration.extra_kwargs)
    wrt = tuple(n for n in GRADIENT_INPUTS[3:] if n in passed)
    keywords.update({n: passed[n] for n in wrt})
    keywords.update(extra)
    backward = BackwardCall(
        tuple(passed[n] for n in GRADIENT_INPUTS[:3]),
        keywords,
        backend.asarray(upstream[0], call.dtype),
        None,
        wrt=wrt,
        grad_state=backend.asarray(upstream[1], call.state_dtype),
    )
    shown = call.describe(how)
    try:
        raw = kernel.call_gradients(backward)
    except PropertyFailure:
        raise
    except Exception as exc:
        raise KernelRaised(
            f"the recurrent kernel's backward pass raised {type(exc).__name__}: "
            f"{str(exc)[:300]} [REC-7.1; call: {shown}]"
        ) from exc
    if not isinstance(raw, (tuple, list)) or len(raw) != 4 + len(wrt):
        raise PropertyFailure(
            f"the backward pass gave {type(raw).__name__}, not the gradients of q, k, v and "
            f"{', '.join(wrt)} [REC-7.1; call: {shown}]"
        )
    found = dict(zip(("q", "k", "v"), raw[:3], strict=True))
    found.update(zip(wrt, raw[4:], strict=True))
    result = {}
    for name, gradient in found.items():
        primal = passed[name]
        dtype = call.state_dtype if name == "initial_state" else call.dtype
        what = unlike_array(backend, gradient, tuple(primal.shape), dtype)
        if what:
            raise PropertyFailure(
                f"d{name} has {what}, but should have its input's shape {tuple(primal.shape)} "
                f"and dtype {dtype} (REC-7.2, REC-7.3) [call: {shown}]"
            )
        result[name] = kernel.numpy(gradient)
    return result


def _gradient_bound(
    kernel: KernelUnderTest,
    call: RecurrentCall,
    state: np.ndarray,
    upstream: tuple[np.ndarray, np.ndarray],
    tokens: dict[str, np.ndarray] | None = None,
) -> RecurrentGradientBound:
    """REC-7.7 for one run of ``tokens`` (default: the whole call) from ``state``, for the
    declared chunk size and operand precision."""
    claim = _recurrent_claim(kernel.declaration)
    tokens = call.tokens(0, call.length) if tokens is None else tokens
    return recurrent_gradient_error_bound(
        tokens["q"],
        tokens["k"],
        tokens["v"],
        upstream[0],
        dtype=call.dtype,
        rule=call.rule,
        g=tokens.get("g"),
        beta=tokens.get("beta"),
        initial_state=state,
        grad_final_state=upstream[1],
        chunk_size=claim.chunk_size,
        state_dtype=call.state_dtype,
        operands_in_input_dtype=claim.rounded_operands,
        normalize_qk=claim.qk_l2norm is not None,
        norm_eps=claim.qk_l2norm or 0.0,
    )


def _judge_gradients(
    got: dict[str, np.ndarray], bound: RecurrentGradientBound, clauses: str, shown: str
) -> None:
    """PropertyFailure at the first gradient element outside REC-7.7 (NaN is outside)."""
    for name, expected, tolerance in zip(
        GRADIENT_INPUTS, bound.gradients, bound.tolerances, strict=True
    ):
        if expected is None or name not in got:
            continue
        assert_elements_within(
            f"d{name}",
            got[name],
            np.asarray(expected),
            np.asarray(tolerance),
            lambda _: f"{clauses}, REC-7.7",
            f" [call: {shown}]",
        )


def _draw_with_upstream(
    data: st.DataObject, kernel: KernelUnderTest, least: int = 1
) -> tuple[RecurrentCall, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """A problem with a past state (zeros where the draw has none) and its upstream
    gradients."""
    call = _draw_call(data, kernel, least=least, past_state=True)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="upstream seed"))
    return call, call.arrays["initial_state"], _gradient_upstream(kernel, call, rng)


@register("recurrent-gradients-match-reference", "REC-7.7", applies=_recurrent_backward)
def recurrent_gradients_match_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-7.1 … REC-7.3, REC-7.7: for random upstream gradients of the output and of the
    final state, dq, dk, dv, dg, dbeta and the past state's gradient are within REC-7.7 of
    the float64 vector-Jacobian product, with their inputs' shapes and dtypes: a gate
    gradient missing a term, a dropped past-state gradient, a wrong dbeta, the decay's
    gradient taken on the wrong state, query groups not summed and a chunked backward that
    drops its last partial chunk are outside it."""
    call, state, upstream = _draw_with_upstream(data, kernel)
    got = _gradients(kernel, call, call.tokens(0, call.length), state, upstream, "")
    _judge_gradients(
        got, _gradient_bound(kernel, call, state, upstream), "REC-7.1", call.describe()
    )


@register("recurrent-gradients-state-passing", "REC-7.4", applies=_recurrent_backward)
def recurrent_gradients_state_passing(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-7.4: a run split at token s, the second call starting from the state the first
    returned: the second call's gradient of its past state, passed to the first call as the
    upstream gradient of its final state, gives both calls' gradients (and the first call's
    past-state gradient) within REC-7.7 of one run's over all T tokens: a past-state
    gradient dropped, or one that ignores the final state's upstream gradient, shows."""
    call, state, (grad_out, grad_state) = _draw_with_upstream(data, kernel, least=2)
    # no empty call: its forward differentiates nothing
    split = _draw_cut(data, call.length, "split at", ends=False)
    how = f"; split at token {split}"
    first, second = call.tokens(0, split), call.tokens(split, call.length)
    _, middle = _invoke(kernel, call, first, state, f"{how}; tokens 0..{split - 1}")
    late = _gradients(
        kernel, call, second, middle, (grad_out[:, :, split:], grad_state), f"{how}; second call"
    )
    early = _gradients(
        kernel,
        call,
        first,
        state,
        (grad_out[:, :, :split], late["initial_state"]),
        f"{how}; first call, upstream of its final state from the second call",
    )
    joined = {
        name: np.concatenate([early[name], late[name]], axis=2)
        for name in early
        if name != "initial_state"
    }
    joined["initial_state"] = early["initial_state"]
    _judge_gradients(
        joined,
        _gradient_bound(kernel, call, state, (grad_out, grad_state)),
        "REC-7.4",
        call.describe(how),
    )


@register("recurrent-gradients-varlen", "REC-7.4", applies=_takes_cu_seqlens_backward)
def recurrent_gradients_varlen(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """REC-7.4, REC-3.3: N sequences packed into one batch element with ``cu_seqlens``
    (empty ones among them), each with its own past state and its own final state's
    upstream gradient: each sequence's dq, dk, dv, dg, dbeta rows and its past state's
    gradient are within REC-7.7 of the float64 vector-Jacobian product of its own run (an
    empty sequence's past-state gradient is its final state's upstream gradient): an
    adjoint carried across a boundary, or a past-state gradient written to another
    sequence's slot, shows."""
    call = _draw_call(data, kernel, batch=1, past_state=True)
    offsets, shape, rng = _packing(data, call)
    spans = list(itertools.pairwise(offsets))
    states = _as_received(kernel, rng.standard_normal(shape), call.state_dtype)
    grad_out, _ = _gradient_upstream(kernel, call, rng)
    grad_states = _as_received(kernel, rng.standard_normal(shape), call.state_dtype)
    how = f"; packed, cu_seqlens {offsets}"
    cu_seqlens = kernel.backend.asarray(np.asarray(offsets, dtype=np.int32))
    got = _gradients(
        kernel,
        call,
        call.tokens(0, call.length),
        states,
        (grad_out, grad_states),
        how,
        cu_seqlens=cu_seqlens,
    )
    parts = [
        _gradient_bound(
            kernel,
            call,
            states[b : b + 1],
            (grad_out[:, :, start:stop], grad_states[b : b + 1]),
            call.tokens(start, stop),
        )
        for b, (start, stop) in enumerate(spans)
    ]
    gradients: list[np.ndarray | None] = []
    tolerances: list[np.ndarray | None] = []
    for n, name in enumerate(GRADIENT_INPUTS):  # each sequence's, joined as they are packed
        found = [(part.gradients[n], part.tolerances[n]) for part in parts]
        if found[0][0] is None:
            gradients.append(None)
            tolerances.append(None)
            continue
        axis = 0 if name == "initial_state" else 2
        gradients.append(np.concatenate([np.asarray(a) for a, _ in found], axis=axis))
        tolerances.append(np.concatenate([np.asarray(t) for _, t in found], axis=axis))
    bound = RecurrentGradientBound(RecurrentGradients(*gradients), RecurrentGradients(*tolerances))
    _judge_gradients(got, bound, "REC-7.4, REC-3.3", call.describe(how))
