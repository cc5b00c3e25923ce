"""scripts/gpu-check's matrix step (CONF-1, CONF-3): the CUDA rows of the known kernels through
``attnspec matrix``.  It cannot run on a GPU here; ``--matrix-only`` on a machine without
one must report each CUDA row as needing a GPU (or not installed), write the matrix files,
and pass.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from support import ROOT

from attnspec.conformance import matrix
from attnspec.conformance.kernels.known import KNOWN_KERNELS

SCRIPT = ROOT / "scripts" / "gpu-check"


@pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "attnspec").exists(),
    reason="scripts/gpu-check runs the checkout's .venv/bin/attnspec, absent here",
)
def test_matrix_step_reports_cuda_rows_without_a_gpu(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the step would check the rows (minutes)")
    done = subprocess.run(
        ["bash", str(SCRIPT), "--matrix-only"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # the matrix is told what this test found above, that torch sees no GPU (as a matrix
        # tells its --jobs processes), instead of importing torch to find it out again
        # (~1.5 CPU-s); the step still asks torch itself whether CUDA is there, and
        # has_cuda_here's own reading of torch is test_matrix.py's
        env={
            **os.environ,
            "GPU_CHECK_MATRIX_OUT": str(tmp_path),
            matrix.HAS_CUDA_VARIABLE: "0",
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cuda = [e for e in KNOWN_KERNELS if e.device == "cuda"]
    rows = {r["name"]: r for r in json.loads((tmp_path / "matrix.json").read_text())}
    for entry in cuda:
        assert rows[entry.name]["status"] in (matrix.NEEDS_GPU, matrix.NOT_INSTALLED), entry
        assert f"  {entry.name}: " in done.stdout
    assert (
        f"matrix    CUDA rows: 0 checked, "
        f"{sum(rows[e.name]['status'] == matrix.NEEDS_GPU for e in cuda)} need a GPU" in done.stdout
    )
    # the CPU rows of docs/matrix.json are merged in, not re-run
    assert any(r["status"] == matrix.CHECKED for r in rows.values())


def test_gpu_check_refuses_an_unknown_option() -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2 and "usage: scripts/gpu-check [--matrix-only]" in done.stderr
