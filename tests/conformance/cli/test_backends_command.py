"""``attnspec backends``: the backend survey."""

from __future__ import annotations

import pytest
from support import run_main


def test_backends_prints_the_survey(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attnspec backends`` prints backends.survey's table (survey stubbed: it is slow
    and tested with the backends)."""
    from attnspec.benchmarks import survey

    rows = [
        survey.SurveyRow("numpy", "cpu", "float64", 0.0, 0.0),
        survey.SurveyRow("cupy", "-", None, None, None, reason="no CUDA device"),
    ]
    monkeypatch.setattr(survey, "survey", lambda seed=0: rows)
    status, out, _ = run_main(capsys, "backends")
    assert status == 0
    assert out.strip() == survey.format_survey(rows).strip()
