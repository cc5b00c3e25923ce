"""``attnspec demo``: torch and the reference checked, a written-up failure confirmed."""

from __future__ import annotations

import pytest
from support import run_main


def test_demo_checks_torch_and_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    """``attnspec demo``: PyTorch's SDPA and the reference, both tables, exit 0 (CONF-1)."""
    pytest.importorskip("torch", reason="the demo's first kernel is PyTorch's SDPA")
    status, out, _ = run_main(capsys, "demo", "--only", "default-scale")
    assert status == 0
    assert "conformance of torch.nn.functional:scaled_dot_product_attention on torch" in out
    assert "conformance of attnspec.reference:scaled_dot_product_attention" in out
    assert out.count("result: conforms") == 2


def test_demo_calls_a_written_up_failure_confirmed(capsys: pytest.CaptureFixture[str]) -> None:
    """SDPA-8.3: PyTorch's SDPA turns a NaN query into 0 (docs/divergences.md#torch-nan-query);
    the demo names that failure as the confirmed divergence and exits 0 (CONF-1)."""
    pytest.importorskip("torch", reason="the demo's first kernel is PyTorch's SDPA")
    status, out, _ = run_main(capsys, "demo", "--only", "nan-propagates")
    assert "confirmed divergence, not a suite artefact: nan-propagates [SDPA-8.3]" in out, out
    assert "divergences.md#torch-nan-query" in out
    assert status == 0


def test_demo_joins_the_failures_one_write_up_explains(capsys: pytest.CaptureFixture[str]) -> None:
    """SDPA-1.2 (issue 38): PyTorch's SDPA keeps q's batch shape for empty queries
    (docs/divergences.md#torch-empty-broadcast), met by batch-broadcast and its fixed corner
    shapes; the demo's report shows that root cause once, with its write-up."""
    pytest.importorskip("torch", reason="the demo's first kernel is PyTorch's SDPA")
    status, out, _ = run_main(capsys, "demo", "--only", "batch-broadcast-corners,batch-broadcast")
    torch_part = out.split("conformance of attnspec.reference")[0]
    assert "(1 distinct divergence):" in torch_part, torch_part
    assert "batch-broadcast-corners, batch-broadcast [SDPA-1.2] -> " in torch_part
    assert status == 0
