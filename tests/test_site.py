"""The rendered site (mkdocs.yml, scripts/build-site): one strict build with a link check,
an anchor for every clause, mathematics rendered, the figures, the guides and the API.

The build needs the docs extra (``pip install -e '.[docs]'``, which ``scripts/setup``
installs); without it these tests skip and say so.  The link checker's own tests need
nothing and always run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

import attnspec
from attnspec.conformance.claims.clauses import all_clauses

ROOT = Path(attnspec.__file__).resolve().parent
DOCS_EXTRA = ("mkdocs", "material", "mkdocstrings_handlers.python", "pymdownx", "latex2mathml")
# CPU seconds, not wall time: the build is one process, and on a shared machine its wall
# time measures the other work (198 s seen at a load of 8); measured about 10 s of CPU.
BUILD_CPU_SECONDS = 60


def _linkcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("linkcheck", ROOT / "docs/site/linkcheck.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """Holds an exclusive lock on the file ``lock`` while the block runs (other processes
    asking for it wait)."""
    import fcntl  # not on Windows: the fixture asks whether it can be imported first

    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_site(out: Path) -> None:
    """``scripts/build-site`` into ``out``: it succeeds, its link check finds nothing broken,
    and it stays within ``BUILD_CPU_SECONDS``."""
    # The build reads the installed libraries' bytecode and writes none: MkDocs, Material,
    # Markdown, Jinja and griffe are imported from the environment's __pycache__, not
    # compiled from source into the checkout's .cache/pycache (the prefix conftest gives the
    # processes tests start, for attnspec's modules, of which the build imports only the
    # facade), which a clean clone has empty: the build alone 5.6 -> 4.5 CPU-s with an
    # empty prefix, 4.1-4.3 either way with a filled one.
    environment = {
        name: value for name, value in os.environ.items() if name != "PYTHONPYCACHEPREFIX"
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/build-site"), str(out)],
        capture_output=True,
        text=True,
        env={**environment, "PYTHON": sys.executable, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "link check: 0 broken internal links" in result.stdout
    assert cpu < BUILD_CPU_SECONDS, f"the site took {cpu:.0f} s of CPU to build"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built by ``scripts/build-site`` into a temporary folder, once per run.

    Once per run, not once per worker: pytest-xdist's worksteal hands the tail of one
    worker's queue to the other, and this module sits at the tail (on main's clean clone
    both workers built the site, ~4.7 s of CPU each).  Under xdist the site goes into the
    run's temporary folder that every worker shares (its workers' folders are inside it);
    the first worker to get there builds it under a lock while the others wait, and marks
    it built only once every assertion on the build has passed, so a failed build fails
    in each worker that needs it."""
    missing = [name for name in DOCS_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"the docs extra is not installed (no {', '.join(missing)}): pip install -e '.[docs]'"
        )
    if "PYTEST_XDIST_WORKER" not in os.environ or importlib.util.find_spec("fcntl") is None:
        out = tmp_path_factory.mktemp("site")  # one process, or no lock (Windows): its own
        _build_site(out)
        return out
    shared = tmp_path_factory.getbasetemp().parent  # the run's, not this worker's
    out, built = shared / "site", shared / "site.built"
    with _locked(shared / "site.lock"):
        if not built.exists():
            shutil.rmtree(out, ignore_errors=True)  # a failed build's leftovers
            _build_site(out)
            built.touch()
    return out


def test_every_clause_has_a_stable_anchor(site: Path) -> None:
    """CONF-1 ("How to cite a clause"): every clause id of every spec document is an anchor
    of its page, so "attnspec 2026.12, SDPA-4.2" links to spec/dense.html#SDPA-4.2."""
    pages: dict[str, str] = {}
    for clause in all_clauses().values():
        page = clause.document.removesuffix(".md") + ".html"
        if page not in pages:
            pages[page] = (site / "spec" / page).read_text(encoding="utf-8")
        assert f'id="{clause.id}"' in pages[page], clause.citation
    assert len(all_clauses()) > 50
    # informative definitions with an id (MHA-1, POS-1, ...) are citable the same way
    for document in (ROOT / "spec").glob("*.md"):
        page = (site / "spec" / f"{document.stem}.html").read_text(encoding="utf-8")
        for anchor in re.findall(
            r'^<a id="([A-Z]+-[\d.]+)"></a>$',
            document.read_text(encoding="utf-8"),
            flags=re.MULTILINE,
        ):
            assert f'id="{anchor}"' in page, (document.name, anchor)


def test_mathematics_is_rendered_to_mathml(site: Path) -> None:
    """Every $...$ and $$...$$ of the spec becomes MathML when the site is built: no TeX
    delimiters are left in the pages, and the pages with the most mathematics have hundreds
    of formulas."""
    for page in ("index", "dense", "features", "tolerance", "sparse", "linear", "CHANGELOG"):
        text = (site / "spec" / f"{page}.html").read_text(encoding="utf-8")
        body = text[text.index("<article") : text.index("</article>")]
        assert "arithmatex" not in body and "$$" not in body and "\\(" not in body, page
    dense = (site / "spec/dense.html").read_text(encoding="utf-8")
    assert dense.count("<math") > 100
    assert re.search(r'<math [^>]*display="block"', dense)


def test_figures_guides_and_api_reference_are_in_the_site(site: Path) -> None:
    """The figures of spec/figures, the conformance guide, the divergences and the API
    reference generated from the docstrings of attnspec.reference and attnspec.conformance."""
    for figure in (ROOT / "spec/figures").glob("*.png"):
        assert (site / "spec/figures" / figure.name).read_bytes() == figure.read_bytes()
    for guide in ("checking-your-kernel", "divergences", "architecture"):
        assert (site / "docs" / f"{guide}.html").is_file()
    reference = (site / "api/reference.html").read_text(encoding="utf-8")
    for name in attnspec.reference.__all__:
        if not callable(getattr(attnspec.reference, name)):
            continue  # constants have no docstring to render
        assert f'id="attnspec.reference.{name}"' in reference, name
    conformance = (site / "api/conformance.html").read_text(encoding="utf-8")
    for name in ("assert_conforms", "check", "declare", "KernelDeclaration"):
        assert f'id="attnspec.conformance.{name}"' in conformance, name


def test_search_index_covers_the_clauses(site: Path) -> None:
    """The site is searchable: the search index holds the spec's text, clause ids included."""
    index = json.loads((site / "search/search_index.json").read_text(encoding="utf-8"))
    text = " ".join(document["text"] for document in index["docs"])
    assert "SDPA-4.2" in text and "Bottom-right causal alignment" in text


def test_link_checker_reports_broken_links_and_anchors(tmp_path: Path) -> None:
    """docs/site/linkcheck.py: a missing file and a missing anchor are reported, a good
    relative link, a site-root link and an anchor in the same page are not, and external
    links are counted, not fetched."""
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec/dense.html").write_text('<p><a id="SDPA-4.2"></a>text</p>')
    (tmp_path / "index.html").write_text(
        '<h1 id="top">t</h1><a href="spec/dense.html#SDPA-4.2">ok</a>'
        '<a href="/spec/dense.html">root</a><a href="#top">here</a>'
        '<a href="https://example.org/">external</a>'
        '<a href="spec/dense.html#SDPA-99.9">bad anchor</a><a href="spec/gone.html">bad file</a>'
    )
    broken, external = _linkcheck().broken_links(tmp_path)
    assert external == 1
    assert len(broken) == 2
    assert re.search(r"SDPA-99\.9.*no id", broken[0]) and "no file spec/gone.html" in broken[1]


def test_site_is_git_ignored_and_documented() -> None:
    """The built site is not committed, and the README says how to build it."""
    assert "/site/" in (ROOT / ".gitignore").read_text().splitlines()
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/build-site" in readme and "site/index.html" in readme
