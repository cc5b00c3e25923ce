"""``attnspec bench``: the reference's time and memory at real sizes, in ratios measured in
one run against each library's own kernel (see :mod:`attnspec.benchmarks.command`), and the
backend survey of ``attnspec backends`` (``survey``).

May import: reference, _version.
"""

from .command import add_parser, command, command_using, run

__all__ = ["add_parser", "command", "command_using", "run"]
