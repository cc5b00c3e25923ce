"""attnspec: the reference definition of attention.

A versioned spec (``spec/``), one reference implementation written against the Python
Array API (:mod:`attnspec.reference`), and a property-based conformance suite
(:mod:`attnspec.conformance`) that checks anyone's kernel clause by clause.

May import: reference, _version.
"""

# the facade: the backend selection and the reference's entry points, by the names their
# own packages export (tests import them from there too)
from ._version import SPEC_VERSION, __version__  # noqa: F401 (re-exported)
from .backends import (
    Backend,
    BackendError,
    available_backends,
    get_backend,
    set_backend,
    use_backend,
)
from .reference import (
    CAUSAL_ALIGNMENTS,
    apply_rope,
    causal_mask,
    multi_head_attention,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
)

__all__ = [
    "CAUSAL_ALIGNMENTS",
    "SPEC_VERSION",
    "Backend",
    "BackendError",
    "apply_rope",
    "available_backends",
    "causal_mask",
    "get_backend",
    "multi_head_attention",
    "padding_mask",
    "scaled_dot_product_attention",
    "set_backend",
    "sinusoidal_positional_encoding",
    "use_backend",
]
