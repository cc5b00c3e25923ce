"""The keyword arguments of the reference's public functions, each written once: its name
and type in a TypedDict (here the sets several functions share, beside each function the
set it adds), its default in :data:`DEFAULTS`.

The mask, the bias and the causal rule (SDPA-3, SDPA-4), the scale (SDPA-2), the softcap
(SOFTCAP-1), the ALiBi slopes (ALIBI-2), dropout (DROP-2), what is returned (LSE-1) and the
block sizes recur in a dozen public signatures: attention in both forms, its backward, its
bounds, the packed and cached forms.  Each of those declares ``**given: Unpack[SomeOptions]``,
so a type checker checks every keyword by name and type, and is decorated with
:func:`shows_options` (:func:`~._keywords.shows_keywords`), which gives ``help()`` and
``inspect.signature`` the explicit keyword-only parameters with their defaults and rejects a
keyword outside them, or a missing required one, as Python would.  :func:`filled` turns what
a call gave into the whole set, each keyword not given at its default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypedDict, TypeVar, cast

from ._array import Array
from ._keywords import shows_keywords

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# Elements of one (rows x keys) chunk of the bounds: ~8 MB per float64 temporary (measured:
# as fast as larger chunks, its passes nearer the cache).
CHUNK_ELEMENTS = 2**20


class _Masks(TypedDict, total=False):
    mask: Array
    bias: Array


class CausalOptions(TypedDict, total=False):
    """The causal rule (SDPA-4) and the scale (SDPA-2)."""

    is_causal: bool
    causal_alignment: str
    scale: float | None


class DenseOptions(_Masks, CausalOptions, total=False):
    """The keywords of spec/dense.md that decide the scores (SDPA-2 … SDPA-4)."""


class FeatureOptions(TypedDict, total=False):
    """The score features of spec/features.md: softcapping (SOFTCAP-1) and ALiBi (ALIBI-2)."""

    softcap: float | None
    alibi_slopes: Array


class ScoreOptions(DenseOptions, FeatureOptions, total=False):
    """:class:`DenseOptions` and the score features of spec/features.md."""


class DropoutOptions(TypedDict, total=False):
    """Dropout with an explicit keep mask (DROP-2)."""

    dropout_p: float
    dropout_keep: Array


class AttentionOptions(ScoreOptions, DropoutOptions, total=False):
    """``scaled_dot_product_attention``'s and ``plain_attention``'s keywords."""

    return_weights: bool
    return_lse: bool


class SinkLogits(TypedDict, total=False):
    """One sink logit per query head, ``(Hq,)``, in every row's denominator (SINK-1) of a
    packed or cache call; each sequence's rows get SINK-1 … SINK-3."""

    sinks: Array


class ReturnLse(TypedDict, total=False):
    """Whether the log-sum-exp is returned too (LSE-1)."""

    return_lse: bool


class BlockOptions(TypedDict, total=False):
    """Query rows and keys processed at a time (None: ``default_block_sizes``)."""

    query_chunk: int | None
    key_block: int | None


class BlockedOptions(ScoreOptions, ReturnLse, BlockOptions, total=False):
    """``blocked_attention``'s keywords."""


class UpstreamLse(TypedDict, total=False):
    """The upstream gradient of the log-sum-exp (BWD-10)."""

    grad_lse: Array


# The defaults other than None (an array's None: not given); a required keyword, one of a
# total=True base, has none
DEFAULTS: Mapping[str, Any] = {
    "is_causal": False,
    "causal_alignment": "top_left",
    "dropout_p": 0.0,
    "return_weights": False,
    "return_lse": False,
    "weights": True,
    "chunk_elements": CHUNK_ELEMENTS,
    "window": (None, None),
    "eps": 0.0,
    "orthogonal": True,
}


def shows_options(kind: type) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """:func:`~._keywords.shows_keywords` for a TypedDict ``kind`` of these keywords, with
    their defaults in :data:`DEFAULTS`."""
    return shows_keywords(kind, DEFAULTS)


def filled(kind: type[T], given: Mapping[str, object], defaults: Mapping[str, Any] = DEFAULTS) -> T:
    """Every keyword of the TypedDict ``kind`` (its keys, its bases' first): those in
    ``given``, the others at their ``defaults`` (None where it has none)."""
    keys = kind.__annotations__
    return cast(T, {name: given[name] if name in given else defaults.get(name) for name in keys})
