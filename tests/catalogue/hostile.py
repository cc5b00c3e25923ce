"""Hostile kernels: each computes attention correctly (through the reference) or not at
all, and does one thing a kernel must never do to the process checking it (CONF-5), or
returns something that is not an answer (SDPA-1.3), or misbehaves in a way the check must
survive without a false verdict.

``HOSTILE`` lists each with the verdict ``attnspec check`` must give on the properties it
is run on and the exit status (0 conforms, 1 a MUST property failed, 2 setup error or
incomplete).  The kernels run on NumPy (``--backend numpy``).

Importing this module as a kernel target also runs the import-time hazard named by the
environment variable ``ATTNSPEC_HOSTILE_AT_IMPORT`` (``sys.exit``, ``os._exit``,
``segfault``, ``hang``): a module that exits or hangs while being imported.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.reference import scaled_dot_product_attention

AT_IMPORT = "ATTNSPEC_HOSTILE_AT_IMPORT"
Array = Any


def _hang() -> None:
    while True:
        time.sleep(1.0)


def _segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


_IMPORT_HAZARDS = {
    "sys.exit": lambda: sys.exit(0),
    "os._exit": lambda: os._exit(0),
    "segfault": _segfault,
    "hang": _hang,
}
if os.environ.get(AT_IMPORT) in _IMPORT_HAZARDS:
    _IMPORT_HAZARDS[os.environ[AT_IMPORT]]()


Answer = Callable[[Any, Array], Any]  # (the correct output, q) -> what the kernel returns


def _hostile(
    name: str, doc: str, *, before: Callable[[], Any] | None = None, answer: Answer | None = None
) -> Callable[..., Any]:
    """A kernel with the spec's minimal signature that runs ``before`` first, then returns
    ``answer(out, q)`` of the correct output, the reference's (``out`` itself when None)."""

    def kernel(
        q: Array,
        k: Array,
        v: Array,
        *,
        mask: Array | None = None,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> Any:
        if before is not None:
            before()
        out = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
        return out if answer is None else answer(out, q)

    kernel.__doc__ = doc
    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def _plus_50_gb_touched(out: Array, q: Array) -> Array:
    scratch = np.ones(50 * 10**9 // 8)  # np.ones writes every page
    return out + 0 * scratch[0]


def _as_array_api_strict(out: Array, q: Array) -> Any:
    import array_api_strict

    return array_api_strict.asarray(out.astype(np.promote_types(out.dtype, np.float32)))


def _then_q_zeroed(out: Array, q: Array) -> Array:
    q[...] = 0
    return out


def _one_ulp_off_at_random(out: Array, q: Array) -> Array:
    rng = np.random.default_rng()  # fresh OS entropy each call
    nudged = np.nextafter(out, np.asarray(np.inf, dtype=out.dtype))
    return np.where(rng.random(out.shape) < 0.5, nudged, out).astype(out.dtype)


def _then_seterr_raise(out: Array, q: Array) -> Array:
    np.seterr(all="raise")
    return out


attention = _hostile(
    "attention", "Correct: the reference (the control every hostile kernel is compared with)."
)
hangs = _hostile("hangs", "Never returns.", before=_hang)
calls_sys_exit_0 = _hostile("calls_sys_exit_0", "Calls sys.exit(0).", before=lambda: sys.exit(0))
calls_os_exit_0 = _hostile("calls_os_exit_0", "Calls os._exit(0).", before=lambda: os._exit(0))
calls_os_exit_3 = _hostile("calls_os_exit_3", "Calls os._exit(3).", before=lambda: os._exit(3))
segfaults = _hostile("segfaults", "Reads address 0: SIGSEGV.", before=_segfault)
raises_keyboard_interrupt = _hostile(
    "raises_keyboard_interrupt", "Raises KeyboardInterrupt.", before=_raise_keyboard_interrupt
)
allocates_50_gb = _hostile(
    "allocates_50_gb",
    "Touches 50 GB (np.ones writes every page), then answers correctly.",
    answer=_plus_50_gb_touched,
)
returns_none = _hostile("returns_none", "Returns None.", answer=lambda out, q: None)
returns_list = _hostile("returns_list", "Returns a list.", answer=lambda out, q: out.tolist())
returns_tuple = _hostile(
    "returns_tuple",
    "(out, weights) from a kernel that does not declare returns_weights.",
    answer=lambda out, q: (out, out),
)
returns_wrong_backend = _hostile(
    "returns_wrong_backend",
    "The right values as an array_api_strict array (which has no float16: float32 then), "
    "under the NumPy backend.",
    answer=_as_array_api_strict,
)
returns_int = _hostile("returns_int", "Returns the int 0.", answer=lambda out, q: 0)
mutates_inputs = _hostile(
    "mutates_inputs",
    "The right answer, then q overwritten in place (scratch reuse gone wrong).",
    answer=_then_q_zeroed,
)
noisy = _hostile(
    "noisy",
    "Within TOL-2 every time, but one ulp off in a fresh random half of the elements on "
    "every call (an unseeded atomic-add order): not deterministic (SDPA-7.5).",
    answer=_one_ulp_off_at_random,
)
prints_a_megabyte = _hostile(
    "prints_a_megabyte",
    "Correct, but prints 1 MiB on every call.",
    before=lambda: print("x" * (2**20 - 1)),
)
leaves_seterr_raise = _hostile(
    "leaves_seterr_raise",
    "Correct, but leaves NumPy raising on every floating-point warning, underflow "
    "included, for whoever computes next.",
    answer=_then_seterr_raise,
)


@dataclass(frozen=True)
class Hostile:
    """A hostile kernel, the properties it is checked on and what the check must say.

    ``status`` is the verdict every one of ``only`` gets unless ``statuses`` names it;
    ``finding`` is text every failed verdict's finding contains; ``exit`` the CLI's exit
    status; ``isolated_only``: in-process, the kernel would take the test run down.
    """

    name: str
    only: tuple[str, ...]
    status: str
    exit: int
    finding: str = ""
    statuses: tuple[tuple[str, str], ...] = ()
    isolated_only: bool = False

    def expected(self, prop: str) -> str:
        return dict(self.statuses).get(prop, self.status)


CHEAP = ("default-scale", "explicit-scale")  # one small call per example
SHAPE = ("output-shape-dtype",)  # SDPA-1.3: an array of the right shape, dtype and backend
HOSTILE = (
    Hostile("attention", CHEAP, "passed", 0),
    Hostile("hangs", ("default-scale",), "failed", 1, "did not return within", isolated_only=True),
    Hostile("calls_sys_exit_0", CHEAP, "failed", 1, "called sys.exit(0)"),
    Hostile("calls_os_exit_0", CHEAP, "failed", 1, "ended with exit status 0", isolated_only=True),
    Hostile("calls_os_exit_3", CHEAP, "failed", 1, "ended with exit status 3", isolated_only=True),
    Hostile("segfaults", CHEAP, "failed", 1, "SIGSEGV", isolated_only=True),
    Hostile(
        "raises_keyboard_interrupt",
        CHEAP,
        "failed",
        1,
        "raised KeyboardInterrupt",
        isolated_only=True,
    ),
    Hostile("allocates_50_gb", CHEAP, "failed", 1, "MemoryError", isolated_only=True),
    Hostile("returns_none", SHAPE, "failed", 1),
    Hostile("returns_list", SHAPE, "failed", 1),
    Hostile("returns_tuple", SHAPE, "failed", 1),
    Hostile("returns_wrong_backend", SHAPE, "failed", 1),
    Hostile("returns_int", SHAPE, "failed", 1),
    Hostile(
        "mutates_inputs",
        ("inputs-unmodified", "default-scale"),
        "failed",
        1,
        statuses=(("default-scale", "passed"),),
    ),
    Hostile(
        "noisy",
        ("deterministic", "default-scale"),
        "failed",
        1,
        statuses=(("default-scale", "passed"),),
    ),
    Hostile("prints_a_megabyte", ("default-scale",), "passed", 0),
    Hostile(
        "leaves_seterr_raise", ("default-scale", "large-logits", "matches-reference"), "passed", 0
    ),
)
