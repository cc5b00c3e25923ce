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
