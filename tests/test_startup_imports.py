"""What each process of a check imports before it has work that needs it (issue 33).

Every ``attnspec check`` starts three interpreters (the command, its judging worker, the
kernel's own process) and the suite runs hundreds of checks, so a module one of them
imports without using it is paid on every run.  These tests pin, by the modules a fresh
process holds (``sys.modules``), never by timing, each import that was made lazy: the gain
stays when someone adds an import back at a module's top, because a test fails.

One subprocess per test, each a few tenths of a second of CPU: a process of this test
session has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (run in ``/``, as
    tests/test_extras.py runs its imports, so nothing of the working directory shadows a
    module)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_listing_the_properties_imports_no_numpy_namespace() -> None:
    """CONF-1: the registry (``attnspec properties``, and the command planning a check)
    lists every property without importing array_api_compat's NumPy namespace, which
    imports numpy.f2py and numpy.testing with it (~70 ms of CPU): only judging needs it,
    in the judging worker."""
    found = modules_after(
        "from attnspec.conformance.judge.registry import all_properties\n"
        "assert len(all_properties()) > 100\n"
        "import attnspec.conformance.cli"
    )
    assert "attnspec.conformance.judge.properties.backward" in found  # all were registered
    assert not {"array_api_compat.numpy", "numpy.f2py", "numpy.testing"} & found


def test_the_kernels_process_imports_what_serves_a_call() -> None:
    """CONF-14: the kernel's own process (conformance/run/kernel_process.py) loads and calls
    the kernel and nothing else: set up for a kernel not built on the reference, it holds
    none of the reference's attention (the declarations read a few of its choices, such as
    CAUSAL_ALIGNMENTS, from its masks and positional modules), no property, no
    Hypothesis: the judge's work happens in the judging worker."""
    found = modules_after(
        "from attnspec.conformance.run.kernel_process import main\n"
        "from attnspec.conformance.run.kernel_setup import KernelSetup\n"
        "def kernel(q, k, v, *, mask=None, is_causal=False, scale=None):\n"
        "    return q\n"
        "setup = KernelSetup(kernel, 'numpy')\n"
        "assert setup.prepare(setup.make_backend()).declaration.family == 'dense'"
    )
    assert "attnspec.conformance.claims.validation" in found  # the declaration was checked
    unneeded = {
        "attnspec.reference.attention",  # the entry point
        "attnspec.reference.blocked",
        "attnspec.reference.backward",
        "attnspec.reference.kv_cache",
        "attnspec.reference.serving",
        "attnspec.reference.sparse",
        "attnspec.conformance.judge.registry",
        "attnspec.conformance.run.property_runner",
        "hypothesis",
    }
    assert not unneeded & found, sorted(unneeded & found)


def test_the_package_imports_the_reference_at_first_use() -> None:
    """``import attnspec`` (and the reference package) imports no module of the reference
    until one of its names is used (the package's structure: no clause, as
    tests/test_extras.py); every name of the facade and of
    ``attnspec.reference.__all__``, and a submodule as an attribute, is still there."""
    found = modules_after(
        "import sys\n"
        "import attnspec, attnspec.reference\n"
        "assert not [m for m in sys.modules if m.startswith('attnspec.reference.')]\n"
        "from attnspec import *\n"
        "from attnspec.reference import *\n"
        "assert attnspec.reference.tolerance.__name__ == 'attnspec.reference.tolerance'\n"
        "assert attnspec.scaled_dot_product_attention is scaled_dot_product_attention\n"
        "assert scaled_dot_product_attention.__module__ == 'attnspec.reference.attention'"
    )
    assert "attnspec.reference.sparse.masks" in found  # every name was imported on demand


def test_the_pytest_plugin_adds_its_options_without_the_suite() -> None:
    """CONF-2's pytest plugin is loaded in every pytest run of an environment where
    attnspec is installed (its ``pytest11`` entry point): without ``--attnspec-kernel`` it
    adds its options (the size caps, the claims, the worker's supervision) and imports no
    array library, no Hypothesis, no judging and no drawing engine (~0.3 s of CPU on
    every user's pytest run before run/shared_flags.py held those flags)."""
    found = modules_after(
        "import pytest\n"
        "from attnspec.conformance import pytest_plugin\n"
        "parser = pytest.Parser()\n"
        "pytest_plugin.pytest_addoption(parser)\n"
        "names = {n for option in parser.getgroup('attnspec').options for n in option.names()}\n"
        "assert {'--attnspec-max-len', '--attnspec-timeout', '--attnspec-causal'} <= names"
    )
    assert "attnspec.conformance.run.shared_flags" in found  # the options were added
    unneeded = {
        "numpy",
        "hypothesis",
        "attnspec.conformance.judge.kernel",
        "attnspec.conformance.run.supervisor",
        "attnspec.conformance.run.property_runner",
        "attnspec.conformance.draw.strategies",
    }
    assert not unneeded & found, sorted(unneeded & found)


def test_the_numpy_backend_leaves_numpys_tool_submodules_unimported() -> None:
    """CONF-14: each judging worker and each kernel's process on NumPy loads
    array_api_compat's NumPy namespace (``Backend('numpy')``) without NumPy's tool
    submodules (numpy.f2py, numpy.testing, numpy.ma, ...: none of them array API), which
    that namespace's copy of NumPy's names imports (0.1 CPU-s of each process's start).
    The namespace holds every other name a plain import of it holds (imported again in
    the same process, for comparison), and NumPy's own lazy attributes are as before."""
    from attnspec.backends._registry import NUMPY_TOOL_SUBMODULES

    tools = sorted(NUMPY_TOOL_SUBMODULES)
    found = modules_after(
        "import sys\n"
        "from attnspec.backends import Backend\n"
        "names = set(dir(Backend('numpy').xp))\n"
        f"tools = {{'numpy.' + name for name in {tools!r}}}\n"
        "assert not tools & set(sys.modules), sorted(tools & set(sys.modules))\n"
        "import numpy\n"
        f"assert set({tools!r}) <= set(numpy.__all__) | set(dir(numpy))\n"
        "for name in [m for m in sys.modules if m.startswith('array_api_compat.numpy')]:\n"
        "    del sys.modules[name]\n"
        "import array_api_compat.numpy as plain\n"
        f"missing = set(dir(plain)) - names\n"
        f"assert missing == set({tools!r}), sorted(missing ^ set(dir(plain)) ^ names)\n"
        "assert numpy.testing.__name__ == 'numpy.testing'"
    )
    assert {"numpy.f2py", "numpy.testing", "numpy.ma"} <= found  # what the plain import costs
