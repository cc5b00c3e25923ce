"""What the judge knows of a kernel loaded in another process: enough for the report, the
conformance claim, rerun commands and reproductions, without importing the kernel."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...backends import FLOAT_DTYPE_NAMES
from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration
from .kernel import KernelUnderTest, describe_inputs


@dataclass(frozen=True)
class BackendInfo:
    name: str
    device: str
    on_cpu: bool = True


@dataclass(frozen=True)
class KernelInfo:
    """What the supervisor knows of a kernel loaded in a worker: enough for the report,
    the conformance claim, rerun commands and reproductions (duck-types the parts of
    :class:`KernelUnderTest` those use)."""

    target: str
    backend: BackendInfo
    declaration: KernelDeclaration
    dtypes: tuple[str, ...]
    loader: str
    memory_note: str = ""
    setup_notes: tuple[str, ...] = ()  # the library's settings, dtypes not checked
    setup_hints: tuple[str, ...] = ()  # read off the kernel's signature while loading it

    @classmethod
    def of(cls, kernel: KernelUnderTest, loader: str, memory_note: str) -> KernelInfo:
        declaration = kernel.declaration
        linear = declaration.linear
        if linear is not None and callable(linear.feature_map):
            # Unpickling the function would import the kernel's module in the supervisor.
            stand_in = CallableInWorker(getattr(linear.feature_map, "__qualname__", "?"))
            declaration = replace(declaration, linear=replace(linear, feature_map=stand_in))
        return cls(
            kernel.target,
            BackendInfo(kernel.backend.name, str(kernel.backend.device), kernel.backend.on_cpu),
            declaration,
            kernel.dtypes,
            loader,
            memory_note,
            tuple(setup_notes(kernel)),
            tuple(kernel.setup_hints),
        )

    def describe(self, problem: Problem) -> str:
        """The inputs of ``problem`` as the worker passed them to the kernel."""
        return describe_inputs(self.declaration, problem)


@dataclass(frozen=True)
class CallableInWorker:
    """Stands in the supervisor for a callable (a feature map) that lives in the worker."""

    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.name} runs in the check's worker process, not here")


def setup_notes(kernel: KernelUnderTest) -> list[str]:
    """What the check changed in the library's settings, the settings it ran in, and the
    claimed dtypes it could not check, with why (for the report's notes)."""
    backend = kernel.backend
    notes = [
        f"changed {change} for this check (as asked: --jax-x64 / jax_x64)"
        for change in backend.changes
    ]
    if backend.settings:
        notes.append(f"{backend.name} settings: {backend.settings}")
    claimed = kernel.declaration.dtypes or FLOAT_DTYPE_NAMES
    for name in claimed:
        reason = backend.missing_dtype_reason(name)
        if reason:
            notes.append(f"{name} is not checked: {reason}")
    return notes
