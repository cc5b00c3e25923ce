"""Check every internal link and anchor of a built site: ``python docs/site/linkcheck.py site``.

MkDocs (``strict``, ``validation`` in mkdocs.yml) already checks the links written in the
Markdown; this checks the HTML as built — navigation, API reference, theme assets — so that
every relative ``href``/``src`` names a file that exists and every ``#fragment`` names an
``id`` in its target page.  External links (with a scheme, or ``//host``) are listed but not
fetched: the build runs without a network.  Exit status 1 lists each broken link.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

LINK_ATTRIBUTES = {"a": "href", "link": "href", "img": "src", "script": "src"}


class _Page(HTMLParser):
    """The ids and the outgoing links of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if values.get(key):
                self.ids.add(values[key])  # type: ignore[arg-type]
        target = values.get(LINK_ATTRIBUTES.get(tag, ""))
        if target:
            self.links.append(target)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def broken_links(site: Path) -> tuple[list[str], int]:
    """(one line per broken internal link or anchor, number of external links skipped)."""
    root = site.resolve()
    pages = {path.resolve(): _parse(path) for path in sorted(site.rglob("*.html"))}
    broken, external = [], 0
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                external += 1
                continue
            # "/x" is relative to the site's root (the 404 page uses such links)
            base = root if parts.path.startswith("/") else path.parent
            target = (base / unquote(parts.path).lstrip("/")).resolve() if parts.path else path
            where = f"{path.relative_to(root)}: {link}"
            if not target.exists():
                broken.append(f"{where} (no file {unquote(parts.path)})")
            elif parts.fragment and target.suffix == ".html":
                anchors = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in anchors:
                    broken.append(f"{where} (no id {parts.fragment!r} in {target.name})")
    return broken, external


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python docs/site/linkcheck.py SITE_DIR", file=sys.stderr)
        return 2
    broken, external = broken_links(Path(argv[0]))
    for line in broken:
        print(f"broken link: {line}", file=sys.stderr)
    print(
        f"link check: {len(broken)} broken internal links; {external} external links not "
        "fetched (no network)"
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
