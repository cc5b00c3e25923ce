"""The reference's packed (varlen) and KV-cache attention against the independent oracle.

Varlen (VARLEN-1 … VARLEN-4) is checked against a block-diagonal dense problem; the KV
cache (KVCACHE-1 … KVCACHE-5) against writing the new keys position by position and
attending the logical prefix.  Every backend and dtype; bad arguments name themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle_features
import oracle_serving
import pytest

from attnspec.backends import Backend
from attnspec.reference.kv_cache import append_to_cache, kv_cache_attention
from attnspec.reference.varlen import varlen_attention

FLOAT64_RELATIVE = 1e-12
LOW_PRECISION_RELATIVE = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-5}


def _close(got: np.ndarray, expected: np.ndarray, dtype: str, where: str) -> None:
    """float64: to 1e-12; other dtypes: the reference computes in the accumulation
    precision on rounded inputs, so a coarse relative check on the same inputs suffices
    here (TOL-2 itself is tested in test_features_reference)."""
    finite = np.isfinite(expected)
    assert np.array_equal(got[~finite], expected[~finite]), where
    scale = np.maximum(np.abs(expected[finite]), 1.0)
    tolerance = FLOAT64_RELATIVE if dtype == "float64" else LOW_PRECISION_RELATIVE[dtype]
    assert np.all(np.abs(got[finite] - expected[finite]) <= tolerance * scale), where


def dtypes_for(backend: Backend, case: str, first_case: str) -> tuple[str, ...]:
    """Every dtype, except on JAX, which compiles every operation for every new shape
    (about 30 s per case here): one case in float32 checks its Array API path there."""
    if backend.name != "jax":
        return backend.dtype_names
    if case != first_case:
        pytest.skip(
            "JAX: one case in float32 covers its Array API path (compiling every "
            "op per shape costs ~30 s a case); numpy, torch and array_api_strict "
            "run every case and dtype"
        )
    return ("float32",)


def as64(backend: Backend, a: Any) -> np.ndarray:
    return np.asarray(backend.to_numpy(a), dtype=np.float64)


VARLEN_CASES = {
    # VARLEN-2: three sequences, one with no keys (VARLEN-3), GQA, bottom-right causal
    "causal-bottom-right-empty-keys": dict(
        seq_q=[3, 2, 4],
        seq_k=[5, 0, 2],
        heads=(4, 2),
        is_causal=True,
        causal_alignment="bottom_right",
    ),
    # VARLEN-2: top-left, ALiBi per sequence, softcap; an empty sequence (VARLEN-3)
    "alibi-softcap-top-left": dict(
        seq_q=[2, 0, 5], seq_k=[4, 3, 5], heads=(2, 2), alibi=(3, 2), softcap=2.0, is_causal=True
    ),
    "alibi-bottom-right": dict(
        seq_q=[4, 1], seq_k=[2, 6], heads=(2, 1), alibi=(2,), causal_alignment="bottom_right"
    ),
}


# VARLEN-5, VARLEN-6: the first case with padding tokens (NaN) past both last offsets and a
# flattened mask combined with its bottom-right causal rule
VARLEN_CASES["padding-flat-mask"] = dict(
    VARLEN_CASES["causal-bottom-right-empty-keys"], padding=(2, 3), flat_mask=True
)


@pytest.mark.parametrize("case", VARLEN_CASES, ids=str)
def test_varlen_matches_block_diagonal_oracle(backend: Backend, case: str) -> None:
    """VARLEN-1, VARLEN-2, VARLEN-3, VARLEN-5, VARLEN-6, LSE-3: no token sees another
    sequence's keys; causal alignment, ALiBi and the flattened mask per sequence; empty
    sequences; padding tokens past the offsets (NaN) never read, their rows 0 and -inf;
    out (T_q, Hq, Ev), lse (Hq, T_q)."""
    spec = dict(VARLEN_CASES[case])
    rng = np.random.default_rng(0)
    lengths = list(zip(spec["seq_q"], spec["seq_k"], strict=True))
    cu_q, cu_k = (
        np.concatenate([[0], np.cumsum(spec.pop(n))]).astype(np.int32) for n in ("seq_q", "seq_k")
    )
    n_q_heads, n_kv_heads = spec.pop("heads")
    pad_q, pad_k = spec.pop("padding", (0, 0))
    q = rng.standard_normal((int(cu_q[-1]) + pad_q, n_q_heads, 4))
    k = rng.standard_normal((int(cu_k[-1]) + pad_k, n_kv_heads, 4))
    v = rng.standard_normal((int(cu_k[-1]) + pad_k, n_kv_heads, 3))
    for a, valid in ((q, cu_q[-1]), (k, cu_k[-1]), (v, cu_k[-1])):
        a[valid:] = np.nan  # padding the kernel must not read (VARLEN-5)
    if "alibi" in spec:
        spec["alibi_slopes"] = rng.random(spec.pop("alibi")) + 0.1
    if spec.pop("flat_mask", False):
        spec["flat_mask"] = rng.random(sum(n_q * n_k for n_q, n_k in lengths)) < 0.6
    for dtype in dtypes_for(backend, case, next(iter(VARLEN_CASES))):
        arrays = [backend.asarray(a, dtype) for a in (q, k, v)]
        options = dict(spec)
        if "alibi_slopes" in options:
            options["alibi_slopes"] = backend.asarray(options["alibi_slopes"], "float32")
        if "flat_mask" in options:
            options["mask"] = backend.xp.asarray(options.pop("flat_mask"))
        out, lse = varlen_attention(
            *arrays, backend.xp.asarray(cu_q), backend.xp.asarray(cu_k), return_lse=True, **options
        )
        seen = [np.nan_to_num(as64(backend, a)) for a in arrays]
        options = dict(spec)
        if "alibi_slopes" in options:
            options["alibi_slopes"] = as64(
                backend, backend.asarray(spec["alibi_slopes"], "float32")
            )
        expected_out, expected_lse = oracle_features.varlen(
            *seen, cu_q.tolist(), cu_k.tolist(), **options
        )
        assert tuple(out.shape) == expected_out.shape and tuple(lse.shape) == expected_lse.shape
        _close(as64(backend, out), expected_out, dtype, f"{backend.name} {dtype} out")
        _close(as64(backend, lse), expected_lse, dtype, f"{backend.name} {dtype} lse")


KV_CASES = {
    # KVCACHE-2: decode (Lq = 1) against cached prefixes of different lengths, one empty
    "decode": dict(lengths=[5, 0, 3], capacity=6, n_new=0, n_queries=1),
    # KVCACHE-2, KVCACHE-4: two new keys appended, causal bottom-right, GQA, ALiBi, softcap
    "append-causal": dict(
        lengths=[1, 4], capacity=6, n_new=2, n_queries=3, is_causal=True, alibi=(2, 4), softcap=5.0
    ),
    # KVCACHE-5: paged cache, blocks of 2 in a shuffled table, new keys crossing a block
    "paged-append": dict(
        lengths=[3, 0], capacity=6, n_new=2, n_queries=2, block_size=2, is_causal=True
    ),
}


def _kv_problem(spec: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    lengths, capacity, n_new = spec["lengths"], spec["capacity"], spec["n_new"]
    batch = len(lengths)
    problem: dict[str, Any] = {"q": rng.standard_normal((batch, 4, spec["n_queries"], 8))}
    block_size = spec.get("block_size")
    if block_size:
        per_row = capacity // block_size
        table = rng.permutation(batch * per_row + 1)[: batch * per_row].reshape(batch, per_row)
        problem["block_table"] = table.astype(np.int32)
        n_cache, length = batch * per_row + 1, block_size
    else:
        n_cache, length = batch, capacity
    problem["k_cache"] = rng.standard_normal((n_cache, 2, length, 8))
    problem["v_cache"] = rng.standard_normal((n_cache, 2, length, 3))
    if n_new:
        problem["k"] = rng.standard_normal((batch, 2, n_new, 8))
        problem["v"] = rng.standard_normal((batch, 2, n_new, 3))
    for option in ("is_causal", "softcap"):
        if option in spec:
            problem[option] = spec[option]
    if "alibi" in spec:
        problem["alibi_slopes"] = rng.random(spec["alibi"]) + 0.1
    return problem


@pytest.mark.parametrize("case", KV_CASES, ids=str)
def test_kv_cache_matches_oracle(backend: Backend, case: str) -> None:
    """KVCACHE-1 … KVCACHE-5: the output over each batch element's cache prefix and new
    keys, bottom-right; the cache after appending holds the new keys at cache_seqlens[b]
    (through the block table) and nothing else changed."""
    spec = KV_CASES[case]
    problem = _kv_problem(spec, np.random.default_rng(1))
    lengths = np.asarray(spec["lengths"], dtype=np.int32)
    for dtype in dtypes_for(backend, case, "paged-append"):
        moved = {
            n: (
                backend.asarray(a, "float32" if n == "alibi_slopes" else dtype)
                if isinstance(a, np.ndarray) and n != "block_table"
                else a
            )
            for n, a in problem.items()
        }
        if "block_table" in moved:
            moved["block_table"] = backend.xp.asarray(problem["block_table"])
        seen = {
            n: (
                as64(backend, a)
                if n in ("q", "k_cache", "v_cache", "k", "v", "alibi_slopes")
                else a
            )
            for n, a in moved.items()
        }
        seen["block_table"] = problem.get("block_table")
        out, lse = kv_cache_attention(
            moved["q"],
            moved["k_cache"],
            moved["v_cache"],
            backend.xp.asarray(lengths),
            return_lse=True,
            **{n: a for n, a in moved.items() if n not in ("q", "k_cache", "v_cache")},
        )
        expected = oracle_features.kv_cache(
            seen["q"],
            seen["k_cache"],
            seen["v_cache"],
            spec["lengths"],
            **{n: a for n, a in seen.items() if n not in ("q", "k_cache", "v_cache")},
        )
        where = f"{backend.name} {dtype} {case}"
        _close(as64(backend, out), expected[0], dtype, where + " out")
        _close(as64(backend, lse), expected[1], dtype, where + " lse")
        if "k" in moved:
            after = append_to_cache(
                moved["k_cache"],
                moved["v_cache"],
                backend.xp.asarray(lengths),
                moved["k"],
                moved["v"],
                block_table=moved.get("block_table"),
            )
            for got, want in zip(after, expected[2:], strict=True):
                assert np.array_equal(as64(backend, got), want), where


def _varlen(**changes: Any) -> Any:
    arrays = dict(
        q=np.zeros((5, 2, 4)),
        k=np.zeros((6, 2, 4)),
        v=np.zeros((6, 2, 3)),
        cu_seqlens_q=np.array([0, 2, 5], np.int32),
        cu_seqlens_k=np.array([0, 6, 6], np.int32),
    )
    arrays.update(changes)
    return lambda: varlen_attention(**arrays)


def _cache(**changes: Any) -> Any:
    arrays = dict(
        q=np.zeros((2, 2, 1, 4)),
        k_cache=np.zeros((2, 1, 5, 4)),
        v_cache=np.zeros((2, 1, 5, 3)),
        cache_seqlens=np.array([2, 5], np.int32),
    )
    arrays.update(changes)
    return lambda: kv_cache_attention(**arrays)


BAD = [
    (
        "cu-float",
        _varlen(cu_seqlens_q=np.array([0.0, 2.0, 5.0])),
        TypeError,
        "cu_seqlens_q has dtype float64 and shape (3,), but should be a 1-d integer array",
    ),
    (
        "cu-past-the-end",
        _varlen(cu_seqlens_q=np.array([0, 2, 6], np.int32)),
        ValueError,
        "cu_seqlens_q=[0, 2, 6], but should start at 0 and end at most at the number of "
        "packed tokens, 5",
    ),
    (
        "flat-mask-size",
        _varlen(mask=np.ones(9, bool)),
        ValueError,
        "mask has dtype bool and shape (9,), but should be a 1-d boolean array of "
        "sum(L_q * L_k) = 12 elements [VARLEN-6",
    ),
    (
        "cu-decreasing",
        _varlen(
            cu_seqlens_k=np.array([0, 4, 2, 6], np.int32),
            cu_seqlens_q=np.array([0, 1, 2, 5], np.int32),
        ),
        ValueError,
        "cu_seqlens_k=[0, 4, 2, 6], but should be non-decreasing",
    ),
    (
        "cu-count",
        _varlen(cu_seqlens_k=np.array([0, 6], np.int32)),
        ValueError,
        "cu_seqlens_q has 3 offsets and cu_seqlens_k 2, but both should have B + 1",
    ),
    (
        "packed-ndim",
        _varlen(q=np.zeros((1, 5, 2, 4))),
        ValueError,
        "q.shape=(1, 5, 2, 4), but should be (total_tokens, heads, head_dim)",
    ),
    (
        "cache-too-long",
        _cache(cache_seqlens=np.array([2, 6], np.int32)),
        ValueError,
        "cache_seqlens[1]=6, but should be in [0, 5]: the cache holds 5 positions",
    ),
    (
        "cache-append-overflows",
        _cache(k=np.zeros((2, 1, 1, 4)), v=np.zeros((2, 1, 1, 3))),
        ValueError,
        "cache_seqlens[1]=5, but should be in [0, 4]",
    ),
    (
        "cache-lengths-count",
        _cache(cache_seqlens=np.array([2], np.int32)),
        ValueError,
        "cache_seqlens has 1 entries, but should have one per batch element (2)",
    ),
    (
        "cache-lengths-float",
        _cache(cache_seqlens=np.array([2.0, 1.0])),
        TypeError,
        "cache_seqlens has dtype float64 and shape (2,), but should be a 1-d integer array",
    ),
    (
        "new-k-only",
        _cache(k=np.zeros((2, 1, 1, 4))),
        ValueError,
        "k is given and v is None, but should both be given or both None",
    ),
    (
        "block-out-of-range",
        _cache(
            block_table=np.array([[0, 3], [1, 2]], np.int32),
            k_cache=np.zeros((3, 1, 4, 4)),
            v_cache=np.zeros((3, 1, 4, 3)),
        ),
        ValueError,
        "block_table=[[0, 3], [1, 2]], but should have one row per batch element (2) "
        "of block indices in [0, 3)",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "message"), [row[1:] for row in BAD], ids=[row[0] for row in BAD]
)
def test_bad_packed_arguments(call: Any, error: type, message: str) -> None:
    """VARLEN-1, KVCACHE-1, KVCACHE-2, KVCACHE-4, KVCACHE-5: malformed offsets, lengths
    and block tables are errors that name the argument (xformers #1122 accepted them)."""
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("window", "chunk", "sink_tokens"),
    [((2, None), None, 0), ((None, None), 2, 0), ((1, None), None, 2)],
    ids=["window", "chunk", "sink-tokens"],
)
def test_kv_cache_leftpad_window_chunk_match_the_paged_oracle(
    backend: Backend, window: tuple[int | None, None], chunk: int | None, sink_tokens: int
) -> None:
    """KVCACHE-6: with cache_leftpad, a window or chunks, batch element b attends positions
    cache_leftpad[b] … cache_seqlens[b] + L_new - 1 of its cache after the append, the
    window and chunks bottom-right, and its first n_sink_tokens of them beside the window
    (SINK-4): the paged oracle's reading of that cache (PAGED-2)."""
    if backend.name == "jax":
        pytest.skip("JAX compiles per shape; test_kv_cache_matches_oracle covers its path")
    spec = KV_CASES["paged-append"]
    problem = _kv_problem(spec, np.random.default_rng(5))
    lengths, leftpad = np.asarray(spec["lengths"], np.int32), np.asarray([2, 0], np.int32)
    xp = backend.xp
    moved = {
        n: backend.asarray(problem[n], "float64") for n in ("q", "k_cache", "v_cache", "k", "v")
    }
    options = dict(block_table=xp.asarray(problem["block_table"]), is_causal=True)
    out, lse = kv_cache_attention(
        moved["q"],
        moved["k_cache"],
        moved["v_cache"],
        xp.asarray(lengths),
        k=moved["k"],
        v=moved["v"],
        cache_leftpad=xp.asarray(leftpad),
        window=window,
        attention_chunk=chunk,
        n_sink_tokens=sink_tokens,
        return_lse=True,
        **options,
    )
    k_after, v_after = append_to_cache(
        moved["k_cache"],
        moved["v_cache"],
        xp.asarray(lengths),
        k=moved["k"],
        v=moved["v"],
        block_table=options["block_table"],
    )
    batch, heads, n_queries, _ = problem["q"].shape
    packed_q = problem["q"].transpose(0, 2, 1, 3).reshape(batch * n_queries, heads, -1)
    expected_out, expected_lse = oracle_serving.paged(
        packed_q,
        as64(backend, k_after),
        as64(backend, v_after),
        [n_queries * b for b in range(batch + 1)],
        (lengths + spec["n_new"]).tolist(),
        problem["block_table"].tolist(),
        leftpad=leftpad.tolist(),
        is_causal=True,
        window=window,
        chunk=chunk,
        sink_tokens=sink_tokens,
    )
    got = as64(backend, out).transpose(0, 2, 1, 3).reshape(batch * n_queries, heads, -1)
    _close(got, expected_out, "float64", f"{backend.name} out")
    got_lse = as64(backend, lse).transpose(1, 0, 2).reshape(heads, batch * n_queries)
    _close(got_lse, expected_lse, "float64", f"{backend.name} lse")


def _expected_rows(q: Any, k: Any, v: Any, sinks: Any, **scoring: Any) -> tuple[Any, Any]:
    """One sequence's (out, lse) by the serving oracle: bottom-right causal, the sinks in
    the denominator (SINK-1 … SINK-3); ``q (Lq, Hq, E)``, k and v ``(Lk, Hkv, ·)``."""
    n_q, n_k = q.shape[0], k.shape[0]
    heads_first = [np.swapaxes(a, 0, 1) for a in (q, k, v)]
    allowed = oracle_serving.causal(n_q, n_k, n_k - n_q)
    return oracle_serving.attend(*heads_first, allowed, sinks=sinks, **scoring)


def test_sinks_in_packed_and_cache_calls(backend: Backend) -> None:
    """SINK-6, VARLEN-5, KVCACHE-2: sink logits join every sequence's rows, per query head
    with GQA; a row that sees no key (a sequence without keys, rows above a bottom-right
    causal diagonal) gives 0 and lse = sinks[h]; the padding rows past cu_seqlens_q[-1]
    give 0 and -inf, no sink joining them."""
    if backend.name == "jax":
        pytest.skip(
            "JAX compiles each op per shape (~50 s for these two calls): its varlen and "
            "cache paths run in the first cases above, numpy, torch and array_api_strict here"
        )
    rng = np.random.default_rng(3)
    lengths = [(3, 5), (2, 0), (4, 2)]  # one sequence without keys, one with Lq > Lk
    cu_q, cu_k = (np.cumsum([0, *n]).astype(np.int32) for n in zip(*lengths, strict=True))
    q = rng.standard_normal((int(cu_q[-1]) + 2, 4, 8))  # two padding rows
    k, v = rng.standard_normal((int(cu_k[-1]), 2, 8)), rng.standard_normal((int(cu_k[-1]), 2, 3))
    caches = rng.standard_normal((2, 2, 5, 8)), rng.standard_normal((2, 2, 5, 3))
    cached = [4, 0]  # a decode batch whose second element has an empty cache
    for dtype in backend.dtype_names:
        sinks = backend.asarray(np.array([0.5, -1.0, 2.0, -20.0]), "float32")
        causal = dict(is_causal=True, softcap=4.0, sinks=sinks, return_lse=True)
        arrays = [backend.asarray(a, dtype) for a in (q, k, v)]
        cu = [backend.xp.asarray(c) for c in (cu_q, cu_k)]
        out, lse = varlen_attention(*arrays, *cu, causal_alignment="bottom_right", **causal)
        seen = [as64(backend, a) for a in (*arrays, sinks)]
        parts = [
            _expected_rows(
                seen[0][cu_q[b] : cu_q[b + 1]],
                seen[1][cu_k[b] : cu_k[b + 1]],
                seen[2][cu_k[b] : cu_k[b + 1]],
                seen[3],
                softcap=4.0,
            )
            for b in range(len(lengths))
        ]
        expected_out = np.concatenate(
            [np.swapaxes(o, 0, 1) for o, _ in parts] + [np.zeros((2, 4, 3))]
        )
        expected_lse = np.concatenate([lse_b for _, lse_b in parts] + [np.full((4, 2), -np.inf)], 1)
        where = f"{backend.name} {dtype} varlen with sinks"
        _close(as64(backend, out), expected_out, dtype, where + " out")
        _close(as64(backend, lse), expected_lse, dtype, where + " lse")
        moved = [backend.asarray(a, dtype) for a in (q[:4].reshape(2, 4, 2, 8), *caches)]
        lengths_k = backend.xp.asarray(np.asarray(cached, np.int32))
        out, lse = kv_cache_attention(*moved, lengths_k, **causal)
        seen = [as64(backend, a) for a in moved]
        for b, n_k in enumerate(cached):
            want = _expected_rows(
                np.swapaxes(seen[0][b], 0, 1),
                np.swapaxes(seen[1][b, :, :n_k], 0, 1),
                np.swapaxes(seen[2][b, :, :n_k], 0, 1),
                as64(backend, sinks),
                softcap=4.0,
            )
            where = f"{backend.name} {dtype} kv cache with sinks, element {b}"
            _close(as64(backend, out)[b], want[0], dtype, where + " out")
            _close(as64(backend, lse)[b], want[1], dtype, where + " lse")
