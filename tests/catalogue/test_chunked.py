"""The conformance suite on the chunked-local catalogue (tests/catalogue/chunked.py): the
correct formulations pass chunk-matches-reference (CHUNK-1), every catalogued bug fails it."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support import SMALL_LIMITS, assert_bug_caught, backend_or_skip, verdict_of

from attnspec.conformance import KernelUnderTest, declaration_of
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.reproduce import snippet
from catalogue import chunked as catalogue
from catalogue.entry import CaughtBug, witness


@pytest.mark.parametrize("fn", catalogue.CORRECT, ids=lambda fn: fn.__name__)
def test_correct_chunk_kernels_pass(fn: Callable[..., Any]) -> None:
    """CHUNK-1: Llama 4's chunk mask (bottom-right) and FlashAttention 3's window of t mod C
    keys (top-left), with masks, bias, GQA, softcap and causal calls, pass on quick."""
    verdict = verdict_of(
        catalogue.PROPERTY, fn, declaration=declaration_of(fn), profile="quick", limits=SMALL_LIMITS
    )
    assert verdict.status == "passed", verdict.detail


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_chunk_bug_is_caught(bug: CaughtBug) -> None:
    """CHUNK-1: chunks counted from the query index, a chunk without its causal bound, and a
    chunk dropped in causal calls fail chunk-matches-reference on quick."""
    assert_bug_caught(bug)


def test_the_chunk_property_is_catalogued() -> None:
    """CHUNK-1: the only chunk property is the one the catalogue's bugs fail."""
    chunk = {p for p in all_properties() if p.startswith("chunk-")}
    assert chunk == {bug.catches for bug in catalogue.BUGS} == {catalogue.PROPERTY}


def test_a_chunk_failure_reproduces_with_its_chunk() -> None:
    """CHUNK-1: the reproduction of a problem with a chunk (Problem(chunk=C), as the property
    makes it) passes attention_chunk= to the kernel and compares with the chunked definition,
    so, run on its own, a kernel that counts chunks from the query index is outside the
    bound (one query, the newest of three keys, chunks of one position: it sees key 0)."""
    problem = witness(n_queries=1, n_keys=3, chunk=1)
    kernel = KernelUnderTest(catalogue.chunk_query_index, backend_or_skip("numpy"))
    reproduction = snippet(problem, kernel)
    assert "attention_chunk=1" in reproduction and " chunk=1," in reproduction
    scope: dict[str, Any] = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(reproduction, scope)
    bound = scope["bound"]
    error = np.abs(np.asarray(scope["out"], np.float64) - np.asarray(bound.out))
    assert np.all(error > np.asarray(bound.out_tolerance)), reproduction
