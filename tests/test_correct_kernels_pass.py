"""The zero-false-failure run (issue 4): correct kernels pass every applicable property.

Kernels: the independently written NumPy formulations of ``catalogue.correct``, the
reference itself (declared with bias and GQA: plain, returning weights, bottom-right),
and PyTorch's ``scaled_dot_product_attention`` on the torch backend.  PyTorch is not
known-correct: a property on which it diverges from the spec is left out of its run only
when the divergence is confirmed against the float64 definition by a test of its own.
Each (kernel, property) runs over 20 seeds, each seed a fresh Hypothesis stream; a
property that fails a correct kernel on any seed fails the test.

Budget: EXAMPLES_PER_SEED examples per seed (40 per property and kernel, twice the
quick profile) through a dedicated settings profile; the properties are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from catalogue.correct import CORRECT

from attnspec.backends import Backend, BackendError
from attnspec.conformance import declaration_of
from attnspec.conformance.kernel import KernelUnderTest
from attnspec.conformance.registry import all_properties
from attnspec.conformance.runner import (
    NOT_APPLICABLE,
    PASSED,
    PROFILES,
    WARNING,
    run_property,
)
from attnspec.reference import scaled_dot_product_attention as reference_sdpa

SEEDS = range(20)
EXAMPLES_PER_SEED = 2
PROFILE = "zero-false-failure"


@dataclass(frozen=True)
class Subject:
    """A kernel believed correct, on a backend, with claims added to its declaration."""

    name: str
    fn: Callable[..., Any]
    backend: str = "numpy"
    claims: dict[str, Any] = field(default_factory=dict)
    # property id -> why it is not run here (a divergence confirmed by its own test)
    divergences: dict[str, str] = field(default_factory=dict)


def _torch_sdpa() -> Callable[..., Any]:
    torch = pytest.importorskip("torch", reason="torch SDPA needs the torch extra")
    return torch.nn.functional.scaled_dot_product_attention


TORCH_NAN_LEAK = "pytorch #101967: NaN at masked keys/values leaks via 0 * NaN (SDPA-8.2)"
WITH_BIAS_AND_GQA = {"bias": True, "gqa": True}
SUBJECTS: list[Subject] = [
    *(Subject(c.name, c.fn, c.backend) for c in CORRECT),
    Subject("reference", reference_sdpa, claims=WITH_BIAS_AND_GQA),
    Subject("reference-with-weights", reference_sdpa,
            claims={**WITH_BIAS_AND_GQA, "returns_weights": True,
                    "extra_kwargs": {"return_weights": True}}),
    Subject("reference-bottom-right", reference_sdpa,
            claims={**WITH_BIAS_AND_GQA, "causal_alignment": "bottom_right",
                    "extra_kwargs": {"causal_alignment": "bottom_right"}}),
    Subject("torch-sdpa", _torch_sdpa, backend="torch",
            divergences={"masked-nonfinite-ignored": TORCH_NAN_LEAK}),
]


@pytest.fixture(autouse=True)
def _seed_profile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A settings profile of EXAMPLES_PER_SEED examples, used once per seed."""
    monkeypatch.setitem(PROFILES, PROFILE, EXAMPLES_PER_SEED)
    yield


def _kernel(subject: Subject) -> KernelUnderTest:
    fn = subject.fn() if subject.fn is _torch_sdpa else subject.fn
    try:
        backend = Backend(subject.backend)
    except BackendError as exc:
        pytest.skip(f"backend {subject.backend!r} unusable here: {exc}")
    return KernelUnderTest(fn, backend, declaration_of(fn, **subject.claims))


CASES = [
    pytest.param(subject, prop_id, id=f"{subject.name}-{prop_id}")
    for subject in SUBJECTS
    for prop_id in all_properties()
    if prop_id not in subject.divergences
]


@pytest.mark.parametrize(("subject", "prop_id"), CASES)
def test_correct_kernel_passes(subject: Subject, prop_id: str) -> None:
    """CONF-1/CONF-3: a correct kernel gets "passed" from every property it claims, and
    "not applicable" from the others, on every one of 20 seeds."""
    kernel = _kernel(subject)
    prop = all_properties()[prop_id]
    bad = []
    for seed in SEEDS:
        verdict = run_property(prop, kernel, profile=PROFILE, seed=seed)
        if verdict.status not in (PASSED, NOT_APPLICABLE):
            bad.append(f"seed {seed}: {verdict.status}: {verdict.detail}\n"
                       f"  inputs: {verdict.counterexample}")
        if verdict.status == NOT_APPLICABLE:
            break  # decided by the declaration alone: the same on every seed
    assert not bad, (f"{prop_id} ({prop.clause}) on correct kernel {subject.name}:\n"
                     + "\n".join(bad[:3]))


def test_torch_nan_leak_is_a_real_divergence() -> None:
    """SDPA-8.2: torch SDPA's warning from masked-nonfinite-ignored is PyTorch's own
    divergence (pytorch #101967), confirmed against the float64 definition: NaN written
    into a masked value row turns finite outputs into NaN."""
    torch = pytest.importorskip("torch", reason="torch SDPA needs the torch extra")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    mask = np.ones((3, 3), dtype=bool)
    mask[:, 0] = False  # key 0 masked for every query
    v[:, 0, :] = np.nan
    expected = reference_sdpa(q, k, v, mask=mask)  # float64 definition
    out = sdpa(*(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(mask))
    assert np.isfinite(expected).all()
    assert np.isnan(out.numpy()).all()
    kernel = _kernel(next(s for s in SUBJECTS if s.name == "torch-sdpa"))
    verdict = run_property(all_properties()["masked-nonfinite-ignored"], kernel)
    assert verdict.status == WARNING, verdict.detail
