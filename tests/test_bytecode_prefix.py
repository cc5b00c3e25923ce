"""The bytecode prefix of the processes tests start is filled from the installed bytecode
(tests/bytecode_prefix.py; issue 33: a clean clone's children compiled the libraries from
source).  Shown by what a fresh interpreter imports, never by timing: a module whose
linked bytecode says one thing and whose source (same size and time) says another."""

from __future__ import annotations

import os
import py_compile
import sys
from pathlib import Path

import bytecode_prefix
import pytest
from support import run_python

PROBE = "seeded_probe"


def installed_bytecode(tree: Path, variant: str = "") -> Path:
    return tree / "__pycache__" / f"{PROBE}.{sys.implementation.cache_tag}{variant}.pyc"


def installed_tree(root: Path) -> Path:
    """A library tree holding ``seeded_probe.py`` and its bytecode, whose source then
    says VALUE = 2 with the size and time of the VALUE = 1 the bytecode was made from."""
    tree = root / "installed"
    tree.mkdir()
    source = tree / f"{PROBE}.py"
    source.write_text("VALUE = 1\n")
    # timestamp-checked, like pip's; in the library's own __pycache__ whatever prefix
    # this process has
    py_compile.compile(str(source), cfile=str(installed_bytecode(tree)), doraise=True)
    stat = source.stat()
    source.write_text("VALUE = 2\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return tree


def probe_value_under_prefix(tree: Path, prefix: Path) -> str:
    """What a fresh interpreter with ``PYTHONPYCACHEPREFIX=prefix`` imports as VALUE."""
    done = run_python(
        f"import {PROBE}; print({PROBE}.VALUE)",
        cwd=tree,
        env={"PYTHONPYCACHEPREFIX": str(prefix)},
        unset=["PYTHONDONTWRITEBYTECODE"],
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_filled_prefix_gives_children_the_installed_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The importer under a prefix reads the linked bytecode (VALUE 1), where an empty
    prefix compiles the source (VALUE 2); the optimised variants are left out, and a
    second fill is skipped by its marker."""
    tree = installed_tree(tmp_path)
    assert probe_value_under_prefix(tree, tmp_path / "empty") == "2"
    optimised = installed_bytecode(tree, ".opt-1")
    py_compile.compile(str(tree / f"{PROBE}.py"), cfile=str(optimised), optimize=1)
    monkeypatch.setattr(bytecode_prefix.sysconfig, "get_path", lambda name: str(tree))
    prefix = tmp_path / "prefix"
    assert bytecode_prefix.prefix_filled_from_installed_bytecode(prefix) == 1
    assert probe_value_under_prefix(tree, prefix) == "1"
    assert bytecode_prefix.prefix_filled_from_installed_bytecode(prefix) == 0
