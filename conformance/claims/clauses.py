"""The spec's clauses, read from the spec's own text so code and spec cannot drift.

A clause is declared in ``spec/*.md`` by an anchor line followed by a bold lead::

    <a id="SDPA-4.2"></a>
    **SDPA-4.2 (MUST) Bottom-right causal alignment.** Query i may attend ...
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from ..._version import SPEC_IS_DRAFT, SPEC_VERSION

LEVELS = ("MUST", "SHOULD", "MAY")
SPEC_DIR = Path(__file__).resolve().parents[2] / "spec"
# The frozen released versions (spec/index.md section 5), one folder each.
RELEASES_DIR = SPEC_DIR / "releases"
_CLAUSE = re.compile(
    r'^<a id="(?P<anchor>[A-Z]+-[0-9]+(?:\.[0-9]+)*)"></a>\s*\n'
    r"\*\*(?P<id>[A-Z]+-[0-9]+(?:\.[0-9]+)*) \((?P<level>MUST|SHOULD|MAY)\) "
    r"(?P<title>[^*]+?)\.\*\*",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Clause:
    id: str
    level: str
    title: str
    document: str

    @property
    def citation(self) -> str:
        """How a paper or an error message cites the clause."""
        return f"attnspec {SPEC_VERSION}, {self.id}"


@functools.cache
def all_clauses() -> dict[str, Clause]:
    """Every clause of every spec document, by id."""
    clauses: dict[str, Clause] = {}
    for document in sorted(SPEC_DIR.glob("*.md")):
        for match in _CLAUSE.finditer(document.read_text(encoding="utf-8")):
            if match["anchor"] != match["id"]:
                raise ValueError(f"{document.name}: anchor {match['anchor']} heads {match['id']}")
            if match["id"] in clauses:
                raise ValueError(f"{document.name}: clause {match['id']} is declared twice")
            clauses[match["id"]] = Clause(
                match["id"], match["level"], match["title"], document.name
            )
    return clauses


def _documents_in_reading_order() -> list[Path]:
    """The spec documents in the order of the document table of spec/index.md (its rows
    start ``| [dense.md](dense.md) |``); any document it does not list comes last."""
    listed = re.findall(
        r"^\| \[([\w-]+\.md)\]\(",
        (SPEC_DIR / "index.md").read_text(encoding="utf-8"),
        flags=re.MULTILINE,
    )
    documents = sorted(SPEC_DIR.glob("*.md"))
    rank = {name: i for i, name in enumerate(dict.fromkeys(listed))}
    return sorted(documents, key=lambda path: rank.get(path.name, len(rank)))


@functools.cache
def spec_order() -> dict[str, int]:
    """Each clause id's position in the spec read in order: documents as spec/index.md
    lists them, clauses as each document declares them."""
    clauses = all_clauses()
    order: dict[str, int] = {}
    for document in _documents_in_reading_order():
        for match in _CLAUSE.finditer(document.read_text(encoding="utf-8")):
            if match["id"] in clauses:
                order.setdefault(match["id"], len(order))
    return order


def clause(clause_id: str) -> Clause:
    """The clause with this id; KeyError naming the spec documents if there is none."""
    try:
        return all_clauses()[clause_id]
    except KeyError:
        raise KeyError(f"no clause {clause_id!r} in {SPEC_DIR}") from None


def _release_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in folder.name.split("."))


@functools.cache
def last_release() -> tuple[str, frozenset[str]]:
    """The newest frozen release's version and clause ids, ``("", frozenset())`` where no
    release is shipped."""
    folders = sorted((p for p in RELEASES_DIR.glob("*") if p.is_dir()), key=_release_key)
    if not folders:
        return "", frozenset()
    ids = {
        match["id"]
        for document in folders[-1].glob("*.md")
        for match in _CLAUSE.finditer(document.read_text(encoding="utf-8"))
    }
    return folders[-1].name, frozenset(ids)


def new_in_draft(clause_id: str) -> bool:
    """Whether the spec checked against is a draft and ``clause_id`` is not in its last
    release: a clause whose text may still change before it is released (section 5)."""
    version, released = last_release()
    return SPEC_IS_DRAFT and bool(version) and clause_id not in released
