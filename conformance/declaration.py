"""What a kernel claims beyond the minimal interface (CONF-3).

The minimal interface is the spec's: ``fn(q, k, v, *, mask=None, is_causal=False,
scale=None) -> out`` in the layout of SDPA-1.1.  Anything else — an additive bias, GQA,
the causal alignment, returned weights, a sparse pattern, a linear feature map — is
declared once, with :func:`declare` or a :class:`KernelDeclaration`, and mirrored by
the CLI's flags.  Properties a kernel does not claim are reported "not applicable".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends import FLOAT_DTYPE_NAMES
from ..reference.masks import CAUSAL_ALIGNMENTS

ATTRIBUTE = "__attnspec__"


@dataclass(frozen=True)
class SparseClaim:
    """The kernel computes attention restricted to one spec pattern (spec/sparse.md).

    ``params`` are the pattern's parameters as ``attnspec.reference.sparse_mask`` takes
    them; with ``pass_params`` the kernel receives them as keyword arguments on every
    call, otherwise they are baked into the kernel.
    """

    pattern: str
    params: Mapping[str, Any] = field(default_factory=dict)
    alignment: str = "top_left"
    causal: bool = False
    pass_params: bool = False


@dataclass(frozen=True)
class LinearClaim:
    """The kernel is kernelized (linear) attention with this feature map (spec/linear.md).

    ``feature_map`` is ``"elu+1"``, ``"relu"``, ``"favor+"`` or a callable phi.  A
    FAVOR+ kernel draws ``num_features`` random features from the integer it receives
    as ``seed_keyword``.
    """

    feature_map: str | Callable[[Any], Any]
    num_features: int | None = None
    orthogonal: bool = True
    seed_keyword: str = "seed"
    eps: float = 0.0
    causal_alignment: str = "top_left"


@dataclass(frozen=True)
class KernelDeclaration:
    """Everything the suite needs to know to call a kernel and judge it."""

    dtypes: tuple[str, ...] | None = None
    # exactly this many leading batch dims (1 for (B, H, L, E) kernels); None: any (SDPA-1.2)
    batch_ndim: int | None = None
    # the kernel needs Ev == E (FlashAttention 2, JAX): the suite pads with exact zeros
    equal_head_dims: bool = False
    mask: bool = True
    causal: bool = True
    causal_alignment: str = "top_left"
    scale: bool = True
    bias: bool = False
    mask_and_causal: bool = True
    gqa: bool = False
    returns_weights: bool = False
    empty_rows_zero: bool = True
    mask_keyword: str = "mask"
    bias_keyword: str = "bias"
    gqa_keyword: str | None = None
    extra_kwargs: Mapping[str, Any] = field(default_factory=dict)
    sparse: SparseClaim | None = None
    linear: LinearClaim | None = None

    def __post_init__(self) -> None:
        if self.dtypes is not None:
            unknown = [d for d in self.dtypes if d not in FLOAT_DTYPE_NAMES]
            if unknown or not self.dtypes:
                raise ValueError(
                    f"dtypes={self.dtypes!r}, but should be a non-empty subset of "
                    f"{FLOAT_DTYPE_NAMES}"
                )
        if self.batch_ndim is not None and (
            isinstance(self.batch_ndim, bool) or not isinstance(self.batch_ndim, int)
            or not 0 <= self.batch_ndim <= 4
        ):
            raise ValueError(f"batch_ndim={self.batch_ndim!r}, but should be None or 0..4")
        alignments = [self.causal_alignment]
        if self.sparse is not None:
            alignments.append(self.sparse.alignment)
        if self.linear is not None:
            alignments.append(self.linear.causal_alignment)
        for alignment in alignments:
            if alignment not in CAUSAL_ALIGNMENTS:
                raise ValueError(
                    f"causal_alignment={alignment!r}, but should be one of {CAUSAL_ALIGNMENTS}"
                )

    @property
    def family(self) -> str:
        """"dense", "sparse" or "linear": which family of properties applies."""
        if self.sparse is not None:
            return "sparse"
        return "linear" if self.linear is not None else "dense"

    @property
    def bias_shares_mask_argument(self) -> bool:
        """True when mask and bias travel in one argument (PyTorch's float attn_mask)."""
        return self.bias and self.mask and self.bias_keyword == self.mask_keyword


def declare(fn: Callable[..., Any] | None = None, /, **claims: Any) -> Any:
    """Attach a :class:`KernelDeclaration` to a kernel; usable bare or with claims.

    >>> @declare(bias=True, gqa=True, causal_alignment="bottom_right")
    ... def my_attention(q, k, v, *, mask=None, bias=None, is_causal=False, scale=None): ...
    """
    declaration = KernelDeclaration(**claims)

    def attach(kernel: Callable[..., Any]) -> Callable[..., Any]:
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
        p.name for p in parameters
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
    """The kernel's declaration: attached, known (see ``known_kernels``), or inferred."""
    from .known_kernels import known_declaration

    declaration = getattr(fn, ATTRIBUTE, None)
    if declaration is None:
        declaration = known_declaration(fn)
    if declaration is None:
        declaration = infer_declaration(fn)
    if not isinstance(declaration, KernelDeclaration):
        raise TypeError(f"{ATTRIBUTE} of the kernel should be a KernelDeclaration")
    return replace(declaration, **overrides) if overrides else declaration
