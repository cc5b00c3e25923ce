"""What a kernel claims beyond the minimal interface (CONF-3).

The minimal interface is the spec's: ``fn(q, k, v, *, mask=None, is_causal=False,
scale=None) -> out`` in the layout of SDPA-1.1.  Anything else — an additive bias, GQA,
the causal alignment, returned weights, a sparse pattern, a linear feature map — is
declared once, with :func:`declare` or a :class:`KernelDeclaration`, or with the CLI's
and the pytest plugin's flags.  Properties a kernel does not claim are reported "not
applicable"; a declaration that waives a MUST clause is named in the claim (CONF-7).
Each field has a type, a default and the values it may hold (``validation.py``) and, where
keeping the default is a MUST, the clauses a non-default value waives (:data:`WAIVES`);
its flags and what the suite does with it are a row of the claims table,
:data:`attnspec.conformance.claims.table.CLAIMS`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, TypeVar, overload

# (the facade, conformance/__init__.py, imports the same claim classes: they are exported
# here beside KernelDeclaration, as the types of its fields)
from .family_claims import (
    FAMILY_CLAIMS,
    Fp8Claim,
    LinearClaim,
    MergeClaim,
    MlaClaim,
    PagedBatchClaim,
    RecurrentClaim,
    RopeClaim,
    SparseClaim,
)
from .validation import check_fields

__all__ = [
    "ATTRIBUTE",
    "WAIVES",
    "Fp8Claim",
    "KernelDeclaration",
    "LinearClaim",
    "MergeClaim",
    "MlaClaim",
    "PagedBatchClaim",
    "RecurrentClaim",
    "RopeClaim",
    "SparseClaim",
    "declaration_of",
    "declare",
    "infer_declaration",
]

ATTRIBUTE = "__attnspec__"

#: The MUST clause(s) a kernel does not follow when it declares other than the default of
#: the field (CONF-7), in field order.
WAIVES: dict[str, tuple[str, ...]] = {
    "empty_sizes": ("SDPA-1.5", "SDPA-5.2"),
    "empty_rows_zero": ("SDPA-5.1",),
}


@dataclass(frozen=True, kw_only=True)
class KernelDeclaration:
    """Everything a kernel claims beyond the minimal interface (CONF-3), e.g.
    ``KernelDeclaration(bias=True, gqa=True, causal_alignment="bottom_right")``.

    One field per row of the claims table (``attnspec.conformance.claims.table.CLAIMS``), in its
    order: the field's type and default are here (its allowed values in ``validation.py``,
    the clauses it waives in :data:`WAIVES`), its flags, the keywords it makes the suite
    pass and its words in the claim line are in the table
    (``tests/conformance/cli/test_check_claims.py`` checks that the two name the same fields).
    """

    # (fields that look alike, a claim and its keyword, are the table's rows: one each)
    dtypes: tuple[str, ...] | None = None
    batch_ndim: int | None = None
    equal_head_dims: bool = False
    equal_lengths: bool = False
    empty_sizes: bool = True
    mask: bool = True
    mask_keyword: str = "mask"
    bias: bool = False
    bias_keyword: str = "bias"
    float32_bias: bool = False
    gqa: bool = False
    gqa_keyword: str | None = None
    causal: bool = True
    causal_alignment: str = "top_left"
    mask_and_causal: bool = True
    scale: bool = True
    returns_weights: bool = False
    empty_rows_zero: bool = True
    extra_kwargs: Mapping[str, Any] = field(default_factory=dict)
    softcap: bool = False
    softcap_keyword: str = "softcap"
    alibi: bool = False
    alibi_keyword: str = "alibi_slopes"
    alibi_builtin_slopes: bool = False
    returns_lse: bool = False
    lse_keyword: str | None = None
    dropout: bool = False
    dropout_keyword: str = "dropout_p"
    dropout_seed_keyword: str = "seed"
    dropout_seeded: bool = True
    varlen: bool = False
    varlen_max_seqlen: bool = True
    varlen_mask: bool = False
    kv_cache: bool = False
    kv_cache_append: bool = True
    kv_cache_paged: bool = False
    kv_cache_block_size: int | None = None
    kv_cache_features: tuple[str, ...] = ()
    sparse: SparseClaim | None = None
    linear: LinearClaim | None = None
    rope: RopeClaim | None = None
    merge: MergeClaim | None = None
    paged_batch: PagedBatchClaim | None = None
    sinks: bool = False
    sinks_keyword: str = "sinks"
    sink_tokens: bool = False  # SINK-4: n_sink_tokens= and window= (StreamingLLM)
    chunk: bool = False  # CHUNK-1: attention_chunk= (Llama 4, FlashAttention 3)
    mla: MlaClaim | None = None
    fp8: Fp8Claim | None = None
    recurrent: RecurrentClaim | None = None
    backward: bool = False
    # "MODULE:FUNC" or the callable itself: FlashAttention's _flash_attn_backward convention
    backward_fn: str | Callable[..., Any] | None = None
    backward_dropout: bool = False  # BWD-9: the backward takes the forward's dropout indicators

    def __post_init__(self) -> None:
        check_fields((f.name, str(f.type), getattr(self, f.name)) for f in fields(self))

    @property
    def family(self) -> str:
        """ "dense", "sparse", "linear", "varlen", "kv-cache", "rope", "merge",
        "paged-batch", "mla", "fp8" or "recurrent": which family of properties applies (the
        last eight have their own calling conventions)."""
        for name, family, _ in FAMILY_CLAIMS:
            if getattr(self, name) is not None:
                return family
        if self.varlen:
            return "varlen"
        return "kv-cache" if self.kv_cache else "dense"

    @property
    def bias_shares_mask_argument(self) -> bool:
        """True when mask and bias travel in one argument (PyTorch's float attn_mask)."""
        return self.bias and self.mask and self.bias_keyword == self.mask_keyword

    def bias_dtype(self, dtype: str) -> str:
        """The dtype the kernel gets its bias in for inputs of ``dtype``: float32 for
        float16 and bfloat16 inputs where it claims ``float32_bias`` (SDPA-1.4), else
        ``dtype``."""
        if self.float32_bias and dtype in ("float16", "bfloat16"):
            return "float32"
        return dtype

    def changed(self) -> dict[str, Any]:
        """The fields whose value is not their default, in field order."""
        changed = {}
        for f in fields(self):
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if getattr(self, f.name) != default:
                changed[f.name] = getattr(self, f.name)
        return changed

    def waivers(self) -> dict[str, str]:
        """Waived clause -> the field that waives it, e.g.
        ``{"SDPA-5.1": "empty_rows_zero=False"}`` (CONF-7)."""
        changed = self.changed()
        return {
            clause: f"{name}={value!r}"
            for name, value in changed.items()
            for clause in WAIVES.get(name, ())
        }

    @property
    def waived(self) -> tuple[str, ...]:
        """MUST clauses this declaration says the kernel does not follow (CONF-7)."""
        return tuple(self.waivers())


Kernel = TypeVar("Kernel", bound=Callable[..., Any])


@overload
def declare(fn: Kernel, /, **claims: Any) -> Kernel: ...
@overload
def declare(fn: None = None, /, **claims: Any) -> Callable[[Kernel], Kernel]: ...


def declare(fn: Callable[..., Any] | None = None, /, **claims: Any) -> Any:
    """Attach a :class:`KernelDeclaration` to a kernel; usable bare or with claims.

    >>> @declare(bias=True, gqa=True, causal_alignment="bottom_right")
    ... def my_attention(q, k, v, *, mask=None, bias=None, is_causal=False, scale=None): ...
    """
    declaration = KernelDeclaration(**claims)

    def attach(kernel: Kernel) -> Kernel:
        if not callable(kernel):
            raise TypeError(f"declare() needs a callable kernel, got {type(kernel).__name__}")
        setattr(kernel, ATTRIBUTE, declaration)
        return kernel

    return attach if fn is None else attach(fn)


def _keyword_parameters(fn: Callable[..., Any]) -> set[str] | None:
    """Names ``fn`` accepts by keyword, or None when it takes ``**kwargs`` or is opaque."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def infer_declaration(fn: Callable[..., Any]) -> KernelDeclaration:
    """The declaration of a kernel that declared nothing, read off its signature.

    ``mask`` or ``attn_mask`` is the mask argument; a missing ``is_causal``/``scale``
    argument means the kernel does not claim that clause.
    """
    names = _keyword_parameters(fn)
    if names is None:
        return KernelDeclaration()
    mask_keyword = "mask" if "mask" in names or "attn_mask" not in names else "attn_mask"
    return KernelDeclaration(
        mask=mask_keyword in names,
        mask_keyword=mask_keyword,
        causal="is_causal" in names,
        scale="scale" in names,
        bias="bias" in names,
    )


def declaration_of(fn: Callable[..., Any], **overrides: Any) -> KernelDeclaration:
    """The kernel's declaration: attached, known (:func:`known_declaration`), or inferred."""

    declaration = getattr(fn, ATTRIBUTE, None)
    if declaration is None:
        declaration = known_declaration(fn)
    if declaration is None:
        declaration = infer_declaration(fn)
    if not isinstance(declaration, KernelDeclaration):
        raise TypeError(f"{ATTRIBUTE} of the kernel should be a KernelDeclaration")
    return replace(declaration, **overrides) if overrides else declaration


def torch_sdpa_declaration() -> dict[str, Any]:
    """What ``torch.nn.functional.scaled_dot_product_attention`` documents, as claims."""
    # float attn_mask is an additive bias and a bool one a mask, through one argument;
    # attn_mask together with is_causal=True raises, so that combination is not claimed.
    return {
        "mask_keyword": "attn_mask",
        "bias": True,
        "bias_keyword": "attn_mask",
        "mask_and_causal": False,
        "gqa": True,
        "gqa_keyword": "enable_gqa",
        "extra_kwargs": {"dropout_p": 0.0},
    }


def _torch_sdpa() -> KernelDeclaration:
    return KernelDeclaration(**torch_sdpa_declaration())


_KNOWN: dict[str, Callable[[], KernelDeclaration]] = {
    "torch.nn.functional.scaled_dot_product_attention": _torch_sdpa,
    "torch._C._nn.scaled_dot_product_attention": _torch_sdpa,
}


def qualified_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', None) or ''}.{getattr(fn, '__qualname__', '')}"


def known_declaration(fn: Any) -> KernelDeclaration | None:
    factory = _KNOWN.get(qualified_name(fn))
    return None if factory is None else factory()
