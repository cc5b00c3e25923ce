"""The feature claims end to end: flags, the keywords the kernel gets, the claim line,
the worker, reproductions (CONF-3).

The kernels are tiny files in ``tmp_path`` calling the reference, as a FlashAttention- or
FlexAttention-style wrapper would: keywords ``softcap``, ``alibi_slopes``, ``return_lse``
(set by ``--lse-keyword``), ``dropout_p``/``seed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import SMALL_SIZE_FLAGS, run_main

from attnspec.backends import Backend
from attnspec.conformance import KernelDeclaration, PagedBatchClaim, RecurrentClaim, cli
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.claims.flags import UsageError
from attnspec.conformance.claims.table import claim_features, claims_from, suite_keywords
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.reproduce import snippet


def run_check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``attnspec check ARGV`` in this process (the kernel in a worker, as a user runs it)
    with sizes capped: these tests read what the flags declare and the kernel gets; every
    stratum and anchor still runs, cut to small sizes."""
    return run_main(capsys, "check", *argv, *SMALL_SIZE_FLAGS)


KERNELS = """
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


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, softcap=None, alibi_slopes=None,
                           return_lse=False):
    from attnspec.reference import varlen_attention

    out, lse = varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal=causal,
                                causal_alignment="bottom_right", scale=softmax_scale,
                                softcap=softcap, alibi_slopes=alibi_slopes, return_lse=True)
    return (out, lse) if return_lse else out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None,
                            block_table=None, softmax_scale=None, causal=False, softcap=None,
                            alibi_slopes=None, return_softmax_lse=False):
    # FlashAttention's (B, L, H, E) layout: the reference in the spec's, written back in place
    from attnspec.reference import append_to_cache, kv_cache_attention

    swap = (0, 2, 1, 3)
    spec = [None if a is None else a.transpose(swap) for a in (q, k_cache, v_cache, k, v)]
    out, lse = kv_cache_attention(spec[0], spec[1], spec[2], cache_seqlens, k=spec[3],
                                  v=spec[4], block_table=block_table, is_causal=causal,
                                  scale=softmax_scale, softcap=softcap,
                                  alibi_slopes=alibi_slopes, return_lse=True)
    if k is not None:
        new_k, new_v = append_to_cache(spec[1], spec[2], cache_seqlens, spec[3], spec[4],
                                       block_table=block_table)
        k_cache[...] = new_k.transpose(swap)
        v_cache[...] = new_v.transpose(swap)
    out = out.transpose(swap)
    return (out, lse) if return_softmax_lse else out


def dropout(q, k, v, *, mask=None, is_causal=False, scale=None, dropout_p=0.0, rng_seed=None):
    shape = (*np.broadcast_shapes(q.shape[:-3], k.shape[:-3]), q.shape[-3], q.shape[-2],
             k.shape[-2])
    keep = np.random.default_rng(rng_seed).random(shape) >= dropout_p
    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                dropout_keep=keep)
"""
FEATURES = "softcap-matches-reference,alibi-matches-reference,lse-matches-reference,lse-empty-rows"


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    path = tmp_path / "kernels.py"
    path.write_text(KERNELS, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--softcap-keyword", "logit_cap"], {"softcap_keyword": "logit_cap", "softcap": True}),
        (["--alibi-builtin-slopes"], {"alibi_builtin_slopes": True, "alibi": True}),
        (
            ["--lse-keyword", "return_softmax_lse"],
            {"lse_keyword": "return_softmax_lse", "returns_lse": True},
        ),
        (
            ["--dropout-seed-keyword", "rng_seed"],
            {"dropout_seed_keyword": "rng_seed", "dropout": True},
        ),
        (["--no-dropout-seeded", "--dropout"], {"dropout_seeded": False, "dropout": True}),
        (
            [
                "--recurrent",
                "delta",
                "--recurrent-varlen",
                "--recurrent-chunk-sizes",
                "16,32",
                "--recurrent-value-groups",
                "--recurrent-state-dtype",
                "bfloat16",
            ],
            {
                "recurrent": RecurrentClaim(
                    "delta",
                    varlen=True,
                    chunk_sizes=(16, 32),
                    value_groups=True,
                    state_dtype="bfloat16",
                )
            },
        ),
        (
            ["--paged-batch", "nhd", "--paged-batch-features", "leftpad,chunk,sinks"],
            {"paged_batch": PagedBatchClaim("nhd", features=("leftpad", "chunk", "sinks"))},
        ),
        (
            ["--kv-cache-features", "window,leftpad,sink_tokens"],
            {"kv_cache": True, "kv_cache_features": ("window", "leftpad", "sink_tokens")},
        ),
        (["--varlen-mask"], {"varlen_mask": True, "varlen": True}),
    ],
)
def test_feature_flags_set_their_claims(flags: list[str], expected: dict[str, Any]) -> None:
    """CONF-3: each feature flag (one row of the claims table) sets its field, and a
    keyword flag turns its feature on."""
    args = cli.build_parser().parse_args(["check", "m:f", *flags])
    assert cli.claims_from(args) == expected


@pytest.mark.parametrize(
    "flags",
    [
        ["--paged-batch", "hnd", "--paged-batch-features", "leftpad,alibi"],
        ["--kv-cache-features", "mask"],
    ],
)
def test_unknown_serving_options_are_usage_errors(flags: list[str]) -> None:
    """CONF-3: an option a paged-batch or KV-cache kernel cannot declare is refused by the
    parser (PAGED-8, KVCACHE-6), not silently dropped."""
    with pytest.raises(UsageError, match="features"):
        cli.build_parser().parse_args(["check", "m:f", *flags])


def test_a_vllm_paged_kernel_declares_s_aux_and_sink_tokens() -> None:
    """CONF-3, SINK-1, SINK-4, PAGED-2: vLLM's sink logits keyword (``s_aux``) and sink
    tokens are declared for a paged kernel by flags alone, and the suite passes exactly
    those keywords (no wrapper)."""
    flags = ["--paged-batch", "nhd", "--paged-batch-features", "window,sinks,sink_tokens"]
    args = cli.build_parser().parse_args(["check", "m:f", *flags, "--sinks-keyword", "s_aux"])
    claims = cli.claims_from(args)
    features = ("window", "sinks", "sink_tokens")
    assert claims["paged_batch"] == PagedBatchClaim("nhd", features=features)
    keywords = suite_keywords(KernelDeclaration(**claims))
    assert {"window_size", "s_aux", "n_sink_tokens"} <= set(keywords), keywords
    assert "sinks" not in keywords


@pytest.mark.parametrize("family", ["--varlen", "--kv-cache"])
def test_a_packed_or_cache_kernel_declares_s_aux(family: str) -> None:
    """CONF-3, SINK-6: a packed or KV-cache kernel's sink logits are declared by flags alone
    (vLLM's ``s_aux``): the suite passes that keyword and the claim line says sinks."""
    args = cli.build_parser().parse_args(["check", "m:f", family, "--sinks-keyword", "s_aux"])
    declaration = KernelDeclaration(**cli.claims_from(args))
    assert "s_aux" in suite_keywords(declaration)
    assert "sinks" in claim_features(declaration)


def test_claims_give_keywords_and_claim_words() -> None:
    """CONF-1, CONF-3: the keywords the suite passes and the words of the claim line."""
    declaration = KernelDeclaration(
        softcap=True,
        alibi=True,
        lse_keyword="return_lse",
        returns_lse=True,
        dropout=True,
        dropout_seed_keyword="rng_seed",
    )
    assert {"softcap", "alibi_slopes", "return_lse", "dropout_p", "rng_seed"} <= set(
        suite_keywords(declaration)
    )
    assert claim_features(declaration)[-4:] == ["softcap", "ALiBi", "log-sum-exp", "dropout"]


def test_flash_like_kernel_conforms_through_the_worker(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """SOFTCAP-1, ALIBI-2, LSE-1, LSE-2: a kernel taking softcap=, alibi_slopes= and
    return_lse= passes, in the worker process (the features travel with each problem),
    and all four pass."""
    status, out, err = run_check(
        capsys,
        f"{kernels}:flash_like",
        "--softcap",
        "--alibi",
        "--lse-keyword",
        "return_lse",
        "--only",
        FEATURES,
    )
    assert status == 0, out + err
    assert "4 passed" in out


def test_base_two_lse_fails_with_a_reproduction(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """LSE-1: a log-sum-exp in base 2 fails lse-matches-reference, exit 1.  The kernel in
    this process (--no-isolate): its (out, lse) crossing from a worker is
    test_flash_like_kernel_conforms_through_the_worker's; what is read here is the
    property's bound, judged the same in either (a worker and a kernel process cost
    ~0.5 CPU-s)."""
    status, out, _ = run_check(
        capsys,
        f"{kernels}:lse_base_two",
        "--softcap",
        "--alibi",
        "--returns-lse",
        "--only",
        "lse-matches-reference",
        "--no-isolate",
    )
    assert status == 1
    assert "TOL-5" in out


def test_dropout_kernel_with_a_renamed_seed(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """DROP-1 ... DROP-4: a kernel whose seed keyword is rng_seed passes every dropout
    property; without --dropout they are not applicable."""
    status, out, err = run_check(
        capsys,
        f"{kernels}:dropout",
        "--dropout-seed-keyword",
        "rng_seed",
        "--dtype",
        "float64",
        "--only",
        "dropout-zero,dropout-rescaling,dropout-seed,dropout-kept-fraction",
    )
    assert status == 0, out + err
    # what is applicable is read off the declaration, the same in this process: no worker
    # started for it (two processes, ~0.5 CPU-s)
    status, out, _ = run_check(
        capsys, f"{kernels}:dropout", "--only", "dropout-seed", "--no-isolate"
    )
    assert "not applicable" in out


FLASH = [
    "--rename",
    "is_causal=causal",
    "--rename",
    "scale=softmax_scale",
    "--gqa",
    "--softcap",
    "--alibi",
    "--causal-alignment",
    "bottom_right",
]


def test_flash_attention_varlen_convention(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """VARLEN-1 ... VARLEN-3: FlashAttention's varlen signature (positional cu_seqlens and
    max_seqlen, causal=, softmax_scale=) is checked as is, with --varlen and renames."""
    status, out, err = run_check(
        capsys,
        f"{kernels}:flash_attn_varlen_func",
        "--varlen",
        "--lse-keyword",
        "return_lse",
        *FLASH,
        "--only",
        "varlen-matches-reference,varlen-empty-sequences,varlen-isolation",
    )
    assert status == 0, out + err
    # the refusal is the kernel setup's, the same in this process: no worker started for it
    status, _, err = run_check(
        capsys, f"{kernels}:flash_attn_varlen_func", "--varlen", "--layout", "blhd", "--no-isolate"
    )
    assert status == 2 and "--layout does not apply" in err


def test_flash_attention_kvcache_convention(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """KVCACHE-1 ... KVCACHE-5: FlashAttention's flash_attn_with_kvcache in its (B, L, H, E)
    layout (new k, v included), paged, appending in place, is checked with --layout blhd."""
    status, out, err = run_check(
        capsys,
        f"{kernels}:flash_attn_with_kvcache",
        "--kv-cache-paged",
        "--layout",
        "blhd",
        "--lse-keyword",
        "return_softmax_lse",
        *FLASH,
        "--dtype",
        "float32,float64",
        "--only",
        "kv-cache-matches-reference,kv-cache-append,kv-cache-paged,kv-cache-stale-positions",
    )
    assert status == 0, out + err


def test_reproduction_rebuilds_the_features(kernels: Path) -> None:
    """The reproduction snippet passes softcap, float32 slopes and return_lse to the kernel
    and unpacks (out, lse); running it prints the kernel's output."""
    from attnspec.conformance.claims.loading import load_kernel

    fn = load_kernel(f"{kernels}:flash_like")
    declaration = KernelDeclaration(
        softcap=True, alibi=True, lse_keyword="return_lse", returns_lse=True
    )
    kernel = KernelUnderTest(fn, Backend("numpy"), declaration, target=f"{kernels}:flash_like")
    rng = np.random.default_rng(0)
    problem = Problem(
        q=rng.standard_normal((1, 2, 3, 4)),
        k=rng.standard_normal((1, 2, 5, 4)),
        v=rng.standard_normal((1, 2, 5, 2)),
        dtype="float64",
        softcap=3.0,
        alibi_slopes=np.array([0.5, 0.25]),
    )
    code = snippet(problem, kernel)
    assert "softcap=3.0" in code and "out, lse = fn(" in code
    assert "alibi_slopes = backend.asarray(problem.alibi_slopes, 'float32')" in code
    out, lse, dtype = kernel.output_with_lse(problem)
    assert out.shape == (1, 2, 3, 2) and lse.shape == (1, 2, 3) and dtype == "float64"


def test_rope_flags_declare_a_function(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """CONF-3 (rope entry): `attnspec check FILE:FUNC --rope half --rope-base B --rope-dim R`
    declares an undecorated function; the claim line names the pairing; --rope-dim alone is a
    usage error."""
    module = tmp_path / "my_rope.py"
    module.write_text(
        "from catalogue.rope import _accumulation, _angles, _rotate_half_style\n\n\n"
        "def rope(x, positions):  # GPT-NeoX partial rotary, undeclared\n"
        "    angles = _angles(positions, 16, 500000.0, _accumulation(x.dtype))\n"
        "    return _rotate_half_style(x, angles, 16)\n"
    )
    status = cli.main(
        [
            "check",
            f"{module}:rope",
            "--backend",
            "numpy",
            "--rope",
            "half",
            "--rope-base",
            "500000",
            "--rope-dim",
            "16",
            "--seed",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "half pairing" in out and "result: conforms" in out
    values = {"rope_dim": 16}
    with pytest.raises(UsageError, match="--rope-dim needs --rope PAIRING"):
        claims_from(lambda name: values.get(name))
