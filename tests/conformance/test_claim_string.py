"""CONF-13: the grammar of a conformance claim (spec/index.md, in EBNF) and the parser that
reads claims (``attnspec.conformance.claims.claim_string``) agree, and every claim the suite prints
is a sentence of the grammar.

The grammar is read from the spec's own text and turned into a regular expression here
(it has no recursion), so Hypothesis can draw sentences from it; the parser is written by
hand, so the two are independent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support import DRAWN

from attnspec import SPEC_VERSION
from attnspec.conformance import (
    Fp8Claim,
    KernelDeclaration,
    LinearClaim,
    MergeClaim,
    MlaClaim,
    PagedBatchClaim,
    RecurrentClaim,
    RopeClaim,
    SparseClaim,
)
from attnspec.conformance.claims.claim_string import FEATURE_WORDS, ParsedClaim, parse_claim
from attnspec.conformance.claims.clauses import SPEC_DIR
from attnspec.conformance.report.render import conformance_claim

# --- the EBNF of CONF-13, read from spec/index.md and turned into a regular expression ------

_TOKEN = re.compile(r'\s*(?:"([^"]*)"|([a-z][a-z ]*[a-z]|[a-z])|([=,|\[\]{}();]))')


@dataclass
class _Grammar:
    rules: dict[str, Any]

    def regex(self, name: str = "claim", active: tuple[str, ...] = ()) -> str:
        if name in active:
            raise ValueError(f"the grammar recurses through {name!r}")
        return self._expr(self.rules[name], (*active, name))

    def _expr(self, node: Any, active: tuple[str, ...]) -> str:
        kind, value = node
        if kind == "terminal":
            return re.escape(value)
        if kind == "rule":
            return f"(?:{self.regex(value, active)})"
        parts = [self._expr(part, active) for part in value]
        if kind == "sequence":
            return "".join(parts)
        if kind == "choice":
            return "(?:" + "|".join(parts) + ")"
        return f"(?:{parts[0]})" + {"option": "?", "repeat": "*", "group": ""}[kind]


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while text[position:].strip():
        match = _TOKEN.match(text, position)
        assert match, f"the EBNF cannot be read at {text[position : position + 30]!r}"
        terminal, name, symbol = match.groups()
        if terminal is not None:
            tokens.append(("terminal", terminal))
        elif name is not None:
            tokens.append(("name", name))
        else:
            tokens.append(("symbol", symbol))
        position = match.end()
    return tokens


def _parse_ebnf(text: str) -> _Grammar:
    tokens = _tokens(text)
    at = 0

    def peek() -> tuple[str, str]:
        return tokens[at] if at < len(tokens) else ("end", "")

    def take(expected: str | None = None) -> tuple[str, str]:
        nonlocal at
        token = peek()
        assert expected is None or token == ("symbol", expected), (token, expected)
        at += 1
        return token

    def joined(part: Callable[[], Any], separator: str, kind: str) -> Any:
        """``part {separator part}``: one part alone, or ``(kind, parts)``."""
        parts = [part()]
        while peek() == ("symbol", separator):
            take(separator)
            parts.append(part())
        return parts[0] if len(parts) == 1 else (kind, parts)

    def expression() -> Any:
        return joined(sequence, "|", "choice")

    def sequence() -> Any:
        return joined(term, ",", "sequence")

    def term() -> Any:
        kind, value = take()
        if kind == "terminal":
            return ("terminal", value)
        if kind == "name":
            return ("rule", value)
        closing = {"[": ("]", "option"), "{": ("}", "repeat"), "(": (")", "group")}[value]
        inner = expression()
        take(closing[0])
        return (closing[1], [inner])

    rules: dict[str, Any] = {}
    while at < len(tokens):
        kind, name = take()
        assert kind == "name", (kind, name)
        take("=")
        rules[name] = expression()
        take(";")
    return _Grammar(rules)


def _ebnf() -> str:
    text = (SPEC_DIR / "index.md").read_text(encoding="utf-8")
    clause = text.split('<a id="CONF-13"></a>')[1]
    blocks = re.findall(r"```ebnf\n(.*?)```", clause, flags=re.DOTALL)
    assert blocks, "CONF-13 has no ```ebnf block"
    return blocks[0]


GRAMMAR = _parse_ebnf(_ebnf())
CLAIM = re.compile(GRAMMAR.regex())


def _in_grammar(text: str) -> bool:
    return CLAIM.fullmatch(text) is not None


def _parses(text: str) -> bool:
    try:
        parse_claim(text)
    except ValueError:
        return False
    return True


def test_the_grammar_is_read_from_the_spec() -> None:
    """CONF-13: the EBNF reader above reads the spec's rules, and the regular expression it
    builds accepts the spec's own examples and rejects a broken one."""
    assert {"claim", "version", "clause id", "feature", "dtype"} <= set(GRAMMAR.rules)
    for sentence in (
        f"conforms to attnspec {SPEC_VERSION} (dense, bias, GQA, bottom-right causal; "
        "float16, bfloat16, float32)",
        f"conforms to attnspec {SPEC_VERSION} except SDPA-5.1 (dense, mask, top-left causal; "
        "float32)",
        "conforms to attnspec 2026.12 except SDPA-1.5, SDPA-5.2 (dense, 1 batch dim, mask, "
        "bias, GQA, top-left causal, ALiBi (standard slopes); float32, float64)",
    ):
        assert _in_grammar(sentence), sentence
        assert _parses(sentence), sentence
    assert not _in_grammar("conforms to attnspec 2026.13 (dense; float32)")
    with pytest.raises(ValueError, match=r"CONF-13.*version '2026\.13'"):
        parse_claim("conforms to attnspec 2026.13 (dense; float32)")


_MUTATION_ALPHABET = " ,;()-.0123456789abcdefxyzADEGLMSQV+=_"


@settings(DRAWN, max_examples=150)
@given(
    st.from_regex(CLAIM, fullmatch=True),
    st.lists(
        st.tuples(
            st.sampled_from(("delete", "insert", "replace")),
            st.integers(0, 10_000),
            st.sampled_from(_MUTATION_ALPHABET),
        ),
        min_size=1,
        max_size=3,
    ),
)
@example("conforms to attnspec 2027.1-draft (dense; float32)", [("replace", 49, ";")])
@example("conforms to attnspec 2027.1 (dense; float32)", [("insert", 27, "3")])  # month 13
@example("conforms to attnspec 2027.1 (dense; float32)", [("insert", 27, "0")])  # month 10
@example("conforms to attnspec 2027.1 except SDPA-5.1 (dense; float32)", [("replace", 40, "0")])
def test_the_parser_reads_the_grammars_sentences_and_rejects_what_the_grammar_rejects(
    text: str, mutations: list[tuple[str, int, str]]
) -> None:
    """CONF-13: the parser accepts every sentence drawn from the grammar and writes it back
    unchanged from its parts; on strings near those sentences (a few characters deleted,
    inserted or replaced), it accepts exactly those the grammar accepts.  One test for both
    because drawing a sentence from the grammar is what costs (~15 ms each); each sentence
    drawn is checked both ways."""
    assert str(parse_claim(text)) == text, "not written back unchanged"
    for kind, position, character in mutations:
        at = position % (len(text) + 1)
        if kind == "delete":
            text = text[:at] + text[at + 1 :]
        elif kind == "insert":
            text = text[:at] + character + text[at:]
        else:
            text = text[:at] + character + text[at + 1 :]
    assert _parses(text) == _in_grammar(text), text


FLIPPED = (
    "equal_head_dims equal_lengths empty_sizes bias gqa mask_and_causal returns_weights "
    "empty_rows_zero softcap alibi alibi_builtin_slopes returns_lse dropout sinks sink_tokens "
    "chunk "
    "backward backward_dropout float32_bias"
).split()


def _declarations() -> list[KernelDeclaration]:
    """Declarations that together show every word of the claims table (CONF-3)."""
    # every boolean claim the other way from its default (a word each), one batch dim
    # (not the default's "batch dims") and bottom-right causal alignment
    default = KernelDeclaration()
    every = KernelDeclaration(
        batch_ndim=1,
        causal_alignment="bottom_right",
        **{name: not getattr(default, name) for name in FLIPPED},
    )
    declarations = [
        every,
        KernelDeclaration(batch_ndim=0, alibi=True),
        KernelDeclaration(batch_ndim=3, causal=False, mask=False, scale=False),
        KernelDeclaration(varlen=True),
        KernelDeclaration(varlen=True, varlen_mask=True),
        KernelDeclaration(kv_cache=True, kv_cache_paged=True),
        *(KernelDeclaration(sparse=SparseClaim(pattern)) for pattern in _sparse_patterns()),
        *(
            KernelDeclaration(linear=LinearClaim(feature_map))
            for feature_map in ("elu+1", "relu", "favor+", lambda x: x)
        ),
        *(KernelDeclaration(rope=RopeClaim(pairing)) for pairing in ("interleaved", "half")),
        KernelDeclaration(merge=MergeClaim()),
        KernelDeclaration(merge=MergeClaim(base="2", out_layout="lhd", lse_layout="lh")),
        KernelDeclaration(paged_batch=PagedBatchClaim()),
        KernelDeclaration(paged_batch=PagedBatchClaim(cache_layout="nhd", page_size=16)),
        KernelDeclaration(paged_batch=PagedBatchClaim("nhd"), fp8=Fp8Claim()),
        KernelDeclaration(varlen=True, fp8=Fp8Claim()),
        KernelDeclaration(paged_batch=PagedBatchClaim(), fp8=Fp8Claim(kv_only=True)),
        KernelDeclaration(mla=MlaClaim()),
        KernelDeclaration(
            mla=MlaClaim(paged=True, page_size=64, default_scale=True), returns_lse=True
        ),
        KernelDeclaration(recurrent=RecurrentClaim()),
        KernelDeclaration(recurrent=RecurrentClaim("gated", "channel", 1, True)),
        KernelDeclaration(recurrent=RecurrentClaim(varlen=True, chunk_sizes=(16, 32))),
    ]
    return declarations


def _sparse_patterns() -> tuple[str, ...]:
    from attnspec.reference.sparse import PATTERN_NAMES

    return tuple(PATTERN_NAMES)


def test_every_claim_the_suite_prints_is_a_sentence_of_the_grammar() -> None:
    """CONF-13 (and CONF-1, CONF-7): the claim the suite prints for a declaration is a
    sentence of the grammar, parsed back into the version checked, the waived clauses, the
    declaration's family and words, and the dtypes; together the declarations use every
    feature word of the grammar, so the grammar lists no word the suite cannot print."""
    shown: set[str] = set()
    for declaration in _declarations():
        dtypes = declaration.dtypes or ("float32", "float64")
        claim = conformance_claim(declaration, tuple(dtypes))
        assert _in_grammar(claim), claim
        parsed = parse_claim(claim)
        assert parsed == ParsedClaim(
            SPEC_VERSION,
            tuple(declaration.waived),
            declaration.family,
            parsed.features,
            tuple(dtypes),
        )
        shown.update(parsed.features)
    assert FEATURE_WORDS <= shown, sorted(FEATURE_WORDS - shown)
    assert {"0 batch dims", "1 batch dim", "3 batch dims"} <= shown


def test_the_claims_of_the_matrix_are_sentences_of_the_grammar() -> None:
    """CONF-13: every claim docs/matrix.md records for a known kernel (checked against
    2026.12, written by the suite of its day) is a sentence of the grammar and is parsed."""
    matrix = (SPEC_DIR.parent / "docs" / "matrix.md").read_text(encoding="utf-8")
    claims = re.findall(
        r"conforms to attnspec \S+(?: except [^(]+?)? \((?:[^()]|\([^()]*\))*\)", matrix
    )
    assert claims, "docs/matrix.md records no conformance claim"
    for claim in claims:
        assert _in_grammar(claim), claim
        assert str(parse_claim(claim)) == claim


def test_a_bad_claim_names_what_is_wrong() -> None:
    """CONF-13: the parser's errors name the part that breaks the grammar; a non-string is
    a TypeError."""
    cases = {
        "conforms to attnspec 2027.1-draft (dense, masks; float32)": "'masks' is not a feature",
        "conforms to attnspec 2027.1-draft except sdpa-5.1 (dense; float32)": "'sdpa-5.1' is not",
        "conforms to attnspec 2027.1-draft (dense; float8)": "the dtype 'float8'",
        "conforms to attnspec 2027.1-draft (dense)": "'; ' should separate",
        "attnspec 2027.1 (dense; float32)": "should start with",
    }
    for text, why in cases.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_claim(text)
    with pytest.raises(TypeError, match="should be a string"):
        parse_claim(b"conforms to attnspec 2027.1 (dense; float32)")  # type: ignore[arg-type]
