"""What a catalogue entry is: a buggy kernel, the property that should catch it, and a
witness input on which the bug shows against the reference (a suite ``Problem``: the one
shape an attention call's inputs have in the suite and its tests)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, SimpleNamespace
from typing import Any, NamedTuple, TypeVar

import numpy as np

from attnspec.conformance import declare
from attnspec.conformance.call.problem import Problem

C = TypeVar("C")


def witness(
    *,
    seed: int = 0,
    batch: tuple[int, ...] = (2,),
    heads: tuple[int, int] = (2, 2),
    n_queries: int = 5,
    n_keys: int = 7,
    head_dim: int = 4,
    value_dim: int = 3,
    magnitude: float = 1.0,
    dtype: str = "float64",
    **options: Any,
) -> Problem:
    """A witness: random normal q, k (times ``magnitude``) and v with Lq != Lk, E != Ev and
    a batch dim, as the suite's :class:`~attnspec.conformance.judge.kernel.Problem` (float64
    values, rounded to ``dtype`` when used)."""
    rng = np.random.default_rng(seed)
    n_q_heads, n_kv_heads = heads
    return Problem(
        q=rng.standard_normal((*batch, n_q_heads, n_queries, head_dim)) * magnitude,
        k=rng.standard_normal((*batch, n_kv_heads, n_keys, head_dim)) * magnitude,
        v=rng.standard_normal((*batch, n_kv_heads, n_keys, value_dim)),
        dtype=dtype,
        **options,
    )


@dataclass(frozen=True)
class BuggyKernel:
    """A kernel with one bug, the property id expected to catch it, and where it runs."""

    name: str
    fn: Callable[..., Any]
    catches: str
    backend: str = "numpy"
    witness: Problem = field(default_factory=witness)
    # pass the witness's q, k and v as transposed (non-contiguous) views of its values
    strided_witness: bool = False
    # Why the named property does not (yet) catch it in the quick profile; empty when it does.
    known_miss: str = ""


@dataclass(frozen=True)
class CaughtBug:
    """A buggy kernel of one of the serving families (merge, MLA, paged batch, RoPE, sinks)
    and the property that must catch it."""

    fn: Callable[..., Any]
    catches: str


# The claims of the dense catalogue kernels: a bias and grouped heads (SDPA-3.2, SDPA-6.1)
ALL: Mapping[str, Any] = MappingProxyType({"bias": True, "gqa": True})

# The spec's keywords (SDPA-1) with their defaults: the keyword-only part of a catalogue
# kernel's signature unless it names its own (``spec_kernel(keywords)``).
SPEC_KEYWORDS: Mapping[str, Any] = MappingProxyType(
    {"mask": None, "bias": None, "is_causal": False, "scale": None}
)


class _SpecArguments(NamedTuple):
    q: Any
    k: Any
    v: Any
    mask: Any = None
    bias: Any = None
    is_causal: bool = False
    scale: float | None = None


class SpecCall(_SpecArguments):
    """One call of a kernel in the spec's convention (SDPA-1): the arrays and the keywords,
    a tuple ``(q, k, v, mask, bias, is_causal, scale)``; any further keyword the kernel
    takes (``softcap``, ``dropout_p``, ``seed`` ...) is in ``extras`` and reads as an
    attribute, ``call.softcap``."""

    extras: Mapping[str, Any]

    def __new__(
        cls, *args: Any, extras: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> SpecCall:
        call = super().__new__(cls, *args, **kwargs)
        call.extras = MappingProxyType(dict(extras or {}))
        return call

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["extras"][name]
        except KeyError:
            raise AttributeError(f"this call has no keyword {name!r}") from None

    def _replace(self, /, **changes: Any) -> SpecCall:
        return SpecCall(*super()._replace(**changes), extras=self.extras)

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> SpecCall:
        """The call of these arguments by name: the spec's seven, the rest as extras."""
        spec = {name: arguments[name] for name in cls._fields if name in arguments}
        extras = {name: value for name, value in arguments.items() if name not in cls._fields}
        return cls(**spec, extras=extras)

    def pass_to(self, fn: Callable[..., Any]) -> Any:
        """``fn(q, k, v, mask=, bias=, is_causal=, scale=)``: the same call of ``fn``."""
        q, k, v, mask, bias, is_causal, scale = self
        return fn(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)


# A keyword without a default (a required keyword-only argument)
REQUIRED: Any = inspect.Parameter.empty


def required(*names: str) -> dict[str, Any]:
    """``names`` as keywords without a default, for :func:`spec_signature`."""
    return dict.fromkeys(names, REQUIRED)


def spec_signature(
    keywords: Mapping[str, Any] = SPEC_KEYWORDS,
    arrays: tuple[str, ...] = ("q", "k", "v"),
    optional: Mapping[str, Any] = MappingProxyType({}),
) -> inspect.Signature:
    """``(q, k, v, *, name=default, ...)`` for each of ``keywords``: the signature the suite
    reads off a kernel (which keywords it passes, CONF-3); ``arrays`` names the positional
    ones (a backward function's are ``q, k, v, grad_out``), and ``optional`` (names and
    defaults) any that may be passed by position after them, as some libraries take them."""
    positional = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in arrays]
    positional += [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default in optional.items()
    ]
    options = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
        for name, default in keywords.items()
    ]
    return inspect.Signature([*positional, *options])


def _arguments_binder(
    signature: inspect.Signature,
) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """``signature.bind(*args, **kwargs)``'s arguments, defaults applied, in the signature's
    order, for a signature of positional-or-keyword and keyword-only parameters (what
    :func:`spec_signature` makes): built at once where the call surely binds (not too many
    positional arguments, each keyword known and not given twice, every required one
    given), by ``Signature.bind`` itself otherwise, which raises the TypeError of a
    function with that signature.  Binding cost ~15 us a call, every catalogue kernel's
    (issue 33)."""
    parameters = list(signature.parameters.values())
    names = tuple(p.name for p in parameters)
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    defaults = {p.name: p.default for p in parameters}
    required = frozenset(p.name for p in parameters if p.default is p.empty)
    known = frozenset(names)
    if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters):
        raise TypeError(f"{signature}: only positional-or-keyword and keyword-only parameters")

    def arguments_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        n_args = len(args)
        given = positional[:n_args]
        if (
            n_args > len(positional)
            or not kwargs.keys() <= known
            or not kwargs.keys().isdisjoint(given)
            or not required <= {*given, *kwargs}
        ):
            bound = signature.bind(*args, **kwargs)  # raises what the call gets wrong
            bound.apply_defaults()
            return dict(bound.arguments)
        return {
            name: args[i] if i < n_args else kwargs.get(name, defaults[name])
            for i, name in enumerate(names)
        }

    return arguments_of


def signed(
    keywords: Mapping[str, Any],
    arrays: tuple[str, ...],
    call: Callable[[dict[str, Any]], C],
    optional: Mapping[str, Any] = MappingProxyType({}),
) -> Callable[[Callable[[C], Any]], Callable[..., Any]]:
    """A decorator: ``body(call(arguments))`` as a function with the signature
    :func:`spec_signature` makes of ``keywords``, ``arrays`` and ``optional``, written once
    here (as the library a catalogue kernel mimics writes it out).  It binds each call as a
    function with that signature would (a ``TypeError`` for an unknown or a missing
    keyword) and passes the bound arguments, defaults applied, through ``call``.  It keeps
    ``body``'s name, docstring and module, by which reports show it and worker processes
    load it."""
    signature = spec_signature(keywords, arrays, optional)
    arguments_of = _arguments_binder(signature)

    def make(body: Callable[[C], Any]) -> Callable[..., Any]:
        def function(*args: Any, **kwargs: Any) -> Any:
            return body(call(arguments_of(args, kwargs)))

        function.__name__, function.__qualname__ = body.__name__, body.__qualname__
        function.__doc__, function.__module__ = body.__doc__, body.__module__
        function.__signature__ = signature  # type: ignore[attr-defined]
        return function

    return make


def namespace(arguments: dict[str, Any]) -> SimpleNamespace:
    """A call's arguments as attributes (``call.cache_seqlens``), for :func:`signed`."""
    return SimpleNamespace(**arguments)


def spec_function(
    keywords: Mapping[str, Any] = SPEC_KEYWORDS, arrays: tuple[str, ...] = ("q", "k", "v")
) -> Callable[[Callable[[SpecCall], Any]], Callable[..., Any]]:
    """:func:`signed` with the arguments as a :class:`SpecCall` (every argument besides
    the spec's seven in ``call.extras``)."""
    return signed(keywords, arrays, SpecCall.of)


# Why this parallels conformance/kernels/convention.py (the known kernels' signatures as
# data) instead of using it: the catalogue stands in for kernels written by others, which
# import nothing of the suite's internals, and the oracle depends on nothing of the suite.
def spec_kernel(
    keywords: Mapping[str, Any] = SPEC_KEYWORDS, /, **claims: Any
) -> Callable[[Callable[[SpecCall], Any]], Callable[..., Any]]:
    """A decorator: ``body(call)`` as a kernel declared with ``claims`` that has the
    signature ``fn(q, k, v, *, mask=None, bias=None, is_causal=False, scale=None)``, or
    ``keywords`` (names and defaults) instead of those four (:func:`spec_function`)."""

    def make(body: Callable[[SpecCall], Any]) -> Callable[..., Any]:
        return declare(spec_function(keywords)(body), **claims)

    return make
