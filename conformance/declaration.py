"""What a kernel claims beyond the minimal interface (CONF-3).

The minimal interface is the spec's: ``fn(q, k, v, *, mask=None, is_causal=False,
scale=None) -> out`` in the layout of SDPA-1.1.  Anything else — an additive bias, GQA,
the causal alignment, returned weights, a sparse pattern, a linear feature map — is
declared once, with :func:`declare` or a :class:`KernelDeclaration`, or with the CLI's
and the pytest plugin's flags.  Properties a kernel does not claim are reported "not
applicable"; a declaration that waives a MUST clause is named in the claim (CONF-7).
The fields, their flags and what the suite does with them are one table,
:data:`attnspec.conformance.claims.CLAIMS`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping  # noqa: F401  (field annotations name them)
from dataclasses import make_dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .claims import CLAIMS, LinearClaim, RopeClaim, SparseClaim, waived_clauses

__all__ = [
    "ATTRIBUTE",
    "KernelDeclaration",
    "LinearClaim",
    "RopeClaim",
    "SparseClaim",
    "declaration_of",
    "declare",
    "infer_declaration",
]

ATTRIBUTE = "__attnspec__"


class _DeclarationBehaviour:
    """What every :class:`KernelDeclaration` can say about itself beyond its fields."""

    if TYPE_CHECKING:  # the claims table's fields these methods read (see CLAIMS)
        rope: RopeClaim | None
        sparse: SparseClaim | None
        linear: LinearClaim | None
        varlen: bool
        kv_cache: bool
        mask: bool
        mask_keyword: str
        bias: bool
        bias_keyword: str

    def __post_init__(self) -> None:
        for claim in CLAIMS:
            problem = claim.invalid(getattr(self, claim.field)) if claim.invalid else None
            if problem:
                raise ValueError(problem)

    @property
    def family(self) -> str:
        """ "dense", "sparse", "linear", "varlen", "kv-cache" or "rope": which family of
        properties applies (the last three have their own calling conventions)."""
        if self.rope is not None:
            return "rope"
        if self.sparse is not None:
            return "sparse"
        if self.linear is not None:
            return "linear"
        if self.varlen:
            return "varlen"
        return "kv-cache" if self.kv_cache else "dense"

    @property
    def bias_shares_mask_argument(self) -> bool:
        """True when mask and bias travel in one argument (PyTorch's float attn_mask)."""
        return self.bias and self.mask and self.bias_keyword == self.mask_keyword

    @property
    def waived(self) -> tuple[str, ...]:
        """MUST clauses this declaration says the kernel does not follow (CONF-7)."""
        return waived_clauses(self)


def _docstring() -> str:
    lines = [
        "Everything the suite needs to know to call a kernel and judge it.",
        "",
        "One field per row of ``attnspec.conformance.claims.CLAIMS``:",
        "",
    ]
    for claim in CLAIMS:
        flags = ", ".join(flag.option for flag in claim.flags) or "--dtype (restricts)"
        lines.append(f"- ``{claim.field}`` (default {claim.default_value!r}; {flags})")
    return "\n".join(lines)


# Built from the claims table, so a new claim is one new row there.
KernelDeclaration: Any = make_dataclass(
    "KernelDeclaration",
    [(claim.field, claim.annotation, claim.dataclass_field()) for claim in CLAIMS],
    bases=(_DeclarationBehaviour,),
    frozen=True,
    kw_only=True,
    namespace={"__doc__": _docstring()},
)
KernelDeclaration.__module__ = __name__
"""Everything a kernel claims beyond the minimal interface (CONF-3): one keyword-only,
frozen field per row of the claims table (``attnspec.conformance.claims.CLAIMS``), e.g.
``KernelDeclaration(bias=True, gqa=True, causal_alignment="bottom_right")``; the fields,
their defaults and CLI flags are listed in the class docstring and in the guide."""


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
