"""The Python API beside the command: ``check`` and ``assert_conforms`` (CONF-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnspec.conformance import (
    SetupError,
    assert_conforms,
    check,
)
from attnspec.conformance.judge.verdict import PASSED


def test_python_api_assert_conforms(kernels: Path) -> None:
    """CONF-1: assert_conforms returns the report of a conforming kernel, raises
    AssertionError with the table for a failing one, SetupError for a bad setup."""
    report = assert_conforms(f"{kernels}:correct", backend="numpy", only=["default-scale"])
    assert report.conforms and [v.status for v in report.verdicts] == [PASSED]
    with pytest.raises(AssertionError, match=r"FAILED default-scale \[SDPA-2.1 MUST"):
        assert_conforms(f"{kernels}:no_default_scale", only=["default-scale"])
    with pytest.raises(SetupError, match="does not accept the keyword 'bias'"):
        assert_conforms(f"{kernels}:correct", only=["default-scale"], bias=True)
    with pytest.raises(SetupError, match=r"unknown claim\(s\) biass"):
        assert_conforms(f"{kernels}:correct", only=["default-scale"], biass=True)


@pytest.mark.parametrize(
    ("target", "options", "message"),
    [
        (None, {}, r"kernel=None, but should be a callable or a target string, 'MODULE:FUNC'"),
        (3, {}, r"kernel=3, but should be a callable or a target string"),
        ("correct", {"causal": "yes"}, r"causal='yes', but should be True or False"),
        ("correct", {"batch_ndim": True}, r"batch_ndim=True, but should be int or None"),
        ("correct", {"mask_keyword": 3}, r"mask_keyword=3, but should be str"),
        ("correct", {"seed": "abc"}, r"seed='abc', but should be an int"),
    ],
)
def test_python_api_names_a_bad_argument(
    kernels: Path, target: object, options: dict[str, object], message: str
) -> None:
    """CONF-3: check() given a kernel that is neither a callable nor a target, a claim of
    the wrong type (a truthy string for a bool, True for a number) or a seed that is not
    an int says which argument and what it should be, before anything runs (these used to
    run: every property failing on None, or the claim taken as truthy)."""
    kernel = f"{kernels}:{target}" if isinstance(target, str) else target
    with pytest.raises(SetupError, match=message):
        check(kernel, only=["default-scale"], **options)  # type: ignore[arg-type]


def test_assert_conforms_caps_the_reproduction(
    kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SDPA-2.1: the score-variance failure's reproduction (2000 key pairs as literals,
    over a megabyte) is not put into the AssertionError: it is written to a file that the
    message names, in attnspec-reproductions/ of the working directory (never the
    temporary directory), and that file holds the whole snippet."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError) as failure:
        assert_conforms(f"{kernels}:no_default_scale", only=["score-variance"])
    message = str(failure.value)
    assert len(message) < 20_000 and "FAILED score-variance [SDPA-2.1" in message
    path = Path(message.split("too long to show here; it is in ")[1].split()[0])
    assert path == Path("attnspec-reproductions", "score-variance.py")
    try:
        snippet = path.read_text(encoding="utf-8")
        assert len(snippet) > 1_000_000 and "out = fn(q, k, v" in snippet
        compile(snippet, str(path), "exec")
    finally:
        path.unlink()
