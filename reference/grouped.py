"""The grouped layout every dense definition is computed in (SDPA-6.1: query heads in
groups over one key/value head): :class:`GroupedInputs`, made by ``sdpa.prepare`` and read
by the score features (``features.py``), the dense, blocked, sparse and backward
references and the tolerance model.  Its own module so that ``sdpa`` and ``features``,
which both use it, need not import each other."""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

from ._array import Array


class GroupedInputs(NamedTuple):
    """Validated, broadcast inputs in the computation dtype, heads split into groups.

    Not a second description of a problem (that is the arguments of
    :func:`~.attention.scaled_dot_product_attention`, and ``conformance.call.problem.Problem`` in
    the suite):
    the form the definition is computed in.

    ``q`` is ``(*batch, Hkv, G, Lq, E)``; ``k`` and ``v`` are ``(*batch, Hkv, 1, Lk, ·)``;
    ``allowed`` (or None when every key is allowed) and ``bias`` (or None) broadcast to
    ``(*batch, Hkv, G, Lq, Lk)``.  ``softcap`` (or None) caps the scaled dot products
    (SOFTCAP-1) and ``alibi`` (or None) is the ALiBi bias in the grouped layout (ALIBI-2),
    both set by :func:`~.sdpa.with_features`.  Shared by the dense reference and the tolerance
    model.
    """

    xp: ModuleType
    q: Array
    k: Array
    v: Array
    allowed: Array
    bias: Array
    scale: float
    out_dtype: Any
    out_shape: tuple[int, ...]
    softcap: float | None = None
    alibi: Any = None
