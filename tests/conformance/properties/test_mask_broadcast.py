"""SDPA-3.1: mask-broadcast's per-head check gives each head its own slice of a full mask.

The check compares a call with the full mask against, for each head h, head h of a call
where every head is given head h's slice: calls on the problem's own shapes, so a backend
that compiles per shape compiles nothing more for it.  A kernel that reads another head's
slice (the first head's, or the key/value head's under GQA) gives some head another result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from catalogue.blocks import arrange, attend
from support import verdict_of

import attnspec
from attnspec.backends import Backend
from attnspec.conformance import KernelUnderTest, Problem, declare
from attnspec.conformance.properties.masking import _each_head_with_its_slice_everywhere
from attnspec.conformance.runner import FAILED, PASSED

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


def test_mask_broadcast_fails_a_kernel_reading_the_key_value_heads_slice() -> None:
    """SDPA-3.1: mask-broadcast fails that kernel; the reference passes it."""
    buggy = declare(mask_by_key_value_head, mask=True, gqa=True)
    assert verdict_of("mask-broadcast", buggy, shrink=False).status == FAILED
    correct = declare(reference, mask=True, gqa=True)
    assert verdict_of("mask-broadcast", correct).status == PASSED
