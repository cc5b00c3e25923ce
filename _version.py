"""The one place the version is written: pyproject reads ``__version__`` from here
(``[tool.setuptools.dynamic]``), and the spec's version follows from it (spec/index.md
section 5): the year and month of the release, and ``-draft`` while the package is a
development release of the next version, whose spec text (``spec/*.md``) may still change.
Released spec versions are frozen under ``spec/releases/<version>/``.

May import: nothing.
"""

__version__ = "2027.1.0.dev0"
# "2027.1.0.dev0" checks the draft "2027.1-draft"; "2027.1.0" (released) checks "2027.1".
SPEC_IS_DRAFT = ".dev" in __version__
SPEC_VERSION = ".".join(__version__.split(".")[:2]) + ("-draft" if SPEC_IS_DRAFT else "")
