"""The seed record of the correct backward and serving formulations (issues 31 and 32):
docs/figures/correct-seeds.json, made by scripts/measure-correct-seeds, names every correct
kernel of each catalogue family (the backward ones in float32 and in float16/bfloat16),
and no run of one gave a status other than "passed" or "not applicable" (CONF-1: a
correct kernel passes every property, on every seed).  The runs themselves are minutes
each; they are in the script, not here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from catalogue import chunked, fp8, merge, mla, paged_batch, sinks
from catalogue.correct_features import FEATURE_KERNELS

RECORD = Path(__file__).resolve().parents[2] / "docs/figures/correct-seeds.json"
ACCEPTED = {"passed", "not applicable"}


def _record() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORD.read_text())
    return data


def _correct_kernels() -> dict[str, set[str]]:
    """Each family's correct kernels as the catalogue lists them, ``module:function``."""

    def named(module: str, functions: Any) -> set[str]:
        return {f"catalogue.{module}:{fn.__name__}" for fn in functions}

    varlen = [fn for name, fn in FEATURE_KERNELS if name.startswith("varlen-")]
    cache = [fn for name, fn in FEATURE_KERNELS if name.startswith("kv-cache-")]
    return {
        "sinks": named("sinks", (*sinks.CORRECT, *sinks.TOKEN_CORRECT)),
        "mla": named("mla", mla.CORRECT),
        "merge": named("merge", merge.CORRECT),
        "paged": named("paged_batch", paged_batch.CORRECT),
        "fp8": named("fp8", fp8.CORRECT),
        "fp8-serving": named("fp8", fp8.SERVING_CORRECT),
        "chunk": named("chunked", chunked.CORRECT),
        "varlen": named("packed_kernels", varlen),
        "kv-cache": named("packed_kernels", cache),
    }


def test_record_names_every_correct_serving_kernel() -> None:
    """SINK-1, MLA-1, MERGE-3, PAGED-2, QUANT-4, QUANT-7, QUANT-8, CHUNK-1, VARLEN-1,
    KVCACHE-2: each serving family of the record lists exactly the catalogue's correct
    kernels of that family."""
    families = _record()["families"]
    for family, kernels in _correct_kernels().items():
        assert set(families[family]["kernels"]) == kernels, family


def test_record_names_every_correct_backward_kernel() -> None:
    """BWD-1, BWD-11, BWD-17: the backward family lists every correct backward formulation
    of the catalogue (CORRECT_KERNELS, and the packed kernel that zeroes its padding
    rows)."""
    pytest.importorskip("torch", reason="the backward catalogue is PyTorch's autograd")
    from catalogue import backward_kernels

    kernels = {*backward_kernels.CORRECT_KERNELS.values(), "packed_zeroed_tail"}
    expected = {f"catalogue.backward_kernels:{name}" for name in kernels}
    for name in expected:  # each names a kernel of the catalogue
        assert callable(getattr(backward_kernels, name.split(":")[1]))
    assert set(_record()["families"]["backward"]["kernels"]) == expected


def test_record_names_every_correct_half_precision_backward_kernel() -> None:
    """BWD-13, BWD-17, BWD-18: the half-precision backward family lists every correct
    formulation of the catalogue checked in float16 and bfloat16 (HALF_CORRECT), each by
    the module-level name it loads by."""
    pytest.importorskip("torch", reason="the half-precision catalogue is PyTorch's autograd")
    from catalogue import half_backward

    expected = set()
    for kernel in half_backward.HALF_CORRECT.values():
        assert getattr(half_backward, kernel.__name__) is kernel, kernel.__name__
        expected.add(f"catalogue.half_backward:{kernel.__name__}")
    assert set(_record()["families"]["backward-half"]["kernels"]) == expected


def test_every_recorded_run_of_a_correct_kernel_passed() -> None:
    """CONF-1: every run recorded gave "passed" or "not applicable" for every property of
    the family (of the profile's ``properties`` where it was run with ``--only``),
    ``not_passed`` is empty, and each profile says which of its seeds it did
    not run; every kernel ran on at least one seed of the quick profile."""
    for family, entry in _record()["families"].items():
        names = {k.split(":")[1] for k in entry["kernels"]}
        assert entry["profiles"]["quick"]["kernels"].keys() == names, family
        for profile, result in entry["profiles"].items():
            for name, kernel in result["kernels"].items():
                where = (family, profile, name)
                seeds = [run["seed"] for run in kernel["runs"]]
                assert profile != "quick" or seeds, where
                assert kernel["seeds_run"] == len(seeds), where
                missing = [s for s in range(result["seeds_asked"]) if s not in seeds]
                assert kernel["seeds_not_run"] == missing, where
                assert kernel["not_passed"] == [], where
                covered = result.get("properties", entry["properties"])  # --only's
                for run in kernel["runs"]:
                    assert set(run["statuses"]) == set(covered), where
                    assert set(run["statuses"].values()) <= ACCEPTED, (*where, run["seed"])
                    assert "passed" in run["statuses"].values(), (*where, run["seed"])
