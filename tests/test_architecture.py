"""One direction of dependencies: the package's layers, and a test that imports follow them.

Every module of the installed package belongs to one layer of :data:`LAYERS` (lowest
first).  A module may import modules of its own layer or of lower ones, never of a higher
one, and the imports form no cycle.  Imports are read with ``ast``, function-level
(lazy) imports included: a lazy import is still a dependency.  Imports under
``if TYPE_CHECKING:`` are not counted: they never run, and only name types for
annotations.  docs/architecture.md describes each layer in a paragraph headed by its
name (checked below).

The conformance suite's layers follow what a check does (CONF-1: clause by clause): the
spec's clauses and a kernel's claims; problems drawn and a kernel called on them; the
properties, one per clause; running them; reporting; the front ends.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository root is the package
SUBPACKAGES = ("reference", "backends", "benchmarks", "conformance")

# (layer, module patterns) from the lowest layer to the highest; names relative to
# ``attnspec`` ("" is the package itself).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("version", ("_version",)),
    ("backends", ("backends", "backends._registry")),
    ("reference", ("reference", "reference.*")),
    ("package", ("",)),
    ("tools", ("backends.survey", "benchmarks", "benchmarks.*")),
    (
        "claims",
        tuple(
            f"conformance.{name}"
            for name in (
                "clauses",
                "side_effects",
                "statistics",
                "favor_bound",
                "claim_string",
                "loading",
                "claims",
                "declaration",
                "known_kernels",
                "layouts",
                "torch_kernels",
                "jax_kernels",
                "adapters",
                "adapters.*",
            )
        ),
    ),
    (
        "problems",
        tuple(
            f"conformance.{name}"
            for name in (
                "kernel",
                "failures",
                "input_features",
                "sizes",
                "shape_pool",
                "one_example",
                "values",
                "element_values",
                "anchors",
                "strategies",
                "bounds",
                "assertions",
                "packed",
                "hints",
                "raised_hints",
                "reproduce",
                "call_guard",
            )
        ),
    ),
    ("property helpers", ("conformance.registration", "conformance.properties._helpers")),
    ("properties", ("conformance.properties", "conformance.properties.*")),
    ("registry", ("conformance.registry",)),
    (
        "running",
        tuple(
            f"conformance.{name}"
            for name in (
                "runner",
                "root_causes",
                "kernel_setup",
                "isolation",
                "worker",
                "jobs",
            )
        ),
    ),
    (
        "reporting",
        ("conformance.report", "conformance.report_files", "conformance.run_plan"),
    ),
    (
        "front ends",
        (
            "conformance",
            "conformance.api",
            "conformance.cli",
            "conformance.pytest_plugin",
            "conformance.matrix",
        ),
    ),
)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int:
    """The index of ``module``'s layer; the most specific pattern wins (an exact name over
    ``pkg.*``), so ``conformance.properties._helpers`` is a helper, not a property."""
    matches = [
        (pattern != module, -len(pattern), index)
        for index, (_, patterns) in enumerate(layers)
        for pattern in patterns
        if fnmatch.fnmatchcase(module, pattern)
    ]
    if not matches:
        raise LookupError(f"module {module!r} is in no layer of tests/test_architecture.py")
    return min(matches)[2]


def package_modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: name relative to ``attnspec`` -> (file, is a package)."""
    files = [*root.glob("*.py"), *(p for sub in SUBPACKAGES for p in (root / sub).rglob("*.py"))]
    modules = {}
    for path in files:
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _type_checking_only(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (at any depth of its code), as names relative
    to ``attnspec``; ``from pkg import name`` counts ``pkg.name`` when that is a module."""
    tree = ast.parse(source)
    skipped = _type_checking_only(tree)
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
        if id(node) in skipped:
            continue
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
        name: imports_of(name, path.read_text(encoding="utf-8"), is_package, known)
        for name, (path, is_package) in modules.items()
    }


def _shown(module: str) -> str:
    return f"attnspec.{module}" if module else "attnspec"


def upward_edges(
    graph: dict[str, set[str]], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS
) -> list[str]:
    """``module -> module`` for every import of a higher layer, with both layers named."""
    found = []
    for module, imported in sorted(graph.items()):
        low = layer_of(module, layers)
        for target in sorted(imported):
            high = layer_of(target, layers)
            if high > low:
                found.append(
                    f"{_shown(module)} -> {_shown(target)} ({layers[low][0]} imports "
                    f"{layers[high][0]})"
                )
    return found


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


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    """A new module is placed in a layer on purpose (the table above), not by accident."""
    missing = []
    for module in graph:
        try:
            layer_of(module)
        except LookupError:
            missing.append(_shown(module))
    assert not missing, f"modules in no layer of LAYERS: {missing}"


def test_no_layer_imports_a_higher_one(graph: dict[str, set[str]]) -> None:
    """Dependencies point one way: down the layers of LAYERS."""
    upward = upward_edges(graph)
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    """No module depends on itself through others, within a layer too."""
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_cycle_edges(graph, c) for c in found)


PROPERTY_HELPERS = "conformance.properties._helpers"


def sibling_property_imports(graph: dict[str, set[str]]) -> list[str]:
    """``module -> module`` for every property module importing another property module
    (the package ``conformance.properties``, which imports them all, is not one)."""

    def is_property_module(name: str) -> bool:
        return name.startswith("conformance.properties.") and name != PROPERTY_HELPERS

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
        "conformance.properties": {"conformance.properties.gqa"},
        "conformance.properties.gqa": {PROPERTY_HELPERS, "conformance.kernel"},
    }
    assert not sibling_property_imports(fine)
    sibling = {**fine, "conformance.properties.gqa": {"conformance.properties.shapes"}}
    assert sibling_property_imports(sibling) == [
        "attnspec.conformance.properties.gqa -> attnspec.conformance.properties.shapes"
    ]


def test_checker_finds_an_upward_edge_and_a_cycle() -> None:
    """The checks above fail on a back edge and on a cycle, naming ``module -> module``."""
    layers = (("low", ("low", "low.*")), ("high", ("high",)))
    fine = {"low": set(), "low.a": {"low"}, "high": {"low.a"}}
    assert not upward_edges(fine, layers) and not cycles(fine)
    back_edge = {**fine, "low.a": {"low", "high"}}
    assert upward_edges(back_edge, layers) == ["attnspec.low.a -> attnspec.high (low imports high)"]
    cyclic = {**fine, "low": {"low.a"}}
    assert cycles(cyclic) == [["low", "low.a"]]
    assert _cycle_edges(cyclic, ["low", "low.a"]) == (
        "attnspec.low -> attnspec.low.a, attnspec.low.a -> attnspec.low"
    )


def test_lazy_imports_count_and_type_checking_imports_do_not(tmp_path: Path) -> None:
    """A function-level import is a dependency; one under ``if TYPE_CHECKING:`` is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n    from .c import C\n"
        "def f():\n    from ..top import name\n    import attnspec.pkg.d\n"
    )
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "top"}
    assert imports_of("pkg.a", source, False, known) == {"pkg.b", "top", "pkg.d"}


def test_architecture_doc_describes_every_layer() -> None:
    """docs/architecture.md has one paragraph per layer, headed by the layer's name, in
    the order of LAYERS (lowest first)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    headed = re.findall(r"^\*\*Layer \d+, ([a-z ]+)\.\*\*", text, flags=re.MULTILINE)
    assert headed == [name for name, _ in LAYERS]


def layer_paragraphs(text: str) -> dict[str, str]:
    """docs/architecture.md's paragraph of each layer, by the layer's name."""
    found = re.findall(
        r"^\*\*Layer \d+, ([a-z ]+)\.\*\*(.*?)(?=^\*\*Layer |^## |\Z)",
        text,
        flags=re.MULTILINE | re.DOTALL,
    )
    return dict(found)


def doc_names(module: str, path: Path) -> list[str]:
    """How docs/architecture.md may name ``module`` (in backticks): its file, its file in
    its folder (``properties/_helpers.py``), a folder it is in (``adapters/``,
    ``properties/*.py``); a module directly in conformance/ by its file name only (the
    layer paragraphs list them one by one, so a new one must be added by name)."""
    parts = path.relative_to(ROOT).parts
    names = ["/".join(parts), "/".join(parts[1:])] if len(parts) > 1 else [parts[0]]
    folders = parts[:-1]
    if module.startswith("conformance."):
        folders = folders[1:]  # not the whole of conformance/
    for depth in range(len(folders), 0, -1):
        folder = "/".join(folders[:depth])
        names += [f"{folder}/", f"{folder}/*.py"]
    return [f"`{name}`" for name in names]


def test_architecture_doc_puts_every_module_in_its_layer() -> None:
    """docs/architecture.md names every module of the package in the paragraph of the layer
    LAYERS puts it in, so that the page and the enforced table cannot drift apart."""
    paragraphs = layer_paragraphs((ROOT / "docs" / "architecture.md").read_text("utf-8"))
    misplaced = []
    for module, (path, _) in sorted(package_modules().items()):
        layer = LAYERS[layer_of(module)][0]
        names = doc_names(module, path)
        if not any(name in paragraphs.get(layer, "") for name in names):
            misplaced.append(f"{_shown(module)}: none of {names} in the layer {layer!r}")
    assert not misplaced, "\n".join(misplaced)


def test_properties_are_listed_in_clause_order(capsys: pytest.CaptureFixture[str]) -> None:
    """The registry, ``attnspec properties`` and so every report (CONF-1: clause by clause)
    list the properties in the spec's order of their clauses (documents as the table of
    spec/index.md lists them, clauses as each document declares them), not in the order
    their modules import."""
    from attnspec.conformance import cli
    from attnspec.conformance.clauses import all_clauses, spec_order
    from attnspec.conformance.registry import all_properties

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
