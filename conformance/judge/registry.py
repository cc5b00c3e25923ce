"""The registered properties, in the order of the clauses they check.

Importing :mod:`.properties` registers every property (:mod:`.registration`); this module
sits above the property modules, so none of them can import it (tests/test_architecture.py).
"""

from __future__ import annotations

from ..claims.clauses import spec_order
from .registration import REGISTRY, Property

__all__ = ["Property", "all_properties"]


# (the registered properties, the same ones in clause order): sorted again only when the
# registry changed (a test registers and removes properties of its own)
_ordered: tuple[tuple[Property, ...], tuple[tuple[str, Property], ...]] = ((), ())


def all_properties() -> dict[str, Property]:
    """Every registered property, in the spec's order of the clauses they check (the order
    ``attnspec properties`` and the reports list them in); properties of one clause in the
    order their modules register them.  A new dict on every call; the order is computed
    once per state of the registry (it was ~40 % of a not-applicable verdict's time)."""
    from . import properties  # noqa: F401  (registers on import)

    global _ordered
    registered = tuple(REGISTRY.values())
    if registered != _ordered[0]:  # identical members compare by identity: fast
        order = spec_order()
        ranked = sorted(
            enumerate(registered),
            key=lambda item: (order.get(item[1].clause, len(order)), item[0]),
        )
        _ordered = (registered, tuple((prop.id, prop) for _, prop in ranked))
    return dict(_ordered[1])
