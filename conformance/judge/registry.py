"""The registered properties, in the order of the clauses they check.

Importing :mod:`.properties` registers every property (:mod:`.registration`); this module
sits above the property modules, so none of them can import it (tests/test_architecture.py).
"""

from __future__ import annotations

from ..claims.clauses import spec_order
from .registration import REGISTRY, Property

__all__ = ["Property", "all_properties"]


def all_properties() -> dict[str, Property]:
    """Every registered property, in the spec's order of the clauses they check (the order
    ``attnspec properties`` and the reports list them in); properties of one clause in the
    order their modules register them."""
    from . import properties  # noqa: F401  (registers on import)

    order = spec_order()
    ranked = sorted(
        enumerate(REGISTRY.values()),
        key=lambda item: (order.get(item[1].clause, len(order)), item[0]),
    )
    return {prop.id: prop for _, prop in ranked}
