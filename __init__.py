"""attnspec: the reference definition of attention.

A versioned spec (``spec/``), one reference implementation written against the Python
Array API (:mod:`attnspec.reference`), and a property-based conformance suite
(:mod:`attnspec.conformance`) that checks anyone's kernel clause by clause.

May import: reference, _version.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# the facade: the backend selection and the reference's entry points, by the names their
# own packages export (tests import them from there too).  The backends are imported here:
# a typo in ATTNSPEC_BACKEND fails ``import attnspec`` (tests/backends/test_backends.py).
from ._version import SPEC_VERSION, __version__  # noqa: F401 (re-exported)
from .backends import (
    Backend,
    BackendError,
    available_backends,
    get_backend,
    set_backend,
    use_backend,
)

if TYPE_CHECKING:
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

# The reference's names, and the reference itself (``import attnspec`` made
# ``attnspec.reference`` an attribute before), are imported at their first use (PEP 562), as
# the conformance package's facade is: a process that needs a few of the reference's
# modules only (the kernel's own process, conformance/run/kernel_process.py, and the
# ``attnspec`` command, which read the declarations' choices from it) does not import all of
# it (~30 ms of CPU a process, and a check starts three).
_HOME = {
    name: ".reference"
    for name in (
        "CAUSAL_ALIGNMENTS apply_rope causal_mask multi_head_attention padding_mask "
        "scaled_dot_product_attention sinusoidal_positional_encoding"
    ).split()
}


def __getattr__(name: str) -> Any:
    """A name of the facade from the reference (or the reference itself), imported at its
    first use (then kept here)."""
    if name == "reference":
        value: Any = import_module(".reference", __name__)
    elif name in _HOME:
        value = getattr(import_module(_HOME[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "reference"})
