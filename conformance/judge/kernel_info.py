"""What the judge knows of a kernel loaded in another process: enough for the report, the
conformance claim, rerun commands and reproductions, without importing the kernel."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...backends import FLOAT_DTYPE_NAMES
from ..call.problem import Problem
from ..call.wire import PLAIN, CallableInKernelProcess, wire_type
from ..claims.declaration import KernelDeclaration
from .kernel import KernelUnderTest, describe_inputs


@wire_type
@dataclass(frozen=True)
class BackendInfo:
    name: str
    device: str
    on_cpu: bool = True


@wire_type
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
    def of(
        cls,
        kernel: KernelUnderTest,
        loader: str,
        memory_note: str,
        held: dict[str, Any] | None = None,
    ) -> KernelInfo:
        """What is known of ``kernel``, its declaration holding only plain data: each
        callable or other object of the kernel's (a feature map, an extra keyword's value)
        replaced by a :class:`CallableInKernelProcess` stand-in, recorded in ``held`` by
        name (the kernel's process puts the original back when it is passed to a call)."""
        declaration = held_declaration(kernel.declaration, {} if held is None else held)
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


def _held(value: Any, held: dict[str, Any]) -> Any:
    if isinstance(value, PLAIN) or (
        isinstance(value, tuple) and all(isinstance(item, PLAIN) for item in value)
    ):
        return value
    name = f"{getattr(value, '__qualname__', type(value).__qualname__)}#{len(held)}"
    held[name] = value
    return CallableInKernelProcess(name)


def held_declaration(declaration: KernelDeclaration, held: dict[str, Any]) -> KernelDeclaration:
    """``declaration`` with what is not plain data held in the kernel's process (see
    :meth:`KernelInfo.of`)."""
    changes: dict[str, Any] = {}
    if declaration.extra_kwargs:
        changes["extra_kwargs"] = {
            name: _held(value, held) for name, value in declaration.extra_kwargs.items()
        }
    linear = declaration.linear
    if linear is not None and callable(linear.feature_map):
        changes["linear"] = replace(linear, feature_map=_held(linear.feature_map, held))
    if callable(declaration.backward_fn):
        changes["backward_fn"] = _held(declaration.backward_fn, held)
    sparse = declaration.sparse
    if sparse is not None and sparse.params:
        params = {name: _held(value, held) for name, value in sparse.params.items()}
        changes["sparse"] = replace(sparse, params=params)
    return replace(declaration, **changes) if changes else declaration


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
