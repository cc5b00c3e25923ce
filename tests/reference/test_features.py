"""The reference's softcap, ALiBi and log-sum-exp against the independent oracle.

Every case runs on every backend and dtype (JAX: float64 on the cases of
``JAX_FLOAT64_CASES``): float64 agrees with ``oracle_features`` to
1e-12 relative; lower precisions lie within TOL-2 extended by TOL-4 (outputs, weights)
and TOL-5 (the log-sum-exp).  Both forms are checked: the plain one (with the weights)
and the blocked one the entry point takes without them, over block sizes that split each
case.  Bad arguments raise errors naming them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle_features
import pytest
from problems import problem_of_shapes
from support import as64, dtypes_checked, on_backend, seen_by_kernel

from attnspec.backends import Backend
from attnspec.reference import (
    alibi_slopes,
    blocked_attention,
    plain_attention,
    scaled_dot_product_attention,
)
from attnspec.reference.tolerance import error_and_lse_bound

FLOAT64_RELATIVE = 1e-12
# Lq > Lk, G = 2; test_sdpa_oracle.py's SHAPES_B too (JAX reuses the compilations there)
SHAPES_GQA = dict(q=(2, 4, 5, 4), k=(2, 2, 3, 4), v=(2, 2, 3, 3))
SHAPES_LONG = dict(q=(1, 2, 3, 6), k=(1, 1, 7, 6), v=(1, 1, 7, 2))  # Lq < Lk, G = 2
CASES: dict[str, dict[str, Any]] = {
    # SOFTCAP-1: large scores against a small cap, with a mask, a bias and an empty row.
    "softcap-mask-bias": problem_of_shapes(
        **SHAPES_GQA, magnitude=4.0, softcap=1.5, mask=(5, 3), bias=(4, 5, 3), empty_rows=(2,)
    ),
    # SOFTCAP-1, SDPA-4.2: bottom-right causal with Lq > Lk leaves rows empty.
    "softcap-causal-bottom-right": problem_of_shapes(
        **SHAPES_GQA, softcap=20.0, is_causal=True, causal_alignment="bottom_right"
    ),
    # ALIBI-1, ALIBI-2: per-batch slopes (B, Hq), non-causal, both anchors, Lq < Lk.
    "alibi-top-left": problem_of_shapes(**SHAPES_LONG, alibi=(1, 2)),
    "alibi-bottom-right": problem_of_shapes(
        **SHAPES_LONG, alibi=(2,), causal_alignment="bottom_right"
    ),
    # ALIBI-2 with causal and a -inf bias, GQA, Lq > Lk bottom-right.
    "alibi-causal-gqa": problem_of_shapes(
        **SHAPES_GQA,
        alibi=(2, 4),
        is_causal=True,
        bias=(2, 4, 5, 3),
        minus_inf=True,
        causal_alignment="bottom_right",
    ),
    # SOFTCAP-1 + ALIBI-2 + explicit scale: the order cap, then ALiBi.
    "softcap-alibi-scale": problem_of_shapes(
        **SHAPES_LONG, magnitude=3.0, softcap=2.0, alibi=(2,), scale=0.8, is_causal=True
    ),
    # LSE-2: Lk = 0 gives -inf everywhere (SHAPES_LONG's q, whose compilations JAX reuses).
    "lk0": problem_of_shapes(
        q=(1, 2, 3, 6), k=(1, 1, 0, 6), v=(1, 1, 0, 2), alibi=(2,), softcap=3.0
    ),
}

# The cases JAX checks in float64 too, every feature among them (softcap, ALiBi, mask, bias,
# -inf bias, causal, empty rows); JAX runs every other dtype on every case, and the other
# backends every dtype on every case (support.dtypes_checked says why).
JAX_FLOAT64_CASES = ("softcap-mask-bias", "softcap-causal-bottom-right", "alibi-causal-gqa")


def assert_matches_oracle(
    backend: Backend, moved: dict[str, Any], dtype: str, where: str, got: tuple[Any, ...]
) -> None:
    """``got`` = (out, lse) or (out, weights, lse) of ``moved`` against the oracle: LSE-3's
    shape and dtype, LSE-2's -inf rows, and the TOL-2/4/5 bounds (float64: 1e-12)."""
    out, lse = got[0], got[-1]
    seen = seen_by_kernel(backend, moved)
    expected_out, expected_weights, expected_lse = oracle_features.sdpa_features(**seen)
    accumulation = "float64" if dtype == "float64" else "float32"
    assert lse.dtype == backend.dtype(accumulation), where
    assert tuple(lse.shape) == expected_lse.shape == tuple(out.shape[:-1]), where
    got_out, got_lse = as64(backend, out), as64(backend, lse)
    got_weights = as64(backend, got[1]) if len(got) == 3 else None
    empty = expected_lse == -np.inf
    assert np.array_equal(got_lse == -np.inf, empty), where
    got_lse, expected_lse = np.where(empty, 0, got_lse), np.where(empty, 0, expected_lse)
    if dtype == "float64":
        magnitude = np.max(np.abs(seen["v"]), initial=1.0)
        assert np.all(np.abs(got_out - expected_out) <= FLOAT64_RELATIVE * magnitude), where
        if got_weights is not None:
            assert np.all(np.abs(got_weights - expected_weights) <= FLOAT64_RELATIVE), where
        scale = np.maximum(np.abs(expected_lse), 1.0)
        assert np.all(np.abs(got_lse - expected_lse) <= FLOAT64_RELATIVE * scale), where
        return
    options = {n: seen[n] for n in seen if n not in ("q", "k", "v")}
    bound, lse_bound = error_and_lse_bound(seen["q"], seen["k"], seen["v"], dtype=dtype, **options)
    assert np.all(np.abs(got_out - expected_out) <= bound.out_tolerance), where
    if got_weights is not None:
        assert np.all(np.abs(got_weights - expected_weights) <= bound.weights_tolerance), where
    assert np.all(np.abs(got_lse - expected_lse) <= np.asarray(lse_bound.lse_tolerance)), where


@pytest.mark.parametrize("case", CASES, ids=str)
def test_features_match_oracle(backend: Backend, case: str) -> None:
    """SOFTCAP-1, ALIBI-1, ALIBI-2, LSE-1 … LSE-4, TOL-4, TOL-5: out, weights and the
    log-sum-exp of the plain form on every backend and dtype (JAX: float64 on
    JAX_FLOAT64_CASES); LSE-3: shape (..., Hq, Lq) and the accumulation dtype; LSE-2: -inf
    exactly where a row sees no key."""
    problem = CASES[case]
    for dtype in dtypes_checked(backend, float64=case in JAX_FLOAT64_CASES):
        moved = on_backend(backend, problem, dtype)
        got = plain_attention(**moved, return_weights=True, return_lse=True)
        assert_matches_oracle(backend, moved, dtype, f"{backend.name} {dtype} {case}", got)


BLOCKS = [{}, {"query_chunk": 2, "key_block": 2}, {"query_chunk": 1, "key_block": 3}]
# JAX: every block shape is a new compilation of every per-block operation, and 2 x 2
# blocks split each case into four (ragged along both axes).  It runs the default blocks and
# one ragged split per shape family instead (issue 33: blocked test 516 -> 377 compilations):
# SHAPES_GQA in query chunks of 2 (rows 0-1 of bottom-right Lq 5 > Lk 3 form a chunk with
# no key at all, SDPA-4.3; ALiBi's distance per chunk with a negative offset, the empty row
# and the -inf bias in a chunk), SHAPES_LONG in key blocks of 2 (Lk 7: four blocks, the last
# ragged; the cap, ALiBi's distance and the log-sum-exp across blocks, blocks across the
# causal diagonal).  The default blocks of the causal cases split keys at the diagonal too;
# test_blocked.py runs masks, biases and blank rows across key blocks on JAX.  Each of these
# bugs of the blocked form fails on JAX with these blocks, as with 2 x 2 ones: ALiBi from
# chunk-relative rows or block-relative keys, the cap on the first key block only, l not
# rescaled when the maximum grows.
# (Lk = 0 keeps the default and 2 x 2 blocks.)
JAX_BLOCKS = {
    SHAPES_GQA["q"]: [{}, {"query_chunk": 2}],
    SHAPES_LONG["q"]: [{}, {"key_block": 2}],
}


def blocks_run(backend: Backend, problem: dict[str, Any]) -> list[dict[str, int]]:
    """The block sizes ``problem`` runs with on ``backend`` (JAX: JAX_BLOCKS of its shapes)."""
    if backend.name != "jax":
        return BLOCKS
    if problem["k"].shape[-2] == 0:  # Lk = 0 (on SHAPES_LONG's q): the default and 2 x 2
        return BLOCKS[:2]
    return JAX_BLOCKS[tuple(problem["q"].shape)]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_blocked_features_match_oracle(backend: Backend, case: str) -> None:
    """SOFTCAP-1, ALIBI-2, LSE-1 … LSE-3, TOL-4, TOL-5 for the blocked form, block by
    block (the cap and ALiBi per block, the log-sum-exp as m + log l), with default blocks
    and blocks that split every case; the entry point without weights returns exactly the
    blocked form's result."""
    problem = CASES[case]
    for dtype in dtypes_checked(backend, float64=case in JAX_FLOAT64_CASES):
        moved = on_backend(backend, problem, dtype)
        for blocks in blocks_run(backend, problem):
            got = blocked_attention(**moved, return_lse=True, **blocks)
            where = f"{backend.name} {dtype} {case} {blocks}"
            assert_matches_oracle(backend, moved, dtype, where, got)
        entry = scaled_dot_product_attention(**moved, return_lse=True)
        default = blocked_attention(**moved, return_lse=True)
        for a, b in zip(entry, default, strict=True):
            assert np.array_equal(as64(backend, a), as64(backend, b), equal_nan=True), case


def test_lse_reproduces_the_weights_and_combines_splits() -> None:
    """LSE-1: p_ij = exp(s_ij - lse_i), and two disjoint key halves combine by their
    log-sum-exps into the full output and log-sum-exp (a half may be empty for a row)."""
    problem = CASES["softcap-alibi-scale"]
    out, weights, lse = scaled_dot_product_attention(
        **problem, return_weights=True, return_lse=True
    )
    n_keys = problem["k"].shape[-2]
    first = np.arange(n_keys) < 3
    halves = [
        scaled_dot_product_attention(
            **problem, mask=np.broadcast_to(part, (3, n_keys)), return_lse=True
        )
        for part in (first, ~first)
    ]
    (out_a, lse_a), (out_b, lse_b) = halves
    combined_lse = np.logaddexp(lse_a, lse_b)
    share_a = np.where(lse_a == -np.inf, 0.0, np.exp(lse_a - combined_lse))[..., None]
    combined = share_a * out_a + (1 - share_a) * out_b
    np.testing.assert_allclose(combined_lse, lse, rtol=1e-12)
    np.testing.assert_allclose(combined, out, rtol=1e-11, atol=1e-12)
    assert np.any(lse_b == -np.inf)  # causal: the first rows see none of the second half
    scores_ok = weights > 0
    reconstructed = np.exp(np.log(np.where(scores_ok, weights, 1.0)))
    np.testing.assert_allclose(reconstructed[scores_ok], weights[scores_ok], rtol=1e-12)


def test_softcap_bounds_weight_ratios() -> None:
    """SOFTCAP-3: with scores up to ~1e4 and cap c, every weight ratio within a row is
    at most e^(2c); without the cap the same inputs give ratios beyond e^(100)."""
    rng = np.random.default_rng(2)
    q, k, v = (
        rng.standard_normal((1, 4, 8)) * 30,
        rng.standard_normal((1, 9, 8)) * 30,
        rng.standard_normal((1, 9, 2)),
    )
    cap = 3.0
    _, capped = scaled_dot_product_attention(q, k, v, softcap=cap, return_weights=True)
    _, plain = scaled_dot_product_attention(q, k, v, return_weights=True)
    # tanh saturates to exactly 1 in float64, so the ratio reaches e^(2c) itself
    assert np.log(capped.max(-1) / capped.min(-1)).max() <= 2 * cap * (1 + 1e-12)
    assert (plain.min(-1) == 0).any() or np.log(plain.max(-1) / plain.min(-1)).max() > 100


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 6, 8, 12, 16, 24, 40])
def test_standard_alibi_slopes(n_heads: int) -> None:
    """ALIBI-3: alibi_slopes(H) is Press et al.'s get_slopes (the published recursive
    form), in float32, for powers of two and the interleaved rule otherwise."""
    xp = Backend("numpy").xp
    slopes = alibi_slopes(n_heads, xp=xp)
    assert slopes.dtype == np.float32 and slopes.shape == (n_heads,)
    expected = np.asarray(oracle_features.press_slopes(n_heads), dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(slopes), expected)


def test_standard_slopes_examples_of_the_spec() -> None:
    """ALIBI-3: the worked values quoted in features.md (8 heads: 1/2 ... 1/256; 6 heads:
    1/4, 1/16, 1/64, 1/256, 1/2, 1/8)."""
    xp = Backend("numpy").xp
    assert np.asarray(alibi_slopes(8, xp=xp)).tolist() == [2.0**-n for n in range(1, 9)]
    assert np.asarray(alibi_slopes(6, xp=xp)).tolist() == [2.0**-n for n in (2, 4, 6, 8, 1, 3)]


def test_alibi_anchor_follows_the_alignment() -> None:
    """ALIBI-2: the two anchors coincide when Lq = Lk, differ when Lq != Lk without
    causal, and under causal differ only through the keys beyond i (the |.|): a top-left
    anchor with a bottom-right causal rule is not a per-row constant."""
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((2, 3, 4)),
        rng.standard_normal((2, 6, 4)),
        rng.standard_normal((2, 6, 2)),
    )
    slopes = np.array([0.5, 0.25])

    def run(alignment: str, n_keys: int = 6, **options: Any) -> np.ndarray:
        return scaled_dot_product_attention(
            q,
            k[:, :n_keys],
            v[:, :n_keys],
            alibi_slopes=slopes,
            causal_alignment=alignment,
            **options,
        )

    np.testing.assert_allclose(run("top_left", 3), run("bottom_right", 3), rtol=1e-12)
    assert not np.allclose(run("top_left"), run("bottom_right"))
    # bottom-right causal: query i sits at key i + 3; the top-left distance |i - j|
    # disagrees with i + 3 - j on keys i < j <= i + 3, which the causal rule allows.
    top_left_bias = -slopes[:, None, None] * np.abs(np.arange(3)[:, None] - np.arange(6))
    wrong = scaled_dot_product_attention(
        q, k, v, bias=top_left_bias, is_causal=True, causal_alignment="bottom_right"
    )
    right = run("bottom_right", is_causal=True)
    assert not np.allclose(wrong, right)


BAD_FEATURES = [
    (
        "softcap-zero",
        dict(softcap=0.0),
        ValueError,
        "softcap=0.0, but should be a finite number > 0 (None for no capping) [SOFTCAP-2",
    ),
    ("softcap-negative", dict(softcap=-2.0), ValueError, "softcap=-2.0, but should be a finite"),
    ("softcap-inf", dict(softcap=float("inf")), ValueError, "softcap=inf, but should be a finite"),
    ("softcap-str", dict(softcap="50"), TypeError, "softcap='50', but should be None or a real"),
    ("softcap-bool", dict(softcap=True), TypeError, "softcap=True, but should be None or a real"),
    (
        "alibi-length",
        dict(alibi_slopes=np.ones(3)),
        ValueError,
        "alibi_slopes.shape=(3,), but its last axis should have one slope per query head (4) "
        "[ALIBI-1",
    ),
    (
        "alibi-batch",
        dict(alibi_slopes=np.ones((2, 4))),
        ValueError,
        "alibi_slopes.shape=(2, 4), but should broadcast to (1, 4) [ALIBI-1",
    ),
    (
        "alibi-scalar",
        dict(alibi_slopes=np.ones(())),
        ValueError,
        "alibi_slopes.shape=(), but should be (..., 4): one slope per query head",
    ),
    (
        "alibi-int",
        dict(alibi_slopes=np.ones(4, np.int32)),
        TypeError,
        "alibi_slopes.dtype=int32, but should be a real floating dtype [ALIBI-1",
    ),
    (
        "alibi-list",
        dict(alibi_slopes=[0.5] * 4),
        TypeError,
        "alibi_slopes is a list, but should be an array",
    ),
    ("return-lse", dict(return_lse=1), TypeError, "return_lse=1, but should be True or False"),
]


def test_bad_alibi_slopes_count() -> None:
    """ALIBI-3: alibi_slopes(n_heads) needs n_heads >= 1."""
    with pytest.raises(ValueError, match=r"n_heads=0, but should be an int >= 1"):
        alibi_slopes(0, xp=Backend("numpy").xp)


def test_dropout_with_keep_mask_matches_oracle(cpu_backend: Backend) -> None:
    """DROP-2: kept weights rescaled by 1/(1-p), dropped ones 0, no renormalisation;
    excluded keys and empty rows untouched; the log-sum-exp unchanged by dropout."""
    problem = CASES["softcap-mask-bias"]
    keep = np.random.default_rng(5).random((2, 4, 5, 3)) < 0.6
    moved = on_backend(cpu_backend, problem, "float64")
    out, weights, lse = scaled_dot_product_attention(
        **moved,
        dropout_p=0.4,
        dropout_keep=cpu_backend.asarray(keep),
        return_weights=True,
        return_lse=True,
    )
    expected_out, expected_weights, expected_lse = oracle_features.sdpa_features(
        **problem, dropout_p=0.4, dropout_keep=keep
    )
    np.testing.assert_allclose(as64(cpu_backend, out), expected_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(as64(cpu_backend, weights), expected_weights, rtol=1e-12, atol=1e-15)
    undropped = scaled_dot_product_attention(**moved, return_lse=True)[1]
    assert np.array_equal(as64(cpu_backend, lse), as64(cpu_backend, undropped))
    assert np.array_equal(as64(cpu_backend, lse) == -np.inf, expected_lse == -np.inf)


BAD_DROPOUT = [
    ("p-one", dict(dropout_p=1.0), ValueError, "dropout_p=1.0, but should be in [0, 1) [DROP-2"),
    ("p-negative", dict(dropout_p=-0.1), ValueError, "dropout_p=-0.1, but should be in [0, 1)"),
    ("p-str", dict(dropout_p="0.1"), TypeError, "dropout_p='0.1', but should be a real number"),
    (
        "p-without-keep",
        dict(dropout_p=0.1),
        ValueError,
        "dropout_p=0.1 needs dropout_keep=, the boolean keep mask: the reference draws no random",
    ),
    (
        "keep-float",
        dict(dropout_p=0.1, dropout_keep=np.ones((3, 5))),
        TypeError,
        "dropout_keep.dtype=float64, but should be bool (True = kept) [DROP-2",
    ),
    (
        "keep-shape",
        dict(dropout_p=0.1, dropout_keep=np.ones((2, 3, 5), bool)),
        ValueError,
        "dropout_keep.shape=(2, 3, 5), but should broadcast to (1, 4, 3, 5) [DROP-2",
    ),
]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [row[1:] for row in (*BAD_FEATURES, *BAD_DROPOUT)],
    ids=[row[0] for row in (*BAD_FEATURES, *BAD_DROPOUT)],
)
def test_bad_feature_arguments(options: dict[str, Any], error: type, message: str) -> None:
    """SOFTCAP-2, ALIBI-1, LSE, DROP-2: bad feature arguments (and dropout's p outside
    [0, 1), a missing or malformed keep mask) name themselves, what they should be and
    the clause."""
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.standard_normal((1, 4, 3, 8)),
        rng.standard_normal((1, 2, 5, 8)),
        rng.standard_normal((1, 2, 5, 6)),
    )
    with pytest.raises(error) as raised:
        scaled_dot_product_attention(q, k, v, **options)
    assert message in str(raised.value)
