"""The feature claims end to end: flags, the keywords the kernel gets, the claim line,
the worker, reproductions (issue 8).

The kernels are tiny files in ``tmp_path`` calling the reference, as a FlashAttention- or
FlexAttention-style wrapper would: keywords ``softcap``, ``alibi_slopes``, ``return_lse``
(set by ``--lse-keyword``), ``dropout_p``/``seed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnspec.backends import Backend
from attnspec.conformance import KernelDeclaration, cli
from attnspec.conformance.claims import claim_features, suite_keywords
from attnspec.conformance.kernel import KernelUnderTest, Problem
from attnspec.conformance.reproduction import snippet

KERNELS = '''
import math
import numpy as np
from attnspec.reference import scaled_dot_product_attention as sdpa


def flash_like(q, k, v, *, mask=None, is_causal=False, scale=None, softcap=None,
               alibi_slopes=None, return_lse=False):
    out, lse = sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale, softcap=softcap,
                    alibi_slopes=alibi_slopes, return_lse=True)
    return (out, lse) if return_lse else out


def lse_base_two(q, k, v, *, mask=None, is_causal=False, scale=None, softcap=None,
                 alibi_slopes=None, return_lse=False):
    out, lse = flash_like(q, k, v, mask=mask, is_causal=is_causal, scale=scale,
                          softcap=softcap, alibi_slopes=alibi_slopes, return_lse=True)
    return out, lse / math.log(2)


def dropout(q, k, v, *, mask=None, is_causal=False, scale=None, dropout_p=0.0, rng_seed=None):
    shape = (*np.broadcast_shapes(q.shape[:-3], k.shape[:-3]), q.shape[-3], q.shape[-2],
             k.shape[-2])
    keep = np.random.default_rng(rng_seed).random(shape) >= dropout_p
    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                dropout_keep=keep)
'''
FEATURES = "softcap-matches-reference,alibi-matches-reference,lse-matches-reference,lse-empty-rows"


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    path = tmp_path / "kernels.py"
    path.write_text(KERNELS, encoding="utf-8")
    return path


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(("flags", "expected"), [
    (["--softcap-keyword", "logit_cap"], {"softcap_keyword": "logit_cap", "softcap": True}),
    (["--alibi-builtin-slopes"], {"alibi_builtin_slopes": True, "alibi": True}),
    (["--lse-keyword", "return_softmax_lse"],
     {"lse_keyword": "return_softmax_lse", "returns_lse": True}),
    (["--dropout-seed-keyword", "rng_seed"], {"dropout_seed_keyword": "rng_seed",
                                              "dropout": True}),
    (["--no-dropout-seeded", "--dropout"], {"dropout_seeded": False, "dropout": True}),
])
def test_feature_flags_set_their_claims(flags: list[str], expected: dict[str, Any]) -> None:
    """CONF-3: each feature flag (one row of the claims table) sets its field, and a
    keyword flag turns its feature on."""
    args = cli.build_parser().parse_args(["check", "m:f", *flags])
    assert cli.claims_from(args) == expected


def test_claims_give_keywords_and_claim_words() -> None:
    """CONF-1, CONF-3: the keywords the suite passes and the words of the claim line."""
    declaration = KernelDeclaration(softcap=True, alibi=True, lse_keyword="return_lse",
                                    returns_lse=True, dropout=True,
                                    dropout_seed_keyword="rng_seed")
    assert {"softcap", "alibi_slopes", "return_lse", "dropout_p", "rng_seed"} <= set(
        suite_keywords(declaration))
    assert claim_features(declaration)[-4:] == ["softcap", "ALiBi", "log-sum-exp", "dropout"]


def test_flash_like_kernel_conforms_through_the_worker(capsys: pytest.CaptureFixture[str],
                                                       kernels: Path) -> None:
    """SOFTCAP-1, ALIBI-2, LSE-1, LSE-2: a kernel taking softcap=, alibi_slopes= and
    return_lse= passes, in the worker process (the features travel with each problem),
    and all four pass."""
    status, out, err = run_main(capsys, "check", f"{kernels}:flash_like", "--softcap",
                                "--alibi", "--lse-keyword", "return_lse", "--only", FEATURES)
    assert status == 0, out + err
    assert "4 passed" in out


def test_base_two_lse_fails_with_a_reproduction(capsys: pytest.CaptureFixture[str],
                                               kernels: Path) -> None:
    """LSE-1: a log-sum-exp in base 2 fails lse-matches-reference, exit 1."""
    status, out, _ = run_main(capsys, "check", f"{kernels}:lse_base_two", "--softcap",
                              "--alibi", "--returns-lse", "--only", "lse-matches-reference")
    assert status == 1
    assert "TOL-5" in out


def test_dropout_kernel_with_a_renamed_seed(capsys: pytest.CaptureFixture[str],
                                           kernels: Path) -> None:
    """DROP-1 ... DROP-4: a kernel whose seed keyword is rng_seed passes every dropout
    property; without --dropout they are not applicable."""
    status, out, err = run_main(capsys, "check", f"{kernels}:dropout", "--dropout-seed-keyword",
                                "rng_seed", "--dtype", "float64", "--only",
                                "dropout-zero,dropout-rescaling,dropout-seed,dropout-kept-fraction")
    assert status == 0, out + err
    status, out, _ = run_main(capsys, "check", f"{kernels}:dropout", "--only", "dropout-seed")
    assert "not applicable" in out


def test_reproduction_rebuilds_the_features(kernels: Path) -> None:
    """The reproduction snippet passes softcap, float32 slopes and return_lse to the kernel
    and unpacks (out, lse); running it prints the kernel's output."""
    from attnspec.conformance.kernel import load_kernel

    fn = load_kernel(f"{kernels}:flash_like")
    declaration = KernelDeclaration(softcap=True, alibi=True, lse_keyword="return_lse",
                                    returns_lse=True)
    kernel = KernelUnderTest(fn, Backend("numpy"), declaration, target=f"{kernels}:flash_like")
    rng = np.random.default_rng(0)
    problem = Problem(q=rng.standard_normal((1, 2, 3, 4)), k=rng.standard_normal((1, 2, 5, 4)),
                      v=rng.standard_normal((1, 2, 5, 2)), dtype="float64", softcap=3.0,
                      alibi_slopes=np.array([0.5, 0.25]))
    code = snippet(problem, kernel)
    assert "softcap=3.0" in code and "out, lse = fn(" in code
    assert "alibi_slopes = backend.asarray(problem.alibi_slopes, 'float32')" in code
    out, lse, dtype = kernel.run_with_lse(problem)
    assert out.shape == (1, 2, 3, 2) and lse.shape == (1, 2, 3) and dtype == "float64"
