"""One thin delegation layer per array library.

Each adapter knows three things about its library and nothing else: how to load it
(with an install hint when it is missing), how to move a NumPy array onto one of its
devices and back, and which floating dtypes it supports.  Everything library-specific
in attnspec lives in this module; reference/ never imports a library.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
# the stored dtypes of float8 kernels (spec/serving.md, QUANT-1): inputs only, never drawn as
# a problem's dtype; NumPy has none, so they cross between processes as their bits (uint8)
FLOAT8_DTYPE_NAMES = ("float8_e4m3fn", "float8_e5m2")
# vjp(fn, primals, cotangents) -> (fn's results, one gradient per primal)
VectorJacobianProduct = Callable[
    [Callable[..., Any], tuple[Any, ...], tuple[Any, ...]],
    tuple[tuple[Any, ...], tuple[Any, ...]],
]


class BackendError(RuntimeError):
    """A backend was asked for that cannot be used on this machine."""


@dataclass(frozen=True)
class Adapter:
    name: str
    module: str
    load: Callable[[], ModuleType]
    default_device: Callable[[ModuleType], Any]
    from_numpy: Callable[[ModuleType, Any, Any], Any]
    to_numpy: Callable[[Any], Any]
    dtype_names: Callable[[ModuleType, Any], tuple[str, ...]]
    parse_device: Callable[[ModuleType, str], Any]
    # is this an array of this library (what its kernels must return, SDPA-1.3)?
    is_array: Callable[[Any], bool]
    # library-wide settings: set some (returning what changed), describe the current ones,
    # and say why a spec dtype is missing
    configure: Callable[[ModuleType, Mapping[str, Any]], list[str]] = lambda xp, config: (
        _no_options(xp, config)
    )
    describe: Callable[[ModuleType], str] = lambda xp: ""
    missing_dtype: Callable[[ModuleType, str], str] = lambda xp, name: ""
    # does the library compile a function anew for each new combination of input shapes
    # (JAX's XLA)?  The conformance suite then draws shapes from a small pool per run.
    compiles_per_shape: bool = False
    # can an array of this library be a view with a memory layout of its own (non-contiguous,
    # transposed, stride-0 broadcast), as NumPy's, PyTorch's and CuPy's can?  A jax.Array
    # has none: every view is a copy (SDPA-1.7 then constrains nothing).
    has_strides: bool = True
    # is this device the host's CPU (not an accelerator that worker processes would share)?
    on_cpu: Callable[[Any], bool] = lambda device: True
    # the library's automatic differentiation (spec/backward.md, BWD-1): ``vjp(fn, primals,
    # cotangents)`` -> (fn's results, the gradient of each primal); None where it has none
    vjp: VectorJacobianProduct | None = None
    # float8 arrays (QUANT-1): the float8 dtype names the library has, an array's stored bits
    # as a NumPy uint8 array, and an array of a float8 dtype rebuilt from its bits on a device
    float8_names: Callable[[ModuleType], tuple[str, ...]] = lambda xp: ()
    float8_bits: Callable[[Any], Any] | None = None
    from_float8_bits: Callable[[ModuleType, Any, str, Any], Any] | None = None
    # from_numpy for a fresh NumPy array no one else holds: the library may keep its memory
    # instead of copying it (None: from_numpy, which copies)
    from_fresh_numpy: Callable[[ModuleType, Any, Any], Any] | None = None


def _torch_vjp(
    fn: Callable[..., Any], primals: tuple[Any, ...], cotangents: tuple[Any, ...]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """torch.autograd's vector-Jacobian product of ``fn`` at ``primals`` (fresh leaves that
    require grad, so the caller's tensors are untouched); a primal ``fn`` does not use gets
    a zero gradient, as its VJP is."""
    import torch

    leaves = tuple(p.detach().clone().requires_grad_(True) for p in primals)
    results = fn(*leaves)
    outputs = results if isinstance(results, tuple) else (results,)
    if len(outputs) != len(cotangents):
        raise ValueError(
            f"fn returned {len(outputs)} results, but {len(cotangents)} cotangents were given"
        )
    grads = torch.autograd.grad(
        outputs, leaves, grad_outputs=cotangents, allow_unused=True, materialize_grads=True
    )
    return tuple(o.detach() for o in outputs), tuple(grads)


def _jax_vjp(
    fn: Callable[..., Any], primals: tuple[Any, ...], cotangents: tuple[Any, ...]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """jax.vjp of ``fn`` at ``primals``, pulled back along ``cotangents``."""
    import jax

    def as_tuple(*args: Any) -> tuple[Any, ...]:
        results = fn(*args)
        return results if isinstance(results, tuple) else (results,)

    outputs, pullback = jax.vjp(as_tuple, *primals)
    if len(outputs) != len(cotangents):
        raise ValueError(
            f"fn returned {len(outputs)} results, but {len(cotangents)} cotangents were given"
        )
    return tuple(outputs), tuple(pullback(tuple(cotangents)))


def _no_options(xp: ModuleType, config: Mapping[str, Any]) -> list[str]:
    if config:
        raise ValueError(
            f"config={dict(config)!r}, but {xp.__name__} has no settings attnspec "
            "can change; only the jax backend takes config"
        )
    return []


def _import_or_explain(module: str, hint: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendError(
            f"backend needs {module!r}, which is not importable here ({exc}); {hint}"
        ) from None


# --- numpy -----------------------------------------------------------------------------


# NumPy's tool and legacy submodules: outside the array API standard, imported by NumPy at
# their first attribute access (numpy.__getattr__), and so by array_api_compat.numpy, which
# copies every name NumPy has (``from numpy import *`` and each name of ``dir(numpy)``).
NUMPY_TOOL_SUBMODULES = frozenset(
    {"f2py", "testing", "ctypeslib", "ma", "polynomial", "rec", "char", "strings"}
)


def numpy_namespace() -> ModuleType:
    """array_api_compat's NumPy namespace, without NumPy's tool submodules
    (:data:`NUMPY_TOOL_SUBMODULES`, none of them array API) that its copy of NumPy's names
    would import: f2py, testing, ma and the others took 0.1 CPU-s of the 0.25 that
    importing the namespace cost, in every process that judges or runs a kernel on NumPy
    (each check starts two, issue 33).  While it is imported, NumPy's lazy attributes of
    those names not imported yet are hidden from it (``__all__``, ``__dir__`` and
    ``__getattr__`` filtered), then restored: NumPy itself is unchanged, and
    ``numpy.testing`` and the others import as before where used.  Already imported
    (in this process, by anything), the namespace is returned as it is."""
    import sys

    loaded = sys.modules.get("array_api_compat.numpy")
    if loaded is not None:
        return loaded
    np = _import_or_explain("numpy", "install it with: pip install numpy")
    hidden = NUMPY_TOOL_SUBMODULES - vars(np).keys()
    attributes = vars(np)
    filtered = ("__all__", "__dir__", "__getattr__")
    if not hidden or not all(name in attributes for name in filtered):
        import array_api_compat.numpy as plain  # a NumPy without lazy submodules

        return plain
    saved = {name: attributes[name] for name in filtered}
    lazy, listed = saved["__getattr__"], saved["__dir__"]

    def visible_attribute(name: str) -> Any:
        if name in hidden:
            raise AttributeError(f"module 'numpy' has no attribute {name!r}")
        return lazy(name)

    attributes["__all__"] = [name for name in saved["__all__"] if name not in hidden]
    attributes["__dir__"] = lambda: [name for name in listed() if name not in hidden]
    attributes["__getattr__"] = visible_attribute
    try:
        import array_api_compat.numpy as xp
    finally:
        attributes.update(saved)
    return xp


def _numpy_to_numpy(x: Any) -> Any:
    import numpy as np

    return np.asarray(x)


# --- array_api_strict ------------------------------------------------------------------


def _load_strict() -> ModuleType:
    return _import_or_explain("array_api_strict", "install it with: pip install 'attnspec[strict]'")


def _is_strict_array(x: Any) -> bool:
    from array_api_strict._array_object import Array  # the library exports no Array name

    return isinstance(x, Array)


def _strict_to_numpy(x: Any) -> Any:
    import numpy as np

    return np.asarray(x)


# --- torch -----------------------------------------------------------------------------


def _load_torch() -> ModuleType:
    _import_or_explain("torch", "install it with: pip install 'attnspec[torch]'")
    import array_api_compat.torch as xp

    return xp


def _torch_default_device(xp: ModuleType) -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _torch_from_numpy(xp: ModuleType, a: Any, device: Any) -> Any:
    return _torch_from_fresh_numpy(xp, a.copy(), device)


def _torch_from_fresh_numpy(xp: ModuleType, a: Any, device: Any) -> Any:
    import torch

    # C order as from_numpy's copy gives it (a fresh array may keep its source's layout)
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy()).to(device)


def _torch_to_numpy(x: Any) -> Any:
    import torch

    x = x.detach()
    if x.dtype == torch.bfloat16 or x.dtype in _torch_float8_dtypes(torch):
        x = x.to(torch.float32)  # exact: float32 holds every bfloat16 and float8 value
    return x.cpu().numpy()


def _torch_float8_dtypes(torch: ModuleType) -> tuple[Any, ...]:
    return tuple(getattr(torch, name) for name in FLOAT8_DTYPE_NAMES if hasattr(torch, name))


def _torch_float8_names(xp: ModuleType) -> tuple[str, ...]:
    return tuple(name for name in FLOAT8_DTYPE_NAMES if hasattr(xp, name))


def _torch_float8_bits(x: Any) -> Any:
    import torch

    return x.detach().contiguous().view(torch.uint8).cpu().numpy()


def _torch_from_float8_bits(xp: ModuleType, bits: Any, name: str, device: Any) -> Any:
    import torch

    return torch.from_numpy(bits.copy()).to(device).view(getattr(torch, name))


def _torch_dtypes(xp: ModuleType, device: Any) -> tuple[str, ...]:
    return FLOAT_DTYPE_NAMES


# --- jax -------------------------------------------------------------------------------


def _load_jax() -> ModuleType:
    # Loading changes no setting: a kernel is checked in the configuration its users run
    # (JAX's defaults, or what they set).  Settings are changed only when asked for, with
    # Backend("jax", config={...}), e.g. jax_enable_x64 for float64 (--jax-x64).
    _import_or_explain("jax", "install it with: pip install 'attnspec[jax]'")
    import jax.numpy as jnp

    return cast(ModuleType, jnp)  # Any to mypy, which reads jax as missing (pyproject.toml)


# JAX's process-wide settings attnspec may change when asked: float64 needs x64 (JAX
# otherwise turns float64 into float32), and on A100/H100-class GPUs the default float32
# matmul is TF32 (10-bit mantissa), below SDPA-7.2's float32 accumulation.
JAX_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision")


def _jax_configure(xp: ModuleType, config: Mapping[str, Any]) -> list[str]:
    import jax

    changes = []
    for name, value in config.items():
        if name not in JAX_SETTINGS:
            raise ValueError(f"config key {name!r}, but should be one of {JAX_SETTINGS}")
        before = getattr(jax.config, name)
        if before != value:
            jax.config.update(name, value)
            changes.append(f"{name}: {before!r} -> {value!r}")
    return changes


# JAX's persistent compilation cache, set through the environment of the worker processes
# that run a kernel (conformance/isolation.py): the directory, and the thresholds below
# which JAX does not cache (1 s of compilation by default; a jitted attention compiles in
# 0.2-0.7 s here, so without them almost nothing would be cached).
JAX_CACHE_DIRECTORY = "JAX_COMPILATION_CACHE_DIR"
JAX_CACHE_THRESHOLDS = (
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
)
_run_cache: list[str] = []  # this process's directory, made on first use


def compilation_cache_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a worker process gets on top of ``environ`` (default this process's)
    so that JAX compiles each signature once per run, not once per worker: the workers of
    ``--jobs N``, a worker started after a crash or a hang, and the re-runs that draw
    around a failed clause share JAX's persistent compilation cache, in a directory of
    this process's (removed when it exits) unless ``JAX_COMPILATION_CACHE_DIR`` names one
    (which then lasts from run to run), with every compilation cached unless the
    environment sets the thresholds.  The cache holds what XLA compiled from the same
    program for the same device: a hit runs the same executable.  Only JAX reads these
    variables."""
    import atexit
    import shutil
    import tempfile

    environ = os.environ if environ is None else environ
    variables = {name: "0" for name in JAX_CACHE_THRESHOLDS if name not in environ}
    if JAX_CACHE_DIRECTORY not in environ:
        if not _run_cache:
            _run_cache.append(tempfile.mkdtemp(prefix="attnspec-jax-cache-"))
            atexit.register(shutil.rmtree, _run_cache[0], ignore_errors=True)
        variables[JAX_CACHE_DIRECTORY] = _run_cache[0]
    return variables


def _jax_describe(xp: ModuleType) -> str:
    import jax

    return ", ".join(f"{name}={getattr(jax.config, name)!r}" for name in JAX_SETTINGS)


def _jax_dtypes(xp: ModuleType, device: Any) -> tuple[str, ...]:
    import jax

    if jax.config.read("jax_enable_x64"):
        return FLOAT_DTYPE_NAMES
    return tuple(name for name in FLOAT_DTYPE_NAMES if name != "float64")


def _jax_missing_dtype(xp: ModuleType, name: str) -> str:
    if name != "float64":
        return ""
    return (
        "jax_enable_x64 is off (JAX's default), so JAX turns float64 into float32; turn "
        "it on with --jax-x64, Backend('jax', config={'jax_enable_x64': True}) or "
        "JAX_ENABLE_X64=1"
    )


def _jax_default_device(xp: ModuleType) -> Any:
    import jax

    return jax.devices()[0]


def _jax_from_numpy(xp: ModuleType, a: Any, device: Any) -> Any:
    import jax

    return jax.device_put(a, device)


def _jax_to_numpy(x: Any) -> Any:
    import numpy as np

    # bfloat16 (ml_dtypes') widened on the host: on the device it would compile per shape
    host = np.asarray(x)
    return host.astype(np.float32) if str(x.dtype) == "bfloat16" else host


# --- cupy ------------------------------------------------------------------------------


def _load_cupy() -> ModuleType:
    cupy = _import_or_explain("cupy", "install it with: pip install 'attnspec[cupy]'")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing raises CUDARuntimeError
        raise BackendError(
            f"backend 'cupy' needs a CUDA device, but none is usable ({exc})"
        ) from None
    if count == 0:
        raise BackendError("backend 'cupy' needs a CUDA device, but none is present")
    import array_api_compat.cupy as xp

    return xp


def _cupy_default_device(xp: ModuleType) -> Any:
    import cupy

    return cupy.cuda.Device(0)


def _cupy_from_numpy(xp: ModuleType, a: Any, device: Any) -> Any:
    import cupy

    with device:
        return cupy.asarray(a)


def _cupy_to_numpy(x: Any) -> Any:
    return x.get()


def _no_bfloat16(xp: ModuleType, device: Any) -> tuple[str, ...]:
    return ("float16", "float32", "float64")


def _strict_dtypes(xp: ModuleType, device: Any) -> tuple[str, ...]:
    return tuple(n for n in FLOAT_DTYPE_NAMES if hasattr(xp, n))


def _first_device(xp: ModuleType) -> Any:
    return xp.__array_namespace_info__().default_device()


def _cpu_only(xp: ModuleType, spec: str) -> Any:
    if spec.lower() not in ("cpu", "cpu:0", "cpu_device"):
        raise ValueError(f"this backend runs on the CPU only; ATTNSPEC_DEVICE={spec!r} is not one")
    return _first_device(xp)


def _torch_device(xp: ModuleType, spec: str) -> Any:
    import torch

    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ValueError(f"device {spec!r} is not a torch device ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(f"device {spec!r} asked for, but torch sees no CUDA device")
    return device


def _jax_device(xp: ModuleType, spec: str) -> Any:
    import jax

    platform, _, index = spec.lower().partition(":")
    platform = {"cuda": "gpu"}.get(platform, platform)
    try:
        devices = jax.devices(platform)
    except RuntimeError as exc:
        raise BackendError(f"device {spec!r} asked for, but jax has none ({exc})") from None
    position = int(index) if index else 0
    if position >= len(devices):
        raise BackendError(f"device {spec!r} asked for, but jax has {len(devices)} {platform}")
    return devices[position]


def _cupy_device(xp: ModuleType, spec: str) -> Any:
    import cupy

    platform, _, index = spec.lower().partition(":")
    if platform not in ("cuda", "gpu"):
        raise ValueError(f"cupy runs on CUDA devices only; {spec!r} is not one")
    return cupy.cuda.Device(int(index) if index else 0)


def _asarray_on(xp: ModuleType, a: Any, device: Any) -> Any:
    return xp.asarray(a, device=device)


def _array_test(name: str) -> Callable[[Any], bool]:
    """``array_api_compat.<name>``, looked up when first used (the library may be absent)."""

    def is_array(x: Any) -> bool:
        import array_api_compat

        return bool(getattr(array_api_compat, name)(x))

    return is_array


ADAPTERS: dict[str, Adapter] = {
    "numpy": Adapter(
        "numpy",
        "numpy",
        numpy_namespace,
        _first_device,
        _asarray_on,
        _numpy_to_numpy,
        _no_bfloat16,
        _cpu_only,
        _array_test("is_numpy_array"),
    ),
    "array_api_strict": Adapter(
        "array_api_strict",
        "array_api_strict",
        _load_strict,
        _first_device,
        _asarray_on,
        _strict_to_numpy,
        _strict_dtypes,
        _cpu_only,
        _is_strict_array,
    ),
    "torch": Adapter(
        "torch",
        "torch",
        _load_torch,
        _torch_default_device,
        _torch_from_numpy,
        _torch_to_numpy,
        _torch_dtypes,
        _torch_device,
        _array_test("is_torch_array"),
        on_cpu=lambda device: device.type == "cpu",
        vjp=_torch_vjp,
        float8_names=_torch_float8_names,
        float8_bits=_torch_float8_bits,
        from_float8_bits=_torch_from_float8_bits,
        from_fresh_numpy=_torch_from_fresh_numpy,
    ),
    "jax": Adapter(
        "jax",
        "jax",
        _load_jax,
        _jax_default_device,
        _jax_from_numpy,
        _jax_to_numpy,
        _jax_dtypes,
        _jax_device,
        _array_test("is_jax_array"),
        _jax_configure,
        _jax_describe,
        _jax_missing_dtype,
        compiles_per_shape=True,
        has_strides=False,
        on_cpu=lambda device: device.platform == "cpu",
        vjp=_jax_vjp,
    ),
    "cupy": Adapter(
        "cupy",
        "cupy",
        _load_cupy,
        _cupy_default_device,
        _cupy_from_numpy,
        _cupy_to_numpy,
        _no_bfloat16,
        _cupy_device,
        _array_test("is_cupy_array"),
        on_cpu=lambda device: False,
    ),
}

ALIASES = {
    "np": "numpy",
    "pytorch": "torch",
    "strict": "array_api_strict",
    "array-api-strict": "array_api_strict",
}


def canonical_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {type(name).__name__}")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in ADAPTERS:
        raise ValueError(
            f"unknown attnspec backend {name!r}; expected one of {', '.join(ADAPTERS)}"
        )
    return key


# A kernel that compiles itself per shape on a library that does not (a function wrapped in
# torch.compile) is checked with shape pools when this variable is "1" (Backend.compiles_per_
# shape); the matrix sets it for such a known kernel (KnownKernel.env), and its workers
# inherit it.
SHAPE_POOLS_VARIABLE = "ATTNSPEC_SHAPE_POOLS"


def shape_pools_asked() -> bool:
    return os.environ.get(SHAPE_POOLS_VARIABLE) == "1"


def env_choice() -> tuple[str | None, str | None]:
    return os.environ.get("ATTNSPEC_BACKEND") or None, os.environ.get("ATTNSPEC_DEVICE") or None
