"""The kernels the tests of the ``attnspec`` command check: a file in ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import KERNELS, kernel_file


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    return kernel_file(tmp_path, "kernels.py", KERNELS)
