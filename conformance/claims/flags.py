"""The command-line flags of the claims and how their values are read (CONF-3).

A :class:`Flag` is one option of ``attnspec check``; the pytest plugin adds the same ones
as ``--attnspec-*``, and a rerun command writes them back (:meth:`Flag.tokens`).  The
values of ``KEY=VALUE`` and comma-list flags are read here, and a bad one is a
:class:`UsageError`: one line, exit status 2 on the command line, a usage error in pytest.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: A flag's parsed value by its ``dest`` (None, or False for a switch, when not given).
Getter = Callable[[str], Any]


class UsageError(ValueError):
    """A bad flag value: reported as one line (CLI exit status 2, pytest usage error)."""


def literal(text: str) -> Any:
    """A flag value: a Python/JSON literal (3, 0.5, True, [1, 2], null) or else the string."""
    lowered = {"true": True, "false": False, "null": None, "none": None}
    if text.lower() in lowered:
        return lowered[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def key_values(pairs: list[str] | None, option: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` as ``{"a": 1, "b": "x"}``; UsageError naming ``option`` otherwise."""
    result: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"{option} {pair!r}, but should be KEY=VALUE")
        result[key.strip()] = literal(value)
    return result


def comma_list(values: str | Iterable[str] | None) -> list[str] | None:
    """Repeated and comma-separated values as one list (None when none was given); one
    string is one comma-separated value ("a,b"), not its characters."""
    if not values:
        return None
    if isinstance(values, str):
        values = [values]
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def alignment_name(text: str) -> str:
    """A causal alignment as typed (``bottom-right``) in the spec's spelling (``bottom_right``)."""
    return text.replace("-", "_")


@dataclass(frozen=True)
class Flag:
    """One command-line option; the CLI adds it as is, the pytest plugin with ``--attnspec-``."""

    option: str
    help: str
    kind: str = "value"  # value | list | switch (store_true) | bool (--x/--no-x)
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] = str
    metavar: str | None = None
    rerun: bool = True  # a rerun command repeats it

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser | Any) -> None:
        """Add to an argparse parser (or group) under its own name, ``--x/--no-x`` for bools."""
        if self.kind == "bool":
            parser.add_argument(
                self.option, action=argparse.BooleanOptionalAction, default=None, help=self.help
            )
        elif self.kind == "switch":
            parser.add_argument(self.option, action="store_true", help=self.help)
        else:
            parser.add_argument(
                self.option,
                action="append" if self.kind == "list" else "store",
                choices=self.choices,
                type=self.type,
                metavar=self.metavar,
                help=self.help,
            )

    def add_prefixed(self, group: Any, prefix: str) -> None:
        """Add to a pytest option group as ``--PREFIX-x`` (and ``--PREFIX-no-x``), dest
        ``PREFIX_x``: pytest's parser has no ``--no-`` variant of its own."""
        name, dest = f"--{prefix}-{self.option[2:]}", f"{prefix}_{self.dest}"
        if self.kind == "bool":
            group.addoption(
                name, action="store_const", const=True, default=None, dest=dest, help=self.help
            )
            group.addoption(
                f"--{prefix}-no-{self.option[2:]}",
                action="store_const",
                const=False,
                dest=dest,
                help=f"the opposite of {name}",
            )
        elif self.kind == "switch":
            group.addoption(name, action="store_true", default=False, dest=dest, help=self.help)
        else:
            group.addoption(
                name,
                action="append" if self.kind == "list" else "store",
                default=None,
                choices=self.choices,
                type=self.type,
                metavar=self.metavar,
                dest=dest,
                help=self.help,
            )

    def tokens(self, value: Any, prefix: str | None = None) -> list[str]:
        """The command-line tokens that give this flag ``value`` (none for the default)."""
        option = self.option if prefix is None else f"--{prefix}-{self.option[2:]}"
        if value is None or (value is False and self.kind == "switch"):
            return []
        if self.kind == "bool":
            negative = (
                f"--no-{self.option[2:]}" if prefix is None else f"--{prefix}-no-{self.option[2:]}"
            )
            return [option if value else negative]
        if self.kind == "switch":
            return [option]
        if self.kind == "list":
            return [token for item in value for token in (option, str(item))]
        if isinstance(
            value, tuple
        ):  # a comma list read by ``type`` (--fp8, --paged-batch-features)
            return [option, ",".join(str(item) for item in value)]
        return [option, str(value)]
