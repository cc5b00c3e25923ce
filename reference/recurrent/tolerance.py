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


def _cumulative_gates(xp: Any, gate_sizes: Array, t: int, chunk: int) -> Array:
    """gamma_t of REC-6.2: the sum of |g| over the C_h tokens ending at t, which bounds the
    chunk-local cumulative sum of log decays a chunked kernel rounds at t; 0 for a
    token-by-token kernel, which exponentiates each gate alone."""
    if chunk == 1:
        return xp.zeros_like(gate_sizes[..., t])
    return xp.sum(gate_sizes[..., max(0, t - chunk + 1) : t + 1], axis=-1)


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


class StateError(NamedTuple):
    """Token ``t``'s step of REC-1.2 and of the state error of REC-6.2: ``kappa_t``,
    ``rho_t`` ``(..., Hs)``, ``gamma_t``, and ``eps_tc`` ``(..., Hs, dv)``."""

    token: Token
    kappa: Array
    rho: Array
    gamma: Array
    error: Array


def state_error_step(
    p: Recurrence, r: Rounding, gate_sizes: Array, state: Array, error: Array, t: int
) -> StateError:
    """REC-6.2's ``eps_tc = rho_t eps_{t-1,c} + phi_tc`` for token ``t`` from ``S_{t-1}``
    and ``eps_{t-1}`` (``gate_sizes`` the largest ``|g|`` of each token, ``(..., Hs, T)``)."""
    xp = p.xp
    token = token_step(p, state, t)
    key = p.k[..., t, :]
    key_squared = xp.sum(key * key, axis=-1)  # (..., Hs)
    key_norm = xp.sqrt(key_squared)[..., None]
    decayed_norms = column_norms(xp, token.decayed)
    if p.beta is not None:
        strength = p.beta[..., t]
        kappa = xp.maximum(xp.abs(1 - strength * key_squared), xp.ones_like(key_squared))
        read_sum = xp.matmul(xp.abs(key)[..., None, :], xp.abs(token.decayed))[..., 0, :]
        read_error = r.read * (xp.abs(strength)[..., None] * key_norm) * read_sum
        correction = 2 * xp.abs(strength)[..., None] * key_norm * decayed_norms
    else:
        kappa = xp.ones_like(key_squared)
        read_error = correction = xp.zeros_like(decayed_norms)
    rho = kappa * xp.max(token.decay, axis=-1)
    gamma = _cumulative_gates(xp, gate_sizes, t, r.chunk)
    local = (
        r.u_a * ((5 + gamma) * kappa + 1)[..., None] * decayed_norms
        + read_error
        + r.write * key_norm * xp.abs(token.update)
        + r.eta * key_norm * (xp.abs(token.update) + correction)
        + r.flush
    )
    return StateError(token, kappa, rho, gamma, rho[..., None] * error + local)


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
    state = p.state
    error = xp.zeros_like(state[..., 0, :])  # eps_{t,c}, (..., Hs, dv)
    run = best = -math.inf  # log of the largest product of rho over a run (Kadane)
    outs, tolerances = [], []
    for t in range(p.length):
        step = state_error_step(p, r, gate_sizes, state, error, t)
        state, error, rho = step.token.state, step.error, step.rho
        log_rho = float(xp.max(xp.log(xp.maximum(rho, xp.full_like(rho, 2.0**-1000)))))
        run = max(log_rho, run + log_rho)
        best = max(best, run)
        queries = p.q[..., t, :]  # (..., Hs, G, dk)
        out = p.scale * xp.matmul(queries[..., :, None, :], state[..., None, :, :])[..., 0, :]
        magnitude = xp.matmul(xp.abs(queries)[..., :, None, :], xp.abs(state)[..., None, :, :])[
            ..., 0, :
        ]
        query_norm = xp.sqrt(xp.sum(queries * queries, axis=-1))[..., None]
        accumulated = SAFETY_FACTOR * (
            alpha
            * query_norm
            * (error[..., None, :] + r.eta * column_norms(xp, state)[..., None, :])
            + r.output * alpha * magnitude
        )
        # The rounding to q's dtype is exact analysis: |fl(x) - o| <= (1 + u_d)|x - o| + u_d|o|.
        tolerance = (
            (1 + r.u_d) * accumulated
            + r.u_d * xp.abs(out)
            + (d_k + chunk + 2) * UNDERFLOW_THRESHOLD[dtype]
        )
        outs.append(out[..., None, :])
        tolerances.append(
            xp.where(xp.isfinite(out), tolerance, xp.zeros_like(tolerance))[..., None, :]
        )
    u_s = UNIT_ROUNDOFF[state_dtype]
    state_tolerance = (
        (1 + u_s) * SAFETY_FACTOR * error[..., None, :]
        + u_s * xp.abs(state)
        + UNDERFLOW_THRESHOLD[state_dtype]
    )
    state_tolerance = xp.where(xp.isfinite(state), state_tolerance, xp.zeros_like(state))
    if outs:
        out_all, tol_all = xp.concat(outs, axis=-2), xp.concat(tolerances, axis=-2)
    else:
        empty = (*p.q.shape[:-2], 0, p.v.shape[-1])
        out_all = tol_all = xp.zeros(empty, dtype=xp.float64, device=array_api_compat.device(state))
    return RecurrentBound(
        out=p.output_heads(out_all),
        out_tolerance=p.output_heads(tol_all),
        final_state=state,
        final_state_tolerance=state_tolerance,
        growth=max(1.0, math.exp(min(best, 700.0))) if best > -math.inf else 1.0,
    )
