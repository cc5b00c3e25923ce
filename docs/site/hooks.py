"""MkDocs hooks for the attnspec site (mkdocs.yml names this file).

* ``on_config`` names the site after ``attnspec.SPEC_VERSION``; appends to the nav's
  "Draft specification" and "Guides" sections any page of ``spec/`` or ``docs/`` that
  mkdocs.yml does not list yet, so a new document is in the site (and its search) without an
  edit here (mkdocs.yml fixes the order of the known ones); and adds one nav section per
  frozen release (``spec/releases/<version>/``, spec/index.md section 5), so a release is in
  the site as soon as it is frozen.
* ``on_files`` adds the pages where they live in the repository — ``spec/*.md``,
  ``spec/figures/*.png``, ``docs/*.md`` and every frozen release — at the same paths in the
  site, so relative links between them (``dense.md#SDPA-4.2``, ``../spec/index.md``) work
  unchanged and a clause's address mirrors the repository's: ``spec/dense.html#SDPA-4.2``.
* ``on_page_markdown`` labels every page of the draft spec (``spec/*.md`` while
  ``attnspec.SPEC_VERSION`` ends in ``-draft``, errata.md aside) as a draft, and sets each
  ``$$`` display block apart by blank lines, as ``pymdownx.arithmatex`` needs (GitHub, where
  the spec is also read, does not).
* ``on_page_content`` turns the TeX that ``pymdownx.arithmatex`` delimits into MathML when the
  site is built, so the pages render mathematics without a script or a network (each formula
  converted once: the frozen releases repeat the draft's, 1783 distinct of 5323).
* ``on_startup`` keeps griffe (mkdocstrings' reader of the API pages' docstrings) out of the
  checkout's folders that cannot hold a submodule of attnspec (``.venv``, ``.cache``, ``.git``).
"""

from __future__ import annotations

import functools
import html
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from latex2mathml.converter import convert
from mkdocs.structure.files import File, Files, InclusionLevel

from attnspec._version import SPEC_IS_DRAFT, SPEC_VERSION

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY_PAGES = (
    ("spec", "*.md"),
    ("spec/figures", "*.png"),
    ("docs", "*.md"),
    ("spec/releases", "*/*.md"),
    ("spec/releases", "*/figures/*.png"),
)
RELEASES = ROOT / "spec" / "releases"
RELEASE_PAGES = {  # a frozen release's documents in reading order, with their nav titles
    "index.md": "Overview and conformance",
    "dense.md": "Dense attention",
    "features.md": "Kernel features",
    "tolerance.md": "Tolerance",
    "sparse.md": "Sparse attention",
    "linear.md": "Linear attention",
    "CHANGELOG.md": "Changelog",
}
# pymdownx.arithmatex's "generic" output: \( ... \) in a span, \[ ... \] in a div.
INLINE_MATH = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
DISPLAY_MATH = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


NAV_SECTIONS = {"spec": "Draft specification", "docs": "Guides"}


def _submodule_files(finder: Any, path: Path) -> Iterator[Path]:
    """griffe's ``ModuleFinder._filter_py_modules`` (the module files under ``path``), not
    descending into folders whose names are no Python identifiers: no module below them can
    be imported as a submodule, and the package's folder is the checkout's root, which holds
    ``.venv`` and ``.cache`` (~28 000 module files walked, ~0.5 of the build's ~5.5 CPU-s);
    the modules griffe loads are the same (compared: the same 206, the same site)."""
    for root, folders, files in os.walk(path, topdown=True, followlinks=True):
        folders[:] = [name for name in folders if name.isidentifier()]
        for name in files:
            if os.path.splitext(name)[1] in finder.extensions_set:
                yield Path(root, name)


def on_startup(command: str, dirty: bool) -> None:
    # griffe's private walk, replaced only where it is what this was written against
    # (griffe 2.4); elsewhere the build walks everything, slower and the same
    import griffe

    finder = griffe.ModuleFinder
    if hasattr(finder, "_filter_py_modules") and hasattr(finder, "extensions_set"):
        finder._filter_py_modules = _submodule_files  # type: ignore[method-assign]


def _listed(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    items = nav.values() if isinstance(nav, dict) else nav
    return set().union(*(_listed(item) for item in items)) if items else set()


def on_config(config: Any) -> Any:
    config["site_name"] = f"attnspec {SPEC_VERSION}"  # the version of _version.py, written once
    listed = _listed(config["nav"])
    sections = {
        next(iter(item)): item[next(iter(item))] for item in config["nav"] if isinstance(item, dict)
    }
    for folder, section in NAV_SECTIONS.items():
        for path in sorted((ROOT / folder).glob("*.md")):
            page = path.relative_to(ROOT).as_posix()
            if page not in listed:
                sections[section].append(page)
    for folder in sorted(RELEASES.iterdir(), reverse=True) if RELEASES.is_dir() else []:
        pages = sorted(path.name for path in folder.glob("*.md"))
        order = list(RELEASE_PAGES)
        pages.sort(key=lambda name: order.index(name) if name in order else len(order))
        config["nav"].append(
            {
                f"Released {folder.name} (frozen)": [
                    {RELEASE_PAGES.get(name, name): f"spec/releases/{folder.name}/{name}"}
                    for name in pages
                ]
            }
        )
    return config


def on_files(files: Files, config: Any) -> Files:
    for folder, pattern in REPOSITORY_PAGES:
        for path in sorted((ROOT / folder).glob(pattern)):
            files.append(
                File(
                    path.relative_to(ROOT).as_posix(),
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                    inclusion=InclusionLevel.INCLUDED,
                )
            )
    return files


DRAFT_LABEL = (
    '!!! warning "Draft: attnspec {version}"\n'
    "    This page is part of the draft of the next version; its text may change until it is\n"
    "    released. Cite a released version: its text is frozen (Errata and the released\n"
    "    versions are in the navigation).\n\n"
)


def _is_draft_page(page: Any) -> bool:
    uri = page.file.src_uri
    draft_documents = uri.startswith("spec/") and uri.count("/") == 1 and uri != "spec/errata.md"
    return SPEC_IS_DRAFT and draft_documents


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if _is_draft_page(page):
        title, newline, rest = markdown.partition("\n")
        if title.startswith("# "):  # the label goes under the page's title
            markdown = title + newline + "\n" + DRAFT_LABEL.format(version=SPEC_VERSION) + rest
        else:
            markdown = DRAFT_LABEL.format(version=SPEC_VERSION) + markdown
    lines, fenced, in_math = [], False, False
    for line in markdown.split("\n"):
        stripped = line.strip()
        fenced ^= stripped.startswith("```")
        if not fenced and stripped == "$$":
            if not in_math and lines and lines[-1].strip():
                lines.append("")
            lines.append(line)
            if in_math:
                lines.append("")
            in_math = not in_math
            continue
        lines.append(line)
    return "\n".join(lines)


@functools.cache
def _mathml(tex: str, display: str) -> str:
    return convert(html.unescape(tex).strip(), display=display)


def on_page_content(content: str, page: Any, config: Any, files: Files) -> str:
    content = DISPLAY_MATH.sub(
        lambda m: f'<div class="math">{_mathml(m[1], "block")}</div>', content
    )
    return INLINE_MATH.sub(lambda m: _mathml(m[1], "inline"), content)
