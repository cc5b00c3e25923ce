"""The reference implementation: pure Python Array API, one module per spec area.

May import: backends.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the reference's entry points, each from the module that defines it
    from ._array import Array
    from .attention import scaled_dot_product_attention
    from .backward import (
        Gradients,
        blocked_attention_backward,
        scaled_dot_product_attention_backward,
        varlen_attention_backward,
    )
    from .blocked import blocked_attention, default_block_sizes
    from .favor import favor_attention, favor_feature_map, favor_projection
    from .features import alibi_slopes
    from .kv_cache import append_to_cache, kv_cache_attention
    from .linear import elu_plus_one, linear_attention, relu_features
    from .masks import CAUSAL_ALIGNMENTS, causal_mask, padding_mask
    from .mha import multi_head_attention
    from .positional import apply_rope, sinusoidal_positional_encoding
    from .recurrent import recurrent_attention, varlen_recurrent_attention
    from .sdpa import plain_attention
    from .sparse import (
        LIBRARY_WINDOWS,
        PATTERN_NAMES,
        bigbird_mask,
        block_sparse_attention,
        block_sparse_mask,
        fixed_mask,
        library_window,
        longformer_mask,
        sliding_window_mask,
        sparse_attention,
        sparse_mask,
        strided_mask,
    )
    from .varlen import varlen_attention

__all__ = [
    "CAUSAL_ALIGNMENTS",
    "LIBRARY_WINDOWS",
    "PATTERN_NAMES",
    "Array",
    "Gradients",
    "alibi_slopes",
    "append_to_cache",
    "apply_rope",
    "bigbird_mask",
    "block_sparse_attention",
    "block_sparse_mask",
    "blocked_attention",
    "blocked_attention_backward",
    "causal_mask",
    "default_block_sizes",
    "elu_plus_one",
    "favor_attention",
    "favor_feature_map",
    "favor_projection",
    "fixed_mask",
    "kv_cache_attention",
    "library_window",
    "linear_attention",
    "longformer_mask",
    "multi_head_attention",
    "padding_mask",
    "plain_attention",
    "recurrent_attention",
    "relu_features",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "sinusoidal_positional_encoding",
    "sliding_window_mask",
    "sparse_attention",
    "sparse_mask",
    "strided_mask",
    "varlen_attention",
    "varlen_attention_backward",
    "varlen_recurrent_attention",
]

# Each name above is imported from its module at its first use (PEP 562), and so is a
# submodule (``attnspec.reference.tolerance``): a process that needs a few names only
# does not import the whole reference.  The conformance suite's declarations read
# CAUSAL_ALIGNMENTS and the RoPE layouts from here (conformance/claims/validation.py), so
# the kernel's own process of a check (conformance/run/kernel_process.py) and the
# ``attnspec`` command imported every module of the reference for them, ~30 ms of CPU a
# process (issue 33).
_HOME = {
    name: module
    for module, names in (
        ("._array", "Array"),
        (".attention", "scaled_dot_product_attention"),
        (".backward", "Gradients blocked_attention_backward"),
        (".backward", "scaled_dot_product_attention_backward varlen_attention_backward"),
        (".blocked", "blocked_attention default_block_sizes"),
        (".favor", "favor_attention favor_feature_map favor_projection"),
        (".features", "alibi_slopes"),
        (".kv_cache", "append_to_cache kv_cache_attention"),
        (".linear", "elu_plus_one linear_attention relu_features"),
        (".masks", "CAUSAL_ALIGNMENTS causal_mask padding_mask"),
        (".mha", "multi_head_attention"),
        (".positional", "apply_rope sinusoidal_positional_encoding"),
        (".recurrent", "recurrent_attention varlen_recurrent_attention"),
        (".sdpa", "plain_attention"),
        (".sparse", "LIBRARY_WINDOWS PATTERN_NAMES bigbird_mask block_sparse_attention"),
        (".sparse", "block_sparse_mask fixed_mask library_window longformer_mask"),
        (".sparse", "sliding_window_mask sparse_attention sparse_mask strided_mask"),
        (".varlen", "varlen_attention"),
    )
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    """A name of :data:`__all__` (or a submodule), imported at its first use (then kept
    here, as an eager import would have left it)."""
    if name in _HOME:
        value = getattr(import_module(_HOME[name], __name__), name)
    elif not name.startswith("__"):
        try:
            value = import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the submodule exists, and something it imports does not
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
