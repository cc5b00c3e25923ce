"""The reference's serving kernels (spec/serving.md) against the independent oracle.

Sinks (SINK-1 … SINK-4), chunked local attention (CHUNK-1), merged states (MERGE-1 …
MERGE-3), absorbed MLA (MLA-1, MLA-2) and mixed batches over a paged cache (PAGED-1 …
PAGED-6), each against ``oracle_serving`` (float64 NumPy, row by row), on every backend.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import oracle
import oracle_serving
import pytest

from attnspec.backends import Backend
from attnspec.reference import kv_cache_attention, scaled_dot_product_attention
from attnspec.reference.serving import (
    chunked_local_mask,
    merge_attention_states,
    mla_attention,
    paged_attention,
    sink_attention,
    streaming_mask,
)
from attnspec.reference.serving import paged as paged_module

FLOAT64_RELATIVE = 1e-12
LOW_PRECISION_RELATIVE = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-5}


def _close(got: np.ndarray, expected: np.ndarray, dtype: str, where: str) -> None:
    """float64: to 1e-12; other dtypes: the reference computes in the accumulation
    precision on rounded inputs, so a coarse relative check on the same inputs suffices
    here (the bounds themselves are tested in test_serving_tolerance.py)."""
    assert got.shape == expected.shape, where
    finite = np.isfinite(expected)
    assert np.array_equal(got[~finite], expected[~finite]), where
    scale = np.maximum(np.abs(expected[finite]), 1.0)
    tolerance = FLOAT64_RELATIVE if dtype == "float64" else LOW_PRECISION_RELATIVE[dtype]
    assert np.all(np.abs(got[finite] - expected[finite]) <= tolerance * scale), where


def _as64(backend: Backend, a: Any) -> np.ndarray:
    return np.asarray(backend.to_numpy(a), dtype=np.float64)


def _dtypes(backend: Backend) -> tuple[str, ...]:
    """float64 everywhere, float32 too but on JAX (which compiles per shape: one dtype
    covers its Array API path there)."""
    return ("float64",) if backend.name == "jax" else ("float64", "float32")


# --- sinks -------------------------------------------------------------------------------

SINK_CASES = {
    # SINK-1: GQA, a mask with a fully masked row, a sink far above the scores
    "mask": dict(is_causal=False),
    # SINK-1 with a bottom-right causal rule (Lq > Lk: rows that see nothing, SINK-2) and softcap
    "causal-softcap": dict(is_causal=True, causal_alignment="bottom_right", softcap=2.0),
    # SINK-1 with a sliding window: the sink stays in every denominator
    "window": dict(window=2),
}


@pytest.mark.parametrize("case", SINK_CASES, ids=str)
def test_sinks_match_the_oracle(backend: Backend, case: str) -> None:
    """SINK-1, SINK-2, SINK-3: the sink joins every denominator unscaled and without a
    value; rows without keys give 0 and lse = sigma_h; with and without a window."""
    if backend.name == "jax" and case != "mask":
        pytest.skip("JAX compiles per shape; the mask case covers its Array API path")
    spec = dict(SINK_CASES[case])
    rng = np.random.default_rng(1)
    n_queries, n_keys = (7, 5) if spec.get("is_causal") else (5, 7)
    q = rng.standard_normal((2, 4, n_queries, 8))
    k = rng.standard_normal((2, 2, n_keys, 8))
    v = rng.standard_normal((2, 2, n_keys, 3))
    sinks = np.array([0.5, -1.0, 6.0, -30.0])
    mask = rng.random((n_queries, n_keys)) < 0.7
    mask[1] = False  # SINK-2: a row that sees no key
    window = spec.pop("window", None)
    if window is not None:  # keys j with |i + d - j| <= window, d bottom-right
        d = n_keys - n_queries
        mask &= np.abs(np.arange(n_queries)[:, None] + d - np.arange(n_keys)[None, :]) <= window
    offset = n_keys - n_queries if spec.get("causal_alignment") == "bottom_right" else 0

    def row(i: int) -> np.ndarray:
        allowed = mask[i].copy()
        if spec.get("is_causal"):
            allowed &= np.arange(n_keys) <= i + offset
        return allowed

    for dtype in _dtypes(backend):
        arrays = [backend.asarray(a, dtype) for a in (q, k, v)]
        out, lse = sink_attention(
            *arrays,
            backend.asarray(sinks, "float32"),
            mask=backend.xp.asarray(mask),
            return_lse=True,
            **spec,
        )
        seen = [_as64(backend, a) for a in arrays]
        for b in range(2):
            expected_out, expected_lse = oracle_serving.attend(
                seen[0][b], seen[1][b], seen[2][b], row, softcap=spec.get("softcap"), sinks=sinks
            )
            where = f"{backend.name} {dtype} batch {b}"
            _close(_as64(backend, out)[b], expected_out, dtype, where + " out")
            _close(_as64(backend, lse)[b], expected_lse, dtype, where + " lse")
        assert np.all(_as64(backend, out)[:, :, 1] == 0), "SINK-2: a row without keys is 0"
        assert np.array_equal(_as64(backend, lse)[:, :, 1], np.broadcast_to(sinks, (2, 4)))


def test_sinks_change_every_row_and_are_not_scaled() -> None:
    """SINK-1: a sink of -inf-like size changes nothing; a sink's effect does not depend on
    the scale (it is not multiplied by it); it is per query head under GQA."""
    backend = Backend("numpy")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in ((4, 3, 5), (2, 6, 5), (2, 6, 2)))
    plain = scaled_dot_product_attention(q, k, v, scale=0.3)
    none = sink_attention(q, k, v, np.full(4, -1e4), scale=0.3)
    np.testing.assert_allclose(none, plain, rtol=1e-14)
    sinks = np.array([0.0, 1.0, 2.0, 3.0])
    for scale in (0.3, 3.0):
        out = sink_attention(q, k, v, sinks, scale=scale)
        _, lse = scaled_dot_product_attention(q, k, v, scale=scale, return_lse=True)
        # SINK-1: out = plain * sum / (sum + e^sigma), the sink taken as given
        factor = 1.0 / (1.0 + np.exp(sinks[:, None] - lse))
        expected = scaled_dot_product_attention(q, k, v, scale=scale) * factor[..., None]
        np.testing.assert_allclose(out, expected, rtol=1e-13)
    assert backend.name == "numpy"


def test_streaming_mask_matches_the_oracle(backend: Backend) -> None:
    """SINK-4: the first n keys stay visible beside a causal window of the last keys,
    bottom-right and top-left, L_q < L_k and L_q > L_k; attention with it matches."""
    for n_queries, n_keys, n_sink, window in ((4, 12, 2, 3), (9, 6, 1, 2), (5, 5, 0, 0)):
        for alignment, offset in (("bottom_right", n_keys - n_queries), ("top_left", 0)):
            built = streaming_mask(n_queries, n_keys, n_sink, window, alignment, xp=backend.xp)
            rows = oracle_serving.streaming(n_queries, n_keys, n_sink, window, offset)
            expected = np.stack([rows(i) for i in range(n_queries)])
            np.testing.assert_array_equal(backend.to_numpy(built), expected, err_msg=alignment)
    # SINK-4 with SINK-1: sink tokens and sink logits together (the last row sees the two
    # sink tokens and its window, not the keys between); on the shapes and sink dtype of
    # test_sinks_match_the_oracle, whose compilations JAX reuses (issue 33: 44 fewer)
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3)))
    sinks = np.array([0.5, -2.0, 1.0, -30.0])
    mask = streaming_mask(5, 7, 2, 2, xp=backend.xp)
    arrays = [backend.asarray(a, "float64") for a in (q, k, v)]
    out = sink_attention(*arrays, backend.asarray(sinks, "float32"), mask=mask)
    for b in range(2):
        expected, _ = oracle_serving.attend(
            q[b], k[b], v[b], oracle_serving.streaming(5, 7, 2, 2, 2), sinks=sinks
        )
        _close(_as64(backend, out)[b], expected, "float64", f"{backend.name} batch {b}")


# --- chunked local attention -------------------------------------------------------------


def test_chunked_local_mask_matches_the_oracle(backend: Backend) -> None:
    """CHUNK-1: a query sees the keys of its own chunk (counted from key position 0) up to
    itself; bottom-right with L_q < L_k and L_q > L_k (negative positions), top-left."""
    for n_queries, n_keys, chunk in ((5, 13, 4), (9, 4, 3), (6, 6, 1), (3, 8, 100)):
        for alignment in ("bottom_right", "top_left"):
            built = chunked_local_mask(n_queries, n_keys, chunk, alignment, xp=backend.xp)
            offset = n_keys - n_queries if alignment == "bottom_right" else 0
            rows = oracle_serving.chunked(n_queries, n_keys, chunk, offset)
            expected = np.stack([rows(i) for i in range(n_queries)])
            np.testing.assert_array_equal(backend.to_numpy(built), expected, err_msg=alignment)


# --- merging states ----------------------------------------------------------------------


def test_merge_of_split_keys_is_attention_over_the_union(backend: Backend) -> None:
    """MERGE-1, MERGE-3: attention over keys split in two (some rows see keys on one side
    only, one row on neither) merges into attention over all keys; NaN in the output of a
    part that saw no key does not leak; two empty parts give 0 and -inf without NaN."""
    rng = np.random.default_rng(3)
    # the shapes of test_sinks_match_the_oracle, whose compilations JAX reuses for the whole
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3)))
    mask = rng.random((5, 7)) < 0.6
    mask[0, 3:] = False  # row 0: only the first part
    mask[1, :3] = False  # row 1: only the second part
    mask[2] = False  # row 2: no key at all
    for dtype in _dtypes(backend):
        arrays = [backend.asarray(a, dtype) for a in (q, k, v)]
        halves = []
        for part in (slice(0, 3), slice(3, 7)):
            out, lse = scaled_dot_product_attention(
                arrays[0],
                arrays[1][..., part, :],
                arrays[2][..., part, :],
                mask=backend.xp.asarray(mask[:, part]),
                return_lse=True,
            )
            halves += [out, lse]
        # a part that saw no key may hold anything in its output (MERGE-3)
        poisoned = np.asarray(backend.to_numpy(halves[0]), dtype=np.float64).copy()
        poisoned[:, :, 1] = np.nan
        poisoned[:, :, 2] = np.nan
        halves[0] = backend.asarray(poisoned, dtype)
        merged_out, merged_lse = merge_attention_states(*halves)
        whole_out, whole_lse = scaled_dot_product_attention(
            *arrays, mask=backend.xp.asarray(mask), return_lse=True
        )
        where = f"{backend.name} {dtype}"
        _close(_as64(backend, merged_out), _as64(backend, whole_out), dtype, where + " out")
        _close(_as64(backend, merged_lse), _as64(backend, whole_lse), dtype, where + " lse")
        assert np.all(_as64(backend, merged_out)[:, :, 2] == 0)
        assert np.all(_as64(backend, merged_lse)[:, :, 2] == -np.inf)


def test_merge_matches_the_oracle_and_pins_the_base(backend: Backend) -> None:
    """MERGE-1, MERGE-2, MERGE-3: random states with log-sum-exps up to 1e3 (no overflow:
    the max shift), -inf on either or both sides, against the element-wise oracle; a base-2
    merge is the natural one in units of ln 2."""
    rng = np.random.default_rng(4)
    # the states' shapes in test_merge_of_split_keys_is_attention_over_the_union (JAX
    # reuses its compilations)
    o_a, o_b = rng.standard_normal((2, 2, 4, 5, 3))
    l_a, l_b = rng.standard_normal((2, 2, 4, 5)) * 300
    l_a[0, :3] = -np.inf
    l_b[0, 2:5] = -np.inf  # (0, 2): both empty
    o_a[0, :3] = np.nan  # MERGE-3: never read
    expected_o, expected_l = oracle_serving.merge(o_a, l_a, o_b, l_b)
    for dtype in _dtypes(backend):
        parts = [backend.asarray(a, dtype) for a in (o_a, l_a, o_b, l_b)]
        out, lse = merge_attention_states(*parts)
        _close(_as64(backend, out), expected_o, dtype, f"{backend.name} {dtype} out")
        _close(_as64(backend, lse), expected_l, dtype, f"{backend.name} {dtype} lse")
        base2 = [parts[0], parts[1] / math.log(2), parts[2], parts[3] / math.log(2)]
        out2, lse2 = merge_attention_states(*base2, lse_base="2")
        _close(_as64(backend, out2), expected_o, dtype, f"{backend.name} {dtype} base 2")
        _close(_as64(backend, lse2) * math.log(2), expected_l, dtype, f"{backend.name} lse2")


# --- MLA ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [(32, 8), (512, 64)], ids=["small", "deepseek"])
def test_mla_absorbed_form_matches_the_oracle(backend: Backend, dims: tuple[int, int]) -> None:
    """MLA-1, MLA-2: MQA over one latent head, values its first r channels, the explicit
    scale; E = 576, Ev = 512 at DeepSeek's sizes."""
    rank, rope = dims
    if rank == 512 and backend.name == "jax":
        pytest.skip("JAX compiles per shape; the small case covers its Array API path")
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 3, rank + rope))
    kv = rng.standard_normal((2, 1, 9, rank + rope))
    scale = (128 + 64) ** -0.5
    for dtype in _dtypes(backend):
        arrays = [backend.asarray(a, dtype) for a in (q, kv)]
        out = mla_attention(
            *arrays, value_dim=rank, scale=scale, is_causal=True, causal_alignment="bottom_right"
        )
        seen = [_as64(backend, a) for a in arrays]
        for b in range(2):
            expected, _ = oracle_serving.attend(
                seen[0][b],
                seen[1][b],
                seen[1][b][..., :rank],
                oracle_serving.causal(3, 9, 6),
                scale=scale,
            )
            _close(_as64(backend, out)[b], expected, dtype, f"{backend.name} {dtype}")


def test_mla_absorbed_equals_the_unabsorbed_heads() -> None:
    """MLA-1 (its note), MLA-2: the absorbed queries against the latent cache, with the
    un-absorbed heads' scale (128 + 64)^-1/2, give the un-absorbed attention once the
    output is multiplied by W_UV: the scale of the absorbed form is the model's."""
    rng = np.random.default_rng(6)
    rank, rope, nope, heads, n_q, n_k = 16, 4, 8, 3, 2, 7
    latent, k_rope = rng.standard_normal((n_k, rank)), rng.standard_normal((n_k, rope))
    w_uk, w_uv = rng.standard_normal((2, heads, rank, nope)) / 4
    q_nope, q_rope = (
        rng.standard_normal((heads, n_q, nope)),
        rng.standard_normal((heads, n_q, rope)),
    )
    scale = (nope + rope) ** -0.5
    unabsorbed = np.stack(
        [
            scaled_dot_product_attention(
                np.concatenate([q_nope[h], q_rope[h]], -1)[None],
                np.concatenate([latent @ w_uk[h], k_rope], -1)[None],
                (latent @ w_uv[h])[None],
                scale=scale,
            )[0]
            for h in range(heads)
        ]
    )
    absorbed_q = np.concatenate([np.einsum("hqn,hrn->hqr", q_nope, w_uk), q_rope], -1)
    kv = np.concatenate([latent, k_rope], -1)[None]
    out = mla_attention(absorbed_q, kv, value_dim=rank, scale=scale)
    np.testing.assert_allclose(np.einsum("hqr,hrn->hqn", out, w_uv), unabsorbed, rtol=1e-12)
    wrong = mla_attention(absorbed_q, kv, value_dim=rank, scale=(rank + rope) ** -0.5)
    assert not np.allclose(np.einsum("hqr,hrn->hqn", wrong, w_uv), unabsorbed, rtol=1e-3)


# --- paged batches -----------------------------------------------------------------------

PAGED_CASES = {
    # PAGED-2, PAGED-3: decode rows, a prefill longer than its cache (rows that see
    # nothing), an empty sequence, a sequence with no key; page size 1
    "mixed-page-1": dict(page=1, seq_q=[1, 6, 0, 2, 3], seq_k=[5, 4, 3, 0, 7], is_causal=True),
    # PAGED-2: page size 16, GQA, softcap, ALiBi, a window, leftpad
    "page-16-window-alibi": dict(
        page=16,
        seq_q=[3, 1, 4],
        seq_k=[37, 17, 20],
        is_causal=True,
        window=(5, None),
        softcap=3.0,
        alibi=True,
        leftpad=[2, 0, 16],
    ),
    # PAGED-2, CHUNK-1, SINK-1: page size 64, chunked local attention and sinks
    "page-64-chunk-sinks": dict(page=64, seq_q=[9, 2], seq_k=[70, 130], chunk=16, sinks=True),
    # PAGED-2: page size 256, non-causal with a right window, one page per sequence
    "page-256-noncausal": dict(page=256, seq_q=[4, 3], seq_k=[10, 200], window=(3, 2)),
    # MLA-1 over a paged latent cache: values are the first channels of the key cache
    "mla-paged": dict(page=4, seq_q=[1, 2], seq_k=[9, 6], is_causal=True, mla=True),
}


# PAGED-8: a flattened mask with the window, leftpad, ALiBi and softcap of page-16's case,
# over pages of 2
PAGED_CASES["page-2-flat-mask"] = dict(PAGED_CASES["page-16-window-alibi"], page=2, flat_mask=True)
# SINK-4: page-16's case with 3 sink tokens beside its window of 5, counted from each
# sequence's cache_leftpad, and sink logits (SINK-1) too
PAGED_CASES["page-16-sink-tokens"] = dict(
    PAGED_CASES["page-16-window-alibi"], sink_tokens=3, sinks=True
)


def _paged_problem(spec: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A paged batch: each sequence's pages drawn out of order from a shared pool, the
    first two sequences sharing one page (PAGED-1), two padding query rows."""
    page, seq_q, seq_k = spec["page"], spec["seq_q"], spec["seq_k"]
    per_seq = max(1, max(-(-n // page) for n in seq_k))
    n_pages = len(seq_k) * per_seq + 2
    table = rng.permutation(n_pages)[: len(seq_k) * per_seq].reshape(len(seq_k), per_seq)
    if len(seq_k) > 1:
        table[1, 0] = table[0, 0]  # a page shared between two sequences
    n_q_heads, n_kv_heads, head_dim = (4, 2, 8) if not spec.get("mla") else (4, 1, 12)
    cu_q = np.concatenate([[0], np.cumsum(seq_q)])
    problem = dict(
        q=rng.standard_normal((int(cu_q[-1]) + 2, n_q_heads, head_dim)),
        k_cache=rng.standard_normal((n_pages, n_kv_heads, page, head_dim)),
        v_cache=None if spec.get("mla") else rng.standard_normal((n_pages, n_kv_heads, page, 3)),
        cu_q=cu_q.astype(np.int32),
        used=np.array(seq_k, np.int32),
        table=table.astype(np.int32),
    )
    return problem


def _paged_options(spec: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name in ("is_causal", "window", "softcap"):
        if name in spec:
            options[name] = spec[name]
    if "chunk" in spec:
        options["attention_chunk"] = spec["chunk"]
    if "sink_tokens" in spec:
        options["n_sink_tokens"] = spec["sink_tokens"]
    if spec.get("mla"):
        options["value_dim"] = 8
        options["scale"] = 0.2
    return options


def _run_paged(
    backend: Backend, dtype: str, problem: dict[str, Any], spec: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    xp = backend.xp
    options = _paged_options(spec)
    if spec.get("alibi"):
        options["alibi_slopes"] = backend.asarray(np.array([0.5, 0.25, 0.125, 1.0]), "float32")
    if spec.get("sinks"):
        options["sinks"] = backend.asarray(np.array([1.0, -2.0, 0.0, 3.0]), "float32")
    if "leftpad" in spec:
        options["cache_leftpad"] = xp.asarray(np.array(spec["leftpad"], np.int32))
    if spec.get("flat_mask"):
        options["mask"] = xp.asarray(_flat_mask(spec))
    out, lse = paged_attention(
        backend.asarray(problem["q"], dtype),
        backend.asarray(problem["k_cache"], dtype),
        None if problem["v_cache"] is None else backend.asarray(problem["v_cache"], dtype),
        xp.asarray(problem["cu_q"]),
        xp.asarray(problem["used"]),
        xp.asarray(problem["table"]),
        return_lse=True,
        **options,
    )
    return _as64(backend, out), _as64(backend, lse)


def _flat_mask(spec: dict[str, Any]) -> np.ndarray:
    """PAGED-8's flattened mask of the case: each sequence's (L_q, L_k) entries in turn."""
    leftpad = spec.get("leftpad") or [0] * len(spec["seq_k"])
    lengths = zip(spec["seq_q"], spec["seq_k"], leftpad, strict=True)
    size = sum(n_q * (n_k - pad) for n_q, n_k, pad in lengths)
    return np.random.default_rng(11).random(size) < 0.6


def _paged_oracle(
    backend: Backend, dtype: str, problem: dict[str, Any], spec: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    def seen(a: Any) -> Any:
        return None if a is None else _as64(backend, backend.asarray(a, dtype))

    options = _paged_options(spec)
    options.pop("attention_chunk", None)
    options.pop("n_sink_tokens", None)
    if spec.get("alibi"):
        options["slopes"] = np.array([0.5, 0.25, 0.125, 1.0])
    if spec.get("sinks"):
        options["sinks"] = np.array([1.0, -2.0, 0.0, 3.0])
    return oracle_serving.paged(
        seen(problem["q"]),
        seen(problem["k_cache"]),
        seen(problem["v_cache"]),
        problem["cu_q"].tolist(),
        problem["used"].tolist(),
        problem["table"].tolist(),
        leftpad=spec.get("leftpad"),
        chunk=spec.get("chunk"),
        flat_mask=_flat_mask(spec) if spec.get("flat_mask") else None,
        sink_tokens=spec.get("sink_tokens", 0),
        **options,
    )


@pytest.mark.parametrize("case", PAGED_CASES, ids=str)
def test_paged_batches_match_the_oracle(backend: Backend, case: str) -> None:
    """PAGED-1, PAGED-2, PAGED-3, PAGED-4: packed queries of sequences of different lengths
    against their cached keys read through shuffled, shared pages of sizes 1 to 256,
    bottom-right per sequence, with windows, chunks, ALiBi, softcap, sinks, sink tokens
    (SINK-4), leftpad, MLA;
    padding rows past cu_seqlens_q[-1] give 0."""
    spec = PAGED_CASES[case]
    if backend.name == "jax" and case != "mixed-page-1":
        pytest.skip("JAX compiles per shape; one case covers its Array API path")
    if backend.name == "jax":
        # Each sequence is computed on its own shapes, each a compilation of every
        # operation on JAX: it leaves out the last one (3 queries over 7 keys), whose path
        # the prefill of 6 over 4 takes too (rows seeing some keys, bottom-right causal),
        # keeping the decode row, the rows that see nothing, the empty sequence, the one
        # with no key, the shared page and the padding rows (issue 33: 164 -> 121
        # compilations).
        spec = dict(spec, seq_q=spec["seq_q"][:-1], seq_k=spec["seq_k"][:-1])
    problem = _paged_problem(spec, np.random.default_rng(7))
    for dtype in _dtypes(backend):
        out, lse = _run_paged(backend, dtype, problem, spec)
        expected_out, expected_lse = _paged_oracle(backend, dtype, problem, spec)
        _close(out, expected_out, dtype, f"{backend.name} {dtype} {case} out")
        _close(lse, expected_lse, dtype, f"{backend.name} {dtype} {case} lse")


def test_paged_decode_equals_the_kv_cache_reference() -> None:
    """PAGED-2 against KVCACHE-2: decode rows over a paged cache are the KV-cache
    definition over the same pages (a dense gather)."""
    rng = np.random.default_rng(8)
    spec = dict(page=16, seq_q=[1, 1, 1], seq_k=[40, 3, 16], is_causal=True)
    problem = _paged_problem(spec, rng)
    out = paged_attention(
        problem["q"],
        problem["k_cache"],
        problem["v_cache"],
        problem["cu_q"],
        problem["used"],
        problem["table"],
        is_causal=True,
    )
    cached = kv_cache_attention(
        problem["q"][:3, :, None, :],
        problem["k_cache"],
        problem["v_cache"],
        problem["used"],
        block_table=problem["table"],
        is_causal=True,
    )
    np.testing.assert_allclose(out[:3], cached[:, :, 0, :], rtol=1e-13)


def _assert_paged_matches_oracle(spec: dict[str, Any], seed: int, dtype: str) -> None:
    """The paged reference on ``spec``'s problem drawn from ``seed``, in ``dtype``, gives
    the oracle's output and log-sum-exp (within the dtype's tolerance)."""
    problem = _paged_problem(spec, np.random.default_rng(seed))
    backend = Backend("numpy")
    out, lse = _run_paged(backend, dtype, problem, spec)
    expected_out, expected_lse = _paged_oracle(backend, dtype, problem, spec)
    _close(out, expected_out, dtype, "out")
    _close(lse, expected_lse, dtype, "lse")


def test_paged_blocks_and_chunks_do_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """PAGED-2, MERGE-1: with blocks of a few elements (rows in many chunks, keys in many
    blocks merged by their log-sum-exps) a long prefill is the oracle's."""
    monkeypatch.setattr(paged_module, "BLOCK_ELEMENTS", 96)
    spec = dict(
        page=16,
        seq_q=[40, 1, 25],
        seq_k=[50, 33, 25],
        is_causal=True,
        window=(20, None),
        sinks=True,
    )
    _assert_paged_matches_oracle(spec, 9, "float64")


def test_paged_thousands_of_queries() -> None:
    """PAGED-2 at serving sizes: a prefill chunk of 2048 queries over 3000 cached keys in
    pages of 16 beside decode rows, against the oracle."""
    spec = dict(page=16, seq_q=[2048, 1, 1], seq_k=[3000, 4000, 17], is_causal=True)
    _assert_paged_matches_oracle(spec, 10, "float32")


def test_paged_tens_of_thousands_of_pages() -> None:
    """PAGED-1, PAGED-3, PAGED-4: 40 000 pages of 4 positions in one cache (page indices
    past int16), a decode row over 100 003 keys, and rows that see nothing at the very start
    of the batch (a first sequence with L_q > L_k, causal)."""
    rng = np.random.default_rng(15)
    n_pages, page = 40_000, 4
    pages = rng.permutation(n_pages)
    table = np.full((2, 25_001), -1, np.int32)  # entries past the pages read: never read
    table[0, 0], table[1] = pages[-1], pages[:25_001]
    k_cache = rng.standard_normal((n_pages, 1, page, 8))
    v_cache = rng.standard_normal((n_pages, 1, page, 4))
    q = rng.standard_normal((4, 2, 8))
    cu_q, used = np.array([0, 3, 4], np.int32), np.array([1, 100_003], np.int32)
    out, lse = paged_attention(
        q, k_cache, v_cache, cu_q, used, table, is_causal=True, return_lse=True
    )
    expected_out, expected_lse = oracle_serving.paged(
        q, k_cache, v_cache, cu_q.tolist(), used.tolist(), table.tolist(), is_causal=True
    )
    _close(out, expected_out, "float64", "out")
    _close(lse, expected_lse, "float64", "lse")
    assert np.all(out[:2] == 0) and np.all(lse[:, :2] == -np.inf), "PAGED-3: rows that see nothing"


def test_memory_past_the_valid_length_changes_nothing(backend: Backend) -> None:
    """PAGED-5: NaN, inf or other values in cache slots past seqused_k and before
    cache_leftpad, in pages no table reaches, in block-table entries past the pages read
    and in query rows past cu_seqlens_q[-1] leave the output bit-identical."""
    if backend.name == "jax":
        pytest.skip(
            "JAX compiles per shape (~20 s here); the paged path runs on JAX in "
            "test_paged_batches_match_the_oracle"
        )
    spec = dict(page=4, seq_q=[2, 3], seq_k=[6, 9], is_causal=True, leftpad=[1, 0])
    rng = np.random.default_rng(11)
    problem = _paged_problem(spec, rng)
    clean = _run_paged(backend, "float32", problem, spec)
    valid_rows = int(problem["cu_q"][-1])
    for fill in (np.nan, np.inf, 1e30):
        dirty = {name: (None if a is None else a.copy()) for name, a in problem.items()}
        reached = set()
        for b, row in enumerate(problem["table"].tolist()):
            for t in range(problem["k_cache"].shape[2] * len(row)):
                page, slot = row[t // 4], t % 4
                inside = spec["leftpad"][b] <= t < spec["seq_k"][b]
                if inside:
                    reached.add((page, slot))
        for page in range(problem["k_cache"].shape[0]):
            for slot in range(4):
                if (page, slot) not in reached:
                    dirty["k_cache"][page, :, slot] = fill
                    dirty["v_cache"][page, :, slot] = fill
        dirty["q"][valid_rows:] = fill
        dirty["table"][0, -1] = 10**6  # an entry past the pages sequence 0 reads
        out, lse = _run_paged(backend, "float32", dirty, spec)
        assert np.array_equal(out[:valid_rows], clean[0][:valid_rows]), fill
        assert np.array_equal(lse[:, :valid_rows], clean[1][:, :valid_rows]), fill


def test_bias_in_another_dtype_than_q(backend: Backend) -> None:
    """SDPA-1.4: a float32 bias with float16 queries is used as given (not rounded to
    float16) and the output has q's dtype."""
    if "float16" not in backend.dtype_names:
        pytest.skip(f"{backend.name} has no float16")
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 3)))
    bias = rng.standard_normal((3, 5)) * 3 + 1 / 3  # not float16 values
    arrays = [backend.asarray(a, "float16") for a in (q, k, v)]
    out = scaled_dot_product_attention(*arrays, bias=backend.asarray(bias, "float32"))
    assert backend.to_numpy(out).dtype == np.float16
    seen = [_as64(backend, a) for a in arrays]
    seen_bias = _as64(backend, backend.asarray(bias, "float32"))
    expected, _ = oracle.sdpa(*seen, bias=seen_bias)
    _close(_as64(backend, out), expected, "float16", backend.name)


# --- bad input ---------------------------------------------------------------------------


def test_bad_arguments_name_themselves() -> None:
    """PAGED-6, SINK-1, MLA-1, MLA-2, MERGE-1: bad input raises naming the argument and
    the clause; pages past the valid length are not read, so their indices are not
    checked (PAGED-1)."""
    rng = np.random.default_rng(13)
    spec = dict(page=4, seq_q=[1, 2], seq_k=[3, 5])
    p = _paged_problem(spec, rng)
    args = [p["q"], p["k_cache"], p["v_cache"], p["cu_q"], p["used"], p["table"]]
    bad_table = p["table"].copy()
    bad_table[1, 0] = 99
    with pytest.raises(ValueError, match=r"block_table\[1\].*PAGED-6"):
        paged_attention(*args[:5], bad_table)
    unread = p["table"].copy()
    unread[0, -1] = -7  # sequence 0 reads one page only
    paged_attention(*args[:5], unread)
    with pytest.raises(ValueError, match=r"seqused_k\[1\].*PAGED-6"):
        paged_attention(*args[:4], np.array([3, 99], np.int32), p["table"])
    with pytest.raises(ValueError, match=r"cu_seqlens_q.*PAGED-1"):
        paged_attention(p["q"], *args[1:3], np.array([0, 2, 1], np.int32), *args[4:])
    with pytest.raises(TypeError, match=r"seqused_k.*integer.*PAGED-1"):
        paged_attention(*args[:4], np.array([3.0, 5.0]), p["table"])
    with pytest.raises(ValueError, match=r"sinks.shape.*SINK-1"):
        paged_attention(*args, sinks=np.zeros(3))
    q, kv = rng.standard_normal((4, 2, 12)), rng.standard_normal((1, 5, 12))
    with pytest.raises(ValueError, match=r"scale=None.*MLA-2"):
        mla_attention(q, kv, value_dim=8, scale=None)
    with pytest.raises(ValueError, match=r"value_dim=13.*MLA-1"):
        mla_attention(q, kv, value_dim=13, scale=0.1)
    with pytest.raises(ValueError, match=r"kv.shape.*MLA-1"):
        mla_attention(q, np.concatenate([kv, kv]), value_dim=8, scale=0.1)
    with pytest.raises(ValueError, match=r"lse_b.shape.*MERGE-2"):
        merge_attention_states(q, q[..., 0], q, q[..., 0, 0])
    with pytest.raises(ValueError, match=r"lse_base.*MERGE-2"):
        merge_attention_states(q, q[..., 0], q, q[..., 0], lse_base="10")
