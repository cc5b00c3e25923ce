"""A known kernel's signature written once, as data: the argument names and defaults of
its library's convention.

The suite reads a kernel's signature (the keywords it passes, CONF-3; the pre-flight binds
the call against it), so each adapter keeps its library's names and defaults
(``attn_mask`` by position, ``is_causal=`` by keyword, ...).  :func:`convention` makes that
signature from the names, binds every call to it as a function with that signature would
(a ``TypeError`` for an unknown or missing argument), and gives the adapter's body the
arguments as one namespace: ``call.q``, ``call.attn_mask``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType, SimpleNamespace
from typing import Any, TypeVar

R = TypeVar("R")

#: The default of an argument without one (a keyword-only argument the call must give).
REQUIRED = inspect.Parameter.empty

_NONE: Mapping[str, Any] = MappingProxyType({})

#: The spec's keywords and their defaults (SDPA-1, with an additive bias): the dense call
#: ``fn(q, k, v, *, mask=None, bias=None, is_causal=False, scale=None)``.
SPEC_KEYWORDS: Mapping[str, Any] = MappingProxyType(
    {"mask": None, "bias": None, "is_causal": False, "scale": None}
)


def convention_signature(
    arrays: Sequence[str], optional: Mapping[str, Any], keywords: Mapping[str, Any]
) -> inspect.Signature:
    """``(ARRAYS, OPTIONAL=default, ..., *, KEYWORDS=default, ...)``."""
    by_position = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature(
        [
            *(inspect.Parameter(name, by_position) for name in arrays),
            *(inspect.Parameter(n, by_position, default=d) for n, d in optional.items()),
            *(
                inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
                for n, d in keywords.items()
            ),
        ]
    )


def convention(
    arrays: Sequence[str] = ("q", "k", "v"),
    optional: Mapping[str, Any] = _NONE,
    keywords: Mapping[str, Any] = _NONE,
    *,
    name: str | None = None,
    module: str | None = None,
) -> Callable[[Callable[[SimpleNamespace], R]], Callable[..., R]]:
    """A decorator: ``body(call)`` as a kernel with the signature ``(ARRAYS, OPTIONAL=...,
    *, KEYWORDS=...)``: the ``arrays`` by position or keyword, then the ``optional``
    arguments by position or keyword and the ``keywords`` by keyword only, each with its
    default (:data:`REQUIRED`: none).  The kernel keeps ``body``'s docstring, and its name
    and module unless ``name`` and ``module`` are given (a kernel a factory makes is named
    where it is bound, so that reports show it and worker processes load it by that
    name)."""
    signature = convention_signature(arrays, optional, keywords)

    def make(body: Callable[[SimpleNamespace], R]) -> Callable[..., R]:
        def kernel(*args: Any, **kwargs: Any) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return body(SimpleNamespace(**bound.arguments))

        kernel.__name__ = body.__name__ if name is None else name
        kernel.__qualname__ = body.__qualname__ if name is None else name
        kernel.__module__ = body.__module__ if module is None else module
        kernel.__doc__ = body.__doc__
        kernel.__signature__ = signature  # type: ignore[attr-defined]
        return kernel

    return make
