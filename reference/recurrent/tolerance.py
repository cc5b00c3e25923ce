"""The accuracy clause of spec/recurrent.md as code: the bound of REC-6.2, evaluated.

One pass over the tokens in float64 evaluates the definition (REC-1.2) and, beside it, the
per-column state error ``eps_tc`` that rounding can have built up by token ``t`` (it is
multiplied by the step's contraction factor ``rho_t`` and grows by the step's own rounding
``phi_tc``), then the output and final-state tolerances.  The derivation is in the spec; this
module only evaluates it, at the cost of the token recurrence.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import array_api_compat

from .._array import Array
from .._checks import check_flag, check_size
from .._keywords import shows_keywords
from ..tolerance import UNDERFLOW_THRESHOLD, UNIT_ROUNDOFF, accumulation_roundoff, scale_is_exact
from ._inputs import INPUT_DEFAULTS, Recurrence, RecurrentInputs, prepare, with_defaults
from .definition import Token, token_step

if TYPE_CHECKING:
    from typing import Unpack

CALL = "recurrent_error_bound(q, k, v)"
SAFETY_FACTOR = 4.0  # C of REC-6.2, as TOL-2's: second-order terms, the target's own rounding
# The smallest normal number of the accumulation format: what a flush to zero loses (REC-6.2).
SMALLEST_NORMAL = {"float32": 2.0**-126, "float64": 2.0**-1022}


class RecurrentBound(NamedTuple):
    """The float64 target of REC-6.1 and the tolerances of REC-6.2, elementwise.

    ``growth`` is the largest product of the contraction factors ``rho_t`` over any run of
    consecutive tokens of any state head, at least 1 (REC-6.3): above 1 the bound grows with
    the state, because the per-step map does not contract.
    """

    out: Any
    out_tolerance: Any
    final_state: Any
    final_state_tolerance: Any
    growth: float


def _dtype_name(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(
            f"{name}={value!r}, but should be one of {', '.join(map(repr, allowed))} "
            f"[REC-6.2, {CALL}]"
        )
    return str(value)


class KernelRounding(TypedDict, total=False):
    """What a kernel declares about its rounding, beside its ``dtype``: ``chunk_size``, its
    largest chunk ``C_h`` (1: token by token); ``state_dtype``, the dtype of its state
    (REC-4.3; default float32, or float64 for float64 inputs); ``operands_in_input_dtype``,
    that it rounds the operands of its matrix products to ``dtype`` (``u_p = u_d``)."""

    chunk_size: int
    state_dtype: str | None
    operands_in_input_dtype: bool


class BoundInputs(RecurrentInputs, KernelRounding, total=False):
    """The keywords of :func:`recurrent_error_bound` beside ``dtype``."""


ROUNDING_DEFAULTS = KernelRounding(chunk_size=1, operands_in_input_dtype=False)
BOUND_DEFAULTS = {**INPUT_DEFAULTS, **ROUNDING_DEFAULTS}


def declared_rounding(
    dtype: Any, declared: KernelRounding, call: str
) -> tuple[str, str, int, bool]:
    """``dtype``, the state dtype, the largest chunk and whether the operands are rounded
    to ``dtype``, checked, each at its default where not declared."""
    given: KernelRounding = {**ROUNDING_DEFAULTS, **declared}
    dtype = _dtype_name("dtype", dtype, tuple(UNIT_ROUNDOFF))
    state_dtype = given.get("state_dtype")
    state_dtype = _dtype_name(
        "state_dtype",
        ("float64" if dtype == "float64" else "float32") if state_dtype is None else state_dtype,
        tuple(UNIT_ROUNDOFF),
    )
    chunk = check_size("chunk_size", given["chunk_size"], call, minimum=1)
    operands = check_flag("operands_in_input_dtype", given["operands_in_input_dtype"], call)
    return dtype, state_dtype, chunk, operands


def _cumulative_gates(xp: Any, gate_sizes: Array, chunk: int) -> Array:
    """gamma_t of REC-6.2 for every token, ``(..., Hs, T)``: the sum of |g| over the C_h
    tokens ending at t, which bounds the chunk-local cumulative sum of log decays a chunked
    kernel rounds at t; 0 for a token-by-token kernel, which exponentiates each gate alone.
    Each token's window is summed alone, in its own order (a running sum would round
    differently)."""
    length = int(gate_sizes.shape[-1])
    if chunk == 1 or length == 0:
        return xp.zeros_like(gate_sizes)
    windows = [xp.sum(gate_sizes[..., : t + 1], axis=-1) for t in range(min(chunk - 1, length))]
    if length >= chunk:  # the full windows side by side, (..., Hs, T - C_h + 1, C_h)
        shifted = [gate_sizes[..., j : length - chunk + 1 + j] for j in range(chunk)]
        full = xp.sum(xp.stack(shifted, axis=-1), axis=-1)
        return xp.concat([*(w[..., None] for w in windows), full], axis=-1)
    return xp.stack(windows, axis=-1)


class Rounding(NamedTuple):
    """The constants of REC-6.2 for one kernel: ``u_d``, ``u_a``, ``u_p``, ``eta``,
    ``r_alpha``, the chunk ``C_h``, the flush term and the coefficients of the read, the
    write and the output."""

    u_d: float
    u_a: float
    u_p: float
    eta: float
    r_alpha: float
    chunk: int
    flush: float
    read: float
    write: float
    output: float


def rounding(
    dtype: str, chunk: int, d_k: int, scale: float, *, rounded_operands: bool, normalize_qk: bool
) -> Rounding:
    """REC-6.2's constants for a kernel computing in ``dtype`` (q's) with chunks of at most
    ``chunk`` tokens, ``d_k`` key channels and the resolved ``scale``."""
    accumulation = "float64" if dtype == "float64" else "float32"
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    u_p = u_d if rounded_operands else 0.0
    return Rounding(
        u_d=u_d,
        u_a=u_a,
        u_p=u_p,
        eta=u_d + (d_k + 6) * u_a if normalize_qk else 0.0,
        r_alpha=0.0 if scale_is_exact(scale) else 2 * u_a,
        chunk=chunk,
        flush=(d_k + chunk + 6) * SMALLEST_NORMAL[accumulation],
        read=u_p + (d_k + chunk + 2) * u_a,
        write=u_p + (chunk + 4) * u_a,
        output=(0.0 if scale_is_exact(scale) else 2 * u_a) + u_p + (d_k + chunk + 2) * u_a,
    )


def column_norms(xp: Any, state: Array) -> Array:
    """``|S_{:c}|``, the Euclidean norm of each value column, ``(..., Hs, dv)``."""
    return xp.sqrt(xp.sum(state * state, axis=-2))


class TokenTerms(NamedTuple):
    """The factors of REC-6.2's step that depend on the tokens' inputs only, not on the
    state, for every token at once, ``(..., Hs, T)`` (``decay`` ``(..., Hs, T, 1 or dk)``,
    ``key_abs`` ``(..., Hs, T, dk)``): ``kappa_t``, ``rho_t``, ``gamma_t``, and the
    coefficients of the decayed state's norms, of the read, of the correction's norms, of
    the write and of eta.  Evaluated before the token loop, each exactly as the loop would
    evaluate it at token ``t`` (the same operations on the same values, elementwise or
    along the same axis), so the bound is bit for bit the token loop's."""

    decay: Array
    key_abs: Array
    kappa: Array
    rho: Array
    gamma: Array
    decayed: Array
    read: Array | None
    correction: Array | None
    write: Array
    eta: Array


def token_terms(p: Recurrence, r: Rounding, gate_sizes: Array) -> TokenTerms:
    """REC-6.2's state-independent factors of every token (``gate_sizes`` the largest
    ``|g|`` of each token, ``(..., Hs, T)``)."""
    xp = p.xp
    decay = xp.exp(p.log_decay)
    key_squared = xp.sum(p.k * p.k, axis=-1)  # (..., Hs, T)
    key_norm = xp.sqrt(key_squared)
    read = correction = None
    if p.beta is not None:
        strength = xp.abs(p.beta)
        kappa = xp.maximum(xp.abs(1 - p.beta * key_squared), xp.ones_like(key_squared))
        read = r.read * (strength * key_norm)
        correction = 2 * strength * key_norm
    else:
        kappa = xp.ones_like(key_squared)
    gamma = _cumulative_gates(xp, gate_sizes, r.chunk)
    return TokenTerms(
        decay=decay,
        key_abs=xp.abs(p.k),
        kappa=kappa,
        rho=kappa * xp.max(decay, axis=-1),
        gamma=gamma,
        decayed=r.u_a * ((5 + gamma) * kappa + 1),
        read=read,
        correction=correction,
        write=r.write * key_norm,
        eta=r.eta * key_norm,
    )


class StateError(NamedTuple):
    """Token ``t``'s step of REC-1.2 and of the state error of REC-6.2: ``kappa_t``,
    ``rho_t`` ``(..., Hs)``, ``gamma_t``, and ``eps_tc`` ``(..., Hs, dv)``."""

    token: Token
    kappa: Array
    rho: Array
    gamma: Array
    error: Array


def state_error_step(
    p: Recurrence, r: Rounding, terms: TokenTerms, state: Array, error: Array, t: int
) -> StateError:
    """REC-6.2's ``eps_tc = rho_t eps_{t-1,c} + phi_tc`` for token ``t`` from ``S_{t-1}``
    and ``eps_{t-1}`` (``terms`` :func:`token_terms`)."""
    xp = p.xp
    token = token_step(p, state, t, terms.decay[..., t, :])
    decayed_norms = column_norms(xp, token.decayed)
    update_abs = xp.abs(token.update)
    rho = terms.rho[..., t]
    # (the rules without a correction add no read error and no correction: every term is
    # >= 0, so leaving out their zeros changes no bit)
    local = terms.decayed[..., t, None] * decayed_norms
    if terms.read is not None and terms.correction is not None:
        read_sum = xp.matmul(terms.key_abs[..., t, None, :], xp.abs(token.decayed))[..., 0, :]
        local = local + terms.read[..., t, None] * read_sum
        local = local + terms.write[..., t, None] * update_abs
        correction = terms.correction[..., t, None] * decayed_norms
        local = local + terms.eta[..., t, None] * (update_abs + correction)
    else:
        local = local + terms.write[..., t, None] * update_abs
        local = local + terms.eta[..., t, None] * update_abs
    error = rho[..., None] * error + (local + r.flush)
    return StateError(token, terms.kappa[..., t], rho, terms.gamma[..., t], error)


# A state whose every |S_kc| is at most FINITE_SQUARES, with fewer than FEW_KEY_CHANNELS rows,
# has a finite sum of squares in every column, in any order (d_k 2^1000 (1 + u)^d_k < 2^1024).
FINITE_SQUARES, FEW_KEY_CHANNELS = 2.0**500, 2**20


def _read_error(xp: Any, eta: float, error: Array, state: Array, state_abs: Array) -> Array:
    """``eps_tc + eta |S_{:c}|``, the state error a read of ``S_t`` starts from (REC-6.2's
    output term), given ``|S_t|``.  Without normalisation (``eta`` 0) the term is
    ``0 * |S_{:c}|``: exactly +0 where every column's norm is finite, which every
    ``|S_kc| <= 2^500`` ensures (FINITE_SQUARES), and ``eps_tc`` (never -0: at least the
    flush term after a step, or NaN) is then returned as adding +0 leaves it, without the
    norms (two passes over the state per token, ~10 % of the bound's time); a state past
    that, or with an infinity or NaN, takes the sum as written, whose inf or NaN the
    tolerance keeps."""
    if eta == 0 and state.shape[-2] < FEW_KEY_CHANNELS:
        if 0 in state.shape or float(xp.max(state_abs)) <= FINITE_SQUARES:
            return error
    return error + eta * column_norms(xp, state)


@shows_keywords(BoundInputs, BOUND_DEFAULTS)
def recurrent_error_bound(
    q: Array, k: Array, v: Array, *, dtype: str, **inputs: Unpack[BoundInputs]
) -> RecurrentBound:
    """REC-6.2 for float64 inputs holding the values the kernel received in ``dtype`` (q's).

    ``chunk_size`` is the kernel's declared largest chunk ``C_h`` (1: token by token);
    ``state_dtype`` the dtype of its returned final state (REC-4.3; default float32, or
    float64 for float64 inputs); ``operands_in_input_dtype`` declares that it rounds the
    operands of its matrix products to ``dtype`` (``u_p = u_d``); ``normalize_qk`` that it
    normalises q and k itself (REC-2.4, ``eta``).  Arguments otherwise as
    :func:`attnspec.reference.recurrent.recurrent_attention`.
    """
    dtype, state_dtype, chunk, rounded_operands = declared_rounding(dtype, inputs, CALL)
    problem: RecurrentInputs = inputs  # prepare leaves the rounding keywords
    p = prepare(q, k, v, CALL, **problem)
    xp = p.xp
    if p.q.dtype != xp.float64:
        raise TypeError(f"q.dtype={q.dtype}, but should be float64 [REC-6.1, {CALL}]")
    d_k = int(p.k.shape[-1])
    r = rounding(
        dtype,
        chunk,
        d_k,
        p.scale,
        rounded_operands=rounded_operands,
        normalize_qk=with_defaults(inputs)["normalize_qk"],
    )
    alpha = abs(p.scale)
    # |g_t| per token, the largest over key channels, (..., Hs, T): the rounding of a chunked
    # kernel's cumulative log decays (gamma_t of REC-6.2)
    gate_sizes = xp.max(xp.abs(p.log_decay), axis=-1)
    terms = token_terms(p, r, gate_sizes)
    # the largest log rho_t of each token, over every state head, (T,)
    run = best = -math.inf  # log of the largest product of rho over a run (Kadane)
    if p.length:
        floor = xp.full_like(terms.rho, 2.0**-1000)
        heads = tuple(range(terms.rho.ndim - 1))
        log_rho = xp.max(xp.log(xp.maximum(terms.rho, floor)), axis=heads)  # (T,)
        for t in range(p.length):
            run = max(float(log_rho[t]), run + float(log_rho[t]))
            best = max(best, run)
    state = p.state
    error = xp.zeros_like(state[..., 0, :])  # eps_{t,c}, (..., Hs, dv)
    queries_abs = xp.abs(p.q)  # (..., Hs, G, T, dk)
    # alpha |q_t|, (..., Hs, G, T, 1)
    query_norms = alpha * xp.sqrt(xp.sum(p.q * p.q, axis=-1))[..., None]
    outs, magnitudes, errors = [], [], []  # each token's, (..., Hs, G or 1, 1, dv)
    for t in range(p.length):
        step = state_error_step(p, r, terms, state, error, t)
        state, error = step.token.state, step.error
        queries = p.q[..., t, :]  # (..., Hs, G, dk)
        outs.append(xp.matmul(queries[..., :, None, :], state[..., None, :, :]))
        state_abs = xp.abs(state)
        magnitudes.append(xp.matmul(queries_abs[..., t, None, :], state_abs[..., None, :, :]))
        errors.append(_read_error(xp, r.eta, error, state, state_abs)[..., None, None, :])
    if outs:
        # every token's output and tolerance at once: elementwise, as token by token
        out_all = p.scale * xp.concat(outs, axis=-2)
        accumulated = SAFETY_FACTOR * (
            query_norms * xp.concat(errors, axis=-2)
            + r.output * alpha * xp.concat(magnitudes, axis=-2)
        )
        # The rounding to q's dtype is exact analysis: |fl(x) - o| <= (1 + u_d)|x - o| + u_d|o|.
        tolerance = (
            (1 + r.u_d) * accumulated
            + r.u_d * xp.abs(out_all)
            + (d_k + chunk + 2) * UNDERFLOW_THRESHOLD[dtype]
        )
        tol_all = xp.where(xp.isfinite(out_all), tolerance, xp.zeros_like(tolerance))
    else:
        empty = (*p.q.shape[:-2], 0, p.v.shape[-1])
        out_all = tol_all = xp.zeros(empty, dtype=xp.float64, device=array_api_compat.device(state))
    u_s = UNIT_ROUNDOFF[state_dtype]
    state_tolerance = (
        (1 + u_s) * SAFETY_FACTOR * error[..., None, :]
        + u_s * xp.abs(state)
        + UNDERFLOW_THRESHOLD[state_dtype]
    )
    state_tolerance = xp.where(xp.isfinite(state), state_tolerance, xp.zeros_like(state))
    return RecurrentBound(
        out=p.output_heads(out_all),
        out_tolerance=p.output_heads(tol_all),
        final_state=state,
        final_state_tolerance=state_tolerance,
        growth=max(1.0, math.exp(min(best, 700.0))) if best > -math.inf else 1.0,
    )
