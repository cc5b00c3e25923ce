"""The gradients' accuracy clause of spec/recurrent.md as code: the bound of REC-7.7.

A forward pass in float64 keeps REC-6.2's state error ``eps_tc`` of every token (and the
state at the start of every ``CHECKPOINT`` tokens); the backward pass then runs the adjoint
recurrence of REC-7.1 (:func:`~.backward.adjoint_step`, recomputing each stretch's states
from its checkpoint) and beside it the adjoint's own error ``psi_tc``, which contracts by
the same ``rho_t`` as the state's, backwards in time; each gradient's tolerance charges the
errors of the quantities it is formed from and its own roundings.  The derivation is in the
spec; this module only evaluates it, at about twice the cost of the recurrence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .._array import Array
from .._keywords import shows_keywords
from ..tolerance import UNDERFLOW_THRESHOLD, UNIT_ROUNDOFF
from ._inputs import (
    GradientInputs,
    optional_arrays,
    prepare_for_gradients,
    split_gradient_inputs,
)
from .backward import RecurrentGradients, _unshare, adjoint_step
from .tolerance import (
    BOUND_DEFAULTS,
    SAFETY_FACTOR,
    KernelRounding,
    Rounding,
    column_norms,
    declared_rounding,
    rounding,
    state_error_step,
    token_terms,
)

if TYPE_CHECKING:
    from typing import Unpack

CALL = "recurrent_gradient_error_bound(q, k, v, grad_out)"
CHECKPOINT = 64  # tokens between the states the bound keeps (memory, not accuracy)


class RecurrentGradientBound(NamedTuple):
    """The float64 gradients of REC-7.6's target and their tolerances of REC-7.7, each a
    :class:`~.backward.RecurrentGradients` of the inputs' shapes (None where the input
    was not given)."""

    gradients: RecurrentGradients
    tolerances: RecurrentGradients


def _matvec(xp: Any, a: Array, b: Array) -> Array:
    """``a (..., m, n) @ b (..., n)`` -> ``(..., m)``."""
    return xp.matmul(a, b[..., :, None])[..., 0]


def _vecmat(xp: Any, a: Array, b: Array) -> Array:
    """``a (..., m) @ b (..., m, n)`` -> ``(..., n)``."""
    return xp.matmul(a[..., None, :], b)[..., 0, :]


class GradientBoundInputs(GradientInputs, KernelRounding, total=False):
    """The keywords of :func:`recurrent_gradient_error_bound` beside ``dtype``."""


@shows_keywords(GradientBoundInputs, BOUND_DEFAULTS)
def recurrent_gradient_error_bound(
    q: Array,
    k: Array,
    v: Array,
    grad_out: Array,
    *,
    dtype: str,
    **inputs: Unpack[GradientBoundInputs],
) -> RecurrentGradientBound:
    """REC-7.7 for float64 inputs and upstream gradients holding the values the kernel
    received in ``dtype`` (q's); ``state_dtype`` is the dtype of the past state and of its
    gradient (default float32, or float64 for float64 inputs); ``chunk_size`` and
    ``operands_in_input_dtype`` as for :func:`~.tolerance.recurrent_error_bound`;
    ``normalize_qk`` that the kernel normalises q and k itself with ``norm_eps`` (REC-2.4),
    so that the gradients of q and k are those of its inputs, through the normalisation
    (REC-7.5)."""
    dtype, state_dtype, chunk, rounded_operands = declared_rounding(dtype, inputs, CALL)
    as_forward, grad_final_state = split_gradient_inputs(inputs)
    p, raw, norm_eps = prepare_for_gradients(q, k, v, CALL, **as_forward)
    xp = p.xp
    if p.q.dtype != xp.float64 or grad_out.dtype != xp.float64:
        raise TypeError(
            f"q.dtype={q.dtype}, grad_out.dtype={grad_out.dtype}, but both should be "
            f"float64 [REC-7.6, {CALL}]"
        )
    batch, (states, groups, length, d_k), d_v = p.q.shape[:-4], p.q.shape[-4:], p.v.shape[-1]
    r = rounding(
        dtype, chunk, d_k, p.scale, rounded_operands=rounded_operands, normalize_qk=raw is not None
    )
    u_a, alpha = r.u_a, abs(p.scale)
    upstream = xp.reshape(grad_out, (*batch, states, groups, length, d_v))
    adjoint = xp.zeros_like(p.state) if grad_final_state is None else grad_final_state
    factors = token_terms(p, r, xp.max(xp.abs(p.log_decay), axis=-1))

    # The forward pass: eps_t of every token, the state every CHECKPOINT tokens.
    errors, saved = [xp.zeros_like(p.state[..., 0, :])], []
    state = p.state
    for t in range(length):
        if t % CHECKPOINT == 0:
            saved.append(state)
        forward = state_error_step(p, r, factors, state, errors[-1], t)
        state = forward.token.state
        errors.append(forward.error)  # errors[t + 1] is eps_t

    product = r.u_p + (d_k + chunk + 2) * u_a  # a length-dk product, as REC-6.2's read
    value_sum = r.u_p + (d_v + chunk + 2) * u_a  # a length-dv product
    query_term = r.r_alpha + r.u_p + (groups + chunk + 3) * u_a  # sum_h q_h dO_h^T into P
    psi = xp.zeros_like(errors[0])  # the adjoint's error per value column, psi_{t,c}
    grads: list[list[Array]] = [[] for _ in range(5)]
    tols: list[list[Array]] = [[] for _ in range(5)]
    dg_magnitude: list[Array] = []
    for index in range(len(saved) - 1, -1, -1):
        start, stop = index * CHECKPOINT, min((index + 1) * CHECKPOINT, length)
        prior = [saved[index]]
        for t in range(start, stop - 1):
            prior.append(state_error_step(p, r, factors, prior[-1], errors[t], t).token.state)
        for t in range(stop - 1, start - 1, -1):
            fwd = state_error_step(p, r, factors, prior[t - start], errors[t], t)
            token, eps, eps_before = fwd.token, errors[t + 1], errors[t]
            queries, dout = p.q[..., t, :], upstream[..., t, :]  # (..., Hs, G, dk|dv)
            step = adjoint_step(p, token, adjoint, dout, t)
            key = p.k[..., t, :]
            key_abs, key_norm = xp.abs(key), xp.sqrt(xp.sum(key * key, axis=-1))[..., None]
            strength = xp.zeros_like(key[..., 0]) if p.beta is None else p.beta[..., t]
            beta_abs = xp.abs(strength)[..., None]  # (..., Hs, 1)
            total_abs, decayed_abs = xp.abs(step.total), xp.abs(token.decayed)
            # P_t's error: the adjoint carried from t + 1 plus this token's output term
            output_sum = alpha * xp.sum(
                xp.abs(dout) * xp.sqrt(xp.sum(queries * queries, axis=-1))[..., None], axis=-2
            )
            # (the normalised queries' own error, eta, as the other factors')
            psi = psi + (query_term + r.eta) * output_sum + u_a * column_norms(xp, step.total)
            # S'_t's error: the decayed eps_{t-1} and the decay's own rounding
            eps_decayed = xp.max(token.decay, axis=-1)[..., None] * eps_before + (5 + fwd.gamma)[
                ..., None
            ] * u_a * column_norms(xp, token.decayed)
            adjoint_norms = column_norms(xp, step.total)
            # w_t = P_t^T k_t, with the normalised key's error eta |k_t| (0 without)
            err_read = key_norm * (psi + r.eta * adjoint_norms) + product * _vecmat(
                xp, key_abs, total_abs
            )
            if p.beta is not None and token.residual is not None:
                residual_abs = xp.abs(token.residual)
                err_residual = (
                    key_norm * (eps_decayed + r.eta * column_norms(xp, token.decayed))
                    + product * _vecmat(xp, key_abs, decayed_abs)
                    + u_a * residual_abs
                )
                err_update = beta_abs * err_residual + u_a * xp.abs(token.update)
                err_dv = beta_abs * err_read + u_a * xp.abs(step.dv)
                err_dbeta = xp.sum(
                    err_read * residual_abs
                    + xp.abs(step.read) * err_residual
                    + value_sum * xp.abs(step.read) * residual_abs,
                    axis=-1,
                )
            else:
                err_update = xp.zeros_like(psi)
                err_dv = err_read
                err_dbeta = xp.zeros_like(psi[..., 0])
            read_abs = xp.abs(step.read)
            err_dk = (
                _matvec(xp, xp.ones_like(total_abs), psi * xp.abs(token.update))
                + _matvec(xp, total_abs, err_update)
                + beta_abs
                * (
                    xp.sum(eps_decayed * read_abs, axis=-1, keepdims=True)
                    + _matvec(xp, decayed_abs, err_read)
                )
                + (value_sum + u_a)
                * (
                    _matvec(xp, total_abs, xp.abs(token.update))
                    + beta_abs * _matvec(xp, decayed_abs, read_abs)
                )
            )
            state_abs = xp.abs(token.state)  # (..., Hs, dk, dv)
            err_dq = alpha * (
                _matvec(xp, xp.abs(dout), eps)[..., None]
                + value_sum * xp.matmul(xp.abs(dout), xp.matrix_transpose(state_abs))
            )
            outer = beta_abs[..., None] * key_abs[..., :, None] * read_abs[..., None, :]
            err_decayed_grad = (
                psi[..., None, :]
                + beta_abs[..., None] * key_abs[..., :, None] * err_read[..., None, :]
                + 2 * u_a * (total_abs + outer)
                + (r.eta * beta_abs * key_norm)[..., None] * read_abs[..., None, :]
            )
            grad_abs = xp.abs(step.decayed)
            magnitude = xp.sum(grad_abs * decayed_abs, axis=-1)  # (..., Hs, dk)
            err_dg = (
                xp.sum(
                    err_decayed_grad * decayed_abs + grad_abs * eps_decayed[..., None, :], axis=-1
                )
                + (d_v + 2) * u_a * magnitude
            )
            if int(p.log_decay.shape[-1]) == 1:
                err_dg = xp.sum(err_dg, axis=-1, keepdims=True) + d_k * u_a * xp.sum(
                    magnitude, axis=-1, keepdims=True
                )
                magnitude = xp.sum(magnitude, axis=-1, keepdims=True)
            # a chunked kernel's gradient of its cumulative log decay at t: q_t * dq_t minus
            # k_t * dk_t (both parts of dk_t), per key channel, with their errors
            written_part = _matvec(xp, total_abs, xp.abs(token.update))
            read_part = beta_abs * _matvec(xp, decayed_abs, read_abs)
            terms = xp.sum(xp.abs(queries) * (xp.abs(step.dq) + err_dq), axis=-2) + key_abs * (
                written_part + read_part + err_dk
            )
            if int(p.log_decay.shape[-1]) == 1:
                terms = xp.sum(terms, axis=-1, keepdims=True)
            dg_magnitude.append((chunk + 4) * u_a * terms)
            for found, value in zip(grads[:4], (step.dq, step.dk, step.dv, step.dg), strict=True):
                found.append(value[..., None, :])
            grads[4].append(
                (xp.zeros_like(step.dg[..., 0]) if step.dbeta is None else step.dbeta)[..., None]
            )
            for found, value in zip(tols[:4], (err_dq, err_dk, err_dv, err_dg), strict=True):
                found.append(value[..., None, :])
            tols[4].append(err_dbeta[..., None])
            # P_{t-1} = diag(exp(g_t)) D_t, its error contracted by rho_t plus this step's
            carried = token.decay[..., :, None] * step.decayed
            psi = (
                fwd.rho[..., None] * psi
                + (6 + fwd.gamma)[..., None] * u_a * column_norms(xp, carried)
                + beta_abs * key_norm * (product * _vecmat(xp, key_abs, total_abs))
                + r.write * beta_abs * key_norm * read_abs
                + r.eta * beta_abs * key_norm * (read_abs + key_norm * adjoint_norms)
                + r.flush
            )
            adjoint = carried
    if chunk > 1 and dg_magnitude:
        # A chunked kernel forms dg_t as a cumulative sum, over its chunk, of the gradients
        # of its cumulative log decays (the chunk holding t lies within C_h tokens of t on
        # either side, whichever way it sums): charge that window's terms.
        dg_magnitude.reverse()
        tols[3].reverse()
        windows = []
        for t in range(length):
            window = tols[3][t]
            for term in dg_magnitude[max(0, t - chunk + 1) : t + chunk]:
                window = window + term[..., None, :]
            windows.append(window)
        tols[3] = windows
        tols[3].reverse()
    return _assemble(
        p,
        (q, k, v, *optional_arrays(as_forward)),
        grads,
        tols,
        (adjoint, psi),
        (dtype, state_dtype, length),
        None if raw is None else (r, norm_eps, *raw),
    )


def _through_normalization(
    xp: Any, raw: Array, grad: Array, error: Array, eps: float, r: Rounding
) -> tuple[Array, Array]:
    """REC-7.7's normalisation terms (REC-7.5): the gradient of the input ``raw`` from the
    gradient ``grad`` of ``x^ = raw / n``, ``n = sqrt(|raw|^2 + eps)``, whose error is
    ``error``, ``dx = (d - x^ s) / n`` with ``s = x^ . d``; and its error: ``d`` perhaps
    rounded to the input dtype first (``u_d``), the kernel's ``x^`` off by ``eta |x^|``,
    the dot product's, the product's and the subtraction's roundings, and ``n``'s (the sum
    of squares, the square root, the division: ``(d_k + 4) u_a``).  0 where ``n = 0``."""
    squared = xp.sum(raw * raw, axis=-1, keepdims=True) + eps
    zero = squared == 0
    norm = xp.sqrt(xp.where(zero, xp.ones_like(squared), squared))
    unit = raw / norm
    unit_abs, grad_abs = xp.abs(unit), xp.abs(grad)
    unit_norm = xp.sqrt(xp.sum(unit * unit, axis=-1, keepdims=True))
    grad_norm = xp.sqrt(xp.sum(grad * grad, axis=-1, keepdims=True))
    along = xp.sum(unit * grad, axis=-1, keepdims=True)
    projected = grad - unit * along
    dx = projected / norm
    received = error + r.u_d * grad_abs
    d_k = int(raw.shape[-1])
    err_along = (
        r.eta * unit_norm * grad_norm
        + xp.sum(unit_abs * received, axis=-1, keepdims=True)
        + d_k * r.u_a * xp.sum(unit_abs * grad_abs, axis=-1, keepdims=True)
    )
    err_projected = (
        received
        + r.eta * unit_norm * xp.abs(along)
        + unit_abs * err_along
        + r.u_a * (unit_abs * xp.abs(along) + xp.abs(projected))
    )
    err = err_projected / norm + (d_k + 4) * r.u_a * xp.abs(dx)
    return xp.where(zero, xp.zeros_like(dx), dx), xp.where(zero, xp.zeros_like(err), err)


def _assemble(
    p: Any,
    inputs: tuple[Array, ...],
    grads: list[list[Array]],
    tols: list[list[Array]],
    adjoint_and_error: tuple[Array, Array],
    dtypes_and_length: tuple[str, str, int],
    normalization: tuple[Rounding, float, Array, Array] | None,
) -> RecurrentGradientBound:
    """The per-token lists (last token first) joined, q's and k's taken through the
    normalisation if the kernel normalises (``(rounding, eps, raw q, raw k)``, shared as
    the lists are), shared heads summed (their errors too, and the sum's own rounding), and
    REC-7.7's ``tau = C (err + sums) + u |dY| + underflow``; 0 where the target is not
    finite."""
    q, k, v, g, beta, initial_state = inputs
    adjoint, psi = adjoint_and_error
    dtype, state_dtype, length = dtypes_and_length
    xp = p.xp
    u_a = UNIT_ROUNDOFF["float64"] if dtype == "float64" else UNIT_ROUNDOFF["float32"]
    likes = (p.q, p.k, p.v, p.log_decay, p.log_decay[..., 0])
    joined = []
    for n, (found_grads, found_tols, like) in enumerate(zip(grads, tols, likes, strict=True)):
        axis = -1 if n == 4 else -2
        if not found_grads:
            joined.append((xp.zeros_like(like), xp.zeros_like(like)))
            continue
        found_grads.reverse()
        found_tols.reverse()
        joined.append((xp.concat(found_grads, axis=axis), xp.concat(found_tols, axis=axis)))
    if normalization is not None:
        r, eps, raw_q, raw_k = normalization
        for n, raw in ((0, raw_q), (1, raw_k)):
            joined[n] = _through_normalization(xp, raw, *joined[n], eps, r)
    batch, (states, groups, _, d_k) = p.q.shape[:-4], p.q.shape[-4:]
    d_v = int(p.v.shape[-1])
    dq, err_dq = (xp.reshape(a, (*batch, states * groups, length, d_k)) for a in joined[0])
    pairs = [
        (dq, err_dq, int(q.shape[-3])),
        (*joined[1], int(k.shape[-3])),
        (*joined[2], int(v.shape[-3])),
    ]
    gradients, tolerances = [], []
    sigma = UNDERFLOW_THRESHOLD[dtype]
    terms = max(d_k, d_v) + groups + 4  # products and sums that may underflow
    for gradient, error, heads in pairs:
        copies = int(gradient.shape[-3]) // heads
        summed = _unshare(xp, gradient, heads)
        error = _unshare(xp, error, heads) + copies * u_a * _unshare(xp, xp.abs(gradient), heads)
        gradients.append(summed)
        tolerances.append(error)
    dg, err_dg = joined[3]
    if g is not None and g.ndim == dg.ndim - 1:
        dg, err_dg = dg[..., 0], err_dg[..., 0]
    gradients += [dg, joined[4][0]]
    tolerances += [err_dg, joined[4][1]]
    wanted = (True, True, True, g is not None, beta is not None)
    result_grads: list[Array | None] = []
    result_tols: list[Array | None] = []
    u_d = UNIT_ROUNDOFF[dtype]
    for gradient, error, present in zip(gradients, tolerances, wanted, strict=True):
        if not present:
            result_grads.append(None)
            result_tols.append(None)
            continue
        tolerance = SAFETY_FACTOR * error + u_d * xp.abs(gradient) + terms * sigma
        result_grads.append(gradient)
        result_tols.append(xp.where(xp.isfinite(gradient), tolerance, xp.zeros_like(tolerance)))
    if initial_state is None:
        result_grads.append(None)
        result_tols.append(None)
    else:
        u_s = UNIT_ROUNDOFF[state_dtype]
        tolerance = (
            SAFETY_FACTOR * psi[..., None, :]
            + u_s * xp.abs(adjoint)
            + terms * UNDERFLOW_THRESHOLD[state_dtype]
        )
        result_grads.append(adjoint)
        result_tols.append(xp.where(xp.isfinite(adjoint), tolerance, xp.zeros_like(tolerance)))
    return RecurrentGradientBound(
        RecurrentGradients(*result_grads),
        RecurrentGradients(*result_tols),
    )
