"""A set of keywords that a family of public functions shares, written once.

The recurrences and their bounds take the same spec keywords beside their own arguments, as
the sparse masks take the same placement keywords.  Such a set is a ``TypedDict`` (the
names and types, which a type checker checks at every call of a function that takes
``**keywords: Unpack[TheSet]``) and one table of its defaults; :func:`shows_keywords` makes
the function show them: help() and ``inspect.signature`` list each keyword with its default
in place of ``**keywords``, and a call that signature refuses (a keyword outside it, a
required one missing) raises the ``TypeError`` Python raises for an explicit signature.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, NamedTuple, ParamSpec, TypedDict, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def shows_keywords(
    keywords: type, defaults: Mapping[str, Any]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function whose last parameter is ``**name: Unpack[keywords]`` (a
    ``TypedDict`` class).  Its keys become keyword-only parameters of the signature shown,
    after the function's own keyword-only parameters without a default and before those
    with one; a required key has no default, an optional one ``defaults.get(name)``: what
    the function uses for it when it is not passed (``defaults`` may name keys of other
    sets as well).  A required key is one of a ``total=True`` base class: ``Required[...]``
    is not seen at run time under ``from __future__ import annotations``."""
    required = keywords.__required_keys__  # type: ignore[attr-defined]
    shown = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if name in required else defaults.get(name),
            # as written (TypedDict wraps a string in a ForwardRef), like the function's own
            annotation=getattr(a, "__forward_arg__", a),
        )
        for name, a in keywords.__annotations__.items()
    ]

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)
        *own, rest = signature.parameters.values()
        if rest.kind is not inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{function.__name__} should end in **keywords: Unpack[...]")
        cut = sum(p.kind is not p.KEYWORD_ONLY or p.default is p.empty for p in own)
        shown_signature = signature.replace(parameters=[*own[:cut], *shown, *own[cut:]])
        arity = _Arity.of(shown_signature)

        @functools.wraps(function)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            # Signature.bind costs ~10 us, as much as a small problem's arithmetic: it runs
            # only for a call the quick look cannot pass, to say what the call gets wrong
            if not arity.binds(len(args), kwargs):
                try:  # what the signature shown refuses: an unknown keyword, a missing one, ...
                    shown_signature.bind(*args, **kwargs)
                except TypeError as refused:
                    raise TypeError(f"{function.__name__}() {refused}") from None
            return function(*args, **kwargs)

        checked.__signature__ = shown_signature  # type: ignore[attr-defined]
        return checked

    return decorate


class _Arity(NamedTuple):
    """What a signature without ``*args`` and ``**kwargs`` lets a call pass."""

    positional: tuple[str, ...]
    by_keyword: frozenset[str]
    required: frozenset[str]

    @classmethod
    def of(cls, signature: inspect.Signature) -> _Arity:
        parameters = signature.parameters.values()
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            return cls((), frozenset(), frozenset({""}))  # binds nothing: bind decides
        return cls(
            tuple(
                p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ),
            frozenset(p.name for p in parameters if p.kind is not p.POSITIONAL_ONLY),
            frozenset(p.name for p in parameters if p.default is p.empty),
        )

    def binds(self, n_args: int, keywords: Mapping[str, object]) -> bool:
        """Whether ``n_args`` positional arguments and ``keywords`` surely bind: not too
        many, each keyword known and not given twice, every required one given."""
        given = set(self.positional[:n_args])
        return (
            n_args <= len(self.positional)
            and keywords.keys() <= self.by_keyword
            and given.isdisjoint(keywords)
            and self.required <= given | keywords.keys()
        )


class Creation(TypedDict, total=False):
    """Where a function that makes an array from nothing makes it: ``xp`` and ``device``,
    default the backend's (``masks.creation_namespace``)."""

    xp: ModuleType | None
    device: Any


shows_creation = shows_keywords(Creation, {})
