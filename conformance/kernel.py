"""Calling a kernel under test: loading it, building its arguments, reading its output.

Properties describe inputs as a :class:`Problem` of NumPy float64 arrays holding values
exactly representable in the dtype under test; :class:`KernelUnderTest` moves them to
the backend in that dtype, calls the kernel as its declaration says, and brings the
output back as float64 NumPy.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import array_api_compat
import numpy as np

from ..backends import Backend
from .declaration import KernelDeclaration, declaration_of


class KernelLoadError(ValueError):
    """``MODULE:FUNC`` or ``path.py:FUNC`` does not name a usable kernel."""


@contextlib.contextmanager
def _on_sys_path(directory: str) -> Iterator[None]:
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
            with _on_sys_path(str(path.resolve().parent)):
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
    return obj


@dataclass
class Problem:
    """One attention call in spec terms (SDPA-1.1), with float64 NumPy inputs."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dtype: str
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def with_(self, **changes: Any) -> Problem:
        return replace(self, **changes)

    def describe(self) -> str:
        """Shapes, dtype and mask summary for a failure message."""
        parts = [
            f"q{tuple(self.q.shape)}", f"k{tuple(self.k.shape)}", f"v{tuple(self.v.shape)}",
            f"dtype={self.dtype}", f"is_causal={self.is_causal}", f"scale={self.scale!r}",
        ]
        if self.mask is not None:
            parts.append(
                f"mask{tuple(self.mask.shape)} ({int(self.mask.sum())}/{self.mask.size} True)"
            )
        if self.bias is not None:
            parts.append(f"bias{tuple(self.bias.shape)}")
        parts.extend(f"{key}={value!r}" for key, value in self.extra.items())
        return ", ".join(parts)


def describe_inputs(declaration: KernelDeclaration, problem: Problem) -> str:
    """``problem.describe()``, plus what an adapter changed on the way to the kernel (the
    zero padding of ``equal_head_dims``), so the inputs shown are those passed."""
    text = problem.describe()
    if declaration.equal_head_dims:
        from .layouts import describe_padding

        padding = describe_padding(problem.q.shape[-1], problem.v.shape[-1],
                                   problem.scale is not None)
        if padding:
            text += f" ({padding})"
    return text


def keyword_sources(declaration: KernelDeclaration,
                    problem: Problem) -> dict[str, tuple[Any, str | None]]:
    """The keywords a kernel with ``declaration`` is called with on ``problem``: each with
    its value (a NumPy array for a mask or bias: a boolean one moves to the backend as
    is, a float one in the dtype under test) and the Python expression that builds it from
    ``problem`` and ``backend`` (None for plain values).  Needs no backend, so a
    reproduction can be written where the kernel is not loaded."""
    decl, dtype = declaration, problem.dtype
    keywords: dict[str, tuple[Any, str | None]] = {
        name: (value, None) for name, value in decl.extra_kwargs.items()}
    if problem.is_causal:
        keywords["is_causal"] = (True, None)
    if problem.scale is not None:
        keywords["scale"] = (problem.scale, None)
    if decl.gqa_keyword is not None and problem.q.shape[-3] != problem.k.shape[-3]:
        keywords[decl.gqa_keyword] = (True, None)
    if decl.bias_shares_mask_argument and problem.bias is not None:
        # one float argument: the bias, with -inf where the mask excludes (PyTorch)
        bias, source = problem.bias, "problem.bias"
        if problem.mask is not None:
            bias = np.where(problem.mask, bias, -np.inf)
            source = "np.where(problem.mask, problem.bias, -inf)"
        keywords[decl.mask_keyword] = (bias, f"backend.asarray({source}, {dtype!r})")
    else:
        if problem.mask is not None:
            keywords[decl.mask_keyword] = (problem.mask, "backend.asarray(problem.mask)")
        if problem.bias is not None:
            keywords[decl.bias_keyword] = (problem.bias,
                                           f"backend.asarray(problem.bias, {dtype!r})")
    keywords.update((name, (value, None)) for name, value in problem.extra.items())
    return keywords


class KernelUnderTest:
    """A kernel, its declaration and the backend it runs on."""

    def __init__(
        self,
        fn: Callable[..., Any],
        backend: Backend,
        declaration: KernelDeclaration | None = None,
        target: str | None = None,
    ) -> None:
        self.backend = backend
        self.declaration = declaration if declaration is not None else declaration_of(fn)
        if self.declaration.equal_head_dims:
            from .layouts import pad_head_dims

            fn = pad_head_dims(fn)
        self.fn = fn
        module, name = getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", "?")
        self.target = target or f"{module}:{name}"
        self.notes: list[str] = []
        # hints read off the kernel before anything ran (see hints.signature_hints)
        self.setup_hints: list[str] = []

    def describe(self, problem: Problem) -> str:
        """The inputs of ``problem`` as passed to this kernel (see :func:`describe_inputs`)."""
        return describe_inputs(self.declaration, problem)

    def note(self, observation: str) -> None:
        """Record something a passing property should report (e.g. SDPA-1.7's SHOULD)."""
        if observation not in self.notes:
            self.notes.append(observation)

    @classmethod
    def load(cls, target: str, backend: Backend, **overrides: Any) -> KernelUnderTest:
        fn = load_kernel(target)
        return cls(fn, backend, declaration_of(fn, **overrides), target)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes to test: those claimed that the backend has, in precision order."""
        available = self.backend.dtype_names
        claimed = self.declaration.dtypes or available
        return tuple(d for d in available if d in claimed)

    @property
    def widest_dtype(self) -> str:
        """The most precise claimed dtype: where small errors are easiest to see."""
        return self.dtypes[-1]

    def rounded(self, a: np.ndarray, dtype: str) -> np.ndarray:
        """``a`` rounded to ``dtype`` on the backend and back: the values the kernel sees."""
        return self.backend.to_numpy(self.backend.asarray(a, dtype)).astype(np.float64)

    def arguments(self, problem: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Backend arrays and keywords for calling the kernel on ``problem``."""
        args, keywords = self.argument_sources(problem)
        return args, {name: value for name, (value, _) in keywords.items()}

    def argument_sources(
        self, problem: Problem
    ) -> tuple[tuple[Any, ...], dict[str, tuple[Any, str | None]]]:
        """As :meth:`arguments`, each keyword with the Python expression that builds it
        from ``problem`` and ``backend`` (None for plain values): what a reproduction
        snippet writes out."""
        b, dtype = self.backend, problem.dtype
        args = tuple(b.asarray(a, dtype) for a in (problem.q, problem.k, problem.v))
        keywords = {
            name: (value if source is None else b.asarray(value) if value.dtype == np.bool_
                   else b.asarray(value, dtype), source)
            for name, (value, source) in keyword_sources(self.declaration, problem).items()}
        return args, keywords

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The kernel's raw result (backend arrays), exactly as it returned it."""
        return self.fn(*args, **kwargs)

    def split(self, result: Any, problem: Problem | None = None) -> tuple[Any, Any]:
        """(out, weights or None) from a raw result, per the declaration; a result that is
        not what SDPA-1.3 asks for (None, a tuple, another library's array) is a failure
        that says so, with the flag to use when it is a convention mismatch."""
        from .failures import PropertyFailure

        if self.declaration.returns_weights:
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise PropertyFailure(
                    f"the kernel returned {_what_it_is(result)}, but declares "
                    "returns_weights=True, so it should return (out, weights) [SDPA-1.3]",
                    problem, self,
                    hint="if it returns only the output, drop --returns-weights "
                         "(returns_weights=False)",
                )
            out, weights = result
        elif isinstance(result, (tuple, list)):
            raise PropertyFailure(
                f"the kernel returned {_what_it_is(result)}, but should return the output "
                f"array [SDPA-1.3]", problem, self, hint=_sequence_hint(result),
            )
        else:
            out, weights = result, None
        for what, x in (("out", out), ("weights", weights)):
            if (x is not None or what == "out") and not self.backend.is_array(x):
                raise PropertyFailure(self._not_an_array(what, x), problem, self,
                                      hint=self._array_hint(x))
        return out, weights

    def _not_an_array(self, what: str, x: Any) -> str:
        library = self.backend.name
        if x is None:
            return (f"the kernel returned None as {what}, but should return a {library} array "
                    "(does it end with `return ...`?) [SDPA-1.3]")
        if array_api_compat.is_array_api_obj(x):
            return (f"{what} is a {_type_name(x)}, but the kernel runs on {library}: it should "
                    f"return a {library} array, like its inputs [SDPA-1.3]")
        return f"{what} is {_what_it_is(x)}, but should be a {library} array [SDPA-1.3]"

    def _array_hint(self, x: Any) -> str:
        if x is not None and array_api_compat.is_array_api_obj(x):
            return (f"convert the result to the input's library inside the kernel, or check it "
                    f"on the backend it returns (--backend {_library_of(x)})")
        return ""

    def invoke(self, problem: Problem) -> tuple[Any, Any]:
        """(out, weights or None) as backend arrays; a kernel exception becomes a failure."""
        from .failures import KernelRaised

        try:
            result = self.call(*self.arguments(problem))
        except Exception as exc:
            from .hints import raised_hint

            raise KernelRaised(
                f"kernel raised {type(exc).__name__}: {str(exc)[:300]}", problem, self,
                hint=raised_hint(exc, self),
            ) from exc
        return self.split(result, problem)

    def numpy(self, x: Any) -> np.ndarray:
        """A backend array as float64 NumPy."""
        return self.backend.to_numpy(x).astype(np.float64)

    def run(self, problem: Problem) -> np.ndarray:
        """The kernel's output for ``problem`` as float64 NumPy."""
        return self.numpy(self.invoke(problem)[0])

    def run_with_weights(self, problem: Problem) -> tuple[np.ndarray, np.ndarray]:
        """Output and weights; weights are observed through V = I when not returned."""
        if self.declaration.returns_weights:
            out, weights = self.invoke(problem)
            return self.numpy(out), self.numpy(weights)
        weights = self.run(identity_values(problem))
        return self.run(problem), weights


def _type_name(x: Any) -> str:
    kind = type(x)
    module = kind.__module__.split(".")[0]
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _what_it_is(x: Any) -> str:
    """"None", "a tuple of 2 (ndarray, ndarray)", "a str", ... for failure messages."""
    if x is None:
        return "None"
    if isinstance(x, (tuple, list)):
        parts = ", ".join(_type_name(item) for item in x[:4]) + (", ..." if len(x) > 4 else "")
        return f"a {type(x).__name__} of {len(x)} ({parts})"
    return f"a {_type_name(x)}"


def _library_of(x: Any) -> str:
    module = type(x).__module__.split(".")[0]
    return {"jaxlib": "jax", "array_api_strict": "array_api_strict"}.get(module, module)


def _sequence_hint(result: Any) -> str:
    if len(result) == 2:
        return ("if it returns (out, weights), declare it: --returns-weights "
                "(returns_weights=True); if the second item is something else (e.g. the "
                "log-sum-exp), check a wrapper that returns result[0]")
    return "check a wrapper that returns only the output, e.g. result[0]"


def identity_values(problem: Problem) -> Problem:
    """``problem`` with V = I, so the output is the weight matrix (SDPA-7.1)."""
    n_keys = problem.k.shape[-2]
    eye = np.broadcast_to(np.eye(n_keys), (*problem.k.shape[:-1], n_keys))
    return problem.with_(v=np.ascontiguousarray(eye))
