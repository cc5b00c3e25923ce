"""The type of the arrays the reference takes and returns."""

from typing import Any, TypeAlias

Array: TypeAlias = Any
"""An array of any library that implements the Python Array API standard: NumPy, CuPy,
PyTorch and JAX (through array_api_compat) and array-api-strict.  The standard publishes no
static type that all of them satisfy (a ``torch.Tensor`` has no ``__array_namespace__``), so
the alias names the intent and a type checker sees ``Any``."""
