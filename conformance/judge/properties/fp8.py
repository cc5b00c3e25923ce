"""QUANT-1 … QUANT-5: attention on q, k, v stored in float8 with descale factors, called as
FlashAttention 3 is: ``fn(q, k, v, q_descale=, k_descale=, v_descale=, scale=, is_causal=,
mask=)``.

The suite draws the stored values on the declared format's grid (subnormals included), each
tensor and head spread by its own power of two, and the descales that bring them back (times
a factor in [0.5, 2)): descales far from 1 (2^-8 … 2^8) and different for q, k, v and for
every (batch element, key/value head), so that a descale applied twice, to the wrong tensor
or to the wrong head of a group moves the output far outside QUANT-4's bound.  Calls have GQA
groups, causal rows of the declared alignment and boolean masks where the declaration has
them, and a softcap and sink logits where it declares them (QUANT-5); every row keeps key
0.  The output is compared with the float64 attention of the real values (QUANT-2) within
QUANT-4's bound, with QUANT-3's term when the kernel declares that it rounds its weights to
float8.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.serving.fp8 import FP8_FORMATS, round_to_fp8
from ....reference.tolerance_fp8 import OUT_DTYPES, fp8_error_bound
from ...claims.declaration import KernelDeclaration
from ...draw import sizes
from ...draw.sizes import Dims
from ...draw.strategies import draw_mask, random_values
from ..assertions import assert_elements_within
from ..failures import KernelRaised, PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import register
from ._helpers import as_float8, descale_keywords, draw_sinks, draw_softcap, has_float8

# FlashAttention 3's float8 heads: head dims 64 to 256 (64 and 128 keep the check cheap),
# decode and prefill rows, a few key/value heads shared by groups of 1 to 8 query heads
REALISTIC = {"E": (64, 128), "Lq": (1, 16, 64), "Lk": (16, 128, 129), "G": (1, 4, 8)}
# the stored values' spread per tensor and head, as a power of two: far from 1 both ways,
# short of the format's largest value for normal draws (448 for e4m3fn, 57344 for e5m2)
SPREADS = {"float8_e4m3fn": (-8, 5), "float8_e5m2": (-8, 8)}


def _fp8_only(declaration: KernelDeclaration) -> str | None:
    if declaration.family != "fp8":
        return "the kernel is not declared to take float8 inputs (--fp8)"
    if declaration.varlen:
        return "the float8 kernel takes packed sequences (--varlen): fp8-varlen-matches-reference"
    if declaration.fp8 is not None and declaration.fp8.kv_only:
        return "the float8 kernel has a float8 cache (--fp8-kv-only): fp8-cache-matches-reference"
    return None


def _fp8_cache_only(declaration: KernelDeclaration) -> str | None:
    fp8 = declaration.fp8
    if declaration.family != "fp8" or fp8 is None or not fp8.kv_only or declaration.varlen:
        return "the kernel is not declared a dense float8 cache kernel (--fp8 --fp8-kv-only)"
    return None


def _fp8_varlen_only(declaration: KernelDeclaration) -> str | None:
    if declaration.family != "fp8" or not declaration.varlen:
        return "the kernel is not declared to take packed float8 sequences (--varlen --fp8)"
    return None


@dataclass(frozen=True)
class Fp8Call:
    """One call: stored values (float64 on the format's grid), float64 descales as passed
    (``(1,)`` or ``(B, H_kv)``), and the options."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    descales: dict[str, np.ndarray]
    fmt: str
    out_dtype: str
    scale: float
    is_causal: bool
    mask: np.ndarray | None
    softcap: float | None = None
    sinks: np.ndarray | None = None  # (Hq,) float64 values exact in float32 (SINK-1)

    def describe(self) -> str:
        shown = ", ".join(
            f"{name} {np.array2string(d, precision=4, separator=', ')}"
            for name, d in self.descales.items()
        )
        mask = "" if self.mask is None else f", mask {self.mask.shape}"
        softcap = "" if self.softcap is None else f", softcap {self.softcap:.6g}"
        sinks = (
            ""
            if self.sinks is None
            else f", sinks {np.array2string(self.sinks, precision=4, separator=', ')}"
        )
        return (
            f"q {self.q.shape}, k {self.k.shape}, v {self.v.shape} stored in {self.fmt}, "
            f"{shown}, out {self.out_dtype}, scale {self.scale:.6g}, "
            f"{'causal' if self.is_causal else 'not causal'}{mask}{softcap}{sinks}"
        )


def _draw_dims(data: st.DataObject, declaration: KernelDeclaration) -> Dims:
    gqa = declaration.gqa
    if sizes.current().realistic:
        dim = data.draw(st.sampled_from(REALISTIC["E"]), label="E")
        n_queries = data.draw(st.sampled_from(REALISTIC["Lq"]), label="Lq")
        n_keys = data.draw(st.sampled_from(REALISTIC["Lk"]), label="Lk")
        groups = data.draw(st.sampled_from(REALISTIC["G"] if gqa else (1,)), label="groups")
    else:
        dim = data.draw(st.sampled_from((4, 8, 16)), label="E")
        n_queries = data.draw(st.integers(1, 4), label="Lq")
        n_keys = data.draw(st.integers(1, 6), label="Lk")
        groups = data.draw(st.integers(1, 3 if gqa else 1), label="groups")
    batch = data.draw(st.integers(1, 2), label="B")
    n_kv_heads = data.draw(st.integers(1, 2), label="H_kv")
    return Dims((batch,), n_kv_heads, groups, n_queries, n_keys, dim, dim)


def _stored_and_descale(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    groups: int,
    fmt: str,
    per_head: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Stored values of ``shape`` (B, H, L, E) on ``fmt``'s grid, spread by 2^s per (batch
    element, key/value head) or per tensor, and the float32 descale 2^-s times a factor in
    [0.5, 2): ``(B, H_kv)`` or ``(1,)``."""
    low, high = SPREADS[fmt]
    batch, heads = shape[0], shape[1] // groups
    grid = (batch, heads) if per_head else (1,)
    spread = rng.integers(low, high + 1, size=grid).astype(np.float64)
    factor = rng.uniform(0.5, 2.0, size=grid)
    descale = (2.0**-spread * factor).astype(np.float32).astype(np.float64)
    widths = np.repeat(spread, groups, axis=1) if per_head else spread
    exponent = widths[..., None, None] if per_head else widths
    largest = FP8_FORMATS[fmt].largest
    real = np.clip(rng.standard_normal(shape) * 2.0**exponent, -largest, largest)
    stored = np.asarray(round_to_fp8(real, fmt))
    return stored, descale


def _draw_stored(
    data: st.DataObject, kernel: KernelUnderTest, dims: Dims, fmt: str, out_dtype: str
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Stored q, k, v ``(B, H, L, ·)`` on ``fmt``'s grid and their descales by the
    reference's names, per tensor ``(1,)`` or per batch element (a packed call's sequence)
    and key/value head; beside a float8 cache (QUANT-8) q holds values of ``out_dtype``
    instead, with no descale."""
    claim = kernel.declaration.fp8
    assert claim is not None  # the float8 properties apply only to an --fp8 declaration
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))
    per_head = claim.descale == "head"
    b, hq, hk = dims.batch[0], dims.n_q_heads, dims.n_kv_heads
    stored, descales = {}, {}
    for name, shape, groups in (
        ("q", (b, hq, dims.n_queries, dims.head_dim), dims.groups),
        ("k", (b, hk, dims.n_keys, dims.head_dim), 1),
        ("v", (b, hk, dims.n_keys, dims.value_dim), 1),
    ):
        if name == "q" and claim.kv_only:
            stored[name] = random_values(kernel, rng, shape, out_dtype)
            continue
        stored[name], descales[f"{name}_descale"] = _stored_and_descale(
            rng, shape, groups, fmt, per_head
        )
    return stored, descales


def _draw_call(data: st.DataObject, kernel: KernelUnderTest, masks: bool = True) -> Fp8Call:
    """One float8 call in the kernel's declared formats, dtypes and options; ``masks``:
    with a boolean mask in some calls where the kernel takes one."""
    declaration = kernel.declaration
    claim = declaration.fp8
    assert claim is not None  # the property applies only to an --fp8 declaration
    fmt = "float8_" + data.draw(st.sampled_from(claim.formats), label="format")
    out_dtypes = [d for d in kernel.dtypes if d in OUT_DTYPES] or ["float32"]
    out_dtype = data.draw(st.sampled_from(out_dtypes), label="out dtype")
    dims = _draw_dims(data, declaration)
    bottom_right = declaration.causal_alignment == "bottom_right"
    if bottom_right and dims.n_queries > dims.n_keys:  # every row keeps a key (see below)
        dims = Dims(
            dims.batch,
            dims.n_kv_heads,
            dims.groups,
            dims.n_keys,
            dims.n_keys,
            dims.head_dim,
            dims.value_dim,
        )
    stored, descales = _draw_stored(data, kernel, dims, fmt, out_dtype)
    is_causal = declaration.causal and data.draw(st.booleans(), label="is_causal")
    mask = None
    if masks and declaration.mask and (not is_causal or declaration.mask_and_causal):
        if data.draw(st.booleans(), label="mask"):
            rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="mask seed"))
            mask = draw_mask(data, rng, dims, empty_rows=False)
            mask[..., 0] = True  # no row without keys: QUANT-4 is stated for rows with keys
    scale = data.draw(st.sampled_from((None, 0.125, 1.5)), label="scale")
    softcap, sinks = None, None
    if declaration.softcap and data.draw(st.booleans(), label="with softcap"):
        softcap = draw_softcap(data)
    if declaration.sinks and data.draw(st.booleans(), label="with sinks"):
        sinks = draw_sinks(data, dims.n_q_heads)
    return Fp8Call(
        stored["q"],
        stored["k"],
        stored["v"],
        descales,
        fmt,
        out_dtype,
        dims.head_dim**-0.5 if scale is None else scale,
        is_causal,
        mask,
        softcap,
        sinks,
    )


def _keywords(kernel: KernelUnderTest, call: Fp8Call) -> dict[str, Any]:
    backend, declaration = kernel.backend, kernel.declaration
    keywords: dict[str, Any] = {**declaration.extra_kwargs, "scale": call.scale}
    keywords.update(descale_keywords(kernel, call.descales))
    if declaration.causal:
        keywords["is_causal"] = call.is_causal
    if call.mask is not None:
        keywords[declaration.mask_keyword] = backend.asarray(call.mask)
    if call.softcap is not None:
        keywords[declaration.softcap_keyword] = call.softcap
    if call.sinks is not None:
        keywords[declaration.sinks_keyword] = backend.asarray(call.sinks, "float32")
    return keywords


def _output(kernel: KernelUnderTest, call: Fp8Call, keywords: dict[str, Any]) -> np.ndarray:
    """The kernel's output on ``call``'s float8 arrays (q in the output dtype beside a
    float8 cache, QUANT-8), as float64, after QUANT-2's shape ``(..., Ev)`` (q's shape but
    its last axis) and the drawn output dtype."""
    backend = kernel.backend
    args = tuple(as_float8(backend, x, call.fmt) for x in (call.q, call.k, call.v))
    if "q_descale" not in call.descales:  # QUANT-8: q in half precision
        args = (backend.asarray(call.q, call.out_dtype), *args[1:])
    try:
        out = kernel.call_raw(args, keywords)
    except Exception as exc:
        raise KernelRaised(
            f"the float8 kernel raised {type(exc).__name__}: {str(exc)[:300]} "
            f"[call: {call.describe()}]"
        ) from exc
    shape = (*call.q.shape[:-1], call.v.shape[-1])
    if not backend.is_array(out) or tuple(out.shape) != shape:
        shown = f"shape {tuple(out.shape)}" if backend.is_array(out) else type(out).__name__
        raise PropertyFailure(
            f"the float8 kernel returned {shown}, but should return one array of shape "
            f"{shape} (QUANT-2) [call: {call.describe()}]"
        )
    if backend.dtype_name(out) != call.out_dtype:
        raise PropertyFailure(
            f"the float8 kernel returned {out.dtype}, but should return {call.out_dtype}, "
            f"the output dtype drawn from its --dtype (QUANT-2) [call: {call.describe()}]"
        )
    return kernel.numpy(out)


def _assert_within_quant4(
    kernel: KernelUnderTest,
    call: Fp8Call,
    out: np.ndarray,
    stored: tuple[np.ndarray, np.ndarray, np.ndarray],
    descales: dict[str, np.ndarray],
    what: str = "out",
    clause: str = "",
) -> None:
    """``out`` ``(B, Hq, Lq, Ev)`` within QUANT-4's bound of QUANT-2 on the ``stored`` q, k, v
    with ``descales`` and ``call``'s options (QUANT-5 with a softcap or sinks, QUANT-3 with
    declared float8 weights); ``clause`` names the clause of the call's layout."""
    claim = kernel.declaration.fp8
    assert claim is not None  # the float8 properties apply only to an --fp8 declaration
    weights = None if claim.weights is None else "float8_" + claim.weights
    bound = fp8_error_bound(
        *stored,
        q_descale=descales.get("q_descale"),  # None beside a float8 cache (QUANT-8)
        k_descale=descales["k_descale"],
        v_descale=descales["v_descale"],
        out_dtype=call.out_dtype,
        fmt=call.fmt,
        weights_format=weights,
        mask=call.mask,
        is_causal=call.is_causal,
        causal_alignment=kernel.declaration.causal_alignment,
        scale=call.scale,
        softcap=call.softcap,
        sinks=call.sinks,
    )
    assert_elements_within(
        what,
        out,
        np.asarray(bound.out),
        np.asarray(bound.out_tolerance),
        lambda at: (
            "QUANT-2, QUANT-4: the attention of stored x descale, each descale once, "
            "on its own tensor and key/value head"
            + ("" if call.softcap is None and call.sinks is None else " (QUANT-5)")
            + (" beside q as given (QUANT-8)" if claim.kv_only else "")
            + ("" if weights is None else f", weights rounded to {weights} (QUANT-3)")
            + clause
        ),
        f" [call: {call.describe()}]",
    )


@register("fp8-matches-reference", "QUANT-4", applies=_fp8_only, applies_on=has_float8)
def fp8_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Stored float8 values with descales far from 1, per tensor or per (batch element,
    key/value head), GQA groups, causal rows and masks: the output within QUANT-4's bound of
    the float64 attention of the real values stored × descale (QUANT-2).  A descale applied
    twice or to the wrong tensor or head, or weights rounded to float8 without declaring
    QUANT-3, is outside it."""
    _check_dense(kernel, data)


@register("fp8-cache-matches-reference", "QUANT-8", applies=_fp8_cache_only, applies_on=has_float8)
def fp8_cache_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Queries in the output dtype, as given, beside float8 keys and values with FlashInfer's
    k_scale, v_scale (per tensor as Python floats, or per batch element and key/value head):
    the output within QUANT-8's bound of the attention of q and the real keys and values.
    Queries rounded to float8 too, or k_scale applied to the values, are outside it."""
    _check_dense(kernel, data)


def _check_dense(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """One dense float8 call drawn, made and judged within QUANT-4 (QUANT-8 for a cache)."""
    call = _draw_call(data, kernel)
    out = _output(kernel, call, _keywords(kernel, call))
    _assert_within_quant4(kernel, call, out, (call.q, call.k, call.v), call.descales)


def _draw_lengths(
    data: st.DataObject, drawn: Fp8Call, bottom_right_causal: bool
) -> list[tuple[int, int]]:
    """Each sequence's (L_q, L_k) within the ``drawn`` call's ``(B, H, L, ·)`` arrays: 0 to
    its L_q queries (an empty sequence among them, VARLEN-3) on 1 to its L_k keys, at most
    L_k queries in a bottom-right causal call (every row keeps a key: QUANT-4 is stated for
    rows with keys)."""
    lengths = []
    for b in range(drawn.q.shape[0]):
        n_keys = data.draw(st.integers(1, drawn.k.shape[-2]), label=f"L_k {b}")
        most = drawn.q.shape[-2]
        most = min(most, n_keys) if bottom_right_causal else most
        lengths.append((data.draw(st.integers(0, most), label=f"L_q {b}"), n_keys))
    return lengths


def _packed(x: np.ndarray, lengths: list[int]) -> np.ndarray:
    """Sequence b's first ``lengths[b]`` positions of ``x`` ``(B, H, L, ·)``, packed as
    ``(sum lengths, H, ·)`` (VARLEN-1)."""
    return np.concatenate([np.swapaxes(x[b, :, :n], 0, 1) for b, n in enumerate(lengths)])


@register(
    "fp8-varlen-matches-reference", "QUANT-7", applies=_fp8_varlen_only, applies_on=has_float8
)
def fp8_varlen_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Packed sequences (cu_seqlens_q, cu_seqlens_k, one empty sequence at times) of stored
    float8 values whose descales differ per sequence and key/value head (or per tensor),
    GQA groups and causal rows: each sequence's rows within QUANT-4's bound of QUANT-2 on
    its own real values, stored × its own row of each descale (QUANT-7).  A kernel that
    reads every sequence's descale from row 0, or applies a descale twice in its packed
    path, is outside it."""
    declaration = kernel.declaration
    drawn = _draw_call(data, kernel, masks=False)
    bottom_right = declaration.causal_alignment == "bottom_right"
    call_lengths = _draw_lengths(data, drawn, drawn.is_causal and bottom_right)
    n_queries = [n for n, _ in call_lengths]
    n_keys = [n for _, n in call_lengths]
    call = replace(
        drawn,
        q=_packed(drawn.q, n_queries),
        k=_packed(drawn.k, n_keys),
        v=_packed(drawn.v, n_keys),
    )
    offsets_q, offsets_k = (
        np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (n_queries, n_keys)
    )
    backend = kernel.backend
    keywords = _keywords(kernel, call)
    keywords.update(
        cu_seqlens_q=backend.asarray(offsets_q), cu_seqlens_k=backend.asarray(offsets_k)
    )
    if declaration.varlen_max_seqlen:
        keywords.update(max_seqlen_q=max(n_queries), max_seqlen_k=max(n_keys))
    out = _output(kernel, call, keywords)
    for b, (n_q, n_k) in enumerate(call_lengths):
        first = int(offsets_q[b])
        rows = np.swapaxes(out[first : first + n_q], 0, 1)[None]
        stored = (
            drawn.q[b : b + 1, :, :n_q],
            drawn.k[b : b + 1, :, :n_k],
            drawn.v[b : b + 1, :, :n_k],
        )
        descales = {name: d[b : b + 1] if d.ndim == 2 else d for name, d in drawn.descales.items()}
        _assert_within_quant4(
            kernel,
            call,
            rows,
            stored,
            descales,
            f"out rows {first}..{first + n_q - 1} (sequence {b}, lengths {call_lengths})",
            f"; sequence {b}'s own row of each descale (QUANT-7)",
        )
