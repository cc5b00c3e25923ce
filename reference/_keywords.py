"""A set of keywords that a family of public functions shares, written once.

The recurrences and their bounds take the same spec keywords beside their own arguments, as
the sparse masks take the same placement keywords.  Such a set is a ``TypedDict`` (the
names and types, which a type checker checks at every call of a function that takes
``**keywords: Unpack[TheSet]``) and one table of its defaults; :func:`shows_keywords` makes
the function show them: help() and ``inspect.signature`` list each keyword with its default
in place of ``**keywords``, and a keyword outside the signature raises the ``TypeError``
Python raises for an explicit signature.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def shows_keywords(
    keywords: type, defaults: Mapping[str, Any]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function whose last parameter is ``**name: Unpack[keywords]`` (a
    ``TypedDict`` class); ``defaults`` maps those of its names whose default is not None
    to it: the values the function uses for a keyword not passed."""
    # the annotations as written (TypedDict wraps a string in a ForwardRef), as help() shows
    # those of the function's own parameters
    annotations: dict[str, Any] = {
        name: getattr(a, "__forward_arg__", a) for name, a in keywords.__annotations__.items()
    }
    if not set(defaults) <= set(annotations):
        raise ValueError(
            f"defaults names {sorted(defaults)}, but should name keywords of "
            f"{keywords.__name__}, {sorted(annotations)}"
        )
    shown = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(name), annotation=a
        )
        for name, a in annotations.items()
    ]

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)
        own = list(signature.parameters.values())
        if not own or own[-1].kind is not inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{function.__name__} should end in **keywords: Unpack[...]")
        parameters = [*own[:-1], *shown]
        names = {p.name for p in parameters}

        @functools.wraps(function)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            unknown = sorted(kwargs.keys() - names)
            if unknown:  # what the explicit signature would have refused
                raise TypeError(
                    f"{function.__name__}() got an unexpected keyword argument {unknown[0]!r}"
                )
            return function(*args, **kwargs)

        checked.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return checked

    return decorate
