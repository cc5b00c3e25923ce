"""Keeping a check's side effects where they belong: the kernel's printing away from the
verdict table, and Hypothesis's cache files out of the user's working directory."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import TextIO

# file descriptors kernel output is routed to by the kernel_output_to blocks in force
_OUTPUT_DESCRIPTORS: list[int] = []
# Hypothesis's storage directories of the hypothesis_storage_elsewhere blocks in force
_STORAGE_DIRECTORIES: list[str] = []
STORAGE_VARIABLE = "HYPOTHESIS_STORAGE_DIRECTORY"


def kernel_output_fd() -> int:
    """Where a kernel's worker process should print: the descriptor of the innermost
    :func:`kernel_output_to` block's stream, else stderr (2), never the table's stdout."""
    return _OUTPUT_DESCRIPTORS[-1] if _OUTPUT_DESCRIPTORS else 2


@contextlib.contextmanager
def kernel_output_to(stream: TextIO | None) -> Iterator[None]:
    """Inside the block, what the kernel prints (and the warnings it raises) goes to
    ``stream`` (None: nowhere), not to stdout, where the verdict table goes.

    Both Python's ``sys.stdout`` and the process's file descriptor 1 (C extensions,
    subprocesses) are redirected when ``stream`` has a file descriptor; a stream without
    one (an in-memory buffer) receives Python-level output only.
    """
    with contextlib.ExitStack() as stack:
        target = stream
        if target is None:
            target = stack.enter_context(open(os.devnull, "w", encoding="utf-8"))
        sys.stdout.flush()
        saved = _redirect_fd(1, target)
        descriptor = _descriptor_of(target)
        if descriptor is not None:  # a worker process started in the block prints there
            _OUTPUT_DESCRIPTORS.append(descriptor)
        try:
            with contextlib.redirect_stdout(target), warnings.catch_warnings():
                # warnings the kernel raises (NumPy's on the NaN inputs of SDPA-8.3, ...)
                # are its output too
                warnings.showwarning = _writer_to(target)
                yield
        finally:
            if descriptor is not None:
                _OUTPUT_DESCRIPTORS.pop()
            sys.stdout.flush()
            target.flush()
            if saved is not None:
                os.dup2(saved, 1)
                os.close(saved)


def _writer_to(target: TextIO) -> Callable[..., None]:
    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        target.write(warnings.formatwarning(message, category, filename, lineno, line))

    return show


def _descriptor_of(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _redirect_fd(fd: int, target: TextIO) -> int | None:
    """Point ``fd`` at ``target``'s descriptor; returns a copy of the old one (or None when
    either has no usable descriptor)."""
    try:
        target_fd = target.fileno()
        saved = os.dup(fd)
    except (AttributeError, OSError, ValueError):
        return None
    target.flush()
    os.dup2(target_fd, fd)
    return saved


@contextlib.contextmanager
def hypothesis_storage_elsewhere() -> Iterator[None]:
    """Inside the block, Hypothesis keeps its files in a temporary directory that is removed
    afterwards, not in ``./.hypothesis``.

    The suite uses no example database (``database=None``); what appeared was Hypothesis's
    cache of the constants it collects from local source files (the kernel's among them).
    ``HYPOTHESIS_STORAGE_DIRECTORY``, when set, is where the user asked for them: honoured.
    A worker process started in the block gets the same directory
    (:func:`hypothesis_storage_variables`).
    """
    if os.environ.get(STORAGE_VARIABLE):
        yield
        return
    from hypothesis import configuration

    previous = getattr(configuration, "__hypothesis_home_directory", None)
    with tempfile.TemporaryDirectory(prefix="attnspec-hypothesis-") as directory:
        configuration.set_hypothesis_home_dir(directory)
        _STORAGE_DIRECTORIES.append(directory)
        try:
            yield
        finally:
            _STORAGE_DIRECTORIES.pop()
            configuration.set_hypothesis_home_dir(previous)


def hypothesis_storage_variables() -> dict[str, str]:
    """The variable a worker process started now gets so that it keeps Hypothesis's files
    where this one does: the innermost :func:`hypothesis_storage_elsewhere` block's
    directory (nothing outside one, or where the user set the variable, which the worker
    inherits).  Each worker's Hypothesis scans the local source files it has imported for
    constants once per storage directory and caches what it found there by the file's hash
    (the same constants, so the same draws): with one directory per run, the workers of
    ``--jobs N``, a worker restarted after a crash, and the re-runs read what the first
    scan found instead of parsing every file again (~0.5 s of CPU each, issue 33)."""
    if os.environ.get(STORAGE_VARIABLE) or not _STORAGE_DIRECTORIES:
        return {}
    return {STORAGE_VARIABLE: _STORAGE_DIRECTORIES[-1]}
