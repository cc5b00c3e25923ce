"""The memory-efficient reference pinned to the plain one (SDPA-7.1, SDPA-7.3, TOL-2).

``blocked_attention`` computes SDPA-7.1 by online softmax over query chunks and key
blocks.  Hypothesis draws the problems the conformance suite draws (batch broadcasting,
GQA, Lq != Lk, masks of every broadcast shape with fully masked rows, biases with -inf and
finfo.min, both causal alignments, explicit scales, Lk = 0, non-finite inputs) together
with block sizes from 1 to one past the length, so every block-boundary case occurs:
blocks that divide the length, ragged last blocks, one block, blocks longer than the
sequence.  On every CPU backend and dtype the result must be within TOL-2 of the plain
formulation in float64 (TOL-1: on the values the computation received), be exactly 0 where
the plain reference is (SDPA-5), and be NaN or infinite exactly where the plain reference
is in the same dtype (SDPA-8.3).
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from problems import broadcast_to_some, problem_of_shapes
from support import as64, on_backend, seen_by_kernel

from attnspec.backends import Backend
from attnspec.reference import (
    blocked_attention,
    default_block_sizes,
    plain_attention,
)
from attnspec.reference.blocked import KEY_BLOCK, MIN_QUERY_CHUNK, SCORES_PER_BLOCK
from attnspec.reference.tolerance import UNIT_ROUNDOFF, accumulation_roundoff, error_bound

# JAX compiles every operation for every new shape: it runs the fixed cases of
# JAX_CASES instead of drawn ones (below).
EXAMPLES = {"numpy": 150, "array_api_strict": 60, "torch": 60}
LOWEST = {
    "float16": -65504.0,
    "bfloat16": -(2 - 2.0**-7) * 2.0**127,
    "float32": float(np.finfo(np.float32).min),
    "float64": float(np.finfo(np.float64).min),
}
NON_FINITE = (np.nan, np.inf, -np.inf)


def examples(backend: Backend) -> settings:
    """Drawn examples for every backend but JAX, which runs the explicit ones only."""
    drawn = settings(
        max_examples=EXAMPLES.get(backend.name, 20),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    return settings(drawn, phases=[Phase.explicit]) if backend.name == "jax" else drawn


Blocks = dict[str, int | None]  # blocked_attention's query_chunk and key_block
Case = tuple[dict[str, Any], str, Blocks]  # a problem (tests/problems.py), a dtype, blocks


@st.composite
def cases(draw: st.DrawFn, dtypes: tuple[str, ...]) -> Case:
    """A problem, a dtype to run it in and the block sizes to run it with."""
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2), label="batch"))
    n_kv = draw(st.integers(1, 2), label="Hkv")
    groups = draw(st.integers(1, 3), label="G")
    n_q, n_k = draw(st.integers(0, 11), label="Lq"), draw(st.integers(0, 11), label="Lk")
    dim = draw(st.integers(1, 4), label="E")
    value_dim = draw(st.integers(1, 3), label="Ev")
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    magnitude = draw(st.sampled_from([1.0, 3.0, 10.0]), label="magnitude")
    scores_shape = (*batch, n_kv * groups, n_q, n_k)
    problem: dict[str, Any] = {
        "q": rng.standard_normal((*batch, n_kv * groups, n_q, dim)) * magnitude,
        "k": rng.standard_normal((*batch, n_kv, n_k, dim)) * magnitude,
        "v": rng.standard_normal((*batch, n_kv, n_k, value_dim)),
    }
    if draw(st.booleans(), label="mask"):
        mask = rng.random(broadcast_to_some(draw, scores_shape, 1)) < 0.6
        if mask.ndim > 1 and mask.shape[-2] and draw(st.booleans(), label="blank a row"):
            mask[..., rng.integers(mask.shape[-2]), :] = False
        problem["mask"] = mask
    if draw(st.booleans(), label="bias"):
        bias = rng.standard_normal(broadcast_to_some(draw, scores_shape, 1)) * 3
        bias[rng.random(bias.shape) < 0.15] = -np.inf
        bias[rng.random(bias.shape) < 0.1] = LOWEST[dtype]
        problem["bias"] = bias
    if draw(st.booleans(), label="causal"):
        problem["is_causal"] = True
        problem["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.booleans(), label="explicit scale"):
        problem["scale"] = draw(st.sampled_from([0.5, 0.0, -0.75, 2.0]), label="scale")
    if draw(st.booleans(), label="non-finite inputs"):
        for name in ("q", "k", "v", "bias"):
            if name in problem and problem[name].size:
                flat = problem[name].reshape(-1)
                flat[rng.integers(flat.size, size=2)] = rng.choice(NON_FINITE, size=2)
    blocks = {
        "query_chunk": draw(st.none() | st.integers(1, n_q + 1), label="query_chunk"),
        "key_block": draw(st.none() | st.integers(1, n_k + 1), label="key_block"),
    }
    return problem, dtype, blocks


def value_range(seen: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output element, min and max of its value column over S(i) (SDPA-7.1: mask, causal
    rule, bias != -inf) and max |v| there; query head h reads key/value head h // G."""
    q, v = seen["q"], seen["v"]
    n_q, n_k = q.shape[-2], v.shape[-2]
    groups = q.shape[-3] // v.shape[-3]
    batch = np.broadcast_shapes(q.shape[:-3], seen["k"].shape[:-3], v.shape[:-3])
    values = np.repeat(np.broadcast_to(v, (*batch, *v.shape[-3:])), groups, axis=-3)
    allowed = np.ones((*batch, q.shape[-3], n_q, n_k), dtype=bool)
    if "mask" in seen:
        allowed = allowed & seen["mask"]
    if "bias" in seen:
        allowed = allowed & (seen["bias"] != -np.inf)
    if seen.get("is_causal"):
        offset = 0 if seen.get("causal_alignment", "top_left") == "top_left" else n_k - n_q
        allowed = allowed & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset)
    # (..., Lq, Lk, 1) against (..., 1, Lk, Ev)
    allowed, values = allowed[..., None], values[..., None, :, :]
    low = np.min(np.where(allowed, values, np.inf), axis=-2, initial=np.inf)
    high = np.max(np.where(allowed, values, -np.inf), axis=-2, initial=-np.inf)
    largest = np.max(np.where(allowed, np.abs(values), 0.0), axis=-2, initial=0.0)
    return low, high, largest


def assert_blocked_matches_plain(
    backend: Backend, problem: dict[str, Any], dtype: str, blocks: Blocks
) -> None:
    moved = on_backend(backend, problem, dtype)
    got = blocked_attention(**moved, **blocks)
    plain, weights = plain_attention(**moved, return_weights=True)
    where = (
        f"{backend.name} {dtype} {blocks} q{tuple(problem['q'].shape)} "
        f"k{tuple(problem['k'].shape)} "
        + " ".join(n for n in ("mask", "bias", "is_causal", "scale") if n in problem)
    )
    # SDPA-1.3: shape and dtype.
    assert tuple(got.shape) == tuple(plain.shape) and got.dtype == plain.dtype, where
    got64, plain64 = as64(backend, got), as64(backend, plain)
    # SDPA-8.3 / TOL-3: NaN and each infinity exactly where the plain reference has them.
    for kind in (np.isnan, np.isposinf, np.isneginf):
        assert np.array_equal(kind(got64), kind(plain64)), f"{where}: {kind.__name__} differs"
    # SDPA-5.1 / SDPA-5.2: a row with no allowed key is exactly 0.
    empty = np.sum(as64(backend, weights), axis=-1) == 0
    assert np.all(got64[empty] == 0), f"{where}: empty rows are not exactly 0"
    # SDPA-7.3 / TOL-2 against the plain formulation evaluated in float64.
    seen = seen_by_kernel(backend, moved)
    bound = error_bound(**seen, dtype=dtype)
    exact, tolerance = np.asarray(bound.out), np.asarray(bound.out_tolerance)
    bounded = np.isfinite(exact) & np.isfinite(tolerance)
    error = np.abs(got64[bounded] - exact[bounded])
    assert np.all(error <= tolerance[bounded]), (
        f"{where}: error {np.max(error / tolerance[bounded]):.3g} x TOL-2"
    )
    # A finfo.min bias on an allowed pair makes delta_i of TOL-2 infinite: the bound says
    # nothing there (and evaluates to inf * 0 = NaN when N = M = 0).  SDPA-7.1 still puts
    # the output inside the range of the allowed values, up to the rounding of a convex
    # combination (TOL-2's (u_d + (Lk + 2) u_a) M term with C = 4, M <= max |v|).
    vacuous = np.isfinite(exact) & ~np.isfinite(tolerance)
    if np.any(vacuous):
        low, high, largest = value_range(seen)
        u_d = UNIT_ROUNDOFF[dtype]
        slack = 4 * (u_d + (problem["k"].shape[-2] + 2) * accumulation_roundoff(dtype))
        slack = slack * largest
        inside = (got64 >= low - slack) & (got64 <= high + slack)
        assert np.all(inside[vacuous]), f"{where}: outside the range of the allowed values"


def several_default_blocks() -> Case:
    """Default block sizes where they split the problem (Lk larger than one key block,
    several query chunks), causal bottom-right with Lq != Lk, a mask.  Two whole query
    chunks (Lq = 512, chunks of 256): each chunk reads its keys in one block and one
    block across the diagonal, both diagonal blocks of one shape; a ragged third chunk
    (Lq = 700 before) was two more block shapes, each a compilation of every per-block
    operation on JAX (148 compilations then, 101 now; the drawn block sizes split raggedly)."""
    n_q, n_k = 512, 1100
    problem = problem_of_shapes(
        q=(2, 2, n_q, 8),
        k=(2, 1, n_k, 8),
        v=(2, 1, n_k, 4),
        mask=(n_q, n_k),
        is_causal=True,
        causal_alignment="bottom_right",
        seed=7,
    )
    return problem, "float32", {}


def rising_large_scores(backend_name: str) -> Case:
    """SDPA-7.4 across blocks: scores near the float32 limit of exp, rising block by block,
    so every block rescales what came before.  JAX: the same on the shapes and blocks of
    JAX_CASES' one-key-block case (three blocks, each rescaling; scores -30000, 0, 30000),
    whose compilations it reuses (64 keys in blocks of 7: 83 compilations of its own)."""
    if backend_name == "jax":
        rising = np.array([-100.0, 0.0, 100.0]).reshape(3, 1)
        problem = {
            "q": np.full(JAX_Q, 100.0),
            "k": np.broadcast_to(rising, JAX_K).copy(),
            "v": np.random.default_rng(1).standard_normal(JAX_V),
            "scale": 1.0,
        }
        return problem, "float32", {"query_chunk": 3, "key_block": 1}
    n = 64
    problem = {
        "q": np.full((1, n, 1), 300.0),
        "k": np.linspace(-300.0, 300.0, n).reshape(1, n, 1),
        "v": np.random.default_rng(1).standard_normal((1, n, 3)),
        "scale": 1.0,
    }
    return problem, "float32", {"query_chunk": 5, "key_block": 7}


# JAX: fixed cases instead of drawn ones (issue 33).  Every drawn shape cost JAX a fresh
# compilation of every operation (5 draws: ~260 compilations in this test, ~185 in
# test_excluded_values_change_nothing); these cases share one shape family and block
# sizes whose blocks are of a few shapes only (3 x 1, 3 x 2 and 6 x 3 scores), and
# test_excluded_values_change_nothing runs the same cases.  Together they run, on JAX,
# every feature the draws exercise (the other backends draw them all, on the same
# backend-independent code); each comment says which:
#   every case: batch (1, 2) broadcast by masks and biases of fewer dims (SDPA-1.2), GQA
#   Hq = 6 over Hkv = 2 (G = 3, SDPA-6.1), Lq = 6 != Lk = 3 (Lq < Lk: the example
#   several_default_blocks), E = 3 != Ev = 2; the dtypes float16, bfloat16 and float32 (all
#   of JAX's) and the scales 2, -0.75, 0, 0.5 (all drawn ones) each in some case.
# (Neither the draws nor these cases use softcap or ALiBi: test_features.py runs those on
# JAX through the blocked form.)
JAX_Q, JAX_K, JAX_V = (1, 2, 6, 6, 3), (1, 2, 2, 3, 3), (1, 2, 2, 3, 2)
JAX_SCORES = (1, 2, 6, 6, 3)


def fixed_case(
    seed: int,
    dtype: str,
    blocks: Blocks,
    *,
    mask: tuple[int, ...] | None = None,
    blank_row: int | None = None,
    bias: tuple[int, ...] | None = None,
    causal: str | None = None,
    scale: float | None = None,
    magnitude: float = 1.0,
    non_finite: bool = False,
    n_k: int = JAX_K[-2],
) -> Case:
    """A case of the shapes JAX_Q, JAX_K, JAX_V (Lk = ``n_k``) made as :func:`cases` makes a
    drawn one: a mask of density 0.6 (``blank_row`` all False), a bias with 15% -inf and 10%
    the dtype's lowest finite value, two non-finite entries in each of q, k, v and bias."""
    rng = np.random.default_rng(seed)
    problem: dict[str, Any] = {
        "q": rng.standard_normal(JAX_Q) * magnitude,
        "k": rng.standard_normal((*JAX_K[:-2], n_k, JAX_K[-1])) * magnitude,
        "v": rng.standard_normal((*JAX_V[:-2], n_k, JAX_V[-1])),
    }
    if mask is not None:
        problem["mask"] = rng.random(mask) < 0.6
        if blank_row is not None:
            problem["mask"][..., blank_row, :] = False
    if bias is not None:
        problem["bias"] = rng.standard_normal(bias) * 3
        problem["bias"][rng.random(bias) < 0.15] = -np.inf
        problem["bias"][rng.random(bias) < 0.1] = LOWEST[dtype]
    if causal is not None:
        problem["is_causal"] = True
        problem["causal_alignment"] = causal
    if scale is not None:
        problem["scale"] = scale
    if non_finite:
        for name in ("q", "k", "v", "bias"):
            if name in problem and problem[name].size:
                flat = problem[name].reshape(-1)
                flat[rng.integers(flat.size, size=2)] = rng.choice(NON_FINITE, size=2)
    return problem, dtype, blocks


JAX_CASES: dict[str, Case] = {
    # Chunks of 3 rows dividing Lq, blocks of 2 keys with a ragged last one; bottom-right
    # causal: rows 0-2 read no key at all (SDPA-4.2, 4.3, 5.1: the chunk of no key block),
    # rows 3-5 a whole block and one across the diagonal; a full-shaped mask with a blank
    # row (SDPA-3.1, 5.1); a key bias (Lk,) with -inf and finfo.min (SDPA-3.3); scale 2
    # (SDPA-2.2); magnitude 3.
    "ragged-bottom-right": fixed_case(
        1,
        "float16",
        {"query_chunk": 3, "key_block": 2},
        mask=JAX_SCORES,
        blank_row=4,
        bias=(3,),
        causal="bottom_right",
        scale=2.0,
        magnitude=3.0,
    ),
    # Blocks of one key, dividing both lengths; top-left causal (SDPA-4.1): whole blocks,
    # blocks across the diagonal; a per-head key mask (Hq, 1, Lk); a bias broadcast over
    # the first batch dim with -inf and finfo.min; scale -0.75; non-finite q, k, v and
    # bias (SDPA-8.3).
    "one-key-blocks-top-left-non-finite": fixed_case(
        2,
        "bfloat16",
        {"query_chunk": 3, "key_block": 1},
        mask=(6, 1, 3),
        bias=(2, 6, 6, 3),
        causal="top_left",
        scale=-0.75,
        non_finite=True,
    ),
    # The default blocks (one block here); no mask; a per-row bias (Lq, 1) with -inf and
    # finfo.min; scale 0; magnitude 10; non-finite inputs.
    "default-blocks-scale-0": fixed_case(
        3,
        "float32",
        {"query_chunk": None, "key_block": None},
        bias=(6, 1),
        scale=0.0,
        magnitude=10.0,
        non_finite=True,
    ),
    # Blocks one past both lengths (one block); an (Lq, Lk) mask with a blank row; scale
    # 0.5; non-finite inputs.
    "blocks-past-the-lengths": fixed_case(
        4,
        "float16",
        {"query_chunk": 7, "key_block": 4},
        mask=(6, 3),
        blank_row=2,
        scale=0.5,
        non_finite=True,
    ),
    # Lk = 0 (SDPA-5.2) with a mask and bottom-right causal, block sizes given.
    "lk0": fixed_case(
        5,
        "bfloat16",
        {"query_chunk": 2, "key_block": 1},
        mask=(6, 0),
        causal="bottom_right",
        n_k=0,
    ),
}


def with_jax_cases(backend: Backend) -> Any:
    """Every case of :data:`JAX_CASES` as an explicit example on JAX; elsewhere the example
    of :func:`several_default_blocks` instead.

    Why not on JAX: its shapes (Lq = 512, Lk = 1100 in blocks of 256 x 1024) are a shape
    family of their own, 101 compilations of every per-block and plain operation, 4.0 of the
    test's 7.1 CPU-s on JAX.  What it adds elsewhere, block sizes the blocked form chooses
    itself (``default_block_sizes``, checked by test_default_block_sizes) and a ragged last
    key block, is backend-independent code; on JAX the cases of JAX_CASES run the same
    per-block operations on every split they make (ragged blocks, several query chunks,
    blocks across the causal diagonal, one-key blocks rescaling the sums as their maximum
    rises), and a sum not rescaled across key blocks fails them."""

    def decorate(test: Any) -> Any:
        if backend.name != "jax":
            return example(case=several_default_blocks()).via("several default blocks")(test)
        for name, case in reversed(JAX_CASES.items()):
            test = example(case=case).via(f"fixed JAX case {name!r}")(test)
        return test

    return decorate


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns on inf - inf; expected
def test_blocked_matches_plain_within_tol2(cpu_backend: Backend) -> None:
    """SDPA-7.1, SDPA-7.3, TOL-2, TOL-3 for every drawn problem and block size, and the
    clauses the draws cover: SDPA-1.2, 1.5, 2.2, 3.1-3.4, 4.1-4.3, 5.1, 5.2, 6.1, 8.3;
    first on the default blocks splitting a problem and on rising large scores (SDPA-7.4:
    finite where the plain reference is).  JAX runs the fixed cases of JAX_CASES instead
    of drawn ones and of the default blocks' example (with_jax_cases says why)."""

    @examples(cpu_backend)
    @given(case=cases(cpu_backend.dtype_names))
    @with_jax_cases(cpu_backend)
    @example(case=rising_large_scores(cpu_backend.name)).via("rising large scores, SDPA-7.4")
    def check(case: Case) -> None:
        assert_blocked_matches_plain(cpu_backend, *case)

    check()


def unused_by(used: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """True where an entry of an array of ``shape``, broadcast to ``used.shape``, meets no
    used pair: ``used`` reduced with "none" over the axes the array is broadcast along."""
    full = (1,) * (used.ndim - len(shape)) + shape
    axes = tuple(
        i for i, (s, u) in enumerate(zip(full, used.shape, strict=True)) if s == 1 and u != 1
    )
    return np.reshape(~np.any(used, axis=axes, keepdims=True), shape)


def assert_excluded_values_change_nothing(backend: Backend, drawn: Case, fill: float) -> None:
    """The output of ``drawn`` (a mask added where it has none) is bit-identical with every
    key, value and bias entry that only excluded pairs use set to ``fill``."""
    case, dtype, blocks = drawn
    case = dict(case)
    q_shape, n_kv, n_k = case["q"].shape, case["k"].shape[-3], case["k"].shape[-2]
    n_q = q_shape[-2]
    case.setdefault("mask", np.random.default_rng(n_q).random((n_q, n_k)) < 0.5)
    batch = np.broadcast_shapes(q_shape[:-3], case["k"].shape[:-3], case["v"].shape[:-3])
    allowed = np.broadcast_to(case["mask"], (*batch, q_shape[-3], n_q, n_k))
    if case.get("is_causal"):
        offset = 0 if case["causal_alignment"] == "top_left" else n_k - n_q
        allowed = allowed & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset)
    # query head h reads key/value head h // G (SDPA-6.1)
    per_kv_head = np.reshape(allowed, (*batch, n_kv, q_shape[-3] // n_kv * n_q, n_k))
    used_keys = np.any(per_kv_head, axis=-2)
    poisoned = dict(case)
    for name in ("k", "v"):
        unused = unused_by(used_keys, case[name].shape[:-1])
        poisoned[name] = np.where(unused[..., None], fill, case[name])
    if "bias" in case:
        poisoned["bias"] = np.where(unused_by(allowed, case["bias"].shape), fill, case["bias"])
    before = blocked_attention(**on_backend(backend, case, dtype), **blocks)
    after = blocked_attention(**on_backend(backend, poisoned, dtype), **blocks)
    before64, after64 = as64(backend, before), as64(backend, after)
    assert np.array_equal(before64, after64, equal_nan=True), (backend.name, blocks, fill)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_excluded_values_change_nothing(cpu_backend: Backend) -> None:
    """SDPA-8.1 (finite), SDPA-8.2 (NaN, +-inf): keys, values and bias entries that only
    pairs excluded by the mask or the causal rule use leave the output bit-identical,
    whatever the block sizes: key blocks the causal rule skips, blocks across the diagonal
    and blocks the mask cuts through.  JAX runs the fixed cases of JAX_CASES instead of
    drawn ones."""
    if cpu_backend.name == "jax":
        # The fixed cases (JAX_CASES, compiled by test_blocked_matches_plain_within_tol2),
        # each poisoned with one of the fills, every fill at least once; the finite fill
        # on the one case with finite values there, so no new path is compiled.
        fills = (1e4, np.nan, np.inf, -np.inf)
        for index, case in enumerate(JAX_CASES.values()):
            assert_excluded_values_change_nothing(cpu_backend, case, fills[index % len(fills)])
        return

    @examples(cpu_backend)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        case = data.draw(cases(cpu_backend.dtype_names), label="case")
        fill = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4]), label="poison")
        assert_excluded_values_change_nothing(cpu_backend, case, fill)

    check()


def test_default_block_sizes() -> None:
    """Blocks never exceed the problem, hold about SCORES_PER_BLOCK scores, and are >= 1;
    they split the problem of :func:`several_default_blocks`."""
    chunk, block = default_block_sizes(4, 512, 1100)
    assert chunk < 512 and block < 1100, (chunk, block)
    chunk, block = default_block_sizes(8, 4096, 4096)
    assert block == KEY_BLOCK and 8 * chunk * block == SCORES_PER_BLOCK, (chunk, block)
    assert default_block_sizes(1, 5, 3) == (5, 3)
    assert default_block_sizes(1, 0, 0) == (1, 1)
    chunk, block = default_block_sizes(1024, 10_000, 10_000)
    assert chunk == MIN_QUERY_CHUNK and block == KEY_BLOCK


def test_memory_is_linear_in_length() -> None:
    """O(L) extra memory: at Lq = Lk = 4096 the blocked reference's peak (NumPy reports its
    buffers to tracemalloc) is within a few copies of the inputs and output plus a few
    blocks, a small fraction of the one Lq x Lk score matrix per head the plain one holds."""
    n, heads, dim, chunk, block = 4096, 2, 16, 256, 256
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((heads, n, dim), dtype=np.float32) for _ in range(3))
    tracemalloc.start()
    try:
        blocked_attention(q, k, v, is_causal=True, query_chunk=chunk, key_block=block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    inputs_and_output = 4 * q.nbytes
    one_block = heads * chunk * block * 4
    budget = 4 * inputs_and_output + 8 * one_block
    scores = heads * n * n * 4
    assert budget < scores / 8, "the budget would not tell O(L) from O(L^2)"
    assert peak <= budget, f"peak {peak / 1e6:.1f} MB > {budget / 1e6:.1f} MB"


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"query_chunk": 0}, ValueError, "query_chunk=0"),
        ({"key_block": -2}, ValueError, "key_block=-2"),
        ({"key_block": 2.5}, TypeError, "key_block=2.5"),
        ({"query_chunk": True}, ValueError, "query_chunk=True"),
        ({"mask": np.ones((3, 4), dtype=np.float32)}, TypeError, "mask.dtype"),
        ({"causal_alignment": "centre", "is_causal": True}, ValueError, "causal_alignment"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, names: str) -> None:
    """Bad block sizes (and the arguments the plain reference checks, SDPA-3.1, SDPA-4.3)
    raise naming the argument."""
    q = k = v = np.zeros((1, 3, 4), dtype=np.float32)
    with pytest.raises(error, match=names.replace(".", r"\.")):
        blocked_attention(q[:, :3], k[:, :4], v[:, :4], **kwargs)
