"""Parameters of the sparse patterns: validation, BigBird's random draw, library windows.

``build_pattern`` turns a pattern name and its keyword parameters into the index set of
``definition.py`` (SPARSE-1.4: bad parameters are errors that name the argument);
``draw_random_blocks`` is SPARSE-5.3's generator; ``library_window`` is SPARSE-2.2.
"""

from __future__ import annotations

import inspect
import math
import operator
import random
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypedDict

import array_api_compat

from .._checks import check_choice, check_flag, check_size, namespace_of
from .._keywords import Creation, shows_keywords
from ..masks import CAUSAL_ALIGNMENTS, causal_offset
from .definition import (
    PATTERN_NAMES,
    BigBird,
    BlockSparse,
    Fixed,
    Longformer,
    SlidingWindow,
    SparsePattern,
    Strided,
    query_blocks,
)


def _window_bound(name: str, value: Any, call: str) -> int | None:
    return None if value is None else check_size(name, value, call)


def _int_tuple(name: str, values: Any, call: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}={values!r}, but should be a sequence of ints >= 0 [{call}]")
    return tuple(sorted({check_size(f"{name}[{n}]", v, call) for n, v in enumerate(values)}))


def _block_sizes(value: Any, call: str) -> tuple[int, int]:
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if len(value) != 2:
            raise ValueError(
                f"block_size={value!r}, but should be an int >= 1 or a pair "
                f"(query block, key block) [{call}]"
            )
        return check_size("block_size[0]", value[0], call, minimum=1), check_size(
            "block_size[1]", value[1], call, minimum=1
        )
    size = check_size("block_size", value, call, minimum=1)
    return size, size


def _blocks(length: int, size: int) -> int:
    return -(-length // size)


def _window(call: str, left: Any, right: Any, dilation: Any) -> dict[str, Any]:
    """The fields of a sliding window (SPARSE-2.1), checked."""
    return {
        "left": _window_bound("left", left, call),
        "right": _window_bound("right", right, call),
        "dilation": check_size("dilation", dilation, call, minimum=1),
    }


def _sliding_window(
    base: dict[str, Any], call: str, *, left: Any, right: Any, dilation: Any = 1
) -> SlidingWindow:
    return SlidingWindow(**base, **_window(call, left, right, dilation))


def _strided(base: dict[str, Any], call: str, *, stride: Any) -> Strided:
    return Strided(**base, stride=check_size("stride", stride, call, minimum=1))


def _fixed(base: dict[str, Any], call: str, *, stride: Any, summary: Any) -> Fixed:
    stride = check_size("stride", stride, call, minimum=1)
    summary = check_size("summary", summary, call)
    if summary > stride:
        raise ValueError(f"summary={summary}, but should be at most stride={stride} [{call}]")
    return Fixed(**base, stride=stride, summary=summary)


def _block_sparse(
    base: dict[str, Any],
    call: str,
    *,
    layout: Any,
    block_size: Any,
    xp: ModuleType,
    device: Any,
) -> BlockSparse:
    block_q, block_k = _block_sizes(block_size, call)
    if array_api_compat.is_array_api_obj(layout):
        if namespace_of(call, layout=layout) is not xp:
            raise TypeError(
                f"layout is a {type(layout).__module__}.{type(layout).__name__}, but should "
                f"be a nested sequence or an array of the library computed with [{call}]"
            )
        if layout.dtype != xp.bool:
            raise TypeError(f"layout.dtype={layout.dtype}, but should be bool [{call}]")
        layout = xp.asarray(layout, device=device)
    else:
        try:
            layout = xp.asarray(layout, dtype=xp.bool, device=device)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"layout could not be read as a boolean array ({exc}) [{call}]"
            ) from None
    expected = (_blocks(base["n_queries"], block_q), _blocks(base["n_keys"], block_k))
    if tuple(layout.shape) != expected:
        raise ValueError(
            f"layout.shape={tuple(layout.shape)}, but should be (ceil(n_queries / "
            f"{block_q}), ceil(n_keys / {block_k})) = {expected} [{call}]"
        )
    return BlockSparse(**base, layout=layout, block_q=block_q, block_k=block_k)


def _longformer(
    base: dict[str, Any],
    call: str,
    *,
    left: Any,
    right: Any,
    global_tokens: Any = (),
    dilation: Any = 1,
) -> Longformer:
    return Longformer(
        **base,
        **_window(call, left, right, dilation),
        global_tokens=_int_tuple("global_tokens", global_tokens, call),
    )


def draw_random_blocks(
    seed: int,
    first_block: int,
    n_query_blocks: int,
    n_key_blocks: int,
    window_blocks: int,
    global_blocks: Sequence[int],
    num_random: int,
) -> tuple[tuple[int, ...], ...]:
    """BigBird's random key blocks exactly as SPARSE-5.3 draws them.

    Only ``Random.random()`` is used: Python guarantees its sequence for an integer seed
    across versions, which ``Random.sample`` and ``randrange`` do not.
    """
    rng = random.Random(seed)
    rows = []
    for query_block in range(first_block, first_block + n_query_blocks):
        drawn: list[int] = []
        if query_block not in global_blocks:
            pool = [
                b
                for b in range(n_key_blocks)
                if abs(query_block - b) > window_blocks and b not in global_blocks
            ]
            for slot in range(min(num_random, len(pool))):
                pick = slot + math.floor(rng.random() * (len(pool) - slot))
                pool[slot], pool[pick] = pool[pick], pool[slot]
            drawn = sorted(pool[: min(num_random, len(pool))])
        rows.append(tuple(drawn + [-1] * (num_random - len(drawn))))
    return tuple(rows)


def _random_blocks_given(
    table: Any,
    first_block: int,
    n_query_blocks: int,
    n_key_blocks: int,
    window_blocks: int,
    global_blocks: Sequence[int],
    call: str,
) -> tuple[tuple[int, ...], ...]:
    shape = tuple(table.shape) if array_api_compat.is_array_api_obj(table) else None
    try:
        rows = [
            tuple(
                int(table[r][s]) if shape is None else int(table[r, s])
                for s in range(len(table[r]) if shape is None else shape[1])
            )
            for r in range(len(table) if shape is None else shape[0])
        ]
    except (TypeError, ValueError, IndexError):
        raise TypeError(f"random_blocks should be a 2-d table of ints [{call}]") from None
    widths = {len(row) for row in rows}
    if len(rows) != n_query_blocks or len(widths) > 1:
        raise ValueError(
            f"random_blocks has {len(rows)} rows of lengths {sorted(widths)}, but should "
            f"have one row of equal length per query block ({n_query_blocks}) [{call}]"
        )
    for r, row in enumerate(rows):
        query_block = first_block + r
        blocks = [b for b in row if b != -1]
        bad = [
            b
            for b in blocks
            if not 0 <= b < n_key_blocks
            or b in global_blocks
            or abs(query_block - b) <= window_blocks
        ]
        if bad or len(set(blocks)) != len(blocks):
            raise ValueError(
                f"random_blocks[{r}]={list(row)}, but should hold distinct key blocks in "
                f"[0, {n_key_blocks}) outside the window and the global blocks, or -1 "
                f"[{call}]"
            )
    return tuple(rows)


def _bigbird(
    base: dict[str, Any],
    call: str,
    *,
    block_size: Any,
    num_random: Any = 0,
    seed: Any = None,
    window_blocks: Any = 1,
    global_blocks: Any = (),
    random_blocks: Any = None,
) -> BigBird:
    size = check_size("block_size", block_size, call, minimum=1)
    window = check_size("window_blocks", window_blocks, call)
    globals_ = _int_tuple("global_blocks", global_blocks, call)
    first, count = query_blocks(base["n_queries"], base["offset"], size)
    n_key_blocks = _blocks(base["n_keys"], size)
    if random_blocks is not None:
        drawn = _random_blocks_given(
            random_blocks, first, count, n_key_blocks, window, globals_, call
        )
    else:
        num_random = check_size("num_random", num_random, call)
        if num_random and (seed is None or isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(
                f"seed={seed!r}, but should be an int when num_random={num_random} > 0 "
                f"(or pass random_blocks=) [{call}]"
            )
        drawn = draw_random_blocks(seed, first, count, n_key_blocks, window, globals_, num_random)
    return BigBird(
        **base,
        block_size=size,
        window_blocks=window,
        global_blocks=globals_,
        first_block=first,
        random_blocks=drawn,
    )


_BUILDERS: dict[str, Callable[..., SparsePattern]] = {
    "sliding_window": _sliding_window,
    "strided": _strided,
    "fixed": _fixed,
    "block_sparse": _block_sparse,
    "longformer": _longformer,
    "bigbird": _bigbird,
}
_CLAUSES = {
    cls.name: cls.clause
    for cls in (SlidingWindow, Strided, Fixed, BlockSparse, Longformer, BigBird)
}


class _Alignment(TypedDict, total=False):
    alignment: str
    causal: bool


class Placement(_Alignment, Creation, total=False):
    """Where a pattern's queries sit among the keys (``alignment``, SPARSE-1.2) and whether
    it is causal (SPARSE-1.3); for a mask, the namespace and device it is made with.  The
    named mask functions take them as ``**placement``, shown by :data:`shows_placement`."""


# The defaults other than None
PLACEMENT_DEFAULTS = Placement(alignment="top_left", causal=False)
shows_placement = shows_keywords(Placement, PLACEMENT_DEFAULTS)


def build_pattern(
    pattern: str, n_queries: int, n_keys: int, params: dict[str, Any], call: str, at: Placement
) -> SparsePattern:
    """Validate a pattern name and its parameters (SPARSE-1.4) and return S(i) placed
    ``at`` (an array ``layout`` of block_sparse made in ``at``'s namespace and device)."""
    placed: Placement = {**PLACEMENT_DEFAULTS, **at}
    alignment, causal = placed["alignment"], placed["causal"]
    check_choice("pattern", pattern, PATTERN_NAMES, call, "SPARSE-1.1")
    clause_call = f"{_CLAUSES[pattern]}, {call}"
    n_queries = check_size("n_queries", n_queries, f"SPARSE-1.1, {call}")
    n_keys = check_size("n_keys", n_keys, f"SPARSE-1.1, {call}")
    check_choice("alignment", alignment, CAUSAL_ALIGNMENTS, call, "SPARSE-1.2")
    check_flag("causal", causal, f"SPARSE-1.3, {call}")
    builder = _BUILDERS[pattern]
    signature = inspect.signature(builder)
    if pattern == "block_sparse":
        params = {**params, "xp": at.get("xp"), "device": at.get("device")}
    try:
        signature.bind({}, "", **params)
    except TypeError:
        names = [
            p.name
            for p in list(signature.parameters.values())[2:]
            if p.name not in ("xp", "device")
        ]
        required = [
            p.name
            for p in list(signature.parameters.values())[2:]
            if p.default is inspect.Parameter.empty and p.name not in ("xp", "device")
        ]
        given = sorted(set(params) - {"xp", "device"})
        raise TypeError(
            f"pattern={pattern!r} takes parameters {', '.join(names)} (required: "
            f"{', '.join(required) or 'none'}), but got {', '.join(given) or 'none'} "
            f"[{_CLAUSES[pattern]}, {call}]"
        ) from None
    base = {
        "n_queries": n_queries,
        "n_keys": n_keys,
        "causal": causal,
        "offset": causal_offset(n_queries, n_keys, alignment),
    }
    return builder(base, clause_call, **params)


# --- library window conventions -------------------------------------------------------------

LIBRARY_WINDOWS = (
    "flash_attn",
    "jax",
    "xformers_local",
    "xformers_causal_local",
    "xformers_components",
)


def _pair(convention: str, window: Any, call: str) -> tuple[int, int]:
    """The two ints of a (left, right) window argument, negative ones included."""
    if isinstance(window, Sequence) and not isinstance(window, (str, bytes)) and len(window) == 2:
        try:
            return operator.index(window[0]), operator.index(window[1])
        except TypeError:
            pass
    raise TypeError(
        f"window={window!r}, but {convention} takes a pair of ints (left, right) [{call}]"
    )


def library_window(convention: str, window: Any, *, causal: bool = False) -> dict[str, Any]:
    """``sparse_mask`` keyword arguments equal to a library's sliding-window argument.

    ``convention`` (SPARSE-2.2):

    - ``"flash_attn"``: FlashAttention ``window_size=(l, r)``, bottom-right, -1 = unbounded
      (``causal=True`` there forces r = 0, which is the causal restriction here);
    - ``"jax"``: ``jax.nn.dot_product_attention(local_window_size=(l, r) or w)``, top-left;
    - ``"xformers_local"``: ``LocalAttentionFromBottomRightMask(window_left=l, window_right=r)``;
    - ``"xformers_causal_local"``: ``LowerTriangularFromBottomRightLocalAttentionMask(w)``,
      the last w keys up to the query's own position (left = w - 1, right = 0);
    - ``"xformers_components"``: the legacy ``xformers.components.attention.LocalAttention(
      window_size=w, causal=...)``, top-left: w (odd) keys centred on the query, or with
      ``causal=True`` the w keys before it and itself.
    """
    call = f"library_window({convention!r}, window)"
    check_choice("convention", convention, LIBRARY_WINDOWS, call, "SPARSE-2.2")
    check_flag("causal", causal, f"SPARSE-2.2, {call}")
    call = f"SPARSE-2.2, {call}"
    alignment, is_causal = "top_left", causal
    left: int | None
    right: int | None
    if convention == "flash_attn":
        left_or_negative, right_or_negative = _pair(convention, window, call)
        left = None if left_or_negative < 0 else left_or_negative
        right = None if right_or_negative < 0 else right_or_negative
        alignment = "bottom_right"
    elif convention == "jax":
        if isinstance(window, Sequence) and not isinstance(window, (str, bytes)):
            left, right = _pair(convention, window, call)
        else:
            left = right = check_size("window", window, call)
        left, right = check_size("window[0]", left, call), check_size("window[1]", right, call)
    elif convention == "xformers_local":
        left, right = _pair(convention, window, call)
        left, right = check_size("window_left", left, call), check_size("window_right", right, call)
        alignment = "bottom_right"
    elif convention == "xformers_causal_local":
        left, right = check_size("window_size", window, call, minimum=1) - 1, 0
        alignment, is_causal = "bottom_right", True
    else:
        size = check_size("window_size", window, call, minimum=1)
        if causal:
            left, right = size, 0
        elif size % 2 == 1:
            left = right = size // 2
        else:
            raise ValueError(
                f"window_size={size}, but should be odd without causal=True (xformers "
                f"asserts it) [{call}]"
            )
    return {
        "pattern": "sliding_window",
        "left": left,
        "right": right,
        "alignment": alignment,
        "causal": is_causal,
    }
