"""The spec's own text, checked as data.

Clause declarations parse and sit in the right documents; the dense, tolerance and
conformance clause list below is the contract code cites; the worked causal examples,
the tolerance constants and the TOL-2 formula quoted in the text agree with the
reference; and the citation metadata carries the spec version.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import oracle
import pytest

import attnspec
from attnspec.backends import Backend
from attnspec.conformance.claims.clauses import LEVELS, SPEC_DIR, all_clauses
from attnspec.reference import tolerance
from attnspec.reference.masks import causal_mask

ROOT = SPEC_DIR.parent
CLAUSE_ID = r"[A-Z]+-[0-9]+(?:\.[0-9]+)*"
AREA_DOCUMENT = {
    "CONF": "index.md",
    "SDPA": "dense.md",
    "DROP": "dense.md",
    "MHA": "dense.md",
    "POS": "dense.md",
    "ROPE": "dense.md",
    "TOL": "tolerance.md",
    "SPARSE": "sparse.md",
    "LIN": "linear.md",
    "SOFTCAP": "features.md",
    "ALIBI": "features.md",
    "LSE": "features.md",
    "VARLEN": "features.md",
    "KVCACHE": "features.md",
    "SINK": "serving.md",
    "CHUNK": "serving.md",
    "MERGE": "serving.md",
    "MLA": "serving.md",
    "PAGED": "serving.md",
    "QUANT": "serving.md",
    "BWD": "backward.md",
    "REC": "recurrent.md",
}
# The contract: exactly these ids at exactly these levels (CONF-1, CONF-2). Code and tests cite
# them; changing one means a new id (spec/index.md, versioning policy), not an edit here.
# Split clauses keep their id for the main requirement; the split-off part has the next free
# number of its section: SDPA-1.8, SDPA-7.7, DROP-6.
CONTRACT = {
    "SDPA-1.1": "MUST",
    "SDPA-1.2": "MUST",
    "SDPA-1.3": "MUST",
    "SDPA-1.4": "MUST",
    "SDPA-1.5": "MUST",
    "SDPA-1.6": "MUST",
    "SDPA-1.7": "MUST",
    "SDPA-1.8": "SHOULD",
    "SDPA-2.1": "MUST",
    "SDPA-2.2": "MUST",
    "SDPA-3.1": "MUST",
    "SDPA-3.2": "MUST",
    "SDPA-3.3": "MUST",
    "SDPA-3.4": "MUST",
    "SDPA-4.1": "MUST",
    "SDPA-4.2": "MUST",
    "SDPA-4.3": "MUST",
    "SDPA-4.4": "MUST",
    "SDPA-5.1": "MUST",
    "SDPA-5.2": "MUST",
    "SDPA-6.1": "MUST",
    "SDPA-6.2": "SHOULD",
    "SDPA-7.1": "MUST",
    "SDPA-7.2": "SHOULD",
    "SDPA-7.3": "MUST",
    "SDPA-7.4": "MUST",
    "SDPA-7.5": "MUST",
    "SDPA-7.6": "MUST",
    "SDPA-7.7": "MAY",
    "SDPA-7.8": "MUST",
    "SDPA-8.1": "MUST",
    "SDPA-8.2": "SHOULD",
    "SDPA-8.3": "MUST",
    "DROP-1": "MAY",
    "DROP-2": "MUST",
    "DROP-3": "MUST",
    "DROP-4": "MUST",
    "DROP-5": "MUST",
    "DROP-6": "MUST",
    "ROPE-1": "MUST",
    "ROPE-3": "MUST",
    "TOL-1": "MUST",
    "TOL-2": "MUST",
    "TOL-3": "MUST",
    "TOL-4": "MUST",
    "TOL-5": "MUST",
    "TOL-6": "MUST",
    "CONF-1": "MUST",
    "CONF-2": "SHOULD",
    "CONF-3": "MUST",
    "CONF-4": "MUST",
    "CONF-5": "MUST",
    "CONF-6": "MUST",
    "CONF-7": "MUST",
    "CONF-8": "MUST",
    # added in 2027.1-draft: the requirements on checkers (CONF-9 split from CONF-5, CONF-10
    # from CONF-7) and the claim's grammar
    "CONF-9": "MUST",
    "CONF-10": "MUST",
    "CONF-11": "MUST",
    "CONF-12": "MUST",
    "CONF-13": "MUST",
    "CONF-14": "MUST",
    "CONF-15": "MUST",
}
# Informative definitions with an id (spec/index.md, section 4): citable, not clauses. MHA-1,
# MHA-2 and POS-1 were MUST clauses nothing checked, ROPE-2 a consequence of ROPE-1 (CHANGELOG).
DEFINITIONS = {"MHA-1", "MHA-2", "POS-1", "ROPE-2"}
CONTRACT_AREAS = {clause_id.split("-")[0] for clause_id in CONTRACT} | {"MHA", "POS"}
DTYPES = ("float16", "bfloat16", "float32", "float64")


def _text(name: str) -> str:
    return (SPEC_DIR / name).read_text(encoding="utf-8")


def _power_of_two(exponent: str) -> float:
    return 2.0 ** int(exponent)


@pytest.mark.parametrize("document", sorted(p.name for p in SPEC_DIR.glob("*.md")))
def test_every_anchor_and_lead_is_a_parsed_clause(document: str) -> None:
    """All clauses: every clause anchor and every bold clause lead in a spec document is
    part of a clause the parser reads, so a malformed clause cannot silently vanish."""
    text = _text(document)
    parsed = [c.id for c in all_clauses().values() if c.document == document]
    definitions = re.findall(
        rf'^<a id="({CLAUSE_ID})"></a>\n\*\*\1 \(informative\) ', text, flags=re.MULTILINE
    )
    assert set(definitions) <= DEFINITIONS, f"{document}: unlisted informative definitions"
    anchors = re.findall(rf'<a id="({CLAUSE_ID})"></a>', text)
    leads = re.findall(rf"^\*\*({CLAUSE_ID}) \(", text, flags=re.MULTILINE)
    assert sorted(anchors) == sorted(parsed + definitions), f"{document}: anchors without a lead"
    assert sorted(leads) == sorted(parsed + definitions), f"{document}: leads without an anchor"


def test_clauses_have_valid_levels_areas_and_documents() -> None:
    """All clauses: levels are RFC 2119 words, each area lives in its own document
    (docs/architecture.md), titles are non-empty; ids are unique (the parser raises)."""
    clauses = all_clauses()
    assert clauses, f"no clause parsed from {SPEC_DIR}"
    for clause in clauses.values():
        assert clause.level in LEVELS, clause
        area = clause.id.split("-")[0]
        assert AREA_DOCUMENT.get(area) == clause.document, clause
        assert clause.title.strip(), clause


def test_dense_tolerance_and_conformance_clauses_are_the_contract() -> None:
    """SDPA-*, DROP-1, MHA-*, POS-1, ROPE-*, TOL-*, CONF-*: exactly the contracted ids at
    exactly the contracted levels."""
    declared = {
        c.id: c.level for c in all_clauses().values() if c.id.split("-")[0] in CONTRACT_AREAS
    }
    assert declared == CONTRACT


def test_decision_clauses_have_a_rationale() -> None:
    """SDPA-*, DROP-1, MHA-*, POS-1, ROPE-*, TOL-*: each clause body carries its one-line
    rationale before the next clause starts."""
    for document in ("dense.md", "tolerance.md", "features.md", "serving.md", "backward.md"):
        bodies = re.split(rf'^<a id="(?={CLAUSE_ID}"></a>)', _text(document), flags=re.MULTILINE)
        for body in bodies[1:]:
            clause_id = body.split('"', 1)[0]
            assert "\n*Rationale:*" in body, f"{document}: {clause_id} has no rationale"


def _worked_examples() -> list[tuple[str, int, int, np.ndarray]]:
    pattern = re.compile(
        r"^```text\n(top_left|bottom_right) Lq=(\d+) Lk=(\d+)\n((?:[01 ]+\n)+)```", re.MULTILINE
    )
    return [
        (alignment, int(lq), int(lk), np.array([row.split() for row in rows.splitlines()], int))
        for alignment, lq, lk, rows in pattern.findall(_text("dense.md"))
    ]


def test_worked_causal_examples_follow_the_rule_and_the_reference() -> None:
    """SDPA-4.1, SDPA-4.2, SDPA-4.3: the 0/1 examples in dense.md are the causal rule
    (independent oracle) and what the reference's causal_mask builds."""
    examples = _worked_examples()
    shown = {(alignment, lq, lk) for alignment, lq, lk, _ in examples}
    sizes = ((3, 5), (5, 3))
    assert shown == {(a, lq, lk) for a in ("top_left", "bottom_right") for lq, lk in sizes}
    xp = Backend("numpy").xp
    for alignment, lq, lk, table in examples:
        assert table.shape == (lq, lk), (alignment, lq, lk)
        expected = oracle.causal_matrix(lq, lk, alignment)
        np.testing.assert_array_equal(table.astype(bool), expected, err_msg=alignment)
        built = np.asarray(causal_mask(lq, lk, alignment, xp=xp))
        np.testing.assert_array_equal(built, expected, err_msg=alignment)


def _constants_table() -> dict[str, tuple[float, float, float]]:
    power = r"\$2\^\{(-\d+)\}\$"
    row = re.compile(rf"^\| `(\w+)` \| {power} \| {power} \| {power} \|$", re.MULTILINE)
    return {
        dtype: (_power_of_two(u_d), _power_of_two(u_a), _power_of_two(sigma))
        for dtype, u_d, u_a, sigma in row.findall(_text("tolerance.md"))
    }


def test_tolerance_constants_agree_with_the_reference() -> None:
    """TOL-2: u_d, u_a = min(u_d, 2^-24), sigma_d and C quoted in tolerance.md (and the
    u_d values quoted in index.md) are the ones reference/tolerance.py evaluates."""
    table = _constants_table()
    assert set(table) == set(DTYPES)
    for dtype, (u_d, u_a, sigma) in table.items():
        assert u_d == tolerance.UNIT_ROUNDOFF[dtype], dtype
        assert u_a == tolerance.accumulation_roundoff(dtype) == min(u_d, 2.0**-24), dtype
        assert sigma == tolerance.UNDERFLOW_THRESHOLD[dtype], dtype
    safety = re.findall(r"\$C = (\d+)\$", _text("tolerance.md"))
    assert safety, "tolerance.md does not state C"
    assert {float(c) for c in safety} == {tolerance.SAFETY_FACTOR}
    quoted = dict(
        (dtype, _power_of_two(exponent))
        for exponent, dtype in re.findall(r"\$2\^\{(-\d+)\}\$ for (\w+)", _text("index.md"))
    )
    assert quoted == {dtype: u_d for dtype, (u_d, _, _) in table.items()}


# The TOL-2 formula as tolerance.md displays it; the test below evaluates these exact terms.
FORMULA_TERMS = (
    r"A_{ij} = \sum_{e=0}^{E-1} |q_{ie}|\,|k_{je}|, \qquad \gamma_{ij} = m_i - s_{ij}",
    r"\Delta_{ij} = \big(r_\alpha + (E+4)u_a\big)\,|\alpha|\,A_{ij} + 2u_a\,|b_{ij}| "
    r"+ 3u_a\,\gamma_{ij} + 6u_a",
    r"g_{ij} = \min\big(p_{ij}\,(e^{\Delta_{ij}} - 1),\ 2\big), "
    r"\qquad D_i = \sum_{j \in S(i)} g_{ij}",
    r"G_{ic} = \sum_{j} g_{ij}\,|v_{jc}|",
    r"N_{ic} = \min\Big(G_{ic} + D_i\,|o_{ic}|,\ "
    r"\sqrt{D_i \textstyle\sum_{j} g_{ij}\,(v_{jc} - o_{ic})^2}\Big)",
    r"S_{ic} = \min\Big(\frac{N_{ic}}{1 - D_i} + G_{ic},\ 2H_{ic} + D_i\,|o_{ic}|\Big)"
    r" \text{ if } D_i < 1",
    r"\tau_{ic} = C \Big[ S_{ic} + \big(u_d + (L_k+2)u_a\big) M_{ic} + u_d|o_{ic}| \Big]"
    r" + \sigma_d \Big(L_k + 2 + \sum_{j \in S(i)} |v_{jc}|\Big)",
    r"\tau^p_{ij} = C \Big[ \min\Big(\frac{g_{ij} + p_{ij} D_i}{1 - D_i},\ 1\Big) "
    r"+ u_d\,p_{ij} \Big] + (L_k+2)\sigma_d",
)


def _displayed_bound(q, k, v, mask, bias, scale, dtype):
    """TOL-2 evaluated term by term as tolerance.md displays it, one element at a time
    where the text sums (no matrix products, no chunks): (tau, tau^p, D)."""
    u_d, u_a, sigma = _constants_table()[dtype]
    (safety,) = {float(c) for c in re.findall(r"\$C = (\d+)\$", _text("tolerance.md"))}
    _, n_keys, head_dim = k.shape
    n_queries, value_dim = q.shape[1], v.shape[2]
    out, p = oracle.sdpa(q, k, v, mask=mask, bias=bias, scale=scale)
    out, p = out[0], p[0]
    s = scale * q[0] @ k[0].T + bias
    tau, tau_p, d = np.zeros((n_queries, value_dim)), np.zeros((n_queries, n_keys)), []
    for i in range(n_queries):
        allowed = [j for j in range(n_keys) if mask[i, j]]
        m = max((s[i, j] for j in allowed), default=0.0)
        g = np.zeros(n_keys)
        for j in allowed:
            a = float(np.sum(np.abs(q[0, i]) * np.abs(k[0, j])))
            r_alpha = 4 * u_d  # at every scale (E-2026.12-14)
            delta = (
                (r_alpha + (head_dim + 4) * u_a) * abs(scale) * a
                + 2 * u_a * abs(bias[i, j])
                + 3 * u_a * (m - s[i, j])
                + 6 * u_a
            )
            if delta < 1:  # the evaluation rule of tolerance.md, which never overflows
                g[j] = min(p[i, j] * math.expm1(delta), 2.0)
            else:
                log_p = math.log(p[i, j]) if p[i, j] > 0 else -math.inf
                g[j] = min(math.exp(min(log_p + delta, 1.0)) - p[i, j], 2.0)
        d_i = g.sum()
        d.append(d_i)
        for c in range(value_dim):
            o = out[i, c]
            big_m = sum(p[i, j] * abs(v[0, j, c]) for j in allowed)
            big_g = sum(g[j] * abs(v[0, j, c]) for j in allowed)
            squares = sum(g[j] * v[0, j, c] ** 2 for j in allowed)
            rounding = 4 * 2.0**-53 * (squares + 2 * abs(o) * big_g + d_i * o * o)
            n = min(
                big_g + d_i * abs(o),
                math.sqrt(d_i * (sum(g[j] * (v[0, j, c] - o) ** 2 for j in allowed) + rounding)),
            )
            h = max(v[0, :, c].max() - o, o - v[0, :, c].min())
            part = min(n / (1 - d_i) + big_g, 2 * h + d_i * abs(o)) if d_i < 1 else 2 * h
            tau[i, c] = safety * (part + (u_d + (n_keys + 2) * u_a) * big_m + u_d * abs(o)) + (
                sigma * (n_keys + 2 + sum(abs(v[0, j, c]) for j in allowed))
            )
        for j in range(n_keys):
            change = min((g[j] + p[i, j] * d_i) / (1 - d_i), 1.0) if d_i < 1 else 1.0
            tau_p[i, j] = safety * (change + u_d * p[i, j]) + (n_keys + 2) * sigma
    return tau, tau_p, np.array(d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["plain", "padded", "large scores"])
@pytest.mark.parametrize("scale", [0.75, 0.25])  # r_alpha = 4 u_d at both (sqrt of 0.25 is 1/2)
def test_tolerance_formula_agrees_with_the_reference(dtype: str, case: str, scale: float) -> None:
    """TOL-2: the bound displayed in tolerance.md, evaluated element by element with the
    constants parsed from the text, equals what reference/tolerance.py computes with its
    matrix products and row chunks (mask, bias, an empty row; keys padded with a huge
    finite bias, a row padded entirely; scores large enough to reach the cap)."""
    text = _text("tolerance.md")
    for term in FORMULA_TERMS:
        assert term in text, f"tolerance.md no longer displays {term}"
    rng = np.random.default_rng(7)
    n_queries, n_keys, head_dim, value_dim = 4, 6, 3, 2
    # Quarter-integers up to 2 are exact in every dtype, so the inputs are what a kernel sees.
    q, k, v, bias = (
        rng.integers(-8, 9, size=shape) / 4.0
        for shape in (
            (1, n_queries, head_dim),
            (1, n_keys, head_dim),
            (1, n_keys, value_dim),
            (n_queries, n_keys),
        )
    )
    mask = rng.random((n_queries, n_keys)) < 0.7
    mask[1] = False  # an empty S(i): its tolerance is the floor alone
    mask[0, :2] = mask[2] = True
    if case == "padded":
        pad = -65504.0 if dtype == "float16" else float(np.finfo(np.float32).min)
        bias[0, 1] = bias[2, :] = pad
    elif case == "large scores":
        q = q * 2.0**6  # |alpha| A up to ~2e4: beyond 1/u_d in half precision
    tau, tau_p, d = _displayed_bound(q, k, v, mask, bias, scale, dtype)
    bound = tolerance.error_bound(
        q, k, v, dtype=dtype, mask=mask, bias=bias, scale=scale, chunk_elements=n_keys
    )  # one row per chunk
    np.testing.assert_allclose(np.asarray(bound.out_tolerance)[0], tau, rtol=1e-9, atol=0)
    np.testing.assert_allclose(np.asarray(bound.weights_tolerance)[0], tau_p, rtol=1e-9, atol=0)
    np.testing.assert_allclose(np.asarray(bound.score_error)[0], d, rtol=1e-9, atol=0)
    _, _, sigma = _constants_table()[dtype]
    assert np.all(np.asarray(bound.out_tolerance)[0, 1] == (n_keys + 2) * sigma)
    if case == "padded" and dtype != "float16":
        assert d[2] >= 1  # every key padded: undetermined, the hull cap applies
        unpadded = mask.copy()
        unpadded[0, 1] = False  # the padded key of row 0 costs nothing: as if masked
        _, _, d_masked = _displayed_bound(q, k, v, unpadded, bias, scale, dtype)
        assert d[0] == pytest.approx(d_masked[0], rel=1e-12)


def test_index_and_changelog_carry_the_spec_version() -> None:
    """Versioning policy (spec/index.md section 5): index.md's title and a section of
    CHANGELOG.md name attnspec.SPEC_VERSION, and a draft's title says it is a draft
    (CITATION.cff cites the newest release: tests/test_releases.py)."""
    title = _text("index.md").split("\n", 1)[0]
    assert title.startswith(f"# attnspec {attnspec.SPEC_VERSION} ")
    assert title.endswith("(draft)") == attnspec.SPEC_VERSION.endswith("-draft")
    assert re.search(
        rf"^## \[{re.escape(attnspec.SPEC_VERSION)}\] ", _text("CHANGELOG.md"), flags=re.MULTILINE
    )


def test_spec_files_ship_with_the_package() -> None:
    """All clauses: the parser reads the spec from the installed package's spec/ directory."""
    assert Path(attnspec.__file__).resolve().parent / "spec" == SPEC_DIR


# --- structure (CONF-1, CONF-2): one level per clause, labelled sections, a closed CONF-3 list ----

# BCP 14 key words, longest first, each with the level it belongs to. A key word followed by
# "clause(s)", "level" or "part", or in parentheses ("SDPA-8.2 (SHOULD)"), names a level; it
# does not state a requirement.
KEY_WORDS = {
    "MUST NOT": "MUST",
    "SHALL NOT": "MUST",
    "SHOULD NOT": "SHOULD",
    "NOT RECOMMENDED": "SHOULD",
    "MUST": "MUST",
    "SHALL": "MUST",
    "REQUIRED": "MUST",
    "SHOULD": "SHOULD",
    "RECOMMENDED": "SHOULD",
    "MAY": "MAY",
    "OPTIONAL": "MAY",
}
KEY_WORD = re.compile(
    r"(?<!\()\b(" + "|".join(KEY_WORDS) + r")\b(?!\))(?!\s+(?:clauses?|level|part)\b)"
)
SPEC_DOCUMENTS = sorted(p.name for p in SPEC_DIR.glob("*.md") if p.name != "CHANGELOG.md")
LABEL = re.compile(r"\((normative|informative)\)$")


def _blocks(document: str) -> list[tuple[str | None, str, str, str]]:
    """The document cut at every clause anchor and heading: (id or None, level or None,
    section label, text), where the label is the nearest enclosing heading's."""
    blocks, current, lines = [], (None, None), []
    labels = {2: "normative", 3: None}  # a document's introduction is normative
    fenced = False

    def close() -> None:
        label = labels[3] or labels[2]
        blocks.append((*current, label, "\n".join(lines)))

    text_lines = _text(document).split("\n")
    for number, line in enumerate(text_lines):
        fenced ^= line.startswith("```")
        anchor = re.match(rf'<a id="({CLAUSE_ID})"></a>$', line)
        heading = None if fenced else re.match(r"^(#{2,3}) (.*)$", line)
        if anchor or heading:
            close()
            lines = []
            if anchor:
                level = re.match(r"^\*\*\S+ \((\w+)\)", text_lines[number + 1])
                current = (anchor[1], level[1] if level else None)
                continue
            current = (None, None)
            depth, found = len(heading[1]), LABEL.search(heading[2])
            if depth == 2:
                labels[2], labels[3] = (found[1] if found else "unlabelled"), None
            else:
                labels[3] = found[1] if found else None
        lines.append(line)
    close()
    return blocks


def _key_words(text: str) -> list[str]:
    return [KEY_WORDS[word] for word in KEY_WORD.findall(text)]


@pytest.mark.parametrize("document", SPEC_DOCUMENTS)
def test_every_clause_uses_only_its_own_level(document: str) -> None:
    """CONF-1 and index.md section 4: a clause's text, notes and rationale use no BCP 14 key
    word of another level than the clause's own (a mixed clause is split into two ids), and
    no key word appears outside clauses but where index.md defines them."""
    offenders = []
    for clause_id, level, _, text in _blocks(document):
        if clause_id is None:
            if document == "index.md" and text.startswith("## 4. Conventions"):
                continue  # where the key words are defined
            words = _key_words(text)
            if words:
                offenders.append(f"text outside clauses uses {words}: {text[:80]!r}")
            continue
        others = sorted(set(_key_words(text)) - {level})
        if others:
            offenders.append(f"{clause_id} ({level}) also uses {others}")
    assert not offenders, f"{document}: " + "; ".join(offenders)


def test_negated_key_words_are_written_in_capitals() -> None:
    """index.md section 4 (BCP 14): a key word is negated as MUST NOT or SHOULD NOT, in
    capitals; "SHOULD not" (erratum E-2026.12-12) is neither a key word nor plain English."""
    lowercase = re.compile(r"\b(MUST|SHALL|SHOULD|MAY) not\b")
    found = [
        f"{document}: {match[0]}"
        for document in sorted(p.name for p in SPEC_DIR.glob("*.md"))
        for match in lowercase.finditer(_text(document))
    ]
    assert not found, found
    assert lowercase.search("values SHOULD not influence")


def test_scope_lists_every_feature_in_or_out() -> None:
    """index.md section 1: every row of the scope table says in or out; a feature in scope
    names where its clauses are — a spec document that exists, or one marked "(being added)"
    that does not exist yet (once it lands, its row must link it) — and one out says why."""
    section = _text("index.md").split("## 1. Scope")[1].split("\n## 2.")[0]
    rows = re.findall(r"^\| (?!feature |---)(.+?) \| (.+?) \| (.+?) \| (.+?) \|$", section, re.M)
    assert len(rows) >= 10
    for feature, _, scope, where in rows:
        assert scope.startswith(("in scope", "out")), (feature, scope)
        if scope.startswith("out"):
            assert len(where) > 20, f"{feature}: out of scope without a reason"
            continue
        added = re.findall(r"`([\w-]+\.md)` \(being added\)", where)
        linked = re.findall(r"\]\(([\w-]+\.md)\)", where)
        clauses = _ids_in(where)
        assert added or linked or clauses, f"{feature}: in scope, but no clauses named"
        for name in added:
            assert not (SPEC_DIR / name).exists(), (
                f"spec/{name} exists: link it in the scope row of {feature!r} "
                f"([{name}]({name})) instead of marking it being added"
            )
        for name in linked:
            assert (SPEC_DIR / name).exists(), name


def test_the_level_checker_catches_mixed_clauses() -> None:
    """The checker above, on mixed clauses as they were once written (and its allowed forms)."""
    assert _key_words("The result SHOULD be bit-identical") == ["SHOULD"]
    assert _key_words("the kernel MUST behave exactly") == ["MUST"]
    assert _key_words("A kernel SHOULD NOT form it; SHALL be") == ["SHOULD", "MUST"]
    assert _key_words("MAY clauses are never failed; SDPA-8.2 (SHOULD); a MUST level") == []


@pytest.mark.parametrize("document", SPEC_DOCUMENTS)
def test_sections_are_labelled_and_clauses_are_normative(document: str) -> None:
    """index.md section 4: every section says normative or informative, clauses sit only in
    normative sections, informative definitions carry "(informative)", and the normative text
    of a clause (before its Note and Rationale) neither describes the reference's behaviour
    nor reports what a library was observed to do."""
    blocks = _blocks(document)
    assert all(label != "unlabelled" for _, _, label, _ in blocks), document
    for clause_id, level, label, text in blocks:
        if clause_id is None:
            continue
        if level == "informative":
            assert clause_id in DEFINITIONS, clause_id
            continue
        assert label == "normative", f"{clause_id} sits in an {label} section"
        normative = re.split(r"\n\*(?:Note|Rationale|Derivation)", text)[0]
        assert not re.search(
            r"ValueError|TypeError|the reference (raises|takes|returns|draws)", normative
        ), f"{clause_id}: the reference's behaviour is normative"
        assert not re.search(r"\(observed|observed on|torch 2\.|jax 0\.", normative), (
            f"{clause_id}: a fact observed on a library is in normative text"
        )


def _declarable_table() -> dict[str, tuple[tuple[str, ...], str, str]]:
    row = re.compile(r"^\| `(\w+)` \| ((?:`--[\w-]+`(?:, )?)+) \| (\w+) \| (.*) \|$", re.MULTILINE)
    return {
        field: (tuple(re.findall(r"`(--[\w-]+)`", flags)), kind, text)
        for field, flags, kind, text in row.findall(_text("index.md"))
    }


def test_conf3_lists_exactly_the_claims_table() -> None:
    """CONF-3: the declarable entries in index.md are exactly the rows of the claims table,
    with their flags, and an entry is a waiver exactly when its row waives a clause, which the
    entry names (CONF-7); the setup table lists exactly the setup flags."""
    from attnspec.conformance.claims.table import CLAIMS, SETUP_FLAGS

    table = _declarable_table()
    assert set(table) == {claim.field for claim in CLAIMS}
    for claim in CLAIMS:
        flags, kind, text = table[claim.field]
        expected = tuple(f.option for f in claim.flags) or ("--dtype",)
        assert flags == expected, claim.field
        assert (kind == "waiver") == (claim.waives is not None), claim.field
        assert kind in ("property", "convention", "waiver"), claim.field
        if claim.waives:
            assert f"waives {' and '.join(claim.waived_clauses)}" in text, claim.field
    setup = re.findall(r"^\| `(--[\w-]+)` \| [^|]+ \|$", _text("index.md"), flags=re.MULTILINE)
    assert setup == [flag.option for flag in SETUP_FLAGS]
    conf3 = _text("index.md").split('<a id="CONF-3"></a>')[1].split('<a id="CONF-4"></a>')[0]
    conf3 = conf3.split("\n*Note:*")[0]  # the rationale quotes the old "…"
    without_ranges = re.sub(rf"{CLAUSE_ID} … {CLAUSE_ID}", "", conf3)  # SOFTCAP-1 … SOFTCAP-3
    assert "…" not in without_ranges and "..." not in without_ranges, "CONF-3's list is open"


def _ids_in(text: str) -> set[str]:
    areas = "|".join(sorted(AREA_DOCUMENT, key=len, reverse=True))
    return set(re.findall(rf"\b(?:{areas})-\d+(?:\.\d+)*\b", text))


def test_every_cited_id_exists() -> None:
    """Every clause id that code, tests, guides or the changelog cite is a clause or an
    informative definition of the spec (a bare section number such as SDPA-4 names the
    section whose clauses it prefixes)."""
    # tests/test_site.py checks that the link checker reports an anchor that does not exist
    known = set(all_clauses()) | DEFINITIONS | {"SDPA-99.9"}
    sources = [
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("conformance/**/*.py"),
        *ROOT.glob("reference/**/*.py"),
        *ROOT.glob("docs/*.md"),
        ROOT / "README.md",
        SPEC_DIR / "CHANGELOG.md",
        *SPEC_DIR.glob("*.md"),
    ]
    missing = {}
    for path in sources:
        for cited in _ids_in(path.read_text(encoding="utf-8")) - known:
            if not any(k.startswith(cited + ".") for k in known):
                missing.setdefault(cited, path.relative_to(ROOT).as_posix())
    assert not missing, f"cited ids the spec does not have: {missing}"


def test_changelog_changes_name_their_clauses() -> None:
    """Per-clause change notes: every entry of a Changed, Withdrawn or Fixed part of
    spec/CHANGELOG.md names at least one clause or definition id, all of them existing."""
    changelog = _text("CHANGELOG.md")
    parts = re.findall(
        r"^### (?:Changed|Withdrawn|Fixed)\n(.*?)(?=^##|\Z)", changelog, re.MULTILINE | re.DOTALL
    )
    entries = [
        entry
        for part in parts
        for entry in re.findall(r"^- (.*?)(?=^- |\Z)", part, flags=re.MULTILINE | re.DOTALL)
    ]
    assert len(entries) >= 3
    known = set(all_clauses()) | DEFINITIONS
    for entry in entries:
        named = _ids_in(entry)
        assert named, f"a change note names no clause: {entry[:80]!r}"
        assert named <= known | {i for i in named if any(k.startswith(i + ".") for k in known)}


def test_reference_runs_on_the_pinned_array_api_version() -> None:
    """Normative references (index.md section 2): the pinned Array API version is one
    array-api-strict can be restricted to, and the reference computes SDPA under it."""
    pinned = re.search(r"Python array API standard, version (\d{4}\.\d{2})", _text("index.md"))
    assert pinned, "index.md pins no Array API version"
    strict = pytest.importorskip("array_api_strict", reason="the test extra installs it")
    from attnspec.reference import scaled_dot_product_attention

    before = strict.get_array_api_strict_flags()
    try:
        strict.set_array_api_strict_flags(api_version=pinned[1])
        q = strict.reshape(strict.arange(12, dtype=strict.float64), (1, 2, 3, 2)) / 10
        out = scaled_dot_product_attention(q, q, q, is_causal=True)
        expected, _ = oracle.sdpa(
            np.asarray(q)[0],
            np.asarray(q)[0],
            np.asarray(q)[0],
            mask=np.tril(np.ones((3, 3), bool)),
            scale=2**-0.5,
        )
        np.testing.assert_allclose(np.asarray(out)[0], expected, rtol=1e-12)
    finally:
        strict.set_array_api_strict_flags(**before)
