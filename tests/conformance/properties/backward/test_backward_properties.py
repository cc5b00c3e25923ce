"""The backward properties (spec/backward.md, ``attnspec check --backward``) on the
frameworks' own gradients: PyTorch's math SDPA through torch.autograd and
jax.nn.dot_product_attention under jax.jit through jax.vjp pass every one; the backward
runs where the kernel runs (its own process, a "vjp" request) with the same verdicts as
in this process; and the claim's usage errors.  The catalogue's buggy and correct
backward passes are judged in tests/catalogue/test_backward.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from oracle_backward import gradients as oracle_gradients
from support import (
    QUICK_XLA_COMPILES,
    SMALL_LIMITS,
    SMALL_SIZES,
    backend_or_skip,
    checked_with_the_kernel_in_its_own_process,
    jax_compiles_quickly,
    verdict_of,
)

from attnspec.backends import Backend
from attnspec.conformance.api import check
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.claims.declaration import KernelDeclaration, declaration_of
from attnspec.conformance.judge.failures import PropertyFailure
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.properties.backward import assert_gradients_match, call_backward
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, NOT_APPLICABLE, PASSED, Verdict
from attnspec.conformance.kernels.known import target_write_ups
from attnspec.conformance.run.kernel_setup import SetupError, kernel_function
from attnspec.conformance.run.root_causes import confirmed_link

SDPA_MATH = "attnspec.conformance.kernels.torch_sdpa:sdpa_math"
JAX_JITTED = "attnspec.conformance.kernels.jax_jitted:jitted_dot_product_attention"
# The dtypes JAX's kernel is checked in here: those of JAX's defaults.  JAX's x64 setting is
# process-wide, and the reference tests' backend fixture turns it on (REFERENCE_CONFIG) for
# the rest of an xdist worker's tests; a check after them took float64 too, which
# jax.nn.dot_product_attention computes at about float32's precision (docs/divergences.md,
# JAX's TOL-2), and failed gradients-linear-in-upstream, -gqa-reduction and -bias-reduction
# (reproduced: tests/backends/test_backends.py::test_jax_float64_is_float64 run first).
CHECKED_DTYPES: dict[str, tuple[str, ...] | None] = {"torch": None, "jax": ("bfloat16", "float32")}


def backward_properties() -> list[str]:
    return [p.id for p in all_properties().values() if p.clause.startswith("BWD-")]


def test_every_backward_clause_with_a_property_is_cited() -> None:
    """BWD-1 … BWD-5, BWD-8 … BWD-13, BWD-15, BWD-17, BWD-18, BWD-19: the clauses the
    backward properties check, each by at least one property."""
    clauses = {all_properties()[p].clause for p in backward_properties()}
    checked = ("1", "2", "3", "4", "5", "8", "9", "10", "11", "12", "13", "15", "17", "18", "19")
    assert clauses == {f"BWD-{n}" for n in checked}


@pytest.mark.parametrize(("target", "backend"), [(SDPA_MATH, "torch"), (JAX_JITTED, "jax")])
def test_framework_gradients_pass(target: str, backend: str) -> None:
    """BWD-1 … BWD-5, BWD-15, BWD-17: torch.autograd of PyTorch's math SDPA and jax.vjp of
    the jitted jax.nn.dot_product_attention pass every backward property of the quick
    profile (BWD-4 not applicable to JAX, which waives SDPA-5.1), but for failures the check
    confirms by a write-up: JAX's fill above a finfo.min bias
    (docs/divergences.md#jax-fill-outranks-min-bias), which gradients-excluded-keys-zero's
    fixed finfo.min problems meet on every seed, and gradients-match-reference where the
    padded-batch anchor reaches it."""
    backend_or_skip(backend)
    report = check(
        target,
        backend=backend,
        only=backward_properties(),
        backward=True,
        dtypes=CHECKED_DTYPES[backend],
    )
    statuses = {v.property: v.status for v in report.verdicts}
    assert set(statuses) == set(backward_properties())
    accepted = (PASSED, "waived", NOT_APPLICABLE)
    write_ups = target_write_ups(target)
    failing = {
        v.property: v.detail
        for v in report.verdicts
        if v.status not in accepted and not confirmed_link(v, write_ups)
    }
    assert failing == {}
    confirmed = {v.property for v in report.verdicts if v.status not in accepted}
    if backend == "jax":  # the fixed finfo.min problems find it on every seed
        assert "gradients-excluded-keys-zero" in confirmed
        assert confirmed <= {"gradients-excluded-keys-zero", "gradients-match-reference"}
    else:
        assert confirmed == set()


@pytest.mark.parametrize(("target", "backend"), [(SDPA_MATH, "torch"), (JAX_JITTED, "jax")])
def test_gradients_in_the_kernels_process_match_in_process(
    target: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BWD-1, BWD-17: with the kernel in its own process (a "vjp" request: the gradients
    computed there by torch.autograd or jax.vjp, sent back as plain data) the verdicts are
    those of the in-process call, for a kernel the judge pads to E = Ev too (JAX's).

    JAX's kernel is the jitted one: jax.nn.dot_product_attention run op by op compiled
    every operation per shape in both processes (33 CPU-s, the suite's longest test; 18
    jitted); the sizes are capped (SMALL_SIZES): what is compared is the two routes'
    verdicts, not the sizes drawn. JAX's fails gradients-excluded-keys-zero on both routes:
    docs/divergences.md#jax-fill-outranks-min-bias, confirmed.  Where this process's JAX
    compiles with support.QUICK_XLA_COMPILES (XLA's elemental emitters and unsplit code
    generation, not an optimisation level), the kernel's process gets the same options,
    so both routes run the kernel compiled alike (11.3 -> 6.7 CPU-s of that process,
    single-threaded, with the emitters); every check of this process's own,
    test_framework_gradients_pass included, already runs under them.

    Both kernels are judged in this process, as the in-process route is, each kernel in a
    process of its own (support.checked_with_the_kernel_in_its_own_process: the kernel's
    process is the boundary compared; a judging worker would import the kernel's library
    once more).  JAX's is checked in JAX's default dtypes on both routes (CHECKED_DTYPES),
    so this process's x64 setting, on after the reference tests (REFERENCE_CONFIG), leaves
    its verdicts as they were (checked: passes after test_jax_float64_is_float64)."""
    backend_or_skip(backend)
    if backend == "jax" and jax_compiles_quickly():
        monkeypatch.setenv("XLA_FLAGS", QUICK_XLA_COMPILES)
    only = ["gradients-gqa-reduction", "gradients-excluded-keys-zero"]
    isolated = checked_with_the_kernel_in_its_own_process(
        target,
        backend=backend,
        only=only,
        limits=SMALL_LIMITS,
        backward=True,
        dtypes=CHECKED_DTYPES[backend],
    )
    local = check(
        target,
        backend=backend,
        only=only,
        backward=True,
        dtypes=CHECKED_DTYPES[backend],
        **SMALL_SIZES,
    )
    assert [(v.property, v.status) for v in isolated.verdicts] == [
        (v.property, v.status) for v in local.verdicts
    ]
    write_ups = target_write_ups(target)
    failed = {v.property for v in isolated.verdicts if v.status != PASSED}
    unconfirmed = [
        v.detail
        for v in isolated.verdicts
        if v.status != PASSED and not confirmed_link(v, write_ups)
    ]
    assert unconfirmed == []
    # jax.nn's fill above a finfo.min bias, found by the fixed problems through both routes
    assert failed == ({"gradients-excluded-keys-zero"} if backend == "jax" else set())


def test_backward_needs_a_claim() -> None:
    """BWD-1: without --backward the backward properties are not applicable."""
    backend_or_skip("torch")
    kernel = KernelUnderTest(
        __import__("torch").nn.functional.scaled_dot_product_attention, Backend("torch")
    )
    verdict = verdict_of("gradients-match-reference", kernel)
    assert verdict.status == NOT_APPLICABLE


def test_backward_without_automatic_differentiation_is_a_usage_error() -> None:
    """BWD-1: --backward on NumPy (no automatic differentiation) and no --backward-fn is
    a usage error naming both ways out."""

    def kernel(q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False,
               scale: float | None = None) -> Any:  # fmt: skip
        return q

    with pytest.raises(SetupError, match="--backward-fn"):
        check(kernel, backend="numpy", backward=True)


def test_bad_backward_fn_is_refused() -> None:
    """BWD-1: backward_fn is None, a callable or 'MODULE:FUNC'."""
    with pytest.raises(ValueError, match="backward_fn"):
        KernelDeclaration(backward_fn="not a target")
    assert KernelDeclaration(backward_fn="m:f").backward_fn == "m:f"


def test_a_kernel_without_masks_or_causal_is_still_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BWD-1: for a kernel that claims neither masks nor causal calls, the fixed backward
    properties check the plain problems: the catalogue's backward without the delta term
    fails gradients-softmax-identity there too (it would pass a property that checks
    nothing)."""
    backend_or_skip("torch")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    report = check(
        "catalogue.backward_kernels:flash2_no_delta",
        backend="torch",
        only=["gradients-softmax-identity"],
        mask=False,
        causal=False,
    )
    assert [v.status for v in report.verdicts] == [FAILED]


def test_abatch_elements_bound_is_its_own() -> None:
    """BWD-19's premise: BWD-17's bound (and the definition) of one batch element, from a
    call on a batch of three with a bias of its own per element, GQA, a mask and causal,
    is that of the element alone, so gradients-batch-composition's 2x bound holds for
    every pair of calls; with a bias broadcast over the batch its gradient is not."""
    import numpy as np

    from attnspec.conformance.judge.properties.backward import batch_element
    from attnspec.reference.tolerance_backward import gradient_error_bound

    rng = np.random.default_rng(19)

    def rounded(*shape: int) -> Any:
        return rng.standard_normal(shape).astype(np.float32).astype(np.float64)

    q, k, v, grad_out = (
        rounded(3, 4, 9, 8),
        rounded(3, 2, 11, 8),
        rounded(3, 2, 11, 5),
        rounded(3, 4, 9, 5),
    )
    options = {"mask": rng.random((3, 1, 9, 11)) < 0.8, "is_causal": True, "dtype": "float32"}
    for bias, own in ((rounded(3, 4, 9, 11), True), (rounded(4, 9, 11), False)):
        batched = gradient_error_bound(q, k, v, grad_out, bias=bias, **options)
        for element in range(3):

            def alone(a: Any, index: tuple[int, ...] = (element,)) -> Any:
                return batch_element(a, 4, index)

            single = gradient_error_bound(
                *(alone(a) for a in (q, k, v, grad_out)),
                bias=alone(bias),
                **{**options, "mask": alone(options["mask"])},
            )
            if not own:  # the sum over the batch: not one element's
                assert not np.allclose(single.dbias, batched.dbias)
            for name, got, expected in zip(single._fields, single, batched, strict=True):
                if name.startswith("dbias") and not own:
                    continue
                np.testing.assert_allclose(got, alone(expected), rtol=1e-12, err_msg=name)


def test_jax_fill_outranks_a_finfo_min_bias_in_the_backward() -> None:
    """BWD-3, BWD-17 (docs/divergences.md#jax-fill-outranks-min-bias): the write-up's minimal
    case, key 1 excluded by the causal rule and both keys' bias float32's finfo.min, through
    jax.vjp of the jitted kernel with dO = 1: its dv is [0, 1] (the excluded key takes the
    row's weight), the float64 loop oracle's [1, 0] (BWD-3: the excluded key's dv is exactly
    0).  The gradients' judging fails it at that key, and the check files the failure
    under the write-up.  Where every key is allowed to some row of such an element, BWD-17's
    bound there charges the rounding of s + finfo.min (~1e31) and passes it: the reason the
    quick profile at SMALL_SIZES finds it (the padded anchor's mask excludes keys 62 and 63
    from every row) and at the default sizes does not (causal alone, no mask)."""
    backend_or_skip("jax")
    fn = kernel_function(JAX_JITTED)
    kernel = KernelUnderTest(fn, Backend("jax"), replace(declaration_of(fn), backward=True))
    min_bias = float(np.finfo(np.float32).min)
    problem = Problem(
        q=np.ones((1, 1, 1, 1)),
        k=np.asarray([1.0, -1.0]).reshape(1, 1, 2, 1),
        v=np.asarray([2.0, 4.0]).reshape(1, 1, 2, 1),
        dtype="float32",
        bias=np.full((1, 1, 1, 2), min_bias),
        is_causal=True,
    )
    grad_out = np.ones((1, 1, 1, 1))
    want = oracle_gradients(
        problem.q, problem.k, problem.v, grad_out,
        allowed=np.asarray([True, False]).reshape(1, 1, 1, 2), bias=problem.bias,
    )  # fmt: skip
    assert want[2].ravel().tolist() == [1.0, 0.0]
    got = call_backward(kernel, problem, grad_out)
    assert got.dv.ravel().tolist() == [0.0, 1.0]
    excluded_key_dv = r"^dv\[0, 0, 1, 0\] = 1\.0, but should be 0\.0 within \d\.\d+e-\d+;"
    with pytest.raises(PropertyFailure, match=excluded_key_dv) as failed:
        assert_gradients_match(kernel, problem, grad_out, got)
    verdict = Verdict(
        "gradients-match-reference", "BWD-17", "MUST", FAILED,
        detail=str(failed.value), counterexample=problem.describe(),
    )  # fmt: skip
    link = confirmed_link(verdict, target_write_ups(JAX_JITTED))
    assert link == "docs/divergences.md#jax-fill-outranks-min-bias"
