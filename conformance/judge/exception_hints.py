"""Hints for an exception a kernel raised: what the exception says about the call.

A kernel that raises on a keyword it does not take, on arrays of another library than the
one it was written for, or on a dtype it does not support raises on every example, and
every property fails with the same exception; the hint says which flag declares the
kernel as it is.  (:mod:`.hints` has the hints found by reading the signature or calling
the kernel again.)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration
from ..claims.table import suite_keywords
from .failures import NamedBackend


class RaisingKernel(Protocol):
    """What a hint reads off the kernel that raised: its claims, backend and function."""

    @property
    def declaration(self) -> KernelDeclaration: ...

    @property
    def backend(self) -> NamedBackend: ...

    @property
    def fn(self) -> Callable[..., Any]: ...


def raised_hint(exc: BaseException, kernel: RaisingKernel, problem: Problem | None = None) -> str:
    """A hint for an exception the kernel raised on ``problem``: a keyword it does not take
    (for kernels whose signature the pre-flight could not read), arrays of the wrong
    library, or a dtype it does not support."""
    match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if match:
        because = suite_keywords(kernel.declaration).get(match.group(1))
        if because:
            return (
                f"the kernel does not take {match.group(1)}=, which the suite passes "
                f"because the declaration says {because}"
            )
    return _other_library_hint(exc, kernel) or _dtype_hint(exc, problem)


# Words by which an exception names an array library's own array type.
_ARRAY_TYPE_WORDS = {
    "numpy": ("ndarray",),
    "torch": ("Tensor",),
    "jax": ("jax", "Array"),
    "cupy": ("cupy",),
    "array_api_strict": ("array_api_strict",),
}


def _other_library_hint(exc: BaseException, kernel: RaisingKernel) -> str:
    """``--backend X`` when the kernel's module uses one array library X other than the
    backend's and the kernel raised on the backend's arrays (a torch kernel checked on
    the default backend, NumPy): its module does not use the backend's library at all, or
    the exception names the backend's array type ("must be Tensor, not numpy.ndarray")."""
    backend = kernel.backend.name
    used = array_libraries_used(kernel.fn)
    others = sorted(used - {backend})
    if len(others) != 1:
        return ""
    if backend in used and not any(word in str(exc) for word in _ARRAY_TYPE_WORDS[backend]):
        return ""
    return (
        f"the kernel's module uses {others[0]} and the kernel raised on {backend} arrays: "
        f"if it takes {others[0]} arrays, check it on them with --backend {others[0]} (the "
        f"default backend is numpy; ATTNSPEC_BACKEND sets another)"
    )


def array_libraries_used(fn: Callable[..., Any]) -> set[str]:
    """The array libraries (of _ARRAY_TYPE_WORDS) whose modules or functions the module
    defining ``fn`` holds as globals (``import torch``, ``from jax import numpy``, ...); for a
    kernel in its own process, what that process read off it when it loaded it."""
    known = getattr(fn, "attnspec_libraries_used", None)
    if known is not None:
        return set(known)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    used = set()
    for value in vars(module).values() if module is not None else ():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", "")
        if isinstance(name, str):
            library = library_of_module(name)
            if library in _ARRAY_TYPE_WORDS:
                used.add(library)
    return used


# How libraries name the dtypes in their messages, beyond the dtype's own name.
_DTYPE_ALIASES = {
    "float16": ("half",),
    "bfloat16": (),
    "float32": (),
    "float64": ("double",),
}


def _dtype_hint(exc: BaseException, problem: Problem | None) -> str:
    """``--dtype`` when the kernel raised on a problem of a dtype its message names (its
    own "only float32 is supported", torch's "Half" or "BFloat16"): SDPA-1.4 lets a kernel
    support fewer dtypes, declared (CONF-3)."""
    if problem is None or problem.dtype not in _DTYPE_ALIASES:
        return ""
    words = set(re.findall(r"[a-z0-9]+", str(exc).lower()))
    names = (problem.dtype, *_DTYPE_ALIASES[problem.dtype])
    if not words.intersection(names):
        return ""
    return (
        f"the kernel raised on {problem.dtype} inputs, and its message names that dtype: if "
        f"it does not support {problem.dtype}, declare the dtypes it does (SDPA-1.4 allows "
        f"fewer), e.g. --dtype float32"
    )


def library_of_module(name: str) -> str:
    """The array library a module of that name belongs to (jaxlib's are JAX's)."""
    top = name.split(".")[0]
    return "jax" if top == "jaxlib" else top
