"""What drawing needs of the kernel it draws for: its claims, the dtypes it is checked in,
and how the backend rounds a value to one of them.

A Protocol, so that drawing depends on no judging code: the judge's
:class:`~attnspec.conformance.judge.kernel.KernelUnderTest` is one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..claims.declaration import KernelDeclaration

if TYPE_CHECKING:  # annotations only: drawing's size caps are read without NumPy
    import numpy as np


class DrawTarget(Protocol):
    """The kernel as drawing sees it."""

    @property
    def declaration(self) -> KernelDeclaration:
        """What the kernel claims: drawing stays within it."""
        ...

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes checked: those claimed that the backend has, in precision order."""
        ...

    def rounded(self, a: np.ndarray, dtype: str) -> np.ndarray:
        """``a`` rounded to ``dtype`` as the backend rounds it: the values the kernel sees."""
        ...
