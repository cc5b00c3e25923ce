"""Weights observed through V = I (SDPA-7.1), in column blocks on a backend that compiles
per shape (``KernelUnderTest.observed_weights``, issue #11).

With V = I the output is the weight matrix; a kernel compiled per shape (jitted JAX) would
compile once more for V's (Lk, Lk) shape (and, declaring ``equal_head_dims``, for q and k
padded to Lk), so there the suite calls it once per block of Ev columns of I, on the
problem's own shapes.  Each output column is one weight times 1 plus exact zeros: the
blocks give the one call's weights bit for bit wherever the kernel computes the scores of
both calls alike, and the one call's TOL-2 bound to the bit.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from catalogue.buggy import CATALOGUE
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from problems import VALUES
from support import backend_or_skip, compiling, drawn, recording

from attnspec.backends import Backend
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.claims.declaration import KernelDeclaration, declaration_of
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.bounds import observed_weights_bound, reference_bound
from attnspec.conformance.judge.kernel import MAX_WEIGHT_BLOCKS, KernelUnderTest, identity_blocks
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED
from attnspec.conformance.run.property_runner import PROFILES, run_property

Shape = tuple[int, ...]


@st.composite
def weight_problems(
    draw: st.DrawFn, declaration: KernelDeclaration, dtypes: tuple[str, ...]
) -> Problem:
    """SDPA-1.1 problems as a kernel with ``declaration`` takes them: 0-2 batch dims (its
    ``batch_ndim`` if declared), GQA where claimed, Lk from 1 to 9 (multiples of Ev and
    not) and 0 last, Ev from 1 to 4 and 0 last, E from 1 to 4, a mask (full or (Lq, Lk)),
    a bias, causal and an explicit scale as claimed (mask and causal together only where
    claimed), in one of ``dtypes``."""
    batch_ndim = declaration.batch_ndim
    if batch_ndim is None:
        batch_ndim = draw(st.integers(0, 2))
    batch = tuple(draw(st.lists(st.integers(1, 2), min_size=batch_ndim, max_size=batch_ndim)))
    n_kv_heads = draw(st.integers(1, 2))
    groups = draw(st.integers(1, 3)) if declaration.gqa else 1
    n_queries = draw(st.integers(1, 4))
    n_keys = draw(st.sampled_from((1, 2, 3, 4, 5, 6, 7, 8, 9, 0)))
    head_dim, value_dim = draw(st.integers(1, 4)), draw(st.sampled_from((1, 2, 3, 4, 0)))

    def values(*shape: int) -> np.ndarray:
        return draw(arrays(np.float64, (*batch, *shape), elements=VALUES, fill=st.nothing()))

    n_heads = n_kv_heads * groups
    problem = Problem(
        q=values(n_heads, n_queries, head_dim),
        k=values(n_kv_heads, n_keys, head_dim),
        v=values(n_kv_heads, n_keys, value_dim),
        dtype=draw(st.sampled_from(dtypes)),
        is_causal=declaration.causal and draw(st.booleans()),
    )
    if declaration.mask and (declaration.mask_and_causal or not problem.is_causal):
        if draw(st.booleans()):
            full = draw(st.booleans())
            shape = (*batch, n_heads, n_queries, n_keys) if full else (n_queries, n_keys)
            problem.mask = draw(arrays(np.bool_, shape))
    if declaration.bias and not (problem.is_causal and declaration.bias_shares_mask_argument):
        if draw(st.booleans()):
            problem.bias = values(n_heads, n_queries, n_keys)
    if declaration.scale and draw(st.booleans()):
        problem.scale = draw(st.sampled_from((0.5, 1.0, 2.0)))
    return problem


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shapes and values, NaN where NaN and zeros of the same sign."""
    return np.array_equal(a, b, equal_nan=True) and bool(np.all(np.signbit(a) == np.signbit(b)))


def blocks_and_one_call(problem: Problem, backend: str = "numpy") -> tuple[Any, ...]:
    """(weights observed in blocks, the v shapes of those calls, weights observed in one
    call) of the reference on ``backend``."""
    in_blocks: list[tuple[Shape, ...]] = []
    blocked = KernelUnderTest(recording(in_blocks), compiling(backend))
    one_call = KernelUnderTest(recording([]), compiling(backend, False))
    weights = blocked.observed_weights(problem)
    return weights, [v for _, _, v in in_blocks], one_call.observed_weights(problem)


def expected_calls(problem: Problem) -> list[Shape]:
    """SDPA-1.1: the v shape of every call the blocks make: the problem's own, once per
    Ev columns of the Lk keys (once for Lk = 0)."""
    n_keys, value_dim = problem.k.shape[-2], problem.v.shape[-1]
    return [tuple(problem.v.shape)] * max(1, math.ceil(n_keys / value_dim))


DECLARED = recording([]).__attnspec__


@given(weight_problems(DECLARED, ("float32", "float64")))
@drawn(60)
def test_blocks_observe_the_one_calls_weights_on_the_reference(problem: Problem) -> None:
    """SDPA-7.1: on a backend that compiles per shape the weights come from calls on the
    problem's own v shape, one per block of Ev columns of I, and equal those of the one
    V = I call bit for bit (GQA, masks, bias, causal, batch dims, Lk not a multiple of Ev,
    Lk = 0); Ev = 0 takes the one call, as a non-compiling backend does."""
    blocks, calls, one_call = blocks_and_one_call(problem)
    assert same_bits(blocks, one_call), problem.describe()
    n_keys = problem.k.shape[-2]
    assert blocks.shape == (*problem.q.shape[:-1], n_keys)
    if problem.v.shape[-1] == 0:
        assert calls == [(*problem.k.shape[:-1], n_keys)]
    else:
        assert calls == expected_calls(problem)


def _normals(rng: np.random.Generator, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    """A standard normal array of each shape, drawn from ``rng`` in turn."""
    return [rng.standard_normal(shape) for shape in shapes]


@pytest.mark.parametrize("n_keys", [MAX_WEIGHT_BLOCKS, MAX_WEIGHT_BLOCKS + 1])
def test_more_blocks_than_the_cap_take_one_call(n_keys: int) -> None:
    """SDPA-7.1: with Ev = 1, Lk = MAX_WEIGHT_BLOCKS keys take that many calls of the
    problem's shape; one key more takes the one V = I call (values of Lk x Lk); both
    observe the one call's weights."""
    rng = np.random.default_rng(n_keys)
    q, k, v = _normals(rng, (2, 3, 4), (2, n_keys, 4), (2, n_keys, 1))
    problem = Problem(q, k, v, "float32", mask=rng.random((3, n_keys)) < 0.7)
    blocks, calls, one_call = blocks_and_one_call(problem)
    assert same_bits(blocks, one_call)
    if n_keys <= MAX_WEIGHT_BLOCKS:
        assert calls == expected_calls(problem)
    else:
        assert identity_blocks(problem) is None
        assert calls == [(2, n_keys, n_keys)]


def test_blocks_observe_the_one_calls_weights_on_the_reference_on_jax() -> None:
    """SDPA-7.1: the same on JAX (XLA's arithmetic; each new shape compiles, so one
    problem: GQA, a mask, causal, Lk = 7 in blocks of Ev = 3)."""
    backend_or_skip("jax")
    rng = np.random.default_rng(7)
    q, k, v = _normals(rng, (1, 4, 5, 2), (1, 2, 7, 2), (1, 2, 7, 3))
    problem = Problem(q, k, v, "float32", mask=rng.random((5, 7)) < 0.7, is_causal=True)
    blocks, calls, one_call = blocks_and_one_call(problem, "jax")
    assert same_bits(blocks, one_call)
    assert calls == expected_calls(problem)


def test_blocks_observe_the_one_calls_weights_on_torch_sdpa() -> None:
    """SDPA-7.1: PyTorch SDPA's math backend (torch_kernels.sdpa_math: its own arithmetic,
    GQA through enable_gqa, mask and bias through one argument), told it compiles per
    shape, observes in blocks the one call's weights bit for bit."""
    backend_or_skip("torch")
    from attnspec.conformance.kernels.torch_sdpa import sdpa_math

    declaration = sdpa_math.__attnspec__

    @given(weight_problems(declaration, ("bfloat16", "float32", "float64")))
    @drawn(30)
    def check(problem: Problem) -> None:
        blocked = KernelUnderTest(sdpa_math, compiling("torch")).observed_weights(problem)
        one_call = KernelUnderTest(sdpa_math, Backend("torch")).observed_weights(problem)
        assert same_bits(blocked, one_call), problem.describe()

    check()


@given(weight_problems(DECLARED, ("float32",)))
@drawn(30)
@example(Problem(q=np.ones((2, 3, 2)), k=np.ones((1, 5, 2)), v=np.ones((1, 5, 2)), dtype="float32"))
def test_each_block_has_the_one_calls_bound(problem: Problem) -> None:
    """TOL-2: output column c of block j (values I[:, j:j + Ev]) gets, to the bit, the
    bound of column j + c of the one V = I problem: observed_weights_bound holds for the
    weights observed in blocks."""
    blocks = identity_blocks(problem)
    if blocks is None:  # Ev = 0: observed in one call
        return
    whole = observed_weights_bound(problem, DECLARED)
    n_keys = problem.k.shape[-2]
    for start, block in blocks:
        width = min(n_keys - start, block.v.shape[-1])
        bound = reference_bound(block, DECLARED)
        for mine, of_whole in zip((bound.out, bound.out_tolerance), whole, strict=True):
            assert same_bits(
                np.asarray(mine)[..., :width], np.asarray(of_whole)[..., start : start + width]
            ), (start, problem.describe())


class RecordingKernel(KernelUnderTest):
    """A kernel under test recording the (q, k, v) shapes of every problem it is called on
    (before the suite's zero padding to E = Ev)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.problems: list[tuple[tuple[int, ...], ...]] = []

    def call_on(self, problem: Problem) -> Any:
        self.problems.append((problem.q.shape, problem.k.shape, problem.v.shape))
        return super().call_on(problem)


def test_the_jitted_jax_kernel_is_not_called_with_values_of_lk_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SDPA-7.1, SDPA-3.2, SDPA-4.1 (issue #11): bias-semantics and causal-alignment read
    the weights of jax.nn.dot_product_attention under jax.jit (declaring E == Ev) on the
    problems' own shapes: no call has values of Lk columns where E differs (each such
    V = I call compiled the kernel once more, with q and k padded to Lk), and both pass."""
    pytest.importorskip("jax", reason="the jitted kernel is JAX's")
    from attnspec.conformance.kernels.jax_jitted import jitted_dot_product_attention

    # float32 and bfloat16: JAX computes float64 at about float32 precision unless told
    # otherwise (docs/divergences.md), which another test's x64 setting would let in here
    declared = replace(declaration_of(jitted_dot_product_attention), dtypes=("bfloat16", "float32"))
    kernel = RecordingKernel(jitted_dot_product_attention, backend_or_skip("jax"), declared)
    # the quick profile but its anchors: how the weights are observed depends on Lk and Ev
    # only, and the small and realistic strata draw the same extremes with the anchors or
    # without them (Lk 0 to 64, Ev 1 to 192, up to 8 blocks of Ev columns); the anchors'
    # 9 (Lk, Ev) pairs more cost 16 of the 38 compilations (~2 of ~5.5 CPU-s, measured)
    monkeypatch.setitem(PROFILES, "quick", replace(PROFILES["quick"], anchors=0))
    for prop in ("bias-semantics", "causal-alignment"):
        # lengths up to 64: the realistic strata's larger ones cost compilations, not cover
        verdict = run_property(all_properties()[prop], kernel, limits=SizeLimits(max_len=64))
        assert verdict.status == PASSED, (prop, verdict.detail)
    identity_like = [(q, k, v) for q, k, v in kernel.problems if v[-1] == k[-2] != q[-1]]
    assert kernel.problems and not identity_like, identity_like


@pytest.mark.parametrize("bug", ["causal-j-lt-i", "softcap-ignored"])
def test_a_failure_on_observed_weights_reproduces_them(bug: str) -> None:
    """SDPA-4.1, SOFTCAP-3, CONF-1: a failure found on weights observed in column blocks
    (causal-alignment, softcap-bounds-logits on NumPy told it compiles per shape) gives a
    reproduction that, run on its own, observes the weights with one V = I call and shows
    them outside their TOL-2 bound (its V, which a shrunk weights failure has all zero,
    would show nothing)."""
    entry = next(entry for entry in CATALOGUE if entry.name == bug)
    prop = all_properties()[entry.catches]
    verdict = run_property(prop, KernelUnderTest(entry.fn, compiling()))
    assert verdict.status == FAILED, verdict.detail
    scope: dict[str, Any] = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(verdict.reproduction, scope)
    assert "kernel weights:" in printed.getvalue()
    observed = np.asarray(scope["observed"], dtype=np.float64)
    error = np.abs(observed - np.asarray(scope["expected"]))
    assert np.any(error > np.asarray(scope["tolerance"])), verdict.reproduction


def mean_v_on_empty_rows(
    q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False, scale: Any = None
) -> Any:
    """The reference, but mean(V) for a row with no allowed key (JAX's and Flax's rule)."""
    from attnspec.reference import scaled_dot_product_attention

    out = np.asarray(scaled_dot_product_attention(q, k, v, mask=mask, scale=scale))
    empty = ~np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2])).any(axis=-1)
    return np.where(empty[..., None], np.mean(v, axis=-2, keepdims=True), out)


def test_weights_of_rows_without_a_key_are_judged_only_under_sdpa_5_1() -> None:
    """SDPA-5.1, CONF-7: assert_weights_match leaves out the weights of a row with no
    allowed key for a kernel that waives SDPA-5.1 (as assert_matches_reference leaves out
    its output), judges them for one that claims it, and judges every other row always."""
    from attnspec.conformance import declare
    from attnspec.conformance.judge.assertions import assert_weights_match
    from attnspec.conformance.judge.failures import PropertyFailure

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, 3)) for n in (4, 5, 5))
    mask = rng.random((4, 5)) < 0.6
    mask[1] = False  # row 1 may attend nothing: its observed weights are 1/5 each
    mask[0, 0] = mask[2, 0] = mask[3, 0] = True
    problem = Problem(q=q, k=k, v=v, dtype="float64", mask=mask)
    for waives in (True, False):
        declared = declare(
            mean_v_on_empty_rows, mask=True, batch_ndim=0, empty_rows_zero=not waives
        )
        kernel = KernelUnderTest(declared, Backend("numpy"))
        _, weights = kernel.output_with_weights(problem)
        if waives:
            assert_weights_match(kernel, problem, weights)
            wrong = weights.copy()
            wrong[0, 2] = np.roll(wrong[0, 2], 1)  # a row with keys, weights moved
            with pytest.raises(PropertyFailure, match="weights"):
                assert_weights_match(kernel, problem, wrong)
        else:
            with pytest.raises(PropertyFailure, match=r"weights\[\(0, 1, 0\)\]"):
                assert_weights_match(kernel, problem, weights)
