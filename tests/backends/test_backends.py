"""Backend selection, conversions, dtypes and devices (SDPA-1.3, SDPA-1.4, TOL-1).

These are the plumbing the conformance suite stands on: the values a kernel receives
must be exactly the values the oracle is given (TOL-1), every dtype of SDPA-1.4 must
really be that dtype, and an unusable backend must say why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from typing import Any

import array_api_compat
import numpy as np
import pytest
import support

from attnspec import (
    Backend,
    BackendError,
    available_backends,
    get_backend,
    set_backend,
    use_backend,
)
from attnspec.backends import BACKEND_NAMES, REFERENCE_CONFIG
from attnspec.backends import _configure_from_environment as configure_from_environment
from attnspec.benchmarks.survey import SurveyRow, format_survey, survey
from attnspec.reference import causal_mask, padding_mask, scaled_dot_product_attention
from attnspec.reference.positional import sinusoidal_positional_encoding

EXPECTED_DTYPES = {
    "numpy": ("float16", "float32", "float64"),
    "array_api_strict": ("float32", "float64"),
    "torch": ("float16", "bfloat16", "float32", "float64"),
    "jax": ("float16", "bfloat16", "float32", "float64"),
    "cupy": ("float16", "float32", "float64"),
}
# Exactly representable in float16, bfloat16, float32 and float64 alike.
EXACT = np.array([[0.0, -0.0, 1.0, -2.5], [0.375, 1024.0, 2.0**-10, -96.0]])


def run_python(code: str, cwd: Any, **environment: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a fresh process with only the given ATTNSPEC_* variables."""
    inherited = [name for name in os.environ if name.startswith("ATTNSPEC_")]
    return support.run_python(code, cwd=cwd, env=environment, unset=inherited, timeout=300)


def test_env_backend_selects_torch_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTNSPEC_BACKEND=torch makes torch the default backend when attnspec is imported.

    What the import runs (backends._configure_from_environment) is run here, with the
    variable set and the selection put back after; that ``import attnspec`` runs it is
    test_env_backend_typo_is_one_clear_error's fresh process (a typo fails the import).
    Why not a fresh process here too: it imported torch for this alone (3.7 CPU-s)."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    monkeypatch.setenv("ATTNSPEC_BACKEND", "torch")
    monkeypatch.delenv("ATTNSPEC_DEVICE", raising=False)
    with use_backend("numpy"):  # restores the selection, whatever this test leaves
        configure_from_environment()
        assert get_backend().name == "torch"


def test_env_device_cpu(tmp_path: Any) -> None:
    """ATTNSPEC_DEVICE=cpu alone selects the default library (NumPy) on the CPU."""
    result = run_python(
        "import attnspec; b = attnspec.get_backend(); print(b.name, b.device)",
        tmp_path,
        ATTNSPEC_DEVICE="cpu",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["numpy", "cpu"]


def test_env_backend_typo_is_one_clear_error(tmp_path: Any) -> None:
    """A typo in ATTNSPEC_BACKEND fails the import with one ValueError that names the
    variable, the bad value and every valid name (no chained tracebacks)."""
    result = run_python("import attnspec", tmp_path, ATTNSPEC_BACKEND="torhc")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: ATTNSPEC_BACKEND='torhc'"), result.stderr
    assert all(name in last for name in BACKEND_NAMES), last
    assert "During handling" not in result.stderr and result.stderr.count("Traceback") == 1


def test_unknown_name_in_code() -> None:
    """set_backend with an unknown name raises ValueError listing the valid names and
    leaves the selection as it was."""
    before = get_backend()
    with pytest.raises(ValueError) as raised:
        set_backend("nmupy")
    assert "'nmupy'" in str(raised.value)
    assert all(name in str(raised.value) for name in BACKEND_NAMES)
    assert get_backend() is before


def test_set_backend() -> None:
    """set_backend changes what get_backend returns (restored by the outer use_backend)."""
    with use_backend("numpy"):
        chosen = set_backend("array_api_strict", "cpu")
        assert get_backend() is chosen and chosen.name == "array_api_strict"
        assert chosen.device == chosen.xp.__array_namespace_info__().default_device()
        assert set_backend("np").name == "numpy"  # aliases are accepted


def test_use_backend_restores_on_exit_and_on_exception() -> None:
    """use_backend selects inside the block and restores the previous choice after it,
    whether the block ends normally or by an exception; blocks nest."""
    before = get_backend()
    with use_backend("array_api_strict") as strict:
        assert get_backend() is strict
        with use_backend("numpy") as inner:
            assert get_backend() is inner
        assert get_backend() is strict
    assert get_backend() is before
    with pytest.raises(KeyError, match="raised inside"):
        with use_backend("array_api_strict"):
            raise KeyError("raised inside")
    assert get_backend() is before


def test_device_strings() -> None:
    """Device names are parsed per library; a GPU name for a CPU-only library is an error."""
    assert str(Backend("numpy", "cpu").device) == "cpu"
    with pytest.raises(ValueError, match="'cuda' is not one"):
        Backend("numpy", "cuda")
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    assert Backend("torch", "cpu").device == torch.device("cpu")


def bfloat16_rounded(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 round-to-nearest-even, done on the bits (finite values)."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def test_round_trip(backend: Backend) -> None:
    """TOL-1: asarray/to_numpy move values exactly: representable values unchanged,
    others rounded to nearest in the target dtype; shapes (also empty and strided)
    and specials (inf, NaN) survive; the array has the dtype that was asked for."""
    random = np.random.default_rng(0).standard_normal((3, 5))
    specials = np.array([np.inf, -np.inf, np.nan])
    for dtype in backend.dtype_names:
        array = backend.asarray(EXACT, dtype=dtype)
        assert array.dtype == backend.dtype(dtype), dtype
        back = backend.to_numpy(array)
        assert back.dtype == np.dtype("float32" if dtype == "bfloat16" else dtype), dtype
        assert np.array_equal(back, EXACT) and np.array_equal(np.signbit(back), np.signbit(EXACT))
        expected = bfloat16_rounded(random) if dtype == "bfloat16" else random.astype(dtype)
        assert np.array_equal(backend.to_numpy(backend.asarray(random, dtype=dtype)), expected)
        strided = random[:, ::2]
        assert np.array_equal(
            backend.to_numpy(backend.asarray(strided, dtype=dtype)),
            bfloat16_rounded(strided) if dtype == "bfloat16" else strided.astype(dtype),
        )
        assert backend.to_numpy(backend.asarray(np.zeros((0, 3)), dtype=dtype)).shape == (0, 3)
        assert np.array_equal(
            backend.to_numpy(backend.asarray(specials, dtype=dtype)), specials, equal_nan=True
        )
    mask = np.array([[True, False], [False, True]])
    assert np.array_equal(backend.to_numpy(backend.asarray(mask)), mask)


def test_asarray_gives_a_fresh_array(backend: Backend) -> None:
    """SDPA-1.6: the array asarray gives the kernel is its own: writing into the NumPy
    array it came from afterwards changes nothing in it, for every dtype, from a transposed
    (non-contiguous) source too; on PyTorch it is C-contiguous, as a copy of it always was
    (the copy is made once: issue 33)."""
    for dtype in backend.dtype_names:
        source = np.random.default_rng(1).standard_normal((4, 3)).T
        expected = bfloat16_rounded(source) if dtype == "bfloat16" else source.astype(dtype)
        array = backend.asarray(source, dtype=dtype)
        source[...] = 0.0
        assert np.array_equal(backend.to_numpy(array), expected), dtype
        if backend.name == "torch":
            assert array.is_contiguous(), dtype


def test_rounding_on_the_host_is_the_round_trips(backend: Backend) -> None:
    """TOL-1: where asarray rounds on the host (a dtype NumPy knows: NumPy's, JAX's,
    CuPy's), rounded_on_host gives exactly the values a round trip through the device
    gives (specials, subnormals and overflow included), as float64; elsewhere None."""
    values = np.random.default_rng(1).standard_normal(64) * np.logspace(-320, 300, 64)
    values = np.concatenate([values, EXACT.ravel(), [np.inf, -np.inf, np.nan, 1e-40, 7e4]])
    for dtype in backend.dtype_names:
        with np.errstate(over="ignore"):  # 1e300 overflows every dtype but float64
            on_host = backend.rounded_on_host(values, dtype)
            trip = backend.to_numpy(backend.asarray(values, dtype)).astype(np.float64)
        if backend.name in ("numpy", "jax", "cupy"):
            assert on_host is not None and on_host.dtype == np.float64, dtype
            assert np.array_equal(on_host, trip, equal_nan=True), dtype
        else:
            assert on_host is None, dtype


def test_dtype_names(backend: Backend) -> None:
    """SDPA-1.4: each backend lists the spec dtypes its library has; others are refused."""
    assert backend.dtype_names == EXPECTED_DTYPES[backend.name]
    for name in ("float16", "bfloat16", "float32", "float64"):
        if name not in backend.dtype_names:
            with pytest.raises(ValueError, match=f"does not support dtype '{name}'"):
                backend.dtype(name)
    with pytest.raises(ValueError, match="dtype='float8'"):
        backend.dtype("float8")


def test_jax_backend_changes_no_setting_unless_asked() -> None:
    """SDPA-1.4: loading the JAX backend leaves JAX's settings alone (x64 off by default,
    so float64 is not offered and asking for it says why); config= turns x64 on and says
    what it changed.

    JAX's settings are process-wide: this process's are set to JAX's defaults for the
    test (x64 off, the default matmul precision) and put back after, whatever it asserts.
    Why not a fresh process: it imported JAX for this alone (2.4 CPU-s)."""
    jax = pytest.importorskip("jax", reason="the jax extra is not installed")
    defaults = {"jax_enable_x64": False, "jax_default_matmul_precision": None}
    saved = {name: getattr(jax.config, name) for name in defaults}
    try:
        for name, value in defaults.items():
            jax.config.update(name, value)
        b = Backend("jax")
        assert {name: getattr(jax.config, name) for name in defaults} == defaults
        assert b.dtype_names == ("float16", "bfloat16", "float32") and b.changes == []
        with pytest.raises(ValueError) as raised:
            b.dtype("float64")
        assert "does not support dtype 'float64': jax_enable_x64 is off" in str(raised.value)
        assert "--jax-x64" in str(raised.value)
        b = Backend("jax", config={"jax_enable_x64": True})
        assert jax.config.jax_enable_x64 and b.dtype_names[-1] == "float64"
        assert b.changes == ["jax_enable_x64: False -> True"]
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


def test_jax_float64_is_float64() -> None:
    """SDPA-1.4: JAX demotes float64 to float32 unless x64 is on; in the reference's
    settings (REFERENCE_CONFIG) float64 arrays hold float64 values and the reference
    returns float64."""
    try:
        backend = Backend("jax", config=REFERENCE_CONFIG["jax"])
    except BackendError as exc:
        pytest.skip(f"backend 'jax' unusable on this machine: {exc}")
    import jax

    assert jax.config.jax_enable_x64
    tiny = 2.0**-40  # lost in float32, kept in float64
    x = backend.asarray(np.array([1.0 + tiny]), dtype="float64")
    assert str(x.dtype) == "float64"
    assert backend.to_numpy(x - 1.0)[0] == tiny
    q = backend.asarray(np.ones((1, 1, 1)), dtype="float64")
    assert str(scaled_dot_product_attention(q, q, q).dtype) == "float64"


def test_jax_float32_matmul_is_float32() -> None:
    """SDPA-7.2: float32 accumulates in float32, so the reference's JAX settings turn off
    the TF32 default JAX uses for float32 matmuls on recent GPUs (a no-op on CPU)."""
    try:
        Backend("jax", config=REFERENCE_CONFIG["jax"])
    except BackendError as exc:
        pytest.skip(f"backend 'jax' unusable on this machine: {exc}")
    import jax

    assert jax.config.jax_default_matmul_precision == "highest"


def test_cupy_without_gpu_has_a_reason() -> None:
    """Without CuPy or a CUDA device, asking for CuPy raises BackendError saying which
    of the two is missing and how to install it."""
    try:
        backend = Backend("cupy")
    except BackendError as exc:
        message = str(exc)
        assert "cupy" in message
        assert "pip install 'attnspec[cupy]'" in message or "CUDA device" in message
    else:
        pytest.skip(f"CuPy works here (device {backend.device}): the GPU path is tested")
    assert available_backends()["cupy"] == message


def fake_cupy(get_device_count: Any) -> types.ModuleType:
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=get_device_count)
    )
    return module


def test_cupy_without_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy installed but no usable CUDA device (driver missing, or zero devices) gives
    BackendError with that reason, on any machine (CuPy is replaced by a stand-in)."""

    def no_driver() -> int:
        raise RuntimeError("cudaErrorInsufficientDriver")

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(no_driver))
    with pytest.raises(BackendError, match=r"needs a CUDA device, but none is usable \(cudaErr"):
        Backend("cupy")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(lambda: 0))
    with pytest.raises(BackendError, match="needs a CUDA device, but none is present"):
        Backend("cupy")


def test_available_backends() -> None:
    """Every backend is listed, "ok" or with a non-empty reason; NumPy is always ok."""
    status = available_backends()
    assert set(status) == set(BACKEND_NAMES)
    assert status["numpy"] == "ok"
    assert all(reason for reason in status.values())


def assert_created_by(array: Any, backend: Backend) -> None:
    assert array_api_compat.array_namespace(array) is backend.xp
    assert array_api_compat.device(array) == backend.device


def test_builders_follow_the_selected_backend(cpu_backend: Backend) -> None:
    """SDPA-4.1, POS-1: without xp=/device=, builders create arrays with the selected
    backend on its device (the default floating dtype for the encoding)."""
    with use_backend(cpu_backend.name, cpu_backend.device):
        mask = causal_mask(3, 4, "bottom_right")
        encoding = sinusoidal_positional_encoding(4, 6)
        padding = padding_mask([1, 3], 4)
    for array in (mask, encoding, padding):
        assert_created_by(array, cpu_backend)
    info = cpu_backend.xp.__array_namespace_info__()
    assert encoding.dtype == info.default_dtypes(device=cpu_backend.device)["real floating"]


def test_builders_honour_xp_and_device(cpu_backend: Backend) -> None:
    """SDPA-4.1, POS-1: xp=/device= win over the selected backend."""
    other = "array_api_strict" if cpu_backend.name != "array_api_strict" else "numpy"
    xp, device = cpu_backend.xp, cpu_backend.device
    with use_backend(other):
        arrays = [
            causal_mask(3, 4, xp=xp, device=device),
            sinusoidal_positional_encoding(4, 6, dtype="float32", xp=xp, device=device),
            padding_mask([1, 3], 4, xp=xp, device=device),
        ]
    for array in arrays:
        assert_created_by(array, cpu_backend)
    assert arrays[1].dtype == xp.float32


def test_survey() -> None:
    """SDPA-7.3, TOL-2 (the `attnspec backends` table): one row per usable backend and
    dtype, each within the TOL-2 bound of the float64 definition; one row with the
    reason for each unusable backend."""
    rows = survey(seed=0)
    status = available_backends()
    for name, reason in status.items():
        mine = [row for row in rows if row.backend == name]
        if reason != "ok":
            assert [row.reason for row in mine] == [reason]
            continue
        assert (
            tuple(row.dtype for row in mine)
            == Backend(name, config=REFERENCE_CONFIG.get(name)).dtype_names
        )
        for row in mine:
            assert row.reason is None and row.within_bound, row
            assert 0 <= row.max_abs_error < np.inf
    text = format_survey(rows)
    assert all(name in text for name in BACKEND_NAMES)
    assert "OUTSIDE" not in text


def test_format_survey_flags_rows_outside_the_bound() -> None:
    """TOL-2: a row whose error exceeds the bound is printed as outside it."""
    rows = [
        SurveyRow("numpy", "cpu", "float32", 1e-6, 0.5),
        SurveyRow("torch", "cpu", "bfloat16", 3e-2, 2.0),
        SurveyRow("cupy", "", None, None, None, reason="no CUDA device"),
    ]
    lines = format_survey(rows).splitlines()
    assert lines[2].endswith("within TOL-2") and lines[3].endswith("OUTSIDE TOL-2")
    assert lines[-1] == "cupy: not usable here: no CUDA device"
