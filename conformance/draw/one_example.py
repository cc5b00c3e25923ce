"""The draws of a realistic stratum that runs one example per property.

Hypothesis runs the simplest example first, so a stratum of one example gets the simplest
choice of every draw.  For its sizes that is the point: the smallest problem the stratum
allows, one past a block (:mod:`.sizes`).  For everything else it is not: no mask, no
bias, the default scale, an all-True mask where one is forced, the first permutation, the
smallest magnitude, ...  So in the quick profile the decode and wide-head strata and the
option combinations met almost none of the inputs the properties draw.  There,
:class:`SeededBesidesSizes` answers the size draws from Hypothesis (the simplest, as
before) and every other draw from a random source seeded by the stratum's Hypothesis
seed: the same in every run with the same seed, different from property to property and
stratum to stratum.  The anchors keep Hypothesis's simplest draws: an anchor is an
upstream test's problem, options included (the padded batch's finfo.min padding with the
default scale, ...).  On a backend that compiles per shape, the options tied to a pooled
shape stay tied (:class:`.shape_pool.TiedDraws` wraps this).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .seeded import SeededDraws
from .sizes import Stratum

# The labels of the draws that choose a problem's sizes (sizes.draw_realistic_dims,
# strategies.draw_dims, shape_pool.choose, and the lengths properties change: causal's
# Lk != Lq, bottom-right empty rows' Lq > Lk), and the prefix of its batch dims' labels.
SIZE_LABELS = frozenset(
    {
        "shape kind",
        "L",
        "Lq",
        "Lk",
        "E",
        "Ev",
        "G",
        "Hkv",
        "batch ndim",
        "shape (pooled)",
        "Lk - Lq",
        "Lq - Lk",
    }
)
SIZE_LABEL_PREFIX = "batch "


def is_size_draw(label: str | None) -> bool:
    """Whether a draw labelled ``label`` chooses a size of the problem."""
    return label is not None and (label in SIZE_LABELS or label.startswith(SIZE_LABEL_PREFIX))


def seeds_besides_sizes(stratum: Stratum, examples: int) -> bool:
    """Whether ``examples`` examples of ``stratum`` draw all but their sizes from a seeded
    source: one example of a realistic stratum that is not an anchor."""
    return stratum.realistic and examples == 1 and stratum.anchor is None


class SeededBesidesSizes:
    """Hypothesis's ``data`` for the sizes, a source seeded by ``seed`` for every other draw
    (see the module doc).  Made afresh for each call of the test, so a replayed example
    (shrinking its sizes) draws the same values from the seeded source."""

    def __init__(self, data: Any, seed: int) -> None:
        self._data, self._seeded = data, SeededDraws(seed)

    def draw(self, strategy: st.SearchStrategy[Any], label: str | None = None) -> Any:
        if is_size_draw(label):
            return self._data.draw(strategy, label=label)
        return self._seeded.draw(strategy, label)
