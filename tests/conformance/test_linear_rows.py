"""The matrix rows of flash-linear-attention's and transformers' recurrences (spec/recurrent.md;
adapters.flash_linear, adapters.transformers_linear) are the libraries' own functions declared
by ``attnspec check`` flags (REC-1.1's declared layout, CONF-3): the flags each row's note
shows parse to exactly the row's declaration, and the device run checks fla's Triton rows.
None of it imports fla or transformers (CI has neither).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from support import ROOT

from attnspec.conformance import cli
from attnspec.conformance.claims import table
from attnspec.conformance.kernels.adapters import flash_linear, transformers_linear
from attnspec.conformance.kernels.known import KNOWN_KERNELS, known_kernel

ROWS = {**flash_linear.ROWS, **transformers_linear.ROWS}


def _device_run() -> object:
    spec = importlib.util.spec_from_file_location("device_run", ROOT / "scripts/device_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_run"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_row_is_its_flags(name: str) -> None:
    """REC-1.1, REC-2.2, REC-6.2: ``attnspec check TARGET FLAGS`` declares what the row
    checks (the rule, gate, chunk sizes, layout, renames, dtypes, output_final_state=True),
    and the matrix row's note shows those flags."""
    row = ROWS[name]
    args = cli.build_parser().parse_args(["check", row.target, *row.flags()])
    claims = table.claims_from(lambda dest: getattr(args, dest))
    setup = table.setup_from(lambda dest: getattr(args, dest))
    assert claims["recurrent"] == row.claim
    assert claims["extra_kwargs"] == dict.fromkeys(row.switches(), True)
    assert "output_final_state" in row.switches()
    assert setup["layout"] == row.layout and setup["rename"] == dict(row.rename)
    assert setup["dtypes"] == flash_linear.FLA_DTYPES
    module = "flash_linear" if name in flash_linear.ROWS else "transformers_linear"
    entry = known_kernel(f"attnspec.conformance.kernels.adapters.{module}:{name}")
    assert entry is not None and " ".join(row.flags()) in entry.note
    assert entry.device == row.device and entry.backend == "torch"


def test_rows_are_read_by_name_and_only_theirs() -> None:
    """A row is built when read (importing fla imports Triton); another name is an
    AttributeError, as for any module."""
    with pytest.raises(AttributeError, match="no attribute 'naive_nothing'"):
        flash_linear.naive_nothing  # noqa: B018
    assert set(transformers_linear.ROWS) == {
        f"{model}_{form}" for model in ("qwen3_next", "qwen3_5") for form in ("chunk", "recurrent")
    }


def test_the_device_run_checks_the_triton_rows() -> None:
    """Issue 35: fla's Triton kernels are CUDA rows of the device run's matrix, with the
    fla-core and einops wheels carried (the image has torch and Triton)."""
    device_run = _device_run()
    steps = {kernel for kernel, _ in device_run.MATRIX_KERNELS.values()}  # type: ignore[attr-defined]
    triton_rows = [e for e in KNOWN_KERNELS if e.name.startswith("fla.") and e.device == "cuda"]
    assert sorted(e.name for e in triton_rows) == sorted(
        "fla.ops.gated_delta_rule:" + f
        for f in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
    )
    assert {e.name for e in triton_rows} <= steps
    pins = (ROOT / "scripts/device-wheels.txt").read_text().split()
    assert {"fla-core==0.6.0", "einops==0.8.2"} <= set(pins)
