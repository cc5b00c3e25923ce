"""Reproductions of known library kernels run on their own and show the failure again.

A kernel named by its library name (``jax.nn:dot_product_attention``,
``torch.nn:MultiheadAttention``, FlexAttention, ``keras.ops:dot_product_attention``) is
checked through its declared adapter (``known_kernels.known_adapter``); its reproduction
must load it the same way (``kernel_setup.kernel_function``) and in the environment it was
checked in (``KERAS_BACKEND``), or it calls the library function with the spec's arguments
and fails for another reason.  Each case here is a confirmed divergence of
docs/divergences.md built directly (no search): one process makes every snippet as the
check makes it, then the snippets run in fresh processes, with no ``KERAS_BACKEND`` set,
and must give the failing output again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support import KERNELS

# found, not imported: Keras would pick its backend in this process
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "jax", "keras")),
    reason="the known kernels here are torch, jax and keras ones: one is not installed",
)

# name -> (target, the problem's arrays and options as Python source, the output expected
# where the float64 definition differs; "nan" for a NaN row)
CASES: dict[str, tuple[str, str, list[Any]]] = {
    # docs/divergences.md#jax-masked-nan (SDPA-8.2): the masked key's NaN value leaks
    "jax.nn": (
        "jax.nn:dot_product_attention",
        "q=a([[[[0.5]]]]), k=a([[[[0.5], [1.0]]]]), v=a([[[[nan], [4.0]]]]), "
        "mask=np.array([[[[False, True]]]]), dtype='float32'",
        ["nan"],
    ),
    # docs/divergences.md#mha-empty-rows (SDPA-5.1): a fully masked row gives NaN, not 0
    "MultiheadAttention": (
        "torch.nn:MultiheadAttention",
        "q=a([[[[1.0, 1.0]]]]), k=a([[[[1.0, 1.0]]]]), v=a([[[[1.0, 1.0]]]]), "
        "mask=np.array([[[[False]]]]), dtype='float32'",
        ["nan", "nan"],
    ),
    # docs/divergences.md#flex-masked-nan (SDPA-8.2): a NaN value of key 1, masked out
    "flex_attention": (
        "torch.nn.attention.flex_attention:flex_attention",
        "q=a([[[[0.25, 1.0]]]]), k=a([[[[0.5, -1.0], [0.5, 0.5]]]]), "
        "v=a([[[[1.0, 2.0], [nan, nan]]]]), mask=np.array([[[[True, False]]]]), "
        "dtype='float32'",
        ["nan", "nan"],
    ),
    # docs/divergences.md#keras-empty-rows (SDPA-5.1): a fully masked row gives mean(V) = 3
    "keras on torch": (
        "keras.ops:dot_product_attention",
        "q=a([[[[1.0]]]]), k=a([[[[1.0], [1.0]]]]), v=a([[[[2.0], [4.0]]]]), "
        "mask=np.array([[[[False, False]]]]), dtype='float32'",
        [3.0],
    ),
    # a user's module:FUNC (imported from the working directory): no default scale (SDPA-2.1)
    "module:FUNC": (
        "kernels:no_default_scale",
        "q=a([[[[1.0, 1.0]]]]), k=a([[[[1.0, 1.0], [0.0, 0.0]]]]), "
        "v=a([[[[1.0], [0.0]]]]), dtype='float64'",
        [0.8807970779778823],  # e^2 / (e^2 + 1): scores unscaled; the definition 0.8044
    ),
}

GENERATE = """
import json, sys
import numpy as np
from attnspec.conformance.judge.kernel import Problem
from attnspec.conformance.run.kernel_setup import KernelSetup
from attnspec.conformance.judge.reproduce import snippet

nan = np.nan
a = np.array
snippets = {}
for name, (target, problem) in json.loads(sys.argv[1]).items():
    kernel = KernelSetup(target).prepare()
    snippets[name] = snippet(eval(f"Problem({problem})"), kernel, "known divergence")
print(json.dumps(snippets))
"""

# appended to each snippet: the output it computed, rows flattened, NaN as "nan"
SHOW = textwrap.dedent("""
    got = kernel.numpy(out).reshape(-1).tolist()
    print("OUTPUT", [("nan" if x != x else x) for x in got])
""")


@pytest.fixture(scope="module")
def reproductions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every case's snippet, made by the setup a check uses (Keras imported on torch)."""
    where = tmp_path_factory.mktemp("known")
    (where / "kernels.py").write_text(KERNELS, encoding="utf-8")
    cases = {name: [target, problem] for name, (target, problem, _) in CASES.items()}
    made = subprocess.run(
        [sys.executable, "-c", GENERATE, json.dumps(cases)],
        capture_output=True,
        text=True,
        cwd=where,
        timeout=300,
        env={**os.environ, "KERAS_BACKEND": "torch"},
    )
    assert made.returncode == 0, made.stderr
    return {**json.loads(made.stdout.splitlines()[-1]), "cwd": str(where)}


# runs the snippets given (name -> code), each in globals of its own, printing its name first
RUN_EACH = """
import json, sys
for name, code in json.loads(sys.argv[1]).items():
    print("CASE", name, flush=True)
    exec(code, {"__name__": "__main__"})
"""


@pytest.fixture(scope="module")
def outputs(reproductions: dict[str, str]) -> dict[str, str]:
    """Each snippet's OUTPUT line, or what it raised: Keras's in a fresh process, the
    others in another (one after the other, each in fresh globals: cheaper than a process
    each), KERAS_BACKEND unset in both."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    batches = [[name for name in CASES if name != "keras on torch"], ["keras on torch"]]
    running = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RUN_EACH,
                json.dumps({name: reproductions[name] + SHOW for name in batch}),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(reproductions["cwd"]),
            env=env,
        )
        for batch in batches
    ]
    shown: dict[str, str] = {}
    for process in running:
        stdout, stderr = process.communicate(timeout=300)
        name = ""
        for line in stdout.splitlines():
            if line.startswith("CASE "):
                name = line.removeprefix("CASE ")
                shown[name] = f"no OUTPUT line; the process ended with {stderr[-3000:]}"
            elif line.startswith("OUTPUT "):
                shown[name] = line
    return shown


@pytest.mark.parametrize("name", list(CASES))
def test_reproduction_of_a_known_kernel_runs_and_fails_again(
    name: str, reproductions: dict[str, str], outputs: dict[str, str]
) -> None:
    """CONF-1 (each failure comes with a reproduction): the snippet loads the kernel
    through kernel_function, as the check did (the adapter of a known kernel, Keras's
    backend), and its output is the divergent one again (SDPA-8.2, SDPA-5.1, SDPA-2.1)."""
    target, _, expected = CASES[name]
    snippet = reproductions[name]
    assert f"fn = kernel_function({target!r})" in snippet, snippet
    shown = outputs.get(name, "not run: an earlier snippet in its process ended it")
    assert shown.startswith("OUTPUT "), f"{name}: {shown}\n{snippet[-1500:]}"
    got = json.loads(shown.removeprefix("OUTPUT ").replace("'", '"'))
    assert len(got) == len(expected), shown
    for value, wanted in zip(got, expected, strict=True):
        if wanted == "nan":
            assert value == "nan", shown
        else:
            assert value != "nan" and abs(value - wanted) <= 1e-6 * abs(wanted), shown


def test_keras_reproduction_pins_the_backend_it_was_checked_on(
    reproductions: dict[str, str],
) -> None:
    """Keras picks its backend at import from KERAS_BACKEND: the reproduction of a check
    made on torch sets it before loading (it ran above with none set, on torch)."""
    snippet = reproductions["keras on torch"]
    assert "os.environ.update({'KERAS_BACKEND': 'torch'})" in snippet
    assert snippet.index("KERAS_BACKEND") < snippet.index("fn = kernel_function(")
    assert "KERAS_BACKEND" not in reproductions["jax.nn"]
