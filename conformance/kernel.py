"""Calling a kernel under test: loading it, building its arguments, reading its output.

Properties describe inputs as a :class:`Problem` of NumPy float64 arrays holding values
exactly representable in the dtype under test; :class:`KernelUnderTest` moves them to
the backend in that dtype, calls the kernel as its declaration says, and brings the
output back as float64 NumPy.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..backends import Backend
from .declaration import KernelDeclaration, declaration_of


class KernelLoadError(ValueError):
    """``MODULE:FUNC`` or ``path.py:FUNC`` does not name a usable kernel."""


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

    def snippet(self, target: str, backend: str) -> str:
        """Python that rebuilds these exact inputs and calls the kernel on them."""
        def literal(a: np.ndarray) -> str:
            return f"np.array({a.tolist()!r}, dtype=np.{a.dtype})"

        lines = [
            "import numpy as np",
            "nan, inf = np.nan, np.inf  # as NumPy prints non-finite values below",
            "from attnspec.backends import Backend",
            "from attnspec.conformance import KernelUnderTest, Problem",
            f"problem = Problem(q={literal(self.q)},",
            f"                  k={literal(self.k)},",
            f"                  v={literal(self.v)},",
            f"                  dtype={self.dtype!r}, is_causal={self.is_causal!r}, "
            f"scale={self.scale!r},",
            f"                  mask={None if self.mask is None else literal(self.mask)},",
            f"                  bias={None if self.bias is None else literal(self.bias)},",
            f"                  extra={self.extra!r})",
            f"kernel = KernelUnderTest.load({target!r}, Backend({backend!r}))",
            "print(kernel.run(problem))",
            "from attnspec.conformance import reference_bound",
            "print(reference_bound(problem, kernel.declaration).out)",
        ]
        return "\n".join(lines)


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
        decl, b = self.declaration, self.backend
        args = tuple(b.asarray(a, problem.dtype) for a in (problem.q, problem.k, problem.v))
        kwargs: dict[str, Any] = dict(decl.extra_kwargs)
        if problem.is_causal:
            kwargs["is_causal"] = True
        if problem.scale is not None:
            kwargs["scale"] = problem.scale
        if decl.gqa_keyword is not None and problem.q.shape[-3] != problem.k.shape[-3]:
            kwargs[decl.gqa_keyword] = True
        if decl.bias_shares_mask_argument and problem.bias is not None:
            bias = problem.bias
            if problem.mask is not None:
                bias = np.where(problem.mask, bias, -np.inf)
            kwargs[decl.mask_keyword] = b.asarray(bias, problem.dtype)
        else:
            if problem.mask is not None:
                kwargs[decl.mask_keyword] = b.asarray(problem.mask)
            if problem.bias is not None:
                kwargs[decl.bias_keyword] = b.asarray(problem.bias, problem.dtype)
        kwargs.update(problem.extra)
        return args, kwargs

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The kernel's raw result (backend arrays), exactly as it returned it."""
        return self.fn(*args, **kwargs)

    def split(self, result: Any) -> tuple[Any, Any]:
        """(out, weights or None) from a raw result, per the declaration."""
        if self.declaration.returns_weights:
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise TypeError(
                    f"kernel declared returns_weights=True but returned {type(result).__name__}"
                )
            return result[0], result[1]
        return result, None

    def invoke(self, problem: Problem) -> tuple[Any, Any]:
        """(out, weights or None) as backend arrays; a kernel exception becomes a failure."""
        from .failures import KernelRaised

        try:
            return self.split(self.call(*self.arguments(problem)))
        except KernelRaised:
            raise
        except Exception as exc:
            raise KernelRaised(
                f"kernel raised {type(exc).__name__}: {str(exc)[:300]}", problem, self
            ) from exc

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


def identity_values(problem: Problem) -> Problem:
    """``problem`` with V = I, so the output is the weight matrix (SDPA-7.1)."""
    n_keys = problem.k.shape[-2]
    eye = np.broadcast_to(np.eye(n_keys), (*problem.k.shape[:-1], n_keys))
    return problem.with_(v=np.ascontiguousarray(eye))
