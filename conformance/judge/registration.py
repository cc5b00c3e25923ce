"""How a property is declared: one per spec clause it checks, registered under a stable id.

Property modules (``properties/*.py``) register their checks here on import;
:mod:`.registry` imports them all and lists them in clause order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..claims.clauses import clause as spec_clause
from ..claims.declaration import KernelDeclaration

if TYPE_CHECKING:
    from ...backends import Backend

# "hypothesis": check(kernel, data) runs once per generated example.
# "fixed": check(kernel, seed) runs once; statistical checks state their false-failure rate.
KINDS = ("hypothesis", "fixed")


# families with calling conventions of their own
PACKED_FAMILIES = ("varlen", "kv-cache", "rope", "merge", "paged-batch", "mla", "fp8", "recurrent")


def always(declaration: KernelDeclaration) -> str | None:
    """Every family whose kernels take ``fn(q, k, v, ...)`` problems: dense, sparse and
    linear.  Packed (varlen) and KV-cache kernels have calling conventions of their own
    and their own properties (spec/features.md)."""
    if declaration.family in PACKED_FAMILIES:
        return f"the kernel declares {declaration.family} attention, checked by its own properties"
    return None


def dense_only(declaration: KernelDeclaration) -> str | None:
    if declaration.family != "dense":
        return f"the kernel declares {declaration.family} attention, not dense SDPA"
    return None


def needs(*claims: str) -> Callable[[KernelDeclaration], str | None]:
    """Applicable only to dense kernels with every named boolean claim set."""

    def applies(declaration: KernelDeclaration) -> str | None:
        reason = dense_only(declaration)
        if reason:
            return reason
        missing = [c for c in claims if not getattr(declaration, c)]
        return f"the kernel does not claim {', '.join(missing)}" if missing else None

    return applies


def takes_any_batch_dims(declaration: KernelDeclaration) -> str | None:
    """Applicable only to dense kernels that take any number of batch dims (no
    ``batch_ndim``): broadcasting between q, k and v's batch shapes (SDPA-1.2)."""
    reason = dense_only(declaration)
    if reason is None and declaration.batch_ndim is not None:
        reason = (
            f"the kernel declares exactly {declaration.batch_ndim} batch "
            f"dim{'' if declaration.batch_ndim == 1 else 's'} (batch_ndim): "
            "q, k and v then share one batch shape (CONF-3)"
        )
    return reason


def family_only(family: str, otherwise: str) -> Callable[[KernelDeclaration], str | None]:
    """Applicable only to kernels declaring ``family`` (merge, RoPE, ...: the families
    with calling conventions of their own); ``otherwise`` says why not."""

    def applies(declaration: KernelDeclaration) -> str | None:
        return None if declaration.family == family else otherwise

    return applies


@dataclass(frozen=True)
class Property:
    id: str
    clause: str
    kind: str
    check: Callable[..., None]
    applies: Callable[[KernelDeclaration], str | None]
    # why the property has nothing to check on a backend (None: it applies on every one)
    applies_on: Callable[[Backend], str | None] | None = None
    # the family whose anchors and strata its examples come from (draw.anchors.anchors_of)
    draws: str = "dense"
    # the property whose examples this one draws (the same Hypothesis seeds, so the same
    # problems): it judges the kernel outputs that property got (None: its own examples)
    draws_as: str | None = None

    def not_applicable(self, declaration: KernelDeclaration, backend: Backend) -> str | None:
        """Why the property does not apply to a kernel declaring ``declaration`` on
        ``backend`` (None: it applies)."""
        reason = self.applies(declaration)
        if reason is None and self.applies_on is not None:
            reason = self.applies_on(backend)
        return reason

    @property
    def level(self) -> str:
        """The clause's level in the spec (CONF-1, CONF-2): MUST decides conformance."""
        return spec_clause(self.clause).level


REGISTRY: dict[str, Property] = {}


def register(
    property_id: str,
    clause: str,
    *,
    kind: str = "hypothesis",
    applies: Callable[[KernelDeclaration], str | None] = dense_only,
    applies_on: Callable[[Backend], str | None] | None = None,
    draws: str = "dense",
    draws_as: str | None = None,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``check`` as property ``property_id`` citing ``clause``; ``draws``: the
    family whose anchors and strata it draws from ("paged-batch": the paged batches of
    ``anchors.PAGED_ANCHORS`` and the mixed-batch stratum; "kv-cache": the dense anchors,
    then the calls of ``anchors.KV_CACHE_ANCHORS``; else the dense anchors);
    ``draws_as``: the registered property whose examples it draws too (its check draws as
    that one's does)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}, but should be one of {KINDS}")

    def decorate(check: Callable[..., Any]) -> Callable[..., Any]:
        if property_id in REGISTRY:
            raise ValueError(f"property {property_id!r} is registered twice")
        if not check.__doc__:
            raise ValueError(f"property {property_id!r} needs a docstring saying what it proves")
        if draws_as is not None and draws_as not in REGISTRY:
            raise ValueError(f"property {property_id!r} draws as {draws_as!r}, not registered")
        REGISTRY[property_id] = Property(
            property_id, clause, kind, check, applies, applies_on, draws, draws_as
        )
        return check

    return decorate
