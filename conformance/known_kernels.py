"""Declarations of well-known third-party kernels, so they check with no configuration.

Each entry states what the library documents; the suite then verifies it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .declaration import KernelDeclaration


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


# Failures of well-known kernels confirmed by hand against the float64 oracle and written up
# in docs/divergences.md; the demo reports them as such instead of as unexplained failures.
_CAUSAL_SCALE_ZERO = "docs/divergences.md#torch-causal-scale-zero"
_TORCH_SDPA_DIVERGENCES = {
    "nan-propagates": "docs/divergences.md#torch-nan-query (pytorch #141128)",
    "mask-broadcast": "docs/divergences.md#torch-1d-mask",
    # the quick profile's "causal with scale 0" combination meets it in these three
    "matches-reference": _CAUSAL_SCALE_ZERO,
    "output-in-value-hull": _CAUSAL_SCALE_ZERO,
    "layout-independence": _CAUSAL_SCALE_ZERO,
    "masked-nonfinite-ignored": "docs/divergences.md#torch-masked-nan (pytorch #101967)",
}
_DIVERGENCES: dict[str, dict[str, str]] = {
    "torch.nn.functional.scaled_dot_product_attention": _TORCH_SDPA_DIVERGENCES,
    "torch._C._nn.scaled_dot_product_attention": _TORCH_SDPA_DIVERGENCES,
    "attnspec.conformance.torch_kernels.sdpa_math": {
        "masked-nonfinite-ignored": _TORCH_SDPA_DIVERGENCES["masked-nonfinite-ignored"],
    },
    "attnspec.conformance.torch_kernels.sdpa_flash": {
        "nan-propagates": _TORCH_SDPA_DIVERGENCES["nan-propagates"],
        "masked-nonfinite-ignored": _TORCH_SDPA_DIVERGENCES["masked-nonfinite-ignored"],
        "matches-reference": _CAUSAL_SCALE_ZERO,
        "rows-sum-to-one": _CAUSAL_SCALE_ZERO,
        "output-in-value-hull": _CAUSAL_SCALE_ZERO,
        "causal-alignment": _CAUSAL_SCALE_ZERO,
        "layout-independence": "docs/divergences.md#torch-flash-strided",
    },
}


def known_divergences(fn: Any) -> dict[str, str]:
    """Property id -> where the confirmed divergence of this kernel is written up."""
    return dict(_DIVERGENCES.get(qualified_name(fn), {}))
