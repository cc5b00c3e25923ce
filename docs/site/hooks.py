"""MkDocs hooks for the attnspec site (mkdocs.yml names this file).

* ``on_config`` appends to the nav's "Specification" and "Guides" sections any page of
  ``spec/`` or ``docs/`` that mkdocs.yml does not list yet, so a new document is in the
  site (and its search) without an edit here; mkdocs.yml fixes the order of the known ones.
* ``on_files`` adds the pages where they live in the repository — ``spec/*.md``,
  ``spec/figures/*.png`` and ``docs/*.md`` — at the same paths in the site, so relative links
  between them (``dense.md#SDPA-4.2``, ``../spec/index.md``) work unchanged and a clause's
  address mirrors the repository's: ``spec/dense.html#SDPA-4.2``.
* ``on_page_markdown`` sets each ``$$`` display block apart by blank lines, as
  ``pymdownx.arithmatex`` needs (GitHub, where the spec is also read, does not).
* ``on_page_content`` turns the TeX that ``pymdownx.arithmatex`` delimits into MathML when the
  site is built, so the pages render mathematics without a script or a network.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from latex2mathml.converter import convert
from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY_PAGES = (("spec", "*.md"), ("spec/figures", "*.png"), ("docs", "*.md"))
# pymdownx.arithmatex's "generic" output: \( ... \) in a span, \[ ... \] in a div.
INLINE_MATH = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
DISPLAY_MATH = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


NAV_SECTIONS = {"spec": "Specification", "docs": "Guides"}


def _listed(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    items = nav.values() if isinstance(nav, dict) else nav
    return set().union(*(_listed(item) for item in items)) if items else set()


def on_config(config: Any) -> Any:
    listed = _listed(config["nav"])
    sections = {
        next(iter(item)): item[next(iter(item))] for item in config["nav"] if isinstance(item, dict)
    }
    for folder, section in NAV_SECTIONS.items():
        for path in sorted((ROOT / folder).glob("*.md")):
            page = path.relative_to(ROOT).as_posix()
            if page not in listed:
                sections[section].append(page)
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


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
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


def _mathml(tex: str, display: str) -> str:
    return convert(html.unescape(tex).strip(), display=display)


def on_page_content(content: str, page: Any, config: Any, files: Files) -> str:
    content = DISPLAY_MATH.sub(
        lambda m: f'<div class="math">{_mathml(m[1], "block")}</div>', content
    )
    return INLINE_MATH.sub(lambda m: _mathml(m[1], "inline"), content)
