"""Sparse pattern parameters for the sparse reference tests (tests/reference/sparse/), drawn
or written by hand: :func:`pattern_params` draws a pattern's parameters (Hypothesis, so a
failure shrinks to small blocks, narrow windows, no global or random blocks);
:data:`FIXED_PARAMS` holds one hand-written set per pattern, with its alignment and
causality, for an ``Lq = 11, Lk = 14`` problem (a block-sparse layout of 4 x 4 blocks of
3 x 4): the one case a backend that compiles per shape (JAX) runs, and an explicit example.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

FIXED_LENGTHS = (11, 14)  # (Lq, Lk) of FIXED_PARAMS

BOUND = st.one_of(st.integers(0, 6), st.none())  # a window side; None: unbounded


@st.composite
def pattern_params(draw: st.DrawFn, pattern: str, n_queries: int, n_keys: int) -> dict[str, Any]:
    """Parameters of ``pattern``, often with ragged blocks; they shrink to small blocks,
    narrow windows and no global or random blocks."""
    if pattern == "sliding_window":
        return {
            "left": draw(BOUND),
            "right": draw(BOUND),
            "dilation": draw(st.sampled_from((1, 2, 3))),
        }
    if pattern == "strided":
        return {"stride": draw(st.integers(1, 6))}
    if pattern == "fixed":
        stride = draw(st.integers(1, 6))
        return {"stride": stride, "summary": draw(st.integers(0, stride))}
    if pattern == "block_sparse":
        block = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
        shape = (-(-n_queries // block[0]), -(-n_keys // block[1]))
        return {"block_size": block, "layout": draw(arrays(np.bool_, shape)).tolist()}
    if pattern == "longformer":
        tokens = st.lists(st.integers(0, max(n_queries, n_keys) + 1), max_size=3, unique=True)
        return {
            "left": draw(BOUND),
            "right": draw(BOUND),
            "dilation": draw(st.sampled_from((1, 2))),
            "global_tokens": draw(tokens),
        }
    size = draw(st.integers(1, 5))
    blocks = -(-max(n_queries, n_keys) // size) + 1
    return {
        "block_size": size,
        "window_blocks": draw(st.integers(0, 2)),
        "global_blocks": draw(st.lists(st.integers(0, blocks - 1), max_size=2, unique=True)),
        "num_random": draw(st.integers(0, 3)),
        "seed": draw(st.integers(0, 2**31)),
    }


# The window's and fixed's parameters give each kernel call the candidate widths of another
# pattern's (test_kernels' JAX case: 11 query rows of 6 candidates, as strided; of 15, as
# bigbird), so JAX compiles their gathered attention once for both: 502 -> 428 compilations
# of test_kernels' JAX tests.  Each still binds: the window's left bound (inclusive, 10 =
# 5 dilated steps) leaves out the first keys of the last rows, fixed's last block is ragged
# (2 of 6 keys) and its summary columns are half of each block.
FIXED_PARAMS: dict[str, tuple[dict[str, Any], str, bool]] = {
    "sliding_window": ({"left": 10, "right": None, "dilation": 2}, "bottom_right", True),
    "strided": ({"stride": 3}, "top_left", True),
    "fixed": ({"stride": 6, "summary": 3}, "bottom_right", False),
    "block_sparse": (
        {
            "block_size": (3, 4),
            "layout": [
                [True, False, True, False],
                [False, True, True, False],
                [True, False, False, True],
                [False, False, True, True],
            ],
        },
        "bottom_right",
        True,
    ),
    "longformer": ({"left": 2, "right": 1, "global_tokens": [0]}, "top_left", False),
    "bigbird": (
        {"block_size": 3, "window_blocks": 1, "global_blocks": [0], "num_random": 1, "seed": 7},
        "bottom_right",
        False,
    ),
}
