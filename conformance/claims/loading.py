"""Loading a kernel from a ``MODULE:FUNC`` or ``path/to/file.py:FUNC`` target.

Below the claims (``--linear MODULE:FUNC`` loads a feature map) and the known kernels
(their adapters are targets), so both can load without importing the kernel under test.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class KernelLoadError(ValueError):
    """``MODULE:FUNC`` or ``path.py:FUNC`` does not name a usable kernel."""


@contextlib.contextmanager
def on_sys_path(directory: str) -> Iterator[None]:
    """``directory`` first on ``sys.path`` inside the block (unless it already was there)."""
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    try:
        yield
    finally:
        if added and directory in sys.path:
            sys.path.remove(directory)


def load_kernel(target: str) -> Callable[..., Any]:
    """Import ``MODULE:FUNC`` (dots allowed in FUNC) or ``path/to/file.py:FUNC``."""
    module_part, sep, attribute = target.rpartition(":")
    if not sep or not module_part or not attribute:
        raise KernelLoadError(f"kernel {target!r} should be MODULE:FUNC or path/to/file.py:FUNC")
    try:
        if module_part.endswith(".py"):
            path = Path(module_part)
            if not path.is_file():
                raise KernelLoadError(f"kernel file {str(path)!r} does not exist")
            name = f"attnspec_kernel_{abs(hash(str(path.resolve())))}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[name] = module
            # the file imports its siblings as when run as a script
            with on_sys_path(str(path.resolve().parent)):
                spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(module_part)
    except KernelLoadError:
        raise
    except Exception as exc:
        raise KernelLoadError(
            f"module {module_part!r} does not import: {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise KernelLoadError(f"{module_part!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise KernelLoadError(f"{target!r} is a {type(obj).__name__}, not a callable kernel")
    kernel: Callable[..., Any] = obj  # callable, checked above
    return kernel
