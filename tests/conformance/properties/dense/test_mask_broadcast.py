"""SDPA-3.1: mask-broadcast's per-head check gives each head its own slice of a full mask.

The check compares a call with the full mask against, for each head h, head h of a call
where every head is given head h's slice: calls on the problem's own shapes, so a backend
that compiles per shape compiles nothing more for it.  A kernel that reads another head's
slice (the first head's, or the key/value head's under GQA) gives some head another result.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from catalogue.blocks import arrange, attend
from support import compiling, recording, verdict_of

import attnspec
from attnspec.backends import Backend
from attnspec.conformance import KernelUnderTest, Problem, declare
from attnspec.conformance.judge.properties.masking import _each_head_with_its_slice_everywhere
from attnspec.conformance.judge.verdict import FAILED, PASSED, Verdict

NUMPY = Backend("numpy")


def mask_by_key_value_head(
    q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False, scale: Any = None
) -> Any:
    """Under GQA, gives query head h the mask slice of its key/value head h // G (a
    kernel that loads the mask per key/value head, as it loads K and V)."""
    if mask is not None and mask.ndim >= 3 and mask.shape[-3] == q.shape[-3] > k.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        by_kv_head = np.arange(q.shape[-3]) // groups * groups
        mask = np.take(mask, by_kv_head, axis=-3)
    return attend(arrange(q, k, v, mask=mask, is_causal=is_causal, scale=scale))


def reference(
    q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False, scale: Any = None
) -> Any:
    """The reference, undeclared (declare() marks the function it is given)."""
    return attnspec.scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=is_causal, scale=scale
    )


def problem(seed: int = 0) -> Problem:
    """Four query heads on two key/value heads, a random mask per head."""
    rng = np.random.default_rng(seed)
    q, k, v = (
        rng.standard_normal((4, 5, 3)),
        rng.standard_normal((2, 6, 3)),
        rng.standard_normal((2, 6, 3)),
    )
    return Problem(q=q, k=k, v=v, dtype="float64", mask=rng.random((4, 5, 6)) < 0.6)


def test_each_heads_own_slice_gives_the_full_masks_output_on_the_reference() -> None:
    """SDPA-3.1: on the reference, head h given its slice everywhere equals head h of the
    call with the full mask (the same arithmetic on the same row)."""
    kernel = KernelUnderTest(declare(reference, mask=True, gqa=True, batch_ndim=0), NUMPY)
    full = problem()
    assert np.array_equal(_each_head_with_its_slice_everywhere(kernel, full), kernel.output(full))


def test_a_kernel_reading_the_key_value_heads_slice_gives_other_heads_another_result() -> None:
    """SDPA-3.1, SDPA-6.1: a kernel giving query head h the mask of head h // G * G differs
    from the per-head check in the heads that are not first in their group."""
    kernel = KernelUnderTest(
        declare(mask_by_key_value_head, mask=True, gqa=True, batch_ndim=0), NUMPY
    )
    full = problem()
    differs = ~np.isclose(_each_head_with_its_slice_everywhere(kernel, full), kernel.output(full))
    assert not differs[[0, 2]].any() and differs[[1, 3]].any()


@functools.cache
def buggy_verdict(fn: Any, compiles_per_shape: bool) -> Verdict:
    """mask-broadcast's verdict on ``fn`` (declared with a mask and GQA) on NumPy, as it is
    or compiling per shape, its first failing example unshrunk (the status is asserted):
    run once for the tests that read it (the key/value head's slice on NumPy is read twice)."""
    buggy = declare(fn, mask=True, gqa=True)
    backend = compiling() if compiles_per_shape else NUMPY
    return verdict_of("mask-broadcast", buggy, backend=backend, shrink=False)


def test_mask_broadcast_fails_a_kernel_reading_the_key_value_heads_slice() -> None:
    """SDPA-3.1: mask-broadcast fails that kernel; the reference passes it."""
    assert buggy_verdict(mask_by_key_value_head, compiles_per_shape=False).status == FAILED
    correct = declare(reference, mask=True, gqa=True)
    assert verdict_of("mask-broadcast", correct).status == PASSED


def two_d_mask_ignored_past_nine_keys(
    q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False, scale: Any = None
) -> Any:
    """Drops an (Lq, Lk) mask when there are more than 9 keys: wrong only at sizes past the
    small stratum's (its lengths are at most 9)."""
    if mask is not None and mask.ndim == 2 and mask.shape[-1] > 9:
        mask = None
    return attend(arrange(q, k, v, mask=mask, is_causal=is_causal, scale=scale))


def test_pooled_realistic_examples_still_meet_every_mask_form() -> None:
    """SDPA-3.1: on a backend compiling per shape a pooled realistic example checks the
    one mask form tied to its shape; a kernel wrong only on (Lq, Lk) masks at realistic
    sizes is still caught there, as on NumPy, and the kernel reading the key/value head's
    slice too."""
    for fn in (two_d_mask_ignored_past_nine_keys, mask_by_key_value_head):
        for compiles_per_shape in (False, True):
            verdict = buggy_verdict(fn, compiles_per_shape)
            assert verdict.status == FAILED, (fn.__name__, compiles_per_shape, verdict.detail)


def mask_shape_per_call(q: Any, k: Any, v: Any, **options: Any) -> tuple[Any, ...]:
    """Per call: q's shape, the mask's shape (None: no mask) and the number of keys."""
    mask = options["mask"]
    return tuple(q.shape), None if mask is None else tuple(mask.shape), k.shape[-2]


MaskCall = tuple[tuple[int, ...], tuple[int, ...] | None, int]


@functools.cache
def calls_of_a_correct_kernel(compiles_per_shape: bool) -> tuple[str, tuple[MaskCall, ...]]:
    """mask-broadcast's status on the reference (a mask, GQA, no bias) on NumPy, as it is or
    compiling per shape, and each of its calls' :func:`mask_shape_per_call`: one run of each,
    read by the two tests below (the compiling run by both)."""
    seen: list[MaskCall] = []
    kernel = recording(seen, record=mask_shape_per_call, mask=True, bias=False)
    backend = compiling() if compiles_per_shape else NUMPY
    return verdict_of("mask-broadcast", kernel, backend=backend).status, tuple(seen)


def test_pooled_realistic_examples_spread_over_the_mask_forms() -> None:
    """SDPA-3.1: the form a pooled realistic example checks is tied to its stratum and
    shape, not Hypothesis's simplest draw (which a stratum of one example always takes):
    over the quick profile's realistic strata a correct kernel meets 1-d and (Lq, Lk)
    masks past the small stratum's 9 keys, and full ones."""
    status, seen = calls_of_a_correct_kernel(compiles_per_shape=True)
    assert status == PASSED
    ranks = {
        len(mask) if len(mask) < 3 else 4 if mask[-3] == q[-3] else 3
        for q, mask, n_keys in seen
        if mask is not None and n_keys > 9
    }
    assert {1, 2, 4} <= ranks, ranks


def test_a_pooled_small_shape_meets_one_drawn_mask_shape_per_run() -> None:
    """SDPA-3.1: on a backend compiling per shape, the broadcastable mask shape drawn for a
    small pooled shape is tied to it (shape_pool.TIED_LABELS), so each meets at most four
    mask shapes a run (that one, the 1-d key mask, the (Lq, Lk) mask and the full mask),
    each a compilation; elsewhere the drawn shape varies from example to example."""
    met: list[dict[tuple[int, ...], set[tuple[int, ...]]]] = []
    for compiles_per_shape in (False, True):
        status, seen = calls_of_a_correct_kernel(compiles_per_shape)
        assert status == PASSED
        shapes: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        for q_shape, mask_shape, n_keys in seen:
            if mask_shape is not None and n_keys <= 9:  # the small stratum's lengths
                shapes.setdefault(q_shape, set()).add(mask_shape)
        met.append(shapes)
    drawn, pooled = met
    assert pooled and max(len(masks) for masks in pooled.values()) <= 4, pooled
    broadcasts = {tuple(n == 1 for n in m) for masks in drawn.values() for m in masks}
    assert len(broadcasts) > 8, broadcasts  # which axes broadcast, and how many there are
