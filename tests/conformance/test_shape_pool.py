"""Shape pools for backends that compile per shape (SDPA-1.1, CONF-1).

A backend that says it compiles per shape (JAX) gets each stratum's shapes from a small
pool per run: every property meets the same few shapes (so a jitted kernel's compilations
are reused), the realistic strata keep their realistic sizes, a failure still shrinks (to
the smallest pooled shape that fails), and the pools are the same whatever the order the
properties run in.  Here on NumPy, with its adapter told that it compiles per shape.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from catalogue.buggy import CATALOGUE, BuggyKernel
from hypothesis import strategies as st
from support import backend_or_skip, compiling, recording, verdict_of

from attnspec.backends import Backend, _registry
from attnspec.conformance import declare
from attnspec.conformance.draw.anchors import ANCHORS
from attnspec.conformance.draw.shape_pool import (
    PLAIN_REQUEST,
    SMALL_POOL,
    SeededDraws,
    ShapePool,
    members_for,
    pool_for_run,
    pooled_dims,
)
from attnspec.conformance.draw.sizes import SizeLimits, Stratum, drawing, problem_cost
from attnspec.conformance.draw.strategies import draw_dims
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED, WARNING
from attnspec.conformance.run.property_runner import ANCHOR_COST, PROFILES, run_property
from attnspec.reference import scaled_dot_product_attention as reference_sdpa

Array = Any


def test_backends_say_whether_they_compile_per_shape() -> None:
    """JAX's adapter compiles per shape; NumPy's and PyTorch's (eager) do not."""
    assert _registry.ADAPTERS["jax"].compiles_per_shape is True
    assert _registry.ADAPTERS["numpy"].compiles_per_shape is False
    assert _registry.ADAPTERS["torch"].compiles_per_shape is False
    assert Backend("numpy").compiles_per_shape is False


def test_shape_pools_variable_says_a_kernel_compiles_per_shape(monkeypatch: Any) -> None:
    """SDPA-1.1, CONF-1: ATTNSPEC_SHAPE_POOLS=1 gives the pools to a kernel that compiles
    itself per shape (torch.compile) on a library that does not; any other value does not."""
    from attnspec.backends import SHAPE_POOLS_VARIABLE

    monkeypatch.delenv(SHAPE_POOLS_VARIABLE, raising=False)
    assert Backend("numpy").compiles_per_shape is False
    monkeypatch.setenv(SHAPE_POOLS_VARIABLE, "1")
    assert Backend("numpy").compiles_per_shape is True
    monkeypatch.setenv(SHAPE_POOLS_VARIABLE, "0")
    assert Backend("numpy").compiles_per_shape is False


# Properties that ask draw_dims for other minimum sizes (causal-zeros: Lq != Lk, at least
# one query and key; batch-head-independence: two key/value heads) or build a probe of
# their own (default-scale): pooled, they meet the shapes the others meet.
ASKING = ("causal-zeros", "batch-head-independence", "default-scale")


@pytest.fixture(scope="module")
def pooled_shapes() -> dict[str, list[tuple[tuple[int, ...], ...]]]:
    """The (q, k, v) shapes a correct kernel is called with by some properties, pooled and
    not (quick profile)."""
    shapes: dict[str, list[tuple[tuple[int, ...], ...]]] = {}
    for name, backend in (("pooled", compiling()), ("free", Backend("numpy"))):
        for prop in ("matches-reference", "key-permutation", *ASKING):
            seen: list[tuple[tuple[int, ...], ...]] = []
            kernel = KernelUnderTest(recording(seen), backend)
            assert verdict_of(prop, kernel).status == PASSED
            shapes[f"{name} {prop}"] = seen
    return shapes


def test_a_compiling_backend_meets_a_few_shapes_shared_by_properties(pooled_shapes) -> None:  # type: ignore[no-untyped-def]
    """SDPA-7.3, SDPA-7.6: pooled, the 30 examples of a property use at most a pool's worth
    of shapes per stratum (3 small + 3 + 1 + 1 + 5 realistic), and a second property meets
    mostly the same ones (its draws ask for other minimum sizes in places); drawn freely,
    the two properties meet at least twice as many shapes."""
    pooled = {shape for shape in pooled_shapes["pooled matches-reference"]}
    bound = SMALL_POOL + sum(
        min(s.examples, 3) for s in PROFILES["quick"].strata(SizeLimits()) if s.realistic
    )
    assert len(pooled) <= bound
    other = set(pooled_shapes["pooled key-permutation"])
    assert len(other & pooled) >= len(other) / 2, (other - pooled, pooled)
    free = {*pooled_shapes["free matches-reference"], *pooled_shapes["free key-permutation"]}
    assert len(free) >= 2 * len(pooled | other), (len(free), len(pooled | other))


def test_properties_asking_for_other_sizes_meet_the_shapes_already_met(pooled_shapes) -> None:  # type: ignore[no-untyped-def]
    """SDPA-4.1, SDPA-7.6, SDPA-2.1: pooled, a property asking for at least one key, Lq !=
    Lk or two key/value heads takes the shapes drawn for a plain request that meet what
    it asks (``where``) before drawing a pool of its own or rewriting sizes, and the
    scale probe's sizes come from a pool too: each meets at most a pool's worth of (q, k)
    shapes per stratum, fewer than drawn freely; causal-zeros meets matches-reference's
    anchors wherever their Lq != Lk (it used to add a key to every one of its shapes)."""

    def qk(shapes: list[tuple[tuple[int, ...], ...]]) -> set[tuple[tuple[int, ...], ...]]:
        return {(q, k) for q, k, _ in shapes}

    strata = PROFILES["quick"].strata(SizeLimits())
    bound = sum(members_for(s.examples, s.realistic) for s in strata)
    for prop in ASKING:
        pooled, free = qk(pooled_shapes[f"pooled {prop}"]), qk(pooled_shapes[f"free {prop}"])
        assert len(pooled) <= bound and len(pooled) < len(free), (prop, len(pooled), len(free))
    anchors = [a.dims(1, SizeLimits(), ANCHOR_COST, gqa=True) for a in ANCHORS]
    unequal = {
        (
            (*d.batch, d.n_q_heads, d.n_queries, d.head_dim),
            (*d.batch, d.n_kv_heads, d.n_keys, d.head_dim),
        )
        for d in anchors
        if d.n_queries != d.n_keys
    }
    shared = qk(pooled_shapes["pooled causal-zeros"]) & qk(
        pooled_shapes["pooled matches-reference"]
    )
    assert unequal and unequal <= shared, unequal - shared


def test_requests_take_plain_members_that_meet_them() -> None:
    """A request for at least one query and key, or for members where Lq != Lk, is
    answered from the plain request's pool when members of it qualify; a kernel that
    needs E == Ev gets pooled shapes with E == Ev."""
    kernel = KernelUnderTest(recording([]), compiling())
    equal = KernelUnderTest(
        declare(bias=True, gqa=True, equal_head_dims=True)(
            lambda q, k, v, **kw: reference_sdpa(q, k, v, **kw)
        ),
        compiling(),
    )
    plain = dict(PLAIN_REQUEST, gqa=True, family="dense")  # what draw_dims is asked by default
    # a seed whose plain members include some with a key and Lq != Lk (asserted below)
    pool, small = ShapePool(seed=4), Stratum("small", 20)
    with drawing(small, SizeLimits(), pool):
        everything = {pooled_dims(SeededDraws(i), kernel, draw_dims, plain) for i in range(40)}
        some = {
            pooled_dims(
                SeededDraws(i),
                kernel,
                draw_dims,
                {**plain, "min_keys": 1},
                where=lambda d: d.n_queries != d.n_keys,
            )
            for i in range(40)
        }
        padded = {pooled_dims(SeededDraws(i), equal, draw_dims, plain) for i in range(40)}
    qualifying = {d for d in everything if d.n_keys >= 1 and d.n_queries != d.n_keys}
    assert qualifying, everything
    assert some and some <= qualifying, (some, everything)
    assert all(d.head_dim == d.value_dim for d in padded), padded


def test_pooled_realistic_strata_keep_their_sizes() -> None:
    """SDPA-1.1: a pooled blocks stratum draws at least 16 keys within its cost
    cap, a pooled decode stratum 1-4 queries against at least 257 keys: pool members come
    from the same drawing code."""
    kernel = KernelUnderTest(recording([]), compiling())
    pool = ShapePool(seed=None)
    blocks = Stratum("blocks", 3, 2**24, min_len=16)
    decode = Stratum("decode", 1, 2**24, (("shape", "decode"),), min_len=257)
    options = dict(PLAIN_REQUEST, gqa=True, family="dense")  # what draw_dims is asked by default
    data = SeededDraws(7)
    for stratum in (blocks, decode):
        with drawing(stratum, SizeLimits(), pool):
            members = {pooled_dims(data, kernel, draw_dims, options) for _ in range(20)}
        assert 1 <= len(members) <= min(stratum.examples, 3), members
        for dims in members:
            assert problem_cost(dims) <= stratum.max_cost, dims
            if stratum is decode:
                assert dims.n_queries <= 4 and dims.n_keys >= 257, dims
            else:
                assert dims.n_keys >= 16, dims


def test_pools_do_not_depend_on_the_order_properties_run_in() -> None:
    """The same run seed gives the same members whichever pool is filled first, in any
    process (``--jobs``); another seed gives other ones."""
    kernel = KernelUnderTest(recording([]), compiling())
    options = dict(PLAIN_REQUEST, gqa=True, family="dense")  # what draw_dims is asked by default
    small = Stratum("small", 20)

    def members(pool: ShapePool, stratum: Stratum) -> list[Any]:
        with drawing(stratum, SizeLimits(), pool):
            pooled_dims(SeededDraws(0), kernel, draw_dims, options)
        return next(v for k, v in pool._members.items() if k[1] == stratum)

    first, second = ShapePool(seed=None), ShapePool(seed=None)
    blocks = Stratum("blocks", 3, 2**24, min_len=16)
    members(second, blocks)  # fills another pool first
    assert members(first, small) == members(second, small)
    assert members(ShapePool(seed=5), small) != members(first, small)
    assert members(first, small)[0].n_queries == 0  # the simplest first: Hypothesis's first


def test_seeded_draws_use_hypothesis_generator_outside_a_test() -> None:
    """SeededDraws pins the Hypothesis engine calls it relies on: seeded draws repeat, and
    seed None gives each strategy's simplest value."""
    assert SeededDraws(None).draw(st.integers(3, 9)) == 3
    assert SeededDraws(None).draw(st.sampled_from(["a", "b"])) == "a"
    draws = [SeededDraws(11).draw(st.integers(0, 10**6)) for _ in range(2)]
    assert draws[0] == draws[1]


def test_seeded_draws_do_not_depend_on_the_modules_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONF-5: a seeded draw (a pool member, a tied option) is the same whatever source
    constants Hypothesis has collected from the modules imported so far (it answers 1 in 20
    number draws with one of them): a worker that has imported other modules draws the
    same pools.  Before, 200 seeded draws changed when a module with a constant loaded."""
    from hypothesis.control import BuildContext
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.conjecture.data import ConjectureData

    numbers = st.integers(0, 2**20)

    def with_hypothesis_provider(seed: int) -> int:
        data = ConjectureData(random=random.Random(seed))
        with BuildContext(data, wrapped_test=with_hypothesis_provider):
            return data.draw(numbers)

    def both() -> tuple[list[int], list[int]]:
        seeds = range(200)
        return [SeededDraws(s).draw(numbers) for s in seeds], [
            with_hypothesis_provider(s) for s in seeds
        ]

    before, plain_before = both()
    found = providers.Constants(integers=providers.SortedSet([424242]))
    monkeypatch.setattr(providers, "_get_local_constants", lambda: found)
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        after, plain_after = both()
    finally:
        providers.CONSTANTS_CACHE.cache.clear()
    # the constant reaches Hypothesis's own provider (the patch is felt), not the seeded one
    assert 424242 in plain_after and plain_after != plain_before
    assert after == before


def last_value_column_off(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Wrong whenever there is a query and a value column, whatever the options: the
    output's last value column is off by one."""
    out = reference_sdpa(q, k, v, **options)
    if out.shape[-1] >= 1:
        out[..., -1] += 1.0
    return out


def test_a_failure_still_shrinks_to_the_smallest_pooled_shape() -> None:
    """SDPA-7.3: a kernel that is wrong whenever Lq >= 1 and Ev >= 1 fails
    matches-reference on a compiling backend too, and its counterexample is the first
    member of a small-stratum pool (they are sorted by size) that can show the bug:
    Hypothesis shrank the pool index down to it."""
    kernel = KernelUnderTest(recording([], last_value_column_off), compiling())
    verdict = verdict_of("matches-reference", kernel)
    assert verdict.status == FAILED
    pools = [
        members
        for key, members in pool_for_run(None)._members.items()
        if key[0] == "dims" and key[1].name == "small"
    ]
    firsts = {next(d for d in members if d.n_queries and d.value_dim) for members in pools}
    shown = {f"q{(*d.batch, d.n_q_heads, d.n_queries, d.head_dim)}" for d in firsts}
    assert any(verdict.counterexample.startswith(q + ",") for q in shown), (
        verdict.counterexample,
        firsts,
    )


# Properties whose sizes now come from pools where they used to draw or rewrite their
# own (causal's Lq != Lk, two heads, two groups, the scale probe).
REPOOLED = {
    "causal-zeros",
    "causal-alignment",
    "default-scale",
    "explicit-scale",
    "batch-head-independence",
    "gqa-mapping",
}
# Properties that check less per pooled realistic example than per other example:
# mask-broadcast one mask form, output-shape-dtype the shape's tied dtype.
PER_EXAMPLE_POOLED = {"mask-broadcast", "output-shape-dtype"}


# Properties that observe the weights through V = I: in column blocks on a backend that
# compiles per shape (KernelUnderTest.observed_weights).
OBSERVING_WEIGHTS = {
    "rows-sum-to-one",
    "causal-alignment",
    "bias-semantics",
    "empty-rows-zero",
    "softcap-bounds-logits",
}


@pytest.mark.parametrize(
    "bug",
    [
        bug
        for bug in CATALOGUE
        if bug.catches in REPOOLED | OBSERVING_WEIGHTS | PER_EXAMPLE_POOLED
        and bug.backend == "numpy"
    ],
    ids=lambda bug: bug.name,
)
def test_catalogue_bugs_stay_caught_on_a_compiling_backend(bug: BuggyKernel) -> None:
    """CONF-1: every catalogued bug that a property taking its sizes from pools, or
    observing the weights (in column blocks there, SDPA-7.1), catches
    (tests/catalogue/test_caught.py, on NumPy as is) is caught by it on a backend that
    compiles per shape too (the first failure decides, not shrunk, as there).  The status
    is what is asserted, so no reproduction is written (reproduce=False): a bug first met
    at an anchor's size wrote ~45 MB of literals: 1.8 -> 0.5 CPU-s)."""
    prop = all_properties()[bug.catches]
    kernel = KernelUnderTest(bug.fn, compiling())
    verdict = run_property(prop, kernel, shrink=False, reproduce=False)
    assert verdict.status == (FAILED if prop.level == "MUST" else WARNING), (
        bug.name,
        verdict.status,
        verdict.detail,
    )


def test_a_failure_without_its_reproduction_is_the_same_verdict() -> None:
    """CONF-1: reproduce=False, as the test above runs, gives the verdict a run with its
    reproduction gives (status, finding, counterexample), the reproduction left out."""
    bug = next(bug for bug in CATALOGUE if bug.name == "mask-after-softmax")
    prop = all_properties()[bug.catches]
    kernel = KernelUnderTest(bug.fn, compiling())
    shown = run_property(prop, kernel, shrink=False)
    bare = run_property(prop, kernel, shrink=False, reproduce=False)
    assert shown.reproduction and not bare.reproduction
    assert (bare.status, bare.detail, bare.counterexample) == (
        shown.status,
        shown.detail,
        shown.counterexample,
    )


def test_the_jitted_jax_kernel_of_the_cost_table_runs() -> None:
    """SDPA-2.1: attnspec.conformance.kernels.jax_jitted (README, "Cost of a check"):
    jax.nn.dot_product_attention under jax.jit, on JAX (a backend that compiles per shape),
    passes score-variance (one call: cheap); its float16 is left out as declared.  The
    pools themselves are tested above on NumPy, where runs cost no compilations."""
    pytest.importorskip("jax", reason="the jitted kernel is JAX's")
    from attnspec.conformance import check
    from attnspec.conformance.kernels.jax_jitted import jitted_dot_product_attention

    assert backend_or_skip("jax").compiles_per_shape
    report = check(jitted_dot_product_attention, backend="jax", only=["score-variance"])
    assert [v.status for v in report.verdicts] == [PASSED], report.verdicts
    assert "float16" not in jitted_dot_product_attention.__attnspec__.dtypes


def test_a_rerun_drawing_around_every_dtype_checked_draws_nothing() -> None:
    """SDPA-1.3, CONF-5: a re-run that draws around every dtype the kernel is checked in
    (its minimal case had float32 inputs, and SDPA-1.3 failed in bfloat16) has no example
    to draw: it ends at once with none checked, so the report says "every draw had such
    inputs", instead of discarding draws until Hypothesis or the worker's stall limit gives
    up (60 s each for a jitted JAX kernel's re-runs, most of its quick profile's time)."""
    calls: list[int] = []
    prop = all_properties()["matches-reference"]
    counting = dataclasses.replace(prop, check=lambda kernel, data: calls.append(1))
    kernel = KernelUnderTest(declare(dtypes=("float32",))(reference_sdpa), compiling())
    verdict = run_property(counting, kernel, limits=SizeLimits(avoid=("float32-inputs",)))
    assert (verdict.status, verdict.examples, calls) == (PASSED, 0, []), verdict
    drawn = run_property(counting, kernel, limits=SizeLimits(avoid=("bfloat16-inputs",)))
    assert drawn.examples > 0 and calls, drawn  # a dtype left: drawn as always


def test_workers_share_one_jax_compilation_cache_per_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """CONF-5: every worker of a run gets JAX's persistent compilation cache in
    one directory of the run (the user's JAX_COMPILATION_CACHE_DIR instead, when set) with
    every compilation cached, so a worker started after a crash, a re-run or another
    worker of --jobs N loads what one already compiled; thresholds the user set stand.  A
    JAX process with those variables writes its compilations there."""
    from attnspec.backends._registry import (
        JAX_CACHE_DIRECTORY,
        JAX_CACHE_THRESHOLDS,
        compilation_cache_variables,
    )

    run = compilation_cache_variables({})
    assert run == {
        **dict.fromkeys(JAX_CACHE_THRESHOLDS, "0"),
        JAX_CACHE_DIRECTORY: compilation_cache_variables({})[JAX_CACHE_DIRECTORY],
    }
    assert os.path.isdir(run[JAX_CACHE_DIRECTORY])
    mine = {JAX_CACHE_DIRECTORY: str(tmp_path), JAX_CACHE_THRESHOLDS[0]: "2"}
    assert compilation_cache_variables(mine) == {JAX_CACHE_THRESHOLDS[1]: "0"}
    pytest.importorskip("jax", reason="the cache is JAX's")
    code = "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 3)(jnp.ones(5)).block_until_ready()"
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        timeout=120,
        env={**os.environ, **compilation_cache_variables({}), JAX_CACHE_DIRECTORY: str(tmp_path)},
    )
    assert any(name.startswith("jit__lambda") for name in os.listdir(tmp_path))


def test_the_suites_own_array_operations_compile_nothing_on_jax() -> None:
    """SDPA-1.1: on JAX, which compiles every operation anew per shape, the zero padding
    of a kernel that needs E == Ev (Ev < E; Ev > E with an explicit scale and with the
    power-of-two factor on q) and the cut of its output are done on the host: checking
    compiles the kernel's signatures and nothing else (it compiled ~330 eager operations
    in the quick profile before), and the kernel gets the very arrays the device
    operations gave (the same output, bit for bit)."""
    jax = pytest.importorskip("jax", reason="the compilations counted are JAX's")
    from attnspec.conformance.call.layouts import pad_head_dims
    from attnspec.conformance.draw.sizes import Dims
    from attnspec.conformance.draw.strategies import random_problem
    from attnspec.conformance.kernels.jax_jitted import jitted_dot_product_attention

    backend = backend_or_skip("jax")
    kernel = KernelUnderTest(jitted_dot_product_attention, backend)
    rng = np.random.default_rng(11)
    # E == Ev first: whatever JAX compiles once per process (not per shape) happens here
    kernel.output(random_problem(kernel, rng, Dims((2,), 1, 2, 3, 5, 3, 3), "float32"))
    problems = [
        random_problem(kernel, rng, Dims((2,), 1, 2, 3, 5, 4, value_dim), dtype, scale=scale)
        for value_dim, scale, dtype in (
            (2, None, "float32"),
            (6, None, "bfloat16"),  # q times 2, widened to float32 on the host and back
            (6, 0.5, "float32"),
        )
    ]
    compiled: list[str] = []

    def heard(event: str, duration: float, **info: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(str(info.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(heard)
    try:
        outputs = [kernel.output(problem) for problem in problems]
    finally:
        jax.monitoring.unregister_event_duration_listener(heard)
    assert compiled and set(compiled) == {"jit(attention)"}, compiled
    assert len(compiled) == len(problems)  # one signature each, all padded differently
    on_device = pad_head_dims(jitted_dot_product_attention)
    for problem, out in zip(problems, outputs, strict=True):
        args, kwargs = kernel.arguments(problem)
        expected = kernel.numpy(on_device(*args, **kwargs))
        np.testing.assert_array_equal(out, expected)


def test_a_rerun_drawing_around_values_meets_the_first_runs_shapes() -> None:
    """CONF-5: a re-run drawing around a fully masked row or a large bias (the
    values, masks and options drawn, not the sizes) draws its problem and probe sizes from
    the pools of the first run, whose compilations a compiling backend has already paid
    (it drew pools of its own before, 24 more kernel compilations); drawing around GQA
    or empty lengths changes the sizes, so its pools are its own."""
    from attnspec.conformance.draw.shape_pool import limits_key

    prop = all_properties()["rows-sum-to-one"]
    kernel = KernelUnderTest(recording([]), compiling())
    pool = pool_for_run(7)
    assert run_property(prop, kernel, seed=7).status == PASSED
    sizes_pools = lambda: {key for key in pool._made if key[0] in ("dims", "probe")}  # noqa: E731
    first_pools = sizes_pools()
    around = SizeLimits(avoid=("fully-masked-row", "large-finite-bias"))
    assert run_property(prop, kernel, seed=7, limits=around).status == PASSED
    assert sizes_pools() == first_pools  # (a tight bias may broadcast from new shapes)
    with drawing(Stratum("small", 20), around, pool):
        assert limits_key() == SizeLimits()
    with drawing(Stratum("small", 20), SizeLimits(avoid=("gqa", "fully-masked-row")), pool):
        assert limits_key() == SizeLimits(avoid=("gqa",))


def compiled_for(q: Any, k: Any, v: Any, **options: Any) -> tuple[Any, ...]:
    """What a compiling backend compiles a call for: shapes, dtype, the options given."""
    mask, bias = options["mask"], options["bias"]
    return (
        *(tuple(a.shape) for a in (q, k, v)),
        str(q.dtype),
        None if mask is None else tuple(mask.shape),
        None if bias is None else tuple(bias.shape),
        options["is_causal"],
        options["scale"] is None,
    )


def test_a_rerun_drawing_around_a_masked_row_or_a_large_bias_compiles_nothing_new() -> None:
    """CONF-5: drawing around a fully masked row keeps the drawn mask's shape (a key is
    added in that shape, strategies.with_a_key_per_row) and drawing around a large bias
    keeps the bias's (values of a few units in the padding or ALiBi shape drawn), so such
    a re-run calls a compiling kernel with signatures the first run compiled: before, a
    key per row took the full scores shape and a bounded bias a shape of its own."""
    runs: list[set[tuple[Any, ...]]] = []
    prop = all_properties()["matches-reference"]
    for limits in (SizeLimits(), SizeLimits(avoid=("fully-masked-row", "large-finite-bias"))):
        seen: list[tuple[Any, ...]] = []
        kernel = KernelUnderTest(recording(seen, record=compiled_for, mask=True), compiling())
        assert run_property(prop, kernel, seed=7, limits=limits).status == PASSED
        runs.append(set(seen))
    first, rerun = runs
    masked = {s for s in rerun if s[4] is not None}
    biased = {s for s in rerun if s[5] is not None}
    assert masked and biased and max(len(s[5]) for s in biased) > 2  # padding or ALiBi shapes met
    assert rerun <= first, sorted(rerun - first)


def test_fewer_value_columns_meet_the_pooled_shapes_options() -> None:
    """SDPA-1.5, SDPA-1.1: for a kernel that needs E == Ev, a problem with fewer value
    columns (empty-sizes' Ev = 0) is called with v zero-padded to the pooled shape, and
    it takes that shape's tied dtype and options: every such call is a signature that
    output-shape-dtype's calls compiled already (each drew options of its own before, 6
    more compilations of the jitted JAX kernel's quick profile)."""
    calls: dict[str, list[tuple[Any, ...]]] = {}
    for prop in ("output-shape-dtype", "empty-sizes"):
        seen: list[tuple[Any, ...]] = []
        fn = recording(seen, record=compiled_for, mask=True, equal_head_dims=True)
        kernel = KernelUnderTest(fn, compiling())
        assert run_property(all_properties()[prop], kernel, seed=7).status == PASSED
        calls[prop] = seen
    padded_ev = {s for s in calls["empty-sizes"] if 0 not in (*s[0], *s[1])}
    assert padded_ev, "empty-sizes drew no Ev = 0 problem"
    assert padded_ev <= set(calls["output-shape-dtype"]), sorted(
        padded_ev - set(calls["output-shape-dtype"])
    )
