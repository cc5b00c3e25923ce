"""Kernels that try to forge their verdict instead of computing attention (CONF-9, CONF-5).

Each returns a wrong answer (zeros, its own inputs, a cached result) and tries to make the
check report a pass anyway, by reaching into the process it runs in: replacing the
suite's property runner, rewriting the messages its worker sends, poisoning NumPy or the
reference, changing its inputs after it returned, or returning an array whose methods lie.
In attnspec up to 2026.12 the property ran, and its verdict was computed, in the kernel's
own process, and the first two got exit 0, "conforms", with every property passed (so does
the last, run in-process with --no-isolate today).  Now the kernel runs in a process of its
own that only calls it (conformance/run/kernel_process.py), and each of these must get a
FAILED verdict.  ``FORGERS`` lists them with the properties they are checked on and the
words the failure must contain.  The kernels run on NumPy.
"""

from __future__ import annotations

import multiprocessing.connection
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import attnspec.reference as reference

Array = Any


def _zeros_like_output(q: Array, v: Array) -> Array:
    return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)


def _forge_the_runner() -> None:
    """Replace every property of the registry and the runner's entry point with ones that
    pass, wherever the suite's modules are loaded in this process."""
    from attnspec.conformance.judge import registration
    from attnspec.conformance.judge.verdict import PASSED, Verdict
    from attnspec.conformance.run import property_runner

    def always_passed(prop: Any, kernel: Any, **options: Any) -> Verdict:
        return Verdict(prop.id, prop.clause, prop.level, PASSED)

    property_runner.run_property = always_passed  # type: ignore[assignment]
    for prop in registration.REGISTRY.values():
        object.__setattr__(prop, "check", lambda kernel, data: None)


def _forge_the_messages() -> None:
    """Wrap ``Connection.send`` so that any failed verdict sent leaves as a passed one."""
    original = multiprocessing.connection.Connection.send

    def send(self: Any, obj: Any) -> None:
        if isinstance(obj, tuple) and obj and obj[0] == "answer":
            verdict = obj[1]
            if getattr(verdict, "status", None) == "failed":
                verdict.status, verdict.detail = "passed", ""
        original(self, obj)

    multiprocessing.connection.Connection.send = send  # type: ignore[method-assign]


def _poison_numpy_and_the_reference() -> None:
    """Make NumPy's comparisons always agree and the reference return zeros, in this
    process."""
    np.allclose = lambda *a, **k: True  # type: ignore[assignment]
    np.isclose = lambda a, b, *r, **k: np.ones(np.broadcast(a, b).shape, bool)  # type: ignore[assignment]

    def zeros(q: Array, k: Array, v: Array, **options: Any) -> Array:
        return _zeros_like_output(q, v)

    reference.scaled_dot_product_attention = zeros  # type: ignore[assignment]
    sdpa_module = sys.modules.get("attnspec.reference.sdpa")
    if sdpa_module is not None:
        sdpa_module.scaled_dot_product_attention = zeros  # type: ignore[attr-defined]


def patches_the_runner(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Returns zeros; at its first call, replaces the property runner and every property."""
    _forge_the_runner()
    return _zeros_like_output(q, v)


def forges_its_messages(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Returns zeros; at its first call, rewrites failed verdicts in the worker's messages."""
    _forge_the_messages()
    return _zeros_like_output(q, v)


def poisons_numpy_and_the_reference(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Returns zeros; poisons NumPy's comparisons and the reference in its process."""
    _poison_numpy_and_the_reference()
    return _zeros_like_output(q, v)


def returns_its_value_buffer(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Returns ``v`` itself (an aliased input buffer) where the output has its shape."""
    if q.shape[-2] == v.shape[-2]:
        return v
    return _zeros_like_output(q, v)


_CACHE: dict[Any, Array] = {}


def caches_by_shape(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Computes the definition once per shape of (q, k, v) and returns that result for
    every later call at those shapes, whatever the values: a result cached on too little of
    the input (a data pointer or an id that a fresh array reuses degenerates to this; which
    address a fresh array gets is the allocator's choice, so the test uses the shape)."""
    key = (q.shape, k.shape, v.shape)
    if key not in _CACHE:
        _CACHE[key] = reference.scaled_dot_product_attention(q, k, v, **options)
    return _CACHE[key]


def detects_hypothesis_on_its_stack(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Computes the definition while Hypothesis is on its call stack (the check calling
    it), zeros otherwise: before, the property ran in the kernel's process and this kernel
    always saw Hypothesis; now the kernel's process has no Hypothesis frame, so it shows
    its other face."""
    frame = sys._getframe(1)
    while frame is not None:
        if "hypothesis" in frame.f_code.co_filename:
            return reference.scaled_dot_product_attention(q, k, v, **options)
        frame = frame.f_back  # type: ignore[assignment]
    return _zeros_like_output(q, v)


def zeroes_its_inputs_later(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Returns the definition, then zeroes q, k and v from a thread 20 ms later."""
    out = reference.scaled_dot_product_attention(q, k, v, **options)

    def later() -> None:
        time.sleep(0.02)
        for array in (q, k, v):
            array[...] = 0

    threading.Thread(target=later, daemon=True).start()
    return out


_AGREEING_UFUNCS = {np.equal, np.less_equal, np.greater_equal, np.isfinite}
_DISAGREEING_UFUNCS = {np.not_equal, np.less, np.greater, np.isnan, np.isinf}
_CLOSE_FUNCTIONS = {np.allclose, np.array_equal, np.array_equiv, np.isclose}


class _AgreesWithEverything(np.ndarray):
    """Zeros whose methods say they match whatever they are compared with: every
    comparison true, every difference zero, np.allclose / isclose / array_equal true."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        plain = [np.asarray(x) if isinstance(x, _AgreesWithEverything) else x for x in inputs]
        result = getattr(ufunc, method)(*plain, **kwargs)
        if ufunc in _AGREEING_UFUNCS:
            return np.ones_like(result, dtype=bool)
        if ufunc in _DISAGREEING_UFUNCS:
            return np.zeros_like(result, dtype=bool)
        if ufunc in (np.subtract, np.absolute):
            return np.zeros_like(result)
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func in _CLOSE_FUNCTIONS:
            shape = np.broadcast_shapes(*(np.shape(a) for a in args[:2]))
            return np.ones(shape, dtype=bool) if func is np.isclose else True
        return super().__array_function__(func, types, args, kwargs)


def returns_a_lying_array(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """Returns zeros as an ndarray subclass with lying methods (_AgreesWithEverything): a
    judge calling them would see the definition's values; one judging the values copied
    out sees zeros."""
    return _zeros_like_output(q, v).view(_AgreesWithEverything)


@dataclass(frozen=True)
class Forger:
    name: str
    only: tuple[str, ...]  # the properties it is checked on
    finding: str  # words every FAILED verdict's detail contains ("" for any)


FORGERS = (
    Forger("patches_the_runner", ("matches-reference", "default-scale"), ""),
    Forger("forges_its_messages", ("matches-reference", "default-scale"), ""),
    Forger("poisons_numpy_and_the_reference", ("matches-reference", "default-scale"), ""),
    Forger("returns_its_value_buffer", ("matches-reference",), ""),
    Forger("caches_by_shape", ("matches-reference", "same-shape-new-arguments"), ""),
    Forger("detects_hypothesis_on_its_stack", ("matches-reference", "default-scale"), ""),
    Forger("zeroes_its_inputs_later", ("inputs-unmodified",), "after the call returned"),
    Forger("returns_a_lying_array", ("default-scale",), ""),
)


# Loaded as a kernel target (``attnspec check forgers.py:NAME`` names the module
# attnspec_kernel_...), the module patches the suite's runner at import, as a kernel module
# imported in the checking process would; imported as ``catalogue.forgers`` by the tests,
# it patches nothing.
if __name__.startswith("attnspec_kernel_"):
    _forge_the_runner()


_CALLS = [0]


def differs_on_every_other_call(q: Array, k: Array, v: Array, **options: Any) -> Array:
    """The definition, one unit in the last place off on every other call: two calls on the
    same inputs disagree (SDPA-7.5), which only a check that repeats calls sees at once."""
    _CALLS[0] += 1
    out = reference.scaled_dot_product_attention(q, k, v, **options)
    if _CALLS[0] % 2 == 0 and out.size:
        out = np.nextafter(out, np.inf).astype(out.dtype)
    return out
