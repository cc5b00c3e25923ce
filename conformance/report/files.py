"""Report files that never lose a verdict: checked before the run, rewritten atomically
after every property, marked incomplete until the run has finished.

While the run goes on, :class:`BackgroundWrites` writes those versions on a thread of its
own, the latest only: a burst of verdicts (the not-applicable ones come at once) is one
write, and the run's thread never waits for a report of a megabyte of reproductions to be
rendered and written (issue 33); the final version is written by the run's thread after
the last one of them.

A reader (a CI step, a person with ``tail``) never sees a half-written file: each write
goes to a temporary file beside the report, then ``os.replace`` puts it in place.  A run
that is interrupted (Ctrl-C, SIGTERM) or killed leaves every finished verdict on disk,
and the report says it is incomplete (CONF-6).  A file that cannot be written is one line
of error; the other files are still written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from ..judge.verdict import Report, Verdict
from ..run.kernel_setup import SetupError

Rerun = Callable[[Verdict], str]
Render = Callable[..., str]  # render(report, rerun=...) -> text, as report.to_json


class Interrupted(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so that one path saves the finished verdicts."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Interrupted` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_name(exc: KeyboardInterrupt) -> str:
    return str(exc) if isinstance(exc, Interrupted) else "SIGINT (Ctrl-C)"


def interruption(exc: KeyboardInterrupt, done: int, total: int) -> str:
    """What an incomplete report says after ``exc``: which signal, how far the run got
    (with every verdict in, the failures' re-runs around other failed clauses were under
    way: root_causes.draw_around)."""
    reason = f"interrupted by {signal_name(exc)} after {done} of {total} properties"
    if done == total:
        reason += ", while their failures were re-run around other failed clauses"
    return reason


def still_running(done: int, total: int) -> str:
    return (
        f"the check was still running: {done} of {total} properties had a verdict when "
        "this was written"
    )


def _temporary_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (the temporary file is removed on error).

    No fsync: this guards against the check being interrupted or killed, where the rename
    is atomic; a power cut may still lose the last write.
    """
    temporary = _temporary_path(path)
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


class ReportFiles:
    """The report files of one run: ``(option, path, render)`` each, e.g.
    ``("--json", "report.json", report.to_json)``."""

    def __init__(self, files: Sequence[tuple[str, str | os.PathLike[str], Render]]) -> None:
        self.files = [(option, Path(path), render) for option, path, render in files]
        self.errors: dict[str, str] = {}  # option -> why its latest write failed

    def check_writable(self) -> None:
        """:class:`SetupError` (one line) unless every path can be written: run before
        anything else, so no verdict is computed for a report that cannot be saved."""
        seen: dict[Path, str] = {}
        for option, path, _ in self.files:
            where = f"{option} {str(path)!r}"
            resolved = path.resolve()
            if resolved in seen:
                raise SetupError(f"{where}: {seen[resolved]} writes the same file")
            seen[resolved] = option
            if path.is_dir():
                raise SetupError(f"{where} is a directory, but should be a file path")
            if not resolved.parent.is_dir():
                raise SetupError(f"{where}: directory {str(path.parent)!r} does not exist")
            probe = _temporary_path(resolved)
            try:
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))
                probe.unlink()
            except OSError as exc:
                raise SetupError(
                    f"{where}: cannot write in {str(path.parent)!r}: {_reason(exc)}"
                ) from None

    def write(
        self, report: Report, rerun: Rerun | None = None, *, incomplete: str | None = None
    ) -> None:
        """Write every file; ``incomplete`` marks this version as partial.  A failure is
        remembered (see :attr:`errors`) and the other files are still written."""
        if incomplete is not None:
            from .render import INCOMPLETE_CLAIM

            report = replace(report, incomplete=incomplete, claim=INCOMPLETE_CLAIM)
        for option, path, render in self.files:
            try:
                write_atomically(path, render(report, rerun=rerun))
            except OSError as exc:
                self.errors[option] = (
                    f"{option} {str(path)!r}: the report could not be written: {_reason(exc)}"
                )
            else:
                self.errors.pop(option, None)


class BackgroundWrites:
    """The incomplete versions of ``files`` written on a thread of their own: each
    :meth:`submit` replaces the version waiting to be written, so the files are at most one
    write behind the run, and a version that was overtaken is never written.  :meth:`close`
    drops the waiting version and waits for the write under way: the caller's final
    :meth:`ReportFiles.write` then comes last."""

    def __init__(self, files: ReportFiles) -> None:
        self.files = files
        self._waiting: tuple[Report, Rerun | None, str] | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(
            target=self._write_each, name="attnspec-report-files", daemon=True
        )
        self._thread.start()

    def submit(self, report: Report, rerun: Rerun | None, incomplete: str) -> None:
        """Write ``report`` (as it is now: its lists are copied) marked ``incomplete``."""
        now = replace(
            report,
            verdicts=list(report.verdicts),
            notes=list(report.notes),
            hints=list(report.hints),
            causes=list(report.causes),
        )
        with self._changed:
            self._waiting = (now, rerun, incomplete)
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed, self._waiting = True, None
            self._changed.notify()
        self._thread.join()

    def _write_each(self) -> None:
        while True:
            with self._changed:
                while self._waiting is None and not self._closed:
                    self._changed.wait()
                if self._waiting is None:
                    return
                (report, rerun, incomplete), self._waiting = self._waiting, None
            self.files.write(report, rerun, incomplete=incomplete)
