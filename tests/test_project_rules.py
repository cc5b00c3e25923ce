"""The project's own rules, checked: pure Array-API reference, clauses cited, lint-clean."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import syntax_tree

from attnspec.conformance.claims.clauses import all_clauses
from attnspec.conformance.judge.registry import all_properties

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("numpy", "torch", "jax", "jaxlib", "cupy", "array_api_strict")


def _imported_modules(path: Path) -> set[str]:
    tree = syntax_tree(path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


REFERENCE_MODULES = sorted((ROOT / "reference").rglob("*.py"))  # subpackages (sparse/) too


def _under_reference(path: Path) -> str:
    return str(path.relative_to(ROOT / "reference"))


@pytest.mark.parametrize("path", REFERENCE_MODULES, ids=_under_reference)
def test_reference_imports_no_array_library(path: Path) -> None:
    """reference/ is pure Array API: it never imports an array library (SDPA-7.1: one
    definition for every library)."""
    assert not (_imported_modules(path) & set(LIBRARIES)), path


@pytest.mark.parametrize("path", REFERENCE_MODULES, ids=_under_reference)
def test_reference_has_no_per_library_branch(path: Path) -> None:
    """No is_torch_array / is_jax_namespace style branching inside reference/."""
    source = path.read_text(encoding="utf-8")
    assert not re.search(r"\bis_(numpy|torch|jax|cupy|dask|ndonnx)_(array|namespace)\b", source)


def _cited_text() -> str:
    sources = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("conformance/**/*.py")]
    return "\n".join(p.read_text(encoding="utf-8") for p in sources)


def test_every_clause_is_cited_by_a_test_or_property() -> None:
    """CONF-1: every clause of the spec is exercised somewhere that names it."""
    cited = set(re.findall(r"\b[A-Z]+-\d+(?:\.\d+)*\b", _cited_text()))
    missing = sorted(set(all_clauses()) - cited)
    assert not missing, f"clauses no test or property cites: {missing}"


def test_every_property_cites_an_existing_clause() -> None:
    """Each conformance property's clause is declared in the spec, so its level is known."""
    clauses = all_clauses()
    for prop in all_properties().values():
        assert prop.clause in clauses, (prop.id, prop.clause)
        assert prop.level in ("MUST", "SHOULD", "MAY")


def _ruff() -> str:
    """The ruff of the test extras (beside this Python), else the one on PATH."""
    beside_python = Path(sys.executable).parent / "ruff"
    ruff = str(beside_python) if beside_python.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed; install the test extras: pip install 'attnspec[test]'")
    return ruff


def test_ruff_is_clean() -> None:
    """The style rule: ruff-clean (the linter is part of the test extras)."""
    ruff = _ruff()
    result = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


def test_ruff_format_leaves_the_tree_unchanged() -> None:
    """The formatting rule: ``ruff format`` would change no file (the pre-commit hook and
    CONTRIBUTING.md run the same command)."""
    ruff = _ruff()
    result = subprocess.run([ruff, "format", "--check", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


def test_mypy_strict_is_clean() -> None:
    """Type hints hold: ``bash scripts/typecheck`` (mypy --strict on the packages that
    pyproject's [tool.mypy] lists) finds nothing."""
    if importlib.util.find_spec("mypy") is None:  # this interpreter is the one run below
        pytest.fail("mypy is not installed; install the test extras: pip install 'attnspec[test]'")
    # mypy reads its installed bytecode and writes none (it checks attnspec's source, never
    # imports it): under conftest's PYTHONPYCACHEPREFIX, meant for attnspec's modules, it
    # compiled its Python modules from source into the prefix a clean clone has empty
    # (0.56 -> 0.20 CPU-s of a run with mypy's cache filled)
    environment = {
        name: value for name, value in os.environ.items() if name != "PYTHONPYCACHEPREFIX"
    }
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "typecheck")],
        capture_output=True,
        text=True,
        env={**environment, "PYTHON": sys.executable, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def _strings_but_docstrings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of ``tree`` that are not docstrings, in one walk of it."""
    docstrings, strings = set(), []
    for n in ast.walk(tree):
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = n.body[0] if n.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            strings.append(n)
    return [n for n in strings if id(n) not in docstrings]


def test_the_version_is_written_once() -> None:
    """One version source: _version.py; the installed package's metadata agrees with it
    (pyproject reads it), and no code writes the version as a literal elsewhere (docstrings
    may quote it)."""
    import importlib.metadata

    import attnspec

    assert importlib.metadata.version("attnspec") == attnspec.__version__, (
        "the installed metadata differs from _version.py: reinstall (bash scripts/setup, or "
        ".venv/bin/python -m pip install --no-deps --no-build-isolation -e .)"
    )
    release = attnspec.SPEC_VERSION.removesuffix("-draft")  # a draft names its release
    assert attnspec.__version__.startswith(release + ".")
    literal = re.compile(re.escape(release) + r"(?!\d)")  # the draft's name contains it
    written = []
    package = [
        *ROOT.glob("*.py"),
        *(
            path
            for folder in ("reference", "backends", "conformance", "benchmarks", "scripts")
            for path in (ROOT / folder).rglob("*.py")
        ),
    ]
    for path in sorted(package):
        relative = path.relative_to(ROOT)
        if relative.name == "_version.py":
            continue
        tree = syntax_tree(path)  # parsed once per process (support.py)
        written += [
            f"{relative}:{node.lineno}"
            for node in _strings_but_docstrings(tree)
            if isinstance(node.value, str) and literal.search(node.value)
        ]
    assert not written, f"the version written outside _version.py: {written}"


def test_the_package_changelog_heads_the_version() -> None:
    """The package's CHANGELOG.md (beside spec/CHANGELOG.md) opens with the version of
    _version.py (versioning policy, spec/index.md section 5): a development version as its
    [Unreleased] section, a release as its own, so that a release cannot ship without its
    entry (tests/test_releases.py checks the rest of its form)."""
    import attnspec

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    first = re.search(r"^## \[([^\]]+)\] — (\S+)$", text, flags=re.MULTILINE)
    assert first, "CHANGELOG.md has no '## [VERSION] — DATE' section"
    heading = (first[1], first[2]) if first[1] == "Unreleased" else (first[1],)
    expected = (
        ("Unreleased", attnspec.__version__)
        if ".dev" in attnspec.__version__
        else (attnspec.__version__,)
    )
    assert heading == expected, (heading, expected)
