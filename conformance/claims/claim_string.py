"""Reading a conformance claim (CONF-13): ``"conforms to attnspec 2027.1-draft except
SDPA-5.1 (dense, mask, top-left causal; float32)"`` into its version, waived clauses,
family, features and dtypes.

The grammar is spec/index.md's (CONF-13, in EBNF); this parser is written by hand from it,
and tests/conformance/test_claim_string.py checks that the two agree: every sentence drawn
from the grammar is parsed and written back unchanged, every claim the suite prints is
parsed, and strings the grammar rejects are rejected here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "conforms to attnspec "
FAMILIES = (
    "dense",
    "sparse",
    "linear",
    "varlen",
    "kv-cache",
    "rope",
    "merge",
    "paged-batch",
    "mla",
    "fp8",
    "recurrent",
)
DTYPES = ("float16", "bfloat16", "float32", "float64")
# The fixed words of ``feature`` in the grammar, and its words with a part that varies.
FEATURE_WORDS = frozenset(
    {
        "needs E == Ev",
        "needs Lq == Lk",
        "mask",
        "bias",
        "GQA",
        "top-left causal",
        "bottom-right causal",
        "mask and causal not combined",
        "explicit scale",
        "returned weights",
        "softcap",
        "ALiBi",
        "ALiBi (standard slopes)",
        "log-sum-exp",
        "dropout",
        "paged",
        "sliding_window",
        "strided",
        "fixed",
        "block_sparse",
        "longformer",
        "bigbird",
        "elu+1",
        "relu",
        "favor+",
        "custom feature map",
        "interleaved pairing",
        "half pairing",
        "base-2 log-sum-exp",
        "tokens-first outputs",
        "tokens-first log-sum-exp",
        "tokens-first pages",
        "sinks",
        "sink tokens",
        "chunked local",
        "backward",
        "dropout backward",
        "float32 bias",
        "float8 inputs",
        "packed sequences",
        "float8 cache",
    }
)
_NUMBER = r"[1-9][0-9]*"
_VERSION = re.compile(r"[0-9]{4}\.(?:1[0-2]?|[2-9])(?:-draft)?")
_CLAUSE_ID = re.compile(rf"[A-Z]+-{_NUMBER}(?:\.{_NUMBER})*")
_BATCH_DIMS = re.compile(rf"(?:0|{_NUMBER}) batch dims?")


@dataclass(frozen=True)
class ParsedClaim:
    """The parts of a conformance claim, in the order the claim writes them."""

    version: str
    waived: tuple[str, ...]
    family: str
    features: tuple[str, ...]
    dtypes: tuple[str, ...]

    def __str__(self) -> str:
        """The claim written back (``parse_claim(text)`` gives ``text`` again)."""
        exception = f" except {', '.join(self.waived)}" if self.waived else ""
        words = ", ".join((self.family, *self.features))
        return f"{PREFIX}{self.version}{exception} ({words}; {', '.join(self.dtypes)})"


def _invalid(text: str, why: str) -> ValueError:
    return ValueError(f"claim={text!r} is not a conformance claim (CONF-13): {why}")


def _is_feature(word: str) -> bool:
    return word in FEATURE_WORDS or _BATCH_DIMS.fullmatch(word) is not None


def parse_claim(text: str) -> ParsedClaim:
    """The parts of ``text``, a ``claim`` of CONF-13's grammar; ``ValueError`` naming what
    is wrong otherwise (for ``TypeError`` on a non-string, as any bad argument type)."""
    if not isinstance(text, str):
        raise TypeError(f"claim={text!r} should be a string (CONF-13)")
    if not text.startswith(PREFIX):
        raise _invalid(text, f"it should start with {PREFIX!r}")
    head, opening, rest = text[len(PREFIX) :].partition(" (")
    if not opening or not rest.endswith(")"):
        raise _invalid(text, "the features and dtypes should follow in ' (...; ...)'")
    version, _, exception = head.partition(" except ")
    if not _VERSION.fullmatch(version):
        raise _invalid(text, f"version {version!r} should be YYYY.M, optionally -draft")
    waived = tuple(exception.split(", ")) if " except " in head else ()
    for clause_id in waived:
        if not _CLAUSE_ID.fullmatch(clause_id):
            raise _invalid(text, f"{clause_id!r} is not a clause id (AREA-N or AREA-N.M)")
    features_part, semicolon, dtypes_part = rest[:-1].partition("; ")
    if not semicolon:
        raise _invalid(text, "'; ' should separate the features from the dtypes")
    family, *features = features_part.split(", ")
    if family not in FAMILIES:
        raise _invalid(text, f"the family {family!r} should be one of {FAMILIES}")
    for word in features:
        if not _is_feature(word):
            raise _invalid(text, f"{word!r} is not a feature of the grammar")
    dtypes = tuple(dtypes_part.split(", "))
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise _invalid(text, f"the dtype {dtype!r} should be one of {DTYPES}")
    return ParsedClaim(version, waived, family, tuple(features), dtypes)
