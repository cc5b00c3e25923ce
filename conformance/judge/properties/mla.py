"""MLA-1 … MLA-5: multi-head latent attention in its absorbed form, called
``fn(q (..., Hq, Lq, r + d_r), kv (..., 1, Lk, r + d_r), scale=, is_causal=)``, or over paged
latent pages as FlashMLA's ``flash_mla_with_kvcache``: ``fn(q (B, Lq, Hq, r + d_r), k_cache
(N, P, 1, r + d_r), block_table=, cache_seqlens=, head_dim_v=r, softmax_scale=, causal=)`` ->
``out (B, Lq, Hq, r)``, or ``(out, lse (B, Hq, Lq))`` for a kernel declared ``returns_lse``.

The kernel's latent width r and rotary part d_r are declared (DeepSeek V3: 512 and 64, so
E = 576 and Ev = 512); the suite draws decode and short prefill rows against caches of up to
a few thousand latent positions, many query heads on the one latent head, and the model's
scale (192^-1/2 times a YaRN factor), never the 576^-1/2 a kernel's default would give.
The output is compared with the definition (multi-query attention whose values are kv's
first r channels) within TOL-2 (MLA-3).

A paged call (MLA-4) has a few sequences of different cached lengths (partial and whole last
pages), every sequence the same decode or short prefill rows (FlashMLA's ``seq_len_q``), over
pages drawn out of order with one shared by two sequences, block-table rows one entry wider
than the longest sequence needs (the entries past a sequence's pages point to a page it must
not read), and the model's scale, or none for a kernel declared with a default (MLA-5).
In some calls the first sequence caches fewer positions than it has queries (its first
rows, the batch's first, see no key in a causal call: PAGED-3), and every slot no sequence
reads holds NaN (PAGED-5, which MLA-4 applies past each length).
Each sequence's rows are compared with TOL-2 of its own multi-query problem, bottom-right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.tolerance import error_and_lse_bound, error_bound
from ...claims.declaration import KernelDeclaration
from ...draw import sizes
from ...draw.strategies import draw_dtype, random_values
from ..assertions import assert_elements_within, unlike_array
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import family_only, register
from ._helpers import call_family_kernel

REALISTIC_HEADS = (16,)  # DeepSeek V3's 128 heads over 8 devices (E = 576 keeps it costly)
REALISTIC_QUERIES = (1, 2, 4)  # decode, and speculative decoding's few rows
REALISTIC_KEYS = (1, 64, 65, 1025)  # FlashMLA's pages are 64; past one block of 1024
# the un-absorbed heads' scale (128 + 64)^-1/2, and times a YaRN factor mscale^2
SCALES = (192**-0.5, 192**-0.5 * 1.3**2)


_mla_family = family_only("mla", "the kernel is not declared multi-head latent attention (--mla)")


def _mla_only(declaration: KernelDeclaration) -> str | None:
    """The dense form only: a paged one (MLA-4) has mla-paged-matches-reference."""
    if declaration.mla is not None and declaration.mla.paged:
        return "the MLA kernel reads paged latent pages (--mla-paged): its call is MLA-4's"
    return _mla_family(declaration)


@dataclass(frozen=True)
class MlaCall:
    """One call, float64 values exact in ``dtype``: ``q (B, Hq, Lq, E)``, ``kv (B, 1, Lk,
    E)``."""

    q: np.ndarray
    kv: np.ndarray
    scale: float
    is_causal: bool
    dtype: str

    def describe(self) -> str:
        return (
            f"q {self.q.shape} and kv {self.kv.shape} in {self.dtype}, scale {self.scale:.6g}, "
            f"{'causal' if self.is_causal else 'not causal'}"
        )


@register("mla-matches-reference", "MLA-3", applies=_mla_only)
def mla_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Decode and short prefill rows of many query heads against one latent head, with the
    model's explicit scale: the output (kv's first r channels as values) within TOL-2 of
    the definition.  A kernel that applies its own 1/sqrt(E), reads the values from other
    channels or aligns causal rows top-left is outside it."""
    claim = kernel.declaration.mla
    assert claim is not None  # the property applies only to an --mla declaration
    dtype = draw_dtype(data, kernel)
    head_dim = claim.value_dim + claim.rope_dim
    n_heads, n_queries, n_keys = sizes.draw_per_stratum(
        data,
        {
            "Hq": (REALISTIC_HEADS, (1, 3)),
            "Lq": (REALISTIC_QUERIES, (1, 3)),
            "Lk": (REALISTIC_KEYS, (1, 9)),
        },
    )
    batch = data.draw(st.integers(1, 2), label="B")
    is_causal = kernel.declaration.causal and data.draw(st.booleans(), label="is_causal")
    scale = data.draw(st.sampled_from(SCALES), label="scale")
    # E = r + d_r is in the hundreds: values from a seeded generator, not a Hypothesis
    # byte per element (which would cost thousands of draws per example)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))
    q = random_values(kernel, rng, (batch, n_heads, n_queries, head_dim), dtype)
    kv = random_values(kernel, rng, (batch, 1, n_keys, head_dim), dtype)
    call = MlaCall(q, kv, scale, is_causal, dtype)
    backend = kernel.backend
    keywords: dict[str, Any] = {"scale": scale}
    if kernel.declaration.causal:
        keywords["is_causal"] = is_causal
    arrays = (backend.asarray(q, dtype), backend.asarray(kv, dtype))
    out = call_family_kernel(kernel, arrays, keywords, "MLA", call.describe())
    shape = (batch, n_heads, n_queries, claim.value_dim)
    shown = unlike_array(backend, out, shape, dtype)
    if shown:
        raise PropertyFailure(
            f"the MLA kernel returned {shown}, but should return one array of shape {shape} "
            f"(B, Hq, Lq, r) in {dtype} (MLA-1) [call: {call.describe()}]"
        )
    actual = kernel.numpy(out)
    bound = error_bound(
        q,
        kv,
        kv[..., : claim.value_dim],
        dtype=dtype,
        is_causal=is_causal,
        causal_alignment=kernel.declaration.causal_alignment,
        scale=scale,
        weights=False,
    )
    expected, tolerance = np.asarray(bound.out), np.asarray(bound.out_tolerance)
    note = (
        f"MLA-1, MLA-2, MLA-3: values kv[..., :{claim.value_dim}], the scale given, "
        f"not 1/sqrt({head_dim})"
    )
    assert_elements_within(
        "out", actual, expected, tolerance, lambda at: note, f" [call: {call.describe()}]"
    )


# MLA-4, MLA-5: the paged form, FlashMLA's call

REALISTIC_PAGE_SIZES = (64,)  # FlashMLA's page_block_size
SMALL_PAGE_SIZES = (1, 2, 3, 16)
# one page and one position, a whole page, one past it; DeepSeek's sizes keep E = 576
REALISTIC_CACHE_LENGTHS = (1, 63, 64, 65, 129)
# decode, speculative decoding's few rows and a short prefill chunk
REALISTIC_PAGED_QUERIES = (*REALISTIC_QUERIES, 16)


def _paged_mla_only(declaration: KernelDeclaration) -> str | None:
    mla = declaration.mla
    if mla is None or not mla.paged:
        return "the kernel is not declared MLA over paged latent pages (--mla R --mla-paged)"
    return None


@dataclass(frozen=True)
class PagedMlaCall:
    """One call, float64 values exact in ``dtype``: ``q (B, Lq, Hq, E)``, pages ``(N, P, 1,
    E)``, ``table (B, M)`` int32, each sequence's cached length; ``scale`` None: not passed
    (MLA-5's default)."""

    q: np.ndarray
    pages: np.ndarray
    table: np.ndarray
    lengths: tuple[int, ...]
    scale: float | None
    is_causal: bool
    dtype: str

    def latent(self, b: int) -> np.ndarray:
        """Sequence b's latent vectors ``(u_b, E)`` in logical order (PAGED-1)."""
        positions = np.arange(self.lengths[b])
        page = self.pages.shape[1]
        return np.asarray(self.pages[self.table[b, positions // page], positions % page, 0])

    def describe(self) -> str:
        scale = "no softmax_scale" if self.scale is None else f"softmax_scale {self.scale:.6g}"
        unread = int(np.isnan(self.pages).any(axis=(2, 3)).sum())
        nan = f", NaN in the {unread} slots no sequence reads" if unread else ""
        return (
            f"q {self.q.shape} (B, Lq, Hq, E) and pages {self.pages.shape} (N, P, 1, E) in "
            f"{self.dtype}, cache_seqlens {list(self.lengths)}, block_table "
            f"{self.table.tolist()}, {scale}, {'causal' if self.is_causal else 'not causal'}"
            f"{nan}"
        )


def _draw_paged_call(data: st.DataObject, kernel: KernelUnderTest) -> PagedMlaCall:
    claim = kernel.declaration.mla
    assert claim is not None  # the property applies only to an --mla --mla-paged declaration
    dtype = draw_dtype(data, kernel)
    realistic = sizes.realistic()
    n_heads, n_queries = sizes.draw_per_stratum(
        data, {"Hq": (REALISTIC_HEADS, (1, 3)), "Lq": (REALISTIC_PAGED_QUERIES, (1, 3))}
    )
    page = claim.page_size or data.draw(
        st.sampled_from(REALISTIC_PAGE_SIZES if realistic else SMALL_PAGE_SIZES), label="P"
    )
    lengths = [
        # a sequence's cache holds its own queries' positions (FlashMLA appends them first)
        max(
            n_queries,
            data.draw(
                st.sampled_from(REALISTIC_CACHE_LENGTHS) if realistic else st.integers(1, 9),
                label=f"cache_seqlens {b}",
            ),
        )
        for b in range(data.draw(st.integers(1, 3), label="B"))
    ]
    if n_queries > 1 and data.draw(st.booleans(), label="more queries than cached keys"):
        # the batch's first sequence: its first rows, the batch's first, see no key in a
        # causal call (PAGED-3: 0, and a log-sum-exp of -inf)
        lengths[0] = data.draw(st.integers(1, n_queries - 1), label="cache_seqlens 0, short")
    is_causal = kernel.declaration.causal and data.draw(st.booleans(), label="causal")
    default = claim.default_scale and data.draw(st.booleans(), label="no softmax_scale")
    scale = None if default else data.draw(st.sampled_from(SCALES), label="softmax_scale")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))
    pages_of = [-(-n // page) for n in lengths]
    n_pages = sum(pages_of) + 1  # one page no sequence reads
    order = rng.permutation(n_pages)
    # one entry past the longest sequence's pages: entries a sequence must not read
    table = np.full((len(lengths), max(pages_of) + 1), order[-1], np.int32)
    first = 0
    for b, count in enumerate(pages_of):
        table[b, :count] = order[first : first + count]
        first += count
    if len(lengths) > 1:
        table[1, 0] = table[0, 0]  # a page shared by two sequences (a common prefix)
    head_dim = claim.value_dim + claim.rope_dim
    q = random_values(kernel, rng, (len(lengths), n_queries, n_heads, head_dim), dtype)
    pages = random_values(kernel, rng, (n_pages, page, 1, head_dim), dtype)
    if data.draw(st.booleans(), label="NaN in the slots no sequence reads"):
        pages = _nan_where_unread(pages, table, lengths)
    return PagedMlaCall(q, pages, table, tuple(lengths), scale, is_causal, dtype)


def _nan_where_unread(pages: np.ndarray, table: np.ndarray, lengths: list[int]) -> np.ndarray:
    """``pages`` with NaN in every slot no sequence reads: past a sequence's length on its
    last page, the pages only the entries past a sequence's pages name, and the pages no
    table row reaches (MLA-4, PAGED-5: that memory changes no output)."""
    read = np.zeros(pages.shape[:2], bool)
    for row, length in zip(table, lengths, strict=True):
        positions = np.arange(length)
        read[row[positions // pages.shape[1]], positions % pages.shape[1]] = True
    return np.where(read[:, :, None, None], pages, np.nan)


def _run_paged(kernel: KernelUnderTest, call: PagedMlaCall) -> tuple[np.ndarray, np.ndarray | None]:
    """The kernel's output (and log-sum-exp) as float64, after MLA-4's shape checks."""
    claim = kernel.declaration.mla
    assert claim is not None  # the property applies only to an --mla --mla-paged declaration
    backend = kernel.backend
    keywords: dict[str, Any] = {
        "block_table": backend.asarray(call.table),
        "cache_seqlens": backend.asarray(np.asarray(call.lengths, np.int32)),
        "head_dim_v": claim.value_dim,
    }
    if call.scale is not None:
        keywords["softmax_scale"] = call.scale
    if kernel.declaration.causal:
        keywords["causal"] = call.is_causal
    arrays = (backend.asarray(call.q, call.dtype), backend.asarray(call.pages, call.dtype))
    result = call_family_kernel(kernel, arrays, keywords, "paged MLA", call.describe())
    batch, n_queries, n_heads, _ = call.q.shape
    shape = (batch, n_queries, n_heads, claim.value_dim)
    lse_shape = (batch, n_heads, n_queries)
    lse_dtype = "float64" if call.dtype == "float64" else "float32"  # LSE-3
    returns_lse = kernel.declaration.returns_lse
    parts = tuple(result) if returns_lse and isinstance(result, (tuple, list)) else (result,)
    shown = unlike_array(backend, parts[0], shape, call.dtype)
    if returns_lse and not shown:
        shown = "a tuple of " + str(len(parts)) if len(parts) != 2 else None
        shown = shown or unlike_array(backend, parts[1], lse_shape, lse_dtype)
    if shown:
        wanted = f"one array of shape {shape} (B, Lq, Hq, r) in {call.dtype}"
        if returns_lse:
            wanted = (
                f"(out, lse): out {shape} (B, Lq, Hq, r) in {call.dtype}, lse {lse_shape} "
                f"(B, Hq, Lq) in {lse_dtype}"
            )
        raise PropertyFailure(
            f"the paged MLA kernel returned {shown}, but should return {wanted} (MLA-4) "
            f"[call: {call.describe()}]"
        )
    lse = kernel.numpy(parts[1]) if returns_lse else None
    return kernel.numpy(parts[0]), lse


@register("mla-paged-matches-reference", "MLA-4", applies=_paged_mla_only)
def mla_paged_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Decode and short prefill rows of a few sequences over shuffled latent pages: each
    sequence's rows within TOL-2 of its own problem, values the first r channels of its
    latent vectors, with the given scale or, where none is passed, 1/sqrt(r + d_r) (MLA-5);
    its log-sum-exp within TOL-5 where returned; rows that see no key give 0 and -inf, and
    NaN in the slots no sequence reads reaches no output.  A kernel that reads the values
    from the rotary end of the page, takes a partial last page from the end of the
    block-table row, defaults to 1/sqrt(r), multiplies whole pages' values by zero weights
    or clamps the causal offset of a short cache at 0 is outside it."""
    claim = kernel.declaration.mla
    assert claim is not None  # the property applies only to an --mla --mla-paged declaration
    call = _draw_paged_call(data, kernel)
    out, lse = _run_paged(kernel, call)
    head_dim = claim.value_dim + claim.rope_dim
    scale = head_dim**-0.5 if call.scale is None else call.scale
    clauses = "MLA-4, MLA-3" + (", MLA-5: no scale passed" if call.scale is None else "")
    for b in range(len(call.lengths)):
        latent = call.latent(b)[None]  # (1, u_b, E): one latent head
        bound, lse_bound = error_and_lse_bound(
            np.swapaxes(call.q[b], 0, 1),
            latent,
            latent[..., : claim.value_dim],
            dtype=call.dtype,
            is_causal=call.is_causal,
            causal_alignment="bottom_right",
            scale=scale,
            weights=False,
        )
        tail = f" (sequence {b}, {call.lengths[b]} cached positions) [call: {call.describe()}]"
        assert_elements_within(
            f"out[{b}]",
            out[b],
            np.swapaxes(np.asarray(bound.out), 0, 1),
            np.swapaxes(np.asarray(bound.out_tolerance), 0, 1),
            lambda at: f"{clauses}; values the first {claim.value_dim} channels",
            tail,
        )
        if lse is not None:
            assert_elements_within(
                f"lse[{b}]",
                lse[b],
                np.asarray(lse_bound.lse),
                np.asarray(lse_bound.lse_tolerance),
                lambda at: f"{clauses}, LSE-1, TOL-5",
                tail,
            )
