"""One direction of dependencies, read from the folders: each layer says what it may import.

A layer is a folder of the package (``reference/``, ``backends/``, ``benchmarks/``, and each
folder of ``conformance/``: ``claims/``, ``call/``, ``kernels/``, ``draw/``, ``judge/``,
``run/``, ``report/``), or one of three single places: ``_version.py``, the package's own
``__init__.py`` (the layer ``attnspec``) and the front ends directly in ``conformance/``
(the layer ``conformance``).  The docstring of the layer's ``__init__.py`` (or module) has
one line ``May import: a, b.`` naming the layers below it that it uses; what those may
import it may import too.  There is no hand-kept list: a new folder is a new layer, and
says what it may import where a reader looks first.

Imports are read with ``ast``, function-level (lazy) imports and imports under
``if TYPE_CHECKING:`` included: a reader meets both as dependencies, so both must point
down, and neither may close a circle.  docs/architecture.md describes each layer with the
same "May import" line and names every module in its layer's paragraph (checked below).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from support import syntax_tree

ROOT = Path(__file__).resolve().parent.parent  # the repository root is the package
SUBPACKAGES = ("reference", "backends", "benchmarks", "conformance")
# Where a layer is not a folder: the module that declares it (relative to the root).
SINGLE_MODULE_LAYERS = {"_version": "_version.py", "attnspec": "__init__.py"}
FRONT_ENDS = "conformance"  # the modules directly in conformance/ and its __init__


def layer_folders(root: Path = ROOT) -> dict[str, Path]:
    """Every layer that is a folder: name -> its ``__init__.py``."""
    found = {sub: root / sub / "__init__.py" for sub in SUBPACKAGES if sub != "conformance"}
    for init in sorted((root / "conformance").glob("*/__init__.py")):
        found[init.parent.name] = init
    return found


def declaring_files(root: Path = ROOT) -> dict[str, Path]:
    """Every layer: name -> the file whose docstring says what it may import."""
    return {
        **{name: root / path for name, path in SINGLE_MODULE_LAYERS.items()},
        **layer_folders(root),
        FRONT_ENDS: root / "conformance" / "__init__.py",
    }


def may_import_line(path: Path) -> tuple[str, ...] | None:
    """The layers named in ``path``'s docstring line ``May import: a, b.`` (``nothing``: none);
    None when it has no such line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    lines = re.findall(r"^May import: (.*?)\.?$", doc, flags=re.MULTILINE)
    if len(lines) != 1:
        return None
    names = tuple(name.strip() for name in lines[0].split(","))
    return () if names == ("nothing",) else names


@cache
def declared_layers(root: Path = ROOT) -> dict[str, tuple[str, ...]]:
    """Every layer and the layers it says it may import."""
    declared = {}
    for name, path in declaring_files(root).items():
        line = may_import_line(path)
        if line is None:
            raise LookupError(f"{path.relative_to(root)} has no 'May import: ...' line")
        declared[name] = line
    return declared


def allowed(layers: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    """What each layer may import: its own line, and what those layers may import."""
    closure: dict[str, set[str]] = {}

    def reach(name: str, seen: tuple[str, ...] = ()) -> set[str]:
        if name in seen:
            raise ValueError("layers that may import each other: " + " -> ".join((*seen, name)))
        if name not in closure:
            found: set[str] = set()
            for lower in layers[name]:
                found |= {lower, *reach(lower, (*seen, name))}
            closure[name] = found
        return closure[name]

    for name in layers:
        reach(name)
    return closure


def layer_of(module: str, layers: dict[str, tuple[str, ...]] | None = None) -> str:
    """The layer of ``module`` (a name relative to ``attnspec``, "" for the package)."""
    layers = declared_layers() if layers is None else layers
    parts = module.split(".") if module else []
    if not parts:
        return "attnspec"
    if parts[0] == "conformance":
        if len(parts) > 1 and parts[1] in layers and parts[1] != FRONT_ENDS:
            return parts[1]
        return FRONT_ENDS
    if parts[0] in layers:
        return parts[0]
    raise LookupError(f"module {module!r} is in no layer")


def package_modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: name relative to ``attnspec`` -> (file, is a package)."""
    files = [*root.glob("*.py"), *(p for sub in SUBPACKAGES for p in (root / sub).rglob("*.py"))]
    modules = {}
    for path in files:
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imports_of(
    module: str, source: str | ast.Module, is_package: bool, known: set[str]
) -> set[str]:
    """The package modules ``module`` imports (at any depth of its code), as names relative
    to ``attnspec``; ``from pkg import name`` counts ``pkg.name`` when that is a module.
    ``source`` is the module's text or its syntax tree."""
    tree = ast.parse(source) if isinstance(source, str) else source
    package = module if is_package else module.rpartition(".")[0]

    def relative(name: str) -> str | None:
        if name == "attnspec" or name.startswith("attnspec."):
            return name.removeprefix("attnspec").removeprefix(".")
        return None

    def closest(name: str) -> str:
        while name not in known and name:
            name = name.rpartition(".")[0]
        return name

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [relative(alias.name) for alias in node.names]
            found.update(closest(n) for n in names if n is not None)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = relative(node.module or "")
                if target is None:
                    continue
            for alias in node.names:
                child = f"{target}.{alias.name}" if target else alias.name
                found.add(child if child in known else closest(target))
    found.discard(module)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = package_modules(root)
    known = set(modules)
    return {
        name: imports_of(name, syntax_tree(path), is_package, known)
        for name, (path, is_package) in modules.items()
    }


def _shown(module: str) -> str:
    return f"attnspec.{module}" if module else "attnspec"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _cycle_edges(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return ", ".join(
        f"{_shown(a)} -> {_shown(b)}" for a in component for b in sorted(graph[a] & members)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    """No module depends on itself through others, within a layer too, type-only imports
    included."""
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_cycle_edges(graph, c) for c in found)


def upward_edges(
    graph: dict[str, set[str]], layers: dict[str, tuple[str, ...]] | None = None
) -> list[str]:
    """``module -> module`` for every import of a layer its own may not import."""
    layers = declared_layers() if layers is None else layers
    may = allowed(layers)
    found = []
    for module, imported in sorted(graph.items()):
        own = layer_of(module, layers)
        for target in sorted(imported):
            other = layer_of(target, layers)
            if other != own and other not in may[own]:
                found.append(f"{_shown(module)} -> {_shown(target)} ({own} may not import {other})")
    return found


def test_every_layer_says_what_it_may_import() -> None:
    """Each layer's __init__ (or module) docstring has one 'May import:' line naming layers,
    and no two layers may import each other (directly or through others)."""
    layers = declared_layers()
    unknown = {name: [n for n in line if n not in layers] for name, line in layers.items()}
    assert not any(unknown.values()), f"'May import' names no layer: {unknown}"
    allowed(layers)  # raises on layers that may import each other


def test_every_module_is_in_a_layer(graph: dict[str, set[str]]) -> None:
    """A module belongs to the layer of its folder: none is left outside."""
    missing = []
    for module in graph:
        try:
            layer_of(module)
        except LookupError:
            missing.append(_shown(module))
    assert not missing, f"modules in no layer: {missing}"


def test_no_layer_imports_what_it_may_not(graph: dict[str, set[str]]) -> None:
    """Dependencies point one way: each import is of the module's own layer or of one its
    layer's 'May import' line reaches."""
    upward = upward_edges(graph)
    assert not upward, "imports a layer may not make:\n" + "\n".join(upward)


def test_checker_finds_an_upward_edge_and_a_cycle() -> None:
    """The checks above fail on a back edge and on a cycle, naming ``module -> module``; a
    layer declared to import a higher one that imports it back is refused too."""
    layers = {"reference": (), "backends": ("reference",)}
    fine = {"reference": set(), "reference.a": {"reference"}, "backends": {"reference.a"}}
    assert not upward_edges(fine, layers) and not cycles(fine)
    back_edge = {**fine, "reference.a": {"reference", "backends"}}
    assert upward_edges(back_edge, layers) == [
        "attnspec.reference.a -> attnspec.backends (reference may not import backends)"
    ]
    cyclic = {**fine, "reference": {"reference.a"}}
    assert cycles(cyclic) == [["reference", "reference.a"]]
    assert _cycle_edges(cyclic, ["reference", "reference.a"]) == (
        "attnspec.reference -> attnspec.reference.a, attnspec.reference.a -> attnspec.reference"
    )
    with pytest.raises(ValueError, match="may import each other"):
        allowed({"reference": ("backends",), "backends": ("reference",)})


def test_may_import_line_is_read_from_the_docstring(tmp_path: Path) -> None:
    """'May import: a, b.' gives (a, b); 'nothing' gives (); no line or two lines: None."""
    cases = {
        '"""Doc.\n\nMay import: call, claims.\n"""\n': ("call", "claims"),
        '"""Doc.\n\nMay import: nothing.\n"""\n': (),
        '"""Doc without it."""\n': None,
        '"""May import: a.\nMay import: b.\n"""\n': None,
    }
    for text, expected in cases.items():
        path = tmp_path / "m.py"
        path.write_text(text)
        assert may_import_line(path) == expected, text


PROPERTY_HELPERS = "conformance.judge.properties._helpers"


def sibling_property_imports(graph: dict[str, set[str]]) -> list[str]:
    """``module -> module`` for every property module importing another property module
    (the package ``conformance.properties``, which imports them all, is not one)."""

    def is_property_module(name: str) -> bool:
        return name.startswith("conformance.judge.properties.") and name != PROPERTY_HELPERS

    return [
        f"{_shown(module)} -> {_shown(target)}"
        for module, imported in sorted(graph.items())
        if is_property_module(module)
        for target in sorted(imported)
        if is_property_module(target)
    ]


def test_property_modules_import_no_sibling(graph: dict[str, set[str]]) -> None:
    """CONF-1: one property module per spec area, none importing another (they share one
    layer, so the layer check alone allows it); what several need is in ``_helpers.py``."""
    found = sibling_property_imports(graph)
    assert not found, "property modules importing a sibling:\n" + "\n".join(found)


def test_sibling_check_finds_a_sibling_import() -> None:
    """The check above fails on ``properties.gqa -> properties.shapes``, not on the helpers
    or on the package that imports every property module."""
    fine = {
        "conformance.judge.properties": {"conformance.judge.properties.gqa"},
        "conformance.judge.properties.gqa": {PROPERTY_HELPERS, "conformance.judge.kernel"},
    }
    assert not sibling_property_imports(fine)
    sibling = {
        **fine,
        "conformance.judge.properties.gqa": {"conformance.judge.properties.shapes"},
    }
    assert sibling_property_imports(sibling) == [
        "attnspec.conformance.judge.properties.gqa -> attnspec.conformance.judge.properties.shapes"
    ]


def test_lazy_and_type_checking_imports_count(tmp_path: Path) -> None:
    """A function-level import is a dependency, and so is one under ``if TYPE_CHECKING:``
    (a reader meets both: a circle through an annotation is still a circle)."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n    from .c import C\n"
        "def f():\n    from ..top import name\n    import attnspec.pkg.d\n"
    )
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "top"}
    assert imports_of("pkg.a", source, False, known) == {"pkg.b", "pkg.c", "top", "pkg.d"}


def layer_paragraphs(text: str) -> dict[str, str]:
    """docs/architecture.md's paragraph of each layer, by the layer's name: a paragraph
    starts with a bold "**`NAME`**" heading."""
    found = re.findall(
        r"^\*\*`([a-z_]+)/?`\*\*(.*?)(?=^\*\*`|^## |\Z)", text, flags=re.MULTILINE | re.DOTALL
    )
    return dict(found)


def test_architecture_doc_describes_every_layer_as_it_declares_itself() -> None:
    """docs/architecture.md has a paragraph per layer whose 'May import:' line is the one
    the layer declares, and names every module of the layer (its file, e.g. ``sizes.py``,
    or its folder, e.g. ``properties/``), so the page and the tree cannot drift apart."""
    paragraphs = layer_paragraphs((ROOT / "docs" / "architecture.md").read_text("utf-8"))
    layers = declared_layers()
    assert sorted(paragraphs) == sorted(layers), "layers without (or unknown) paragraphs"
    wrong = []
    for name, line in layers.items():
        said = re.findall(r"May import: (.*?)\.?$", paragraphs[name], flags=re.MULTILINE)
        expected = ", ".join(line) or "nothing"
        if said != [expected]:
            wrong.append(f"{name}: the doc says {said}, the layer {expected!r}")
    for module, (path, is_package) in sorted(package_modules().items()):
        layer = layer_of(module)
        parts = path.relative_to(ROOT).parts
        # a conformance layer names its modules one by one (or a folder inside it, such as
        # properties/); a folder at the root (reference/) may be described as a whole
        folders = parts[2:-1] if parts[0] == "conformance" else parts[:-1]
        names = [f"`{parts[-1]}`", *(f"`{folder}/`" for folder in folders)]
        if is_package or any(n in paragraphs[layer] for n in names):
            continue
        wrong.append(f"{_shown(module)}: none of {names} in the paragraph of {layer!r}")
    assert not wrong, "\n".join(wrong)


def test_properties_are_listed_in_clause_order(capsys: pytest.CaptureFixture[str]) -> None:
    """The registry, ``attnspec properties`` and so every report (CONF-1: clause by clause)
    list the properties in the spec's order of their clauses (documents as the table of
    spec/index.md lists them, clauses as each document declares them), not in the order
    their modules import."""
    from attnspec.conformance import cli
    from attnspec.conformance.claims.clauses import all_clauses, spec_order
    from attnspec.conformance.judge.registry import all_properties

    order = spec_order()
    assert sorted(order, key=order.__getitem__) == sorted(all_clauses(), key=order.__getitem__)
    areas = list(dict.fromkeys(clause.split("-")[0] for clause in order))
    assert (
        areas.index("SDPA")
        < areas.index("TOL")
        < areas.index("SPARSE")
        < areas.index("LIN")
        < areas.index("SOFTCAP")
    ), areas  # dense, tolerance, sparse, linear, features
    listed = list(all_properties().values())
    positions = [order[prop.clause] for prop in listed]
    out_of_order = [
        (a.id, a.clause, b.id, b.clause)
        for a, b, pa, pb in zip(listed, listed[1:], positions, positions[1:], strict=False)
        if pa > pb
    ]
    assert not out_of_order, out_of_order
    assert cli.main(["properties"]) == 0
    shown = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert shown == [prop.id for prop in listed]


PROPERTY_TESTS = ROOT / "tests" / "conformance" / "properties"
CLAUSE_ID = r"\b[A-Z]+-[0-9]+(?:\.[0-9]+)*\b"


# The clauses every property answers to, whatever its document: applicability and
# conformance (spec/index.md) and the tolerance a comparison uses (spec/tolerance.md).
EVERY_DOCUMENT = {"index.md", "tolerance.md"}


def misplaced_property_tests(root: Path = PROPERTY_TESTS) -> list[str]:
    """``path::test`` for each test of ``tests/conformance/properties/<doc>/`` whose
    docstring cites no clause (or section, ``SDPA-4``) of ``spec/<doc>.md``, unless all it
    cites are spec/index.md's and spec/tolerance.md's."""
    from attnspec.conformance.claims.clauses import all_clauses

    document_of = {c.id.split("-")[0]: c.document for c in all_clauses().values()}
    wrong = []
    for path in sorted(root.glob("*/test_*.py")):
        document = f"{path.parent.name}.md"
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                cited = re.findall(CLAUSE_ID, ast.get_docstring(node) or "")
                documents = {document_of.get(c.split("-")[0]) for c in cited}
                if document not in documents and not (cited and documents <= EVERY_DOCUMENT):
                    wrong.append(f"{path.relative_to(ROOT)}::{node.name} cites {cited}")
    return wrong


def test_property_tests_are_filed_under_their_spec_document() -> None:
    """The tests of the properties mirror the spec: ``tests/conformance/properties/dense/``
    holds the tests of spec/dense.md's clauses, ``sparse/`` of spec/sparse.md's, and so on;
    each test's docstring cites clauses of its folder's document (besides spec/index.md's
    and spec/tolerance.md's, which every property answers to), so a clause id leads to one
    folder (and ``grep -rn CLAUSE-ID tests/`` to every test that cites it)."""
    folders = {path.name for path in PROPERTY_TESTS.iterdir() if path.is_dir()}
    documents = {path.stem for path in (ROOT / "spec").glob("*.md")}
    assert folders <= documents, f"folders named after no spec document: {folders - documents}"
    assert not list(PROPERTY_TESTS.glob("test_*.py")), "a property test outside its document"
    wrong = misplaced_property_tests()
    assert not wrong, "tests citing no clause of their folder's document:\n" + "\n".join(wrong)
