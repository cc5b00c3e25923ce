"""The sparse patterns' index sets (spec/sparse.md, SPARSE-1 … SPARSE-5), checked.

Every mask ``sparse_mask`` builds is compared with a brute-force set builder written
here, in plain Python, from the spec's formulas — for 240 small (Lq, Lk, parameters) per
pattern drawn by Hypothesis on NumPy (a failure shrinks to the shortest lengths and simplest
parameters) and a hand-written case per pattern on every other CPU backend.  BigBird's draw is
re-implemented from SPARSE-5.3's pseudo-code.  The library window conventions of
SPARSE-2.2 are checked against JAX itself and against transcriptions of the upstream
FlashAttention and xformers sources and docstrings.  The figures in spec/figures/ are
what scripts/draw-patterns draws now.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import random
import re
from dataclasses import dataclass
from typing import Any

import array_api_compat.numpy as np_xp
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from sparse_problems import FIXED_LENGTHS, FIXED_PARAMS, pattern_params
from support import ROOT, backend_or_skip, drawn

from attnspec.backends import Backend
from attnspec.reference import (
    PATTERN_NAMES,
    bigbird_mask,
    block_sparse_mask,
    fixed_mask,
    library_window,
    longformer_mask,
    sliding_window_mask,
    sparse_mask,
    strided_mask,
)

ALIGNMENTS = ("top_left", "bottom_right")


# --- the spec's formulas, as Python sets ---------------------------------------------------


def offset(n_queries: int, n_keys: int, alignment: str) -> int:
    """SPARSE-1.2: d = 0 (top-left) or Lk - Lq (bottom-right)."""
    return 0 if alignment == "top_left" else n_keys - n_queries


def window_set(t: int, n_keys: int, left: int | None, right: int | None, dilation: int) -> set[int]:
    """SPARSE-2.1: t - left <= j <= t + right, (t - j) mod dilation == 0."""
    return {
        j
        for j in range(n_keys)
        if (left is None or j >= t - left)
        and (right is None or j <= t + right)
        and (t - j) % dilation == 0
    }


@dataclass(frozen=True)
class MaskCase:
    """One mask to build and check: a pattern, its lengths Lq and Lk, alignment,
    causality and the pattern's parameters."""

    pattern: str
    n_queries: int
    n_keys: int
    alignment: str
    causal: bool
    params: dict[str, Any]


def expected_sets(case: MaskCase, random_rows: list[list[int]] | None = None) -> list[set[int]]:
    """S(i) for every query, straight from spec/sparse.md (Python's // and % floor)."""
    pattern, n_keys, params = case.pattern, case.n_keys, case.params
    d = offset(case.n_queries, n_keys, case.alignment)
    keys = range(n_keys)
    sets = []
    for i in range(case.n_queries):
        t = i + d
        if pattern == "sliding_window":
            s = window_set(t, n_keys, params["left"], params["right"], params.get("dilation", 1))
        elif pattern == "strided":
            stride = params["stride"]
            s = {j for j in keys if t - stride <= j <= t} | {
                j for j in keys if (t - j) % stride == 0
            }
        elif pattern == "fixed":
            stride, summary = params["stride"], params["summary"]
            s = {j for j in keys if j // stride == t // stride} | {
                j for j in keys if j % stride in range(stride - summary, stride)
            }
        elif pattern == "block_sparse":
            block_q, block_k = params["block_size"]
            s = {j for j in keys if params["layout"][i // block_q][j // block_k]}
        elif pattern == "longformer":
            globals_ = set(params["global_tokens"])
            s = window_set(
                t, n_keys, params["left"], params["right"], params.get("dilation", 1)
            ) | (globals_ & set(keys))
            if t in globals_:
                s = set(keys)
        else:  # bigbird
            size, near = params["block_size"], params["window_blocks"]
            globals_ = set(params["global_blocks"])
            first = d // size
            drawn = set(random_rows[t // size - first]) if random_rows else set()
            s = {
                j
                for j in keys
                if abs(t // size - j // size) <= near
                or j // size in globals_
                or t // size in globals_
                or j // size in drawn
            }
        sets.append({j for j in s if j <= t} if case.causal else s)
    return sets


def as_mask(sets: list[set[int]], n_keys: int) -> np.ndarray:
    mask = np.zeros((len(sets), n_keys), dtype=bool)
    for i, s in enumerate(sets):
        mask[i, sorted(s)] = True
    return mask


def spec_draw(
    seed: int,
    first: int,
    count: int,
    n_key_blocks: int,
    near: int,
    globals_: set[int],
    num_random: int,
) -> list[list[int]]:
    """SPARSE-5.3's pseudo-code, transcribed line by line."""
    rng = random.Random(seed)
    table = []
    for query_block in range(first, first + count):
        if query_block in globals_:
            row: list[int] = []
        else:
            pool = [
                b for b in range(n_key_blocks) if abs(query_block - b) > near and b not in globals_
            ]
            m = min(num_random, len(pool))
            for s in range(m):
                p = s + math.floor(rng.random() * (len(pool) - s))
                pool[s], pool[p] = pool[p], pool[s]
            row = sorted(pool[:m])
        table.append(row + [-1] * (num_random - len(row)))
    return table


def check_case(backend: Backend, case: MaskCase) -> None:
    pattern, n_queries, n_keys, params = case.pattern, case.n_queries, case.n_keys, case.params
    keywords = dict(params)
    if pattern == "block_sparse":
        keywords["layout"] = backend.asarray(
            np.array(params["layout"], dtype=bool).reshape(
                -(-n_queries // params["block_size"][0]), -(-n_keys // params["block_size"][1])
            )
        )
    keywords.update(
        alignment=case.alignment, causal=case.causal, xp=backend.xp, device=backend.device
    )
    random_rows = None
    if pattern == "bigbird":
        mask, table = bigbird_mask(n_queries, n_keys, **keywords)
        random_rows = backend.to_numpy(table).tolist()
    else:
        mask = sparse_mask(pattern, n_queries, n_keys, **keywords)
    expected = as_mask(expected_sets(case, random_rows), n_keys)
    got = backend.to_numpy(mask)
    assert got.dtype == bool and got.shape == (n_queries, n_keys)
    assert np.array_equal(got, expected), (
        f"{pattern} Lq={n_queries} Lk={n_keys} {case.alignment} causal={case.causal} {params}\n"
        f"got\n{got.astype(int)}\nexpected\n{expected.astype(int)}"
    )


@st.composite
def small_cases(draw: st.DrawFn, pattern: str) -> MaskCase:
    """A case of ``pattern``: lengths 1-14, ragged blocks and Lq != Lk included; a failure
    shrinks to the shortest lengths and simplest parameters."""
    n_queries, n_keys = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    alignment, causal = draw(st.sampled_from(ALIGNMENTS)), draw(st.booleans())
    params = draw(pattern_params(pattern, n_queries, n_keys))
    return MaskCase(pattern, n_queries, n_keys, alignment, causal, params)


@pytest.mark.parametrize("pattern", PATTERN_NAMES)
def test_mask_equals_the_spec_set_on_numpy(pattern: str) -> None:
    """SPARSE-1.1, SPARSE-1.2, SPARSE-1.3 and each pattern's clause (SPARSE-2.1, SPARSE-3.1,
    SPARSE-3.2, SPARSE-4.1, SPARSE-5.1, SPARSE-5.2): the mask is exactly S(i), for 240
    drawn small (Lq, Lk, params) in both alignments, with and without causality, after the
    pattern's hand-written case."""
    numpy = Backend("numpy")
    params, alignment, causal = FIXED_PARAMS[pattern]

    @drawn(240)
    @given(case=small_cases(pattern))
    @example(case=MaskCase(pattern, *FIXED_LENGTHS, alignment, causal, params)).via(
        "the hand-written case"
    )
    def mask_is_the_set(case: MaskCase) -> None:
        check_case(numpy, case)

    mask_is_the_set()


def test_mask_equals_the_spec_set_on_every_backend(cpu_backend: Backend) -> None:
    """SPARSE-1.1: the mask builders are pure Array API — the same sets on every backend.
    The hand-written case of each pattern (Lq = 11, Lk = 14; tests/sparse_problems.py):
    JAX compiles every operation for each new shape, so the shapes are shared."""
    for pattern in PATTERN_NAMES:
        params, alignment, causal = FIXED_PARAMS[pattern]
        check_case(cpu_backend, MaskCase(pattern, *FIXED_LENGTHS, alignment, causal, params))


def test_degenerate_sizes() -> None:
    """SPARSE-1.2: every pattern is defined for Lq = 0 and Lk = 0 (empty masks)."""
    numpy = Backend("numpy")
    for pattern in PATTERN_NAMES:
        for n_queries, n_keys in ((0, 5), (5, 0), (0, 0)):
            params = dict(FIXED_PARAMS[pattern][0])
            if pattern == "block_sparse":
                block_q, block_k = params["block_size"]
                params["layout"] = [[True] * (-(-n_keys // block_k))] * (-(-n_queries // block_q))
            check_case(numpy, MaskCase(pattern, n_queries, n_keys, "bottom_right", True, params))


def test_named_builders_equal_sparse_mask() -> None:
    """SPARSE-1.1: the per-pattern builders are sparse_mask with the pattern named."""
    kw = {"alignment": "bottom_right", "causal": True, "xp": np_xp}
    layout = [[True, False, True], [False, True, False]]
    pairs = [
        (
            sliding_window_mask(5, 9, left=2, right=1, dilation=2, **kw),
            sparse_mask("sliding_window", 5, 9, left=2, right=1, dilation=2, **kw),
        ),
        (strided_mask(5, 9, stride=3, **kw), sparse_mask("strided", 5, 9, stride=3, **kw)),
        (
            fixed_mask(5, 9, stride=3, summary=1, **kw),
            sparse_mask("fixed", 5, 9, stride=3, summary=1, **kw),
        ),
        (
            block_sparse_mask(5, 9, layout=layout, block_size=(3, 4), **kw),
            sparse_mask("block_sparse", 5, 9, layout=layout, block_size=(3, 4), **kw),
        ),
        (
            longformer_mask(5, 9, left=1, right=1, global_tokens=[2], **kw),
            sparse_mask("longformer", 5, 9, left=1, right=1, global_tokens=[2], **kw),
        ),
        (
            bigbird_mask(5, 9, block_size=2, num_random=1, seed=3, **kw)[0],
            sparse_mask("bigbird", 5, 9, block_size=2, num_random=1, seed=3, **kw),
        ),
    ]
    for named, generic in pairs:
        assert np.array_equal(named, generic)


# --- BigBird's random blocks (SPARSE-5.3) -----------------------------------------------------


def test_bigbird_draw_follows_the_pseudo_code() -> None:
    """SPARSE-5.3: the drawn table is exactly the spec's pseudo-code, for 200 random
    configurations, and it obeys the constraints the clause states."""
    rng = random.Random(53)
    for _ in range(200):
        n_queries, n_keys = rng.randint(1, 40), rng.randint(1, 40)
        size, near, r = rng.randint(1, 5), rng.randint(0, 2), rng.randint(0, 4)
        alignment = rng.choice(ALIGNMENTS)
        n_key_blocks = -(-n_keys // size)
        globals_ = set(rng.sample(range(n_key_blocks + 1), min(2, n_key_blocks)))
        seed = rng.randint(0, 2**40)
        _, table = bigbird_mask(
            n_queries,
            n_keys,
            block_size=size,
            window_blocks=near,
            global_blocks=sorted(globals_),
            num_random=r,
            seed=seed,
            alignment=alignment,
            xp=np_xp,
        )
        d = offset(n_queries, n_keys, alignment)
        first, last = d // size, (n_queries - 1 + d) // size
        expected = spec_draw(seed, first, last - first + 1, n_key_blocks, near, globals_, r)
        assert np.asarray(table).tolist() == expected
        for query_block, row in zip(range(first, last + 1), expected, strict=True):
            drawn = [b for b in row if b >= 0]
            pool = [
                b for b in range(n_key_blocks) if abs(query_block - b) > near and b not in globals_
            ]
            assert len(set(drawn)) == len(drawn) and set(drawn) <= set(pool)
            assert len(drawn) == (0 if query_block in globals_ else min(r, len(pool)))


def test_bigbird_seed_reproduces_and_table_replaces_it() -> None:
    """SPARSE-5.3: the same seed gives the same pattern; passing the returned table back as
    random_blocks= gives it without the seed; different seeds give different tables."""
    kw = {"block_size": 4, "window_blocks": 1, "global_blocks": [0], "xp": np_xp}
    mask, table = bigbird_mask(64, 64, num_random=3, seed=11, **kw)
    again, table_again = bigbird_mask(64, 64, num_random=3, seed=11, **kw)
    replayed, table_replayed = bigbird_mask(64, 64, random_blocks=table, **kw)
    assert np.array_equal(mask, again) and np.array_equal(table, table_again)
    assert np.array_equal(mask, replayed) and np.array_equal(table, table_replayed)
    tables = {bigbird_mask(64, 64, num_random=3, seed=s, **kw)[1].tobytes() for s in range(5)}
    assert len(tables) == 5


# --- library conventions (SPARSE-2.2) ---------------------------------------------------------


def flash_attn_local_mask(n_queries: int, n_keys: int, window: tuple[int, int]) -> np.ndarray:
    """Transcription of flash-attention tests/test_flash_attn.py ``construct_local_mask``
    (True = masked out there) for non-negative windows, returned as True = may attend."""
    row = np.arange(n_queries)[:, None]
    col = np.arange(n_keys)[None, :]
    masked = np.logical_or(
        col > np.minimum(row + n_keys - n_queries + window[1], n_keys),
        col < row + n_keys - n_queries - window[0],
    )
    return ~masked


def test_flash_attn_window_matches_its_reference_mask() -> None:
    """SPARSE-2.2: FlashAttention window_size=(l, r) is bottom-right [t - l, t + r] — the
    mask FlashAttention's own tests build, for every small shape and window."""
    for n_queries in range(1, 9):
        for n_keys in range(1, 9):
            for window in ((0, 0), (1, 0), (0, 2), (2, 3), (5, 1), (7, 7)):
                ours = sparse_mask(
                    n_queries=n_queries,
                    n_keys=n_keys,
                    xp=np_xp,
                    **library_window("flash_attn", window),
                )
                assert np.array_equal(ours, flash_attn_local_mask(n_queries, n_keys, window))


def test_flash_attn_documented_causal_examples() -> None:
    """SPARSE-2.2 with SPARSE-1.3: FlashAttention's docstring examples of causal=True with
    seqlen_q != seqlen_k (window (-1, -1) = unbounded, bottom-right)."""
    kw = library_window("flash_attn", (-1, -1), causal=True)
    two_by_five = [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    five_by_two = [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    assert np.array_equal(sparse_mask(n_queries=2, n_keys=5, xp=np_xp, **kw), two_by_five)
    assert np.array_equal(sparse_mask(n_queries=5, n_keys=2, xp=np_xp, **kw), five_by_two)
    # causal=True with a window: FlashAttention sets the right extent to 0.
    causal = library_window("flash_attn", (2, 5), causal=True)
    right_zero = library_window("flash_attn", (2, 0))
    assert np.array_equal(
        sparse_mask(n_queries=6, n_keys=9, xp=np_xp, **causal),
        sparse_mask(n_queries=6, n_keys=9, xp=np_xp, **right_zero),
    )


def test_xformers_local_documented_examples() -> None:
    """SPARSE-2.2: xformers' LocalAttentionFromBottomRightMask(window_left=1, window_right=2)
    docstring shows these 4x4 and 4x5 masks."""
    kw = library_window("xformers_local", (1, 2))
    four_by_four = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]]
    four_by_five = [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert np.array_equal(sparse_mask(n_queries=4, n_keys=4, xp=np_xp, **kw), four_by_four)
    assert np.array_equal(sparse_mask(n_queries=4, n_keys=5, xp=np_xp, **kw), four_by_five)


def test_xformers_masks_match_their_materialize() -> None:
    """SPARSE-2.2: transcriptions of xformers' ``materialize``: LocalAttentionFromBottomRight
    is triu(d - l) & tril(d + r); LowerTriangularFromBottomRightLocalAttentionMask(w) is
    tril(d) & triu(d - w + 1) (w keys including the query's own position); the legacy
    components.LocalAttention(w) keeps |i - j| < w // 2 + 1, or with causal=True a width
    2w + 1 pattern cut by the causal triangle."""
    for n_queries in range(1, 8):
        for n_keys in range(1, 8):
            ones = np.ones((n_queries, n_keys), dtype=bool)
            d = n_keys - n_queries
            for left, right in ((0, 0), (1, 2), (3, 0), (0, 4)):
                kw = library_window("xformers_local", (left, right))
                expected = np.triu(ones, d - left) & np.tril(ones, d + right)
                assert np.array_equal(
                    sparse_mask(n_queries=n_queries, n_keys=n_keys, xp=np_xp, **kw), expected
                )
            for w in (1, 2, 4):
                kw = library_window("xformers_causal_local", w)
                expected = np.tril(ones, d) & np.triu(ones, d - w + 1)
                assert np.array_equal(
                    sparse_mask(n_queries=n_queries, n_keys=n_keys, xp=np_xp, **kw), expected
                )
    for length in range(1, 9):
        distance = np.abs(np.arange(length)[:, None] - np.arange(length)[None, :])
        for w in (1, 3, 5):
            kw = library_window("xformers_components", w)
            assert np.array_equal(
                sparse_mask(n_queries=length, n_keys=length, xp=np_xp, **kw), distance < w // 2 + 1
            )
        for w in (1, 2, 3):
            kw = library_window("xformers_components", w, causal=True)
            causal = np.tril(np.ones((length, length), dtype=bool))
            assert np.array_equal(
                sparse_mask(n_queries=length, n_keys=length, xp=np_xp, **kw),
                (distance < (2 * w + 1) // 2 + 1) & causal,
            )


def test_jax_local_window_size_is_the_same_set() -> None:
    """SPARSE-2.2: jax.nn.dot_product_attention(local_window_size=...) attends exactly the
    keys of library_window("jax", ...): observed through V = I with q = k = 0, where the
    weights are uniform over the keys a query may attend."""
    jax = pytest.importorskip("jax", reason="JAX is not installed; its mapping is not checked")
    jnp = backend_or_skip("jax").xp
    # One shape (JAX compiles the attention per shape, about 3 s), several windows.
    n_queries, n_keys = 5, 9
    for window, causal in (
        ((2, 1), False),
        ((1, 3), False),
        ((0, 0), False),
        (2, False),
        ((3, 0), True),
        ((1, 4), True),
        (6, True),
    ):
        # JAX wants v's head dimension equal to q's: E = Lk.
        q = jnp.zeros((1, n_queries, 1, n_keys), dtype=jnp.float32)
        k = jnp.zeros((1, n_keys, 1, n_keys), dtype=jnp.float32)
        v = jnp.eye(n_keys, dtype=jnp.float32)[None, :, None, :]
        out = np.asarray(
            jax.nn.dot_product_attention(q, k, v, local_window_size=window, is_causal=causal)
        )[0, :, 0, :]
        ours = np.asarray(
            sparse_mask(
                n_queries=n_queries,
                n_keys=n_keys,
                xp=np_xp,
                **library_window("jax", window, causal=causal),
            )
        )
        # JAX gives empty rows the mean of V (SDPA-5.1 divergence): compare the others.
        rows = ours.any(axis=1)
        assert rows.any()
        assert np.array_equal(out[rows] > 0, ours[rows]), (window, causal)


# --- parameter errors (SPARSE-1.4) ---------------------------------------------------------

BAD_PARAMETERS = [
    (ValueError, "pattern='diagonal'", lambda: sparse_mask("diagonal", 3, 3, xp=np_xp)),
    (
        ValueError,
        "alignment='centre'",
        lambda: sparse_mask("strided", 3, 3, stride=2, alignment="centre", xp=np_xp),
    ),
    (
        TypeError,
        "causal='yes'",
        lambda: sparse_mask("strided", 3, 3, stride=2, causal="yes", xp=np_xp),
    ),
    (ValueError, "n_queries=-1", lambda: sparse_mask("strided", -1, 3, stride=2, xp=np_xp)),
    (ValueError, "left=-1", lambda: sliding_window_mask(3, 3, left=-1, right=0, xp=np_xp)),
    (TypeError, "right=1.5", lambda: sliding_window_mask(3, 3, left=1, right=1.5, xp=np_xp)),
    (
        ValueError,
        "dilation=0",
        lambda: sliding_window_mask(3, 3, left=1, right=1, dilation=0, xp=np_xp),
    ),
    (TypeError, "got width", lambda: sparse_mask("sliding_window", 3, 3, width=2, xp=np_xp)),
    (
        TypeError,
        "required: left, right",
        lambda: sparse_mask("sliding_window", 3, 3, left=2, xp=np_xp),
    ),
    (ValueError, "stride=0", lambda: strided_mask(3, 3, stride=0, xp=np_xp)),
    (ValueError, "summary=5", lambda: fixed_mask(3, 3, stride=4, summary=5, xp=np_xp)),
    (
        ValueError,
        "layout.shape=(1, 1)",
        lambda: block_sparse_mask(5, 5, layout=[[True]], block_size=2, xp=np_xp),
    ),
    (
        TypeError,
        "layout.dtype=float64",
        lambda: block_sparse_mask(2, 2, layout=np.ones((1, 1)), block_size=2, xp=np_xp),
    ),
    (
        ValueError,
        "block_size=(1, 2, 3)",
        lambda: block_sparse_mask(2, 2, layout=[[True]], block_size=(1, 2, 3), xp=np_xp),
    ),
    (
        ValueError,
        "block_size[1]=0",
        lambda: block_sparse_mask(2, 2, layout=[[True]], block_size=(2, 0), xp=np_xp),
    ),
    (
        ValueError,
        "global_tokens[1]=-2",
        lambda: longformer_mask(4, 4, left=1, right=1, global_tokens=[0, -2], xp=np_xp),
    ),
    (
        TypeError,
        "global_tokens=3",
        lambda: longformer_mask(4, 4, left=1, right=1, global_tokens=3, xp=np_xp),
    ),
    (TypeError, "seed=None", lambda: bigbird_mask(8, 8, block_size=2, num_random=1, xp=np_xp)),
    (
        ValueError,
        "random_blocks has 1 rows",
        lambda: bigbird_mask(8, 8, block_size=2, random_blocks=[[3]], xp=np_xp),
    ),
    (
        ValueError,
        "random_blocks[0]=[1]",
        lambda: bigbird_mask(8, 8, block_size=2, random_blocks=[[1], [3], [0], [-1]], xp=np_xp),
    ),
    (ValueError, "convention='torch'", lambda: library_window("torch", (1, 1))),
    (TypeError, "window=3, but flash_attn takes a pair", lambda: library_window("flash_attn", 3)),
    (ValueError, "window_size=4", lambda: library_window("xformers_components", 4)),
    (ValueError, "window[0]=-1", lambda: library_window("jax", (-1, 2))),
    (ValueError, "window_left=-1", lambda: library_window("xformers_local", (-1, 2))),
    (ValueError, "window_size=0", lambda: library_window("xformers_causal_local", 0)),
]


@pytest.mark.parametrize(
    ("error", "fragment", "call"),
    BAD_PARAMETERS,
    ids=[fragment for _, fragment, _ in BAD_PARAMETERS],
)
def test_bad_parameters_raise_naming_them(error: type, fragment: str, call: Any) -> None:
    """SPARSE-1.4: a bad pattern parameter raises ValueError/TypeError naming the argument,
    its value and the clause."""
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert fragment in message, message
    assert re.search(r"\[(SPARSE|SDPA)-[0-9.]+, ", message), message


def test_layout_from_another_library_is_rejected() -> None:
    """SPARSE-1.4: a layout array must belong to the library the mask is built with."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    with pytest.raises(TypeError, match="layout is a torch"):
        block_sparse_mask(2, 2, layout=torch.ones((1, 1), dtype=torch.bool), block_size=2, xp=np_xp)


# --- figures -------------------------------------------------------------------------------


def _draw_patterns_module() -> Any:
    path = ROOT / "scripts" / "draw-patterns"
    loader = importlib.machinery.SourceFileLoader("draw_patterns", str(path))
    spec = importlib.util.spec_from_loader("draw_patterns", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_figures_are_what_the_script_draws_now() -> None:
    """SPARSE-1.1 … SPARSE-5.2 figures: every committed spec/figures/sparse_*.png shows what
    ``sparse_mask`` gives now (decoded pixels compared), and the spec embeds each of them."""
    drawing = _draw_patterns_module()
    text = (ROOT / "spec" / "sparse.md").read_text(encoding="utf-8")
    embedded = set(re.findall(r"\]\(figures/(sparse_[a-z_]+\.png)\)", text))
    drawn = drawing.render_all()
    assert embedded == set(drawn)
    for name, data in drawn.items():
        committed = ROOT / "spec" / "figures" / name
        assert committed.exists(), f"{name} missing: run scripts/draw-patterns"
        assert drawing.picture(committed.read_bytes()) == drawing.picture(data), (
            f"{name} is stale: run scripts/draw-patterns"
        )


def test_figure_pixels_are_the_mask() -> None:
    """SPARSE-2.1: the drawing itself is faithful — each cell's centre pixel is 'may attend'
    exactly where the mask is True."""
    drawing = _draw_patterns_module()
    mask = np.asarray(sliding_window_mask(5, 7, left=1, right=2, xp=np_xp))
    rows = drawing.pixels(mask.tolist(), None)
    centre = drawing.CELL // 2
    cells = np.array(
        [
            [rows[i * drawing.CELL + centre][j * drawing.CELL + centre] for j in range(7)]
            for i in range(5)
        ]
    )
    assert np.array_equal(cells == 1, mask)
