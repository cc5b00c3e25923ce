"""What several property modules share: the values TOL-2 compares, the output
shape and dtype checks (SDPA-1.3), problems drawn with the features a kernel claims
(softcap, ALiBi) or of its own family (sparse, linear), and inputs passed in another
memory layout (strided, transposed, stride-0 views: SDPA-1.7 and SDPA-7.8).

Property modules import these from here, never from each other, so each property module
is a leaf and the registry can list them in clause order.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import array_api_compat
import numpy as np
from hypothesis import strategies as st

from ....backends import FLOAT_DTYPE_NAMES, Backend
from ....backends._registry import numpy_namespace
from ....reference.features import alibi_slopes as standard_slopes
from ....reference.sparse.masks import sparse_mask
from ....reference.tolerance import score_errors
from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw import shape_pool
from ...draw.input_features import scores_shape
from ...draw.sizes import Dims, current, realistic
from ...draw.strategies import (
    draw_dims,
    draw_dtype,
    draw_problem,
    draw_rng,
    random_problem,
    within_limitations,
)
from ..assertions import assert_shape
from ..bounds import definition_keywords
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest

# Key counts one past a power of two, where tiled kernels meet a partial block: pytorch
# #191937 (stride-0 K/V wrong when Lk % 32 == 1); 1 is the degenerate row of one key.
AWKWARD_KEY_COUNTS = (33, 1, 65)


def awkward_key_counts() -> tuple[int, ...]:
    """The AWKWARD_KEY_COUNTS within the user's ``--max-len`` (a size cap holds for every
    draw, spec/index.md section 7)."""
    return tuple(n for n in AWKWARD_KEY_COUNTS if n <= current().limits.max_len)


def with_awkward_key_count(data: st.DataObject, kernel: KernelUnderTest, dims: Dims) -> Dims:
    """``dims`` of a small draw with Lk often one of AWKWARD_KEY_COUNTS (Lq = Lk kept for
    ``equal_lengths``); realistic strata draw their own block boundaries.  On a backend
    that compiles per shape the pooled small shapes are kept as drawn (each awkward count
    would be a new compilation per pooled shape); its realistic strata still meet block
    boundaries."""
    if realistic() or shape_pool.pooling(data):
        return dims
    choices = (dims.n_keys, dims.n_keys, *awkward_key_counts())
    n_keys = data.draw(st.sampled_from(choices), label="Lk")
    return within_limitations(kernel, replace(dims, n_keys=n_keys))


# TOL-2 holds for every score error, but grows like 1/(1 - D_i): beyond D_i = 1/4 a
# comparison can catch little, so value comparisons keep problems below it.
VALID_SCORE_ERROR = 0.25


def _group_heads(problem: Problem, a: np.ndarray) -> np.ndarray:
    """A key-side array ``(..., Hkv, Lk, ·)`` repeated per query head: head h uses h // G."""
    groups = problem.q.shape[-3] // problem.k.shape[-3]
    return np.repeat(a, groups, axis=-3)


def pair_score_magnitudes(problem: Problem) -> np.ndarray:
    """|alpha| A_ij of TOL-2 for every pair (allowed or not), ``(..., Hq, Lq, Lk)``."""
    head_dim, n_kv = problem.q.shape[-1], problem.k.shape[-3]
    scale = 1.0 / math.sqrt(head_dim) if problem.scale is None else abs(problem.scale)
    keys = np.repeat(np.abs(problem.k), problem.q.shape[-3] // max(n_kv, 1), axis=-3)
    magnitudes: np.ndarray = scale * (np.abs(problem.q) @ np.swapaxes(keys, -1, -2))
    return magnitudes


def row_score_errors(problem: Problem, declaration: KernelDeclaration | None = None) -> np.ndarray:
    """D_i of TOL-2 for every query row of ``problem`` (0 for rows with no allowed key)."""
    alignment = "top_left" if declaration is None else declaration.causal_alignment
    return np.asarray(
        score_errors(
            problem.q,
            problem.k,
            problem.v,
            **definition_keywords(problem, alignment, features=False),
        )
    )


def score_error(problem: Problem) -> float:
    """max_i D_i of TOL-2: how far the score errors a kernel may make can move a row's
    weights (relative, weighted by the weights themselves)."""
    errors = row_score_errors(problem)
    return float(np.max(errors)) if errors.size else 0.0


def within_validity(kernel: KernelUnderTest, problem: Problem) -> Problem:
    """``problem`` with q scaled by a power of two until D_i <= 1/4 (TOL-2 tight).

    Properties that compare values within TOL-2 use this, so that the bound stays tight
    enough to catch errors (it holds for any D, spec/tolerance.md).  Rows whose bias alone
    puts them beyond 1/4 (every key padded with a huge finite bias: their weights are not
    determined by the arithmetic SDPA-7.2 allows) keep TOL-2's hull bound and are left out
    of the target.
    """
    errors = row_score_errors(problem, kernel.declaration)
    if errors.size == 0 or np.max(errors) <= VALID_SCORE_ERROR:
        return problem
    unscaled = problem.with_(q=np.zeros_like(problem.q))
    reachable = row_score_errors(unscaled, kernel.declaration) < VALID_SCORE_ERROR
    if not np.any(reachable & (errors > VALID_SCORE_ERROR)):
        return problem
    scaled = problem
    for halvings in range(1, 2100):  # a float64 q underflows to 0 within 1100 halvings
        q = kernel.rounded(problem.q * 2.0**-halvings, problem.dtype)
        scaled = problem.with_(q=q)
        errors = row_score_errors(scaled, kernel.declaration)
        if np.all(errors[reachable] <= VALID_SCORE_ERROR):
            return scaled
    return scaled


def values_per_query(problem: Problem) -> np.ndarray:
    """V broadcast to ``(*batch, Hq, Lk, Ev)``: the values each query head attends."""
    v = _group_heads(problem, problem.v)
    shape = scores_shape(problem)
    return np.broadcast_to(v, (*shape[:-2], *v.shape[-2:]))


def dtype_name(backend: Backend, dtype: Any) -> str:
    """The spec's name ("float16", ...) of a backend dtype, or its repr if it has none."""
    for name in FLOAT_DTYPE_NAMES:
        if name in backend.dtype_names and dtype == backend.dtype(name):
            return name
    return str(dtype)


def call_text(kernel: KernelUnderTest) -> str:
    return f"{getattr(kernel.fn, '__name__', 'kernel')}(q, k, v)"


def _require_array(x: Any, what: str, problem: Problem, kernel: KernelUnderTest) -> None:
    if not array_api_compat.is_array_api_obj(x):
        raise PropertyFailure(
            f"{what} is a {type(x).__name__}, but should be an array [SDPA-1.3, "
            f"{call_text(kernel)}]",
            problem,
            kernel,
        )


def _expected_shapes(problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(out shape, weights shape): (*batch, Hq, Lq, Ev) and (*batch, Hq, Lq, Lk)."""
    scores = scores_shape(problem)
    return (*scores[:-1], problem.v.shape[-1]), scores


def assert_output_shapes(
    kernel: KernelUnderTest,
    problem: Problem,
    out: Any,
    weights: Any,
) -> None:
    """Raw ``out`` is a (*batch, Hq, Lq, Ev) array, ``weights`` (if any) (*batch, Hq, Lq, Lk)."""
    out_shape, weights_shape = _expected_shapes(problem)
    _require_array(out, "out", problem, kernel)
    assert_shape(out, out_shape, "out", problem, kernel)
    if weights is not None:
        _require_array(weights, "weights", problem, kernel)
        assert_shape(weights, weights_shape, "weights", problem, kernel)


def assert_output_shape_and_dtype(
    kernel: KernelUnderTest,
    problem: Problem,
    out: Any,
    weights: Any = None,
) -> None:
    """SDPA-1.3 for one raw result: shapes as ``assert_output_shapes``, dtype q's."""
    assert_output_shapes(kernel, problem, out, weights)
    for what, result in (("out", out), ("weights", weights)):
        if result is not None and result.dtype != kernel.backend.dtype(problem.dtype):
            raise PropertyFailure(
                f"{what}.dtype={dtype_name(kernel.backend, result.dtype)}, but should be "
                f"{problem.dtype}, the dtype of q [SDPA-1.3, {call_text(kernel)}]",
                problem,
                kernel,
            )


SOFTCAPS = (1.0, 2.5, 8.0, 30.0, 50.0)  # Gemma 2 caps attention logits at 50


SLOPE_FACTORS = (1.0, 0.25, 4.0)


def draw_softcap(data: st.DataObject) -> float:
    return data.draw(st.sampled_from(SOFTCAPS), label="softcap")


def draw_alibi_slopes(data: st.DataObject, kernel: KernelUnderTest, dims: Dims) -> np.ndarray:
    """Slopes of ALIBI-1: the standard ones (ALIBI-3) for a kernel that computes its own,
    exact in float64 (ALIBI-3 defines the values, not their float32 roundings: a float64
    kernel must not be judged against float32 slopes); otherwise ``(Hq,)`` or
    ``(*batch, Hq)``, standard slopes times a factor or uniform ones, as float64 values
    exact in float32 (the dtype the suite passes them in)."""
    n_heads = dims.n_q_heads
    standard = np.asarray(_standard(n_heads), dtype=np.float64)
    if kernel.declaration.alibi_builtin_slopes:
        return standard
    rng = draw_rng(data)
    if data.draw(st.booleans(), label="uniform slopes"):
        slopes = rng.uniform(0.01, 1.0, n_heads)
    else:
        slopes = standard * data.draw(st.sampled_from(SLOPE_FACTORS), label="slope factor")
    if len(dims.batch) > 0 and data.draw(st.booleans(), label="per-batch slopes"):
        slopes = slopes * rng.uniform(0.5, 2.0, (*dims.batch, 1))
    return slopes.astype(np.float32).astype(np.float64)


def _standard(n_heads: int) -> list[float]:
    return [float(s) for s in standard_slopes(n_heads, xp=numpy_namespace(), dtype=np.float64)]


def with_claimed_features(
    data: st.DataObject,
    kernel: KernelUnderTest,
    problem: Problem,
    dims: Dims,
    *,
    softcap: bool | None = None,
    alibi: bool | None = None,
) -> Problem:
    """``problem`` with the features the kernel claims: each drawn ("maybe") unless
    ``softcap``/``alibi`` say always (True) or never (False)."""
    decl = kernel.declaration
    if (
        decl.softcap
        and softcap is not False
        and (softcap or data.draw(st.booleans(), label="with softcap"))
    ):
        problem = problem.with_(softcap=draw_softcap(data))
    if (
        decl.alibi
        and alibi is not False
        and (alibi or data.draw(st.booleans(), label="with ALiBi"))
    ):
        problem = problem.with_(alibi_slopes=draw_alibi_slopes(data, kernel, dims))
    return problem


def pattern_mask(kernel: KernelUnderTest, n_queries: int, n_keys: int) -> np.ndarray:
    """The declared pattern's boolean (Lq, Lk) mask, as NumPy."""
    claim = kernel.declaration.sparse
    assert claim is not None
    return np.asarray(
        sparse_mask(
            claim.pattern,
            n_queries,
            n_keys,
            alignment=claim.alignment,
            causal=claim.causal,
            xp=numpy_namespace(),
            **dict(claim.params),
        )
    )


def pinned_lengths(pattern: str, params: dict[str, object]) -> tuple[tuple[int, int], ...] | None:
    """Length ranges a pattern's parameters fix: a block layout of (nqb, nkb) blocks of
    size (bq, bk) needs Lq in ((nqb - 1) bq, nqb bq], likewise Lk (ragged last block)."""
    if pattern != "block_sparse":
        return None
    layout = np.asarray(params["layout"])
    size = params["block_size"]
    sizes = (size, size) if isinstance(size, int) else tuple(size)  # type: ignore[arg-type]
    return tuple(
        ((blocks - 1) * block + 1, blocks * block)
        for blocks, block in zip(layout.shape, sizes, strict=True)
    )


def draw_sparse_problem(
    kernel: KernelUnderTest,
    data: st.DataObject,
    weights: bool = False,
) -> tuple[Problem, np.ndarray]:
    """Sizes long enough to show the pattern's structure, ragged tails and Lq != Lk (a
    block-sparse layout pins the lengths); ``weights``: observed through V = I."""
    claim = kernel.declaration.sparse
    assert claim is not None
    dims = draw_dims(data, kernel, min_queries=1, min_keys=1, max_len=17, weights=weights)
    lengths = pinned_lengths(claim.pattern, dict(claim.params))
    if lengths is not None:
        (q_low, q_high), (k_low, k_high) = lengths
        dims = replace(
            dims,
            n_queries=data.draw(st.integers(q_low, q_high), label="Lq"),
            n_keys=data.draw(st.integers(k_low, k_high), label="Lk"),
        )
    dtype = draw_dtype(data, kernel)
    rng = draw_rng(data)
    problem = random_problem(
        kernel, rng, dims, dtype, extra=dict(claim.params) if claim.pass_params else {}
    )
    return problem, pattern_mask(kernel, dims.n_queries, dims.n_keys)


def draw_any_problem(data: st.DataObject, kernel: KernelUnderTest) -> Problem:
    """A problem of the kernel's own family: dense (``draw_problem``), sparse (its declared
    pattern, at lengths the pattern allows) or linear (no mask, bias or scale; a seed for
    FAVOR+ kernels), for properties that hold for every attention kernel."""
    declaration = kernel.declaration
    if declaration.sparse is not None:
        return draw_sparse_problem(kernel, data)[0]
    if declaration.linear is None:
        return draw_problem(data, kernel)
    problem = draw_problem(data, kernel, mask="never", bias="never", scale="never")
    if declaration.linear.feature_map == "favor+":
        problem.extra[declaration.linear.seed_keyword] = data.draw(
            st.integers(0, 2**16), label="seed"
        )
    return problem


def call_with(
    kernel: KernelUnderTest,
    problem: Problem,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    context: str = "",
) -> tuple[Any, Any]:
    """(out, weights or None) for hand-built backend arguments describing ``problem``.

    Like ``KernelUnderTest.call_on``, a kernel exception becomes a failure that shows the
    problem (and ``context``, e.g. how the arguments were laid out); used where the
    arguments are views or must be inspected after the call.
    """
    result = kernel.call_checked(args, kwargs, problem, context)
    return kernel.split(result, problem)


def _interleaved(values: np.ndarray, axis: int) -> np.ndarray:
    """``values`` interleaved with filler along ``axis`` (-1 or -2): even positions hold
    the values, odd ones NaN (False for masks), which only a stride-ignoring kernel reads."""
    filler = ~values if values.dtype == bool else np.full_like(values, np.nan)
    stacked = np.stack([values, filler], axis=axis)
    shape = list(values.shape)
    shape[axis] *= 2
    return stacked.reshape(shape)


def laid_out(
    backend: Backend,
    values: np.ndarray,
    dtype: str | None,
    layout: str,
    shape: tuple[int, ...] | None = None,
) -> Any:
    """A backend array equal to ``values`` (broadcast to ``shape`` for "broadcast") whose
    memory layout is ``layout``, built as a view with the backend's Array API namespace
    (a backend whose arrays have no strides, JAX, never gets here: layout-independence
    does not apply to it)."""
    xp = backend.xp
    if layout == "strided":  # every other element of the innermost axis
        return backend.asarray(_interleaved(values, -1), dtype)[..., ::2]
    if layout == "strided_rows":  # every other row
        return backend.asarray(_interleaved(values, -2), dtype)[..., ::2, :]
    if layout == "transposed":  # a contiguous (..., E, L) array seen as (..., L, E)
        stored = np.ascontiguousarray(np.swapaxes(values, -1, -2))
        return xp.matrix_transpose(backend.asarray(stored, dtype))
    if layout == "broadcast":  # stride 0 along every axis where values has size 1
        return xp.broadcast_to(backend.asarray(values, dtype), shape or values.shape)
    return backend.asarray(values, dtype)


def output_laid_out(
    kernel: KernelUnderTest, problem: Problem, layouts: dict[str, str], context: str
) -> np.ndarray:
    """The kernel's output (float64) for ``problem`` with q, k and v passed as views of
    ``layouts`` (input name -> a layout of :func:`laid_out`; the others contiguous); an
    exception the kernel raises is a failure that shows ``problem`` and ``context``."""
    args, kwargs = kernel.arguments(problem)
    args = tuple(
        laid_out(kernel.backend, getattr(problem, name), problem.dtype, layouts.get(name, ""))
        for name in "qkv"
    )
    out, _ = call_with(kernel, problem, args, kwargs, context)
    return kernel.numpy(out)


def arrays_have_layouts(backend: Backend) -> str | None:
    """None where the backend's arrays have strides, else why a layout means nothing."""
    if backend.has_strides:
        return None
    return (
        f"{backend.name} arrays have no memory layout (a strided, transposed or broadcast view "
        "is a copy, contiguous like any other array): SDPA-1.7 constrains nothing there"
    )


# Sinks near the scores, far above them (the sink takes almost every row's whole weight) and
# far below (almost no effect), as trained gpt-oss sinks span
SINK_SCALES = (1.0, 8.0)
SINK_SHIFTS = (0.0, 6.0, -30.0)


def draw_sinks(data: st.DataObject, n_heads: int) -> np.ndarray:
    """Sink logits ``(n_heads,)`` of SINK-1 (the sinks and paged-batch properties)."""
    scale = data.draw(st.sampled_from(SINK_SCALES), label="sink spread")
    shift = data.draw(st.sampled_from(SINK_SHIFTS), label="sink shift")
    seeded = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="sinks seed"))
    # float64 values exact in float32: the sinks are passed as float32
    return (seeded.standard_normal(n_heads) * scale + shift).astype(np.float32).astype(np.float64)


def has_float8(backend: Backend) -> str | None:
    """Why ``backend`` cannot run a float8 property (QUANT-1), or None."""
    if backend.float8_names:
        return None
    return f"{backend.name} has no float8 dtype (QUANT-1): check a float8 kernel on torch"


def as_float8(backend: Backend, stored: np.ndarray, fmt: str) -> Any:
    """``stored`` (on ``fmt``'s grid) as a float8 array: exact through float32."""
    return backend.xp.astype(backend.asarray(stored, "float32"), backend.dtype(fmt))


def call_family_kernel(
    kernel: KernelUnderTest, arrays: tuple[Any, ...], keywords: dict[str, Any], what: str, call: str
) -> Any:
    """``kernel.call_raw(arrays, keywords)`` with the declaration's extra keywords under
    ``keywords``; :class:`KernelRaised` naming the ``what`` kernel and ``call`` (the call in
    words) when it raises."""
    try:
        return kernel.call_raw(arrays, {**kernel.declaration.extra_kwargs, **keywords})
    except Exception as exc:
        raise KernelRaised(
            f"the {what} kernel raised {type(exc).__name__}: {str(exc)[:300]} [call: {call}]"
        ) from exc


def descale_keywords(kernel: KernelUnderTest, descales: dict[str, np.ndarray]) -> dict[str, Any]:
    """The float8 ``descales`` (by the reference's names, float64 values exact in float32)
    as the kernel takes them: float32 arrays under FlashAttention 3's keywords, or beside a
    float8 cache FlashInfer's ``k_scale``, ``v_scale`` (QUANT-8), a per-tensor one as a
    Python float as FlashInfer's ``run`` takes it."""
    claim = kernel.declaration.fp8
    assert claim is not None  # only for a kernel that declares float8 inputs
    names = claim.descale_keywords
    return {
        names[name]: float(d.reshape(-1)[0])
        if claim.kv_only and claim.descale == "tensor"
        else kernel.backend.asarray(d, "float32")
        for name, d in descales.items()
    }
