"""The release discipline of spec/index.md, section 5: a released version's text is frozen
(spec/releases/<version>/, generated from the git tag spec-<version> by
scripts/freeze-release) and never changes; errors of a released version are dated errata;
the package on the main branch checks the draft of the next version; CITATION.cff cites the
newest release and is valid CFF 1.2.0; both changelogs have one section per version.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import attnspec
from attnspec._version import SPEC_IS_DRAFT
from attnspec.conformance.claims.clauses import all_clauses

ROOT = Path(attnspec.__file__).resolve().parent
RELEASES = ROOT / "spec" / "releases"
# The SHA-256 of each frozen release's RELEASE.json, which holds the digest of every file of
# it: a released text cannot change unless this line changes too, on purpose. Never edit an
# entry; a new release adds one (scripts/freeze-release prints nothing to paste: compute it
# with sha256sum spec/releases/<version>/RELEASE.json after reviewing the frozen copy).
FROZEN = {
    "2026.12": "3383b899f84d73c4f5cae44be13186ac1ce5d2368e4bd684971ace8dea0ccd27",
}
KEEP_A_CHANGELOG = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
SPEC_CHANGELOG_KINDS = ("Added", "Changed", "Withdrawn", "Fixed", "Editorial")
ERRATUM = re.compile(r"E-(\d{4}\.\d{1,2})-(\d+)")


def _freeze_release() -> ModuleType:
    path = ROOT / "scripts" / "freeze-release"
    loader = importlib.machinery.SourceFileLoader("freeze_release", str(path))
    spec = importlib.util.spec_from_loader("freeze_release", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _manifest(version: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((RELEASES / version / "RELEASE.json").read_text())
    return manifest


def _frozen_versions() -> list[str]:
    return sorted((p.name for p in RELEASES.iterdir() if p.is_dir()), key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.removesuffix("-draft").split("."))


def test_frozen_releases_are_intact() -> None:
    """Section 5: every frozen release is exactly its manifest (each file's bytes after its
    banner hash to the released file's digest), and each manifest is the one pinned here."""
    assert set(_frozen_versions()) == set(FROZEN), "a frozen release without a pinned digest"
    for version in _frozen_versions():
        folder = RELEASES / version
        assert _freeze_release().problems(folder) == [], version
        digest = hashlib.sha256((folder / "RELEASE.json").read_bytes()).hexdigest()
        assert digest == FROZEN[version], f"{version}: RELEASE.json changed"
        manifest = _manifest(version)
        assert manifest["version"] == version and manifest["tag"] == f"spec-{version}"


def test_a_changed_frozen_text_is_found(tmp_path: Path) -> None:
    """Section 5: the check above is not vacuous: one changed character of a released
    document, a changed banner, a removed figure and an added file are each reported."""
    freeze = _freeze_release()
    version = _frozen_versions()[-1]
    cases = {
        "text": lambda f: (f / "dense.md").write_text(
            (f / "dense.md").read_text().replace("MUST", "SHOULD", 1)
        ),
        "banner": lambda f: (f / "index.md").write_text(
            (f / "index.md").read_text().replace("never changes", "rarely changes", 1)
        ),
        "removed": lambda f: next((f / "figures").glob("*.png")).unlink(),
        "added": lambda f: (f / "new.md").write_text("# new\n"),
    }
    for name, change in cases.items():
        folder = tmp_path / name
        shutil.copytree(RELEASES / version, folder)
        assert freeze.problems(folder) == [], name
        change(folder)
        assert len(freeze.problems(folder)) == 1, (name, freeze.problems(folder))


def _git_can_read_tags() -> bool:
    if shutil.which("git") is None:
        return False
    found = subprocess.run(
        ["git", "-C", str(ROOT), "tag", "--list", "spec-*"], capture_output=True, text=True
    )
    return found.returncode == 0 and bool(found.stdout.strip())


@pytest.mark.skipif(
    not _git_can_read_tags(),
    reason="no git checkout with the spec-* tags here (e.g. an unpacked archive): the "
    "frozen copies are still checked against their pinned digests above",
)
def test_frozen_releases_are_generated_from_their_tags() -> None:
    """Section 5: each frozen release is what scripts/freeze-release generates from the tag
    spec-<version>, and the tag is on the commit the manifest names."""
    for version in _frozen_versions():
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", f"spec-{version}^{{commit}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert commit == _manifest(version)["commit"], version
        check = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "freeze-release"), version, "--check"],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_released_ids_are_never_deleted() -> None:
    """Section 5: every clause id of a frozen release is still a clause of the draft, or
    its withdrawal is listed in spec/CHANGELOG.md, so an old citation stays resolvable."""
    clause = re.compile(r'^<a id="([A-Z]+-[0-9]+(?:\.[0-9]+)*)"></a>\n\*\*\1 \(', re.MULTILINE)
    withdrawn = set(
        re.findall(
            r"[A-Z]+-[0-9]+(?:\.[0-9]+)*",
            "".join(re.findall(r"^### Withdrawn\n(.*?)(?=^##|\Z)", _spec_changelog(), re.S | re.M)),
        )
    )
    for version in _frozen_versions():
        released: set[str] = set()
        for document in (RELEASES / version).glob("*.md"):
            released |= set(clause.findall(document.read_text(encoding="utf-8")))
        assert len(released) > 50, version
        assert released <= set(all_clauses()) | withdrawn | _definitions(), sorted(
            released - set(all_clauses()) - withdrawn
        )


def _definitions() -> set[str]:
    """Informative definitions with an id (MHA-1, ...): citable, not clauses."""
    text = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "spec").glob("*.md"))
    return set(re.findall(r"^\*\*([A-Z]+-[0-9]+(?:\.[0-9]+)*) \(informative\)", text, re.M))


def test_the_package_checks_the_draft_of_a_later_version() -> None:
    """Section 5: a development release of the package checks the draft (its SPEC_VERSION
    ends in -draft and names the package's version), a release checks a released version,
    and the draft's version is later than every frozen release."""
    release = ".".join(attnspec.__version__.split(".")[:2])
    assert SPEC_IS_DRAFT == (".dev" in attnspec.__version__)
    assert attnspec.SPEC_VERSION == release + ("-draft" if SPEC_IS_DRAFT else "")
    assert re.fullmatch(r"\d{4}\.[1-9]\d?", release), "YYYY.M, no leading zero (PEP 440)"
    newest = _frozen_versions()[-1]
    if SPEC_IS_DRAFT:
        assert _version_key(release) > _version_key(newest)
    else:
        assert release == newest, "a released package checks a frozen release"


def _cff() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="the test extra installs pyyaml")
    data: dict[str, Any] = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    return data


def test_citation_file_is_valid_cff_1_2_0() -> None:
    """Section 9: CITATION.cff validates against the CFF 1.2.0 schema (tests/data, offline),
    and the validation rejects a citation without authors or with an unquoted date."""
    jsonschema = pytest.importorskip("jsonschema", reason="the test extra installs jsonschema")
    schema = json.loads((ROOT / "tests/data/cff-1.2.0.schema.json").read_text())
    validator = jsonschema.Draft7Validator(
        schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )
    cff = _cff()
    assert not list(validator.iter_errors(cff)), [e.message for e in validator.iter_errors(cff)]
    without_authors = {k: v for k, v in cff.items() if k != "authors"}
    assert list(validator.iter_errors(without_authors))
    import datetime

    assert list(validator.iter_errors({**cff, "date-released": datetime.date(2026, 12, 1)}))


def test_citation_file_cites_the_newest_release() -> None:
    """Section 9: CITATION.cff and its preferred citation name the newest frozen release,
    its release date and its tagged commit, with what a citation manager needs."""
    cff = _cff()
    manifest = _manifest(_frozen_versions()[-1])
    for entry in (cff, cff["preferred-citation"]):
        assert entry["version"] == manifest["version"]
        assert entry["date-released"] == manifest["released"]
        assert entry["commit"] == manifest["commit"]
        assert entry["title"] == "attnspec: a reference specification of attention"
        assert entry["authors"] == [{"name": "attnspec contributors"}]
        assert entry["license"] == "Apache-2.0"
    assert cff["preferred-citation"]["year"] == int(manifest["released"][:4])
    assert f'"attnspec {manifest["version"]}, SDPA-4.2"' in cff["message"]
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["abstract"]


def _spec_changelog() -> str:
    return (ROOT / "spec" / "CHANGELOG.md").read_text(encoding="utf-8")


def _sections(text: str) -> list[tuple[str, str, str]]:
    """(version, date or 'unreleased', body) of each '## [VERSION] — DATE' section."""
    return re.findall(
        r"^## \[([^\]]+)\] — (\d{4}-\d\d-\d\d|unreleased)\n(.*?)(?=^## |\Z)", text, re.M | re.S
    )


def test_spec_changelog_has_one_section_per_version() -> None:
    """Section 5: spec/CHANGELOG.md opens with the draft (unreleased) or the package's
    released version, then every frozen release with its release date, newest first, each
    divided into the kinds of change its preamble lists."""
    sections = _sections(_spec_changelog())
    versions = [version for version, _, _ in sections]
    assert versions[0] == attnspec.SPEC_VERSION
    assert (sections[0][1] == "unreleased") == SPEC_IS_DRAFT
    assert versions[1 if SPEC_IS_DRAFT else 0 :] == _frozen_versions()[::-1]
    for version, date, body in sections:
        if version in FROZEN:
            assert date == _manifest(version)["released"], version
        kinds = re.findall(r"^### (.*)$", body, re.M)
        assert kinds and set(kinds) <= set(SPEC_CHANGELOG_KINDS), (version, kinds)
        assert kinds == sorted(kinds, key=SPEC_CHANGELOG_KINDS.index), (version, kinds)


def test_package_changelog_has_one_section_per_version() -> None:
    """CHANGELOG.md in Keep a Changelog form: an [Unreleased] section naming the
    development version (while there is one), then one dated section per released version,
    newest first, the newest a release of the newest frozen spec, each divided into Keep a
    Changelog's kinds of change."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\] — (\S+)\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert sections, "CHANGELOG.md has no '## [VERSION] — DATE' section"
    for version, _, body in sections:
        kinds = re.findall(r"^### (.*)$", body, re.M)
        assert kinds and set(kinds) <= set(KEEP_A_CHANGELOG), (version, kinds)
    if SPEC_IS_DRAFT:
        assert sections[0][:2] == ("Unreleased", attnspec.__version__), sections[0][:2]
        sections = sections[1:]
    else:
        assert sections[0][0] == attnspec.__version__, sections[0][0]
    released = [version for version, _, _ in sections]
    assert released and released[0].startswith(_frozen_versions()[-1] + "."), released
    assert released == sorted(released, key=_version_key, reverse=True)
    for version, date, _ in sections:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", date), (version, date)


def _errata() -> list[tuple[str, str, str, str]]:
    """(id, version, number, date found) of every erratum of spec/errata.md."""
    text = (ROOT / "spec" / "errata.md").read_text(encoding="utf-8")
    rows = re.findall(r'^\| <a id="(E-([\d.]+)-(\d+))"></a>\1 \| (\d{4}-\d\d-\d\d) \|', text, re.M)
    return [(ident, version, number, date) for ident, version, number, date in rows]


def test_errata_are_dated_numbered_and_in_the_changelog() -> None:
    """Section 5: each erratum is a row with its own anchor and the date it was found, no
    earlier than its version's release; ids are numbered from 1 without gaps per version;
    every erratum is named in spec/CHANGELOG.md, and every erratum named there exists."""
    errata = _errata()
    assert errata, "spec/errata.md lists no erratum"
    for version in {version for _, version, _, _ in errata}:
        assert version in FROZEN, f"an erratum of {version}, which is not a frozen release"
        numbers = [int(n) for _, v, n, _ in errata if v == version]
        assert numbers == list(range(1, len(numbers) + 1)), (version, numbers)
    for ident, version, _, date in errata:
        assert date >= _manifest(version)["released"], (ident, date)
    named = {f"E-{version}-{number}" for version, number in ERRATUM.findall(_spec_changelog())}
    assert named == {ident for ident, _, _, _ in errata}
