"""Anchor problems: fixed shapes from upstream kernels' test grids, run in every profile.

FlashAttention, aotriton and PyTorch test their kernels on fixed grids of lengths, head
dims and head counts.  attnspec covers what those grids cover — each anchor below is a
point of one of them, or a shape kernels special-case — and then searches past them with
the random draws of the realistic strata (``sizes.draw_realistic_dims``).  Every profile
runs each anchor once per property, after the small problems and before the random
realistic draws, in the most precise dtype the kernel is checked in (the tightest TOL-2
bound, where a small wrong share of the output shows), or in each dtype checked where the
anchor's values depend on the dtype.  Everything but the sizes, the dtype and the options
an anchor forces (values, other options) is drawn as usual, starting from Hypothesis's
simplest choice.

Sources (read 2026-11):
  FA   Dao-AILab/flash-attention tests/test_flash_attn.py: test_flash_attn_output and
       test_flash_attn_varlen_output run seqlen pairs (113, 203), (128, 217), (113, 211),
       (108, 256), (256, 512), (512, 256), (1024, 1024), (1023, 1024), (1024, 1023),
       (2048, 2048) with d in 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256,
       causal or not, 9 query heads on 9, 3 or 1 key/value heads; test_flash_attn_kvcache
       runs (1, 128), (1, 339), (3, 1024), (64, 800), (3, 799), (64, 2048), (16, 20000),
       (1, 128 * 1024), ... against a cache.
  FA 1.x  the same file in FlashAttention 1 (commit 008951f): test_flash_attn_unpadded
       runs square lengths 97, 128, 200, 256, 257, 384, 512, 768, 1024, 1025, 2048, causal
       or not, d in 16, 32, 40, 64, 80, 128.
  FA3  hopper/tests/test_flash_attn.py (and tests/cute): adds (239, 1), (799, 3),
       (4096, 4096), (4224, 4224), batch 9 x 6 heads (2 or 1 key/value heads).
  AOT  ROCm/aotriton test/test_backward.py: "PyTorch set" head dims 8, 16, 21, 32, 64, 72,
       96, 128, 160, 192, 203, 256, lengths 4 ... 2048 with 143 and 587, causal only when
       Lq = Lk; sm_scale 0.0 and 1.2; test_op_bwd_with_matrix_bias adds a matrix bias
       with BATCH 1 or 4, N_HEADS 1 or 4, head dims 16 ... 256.
  Llama 3  Dubey et al., "The Llama 3 Herd of Models" (2024), Table 3, and the
       meta-llama/Meta-Llama-3-70B config.json: the 70B model's 64 query heads share 8
       key/value heads (groups of 8; the 405B model's 128 share 8), head dim 128.
  FA3 pack_gqa  flash_attn_interface's ``pack_gqa`` packs the query heads of a group into
       the rows of one tile, a path taken for the group's size.
What no fixed grid above has, an anchor adds from the shapes kernels special-case: more
query rows than an int16 index numbers (2**15), and a padded query row of a padded batch
whose every key carries the dtype's most negative finite value (an HF-style additive
mask), in every dtype checked; and a model's GQA heads, several key/value heads each shared
by a group of 8, where a mapping h mod Hkv departs from SDPA-6.1's floor(h / G) on most heads
(the upstream grids' groups of 3 on 1 or 2 key/value heads, and the random draws' small
groups, reach a large group with several key/value heads only by chance).

The paged-batch properties have anchors of their own (``PAGED_ANCHORS``, run in their
place): paged pools past 2**15 positions at page sizes 1, 16, 64 and 256, and a mixed
batch with a prefill of a thousand queries.  The KV-cache properties run
``KV_CACHE_ANCHORS`` after the dense ones, each where the kernel takes the cache options
it passes: StreamingLLM's sink tokens beside a window that has moved past them, whatever
the random draws reach.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .sizes import LENGTHS, Dims, SizeLimits, problem_cost

DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Anchor:
    """One fixed problem shape: ``n_q_heads`` query heads on ``n_kv_heads`` key/value
    heads when the kernel claims GQA (else ``n_q_heads`` of each), ``batch`` elements,
    and the options it forces (stratum options: see ``strategies.draw_problem``)."""

    name: str
    source: str
    n_queries: int
    n_keys: int
    head_dim: int
    value_dim: int
    n_q_heads: int
    n_kv_heads: int
    batch: int = 1
    forced: tuple[tuple[str, Any], ...] = ()
    each_dtype: bool = False  # run once in every dtype the kernel is checked in

    # its keywords are sizes.draw_realistic_dims's, which passes them on here
    def dims(
        self,
        batch_ndim: int | None,
        limits: SizeLimits,
        cap: int,
        *,
        gqa: bool,
        weights: bool = False,
        family: str = "dense",
        min_kv_heads: int = 1,
        min_groups: int = 1,
    ) -> Dims:
        """The anchor's sizes for a kernel with ``batch_ndim`` batch dims (None counts as
        1), cut to the user's limits: lengths to --max-len, head dims to --max-head-dim,
        then batch, groups and key/value heads until batch x heads fits
        --max-batch-heads (a cap is a boundary the user cares about, so the anchor keeps
        as much of its shape as the caps allow).  Then, where the problem would cost more
        than ``cap`` (``sizes.problem_cost``; weights observed through V = I cost
        Lk x Lk values per key/value head), Lk is cut to the longest of sizes.LENGTHS
        that fits."""
        batch_ndim = 1 if batch_ndim is None else batch_ndim  # realistic inputs: (B, H, L, E)
        kv_heads, groups = self.n_kv_heads, self.n_q_heads // self.n_kv_heads
        if not gqa:
            kv_heads, groups = self.n_q_heads, 1
        kv_heads = max(kv_heads, min_kv_heads)
        groups = max(groups, min_groups) if gqa else 1
        batch = self.batch
        if batch_ndim == 0:  # no batch dims: the batch elements become more heads
            kv_heads, batch = kv_heads * batch, 1
        room = limits.max_batch_heads
        batch = max(1, min(batch, room // (kv_heads * groups)))
        groups = max(1, min(groups, room // kv_heads))
        kv_heads = max(1, min(kv_heads, room // groups))
        dims = Dims(
            batch=(batch, *(1,) * (batch_ndim - 1)) if batch_ndim else (),
            n_kv_heads=kv_heads,
            groups=groups,
            n_queries=min(self.n_queries, limits.max_len),
            n_keys=min(self.n_keys, limits.max_len),
            head_dim=min(self.head_dim, limits.max_head_dim),
            value_dim=min(self.value_dim, limits.max_head_dim),
        )
        shorter = [n for n in LENGTHS if n < dims.n_keys]
        while shorter and problem_cost(dims, weights=weights, family=family) > cap:
            dims = replace(dims, n_keys=shorter.pop())
        return dims


ANCHORS: tuple[Anchor, ...] = (
    # the first pair of FA's grids at its first head dim that no vector width divides;
    # FA's multi-query heads (9 on 1) cut to 3 on 1 for the cost
    Anchor(
        "FlashAttention 113 x 203, head dim 59, 3 query heads on 1",
        "FA",
        113,
        203,
        59,
        59,
        n_q_heads=3,
        n_kv_heads=1,
    ),
    # causal, one row past two blocks of 128 (FA 1.x's test_flash_attn_unpadded lengths
    # 97 ... 257 ... 1025, causal or not, d = 16, 32, 40, 64, 80, 128)
    Anchor(
        "FlashAttention 257 x 257 causal, head dim 80",
        "FA 1.x",
        257,
        257,
        80,
        80,
        n_q_heads=1,
        n_kv_heads=1,
        forced=(("causal", True),),
    ),
    # decode against a long cache: cut to --max-len (4096 by default), past 2048 keys
    Anchor(
        "FlashAttention decode 1 x 131072 (cut to --max-len), head dim 128, MQA 6 on 1",
        "FA kvcache",
        1,
        128 * 1024,
        128,
        128,
        n_q_heads=6,
        n_kv_heads=1,
    ),
    # many programs: 9 x 6 x 799 = 43146 query rows (> 2**15) on 3 keys, at aotriton's
    # smallest odd head dim: cheap
    Anchor(
        "FlashAttention 3 799 x 3, batch 9 x 6 heads (43146 rows > 2**15), head dim 21",
        "FA3; head dim from AOT",
        799,
        3,
        21,
        21,
        n_q_heads=6,
        n_kv_heads=2,
        batch=9,
    ),
    # a padded batch as HF builds it: per-element key padding as an additive bias of
    # finfo(dtype).min, one batch element padded entirely (its query rows see only
    # padded keys); the shape of aotriton's test_op_bwd_with_matrix_bias (an additive
    # bias): batch 4, 64 x 64, head dim 64.  Small: it runs once per dtype.
    Anchor(
        "padded batch 4 x 64 x 64, finfo.min bias, an element padded entirely, head dim 64",
        "AOT; HF additive masks",
        64,
        64,
        64,
        64,
        n_q_heads=1,
        n_kv_heads=1,
        batch=4,
        forced=(("bias", "padding"), ("fill", "finfo.min"), ("padded element", True)),
        each_dtype=True,
    ),
    # Llama 3 70B's heads at its head dim: 64 query heads on 8 key/value heads, so that a
    # kernel's path for large groups (FA3's pack_gqa: 8 x 17 = 136 packed rows, one tile
    # of 128 and a ragged one) meets several key/value heads; lengths short for the cost
    Anchor(
        "Llama 3 70B heads: 64 query heads on 8 (groups of 8), 17 x 33, head dim 128",
        "Llama 3; FA3 pack_gqa",
        17,
        33,
        128,
        128,
        n_q_heads=64,
        n_kv_heads=8,
    ),
)


# A paged pool holds more positions than a 16-bit index numbers (2**15), so that the
# sequences, reading its last pages, read slots and (with pages of 1) page indices past it.
PAGED_POOL_SLOTS = 2**15 + 2**10


@dataclass(frozen=True)
class PagedAnchor:
    """One fixed paged batch (PAGED-1) of the paged-batch properties: pages of
    ``page_size`` positions (the kernel's own where it declares one), a pool of at least
    ``pool_slots`` positions of which the sequences read the last pages in a shuffled
    order, block table rows as wide as the pool, and per sequence its query and cached
    lengths (each cut to --max-len; queries to the sequence's keys but for a decode row).
    Head dims of ``head_dim`` and one key/value head (two query heads with GQA) keep the
    pool's arrays to a few MiB."""

    name: str
    source: str
    page_size: int
    n_queries: tuple[int, ...]
    n_keys: tuple[int, ...]
    head_dim: int = 8
    pool_slots: int = PAGED_POOL_SLOTS
    forced: tuple[tuple[str, Any], ...] = ()
    each_dtype: bool = False


def _paged_anchor(page_size: int) -> PagedAnchor:
    pages = -(-PAGED_POOL_SLOTS // page_size)
    return PagedAnchor(
        f"paged pool of {pages} pages of {page_size} (block table rows of {pages}), decode on "
        "4096 keys and a prefill chunk of 16 on 1000, the pool's last pages read",
        "vLLM #1514, #50427; FA page sizes",
        page_size,
        n_queries=(1, 16),
        n_keys=(4096, 1000),
    )


# Serving sizes the random paged draws do not reach: tens of thousands of pages, where a
# page or slot index past 2**15 (2**31 elements for 32-bit offsets: vllm-project/vllm
# #1486, fixed in #1514; FlexAttention's paged offsets, vllm #50427) wraps, at each page
# size upstream tests run (1, 16, 64, 256); and a prefill of a thousand queries beside
# decode rows and a short chunk in one batch, as vLLM's chunked prefill schedules them.
PAGED_ANCHORS: tuple[PagedAnchor, ...] = (
    *(_paged_anchor(page_size) for page_size in (1, 16, 64, 256)),
    PagedAnchor(
        "mixed batch: a prefill of 1000 queries on 1024 keys, decode rows on 1, 257 and "
        "4096 keys, a chunk of 64 on 300, pages of 16",
        "vLLM chunked prefill",
        16,
        n_queries=(1, 1000, 1, 64, 1),
        n_keys=(257, 1024, 4096, 300, 1),
        head_dim=64,
        pool_slots=0,  # only the pages the batch reads
    ),
)


@dataclass(frozen=True)
class CacheAnchor:
    """One fixed KV-cache call (KVCACHE-1) of the KV-cache properties, run where the
    kernel takes every cache option of ``features`` (``--kv-cache-features``): batch
    element b's ``lengths[b]`` cached keys (cache_seqlens) from ``starts[b]``
    (cache_leftpad, where the kernel takes it), ``n_queries`` queries and as many new keys
    when the kernel appends, ``window_size=window`` and ``n_sink_tokens=sink_tokens``;
    ``n_q_heads`` query heads on ``n_kv_heads`` with GQA (else ``n_kv_heads`` of each).
    Lengths are cut to --max-len, head dims to --max-head-dim."""

    name: str
    source: str
    lengths: tuple[int, ...]
    starts: tuple[int, ...]
    n_queries: int
    window: tuple[int | None, int | None]
    sink_tokens: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    features: tuple[str, ...] = ("window", "sink_tokens")
    forced: tuple[tuple[str, Any], ...] = ()
    each_dtype: bool = False


# StreamingLLM (Xiao et al., 2023) keeps 4 sink tokens beside a window of recent keys; what
# it keeps them for is a window that has moved past them, which a drawn cache reaches only
# by chance.  Three elements as flash_attn_with_kvcache's tests run them (left padding,
# FA3's 6 query heads on 2): one whose window has moved past its sink tokens from
# cache_leftpad 0, one whose window still covers them (counted once), and one whose sink
# tokens start at its cache_leftpad of 64 (positions 0 ... 3 are stale memory there).
KV_CACHE_ANCHORS: tuple[CacheAnchor, ...] = (
    CacheAnchor(
        "StreamingLLM decode: 4 sink tokens beside a window of (16, 0), cache_seqlens 300, "
        "17, 129 from cache_leftpad 0, 5, 64, 3 queries, GQA 6 on 2, head dim 64",
        "StreamingLLM; FA kvcache, FA3",
        lengths=(300, 17, 129),
        starts=(0, 5, 64),
        n_queries=3,
        window=(16, 0),
        sink_tokens=4,
        n_q_heads=6,
        n_kv_heads=2,
        head_dim=64,
    ),
)


def anchors_of(draws: str) -> tuple[Any, ...]:
    """The anchors of the properties that draw ``draws`` problems: the paged-batch
    family's own batches, the dense problems of ``ANCHORS`` then ``KV_CACHE_ANCHORS`` for
    the KV-cache family, the dense problems for every other."""
    if draws == "paged-batch":
        return PAGED_ANCHORS
    return (*ANCHORS, *KV_CACHE_ANCHORS) if draws == "kv-cache" else ANCHORS


def anchor_applies(anchor: Any, kv_cache_features: tuple[str, ...]) -> bool:
    """Whether a kernel taking the cache options ``kv_cache_features`` runs ``anchor``'s
    stratum (None: a random one): a KV-cache anchor only where it takes every option the
    anchor passes."""
    return not isinstance(anchor, CacheAnchor) or set(anchor.features) <= set(kv_cache_features)


def anchor_options(
    anchor: Anchor | PagedAnchor | CacheAnchor, dtype: str | None
) -> tuple[tuple[str, Any], ...]:
    """The stratum options of ``anchor``: its forced options and its dtype (``dtype``, or
    the kernel's most precise one, "widest")."""
    return (*anchor.forced, ("dtype", dtype or "widest"))
