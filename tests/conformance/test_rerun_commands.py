"""Rerun commands repeat what picks the kernel checked (CONF-1): a library setting read
at import, Keras's ``KERAS_BACKEND``, besides the flags (conformance/reproduce.py).

Without it, ``attnspec check keras.ops:dot_product_attention ... --only P`` pasted into a
shell where it is not set checks Keras on another backend (or fails to import Keras).
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from attnspec.conformance.claims.table import CLAIM_FLAGS
from attnspec.conformance.judge.reproduce import pytest_rerun_command, rerun_command

KERAS = "keras.ops:dot_product_attention"


def _plugin_option(dest: str) -> Any:
    return {"attnspec_profile": "quick", "attnspec_seed": 3}.get(dest)


def test_a_keras_rerun_repeats_the_backend_it_ran_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    check = rerun_command(KERAS, ["--dtype", "float32"], "empty-rows-zero", 3)
    assert shlex.split(check) == [
        "KERAS_BACKEND=torch",
        "attnspec",
        "check",
        KERAS,
        "--dtype",
        "float32",
        "--only",
        "empty-rows-zero",
        "--seed",
        "3",
    ]
    plugin = pytest_rerun_command(KERAS, _plugin_option, CLAIM_FLAGS, "attnspec", "gqa-mapping")
    assert plugin.startswith(f"KERAS_BACKEND=torch pytest --attnspec-kernel {KERAS} ")
    assert plugin.endswith("--attnspec-only gqa-mapping")


def test_other_reruns_carry_no_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the library that reads it: a jax kernel's rerun does not carry KERAS_BACKEND,
    and none is made up when it is not set."""
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert rerun_command("jax.nn:dot_product_attention", [], "p", None).startswith("attnspec ")
    monkeypatch.delenv("KERAS_BACKEND")
    assert rerun_command(KERAS, [], "p", None) == f"attnspec check {KERAS} --only p"
