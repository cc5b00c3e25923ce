"""What each field of a :class:`~.declaration.KernelDeclaration` may hold (CONF-3).

First its type (a bool is not an int here), then its value: dtypes the suite knows, a
batch rank it can draw, a causal alignment the spec defines, a RoPE pairing, base and
rotary dimension, a merge base and layouts it can check.  A declaration checks itself with
:func:`check_fields` when it is made, so a bad claim fails where it is written
(``declare(...)``, a flag), not properties later.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...backends import FLOAT_DTYPE_NAMES
from ...reference.masks import CAUSAL_ALIGNMENTS
from ...reference.positional import ROPE_LAYOUTS
from . import family_claims as family

# The types a field of each simple annotation takes (a bool is not an int here).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "bool": (bool,),
    "str": (str,),
    "str | None": (str, type(None)),
    "int | None": (int, type(None)),
}


def type_problem(name: str, annotation: str, value: Any) -> str | None:
    """What is wrong with the type of field ``name`` (annotated ``annotation``), or None."""
    allowed = _FIELD_TYPES.get(annotation)
    if not allowed or (
        isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
    ):
        return None
    expected = (
        "True or False"
        if allowed == (bool,)
        else " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
    )
    return f"{name}={value!r}, but should be {expected}"


def _rope_invalid(value: Any) -> str | None:
    if value is None:
        return None
    if value.pairing not in ROPE_LAYOUTS:
        return f"rope pairing={value.pairing!r}, but should be one of {ROPE_LAYOUTS}"
    if not (isinstance(value.base, (int, float)) and value.base > 0):
        return f"rope base={value.base!r}, but should be a number > 0"
    dim = value.rotary_dim
    if dim is not None and (
        isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2
    ):
        return f"rope rotary_dim={dim!r}, but should be None or an even int >= 2"
    return None


def _merge_invalid(value: Any) -> str | None:
    if value is None:
        return None
    for name, allowed in (
        ("base", family.MERGE_BASES),
        ("out_layout", family.MERGE_OUT_LAYOUTS),
        ("lse_layout", family.MERGE_LSE_LAYOUTS),
    ):
        if getattr(value, name) not in allowed:
            return f"merge {name}={getattr(value, name)!r}, but should be one of {allowed}"
    return None


def _paged_batch_invalid(value: Any) -> str | None:
    if value is None:
        return None
    if value.cache_layout not in family.PAGED_CACHE_LAYOUTS:
        return (
            f"paged_batch cache_layout={value.cache_layout!r}, but should be one of "
            f"{family.PAGED_CACHE_LAYOUTS}"
        )
    size = value.page_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        return f"paged_batch page_size={size!r}, but should be None or an int >= 1"
    features = value.features
    if not isinstance(features, tuple) or not set(features) <= set(family.PAGED_FEATURES):
        return (
            f"paged_batch features={features!r}, but should be a tuple of {family.PAGED_FEATURES}"
        )
    return None


def _mla_invalid(value: Any) -> str | None:
    if value is None:
        return None
    for name, least in (("value_dim", 1), ("rope_dim", 0)):
        size = getattr(value, name)
        if isinstance(size, bool) or not isinstance(size, int) or size < least:
            return f"mla {name}={size!r}, but should be an int >= {least}"
    for name in ("paged", "default_scale"):
        if not isinstance(getattr(value, name), bool):
            return f"mla {name}={getattr(value, name)!r}, but should be a bool"
    size = value.page_size
    if size is not None and (
        not value.paged or isinstance(size, bool) or not isinstance(size, int) or size < 1
    ):
        return f"mla page_size={size!r}, but should be None, or an int >= 1 with paged=True"
    return None


def _fp8_invalid(value: Any) -> str | None:
    if value is None:
        return None
    formats = value.formats
    if not isinstance(formats, tuple) or not formats or not set(formats) <= set(family.FP8_FORMATS):
        return f"fp8 formats={formats!r}, but should be a non-empty tuple of {family.FP8_FORMATS}"
    if value.descale not in family.FP8_DESCALES:
        return f"fp8 descale={value.descale!r}, but should be one of {family.FP8_DESCALES}"
    if value.weights is not None and value.weights not in family.FP8_FORMATS:
        return f"fp8 weights={value.weights!r}, but should be None or one of {family.FP8_FORMATS}"
    if not isinstance(value.kv_only, bool):
        return f"fp8 kv_only={value.kv_only!r}, but should be a bool"
    return None


def _recurrent_invalid(value: Any) -> str | None:
    if value is None:
        return None
    for name, allowed in (("rule", family.RECURRENT_RULES), ("gate", family.RECURRENT_GATES)):
        if getattr(value, name) not in allowed:
            return f"recurrent {name}={getattr(value, name)!r}, but should be one of {allowed}"
    size = value.chunk_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return f"recurrent chunk_size={size!r}, but should be an int >= 1"
    for name in ("rounded_operands", "varlen", "value_groups"):
        if not isinstance(getattr(value, name), bool):
            return f"recurrent {name}={getattr(value, name)!r}, but should be a bool"
    sizes = value.chunk_sizes
    if not isinstance(sizes, tuple) or any(
        isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in sizes
    ):
        return f"recurrent chunk_sizes={sizes!r}, but should be a tuple of ints >= 1"
    if value.state_dtype not in (None, *family.RECURRENT_STATE_DTYPES):
        return (
            f"recurrent state_dtype={value.state_dtype!r}, but should be None or one of "
            f"{family.RECURRENT_STATE_DTYPES}"
        )
    eps = value.qk_l2norm
    if eps is not None and (
        isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf
    ):
        return f"recurrent qk_l2norm={eps!r}, but should be None or a finite float >= 0"
    return None


def _dtypes_invalid(value: Any) -> str | None:
    if value is not None and (not value or any(d not in FLOAT_DTYPE_NAMES for d in value)):
        return f"dtypes={value!r}, but should be a non-empty subset of {FLOAT_DTYPE_NAMES}"
    return None


def _batch_ndim_invalid(value: Any) -> str | None:
    # an int or None by now: KernelDeclaration checks its fields' types first
    if value is not None and not 0 <= value <= 4:
        return f"batch_ndim={value!r}, but should be None or 0..4"
    return None


def _alignment_invalid(value: object) -> str | None:
    if value not in CAUSAL_ALIGNMENTS:
        return f"causal_alignment={value!r}, but should be one of {CAUSAL_ALIGNMENTS}"
    return None


def _family_alignment_invalid(value: Any) -> str | None:
    if value is None:
        return None
    return _alignment_invalid(
        getattr(value, "alignment", None) or getattr(value, "causal_alignment", None)
    )


def _backward_fn_invalid(value: Any) -> str | None:
    if value is None or callable(value) or (isinstance(value, str) and ":" in value):
        return None
    return (
        f"backward_fn={value!r}, but should be None, a callable, or 'MODULE:FUNC' / "
        "'path/to/file.py:FUNC' naming one"
    )


def _kv_cache_features_invalid(value: Any) -> str | None:
    if not set(value) <= set(family.KV_CACHE_FEATURES):
        return f"kv_cache_features={value!r}, but should be a tuple of {family.KV_CACHE_FEATURES}"
    return None


#: The value check of each field that has one: a message saying what is wrong, or None.
VALUE_CHECKS: Mapping[str, Callable[[Any], str | None]] = {
    "dtypes": _dtypes_invalid,
    "batch_ndim": _batch_ndim_invalid,
    "causal_alignment": _alignment_invalid,
    "sparse": _family_alignment_invalid,
    "linear": _family_alignment_invalid,
    "rope": _rope_invalid,
    "merge": _merge_invalid,
    "paged_batch": _paged_batch_invalid,
    "kv_cache_features": _kv_cache_features_invalid,
    "mla": _mla_invalid,
    "fp8": _fp8_invalid,
    "recurrent": _recurrent_invalid,
    "backward_fn": _backward_fn_invalid,
}


def check_fields(declared: Iterable[tuple[str, str, Any]]) -> None:
    """Raise TypeError for the first field (name, annotation, value) of the wrong type,
    else ValueError for the first whose value its check refuses."""
    fields = list(declared)
    for name, annotation, value in fields:
        problem = type_problem(name, annotation, value)
        if problem:
            raise TypeError(problem)
    for name, _, value in fields:
        check = VALUE_CHECKS.get(name)
        problem = check(value) if check else None
        if problem:
            raise ValueError(problem)
