"""Property modules, one per spec area; importing them registers their properties."""

from . import agreement, scale  # noqa: F401
