"""spec/backward.md: the kernel's gradients (``attnspec check --backward``).

Every property calls the kernel's backward pass where the kernel runs (its own process,
its framework, its device: ``KernelUnderTest.call_gradients``) with an upstream gradient
dO of its output, and judges the returned ``(dq, dk, dv, dbias)`` here: against the
float64 vector-Jacobian product of the definition within BWD-17's bound
(``reference.tolerance_backward``), or exactly where the spec says exactly (BWD-3, BWD-4).
``gradients-match-reference`` draws as the forward accuracy properties do, over every
stratum and anchor of the profile (block boundaries, decode, head dims to 256, wide GQA,
padding biases); the others are fixed problems, the same on every seed and cheap, each
made to show one clause: a key no query sees, a row with no key, rows whose log-sum-exp is
below -88.7 at L % 128 = 64, L = 1025, groups of up to 8 query heads, broadcast biases,
repeated calls, strided inputs.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

from ....backends import Backend
from ....reference.backward import scaled_dot_product_attention_backward
from ....reference.features import alibi_slopes as standard_alibi_slopes
from ....reference.same_dtype import (
    FACTOR,
    SCORE_LIMIT,
    comparative_floors,
    comparative_threshold,
    largest_score,
    last_place,
    same_dtype_attention_backward,
)
from ....reference.tolerance_backward import GradientBound, gradient_error_bound
from ...call.gradients import BackwardCall
from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.input_features import FULLY_MASKED_ROW, allowed_keys, scores_shape
from ...draw.realistic_values import LARGEST_FINITE
from ...draw.shape_pool import pooling
from ...draw.sizes import Dims, avoided_now, current
from ...draw.strategies import (
    draw_dims,
    draw_problem,
    random_problem,
    random_values,
    with_a_key_per_row,
    within_limitations,
)
from ..assertions import assert_within_bound, first_index
from ..bounds import definition_keywords, dropout_bound
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest, reject_avoided
from ..packed_calls import Batch, Padding, varlen_arguments
from ..registration import needs, register
from ._helpers import draw_sparse_problem, laid_out

NAMES = ("dq", "dk", "dv", "dbias")
# softcaps the match property draws for a kernel that claims one: where tanh bends the
# scores (BWD-7) and where it barely does
SOFTCAPS = (1.0, 5.0, 30.0)
# exp(lse) underflows float32 below this (PyTorch #196678's rows)
LSE_UNDERFLOW = -88.7
HALF_DTYPES = ("float16", "bfloat16")  # BWD-14's dtypes
SEED_DROPOUT = 20261206  # the dropout seed of gradients-dropout; the runner's seed is added


class Gradients(NamedTuple):
    """A backward call's gradients as float64 NumPy (``dbias`` None without a bias), the
    bias as it was passed (float64; with -inf where a shared mask argument excludes) and,
    where asked for, the output of the forward call differentiated (BWD-9)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dbias: np.ndarray | None
    bias: np.ndarray | None
    out: np.ndarray | None = None

    def named(self) -> dict[str, np.ndarray | None]:
        return dict(zip(NAMES, (self.dq, self.dk, self.dv, self.dbias), strict=True))


def _upstream(kernel: KernelUnderTest, problem: Problem, rng: np.random.Generator) -> np.ndarray:
    """A random dO of the output's shape, rounded to the problem's dtype (BWD-16)."""
    batch = np.broadcast_shapes(problem.q.shape[:-3], problem.k.shape[:-3], problem.v.shape[:-3])
    shape = (*batch, problem.q.shape[-3], problem.q.shape[-2], problem.v.shape[-1])
    return kernel.rounded(rng.standard_normal(shape), problem.dtype)


def call_backward(
    kernel: KernelUnderTest,
    problem: Problem,
    grad_out: np.ndarray,
    arguments: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
    context: str = "",
    grad_lse: np.ndarray | None = None,
    with_output: bool = False,
) -> Gradients:
    """The kernel's gradients for dO = ``grad_out`` (and dlse = ``grad_lse`` of the
    log-sum-exp it returns, in LSE-3's dtype) on ``problem`` (or on ``arguments``, the same
    values laid out otherwise), each of its input's shape and dtype (BWD-2, BWD-13), as
    float64; ``with_output``: the output of the same forward call too."""
    reject_avoided(problem, kernel.declaration)
    backend = kernel.backend
    args, kwargs = arguments if arguments is not None else kernel.arguments(problem)
    bias_keyword = kernel.bias_keyword(problem)
    upstream = backend.asarray(grad_out, problem.dtype)
    lse_dtype = "float64" if problem.dtype == "float64" else "float32"
    lse_upstream = None if grad_lse is None else backend.asarray(grad_lse, lse_dtype)
    call = BackwardCall(args, kwargs, upstream, bias_keyword, lse_upstream, with_output=with_output)
    try:
        raw = kernel.call_gradients(call, problem)
    except PropertyFailure:
        raise
    except Exception as exc:
        raise KernelRaised(
            f"the backward pass raised {type(exc).__name__}: {str(exc)[:300]}{context} [BWD-1]",
            problem,
            kernel,
        ) from exc
    if not isinstance(raw, (tuple, list)) or len(raw) != 4 + with_output:
        raise PropertyFailure(
            f"the backward pass gave {type(raw).__name__}, not (dq, dk, dv, dbias){context} "
            "[BWD-1]",
            problem,
            kernel,
        )
    passed = (*args[:3], None if bias_keyword is None else kwargs[bias_keyword])
    got: list[np.ndarray | None] = []
    for name, gradient, primal in zip(NAMES, raw[:4], passed, strict=True):
        if primal is None:
            got.append(None)
            continue
        _check_like(kernel, problem, name, gradient, primal, context)
        got.append(kernel.numpy(gradient))
    bias = None if passed[3] is None else kernel.numpy(passed[3])
    out = kernel.numpy(raw[4]) if with_output else None
    return Gradients(got[0], got[1], got[2], got[3], bias, out)  # type: ignore[arg-type]


def _check_like(
    kernel: KernelUnderTest, problem: Problem, name: str, gradient: Any, primal: Any, context: str
) -> None:
    """BWD-2, BWD-13: a gradient is an array of its input's shape and dtype."""
    backend = kernel.backend
    shape, dtype = tuple(primal.shape), backend.dtype_name(primal)
    if not backend.is_array(gradient):
        found = "None" if gradient is None else type(gradient).__name__
        raise PropertyFailure(
            f"{name} is {found}, but should be a {backend.name} array of shape {shape}"
            f"{context} [BWD-1, BWD-2]",
            problem,
            kernel,
        )
    if tuple(gradient.shape) != shape or backend.dtype_name(gradient) != dtype:
        raise PropertyFailure(
            f"{name} is {backend.dtype_name(gradient) or gradient.dtype}"
            f"{tuple(gradient.shape)}, but should have its input's shape and dtype, "
            f"{dtype}{shape}{context} [BWD-2: summed over broadcast dims; BWD-13]",
            problem,
            kernel,
        )


def first_outside(error: np.ndarray, tolerance: Any) -> tuple[tuple[int, ...], int] | None:
    """The first index where ``error`` exceeds ``tolerance`` (NaN does) and how many do, or
    None where none does."""
    with np.errstate(invalid="ignore"):
        outside = np.asarray(~(error <= tolerance))
    return (first_index(outside), int(outside.sum())) if outside.any() else None


def expected_gradients(
    kernel: KernelUnderTest,
    problem: Problem,
    grad_out: np.ndarray,
    bias: np.ndarray | None,
    grad_lse: np.ndarray | None = None,
    dropout_keep: np.ndarray | None = None,
) -> GradientBound:
    """BWD-16, BWD-17: the float64 gradients of the definition on the values the kernel got
    and their allowed errors in the problem's dtype (``bias`` as passed; ``grad_lse`` the
    log-sum-exp's upstream gradient, BWD-10; ``dropout_keep`` the keep indicators of the
    forward call, with the problem's dropout probability, BWD-9)."""
    return gradient_error_bound(
        problem.q,
        problem.k,
        problem.v,
        grad_out,
        grad_lse=grad_lse,
        dropout_p=0.0 if dropout_keep is None else problem.dropout_p,
        dropout_keep=dropout_keep,
        **{**definition_keywords(problem, kernel.declaration.causal_alignment), "bias": bias},
    )


def _outside(got: Gradients, bound: GradientBound) -> tuple[Any, ...] | None:
    """(name, gradient, expected, tolerance, index, count) of the first gradient with an
    element outside its bound (NaN is), or None where every one is within."""
    wanted = (bound.dq, bound.dk, bound.dv, bound.dbias)
    tolerances = (bound.dq_tolerance, bound.dk_tolerance, bound.dv_tolerance, bound.dbias_tolerance)
    for name, gradient, expected, tolerance in zip(NAMES, got[:4], wanted, tolerances, strict=True):
        if gradient is None:
            continue
        expected, tolerance = np.asarray(expected), np.asarray(tolerance)
        found = first_outside(np.abs(gradient - expected), tolerance)
        if found is not None:
            return (name, gradient, expected, tolerance, *found)
    return None


def half_precision_cause(
    kernel: KernelUnderTest,
    problem: Problem,
    grad_out: np.ndarray,
    grad_lse: np.ndarray | None = None,
) -> str:
    """BWD-14 named where it is the cause of a half-precision BWD-17 failure: the same
    values (exact in float32, BWD-16) given to the kernel in float32 give gradients within
    BWD-17's float32 bound, so the error is made by the kernel's float16 or bfloat16
    arithmetic, which BWD-14 recommends keeping in float32 and the bound assumes is; ""
    where the kernel is not checked in float32 or fails there too."""
    if problem.dtype not in HALF_DTYPES or "float32" not in kernel.dtypes:
        return ""
    wide = problem.with_(dtype="float32")
    try:
        grads = call_backward(kernel, wide, grad_out, grad_lse=grad_lse)
        bound = expected_gradients(kernel, wide, grad_out, grads.bias, grad_lse)
    except PropertyFailure:
        return ""
    if _outside(grads, bound) is not None:
        return ""
    return (
        f"; the same inputs in float32 are within its float32 bound: the error is made by "
        f"its {problem.dtype} arithmetic, which BWD-14 (SHOULD) keeps in float32 for dP, D, dS "
        "and the sums of dq, dk, dv, as the bound assumes [BWD-14]"
    )


def assert_gradients_match(
    kernel: KernelUnderTest,
    problem: Problem,
    grad_out: np.ndarray,
    got: Gradients,
    context: str = "",
    grad_lse: np.ndarray | None = None,
    dropout_keep: np.ndarray | None = None,
) -> GradientBound:
    """BWD-17: every gradient element within its bound of the definition (NaN is outside);
    with ``dropout_keep``, that of the forward's keep indicators (BWD-9).  A failure in
    float16 or bfloat16 names BWD-14 where that is its cause (:func:`half_precision_cause`,
    which calls the kernel's backward again: run on the reported failure only,
    ``failures.with_cause``)."""
    bound = expected_gradients(kernel, problem, grad_out, got.bias, grad_lse, dropout_keep)
    found = _outside(got, bound)
    if found is None:
        return bound
    name, gradient, expected, tolerance, at, count = found
    clause = "BWD-17" if dropout_keep is None else "BWD-9, BWD-17"

    def cause() -> str:  # another backward call: run on the reported failure only
        return half_precision_cause(kernel, problem, grad_out, grad_lse)

    raise PropertyFailure(
        f"{name}{list(at)} = {gradient[at]!r}, but should be {expected[at]!r} within "
        f"{tolerance[at]:.3g}{context}; {count} of {gradient.size} elements outside "
        f"[{clause}]",
        problem,
        kernel,
        explain=None if dropout_keep is not None else cause,
    )


def _for_backward(kernel: KernelUnderTest, problem: Problem, rng: np.random.Generator) -> Problem:
    """``problem`` as the backward properties call it: E = Ev for a kernel that declares
    ``equal_head_dims`` (its gradients are taken unpadded: new values of v)."""
    head_dim, value_dim = problem.q.shape[-1], problem.v.shape[-1]
    if not kernel.declaration.equal_head_dims or head_dim == value_dim:
        return problem
    shape = (*problem.v.shape[:-1], head_dim)
    return problem.with_(v=kernel.rounded(rng.standard_normal(shape), problem.dtype))


def with_keys(kernel: KernelUnderTest, problem: Problem) -> Problem:
    """``problem`` with a key in every row the causal rule leaves one for a kernel that
    waives SDPA-5.1 (and so BWD-4): its rows without a key are not the definition's; and
    while a re-run draws around SDPA-5.1's fully masked rows (root causes)."""
    drawn_around = FULLY_MASKED_ROW in avoided_now()  # a re-run around SDPA-5.1's rows
    if (kernel.declaration.empty_rows_zero and not drawn_around) or problem.mask is None:
        return problem
    return problem.with_(mask=with_a_key_per_row(problem, kernel.declaration))


def _backward_claimed(declaration: KernelDeclaration) -> str | None:
    return needs("backward")(declaration)


def _backward_with(*claims: str) -> Any:
    return needs("backward", *claims)


class JudgedOutputs:
    """The kernel outputs one property judged, kept for another that draws the same
    examples (``draws_as``) to judge again without calling the kernel: per (kernel,
    problem, dO), least recently used out first, at most ``max_bytes`` of arrays.  A
    property that finds nothing (another worker process judged it, or it was evicted)
    calls the kernel itself."""

    def __init__(self, max_bytes: int = 64 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[bytes, tuple[KernelUnderTest, Any, int]] = OrderedDict()

    @staticmethod
    def _key(kernel: KernelUnderTest, problem: Problem, grad_out: np.ndarray) -> bytes:
        hasher = hashlib.blake2b(digest_size=16)
        arrays = (problem.q, problem.k, problem.v, problem.mask, problem.bias)
        for a in (*arrays, problem.alibi_slopes, grad_out):
            hasher.update(b"-" if a is None else repr((a.dtype.str, a.shape)).encode())
            if a is not None:
                hasher.update(np.ascontiguousarray(a).data)
        scalars = (problem.dtype, problem.is_causal, problem.scale, problem.softcap)
        others = (problem.dropout_p, problem.seed, sorted(problem.extra.items()))
        hasher.update(repr((id(kernel), *scalars, *others)).encode())
        return hasher.digest()

    def remember(
        self, kernel: KernelUnderTest, problem: Problem, grad_out: np.ndarray, outputs: Any
    ) -> None:
        size = sum(a.nbytes for a in _arrays_in(outputs))
        if size > self.max_bytes // 4:
            return  # one large example would evict every other
        self._kept[self._key(kernel, problem, grad_out)] = (kernel, outputs, size)
        while sum(entry[2] for entry in self._kept.values()) > self.max_bytes:
            self._kept.popitem(last=False)

    def recall(self, kernel: KernelUnderTest, problem: Problem, grad_out: np.ndarray) -> Any:
        key = self._key(kernel, problem, grad_out)
        entry = self._kept.get(key)
        if entry is None or entry[0] is not kernel:
            return None
        self._kept.move_to_end(key)
        return entry[1]


def _arrays_in(value: Any) -> list[np.ndarray]:
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, (tuple, list)):
        return [a for item in value for a in _arrays_in(item)]
    return []


# gradients-match-reference's half-precision outputs, judged again by BWD-18's property
JUDGED = JudgedOutputs()


@functools.cache
def _numpy() -> Backend:
    """NumPy, where BWD-18's comparison runs in float16: made at its first use, not when
    the properties are registered (making it imports array_api_compat's NumPy namespace,
    ~70 ms of CPU, which a process that only lists or plans the properties, the
    ``attnspec`` command, has no use for)."""
    return Backend("numpy")


@register("gradients-match-reference", "BWD-17", applies=_backward_claimed)
def gradients_match_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """dq, dk, dv (and the bias's gradient) for a random dO lie within BWD-17's bound of the
    float64 vector-Jacobian product of the definition (BWD-1, BWD-16), on the problems the
    forward accuracy property draws: masks, biases (padding fills of finfo.min), both
    causal alignments as declared, GQA, explicit scales, a softcap where claimed, and in
    the realistic strata block-boundary lengths, decode, head dims to 256 and the anchors.
    A dropped or low-precision delta term, a scale applied twice or not at all, GQA
    gradients not summed over the group, a missing softcap derivative or a last key block
    left out are outside it."""
    problem, rng = _drawn_for_gradients(kernel, data)
    grad_out = _upstream(kernel, problem, rng)
    got = call_backward(kernel, problem, grad_out)
    bound = assert_gradients_match(kernel, problem, grad_out, got)
    if problem.dtype in HALF_DTYPES:  # judged again by BWD-18's property, on these outputs
        expected = (bound.dq, bound.dk, bound.dv, bound.dbias)
        JUDGED.remember(kernel, problem, grad_out, (got, expected))


def _drawn_for_gradients(
    kernel: KernelUnderTest, data: st.DataObject, dims: Dims | None = None
) -> tuple[Problem, np.random.Generator]:
    """A problem drawn as the forward accuracy properties draw them (of ``dims`` where
    given), as the backward properties call it, a softcap drawn where claimed; and the
    generator its upstream gradients come from."""
    problem = draw_problem(data, kernel, dims=dims)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="dO seed"))
    problem = with_keys(kernel, _for_backward(kernel, problem, rng))
    if kernel.declaration.softcap and data.draw(st.booleans(), label="softcap"):
        problem = problem.with_(softcap=data.draw(st.sampled_from(SOFTCAPS), label="cap"))
    return problem, rng


def _definition_gradients(
    kernel: KernelUnderTest, problem: Problem, grad_out: np.ndarray, bias: np.ndarray | None
) -> tuple[Any, ...]:
    """BWD-16: the float64 gradients of the definition on the values the kernel got."""
    keywords = definition_keywords(problem, kernel.declaration.causal_alignment)
    del keywords["dtype"]
    return scaled_dot_product_attention_backward(
        problem.q, problem.k, problem.v, grad_out, **{**keywords, "bias": bias}
    )


def _rounded_on_host(backend: Backend, dtype: str) -> Callable[[Any], Any]:
    """Float32 NumPy values rounded to ``backend``'s ``dtype`` on the host."""

    def store(a: Any) -> Any:
        return backend.rounded_on_host(a, dtype).astype(np.float32)

    return store


def _same_dtype_gradients(
    kernel: KernelUnderTest,
    problem: Problem,
    grad_out: np.ndarray,
    bias: np.ndarray | None,
    delta_from_output: bool,
) -> list[np.ndarray | None]:
    """BWD-18's comparison implementation on the values the kernel got, in the problem's
    dtype, as float64, in the form of the delta term ``delta_from_output`` names: on NumPy
    where it has the dtype (float16: no device transfer, no compilation per shape) or holds
    the library's (JAX's bfloat16), else on the kernel's backend (PyTorch's bfloat16)."""
    dtype, store = problem.dtype, None
    numpy = _numpy()
    backend = numpy if dtype in numpy.dtype_names else kernel.backend
    if backend is not numpy and kernel.backend.rounded_on_host(np.zeros(1), dtype) is not None:
        # NumPy holds the library's dtype (JAX's bfloat16): float32 on the host, each step
        # rounded there, rather than a compilation per shape and operation on the device
        backend, dtype, store = numpy, "float32", _rounded_on_host(kernel.backend, dtype)
    keywords = definition_keywords(problem, kernel.declaration.causal_alignment)
    del keywords["dtype"]
    if problem.mask is not None:
        keywords["mask"] = backend.asarray(problem.mask)
    if problem.alibi_slopes is not None:  # float32, as the kernel gets them
        keywords["alibi_slopes"] = backend.asarray(problem.alibi_slopes, "float32")
    keywords["bias"] = None if bias is None else backend.asarray(bias, dtype)
    arrays = (backend.asarray(a, dtype) for a in (problem.q, problem.k, problem.v, grad_out))
    theirs = same_dtype_attention_backward(
        *arrays, store=store, delta_from_output=delta_from_output, **keywords
    )
    return [None if g is None else backend.to_numpy(g).astype(np.float64) for g in theirs]


def _flash_rule_applies(declaration: KernelDeclaration) -> str | None:
    reason = needs("backward")(declaration)
    if reason is None and declaration.dtypes and not set(declaration.dtypes) & set(HALF_DTYPES):
        reason = (
            "the kernel is checked in neither float16 nor bfloat16, the dtypes FlashAttention's "
            "rule applies to"
        )
    return reason


@register(
    "gradients-within-flash-rule",
    "BWD-18",
    applies=_flash_rule_applies,
    draws_as="gradients-match-reference",
)
def gradients_within_flash_rule(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """In float16 and bfloat16, each gradient's largest error against the float64 definition
    is at most 3 times that of FlashAttention's same-dtype implementation (``attention_ref``
    with ``upcast=False, reorder_ops=True``, differentiated in the dtype; the larger error of
    its two forms of the delta term, autograd's and FlashAttention's), or a floor of
    float32's roundings (and a last place of the dtype) where that is larger, on the
    problems and kernel outputs of
    gradients-match-reference where float32 resolves the scores (a SHOULD: a warning).  dP,
    the delta term, dV or dQ accumulated in the input dtype stay within BWD-17 but not within
    it."""
    problem, rng = _drawn_for_gradients(kernel, data)
    grad_out = _upstream(kernel, problem, rng)
    if problem.dtype not in HALF_DTYPES:
        return
    keywords = definition_keywords(problem, kernel.declaration.causal_alignment)
    del keywords["dtype"]
    largest = largest_score(problem.q, problem.k, **keywords)
    if largest >= SCORE_LIMIT:
        return  # outside BWD-18: float32 does not resolve the scores (a padding bias)
    recalled = JUDGED.recall(kernel, problem, grad_out)
    if recalled is None:
        got = call_backward(kernel, problem, grad_out)
        expected = tuple(_definition_gradients(kernel, problem, grad_out, got.bias))
    else:
        got, expected = recalled
    assert_within_flash_rule(kernel, problem, grad_out, got, expected)


class RuleThreshold(NamedTuple):
    """BWD-18's threshold of one gradient, the comparison implementation's largest error
    (the larger of its two forms of the delta term) and the floor it is the larger of (with
    3 times that error)."""

    threshold: float
    reference_error: float
    floor: float


def flash_rule_thresholds(
    kernel: KernelUnderTest,
    problem: Problem,
    grad_out: np.ndarray,
    bias: np.ndarray | None,
    expected: tuple[Any, ...],
) -> list[RuleThreshold | None]:
    """BWD-18's threshold of each gradient of ``problem`` (float16 or bfloat16; ``bias`` as
    passed, ``expected`` the definition's gradients, BWD-16), None for a gradient without one
    (no bias, or the comparison implementation overflowed: it sets no threshold)."""
    keywords = definition_keywords(problem, kernel.declaration.causal_alignment)
    del keywords["dtype"]
    keywords["bias"] = bias
    floors = comparative_floors(
        problem.q, problem.k, problem.v, grad_out, dtype=problem.dtype, **keywords
    )
    # D as autograd's softmax backward forms it, and from the stored output as FlashAttention
    # does: each form's roundings cancel where the other's do not (BWD-18)
    forms = [_same_dtype_gradients(kernel, problem, grad_out, bias, f) for f in (False, True)]
    found: list[RuleThreshold | None] = []
    for exact, *others, floor in zip(expected, *forms, (*floors, None), strict=False):
        if exact is None or floor is None or any(o is None for o in others):
            found.append(None)
            continue
        wanted = np.asarray(exact, np.float64)
        errors = [float(np.max(np.abs(o - wanted), initial=0.0)) for o in others]
        error, finite = max(errors), bool(np.all(np.isfinite(errors)))
        # a gradient stored in the dtype: the rule asks for no less than its last place
        floor = max(floor, last_place(float(np.max(np.abs(wanted), initial=0.0)), problem.dtype))
        found.append(
            RuleThreshold(comparative_threshold(error, floor), error, floor) if finite else None
        )
    return found


def assert_within_flash_rule(
    kernel: KernelUnderTest,
    problem: Problem,
    grad_out: np.ndarray,
    got: Gradients,
    expected: tuple[Any, ...],
    thresholds: list[RuleThreshold | None] | None = None,
) -> None:
    """BWD-18: each of the kernel's gradients ``got`` (float16 or bfloat16) within
    FlashAttention's rule of the definition's ``expected`` (BWD-16): its largest error at
    most 3 times the comparison implementation's, or the floor where that is larger
    (``thresholds``: :func:`flash_rule_thresholds`, computed here when not given)."""
    if thresholds is None:
        thresholds = flash_rule_thresholds(kernel, problem, grad_out, got.bias, expected)
    for name, gradient, exact, limit in zip(NAMES, got[:4], expected, thresholds, strict=False):
        if gradient is None or exact is None or limit is None:
            continue
        exact = np.asarray(exact, dtype=np.float64)
        error = np.abs(gradient - exact)
        largest = math.nan if np.isnan(error).any() else float(np.max(error, initial=0.0))
        if largest <= limit.threshold:
            continue
        at = first_index(np.isnan(error) | (error == largest))
        raise PropertyFailure(
            f"{name}: the kernel's largest error against the definition is {largest:.3g} "
            f"({name}{list(at)} = {gradient[at]!r}, the definition's {exact[at]!r}), "
            f"{largest / limit.threshold:.3g} times BWD-18's threshold {limit.threshold:.3g}, "
            f"the larger of {FACTOR:g} x {limit.reference_error:.3g} (the largest error of "
            "FlashAttention's same-dtype implementation, attention_ref(upcast=False, "
            f"reorder_ops=True), in {problem.dtype}) and the floor {limit.floor:.3g}: "
            "FlashAttention's tests would reject it [BWD-18]",
            problem,
            kernel,
        )


# --- fixed problems -----------------------------------------------------------------


def _batch(declaration: KernelDeclaration) -> tuple[int, ...]:
    """Two batch elements in the batch rank the kernel takes (none for batch_ndim=0)."""
    ndim = 1 if declaration.batch_ndim is None else declaration.batch_ndim
    return (2, *(1,) * (ndim - 1)) if ndim else ()


def _fixed_problem(
    kernel: KernelUnderTest,
    rng: np.random.Generator,
    *,
    n_queries: int,
    n_keys: int,
    head_dim: int = 16,
    groups: int = 1,
    n_kv_heads: int = 1,
    dtype: str | None = None,
    magnitude: float = 1.0,
) -> Problem:
    """Random values of these sizes (GQA only where claimed; as the kernel's limits allow),
    in ``dtype`` (default: the most precise checked)."""
    decl = kernel.declaration
    dims = Dims(
        batch=_batch(decl),
        n_kv_heads=n_kv_heads,
        groups=groups if decl.gqa else 1,
        n_queries=n_queries,
        n_keys=n_keys,
        head_dim=head_dim,
        value_dim=head_dim,
    )
    dims = within_limitations(kernel, dims)  # Lq = Lk for equal_lengths, ...
    return random_problem(kernel, rng, dims, dtype or kernel.widest_dtype, magnitude)


def _exclusion_problems(kernel: KernelUnderTest, seed: int) -> list[Problem]:
    """Problems where some keys are seen by no query and some pairs are excluded: a masked
    key column and a masked query row (when masks are claimed), causal calls of the
    declared alignment with more keys than queries (top-left: the last keys) and more
    queries than keys (bottom-right: the first queries see nothing), GQA where claimed; for
    a kernel that claims neither masks nor causal calls, the plain problems."""
    decl = kernel.declaration
    rng = np.random.default_rng(seed)
    found = []
    for n_queries, n_keys in ((5, 9), (9, 5), (65, 70)):
        problem = _fixed_problem(kernel, rng, n_queries=n_queries, n_keys=n_keys, groups=2)
        if decl.mask:
            mask = rng.random(scores_shape(problem)[-2:]) < 0.8
            mask[:, 1] = False  # a key no query sees (BWD-3)
            mask[2, :] = False  # a query with no key (BWD-4)
            found.append(with_keys(kernel, problem.with_(mask=mask)))
        if decl.causal:
            found.append(problem.with_(is_causal=True))
        if not (decl.mask or decl.causal):  # nothing to exclude: the plain problem
            found.append(problem)
    return found


@register("gradients-shape-dtype", "BWD-13", kind="fixed", applies=_backward_claimed)
def gradients_shape_dtype(kernel: KernelUnderTest, seed: int) -> None:
    """In every dtype checked, dq, dk, dv and the bias's gradient are arrays of their
    inputs' shapes and dtypes (BWD-2, BWD-13), with GQA and a bias broadcast over the batch
    and heads where claimed: a bias gradient returned at the scores' shape, dk and dv of
    the query heads' count, or float32 gradients of float16 inputs are not."""
    rng = np.random.default_rng(seed + 10)
    for dtype in kernel.dtypes:
        problem = _fixed_problem(kernel, rng, n_queries=5, n_keys=7, groups=2, dtype=dtype)
        if kernel.declaration.bias:
            bias = kernel.rounded(rng.standard_normal(scores_shape(problem)[-2:]), dtype)
            problem = problem.with_(bias=bias)
        call_backward(kernel, problem, _upstream(kernel, problem, rng), context=f" ({dtype})")


def _min_biased(kernel: KernelUnderTest, problems: list[Problem]) -> list[Problem]:
    """The 5 x 9 problems of :func:`_exclusion_problems` with every bias entry the dtype's
    most negative finite number (an HF-style additive padding fill), where a bias is claimed
    beside their mask or causal rule: every allowed key of every row carries it (a finite
    bias keeps the key allowed, SDPA-3.3), so a kernel that fills excluded logits with a
    larger finite number (JAX's -0.7 finfo.max) gives those rows' weight, and their dO, to
    the excluded keys (docs/divergences.md#jax-fill-outranks-min-bias)."""
    decl = kernel.declaration
    if not decl.bias:
        return []
    return [
        problem.with_(bias=np.full(scores_shape(problem)[-2:], -LARGEST_FINITE[problem.dtype]))
        for problem in problems
        if problem.q.shape[-2] == 5
        and (problem.mask is not None or problem.is_causal)
        and not (problem.is_causal and decl.bias_shares_mask_argument)
    ]


@register("gradients-excluded-keys-zero", "BWD-3", kind="fixed", applies=_backward_claimed)
def gradients_excluded_keys_zero(kernel: KernelUnderTest, seed: int) -> None:
    """A key that no query may attend (masked for every query, or causally excluded in the
    declared alignment) has dk = dv = 0 exactly, and the bias gradient of every excluded
    pair is exactly 0: a backward that drops the causal mask, or scores a padded tile 0
    instead of -inf, gives them gradients its forward never used.  Where a bias is claimed,
    also with every bias entry the dtype's most negative finite number (BWD-3 with SDPA-3.3:
    such a key is still allowed, the excluded ones are not), on every seed: a kernel whose
    fill of excluded logits outranks that bias gives them the rows' weight."""
    problems = _exclusion_problems(kernel, seed)
    min_biased = _min_biased(kernel, problems)
    for problem in [*problems, *min_biased]:
        rng = np.random.default_rng(seed + 1)
        biased = (
            f" (every bias entry {-LARGEST_FINITE[problem.dtype]:.4g}, SDPA-3.3)"
            if any(problem is p for p in min_biased)
            else ""
        )
        grads = call_backward(kernel, problem, _upstream(kernel, problem, rng))
        allowed = allowed_keys(problem, kernel.declaration)
        group = problem.q.shape[-3] // problem.k.shape[-3]
        per_kv_head = allowed.reshape(*allowed.shape[:-3], -1, group, *allowed.shape[-2:])
        unseen = np.asarray(~per_kv_head.any(axis=(-3, -2)))  # (batch, Hkv, Lk)
        for name, gradient in (("dk", grads.dk), ("dv", grads.dv)):
            shown = np.broadcast_to(gradient, (*unseen.shape, gradient.shape[-1]))
            nonzero = np.asarray(unseen[..., None] & (shown != 0))
            if nonzero.any():
                at = first_index(nonzero)
                raise PropertyFailure(
                    f"{name}{list(at)} = {shown[at]!r}, but key {at[-2]} is attended by no "
                    f"query (masked or causally excluded{biased}), so its gradient should be "
                    "exactly 0 [BWD-3]",
                    problem,
                    kernel,
                )


def _backward_unless(
    claims: tuple[str, ...], excluded: Callable[[KernelDeclaration], bool], why: str
) -> Callable[[KernelDeclaration], str | None]:
    """Applies where the backward and ``claims`` are claimed, but not where ``excluded``
    (then ``why`` says why not)."""

    def applies(declaration: KernelDeclaration) -> str | None:
        reason = needs("backward", *claims)(declaration)
        return why if reason is None and excluded(declaration) else reason

    return applies


_empty_rows_defined = _backward_unless(
    ("mask",),
    lambda declaration: not declaration.empty_rows_zero,
    "the kernel waives SDPA-5.1 (empty_rows_zero=False), from which BWD-4's gradients of a "
    "row without keys follow",
)


@register("gradients-empty-rows", "BWD-4", kind="fixed", applies=_empty_rows_defined)
def gradients_empty_rows(kernel: KernelUnderTest, seed: int) -> None:
    """A query whose every key is masked has dq = 0 exactly, adds nothing to dk, dv and the
    bias gradient, and no gradient is NaN: recomputing its weights as exp(s - lse) with
    lse = -inf gives NaN (PyTorch before _safe_softmax)."""
    for problem in _exclusion_problems(kernel, seed):
        if problem.mask is None:
            continue
        rng = np.random.default_rng(seed + 2)
        grad_out = _upstream(kernel, problem, rng)
        grads = call_backward(kernel, problem, grad_out)
        for name, gradient in grads.named().items():
            if gradient is not None and not np.isfinite(gradient).all():
                at = first_index(~np.isfinite(gradient))
                raise PropertyFailure(
                    f"{name}{list(at)} = {gradient[at]!r} with a query whose every key is "
                    "masked, but every gradient should be finite; that row's dq exactly 0 "
                    "[BWD-4]",
                    problem,
                    kernel,
                )
        keyless = np.asarray(~allowed_keys(problem, kernel.declaration).any(axis=-1))
        dq = np.broadcast_to(grads.dq, (*keyless.shape, grads.dq.shape[-1]))
        nonzero = np.asarray(keyless[..., None] & (dq != 0))
        if nonzero.any():
            at = first_index(nonzero)
            raise PropertyFailure(
                f"dq{list(at)} = {dq[at]!r}, but query {at[-2]} may attend no key, so its "
                "gradient should be exactly 0 [BWD-4]",
                problem,
                kernel,
            )
        assert_gradients_match(kernel, problem, grad_out, grads, " (a row with no key)")


def _finite_problems(kernel: KernelUnderTest, seed: int) -> list[tuple[str, Problem]]:
    """PyTorch #196678: L = 192 (L % 128 = 64) with an explicit causal mask and every score
    near -120, so every row's log-sum-exp is below -88.7; PyTorch #153799's L = 1025,
    causal; and keys padded with a bias of the dtype's most negative finite value."""
    decl = kernel.declaration
    rng = np.random.default_rng(seed)
    low = _fixed_problem(kernel, rng, n_queries=192, n_keys=192, magnitude=0.1)
    q, k = low.q.copy(), low.k.copy()
    q[..., 0], k[..., 0] = 1.0, -480.0  # x_ij ~ -480 / sqrt(16) = -120
    low = low.with_(q=kernel.rounded(q, low.dtype), k=kernel.rounded(k, low.dtype))
    if decl.mask:
        low = low.with_(mask=np.tril(np.ones((192, 192), dtype=bool)))
    found = [("log-sum-exp below -88.7 at L = 192", low)]
    long = _fixed_problem(kernel, rng, n_queries=1025, n_keys=1025, head_dim=8)
    if decl.causal:
        found.append(("L = 1025, causal", long.with_(is_causal=True)))
    padded = _fixed_problem(kernel, rng, n_queries=64, n_keys=64)
    if decl.bias:
        bias = rng.standard_normal(scores_shape(padded)[-2:])
        bias[:, -7:] = -LARGEST_FINITE[padded.dtype]
        found.append(("keys padded by a finfo.min bias", padded.with_(bias=bias)))
    return found


@register("gradients-finite", "BWD-5", kind="fixed", applies=_backward_claimed)
def gradients_finite(kernel: KernelUnderTest, seed: int) -> None:
    """Finite inputs give finite gradients where the forward output is finite: rows whose
    log-sum-exp is below -88.7 at L = 192 (L % 128 = 64, PyTorch #196678's cuDNN NaN),
    L = 1025 causal (PyTorch #153799), keys padded with finfo.min."""
    rng = np.random.default_rng(seed + 3)
    for what, problem in _finite_problems(kernel, seed):
        grads = call_backward(kernel, problem, _upstream(kernel, problem, rng), context="")
        for name, gradient in grads.named().items():
            if gradient is not None and not np.isfinite(gradient).all():
                bad = ~np.isfinite(gradient)
                at = first_index(bad)
                raise PropertyFailure(
                    f"{name}{list(at)} = {gradient[at]!r} ({what}), but every gradient of "
                    f"finite inputs should be finite; {int(bad.sum())} of {bad.size} are not "
                    "[BWD-5]",
                    problem,
                    kernel,
                )


def _quarter_steps(
    kernel: KernelUnderTest, problem: Problem, rng: np.random.Generator
) -> np.ndarray:
    """A dO of multiples of 1/4 in [-2, 2]: any two add up exactly in every dtype."""
    shape = _upstream(kernel, problem, rng).shape
    return rng.integers(-8, 9, size=shape).astype(np.float64) / 4


@register("gradients-linear-in-upstream", "BWD-1", kind="fixed", applies=_backward_claimed)
def gradients_linear_in_upstream(kernel: KernelUnderTest, seed: int) -> None:
    """The gradients are linear in dO (a vector-Jacobian product): those of dO1 + dO2 are
    the sum of those of dO1 and dO2, within the sum of the three calls' BWD-17 bounds
    (dO1 + dO2 exact in the dtype)."""
    rng = np.random.default_rng(seed + 4)
    for problem in _exclusion_problems(kernel, seed)[:2]:
        first, second = _quarter_steps(kernel, problem, rng), _quarter_steps(kernel, problem, rng)
        calls = [call_backward(kernel, problem, d) for d in (first, second, first + second)]
        bounds = [expected_gradients(kernel, problem, d, calls[0].bias) for d in (first, second)]
        bounds.append(expected_gradients(kernel, problem, first + second, calls[0].bias))
        for index, name in enumerate(NAMES):
            parts = [call[index] for call in calls]
            if parts[0] is None or parts[1] is None or parts[2] is None:
                continue
            tolerance = np.sum([np.asarray(bound[4 + index]) for bound in bounds], axis=0)
            found = first_outside(np.abs(parts[0] + parts[1] - parts[2]), tolerance)
            if found is not None:
                at = found[0]
                raise PropertyFailure(
                    f"{name}{list(at)}: {parts[0][at]!r} for dO1 plus {parts[1][at]!r} for "
                    f"dO2 is not {parts[2][at]!r} for dO1 + dO2 within {tolerance[at]:.3g}: the "
                    "gradients should be linear in the upstream gradient [BWD-1]",
                    problem,
                    kernel,
                )


@register("gradients-softmax-identity", "BWD-1", kind="fixed", applies=_backward_claimed)
def gradients_softmax_identity(kernel: KernelUnderTest, seed: int) -> None:
    """Each row's dS sums to 0 over its keys (the softmax's Jacobian annihilates constants),
    so adding one vector to every key changes nothing and dk summed over the keys of each
    key/value head is 0, within the sum of those keys' BWD-17 bounds; with a bias of the
    full scores' shape its gradient's row sums are 0 too.  A backward that drops the delta
    term D = rowsum(dO * O) breaks it."""
    rng = np.random.default_rng(seed + 5)
    for problem in _exclusion_problems(kernel, seed):
        decl = kernel.declaration
        shares = problem.is_causal and decl.bias_shares_mask_argument
        if decl.bias and problem.mask is None and not shares:
            bias = kernel.rounded(rng.standard_normal(scores_shape(problem)), problem.dtype)
            problem = problem.with_(bias=bias)
        grad_out = _upstream(kernel, problem, rng)
        grads = call_backward(kernel, problem, grad_out)
        bound = expected_gradients(kernel, problem, grad_out, grads.bias)
        checks = [("dk summed over keys", grads.dk, np.asarray(bound.dk_tolerance), -2)]
        if grads.dbias is not None and grads.dbias.shape == scores_shape(problem):
            checks.append(("dbias summed over keys", grads.dbias, bound.dbias_tolerance, -1))
        for what, gradient, tolerance, axis in checks:
            total = np.abs(gradient.sum(axis=axis))
            allowed = np.asarray(tolerance).sum(axis=axis)
            found = first_outside(total, allowed)
            if found is not None:
                at = found[0]
                raise PropertyFailure(
                    f"{what}{list(at)} = {total[at]!r}, but should be 0 within "
                    f"{allowed[at]:.3g}: a row's dS sums to 0 over its keys [BWD-1]",
                    problem,
                    kernel,
                )


@register("gradients-gqa-reduction", "BWD-2", kind="fixed", applies=_backward_with("gqa"))
def gradients_gqa_reduction(kernel: KernelUnderTest, seed: int) -> None:
    """dk and dv of a key/value head are the sums over the G query heads that read it
    (h // G), for G = 2, 4 and 8 on one and two key/value heads (multi-query attention
    included): a backward that keeps one query head's contribution, or sums heads
    h mod Hkv, is outside BWD-17's bound."""
    rng = np.random.default_rng(seed + 6)
    for groups, n_kv_heads in ((8, 1), (4, 2), (2, 2)):
        problem = _fixed_problem(
            kernel, rng, n_queries=17, n_keys=33, groups=groups, n_kv_heads=n_kv_heads
        )
        if kernel.declaration.causal:
            problem = problem.with_(is_causal=True)
        grad_out = _upstream(kernel, problem, rng)
        context = f" (GQA: {groups} query heads per key/value head)"
        grads = call_backward(kernel, problem, grad_out, context=context)
        assert_gradients_match(kernel, problem, grad_out, grads, context)


def _bias_shapes(problem: Problem) -> list[tuple[int, ...]]:
    """Bias shapes that broadcast to the scores: one (Lq, Lk) for all, per head, per key."""
    full = scores_shape(problem)
    n_q, n_k = full[-2:]
    shapes = [(n_q, n_k), (*(1,) * (len(full) - 2), n_q, n_k), (*full[:-2], 1, n_k)]
    return [full, *dict.fromkeys(shapes)]


@register("gradients-bias-reduction", "BWD-2", kind="fixed", applies=_backward_with("bias"))
def gradients_bias_reduction(kernel: KernelUnderTest, seed: int) -> None:
    """The bias gradient has the bias's own shape, dS summed over every dimension the bias
    was broadcast along, within BWD-17's bound: (Lq, Lk), (1, 1, Lq, Lk) and per-key
    (B, H, 1, Lk) biases.  Returned unreduced, or averaged instead of summed, it is not."""
    rng = np.random.default_rng(seed + 7)
    base = _fixed_problem(kernel, rng, n_queries=9, n_keys=13, groups=2)
    for shape in _bias_shapes(base):
        bias = kernel.rounded(rng.standard_normal(shape), base.dtype)
        problem = base.with_(bias=bias)
        grad_out = _upstream(kernel, problem, rng)
        context = f" (a bias of shape {shape})"
        grads = call_backward(kernel, problem, grad_out, context=context)
        assert_gradients_match(kernel, problem, grad_out, grads, context)


def _alibi_problems(kernel: KernelUnderTest, seed: int) -> list[Problem]:
    """Lq < Lk and Lq > Lk (the anchor of the declared alignment matters), causal where
    claimed, GQA where claimed, with slopes of every size: Press et al.'s for a kernel that
    computes its own (ALIBI-3), random ones in (0, 1] otherwise."""
    decl = kernel.declaration
    rng = np.random.default_rng(seed)
    found = []
    for n_queries, n_keys in ((9, 23), (23, 9)):
        problem = _fixed_problem(kernel, rng, n_queries=n_queries, n_keys=n_keys, groups=2)
        n_heads = problem.q.shape[-3]
        slopes = (
            np.asarray(standard_alibi_slopes(n_heads), dtype=np.float64)
            if decl.alibi_builtin_slopes
            else kernel.rounded(np.asarray(rng.uniform(0.05, 1.0, n_heads)), "float32")
        )
        problem = problem.with_(alibi_slopes=slopes, is_causal=decl.causal)
        found.append(with_keys(kernel, problem))
    return found


@register("gradients-alibi", "BWD-8", kind="fixed", applies=_backward_with("alibi"))
def gradients_alibi(kernel: KernelUnderTest, seed: int) -> None:
    """With ALiBi (ALIBI-2) the gradients are those of the forward with the same bias, its
    distance anchored as the declared causal alignment anchors it, within BWD-17's bound,
    for Lq < Lk and Lq > Lk: a backward that recomputes the weights without the ALiBi term,
    or from the other corner, is outside it."""
    rng = np.random.default_rng(seed + 11)
    for problem in _alibi_problems(kernel, seed):
        grad_out = _upstream(kernel, problem, rng)
        context = f" (ALiBi, Lq = {problem.q.shape[-2]}, Lk = {problem.k.shape[-2]})"
        grads = call_backward(kernel, problem, grad_out, context=context)
        assert_gradients_match(kernel, problem, grad_out, grads, context)


_lse_differentiated = _backward_unless(
    ("returns_lse",),
    lambda declaration: declaration.backward_fn is not None,
    "the kernel's explicit backward function (FlashAttention's convention) takes no gradient "
    "of the log-sum-exp",
)


@register("gradients-log-sum-exp", "BWD-10", kind="fixed", applies=_lse_differentiated)
def gradients_log_sum_exp(kernel: KernelUnderTest, seed: int) -> None:
    """The log-sum-exp the kernel returns is an output with its own gradient: for upstream
    gradients dO and dlse (and for dlse alone, dO = 0) the gradients are the vector-Jacobian
    product of both outputs, dS = P (dP - D + dlse), within BWD-17's bound; a row with no key
    receives nothing from its dlse (BWD-4).  A backward that treats the log-sum-exp as a
    constant (split-KV training combines partial results through it) is outside it."""
    rng = np.random.default_rng(seed + 12)
    for problem in _exclusion_problems(kernel, seed)[:2]:
        grad_lse = rng.standard_normal(problem.q.shape[:-1]) * 2
        grad_lse = kernel.rounded(grad_lse, "float64" if problem.dtype == "float64" else "float32")
        random = _upstream(kernel, problem, rng)
        for grad_out, what in ((random, "dO and dlse"), (np.zeros_like(random), "dlse alone")):
            context = f" (the log-sum-exp's gradient: {what})"
            grads = call_backward(kernel, problem, grad_out, context=context, grad_lse=grad_lse)
            assert_gradients_match(kernel, problem, grad_out, grads, context, grad_lse)


_dropout_backward = _backward_unless(
    ("dropout", "backward_dropout"),
    lambda declaration: declaration.backward_fn is not None and not declaration.dropout_seeded,
    "an explicit backward function regenerates the forward's keep indicators from the seed "
    "among the forward's keywords, and the kernel takes none (--no-dropout-seeded)",
)
# the dropout probabilities drawn and the width of V = [I | G] past the identity
BACKWARD_DROPOUT_P = (0.2, 0.5)
GENERAL_VALUE_COLUMNS = 4


def _dropout_problem(kernel: KernelUnderTest, dropout_p: float, seed: int) -> Problem:
    """q and k of scores within about +-1 (so that each allowed weight is at least
    e^-2 / Lk) and V = [I | G]: the output's first Lk columns are the kept, rescaled
    weights xi p / (1 - p) (DROP-2), which show the indicators, and E = Ev = Lk + 4."""
    rng = np.random.default_rng(seed)
    n_keys = 16
    problem = _fixed_problem(
        kernel,
        rng,
        n_queries=n_keys,
        n_keys=n_keys,
        head_dim=n_keys + GENERAL_VALUE_COLUMNS,
        n_kv_heads=2,
        magnitude=0.5,
    )
    n_keys = problem.k.shape[-2]
    eye = np.broadcast_to(np.eye(n_keys, problem.v.shape[-1]), problem.v.shape).copy()
    eye[..., n_keys:] = problem.v[..., n_keys:]
    causal = kernel.declaration.causal and dropout_p == BACKWARD_DROPOUT_P[-1]
    return problem.with_(v=eye, dropout_p=dropout_p, seed=seed, is_causal=causal)


def _read_indicators(kernel: KernelUnderTest, problem: Problem, out: np.ndarray) -> np.ndarray:
    """The keep indicators the forward call drew, read off its output's identity columns
    (``_dropout_problem``): kept where the entry is above half the kept value p/(1 - p),
    then the whole output checked against DROP-2 with them within TOL-6.  The reading is
    exact for a forward within TOL-6 where every allowed entry's bound is below half its
    kept value, which the problem is made for (checked: not so is the suite's error)."""
    decl = kernel.declaration
    n_keys = problem.k.shape[-2]
    allowed = allowed_keys(problem, decl)
    kept_value = np.asarray(dropout_bound(problem, decl, allowed)[0])[..., :n_keys]
    keep: np.ndarray = allowed & (out[..., :n_keys] > kept_value / 2)
    expected, tolerance = (np.asarray(a) for a in dropout_bound(problem, decl, keep))
    if np.any(allowed & ~(tolerance[..., :n_keys] < kept_value / 2)):
        raise AssertionError("the dropout problem does not show the indicators within TOL-6")
    assert_within_bound(
        out,
        expected,
        tolerance,
        f"out of the call differentiated, dropout_p={problem.dropout_p} (V = [I | G]: the "
        "first Lk columns are the kept weights p/(1 - p) or 0)",
        problem,
        kernel,
        clause="DROP-2, TOL-6",
    )
    return keep


@register("gradients-dropout", "BWD-9", kind="fixed", applies=_dropout_backward)
def gradients_dropout(kernel: KernelUnderTest, seed: int) -> None:
    """With dropout the backward pass uses the keep indicators its forward call drew: one
    call, differentiated, whose output (V = [I | G]) shows those indicators, gives dq, dk
    and dv within BWD-17's bound of the vector-Jacobian product with them (W = xi P/(1 - p),
    dP = (xi/(1 - p)) dO V^T, D = dO . o), for p = 0.2 and 0.5 (causal where claimed).  A
    backward that draws a mask of its own, ignores the mask or forgets its rescaling is
    outside it.  Deterministic: the indicators are read, not assumed."""
    rng = np.random.default_rng(seed + 13)
    for dropout_p in BACKWARD_DROPOUT_P:
        problem = _dropout_problem(kernel, dropout_p, SEED_DROPOUT + seed)
        grad_out = _upstream(kernel, problem, rng)
        context = f" (dropout_p={dropout_p}, the indicators its forward output shows)"
        grads = call_backward(kernel, problem, grad_out, context=context, with_output=True)
        keep = _read_indicators(kernel, problem, np.asarray(grads.out))
        assert_gradients_match(kernel, problem, grad_out, grads, context, dropout_keep=keep)


def _backward_of_family(family: str, otherwise: str) -> Callable[[KernelDeclaration], str | None]:
    """Applies to a kernel of ``family`` (its own calling convention) that claims a backward;
    ``otherwise`` says why not to the others."""

    def applies(declaration: KernelDeclaration) -> str | None:
        if declaration.family != family:
            return otherwise
        return None if declaration.backward else "the kernel does not claim backward"

    return applies


_packed_backward_claimed = _backward_of_family(
    "varlen", "the kernel takes no packed sequences (varlen)"
)


# (Lq, Lk) of the packed sequences: more keys than queries, fewer, as many
PACKED_LENGTHS = ((5, 4), (3, 6), (7, 7))


@register("gradients-packed", "BWD-11", kind="fixed", applies=_packed_backward_claimed)
def gradients_packed(kernel: KernelUnderTest, seed: int) -> None:
    """Packed sequences with 2 query and 3 key tokens past the last offsets (VARLEN-5): the
    gradient rows of those tokens, which no sequence owns, are exactly 0 (never left
    uninitialised, PyTorch #176793), and each sequence's dq, dk, dv are within BWD-17 of that
    sequence's own gradients (no gradient crosses a boundary); causal in the declared
    alignment where claimed, GQA where claimed."""
    decl = kernel.declaration
    rng = np.random.default_rng(seed + 13)
    dtype = kernel.widest_dtype
    sequences = [
        random_problem(
            kernel,
            rng,
            Dims((), 1, 2 if decl.gqa else 1, n_queries, n_keys, 8, 8),
            dtype,
        ).with_(is_causal=decl.causal)
        for n_queries, n_keys in PACKED_LENGTHS
    ]
    batch = Batch(sequences)
    padding = Padding(queries=2, keys=3, value=0.0)
    args, kwargs = varlen_arguments(kernel, batch, padding=padding)
    total = args[0].shape[0]
    grad_out = kernel.rounded(rng.standard_normal((total, *args[0].shape[1:])), dtype)
    call = BackwardCall(args, kwargs, kernel.backend.asarray(grad_out, dtype), None)
    try:
        raw = kernel.call_gradients(call, batch.first)
    except PropertyFailure:
        raise
    except Exception as exc:
        raise KernelRaised(
            f"the packed backward pass raised {type(exc).__name__}: {str(exc)[:300]} "
            f"[{batch.describe()}] [BWD-11]",
            batch.first,
            kernel,
        ) from exc
    grads = [kernel.numpy(g) for g in raw[:3]]
    starts = [np.cumsum([0, *(s.q.shape[-2] for s in sequences)])]
    starts.append(np.cumsum([0, *(s.k.shape[-2] for s in sequences)]))
    for name, gradient, offsets in zip(
        NAMES[:3], grads, (starts[0], starts[1], starts[1]), strict=True
    ):
        tail = gradient[offsets[-1] :]
        if not np.all(tail == 0):
            at = first_index(tail != 0)
            raise PropertyFailure(
                f"{name}[{offsets[-1] + at[0]}, {list(at[1:])}] = {tail[at]!r}, but token "
                f"{offsets[-1] + at[0]} is past cu_seqlens[-1] = {offsets[-1]}: no sequence owns "
                f"it, so its gradient should be exactly 0 [BWD-11; {batch.describe()}]",
                batch.first,
                kernel,
            )
    for b, sequence in enumerate(sequences):
        rows, keys = (slice(o[b], o[b + 1]) for o in starts)
        bound = gradient_error_bound(
            sequence.q,
            sequence.k,
            sequence.v,
            np.swapaxes(grad_out[rows], 0, 1),
            dtype=dtype,
            is_causal=sequence.is_causal,
            causal_alignment=decl.causal_alignment,
        )
        wanted = zip(grads, (rows, keys, keys), bound[:3], bound[4:7], strict=False)
        for name, (gradient, part, expected, tolerance) in zip(NAMES, wanted, strict=False):
            got = np.swapaxes(gradient[part], 0, 1)
            found = first_outside(np.abs(got - expected), np.asarray(tolerance))
            if found is not None:
                at = found[0]
                raise PropertyFailure(
                    f"{name} of sequence {b}{list(at)} = {got[at]!r}, but should be "
                    f"{np.asarray(expected)[at]!r} within {np.asarray(tolerance)[at]:.3g}, the "
                    f"gradient of that sequence alone [BWD-11, BWD-17; {batch.describe()}]",
                    sequence,
                    kernel,
                )


@register(
    "gradients-sparse",
    "BWD-12",
    applies=_backward_of_family("sparse", "the kernel does not declare a sparse pattern"),
)
def gradients_sparse(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A sparse kernel's gradients are those of dense attention with its pattern's mask,
    within BWD-17's bound, at the lengths its pattern allows (ragged tails, Lq != Lk), and a
    key the pattern lets no query see has dk = dv = 0 exactly: a block-sparse backward that
    leaves the rows of blocks it never visits unwritten, or reads its block list wrongly, is
    caught."""
    problem, mask = draw_sparse_problem(kernel, data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="dO seed"))
    grad_out = _upstream(kernel, problem, rng)
    grads = call_backward(kernel, problem, grad_out)
    unseen = np.asarray(~np.asarray(mask).any(axis=-2))  # (Lk,): keys no query attends
    for name, gradient in (("dk", grads.dk), ("dv", grads.dv)):
        nonzero = unseen[:, None] & ~(gradient == 0)
        if nonzero.any():
            at = first_index(nonzero)
            raise PropertyFailure(
                f"{name}{list(at)} = {gradient[at]!r}, but the pattern lets no query attend key "
                f"{at[-2]}, so its gradient should be exactly 0 [BWD-12, BWD-3]",
                problem,
                kernel,
            )
    dense = problem.with_(mask=mask, extra={})
    assert_gradients_match(kernel, dense, grad_out, grads, " (dense with the pattern's mask)")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint64)


@register("gradients-deterministic", "BWD-15", kind="fixed", applies=_backward_claimed)
def gradients_deterministic(kernel: KernelUnderTest, seed: int) -> None:
    """The same backward call made again on the same inputs and dO returns bitwise the same
    gradients (three calls each, on problems with a mask, causal and GQA, and one of 449
    keys: several key blocks of any usual width): a backward that
    accumulates dq in an order that changes from call to call (atomics) does not."""
    rng = np.random.default_rng(seed + 8)
    # several key blocks of 64 or 128: an order of block sums that changes shows from three
    long = _fixed_problem(kernel, rng, n_queries=65, n_keys=449, groups=2)
    for problem in [*_exclusion_problems(kernel, seed), long]:
        grad_out = _upstream(kernel, problem, rng)
        first = call_backward(kernel, problem, grad_out)
        for again in range(2):
            other = call_backward(kernel, problem, grad_out)
            for name, a, b in zip(NAMES, first[:4], other[:4], strict=True):
                if a is None or b is None or np.array_equal(_bits(a), _bits(b)):
                    continue
                at = first_index(_bits(a) != _bits(b))
                raise PropertyFailure(
                    f"{name}{list(at)} is {a[at]!r} on the first call and {b[at]!r} on call "
                    f"{again + 2} with the same inputs and dO: the backward pass should be "
                    "deterministic [BWD-15]",
                    problem,
                    kernel,
                )


def _has_layouts(backend: Backend) -> str | None:
    if backend.has_strides:
        return None
    return f"{backend.name} arrays have no memory layout: a strided view is a copy"


# (alike in shape to the other fixed properties' registrations: one row of the registry)
@register(
    "gradients-layout-independence",
    "BWD-1",
    kind="fixed",
    applies=_backward_claimed,
    applies_on=_has_layouts,
)
def gradients_layout_independence(kernel: KernelUnderTest, seed: int) -> None:
    """q, k and v passed as non-contiguous views (every other element, every other row,
    transposed storage) give gradients within BWD-17's bound of the definition, as the
    contiguous inputs do: the vector-Jacobian product depends on the values only."""
    rng = np.random.default_rng(seed + 9)
    problem = _fixed_problem(kernel, rng, n_queries=33, n_keys=65, groups=2)
    for layout in ("strided", "strided_rows", "transposed"):
        args, kwargs = kernel.arguments(problem)
        args = tuple(
            laid_out(kernel.backend, getattr(problem, name), problem.dtype, layout)
            for name in "qkv"
        )
        grad_out = _upstream(kernel, problem, rng)
        context = f" (q, k, v {layout})"
        grads = call_backward(kernel, problem, grad_out, (args, kwargs), context)
        assert_gradients_match(kernel, problem, grad_out, grads, context)


# --- batch composition (BWD-19) ----------------------------------------------------------

# The magnitudes of the companions a batch element gets: as drawn, and with scores some
# hundreds larger than the element's (a row maximum shared over the batch then underflows
# the element's weights to 0)
COMPANION_MAGNITUDES = (1.0, 16.0)


def batch_element(a: np.ndarray, full_ndim: int, index: tuple[int, ...]) -> np.ndarray:
    """Batch element ``index`` of ``a``, right-aligned against an array of ``full_ndim``
    dims whose first ``len(index)`` are the batch: its batch axes kept with size 1 (an
    axis ``a`` broadcasts along, or leaves out, as it is)."""
    offset = full_ndim - a.ndim
    return a[
        tuple(
            slice(index[axis + offset], index[axis + offset] + 1)
            if axis + offset < len(index) and a.shape[axis] > 1
            else slice(None)
            for axis in range(a.ndim)
        )
    ]


def _per_element(a: np.ndarray, full_ndim: int, batch: tuple[int, ...]) -> bool:
    """Whether ``a`` has its own values for every batch element (no batch broadcast)."""
    offset = full_ndim - a.ndim
    return all(
        size == 1 or (axis >= offset and a.shape[axis - offset] == size)
        for axis, size in enumerate(batch)
    )


def _batch_in_calls(declaration: KernelDeclaration) -> str | None:
    reason = needs("backward")(declaration)
    if reason is None and declaration.batch_ndim == 0:
        reason = "the kernel takes no batch dimension (batch_ndim=0)"
    return reason


def _composed(
    kernel: KernelUnderTest, data: st.DataObject
) -> tuple[Problem, np.random.Generator, bool] | None:
    """A drawn problem of two batch elements or more (None on an anchor of one element,
    the largest problems, which a second element would double, and where --max-batch-heads
    leaves no room for a second), with a bias of its own per element
    where the shapes are not pooled (one broadcast over the batch gets the sum of every
    element's dS, BWD-2, so its gradient is not one element's), the generator of its
    values, and whether its shapes are pooled."""
    pooled = pooling(data)
    dims = draw_dims(data, kernel, where=lambda dims: math.prod(dims.batch) >= 2)
    if math.prod(dims.batch) < 2 and current().stratum.anchor is not None:
        return None  # a single long problem: a second element would double the largest
    if math.prod(dims.batch) < 2:  # a second batch element (an unpooled shape)
        if 2 * dims.batch_heads > current().limits.max_batch_heads:
            return None
        dims = replace(dims, batch=(2, *(dims.batch or (1,))[1:]))
    problem, rng = _drawn_for_gradients(kernel, data, dims)
    bias, batch = problem.bias, problem.q.shape[:-3]
    if bias is not None and not pooled:
        heads = bias.shape[-3] if bias.ndim >= 3 else 1
        bias = np.array(np.broadcast_to(bias, (*batch, heads, *bias.shape[-2:])))
        problem = problem.with_(bias=bias)
    return problem, rng, pooled


@register("gradients-batch-composition", "BWD-19", applies=_batch_in_calls)
def gradients_batch_composition(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """One batch element's dq, dk, dv (and its bias's gradient, where the bias is its own)
    are the same, within twice BWD-17's bound of that element, in the drawn batch, in the
    same batch with every other element's inputs and dO renewed (of the drawn magnitude or
    16 times it), and (where shapes are not pooled: a compiled kernel would compile another
    batch size) alone in a batch of one: each is within BWD-17's bound of the same
    definition, a function of that element's inputs alone.  dK/dV or a bias gradient summed
    over the batch, or a row maximum of the recomputed weights shared across batch
    elements, are not.  Drawn on every stratum; of the anchors, those that are batches
    already (a single long anchor, the largest problem, is not doubled)."""
    composed = _composed(kernel, data)
    if composed is None:
        kernel.note(
            "not run on anchors of one batch element, nor where --max-batch-heads "
            "leaves no batch of 2 at the heads drawn"
        )
        return
    problem, rng, pooled = composed
    batch = problem.q.shape[:-3]
    flat = data.draw(st.integers(0, math.prod(batch) - 1), label="batch element")
    index = tuple(int(i) for i in np.unravel_index(flat, batch))
    magnitude = data.draw(st.sampled_from(COMPANION_MAGNITUDES), label="companions' magnitude")
    full = len(batch) + 3

    def element(a: np.ndarray | None, ndim: int = full) -> Any:
        return None if a is None else batch_element(a, ndim, index)

    def renewed(a: np.ndarray, scale: float) -> np.ndarray:
        fresh = random_values(kernel, rng, a.shape, problem.dtype, scale)
        fresh[index] = a[index]
        return fresh

    grad_out = _upstream(kernel, problem, rng)
    companions = problem.with_(**{n: renewed(getattr(problem, n), magnitude) for n in "qkv"})
    calls = [
        ("in the drawn batch", problem, grad_out),
        ("among renewed companions", companions, renewed(grad_out, 1.0)),
    ]
    alone = problem.with_(
        q=element(problem.q),
        k=element(problem.k),
        v=element(problem.v),
        mask=element(problem.mask),
        bias=element(problem.bias),
        alibi_slopes=element(problem.alibi_slopes, len(batch) + 1),
    )
    if not pooled:
        calls.append(("alone in a batch of one", alone, element(grad_out)))
    found = [(what, p, call_backward(kernel, p, d, context=f" ({what})")) for what, p, d in calls]
    first = found[0][2]
    bound = expected_gradients(kernel, alone, element(grad_out), element(first.bias))
    tolerances = (bound.dq_tolerance, bound.dk_tolerance, bound.dv_tolerance)
    compared = list(zip(NAMES[:3], tolerances, strict=True))
    if first.bias is not None and _per_element(first.bias, full, batch):
        compared.append(("dbias", bound.dbias_tolerance))
    for name, tolerance in compared:
        allowed = 2 * np.asarray(tolerance)
        expected = element(first.named()[name])
        for what, other, grads in found[1:]:
            got = element(grads.named()[name])  # an element alone: as it is
            outside = first_outside(np.abs(got - expected), allowed)
            if outside is not None:
                at, count = outside
                raise PropertyFailure(
                    f"{name}{list(at)} of batch element {list(index)} is {got[at]!r} "
                    f"{what} and {expected[at]!r} in the drawn batch {list(batch)}, but should "
                    f"be the same within {allowed[at]:.3g} (twice its BWD-17 bound); "
                    f"{count} of {got.size} elements outside [BWD-19]",
                    other,
                    kernel,
                )


__all__ = ["Gradients", "assert_gradients_match", "call_backward", "expected_gradients"]
