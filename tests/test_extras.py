"""Every combination of optional extras imports and type-checks (issue 30).

The package needs only its core dependencies (pyproject's ``dependencies``); the libraries of
the extras (torch, jax, cupy, matplotlib for ``bench``, flax, keras, the third-party
kernels) are imported inside the functions that use them.  Two checks prove it, both cheap:

- importing every module of the package with every optional library blocked
  (``sys.modules[name] = None`` makes ``import name`` raise ImportError) succeeds;
- mypy reads every optional library as missing, installed or not (``follow_imports =
  "skip"`` with ``ignore_missing_imports``, and ``follow_imports_for_stubs`` for the
  libraries that ship ``.pyi`` stubs, which ``skip`` alone still reads: jax.numpy's, where
  a function returning the module passed with jax installed and failed ``no-any-return``
  without it), so the one ``mypy --strict`` run of
  scripts/typecheck (tests/test_project_rules.py) sees what a run without any extra sees:
  passing there is passing in every combination.  Without ``skip``, an installed library's
  types are checked and a run without it differs (an ``Any`` returned where ``int`` is
  declared, a ``type: ignore`` left unused), which is how ``mypy --strict`` failed in an
  environment without the bench extra.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys

import pytest
from support import syntax_tree
from test_architecture import ROOT, package_modules

# What the package may import at module level: its core dependencies (their import names),
# and pytest, which only the pytest plugin imports (pytest loads it; it needs no extra).
CORE = {"numpy", "array_api_compat", "array_api_extra", "hypothesis"}
PLUGIN_ONLY = {"pytest": "conformance.pytest_plugin"}
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")


@functools.cache
def package_trees() -> dict[str, ast.Module]:
    """Each module of the package (package_modules' names) -> its syntax tree, parsed once
    per process (support.syntax_tree)."""
    return {module: syntax_tree(path) for module, (path, _) in package_modules().items()}


@functools.cache
def imported_libraries() -> dict[str, frozenset[str]]:
    """Each third-party library the package imports (top-level name) -> the modules that do."""
    found: dict[str, set[str]] = {}
    for module, tree in package_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top != "attnspec":
                    found.setdefault(top, set()).add(module)
    return {library: frozenset(modules) for library, modules in found.items()}


def optional_libraries() -> list[str]:
    return sorted(set(imported_libraries()) - CORE - set(PLUGIN_ONLY))


def test_core_dependencies_are_pyprojects() -> None:
    """CORE is pyproject's ``dependencies`` (by import name), so the checks below block
    every library that is not one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    names = {dep.split(">")[0].split("=")[0].strip() for dep in project["dependencies"]}
    assert {name.replace("-", "_") for name in names} == CORE


def test_only_the_plugin_imports_pytest() -> None:
    """pytest is not a dependency: only the pytest plugin (loaded by pytest) may import it."""
    users = imported_libraries()
    for library, module in PLUGIN_ONLY.items():
        assert users.get(library, set()) <= {module}, users[library]


def test_every_module_imports_without_the_optional_extras() -> None:
    """With every optional library blocked, each module of the package imports: they are
    imported only inside the functions that use them (matplotlib only where a figure is
    drawn, torch only where a torch kernel is called)."""
    blocked = optional_libraries()
    assert {"matplotlib", "torch", "jax"} <= set(blocked), blocked  # the checker sees them
    modules = sorted(
        f"attnspec.{name}" if name else "attnspec"
        for name in package_modules()
        if name != PLUGIN_ONLY["pytest"]
    )
    script = (
        "import importlib, json, sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "failed = {}\n"
        f"for module in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(module)\n"
        "    except Exception as exc:\n"
        "        failed[module] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout.splitlines()[-1])
    assert not failed, "modules that need an optional extra to import:\n" + "\n".join(
        f"{module}: {error}" for module, error in failed.items()
    )


def _mypy_overrides() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    overrides: list[dict[str, object]] = config["tool"]["mypy"]["overrides"]
    return overrides


def _matches(module: str, pattern: str) -> bool:
    """mypy's rule: ``a.*`` names ``a`` and every module below it."""
    if pattern.endswith(".*"):
        return module == pattern[:-2] or module.startswith(pattern[:-1])
    return module == pattern


def _override_of(module: str) -> dict[str, object]:
    """The settings mypy applies to ``module`` (the overrides naming it, merged)."""
    settings: dict[str, object] = {}
    for override in _mypy_overrides():
        patterns = override["module"]
        patterns = [patterns] if isinstance(patterns, str) else patterns
        assert isinstance(patterns, list)
        if any(_matches(module, p) for p in patterns):
            settings.update(override)
    return settings


def test_mypy_reads_every_optional_library_as_missing() -> None:
    """Each optional library, and its submodules, is ``follow_imports = "skip"``, with
    ``follow_imports_for_stubs`` (its ``.pyi`` stubs skipped too), and
    ``ignore_missing_imports`` for mypy: the same ``Any`` whether its extra is installed or
    not, so scripts/typecheck passing proves ``mypy --strict`` passes without any extra."""
    wrong = []
    for library in optional_libraries():
        for module in (library, f"{library}.sub"):
            settings = _override_of(module)
            if (
                settings.get("follow_imports") != "skip"
                or settings.get("follow_imports_for_stubs") is not True
                or not settings.get("ignore_missing_imports")
            ):
                wrong.append(module)
    assert not wrong, f"not read as missing by mypy (pyproject's [tool.mypy] overrides): {wrong}"


def test_override_matching_finds_a_library_left_out() -> None:
    """The check above fails for a library no override names (here: one made up)."""
    assert _override_of("attnspec_made_up_library") == {}
    assert _override_of("torch.nn")["follow_imports"] == "skip"


# What ``typing`` gained after 3.10, the oldest Python pyproject's requires-python admits.
TYPING_AFTER_3_10 = {
    "Unpack", "Self", "Never", "LiteralString", "Required", "NotRequired", "TypeVarTuple",
    "assert_never", "assert_type", "reveal_type", "dataclass_transform", "get_overloads",
    "clear_overloads", "override", "TypeAliasType", "ReadOnly", "TypeIs",
}  # fmt: skip


def runtime_typing_imports(source: str | ast.Module) -> set[str]:
    """The names a module (its source or syntax tree) imports from ``typing`` when it runs:
    everything but what is imported under ``if TYPE_CHECKING:``."""
    tree = ast.parse(source) if isinstance(source, str) else source
    checking_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for node in ast.walk(block)
    }
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "typing"
        if id(node) not in checking_only
        for alias in node.names
    }


def test_the_package_imports_on_the_oldest_python_it_admits() -> None:
    """pyproject says ``requires-python = ">=3.10"``: no module imports a name ``typing``
    gained later when it runs (``Unpack`` for the reference's keyword sets is imported under
    ``TYPE_CHECKING``; with ``from __future__ import annotations`` the annotations that name
    it are never evaluated)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["requires-python"] == ">=3.10", "update TYPING_AFTER_3_10 with the floor"
    newer = {
        module: sorted(runtime_typing_imports(tree) & TYPING_AFTER_3_10)
        for module, tree in package_trees().items()
    }
    assert {module: names for module, names in newer.items() if names} == {}


def test_runtime_typing_imports_sees_past_type_checking_blocks() -> None:
    """The helper above finds a module-level import and ignores a TYPE_CHECKING one."""
    source = (
        "from typing import TYPE_CHECKING, Any, Unpack\n"
        "if TYPE_CHECKING:\n    from typing import Self\n"
    )
    assert runtime_typing_imports(source) == {"TYPE_CHECKING", "Any", "Unpack"}
