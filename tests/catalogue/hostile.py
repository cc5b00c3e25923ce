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


def attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Correct: the reference (the control every hostile kernel is compared with)."""
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def hangs(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Never returns."""
    _hang()
    raise AssertionError("unreachable")


def calls_sys_exit_0(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    sys.exit(0)


def calls_os_exit_0(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    os._exit(0)


def calls_os_exit_3(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    os._exit(3)


def segfaults(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    _segfault()
    raise AssertionError("unreachable")


def raises_keyboard_interrupt(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    raise KeyboardInterrupt


def allocates_50_gb(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Touches 50 GB (np.ones writes every page), then answers correctly."""
    scratch = np.ones(50 * 10**9 // 8)
    return attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale) + 0 * scratch[0]


def returns_none(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    return None


def returns_list(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    return attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale).tolist()


def returns_tuple(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """(out, weights) from a kernel that does not declare returns_weights."""
    out = attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    return out, out


def returns_wrong_backend(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """The right values as an array_api_strict array (which has no float16: float32 then),
    under the NumPy backend."""
    import array_api_strict

    out = attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    return array_api_strict.asarray(out.astype(np.promote_types(out.dtype, np.float32)))


def returns_int(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    return 0


def mutates_inputs(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """The right answer, then q overwritten in place (scratch reuse gone wrong)."""
    out = attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    q[...] = 0
    return out


def noisy(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Within TOL-2 every time, but one ulp off in a fresh random half of the elements on
    every call (an unseeded atomic-add order): not deterministic (SDPA-7.5)."""
    out = attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    rng = np.random.default_rng()  # fresh OS entropy each call
    nudged = np.nextafter(out, np.asarray(np.inf, dtype=out.dtype))
    return np.where(rng.random(out.shape) < 0.5, nudged, out).astype(out.dtype)


def prints_a_megabyte(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Correct, but prints 1 MiB on every call."""
    print("x" * (2**20 - 1))
    return attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def leaves_seterr_raise(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Correct, but leaves NumPy raising on every floating-point warning, underflow
    included, for whoever computes next."""
    out = attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    np.seterr(all="raise")
    return out


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
