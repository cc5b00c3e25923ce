"""``attnspec properties``: every property, in the spec's clause order (CONF-1)."""

from __future__ import annotations

import pytest
from support import run_main

from attnspec.conformance.judge.registry import all_properties


def test_properties_lists_every_property(capsys: pytest.CaptureFixture[str]) -> None:
    """``attnspec properties``: every registered id with its clause and level."""
    status, out, _ = run_main(capsys, "properties")
    assert status == 0
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    for prop in all_properties().values():
        assert lines[prop.id][1:3] == [prop.clause, prop.level]
