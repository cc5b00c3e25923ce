"""The one place the version is written: pyproject reads ``__version__`` from here
(``[tool.setuptools.dynamic]``), and the spec's version is its year and month."""

__version__ = "2026.12.0"
# spec/index.md section 5: the spec is YYYY.MM, the package adds a patch number.
SPEC_VERSION = ".".join(__version__.split(".")[:2])
