"""The GPU serving rows' adapters (FlashAttention 3, vLLM's flash-attn, FlashInfer;
conformance/kernels/adapters/) wired against CPU stand-ins of the libraries
(tests/serving_stand_ins.py).  The stand-ins take the libraries' own parameters and check
what the libraries require, then turn the library's convention back into the spec's and
compute in float64, so an adapter's output equals the float64 oracle of the spec's call
(tests/oracle_serving.py, tests/oracle.py) rounded to the output dtype only when it maps
the call onto the library's: argument names, cache layout, int32 cu_seqlens / seqused_k /
block table, FlashInfer's page lists and mask, descales, sinks, the head-dim padding.  Each
adapter is called as the suite's properties call it (their keywords and conventions).  The
real libraries need a GPU (the device run, docs/gpu.md)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the adapters call torch libraries")

import serving_stand_ins  # noqa: E402
from oracle import sdpa  # noqa: E402
from oracle_serving import merge, paged  # noqa: E402

from attnspec.conformance.claims.declaration import declaration_of  # noqa: E402
from attnspec.conformance.kernels.adapters import (  # noqa: E402
    flash_attn3,
    flash_mla,
    flashinfer,
    vllm_flash,
)
from attnspec.conformance.kernels.known import known_kernel  # noqa: E402

ADAPTERS = "attnspec.conformance.kernels.adapters."
# a float64 result rounded to the output dtype: at most one unit in the last place apart
# when two float64 evaluations of the same function straddle a rounding boundary
ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
# the wiring mistakes test_wiring_breaks_are_caught makes, by name
_BREAK_NAMES_MLA = (
    "int64 metadata",
    "scale dropped",
    "causal dropped",
    "head_dim_v of q",
    "metadata reused",
)
_BREAK_NAMES_FLASHINFER_MLA = (
    "lse in another base",
    "ckv from the rope end",
    "kv_len_arr as whole pages",
)
_BREAK_NAMES_MERGE = (
    "lse [num_tokens, num_heads]",
    "outputs swapped, not their lse",
    "output_lse not passed",
)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    serving_stand_ins.install(monkeypatch)


def _assert_rounded(got: Any, want: np.ndarray) -> None:
    rtol = ULP[got.dtype]
    np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol, atol=rtol * 2.0**-14)


class Batch:
    """A mixed batch as paged-batch properties draw it: a decode row, a prefill chunk and a
    (causal) sequence with more queries than keys, GQA 2 on 2, head dim 6 (not a multiple
    of FlashAttention's 8), shuffled pages with one shared, two query rows of padding past
    cu_seqlens_q[-1]; pages in the spec's HND order (``nhd`` swaps them for the call)."""

    def __init__(self, page: int, value_dim: int = 6, leftpad: bool = False) -> None:
        rng = np.random.default_rng(page)
        self.cu_q, self.used = [0, 1, 4, 8], [9, 6, 3]
        self.starts = [2, 1, 0] if leftpad else None
        pages = [-(-u // page) for u in self.used]
        order = rng.permutation(sum(pages) + 1)
        self.table = np.full((3, max(pages)), order[-1])
        first = 0
        for b, n in enumerate(pages):
            self.table[b, :n] = order[first : first + n]
            first += n
        self.table[1, 0] = self.table[0, 0]  # a page shared by two sequences
        self.q = rng.standard_normal((10, 4, 6))
        self.k = rng.standard_normal((len(order), 2, page, 6))
        self.v = rng.standard_normal((len(order), 2, page, value_dim))

    def keywords(self, layout: str, **options: Any) -> dict[str, Any]:
        """The call as the paged-batch properties make it (torch, float16)."""
        k, v = (torch.tensor(c).half() for c in (self.k, self.v))
        if layout == "nhd":
            k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        call = {
            "q": torch.tensor(self.q).half(),
            "k_cache": k,
            "v_cache": v,
            "cu_seqlens_q": torch.tensor(self.cu_q),
            "seqused_k": torch.tensor(self.used, dtype=torch.int32),
            "block_table": torch.tensor(self.table),
            **options,
        }
        if self.starts is not None:
            call["cache_leftpad"] = torch.tensor(self.starts, dtype=torch.int32)
        return call

    def want(self, **options: Any) -> np.ndarray:
        """The float64 oracle on the float16-rounded inputs."""
        half = [np.asarray(x, np.float16).astype(np.float64) for x in (self.q, self.k, self.v)]
        out, _ = paged(
            *half, self.cu_q, self.used, self.table.tolist(), leftpad=self.starts, **options
        )
        return out


def test_flash_attn3_paged_maps_onto_flash_attn_with_kvcache(stand_ins: None) -> None:
    """PAGED-1, PAGED-2, KVCACHE-6, CHUNK-1, SOFTCAP-1: page_table, cache_seqlens,
    cache_leftpad, cu_seqlens_q (int32), NHD pages, window_size and attention_chunk as
    FlashAttention 3 takes them; head dims padded with the unpadded scale."""
    batch = Batch(page=4, leftpad=True)
    for options, oracle in (
        (
            {"is_causal": True, "window_size": (2, -1), "softcap": 5.0},
            {"is_causal": True, "window": (2, None), "softcap": 5.0},
        ),
        ({"is_causal": False, "attention_chunk": 3}, {"chunk": 3}),
    ):
        call = batch.keywords("nhd", max_seqlen_q=4, max_seqlen_k=9, **options)
        _assert_rounded(flash_attn3.flash_attn3_paged(**call), batch.want(**oracle))


@pytest.mark.parametrize("adapter", ["vllm_flash_attn_varlen", "vllm_flash_attn_varlen_fa3"])
def test_vllm_paged_maps_onto_flash_attn_varlen_func(stand_ins: None, adapter: str) -> None:
    """PAGED-1, PAGED-2, SINK-1: the whole NHD cache as k and v, seqused_k and block_table
    (int32), window_size as [left, right], and on the FlashAttention 3 path the sinks as
    s_aux; pages of vLLM's 16."""
    batch = Batch(page=vllm_flash.VLLM_PAGE_SIZE)
    options: dict[str, Any] = {"is_causal": True, "window_size": (3, 0), "softcap": 4.0}
    oracle: dict[str, Any] = {"is_causal": True, "window": (3, 0), "softcap": 4.0}
    if adapter.endswith("fa3"):
        options["sinks"] = torch.tensor([0.5, -1.0, 2.0, 0.0])
        oracle["sinks"] = [0.5, -1.0, 2.0, 0.0]
    call = batch.keywords("nhd", max_seqlen_q=4, max_seqlen_k=9, **options)
    _assert_rounded(getattr(vllm_flash, adapter)(**call), batch.want(**oracle))


@pytest.mark.parametrize(
    ("module", "name"),
    [(flash_attn3, "flash_attn3_paged_fp8"), (vllm_flash, "vllm_flash_attn_varlen_fa3_fp8")],
)
def test_float8_paged_rows_pass_the_descales(stand_ins: None, module: Any, name: str) -> None:
    """QUANT-6: float8 q and pages with descales (num_sequences, num_heads_k), distinct per
    sequence, reach FlashAttention's q_descale, k_descale, v_descale: sequence b's rows are
    the attention of its real values (its q rows and the pages times row b), head dim 6
    padded to 16 (float8's alignment), in bfloat16."""
    batch = Batch(page=vllm_flash.VLLM_PAGE_SIZE)
    rng = np.random.default_rng(5)
    descales = {n: rng.uniform(0.25, 4.0, (3, 2)).astype(np.float32) for n in ("q", "k", "v")}
    stored = [
        np.asarray(torch.tensor(x).to(torch.float8_e4m3fn).double())
        for x in (batch.q, batch.k, batch.v)
    ]
    call = batch.keywords("nhd", max_seqlen_q=4, max_seqlen_k=9, is_causal=True)
    for key, x in zip(("q", "k_cache", "v_cache"), stored, strict=True):
        layout = x if key == "q" else np.swapaxes(x, 1, 2)
        call[key] = torch.tensor(layout).to(torch.float8_e4m3fn)
    call.update({f"{n}_descale": torch.tensor(d) for n, d in descales.items()})
    got = getattr(module, name)(**call)
    assert got.dtype == torch.bfloat16
    for b in range(3):
        real = (
            stored[0] * np.repeat(descales["q"][b], 2)[None, :, None],
            stored[1] * descales["k"][b][None, :, None, None],
            stored[2] * descales["v"][b][None, :, None, None],
        )
        want, _ = paged(*real, batch.cu_q, batch.used, batch.table.tolist(), is_causal=True)
        rows = slice(batch.cu_q[b], batch.cu_q[b + 1])
        _assert_rounded(got[rows], want[rows])


def test_flashinfer_paged_maps_onto_the_prefill_wrapper(stand_ins: None) -> None:
    """PAGED-1, PAGED-5, PAGED-8, SINK-1: the block table as FlashInfer's page lists (a
    partial last page), HND pages, the custom mask with the causal rule folded in (FlashInfer
    ignores causal with a mask), sinks, logits_soft_cap; q without the padding rows, whose
    output rows are 0."""
    batch = Batch(page=4)
    rng = np.random.default_rng(1)
    lengths = [(1, 9), (3, 6), (4, 3)]
    mask = np.concatenate([(rng.random(n_q * n_k) < 0.7) for n_q, n_k in lengths])
    sinks = [1.0, -2.0, 0.0, 3.0]
    call = batch.keywords(
        "hnd",
        is_causal=True,
        softcap=6.0,
        custom_mask=torch.tensor(mask),
        sinks=torch.tensor(sinks),
    )
    got = flashinfer.batch_prefill_paged(**call)
    want = batch.want(is_causal=True, softcap=6.0, flat_mask=mask, sinks=sinks)
    _assert_rounded(got, want)
    assert not got[8:].any()


def test_flashinfer_float8_cache_passes_its_scales(stand_ins: None) -> None:
    """QUANT-8: float16 queries beside e4m3 pages reach FlashInfer's run as they are, the
    pages' per-tensor scales as k_scale= and v_scale= Python floats; the float16 output is
    the attention of q and the pages times their scales."""
    batch = Batch(page=4)
    stored = [
        np.asarray(torch.tensor(x).to(torch.float8_e4m3fn).double()) for x in (batch.k, batch.v)
    ]
    call = batch.keywords("hnd", is_causal=True)
    call["k_cache"], call["v_cache"] = (torch.tensor(x).to(torch.float8_e4m3fn) for x in stored)
    call.update(k_scale=0.375, v_scale=2.5)
    got = flashinfer.batch_prefill_paged_fp8_cache(**call)
    assert got.dtype == torch.float16
    claim = declaration_of(flashinfer.batch_prefill_paged_fp8_cache).fp8
    assert claim is not None and claim.kv_only and claim.descale == "tensor"
    owned = batch.cu_q[-1]
    want, _ = paged(
        np.asarray(batch.q, np.float16).astype(np.float64),
        stored[0] * 0.375,
        stored[1] * 2.5,
        batch.cu_q,
        batch.used,
        batch.table.tolist(),
        is_causal=True,
    )
    _assert_rounded(got[:owned], want[:owned])


def test_flash_attn3_dense_maps_onto_flash_attn_func(stand_ins: None) -> None:
    """SDPA-1.1, SDPA-4.2, SDPA-6.1, SOFTCAP-1: (B, S, H, D) layout, bottom-right causal
    rows, GQA, the softcap, head dims 6 and 10 padded to 16 with the default scale
    1/sqrt(6) kept."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 3, 6), (2, 2, 5, 6), (2, 2, 5, 10)))
    half = [np.asarray(x, np.float16).astype(np.float64) for x in (q, k, v)]
    got = flash_attn3.flash_attn3_func(
        *(torch.tensor(x).half() for x in (q, k, v)), is_causal=True, softcap=3.0
    )
    want, _ = sdpa(*half, is_causal=True, causal_alignment="bottom_right", softcap=3.0)
    _assert_rounded(got, want)


def test_flash_attn3_fp8_maps_the_descales(stand_ins: None) -> None:
    """QUANT-1, QUANT-2, QUANT-5: float8 q, k, v with (B, H_kv) float32 descales reach
    FlashAttention 3's q_descale, k_descale, v_descale (a query head its key/value head's),
    head dim 12 padded to 16 (float8's alignment), with a softcap; the bfloat16 output is the
    attention of stored x descale."""
    rng = np.random.default_rng(3)
    shapes = {"q": (1, 4, 3, 12), "k": (1, 2, 5, 12), "v": (1, 2, 5, 12)}
    stored = {
        n: torch.tensor(rng.standard_normal(s)).to(torch.float8_e4m3fn) for n, s in shapes.items()
    }
    descales = {
        n: torch.tensor(rng.uniform(0.25, 4.0, (1, 2)), dtype=torch.float32) for n in shapes
    }
    got = flash_attn3.flash_attn3_func_fp8(
        stored["q"],
        stored["k"],
        stored["v"],
        scale=0.3,
        is_causal=False,
        softcap=2.0,
        **{f"{n}_descale": d for n, d in descales.items()},
    )
    real = {
        n: stored[n].double().numpy()
        * np.repeat(descales[n].double().numpy(), shapes[n][1] // 2, axis=1)[..., None, None]
        for n in shapes
    }
    want, _ = sdpa(real["q"], real["k"], real["v"], scale=0.3, softcap=2.0)
    assert got.dtype == torch.bfloat16
    _assert_rounded(got, want)


def test_flashinfer_merge_state_declares_its_convention(stand_ins: None) -> None:
    """MERGE-1, MERGE-2: flashinfer.merge_state is called as it is; its base-2 log-sum-exps
    and (L, H) layouts are declared, not translated."""
    claim = declaration_of(flashinfer.merge_state).merge
    assert claim is not None
    assert (claim.base, claim.out_layout, claim.lse_layout) == ("2", "lhd", "lh")
    rng = np.random.default_rng(4)
    o_a, o_b = (torch.tensor(rng.standard_normal((3, 2, 4))).half() for _ in range(2))
    s_a, s_b = (torch.tensor(rng.uniform(-5, 5, (3, 2)), dtype=torch.float32) for _ in range(2))
    o, s = flashinfer.merge_state(o_a, s_a, o_b, s_b)
    ln2 = np.log(2.0)
    want_o, want_l = merge(o_a.double(), s_a.double() * ln2, o_b.double(), s_b.double() * ln2)
    _assert_rounded(o, want_o)
    np.testing.assert_allclose(s.double().numpy(), want_l / ln2, rtol=2.0**-23)


def test_stand_ins_refuse_what_the_libraries_refuse(stand_ins: None) -> None:
    """PAGED-1: the stand-ins are not lenient: FlashAttention's int32 metadata, vLLM's
    refusal of sinks on its FlashAttention 2 path, and FlashInfer's q of exactly
    qo_indptr[-1] rows raise as the libraries do, so the tests above can fail."""
    import flash_attn_interface
    import flashinfer as library
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    batch = Batch(page=4)
    call = batch.keywords("nhd")
    q, k, v = call["q"], call["k_cache"], call["v_cache"]
    with pytest.raises(RuntimeError, match="int32"):
        flash_attn_interface.flash_attn_with_kvcache(
            q,
            k,
            v,
            cache_seqlens=call["seqused_k"],
            page_table=call["block_table"],
            cu_seqlens_q=call["cu_seqlens_q"].int(),
            max_seqlen_q=4,
        )
    with pytest.raises(NotImplementedError, match="s_aux"):
        flash_attn_varlen_func(
            q,
            k,
            v,
            4,
            call["cu_seqlens_q"].int(),
            9,
            seqused_k=call["seqused_k"],
            block_table=call["block_table"].int(),
            s_aux=torch.zeros(4),
        )
    wrapper = library.BatchPrefillWithPagedKVCacheWrapper(torch.empty(8), kv_layout="HND")
    indptr, indices, last = flashinfer.page_lists(call["seqused_k"], call["block_table"], 4)
    wrapper.plan(torch.tensor(batch.cu_q, dtype=torch.int32), indptr, indices, last, 4, 2, 6, 4)
    with pytest.raises(RuntimeError, match=r"qo_indptr\[-1\] rows"):
        wrapper.run(q, (call["k_cache"].transpose(1, 2), call["v_cache"].transpose(1, 2)))


def test_gpu_serving_rows_need_their_libraries() -> None:
    """The matrix rows of these adapters name the library each needs and run on CUDA only,
    so a machine without them reports "not installed" or "needs a GPU"."""
    for module, name in (
        ("flash_attn3", "flash_attn3_func"),
        ("flash_attn3", "flash_attn3_func_fp8"),
        ("flash_attn3", "flash_attn3_paged"),
        ("flash_attn3", "flash_attn3_paged_fp8"),
        ("vllm_flash", "vllm_flash_attn_varlen"),
        ("vllm_flash", "vllm_flash_attn_varlen_fa3"),
        ("vllm_flash", "vllm_flash_attn_varlen_fa3_fp8"),
        ("flashinfer", "batch_prefill_paged"),
        ("flashinfer", "batch_prefill_paged_fp8_cache"),
        ("flashinfer", "merge_state"),
        ("flash_mla", "flash_mla_with_kvcache"),
        ("flashinfer", "batch_mla_paged"),
        ("vllm_flash", "merge_attn_states"),
    ):
        entry = known_kernel(f"{ADAPTERS}{module}:{name}")
        assert entry is not None, name
        assert entry.device == "cuda", name
        library = {"flash_attn3": "flash_attn_interface", "vllm_flash": "vllm"}
        assert entry.requires == (library.get(module, module),), name


class LatentPages:
    """Absorbed MLA over paged latent pages as mla-paged-matches-reference draws it (MLA-4):
    two sequences of 70 and 5 cached positions (partial last pages of 64), two queries each,
    three heads, E = 576, shuffled pages, block-table rows wider than a sequence needs (their
    last entries point to a page no sequence reads), int64 metadata the adapter converts."""

    def __init__(self) -> None:
        rng = np.random.default_rng(6)
        self.used, self.table = [70, 5], [[3, 0, 2], [1, 2, 2]]
        self.q = rng.standard_normal((2, 2, 3, 576))
        self.pages = rng.standard_normal((4, 64, 1, 576))

    def call(self) -> tuple[Any, Any, dict[str, Any]]:
        """``q``, ``k_cache`` and the keywords as the property passes them (float16 pages
        in FlashMLA's layout)."""
        q, pages = (torch.tensor(x).half() for x in (self.q, self.pages))
        metadata = {
            "block_table": torch.tensor(self.table),
            "cache_seqlens": torch.tensor(self.used),
        }
        return q, pages, {**metadata, "head_dim_v": 512}

    def want(self, scale: float, is_causal: bool) -> tuple[np.ndarray, np.ndarray]:
        """The float64 oracle on the inputs as :meth:`call` rounds them (torch rounds
        float64 to float16 through float32, which differs from NumPy's one rounding in a few
        of these 150 000 elements): out (B, Lq, Hq, 512), lse (B, Hq, Lq)."""
        q, pages = (x.double().numpy() for x in self.call()[:2])
        out, lse = paged(
            q.reshape(4, 3, 576),
            np.swapaxes(pages, 1, 2),
            None,
            [0, 2, 4],
            self.used,
            self.table,
            value_dim=512,
            is_causal=is_causal,
            scale=scale,
        )
        return out.reshape(2, 2, 3, 512), lse.reshape(3, 2, 2).transpose(1, 0, 2)


def _assert_paged_mla(adapter: Any, scale: float | None, is_causal: bool) -> None:
    """``adapter`` called as mla-paged-matches-reference calls it gives the oracle's output
    rounded to float16 and its log-sum-exp rounded to float32 (MLA-4, MLA-5)."""
    pages = LatentPages()
    keywords = {"causal": is_causal} | ({} if scale is None else {"softmax_scale": scale})
    q, k_cache, call = pages.call()
    out, lse = adapter(q, k_cache, **call, **keywords)
    want_out, want_lse = pages.want(576**-0.5 if scale is None else scale, is_causal)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    _assert_rounded(out, want_out)
    np.testing.assert_allclose(lse.double().numpy(), want_lse, rtol=2.0**-23)


def test_flash_mla_maps_onto_flash_mla_with_kvcache(stand_ins: None) -> None:
    """MLA-4, MLA-5: FlashMLA's own call with its scheduler metadata added: int32
    block_table and cache_seqlens, pages of 64, the model's scale passed or, passed none,
    FlashMLA's 1/sqrt(576); bottom-right causal rows; out and lse in FlashMLA's layouts."""
    claim = declaration_of(flash_mla.flash_mla_with_kvcache).mla
    assert claim is not None and (claim.paged, claim.page_size, claim.default_scale) == (
        True,
        64,
        True,
    )
    _assert_paged_mla(flash_mla.flash_mla_with_kvcache, 192**-0.5, True)
    _assert_paged_mla(flash_mla.flash_mla_with_kvcache, None, False)


def test_flashinfer_mla_maps_onto_the_mla_wrapper(stand_ins: None) -> None:
    """MLA-4: FlashInfer's BatchMLAPagedAttentionWrapper gets the block table as its page
    lists, the cached lengths as kv_len_arr, the queries and pages split at the latent width
    (ckv, kpe), the scale (it has no default) and causal; its base-2 [tokens, heads]
    log-sum-exp comes back natural, (B, Hq, Lq)."""
    claim = declaration_of(flashinfer.batch_mla_paged).mla
    assert claim is not None and (claim.paged, claim.default_scale) == (True, False)
    _assert_paged_mla(flashinfer.batch_mla_paged, 192**-0.5, True)
    _assert_paged_mla(flashinfer.batch_mla_paged, 0.3, False)


class _MiswiredMla(serving_stand_ins.BatchMLAPagedAttentionWrapper):
    """FlashInfer's MLA wrapper receiving what a miswired adapter would pass it: ``wrong`` is
    "lengths" (whole pages as kv_len_arr), "ckv" (ckv sliced from the rotary end of the
    latent vector) or "base" (the log-sum-exp in a base other than the one converted)."""

    wrong = ""

    def plan(self, *args: Any, **kwargs: Any) -> None:
        if self.wrong == "lengths":
            indptr, page_size = args[1], args[7]
            args = (*args[:3], ((indptr[1:] - indptr[:-1]) * page_size).int(), *args[4:])
        super().plan(*args, **kwargs)

    def run(self, q_nope: Any, q_pe: Any, ckv: Any, kpe: Any, **kwargs: Any) -> Any:
        if self.wrong == "ckv":
            ckv = torch.cat([ckv, kpe], dim=-1)[..., -ckv.shape[-1] :]
        out, lse = super().run(q_nope, q_pe, ckv, kpe, **kwargs)
        return out, lse / np.log(2.0) if self.wrong == "base" else lse


def _flash_mla_breaks() -> dict[str, Any]:
    """Wirings of flash_mla_with_kvcache an adapter could get wrong, each called as the
    adapter is."""
    import flash_mla as library

    def call(q: Any, k: Any, **given: Any) -> Any:
        used, table = given.pop("cache_seqlens").int(), given.pop("block_table").int()
        meta, splits = library.get_mla_metadata(used, q.shape[1] * q.shape[2], 1)
        return library.flash_mla_with_kvcache(
            q, k, table, used, given.pop("head_dim_v"), meta, splits, **given
        )

    def with_int64(q: Any, k: Any, **given: Any) -> Any:
        table, used, dv = (given.pop(n) for n in ("block_table", "cache_seqlens", "head_dim_v"))
        return library.flash_mla_with_kvcache(
            q, k, table, used, dv, *library.get_mla_metadata(), **given
        )

    def reusing(q: Any, k: Any, **given: Any) -> Any:
        meta = library.get_mla_metadata()[0]
        meta.config = (1, 1, 1, 64, 1, False)  # filled by a call of another batch's shapes
        table, used = given.pop("block_table").int(), given.pop("cache_seqlens").int()
        return library.flash_mla_with_kvcache(
            q, k, table, used, given.pop("head_dim_v"), meta, None, **given
        )

    return {
        "int64 metadata": with_int64,
        "scale dropped": lambda q, k, softmax_scale=None, **given: call(q, k, **given),
        "causal dropped": lambda q, k, causal=False, **given: call(q, k, **given),
        "head_dim_v of q": lambda q, k, **given: call(q, k, **{**given, "head_dim_v": 576}),
        "metadata reused": reusing,
    }


def _merge_breaks() -> dict[str, Any]:
    """Wirings of vLLM's merge_attn_states an adapter could get wrong."""
    from vllm.v1.attention.ops.merge_attn_states import merge_attn_states as merge

    def run(
        o_a: Any, l_a: Any, o_b: Any, l_b: Any, transpose: bool = False, swap: bool = False
    ) -> Any:
        out, lse = torch.empty_like(o_a), torch.zeros_like(l_a)
        l_a, l_b = (x.T.contiguous() for x in (l_a, l_b)) if transpose else (l_a, l_b)
        merge(out, *((o_b, l_a, o_a, l_b) if swap else (o_a, l_a, o_b, l_b)), lse)
        return out, lse

    def no_output_lse(o_a: Any, l_a: Any, o_b: Any, l_b: Any) -> Any:
        out = torch.empty_like(o_a)
        merge(out, o_a, l_a, o_b, l_b)
        return out, torch.zeros_like(l_a)

    return {
        "lse [num_tokens, num_heads]": lambda *s: run(*s, transpose=True),
        "outputs swapped, not their lse": lambda *s: run(*s, swap=True),
        "output_lse not passed": no_output_lse,
    }


def _merge_states() -> tuple[Any, ...]:
    """Three tokens, two heads, head size 8 (lhd), log-sum-exps (H, L) float32, one token's
    prefix empty (-inf)."""
    rng = np.random.default_rng(7)
    o_a, o_b = (torch.tensor(rng.standard_normal((3, 2, 8))).half() for _ in range(2))
    l_a, l_b = (torch.tensor(rng.uniform(-4, 4, (2, 3)), dtype=torch.float32) for _ in range(2))
    l_a[1, 2] = -np.inf
    return o_a, l_a, o_b, l_b


def _assert_merged(adapter: Any) -> None:
    """MERGE-1, MERGE-2, MERGE-3: the adapter's (o, lse) are the oracle's merge of the
    states in vLLM's layouts, rounded to float16 and float32."""
    o_a, l_a, o_b, l_b = _merge_states()
    o, lse = adapter(o_a, l_a, o_b, l_b)
    want_o, want_l = merge(o_a.double(), l_a.double().T, o_b.double(), l_b.double().T)
    _assert_rounded(o, want_o)
    np.testing.assert_allclose(lse.double().numpy(), want_l.T, rtol=2.0**-23)


def test_vllm_merge_attn_states_declares_its_convention(stand_ins: None) -> None:
    """MERGE-1, MERGE-2, MERGE-3: vLLM's merge_attn_states writes into buffers the adapter
    allocates; its natural-log log-sum-exps [num_heads, num_tokens] and [num_tokens,
    num_heads, head_size] outputs are declared, not translated."""
    claim = declaration_of(vllm_flash.merge_attn_states).merge
    assert claim is not None
    assert (claim.base, claim.out_layout, claim.lse_layout) == ("e", "lhd", "hl")
    _assert_merged(vllm_flash.merge_attn_states)


@pytest.mark.parametrize(
    "broken", [*_BREAK_NAMES_MLA, *_BREAK_NAMES_FLASHINFER_MLA, *_BREAK_NAMES_MERGE]
)
def test_wiring_breaks_are_caught(
    stand_ins: None, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """MLA-4, MLA-5, MERGE-2: each way of wiring FlashMLA, FlashInfer's MLA wrapper or
    vLLM's merge wrongly (int64 metadata, the scale or causal flag not passed, head_dim_v of
    q, scheduler metadata reused for other shapes; a log-sum-exp in another base,
    ckv sliced from the rotary end, whole pages as lengths; log-sum-exps transposed, outputs
    swapped without their log-sum-exps, output_lse not passed) is refused by the stand-in
    or gives another result than the checks above accept, so those checks can fail."""
    if broken in _BREAK_NAMES_MLA:
        with pytest.raises((AssertionError, RuntimeError)):
            _assert_paged_mla(_flash_mla_breaks()[broken], 192**-0.5, True)
    elif broken in _BREAK_NAMES_FLASHINFER_MLA:
        wrong = {"lse in another base": "base", "ckv from the rope end": "ckv"}
        miswired = type("Miswired", (_MiswiredMla,), {"wrong": wrong.get(broken, "lengths")})
        monkeypatch.setattr(
            sys.modules["flashinfer.mla"], "BatchMLAPagedAttentionWrapper", miswired
        )
        with pytest.raises(AssertionError):
            _assert_paged_mla(flashinfer.batch_mla_paged, 192**-0.5, True)
    else:
        with pytest.raises((AssertionError, RuntimeError)):
            _assert_merged(_merge_breaks()[broken])
