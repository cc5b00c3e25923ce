"""The inputs of a gated / delta-rule recurrence, checked and brought into one form.

Every function of :mod:`attnspec.reference.recurrent` takes the layout of
spec/recurrent.md (REC-1.1): heads first, ``q (..., Hq, T, dk)``, ``k (..., Hk, T, dk)``,
``v (..., Hv, T, dv)``, a gate ``g (..., Hs, T)`` per head or ``(..., Hs, T, dk)`` per key
channel, ``beta (..., Hs, T)`` and a state ``(..., Hs, dk, dv)``, where
``Hs = max(Hk, Hv)`` states are written and ``Ho = max(Hq, Hs)`` output heads read them
(REC-3.1).  :func:`prepare` checks all of that, with errors that name the argument, and
returns the arrays in the computation dtype (REC-4.1) with the key and value heads
repeated to the ``Hs`` states, so that the evaluations never think about head sharing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

import array_api_compat

from .._array import Array
from .._checks import check_choice, check_flag, check_size, namespace_of
from .._keywords import shows_keywords

if TYPE_CHECKING:
    from typing import Unpack

UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")
GATED_RULES = ("gated", "gated_delta")
DELTA_RULES = ("delta", "gated_delta")


class RecurrentInputs(TypedDict, total=False):
    """The keywords that every function of the package takes beside its arrays, the spec's:
    the update rule (REC-1.2), the gate ``g`` (REC-1.3), the correction strength ``beta``
    (REC-1.4), ``scale`` (REC-2.3), ``initial_state`` (REC-2.2) and the normalisation of q
    and k (REC-2.4).  The public functions take them as ``**inputs``, shown by
    :data:`shows_inputs`, and pass them on to :func:`prepare` unchanged."""

    rule: str
    g: Array
    beta: Array
    scale: float | None
    initial_state: Array
    normalize_qk: bool
    norm_eps: float


class GradientInputs(RecurrentInputs, total=False):
    """:class:`RecurrentInputs` and the upstream gradient of the final state (REC-7.1),
    which the gradients and their bound take."""

    grad_final_state: Array


# The defaults other than None (the arrays' None: not given)
INPUT_DEFAULTS = RecurrentInputs(rule="gated_delta", normalize_qk=False, norm_eps=0.0)
# help() and type checkers show each keyword of RecurrentInputs with its default
shows_inputs = shows_keywords(RecurrentInputs, INPUT_DEFAULTS)
shows_gradient_inputs = shows_keywords(GradientInputs, INPUT_DEFAULTS)


def with_defaults(inputs: RecurrentInputs) -> RecurrentInputs:
    """``inputs`` with :data:`INPUT_DEFAULTS` where a keyword of it was not passed."""
    return {**INPUT_DEFAULTS, **inputs}


def split_gradient_inputs(inputs: GradientInputs) -> tuple[RecurrentInputs, Array]:
    """The forward call's keywords of ``inputs`` and its ``grad_final_state`` (None where
    not given)."""
    forward = inputs.copy()
    return forward, forward.pop("grad_final_state", None)


def optional_arrays(inputs: RecurrentInputs) -> tuple[Array, Array, Array]:
    """``g``, ``beta`` and ``initial_state`` of ``inputs``, None where not given."""
    return inputs.get("g"), inputs.get("beta"), inputs.get("initial_state")


@dataclass(frozen=True)
class Recurrence:
    """One problem in computation form (REC-4.1), heads already shared out (REC-3.1).

    ``q (..., Hs, G, T, dk)``: output head ``s * G + i`` reads state ``s`` with these
    queries; ``k (..., Hs, T, dk)``; ``v (..., Hs, T, dv)``; ``log_decay`` ``(..., Hs, T,
    1)`` per head or ``(..., Hs, T, dk)`` per key channel (zeros for the ungated rules);
    ``beta (..., Hs, T)`` (None for the rules without a correction); ``state (..., Hs, dk,
    dv)``; ``scale`` already resolved (REC-2.3).
    """

    xp: ModuleType
    rule: str
    q: Array
    k: Array
    v: Array
    log_decay: Array
    beta: Array | None
    state: Array
    scale: float
    out_dtype: Any
    per_channel: bool

    @property
    def delta(self) -> bool:
        return self.rule in DELTA_RULES

    @property
    def length(self) -> int:
        return int(self.k.shape[-2])

    def output_heads(self, out: Array) -> Array:
        """``(..., Hs, G, T, dv)`` -> ``(..., Ho, T, dv)`` in the output dtype (REC-4.2)."""
        shape = tuple(out.shape)
        merged = self.xp.reshape(out, (*shape[:-4], shape[-4] * shape[-3], *shape[-2:]))
        return self.xp.astype(merged, self.out_dtype)


def _real(name: str, value: Any, clause: str, call: str) -> float | None:
    """None, or a finite real number (0-d arrays and NumPy scalars included)."""
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{name}={value!r}, but should be None or a real number [{clause}, {call}]")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name}={value!r}, but should be None or a real number [{clause}, {call}]"
        ) from None
    if not math.isfinite(number):
        raise ValueError(f"{name}={value!r}, but should be finite [{clause}, {call}]")
    return number


def _require(condition: bool, message: str, clause: str, call: str) -> None:
    if not condition:
        raise ValueError(f"{message} [{clause}, {call}]")


def _shape(a: Array) -> tuple[int, ...]:
    return tuple(int(n) for n in a.shape)


def _share(xp: ModuleType, a: Array, heads: int, axis: int) -> Array:
    """Repeat each of ``a``'s heads so that ``heads`` heads result: head ``h`` of the
    result is head ``h // (heads / a.shape[axis])`` of ``a`` (REC-3.1)."""
    have = int(a.shape[axis])
    if have == heads:
        return a
    index = xp.arange(heads, device=array_api_compat.device(a)) // (heads // have)
    return xp.take(a, index, axis=axis)


def l2_normalized(x: Array, eps: float) -> Array:
    """``x / sqrt(|x|^2 + eps)`` over the last axis (REC-2.4); a zero row with ``eps = 0``
    stays zero."""
    xp = namespace_of("l2_normalized(x)", x=x)
    norm_squared = xp.sum(x * x, axis=-1, keepdims=True) + eps
    zero = norm_squared == 0
    safe = xp.where(zero, xp.ones_like(norm_squared), norm_squared)
    return xp.where(zero, xp.zeros_like(x), x / xp.sqrt(safe))


def prepare(
    q: Array, k: Array, v: Array, call: str, /, **inputs: Unpack[RecurrentInputs]
) -> Recurrence:
    """Check the arguments against REC-1 … REC-4 and return the problem in computation
    form; every error names the argument, what it was and what it should be.  A keyword
    not passed takes its value from :data:`INPUT_DEFAULTS`; keywords of a larger set (a
    bound's rounding keywords) are left to the caller."""
    given = with_defaults(inputs)
    rule, normalize_qk, norm_eps = given["rule"], given["normalize_qk"], given["norm_eps"]
    (g, beta, initial_state), scale = optional_arrays(inputs), inputs.get("scale")
    xp = namespace_of(call, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    rule = check_choice("rule", rule, UPDATE_RULES, call, "REC-1.2")
    normalize_qk = check_flag("normalize_qk", normalize_qk, f"REC-2.4, {call}")
    eps = _real("norm_eps", norm_eps, "REC-2.4", call)
    _require(
        eps is not None and eps >= 0, f"norm_eps={norm_eps!r}, but should be >= 0", "REC-2.4", call
    )
    alpha = _real("scale", scale, "REC-2.3", call)
    for name, a in (
        ("q", q),
        ("k", k),
        ("v", v),
        ("g", g),
        ("beta", beta),
        ("initial_state", initial_state),
    ):
        if a is not None and not xp.isdtype(a.dtype, "real floating"):
            raise TypeError(
                f"{name}.dtype={a.dtype}, but should be a real floating dtype "
                f"(float16, bfloat16, float32, float64) [REC-4.1, {call}]"
            )
    layout = "(..., heads, T, head_dim)"
    for name, a in (("q", q), ("k", k), ("v", v)):
        _require(a.ndim >= 3, f"{name}.shape={_shape(a)}, but should be {layout}", "REC-1.1", call)
    batch = _shape(q)[:-3]
    for name, a in (("k", k), ("v", v)):
        _require(
            _shape(a)[:-3] == batch,
            f"{name}.shape={_shape(a)}, but its batch dims should be q's, {batch}",
            "REC-1.1",
            call,
        )
    (h_q, length, d_k), (h_k, _, d_k2), (h_v, _, d_v) = (_shape(a)[-3:] for a in (q, k, v))
    _require(
        d_k2 == d_k, f"k.shape={_shape(k)}, but its head dim should be q's, {d_k}", "REC-1.1", call
    )
    for name, a in (("k", k), ("v", v)):
        _require(
            _shape(a)[-2] == length,
            f"{name}.shape={_shape(a)}, but should have q's length T={length}",
            "REC-1.1",
            call,
        )
    states = max(h_k, h_v)
    outputs = max(h_q, states)
    for name, heads, total in (("k", h_k, states), ("v", h_v, states), ("q", h_q, outputs)):
        _require(
            heads >= 1 and total % heads == 0,
            f"{name} has {heads} heads, but that should divide {total} "
            f"(Hs = max(Hk, Hv) = {states}, Ho = max(Hq, Hs) = {outputs})",
            "REC-3.1",
            call,
        )
    _require(outputs % states == 0, f"Hs={states} should divide Ho={outputs}", "REC-3.1", call)
    gated, delta = rule in GATED_RULES, rule in DELTA_RULES
    for name, a, wanted in (("g", g, gated), ("beta", beta, delta)):
        if wanted and a is None:
            raise ValueError(f"{name} is None, but rule={rule!r} needs it [REC-1.2, {call}]")
        if not wanted and a is not None:
            raise ValueError(
                f"{name} was given, but rule={rule!r} does not use it; pass None or choose "
                f"a rule with {'a gate' if name == 'g' else 'a correction'} [REC-1.2, {call}]"
            )
    per_head = (*batch, states, length)
    if g is not None:
        _require(
            _shape(g) in (per_head, (*per_head, d_k)),
            f"g.shape={_shape(g)}, but should be {per_head} (per head) or "
            f"{(*per_head, d_k)} (per key channel)",
            "REC-1.3",
            call,
        )
    if beta is not None:
        _require(
            _shape(beta) == per_head,
            f"beta.shape={_shape(beta)}, but should be {per_head}",
            "REC-1.4",
            call,
        )
    state_shape = (*batch, states, d_k, d_v)
    if initial_state is not None:
        _require(
            _shape(initial_state) == state_shape,
            f"initial_state.shape={_shape(initial_state)}, but should be {state_shape} "
            f"(..., Hs, dk, dv)",
            "REC-2.2",
            call,
        )
    present = [a for a in (q, k, v, g, beta, initial_state) if a is not None]
    dtype = xp.float64 if any(a.dtype == xp.float64 for a in present) else xp.float32
    out_dtype = q.dtype
    q, k, v = (xp.astype(a, dtype) for a in (q, k, v))
    if normalize_qk:
        q, k = l2_normalized(q, eps or 0.0), l2_normalized(k, eps or 0.0)
    k, v = _share(xp, k, states, -3), _share(xp, v, states, -3)
    q = _share(xp, q, outputs, -3)
    q = xp.reshape(q, (*batch, states, outputs // states, length, d_k))
    if g is None:
        log_decay = xp.zeros((*per_head, 1), dtype=dtype, device=array_api_compat.device(q))
    else:
        log_decay = xp.astype(g, dtype)
        log_decay = log_decay if log_decay.ndim == len(per_head) + 1 else log_decay[..., None]
    state = (
        xp.zeros(state_shape, dtype=dtype, device=array_api_compat.device(q))
        if initial_state is None
        else xp.astype(initial_state, dtype)
    )
    return Recurrence(
        xp=xp,
        rule=rule,
        q=q,
        k=k,
        v=v,
        log_decay=log_decay,
        beta=None if beta is None else xp.astype(beta, dtype),
        state=state,
        scale=1.0 / math.sqrt(d_k) if alpha is None else alpha,
        out_dtype=out_dtype,
        per_channel=g is not None and g.ndim == len(per_head) + 1,
    )


def prepare_for_gradients(
    q: Array, k: Array, v: Array, call: str, /, **inputs: Unpack[RecurrentInputs]
) -> tuple[Recurrence, tuple[Array, Array] | None, float]:
    """:func:`prepare` for the gradients and their bound: q and k normalised (REC-2.4)
    after they are shared out (REC-3.1), and those shared q and k from before the
    normalisation, whose gradients go through its Jacobian (REC-7.5): None without
    ``normalize_qk``; with ``norm_eps`` as a float."""
    given = with_defaults(inputs)
    normalize = check_flag("normalize_qk", given["normalize_qk"], f"REC-2.4, {call}")
    unnormalized: RecurrentInputs = {**given, "normalize_qk": False}
    p = prepare(q, k, v, call, **unnormalized)
    eps = float(given["norm_eps"])
    if not normalize:
        return p, None, eps
    normalized = dataclasses.replace(p, q=l2_normalized(p.q, eps), k=l2_normalized(p.k, eps))
    return normalized, (p.q, p.k), eps


def check_chunk_size(chunk_size: Any, call: str) -> int:
    """A chunk size of at least one token (REC-5.1: it changes nothing but the rounding)."""
    return check_size("chunk_size", chunk_size, f"REC-5.1, {call}", minimum=1)
