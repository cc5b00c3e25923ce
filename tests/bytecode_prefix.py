"""The bytecode prefix of the processes tests start, filled from the installed bytecode.

With ``PYTHONPYCACHEPREFIX`` set (conftest sets it for the processes the tests start, to
keep ``__pycache__`` out of the tree), Python reads bytecode from the prefix only, never
from a library's own ``__pycache__``: in a clean clone, whose prefix is empty, the first
processes to import torch, SymPy, JAX, Hypothesis, NumPy and the standard library compiled
them from source (torch, NumPy and Hypothesis 3.7 CPU-s against 1.4 with bytecode, JAX 2.5
against 1.05), and two such processes at once each did.  Linking the installed bytecode
into the prefix's layout first gives them what the libraries ship; the bytecode stays
valid against its source (the importer checks the source's time and size as usual), and
a file Python rewrites is replaced, not written through the link.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

# Parts of the standard library that no test's process imports.
_UNUSED_STDLIB_PARTS = frozenset(
    {"site-packages", "test", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo"}
)


def _link_bytecode(tree: str, prefix: Path, skipped: frozenset[str]) -> int:
    """Link every ``__pycache__/NAME.<cache tag>.pyc`` under ``tree`` (no optimised
    variants) to where the importer looks for it under ``prefix``; returns how many."""
    suffix = f".{sys.implementation.cache_tag}.pyc"
    linked = 0
    for directory, subdirectories, files in os.walk(tree):
        subdirectories[:] = [name for name in subdirectories if name not in skipped]
        if os.path.basename(directory) != "__pycache__":
            continue
        names = [name for name in files if name.endswith(suffix) and name.count(".") == 2]
        if not names:
            continue
        # the prefix mirrors the source's absolute directory (sys.pycache_prefix's layout)
        target = prefix / os.path.dirname(directory).lstrip(os.sep)
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            try:
                os.link(os.path.join(directory, name), target / name)
            except FileExistsError:
                continue
            except OSError:  # another file system, or links not allowed: nothing gained
                return linked
            linked += 1
    return linked


def prefix_filled_from_installed_bytecode(prefix: Path) -> int:
    """Fill ``prefix`` once with links to the standard library's and the environment's
    bytecode; a marker file makes later runs skip the walk (0.3 CPU-s).  Returns how
    many files were linked (0 when the marker was there)."""
    marker = prefix / f".filled-{sys.implementation.cache_tag}"
    if marker.exists():
        return 0
    linked = _link_bytecode(sysconfig.get_path("stdlib"), prefix, _UNUSED_STDLIB_PARTS)
    for tree in {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}:
        linked += _link_bytecode(tree, prefix, frozenset())
    marker.touch()
    return linked
