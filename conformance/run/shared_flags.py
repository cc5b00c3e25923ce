"""The flags ``attnspec check`` and the pytest plugin share (the plugin's as
``--attnspec-<flag>``): the size caps and the worker's supervision, with their defaults.

A module of its own, importing no judging, drawing engine or array library: the plugin is
loaded in every pytest run of an environment where attnspec is installed (its ``pytest11``
entry point) and adds these options whether or not a kernel is checked.
"""

from __future__ import annotations

from ..claims.flags import Flag
from ..draw.sizes import SizeLimits

DEFAULT_TIMEOUT = 60.0  # s per kernel call: JAX/XLA compiles a new shape in a few seconds
DEFAULT_MEMORY_LIMIT_GIB = 16.0  # beyond the loaded backend; quick problems need megabytes
DEFAULT_LOAD_TIMEOUT = 120.0  # s to start a worker and import the backend and the kernel
# Kernel calls that may outlast the timeout before the run stops: a kernel that hangs on
# every call then ends the quick profile in about DEFAULT_STALL_BUDGET timeouts (two at a
# time with two workers), not one per applicable property (~29 on the quick profile).
DEFAULT_STALL_BUDGET = 3

_DEFAULT_LIMITS = SizeLimits()
#: The size caps, shared by ``attnspec check`` and the pytest plugin (``--attnspec-max-len``
#: ...); each flag's dest is the :class:`SizeLimits` field it sets.
SIZE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--max-len",
        f"largest Lq and Lk drawn (default {_DEFAULT_LIMITS.max_len}; larger "
        "adds longer block boundaries)",
        type=int,
        metavar="N",
    ),
    Flag(
        "--max-head-dim",
        f"largest head dims E and Ev drawn (default {_DEFAULT_LIMITS.max_head_dim})",
        type=int,
        metavar="N",
    ),
    Flag(
        "--max-batch-heads",
        f"largest batch x query heads drawn (default {_DEFAULT_LIMITS.max_batch_heads})",
        type=int,
        metavar="N",
    ),
)


# The supervision flags `attnspec check` and the pytest plugin share (the plugin's with
# --attnspec-); how isolation is turned off or on differs (--no-isolate, --attnspec-isolate).
SUPERVISION_FLAGS = (
    Flag(
        "--timeout",
        "a kernel call (or the suite's work between two calls) taking longer "
        f"fails its property and the worker is restarted (default {DEFAULT_TIMEOUT:g})",
        type=float,
        metavar="SECONDS",
    ),
    Flag(
        "--memory-limit",
        "address space the worker may add after loading the backend "
        f"(default {DEFAULT_MEMORY_LIMIT_GIB:g}; 0: no limit; CPU devices only)",
        type=float,
        metavar="GIB",
    ),
    Flag(
        "--stall-budget",
        "kernel calls that may outlast --timeout before the run stops, the kernel judged "
        f"as hanging and the other properties not run (default {DEFAULT_STALL_BUDGET})",
        type=int,
        metavar="N",
    ),
    Flag(
        "--judge",
        "the strictest judging, for generated or untrusted kernels: every kernel call made "
        "twice on fresh copies and compared bit for bit, inputs re-read after every call, "
        "properties in a seeded random order (about twice the time)",
        kind="switch",
    ),
    Flag(
        "--deadline",
        "seconds of wall time after which no property starts (those left: not run; the "
        "report says so); default none",
        type=float,
        metavar="SECONDS",
    ),
)
