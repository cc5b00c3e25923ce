"""The forward pass of the backward catalogue's correct kernels (tests/catalogue/
backward_kernels.py) against every forward property it declares (CONF-1): a correct
formulation claims bias, GQA, softcap, ALiBi and the log-sum-exp, and must implement them.

The four correct kernels share one forward, ``plain_forward`` (through the custom
autograd.Function for ``flash2`` and ``numpy_split_kv``, called directly for
``autograd_plain`` and ``explicit_flash2``): the full quick forward check runs once, on
``flash2`` (~10 CPU-s, nearly all of it Hypothesis drawing the problems, whatever the size
caps), and the others are shown to return the same arrays bit for bit on a problem with
every declared feature, ALiBi slopes per batch element included (the shape the forward
once broadcast along the key axis: ALIBI-1).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from support import SMALL_SIZES, one_torch_thread

torch = pytest.importorskip("torch", reason="the catalogue's backward kernels are torch's")

from attnspec.conformance.api import check  # noqa: E402
from attnspec.conformance.judge.verdict import FAILED  # noqa: E402
from catalogue import backward_kernels  # noqa: E402
from catalogue.backward_kernels import CORRECT_KERNELS  # noqa: E402

single_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


def test_shared_forward_conforms_on_the_quick_profile() -> None:
    """SDPA-*, SOFTCAP-1, ALIBI-1, ALIBI-2, LSE-1 … LSE-3: ``flash2``'s forward passes every
    forward property of the quick profile it declares (SHOULD warnings aside)."""
    report = check(
        "catalogue.backward_kernels:flash2",
        backend="torch",
        profile="quick",
        backward=False,
        **SMALL_SIZES,
    )
    failed = [(v.property, v.detail) for v in report.verdicts if v.status == FAILED]
    assert failed == []
    ran = {v.property for v in report.verdicts if v.status != "not applicable"}
    assert {"alibi-matches-reference", "softcap-matches-reference", "lse-empty-rows"} <= ran


def _every_feature() -> Iterator[dict[str, object]]:
    """Inputs with GQA, a mask, a bias, softcap, ALiBi slopes of shape (B, Hq) and
    (Hq), bottom-right causal, and an empty key axis."""
    rng = np.random.default_rng(31)
    for n_keys, slopes_shape in ((7, (2, 4)), (7, (4,)), (0, (2, 4))):

        def tensor(*shape: int) -> object:
            return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))

        yield {
            "q": tensor(2, 4, 5, 8),
            "k": tensor(2, 2, n_keys, 8),
            "v": tensor(2, 2, n_keys, 3),
            "mask": torch.from_numpy(rng.random((2, 1, 5, n_keys)) < 0.8),
            "bias": tensor(1, 4, 5, n_keys),
            "is_causal": True,
            "causal_alignment": "bottom_right",
            "softcap": 3.0,
            "alibi_slopes": torch.from_numpy(rng.random(slopes_shape).astype(np.float32)),
        }


@pytest.mark.parametrize("name", sorted(set(CORRECT_KERNELS) - {"flash2"}))
def test_correct_kernels_share_the_checked_forward(name: str) -> None:
    """CONF-1: each other correct kernel's forward returns ``flash2``'s output and
    log-sum-exp bit for bit, so the check above is a check of theirs."""
    kernel = getattr(backward_kernels, CORRECT_KERNELS[name])
    for inputs in _every_feature():
        q, k, v = inputs.pop("q"), inputs.pop("k"), inputs.pop("v")
        for got, expected in zip(
            kernel(q, k, v, **inputs), backward_kernels.flash2(q, k, v, **inputs), strict=True
        ):
            assert torch.equal(got, expected), (name, tuple(k.shape))
