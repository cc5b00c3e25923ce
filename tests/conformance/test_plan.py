"""One check, validated once (CONF-6): :func:`plan_run` rejects every bad choice of the CLI,
the API and the plugin before the kernel is loaded, and the API writes the report files of
its plan as the CLI does (conformance/run_plan.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from attnspec.conformance.api import check
from attnspec.conformance.plan import plan_run
from attnspec.conformance.run.kernel_setup import KernelSetup, SetupError
from attnspec.conformance.run.supervisor import IsolationOptions

REFERENCE = "attnspec.reference:scaled_dot_product_attention"


@pytest.mark.parametrize(
    "choices, words",
    [
        ({"only": ["no-such-property"]}, "no-such-property"),
        ({"profile": "no-such-profile"}, "no-such-profile"),
        ({"jobs": 0}, "jobs=0, but should be a positive integer"),
        ({"jobs": 2}, "jobs=2 runs properties in worker processes"),
        ({"reports": {"html": "r.html"}}, "reports has the format(s) ['html']"),
        ({"reports": {"json": "."}}, "--json '.' is a directory"),
        ({"reports": {"json": "r", "markdown": "./r"}}, "--json writes the same file"),
        ({"reports": {"junit": "no/such/dir/r.xml"}}, "directory 'no/such/dir' does not exist"),
    ],
)
def test_a_bad_choice_is_rejected_before_the_kernel_loads(
    choices: dict[str, Any], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-6: a run that could not finish (or not be saved) is refused before it starts;
    the kernel's module does not exist, so only a check made before loading can answer."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SetupError) as raised:
        plan_run(KernelSetup("no_such_module_here:fn", "numpy"), **choices)
    assert words in str(raised.value)


def test_the_plan_carries_every_choice(tmp_path: Path) -> None:
    """CONF-6: the plan holds what the runner needs: the selection in the order given, a
    partial run (no claim) for --only, workers and the report paths asked for."""
    plan = plan_run(
        KernelSetup(REFERENCE, "numpy"),
        only=["explicit-scale", "default-scale"],
        seed=3,
        isolation=IsolationOptions(),
        jobs=2,
        reports={"json": tmp_path / "r.json", "junit": None},
    )
    assert [p.id for p in plan.properties] == ["explicit-scale", "default-scale"]
    assert plan.partial and plan.seed == 3 and plan.jobs == 2
    assert plan.reports == (("json", tmp_path / "r.json"),)


def test_the_api_writes_the_report_files_of_its_plan(tmp_path: Path) -> None:
    """CONF-6: check(reports=...) writes the same complete JSON and Markdown reports as
    ``attnspec check --json --markdown`` after the run."""
    paths = {"json": tmp_path / "r.json", "markdown": tmp_path / "r.md"}
    report = check(REFERENCE, backend="numpy", only=["default-scale"], reports=paths)
    data = json.loads(paths["json"].read_text())
    assert [v["property"] for v in data["verdicts"]] == ["default-scale"]
    assert data["incomplete"] == "" and data["claim"] == report.claim
    assert "default-scale" in paths["markdown"].read_text()
