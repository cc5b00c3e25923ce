"""Float8 arrays in the torch backend and across the kernel-process wire (QUANT-1).

A float8 kernel's stored q, k, v must reach it bit for bit (QUANT-1: the real value is the
stored value times its descale), and NumPy has no float8 dtype: the wire carries the bits.
The expected values come from a plain decoding of the bit patterns, not from torch.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from attnspec import Backend
from attnspec.backends.exchange import export_array, import_array
from attnspec.conformance.call.wire import loads_from_kernel

torch = pytest.importorskip("torch", reason="float8 arrays are checked on torch's CPU dtypes")

# (significand bits, exponent bits, bias) of each format, and whether it is the "fn" variant
# whose only non-finite patterns are S.1111.111 (NaN) instead of IEEE's all-ones exponent
FORMATS = {"float8_e4m3fn": (3, 4, 7, True), "float8_e5m2": (2, 5, 15, False)}


def decoded(bits: np.ndarray, name: str) -> np.ndarray:
    """QUANT-1's formats decoded from their bit patterns as float64, one element at a time."""
    mant, exp_bits, bias, fn = FORMATS[name]
    top = (1 << exp_bits) - 1
    out = np.empty(bits.shape, np.float64)
    for index, b in np.ndenumerate(bits.astype(np.int64)):
        sign = -1.0 if b >> 7 else 1.0
        e, m = (b >> mant) & top, b & ((1 << mant) - 1)
        if fn and e == top and m == (1 << mant) - 1:
            value = float("nan")
        elif not fn and e == top:
            value = float("nan") if m else sign * float("inf")
        elif e == 0:
            value = sign * m / 2.0**mant * 2.0 ** (1 - bias)
        else:
            value = sign * (1 + m / 2.0**mant) * 2.0 ** (e - bias)
        out[index] = value
    return out


@pytest.fixture(scope="module")
def torch_cpu() -> Backend:
    return Backend("torch", "cpu")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_float8_values_and_bits(torch_cpu: Backend, name: str) -> None:
    """QUANT-1: every one of the 256 stored patterns widens exactly to its value, and its
    bits come back unchanged from from_float8_bits."""
    assert name in torch_cpu.float8_names
    bits = np.arange(256, dtype=np.uint8).reshape(16, 16)
    x = torch_cpu.from_float8_bits(bits, name)
    assert torch_cpu.float8_name(x) == name and torch_cpu.dtype_name(x) is None
    np.testing.assert_array_equal(torch_cpu.float8_bits(x), bits)
    np.testing.assert_array_equal(torch_cpu.to_numpy(x), decoded(bits, name))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_float8_crosses_the_wire_bit_for_bit(torch_cpu: Backend, name: str) -> None:
    """QUANT-1: a float8 array (contiguous, and a transposed view over filler) crosses to
    the kernel's process and back with its dtype, layout and every bit: NaN payloads and
    -0 included."""
    bits = np.arange(256, dtype=np.uint8).reshape(4, 8, 8)
    memory = torch_cpu.from_float8_bits(bits, name)
    for x in (memory, memory.transpose(1, 2)[:, :, ::2]):
        payload = loads_from_kernel(pickle.dumps(export_array(torch_cpu, x)))
        assert payload.values.dtype == np.uint8
        back = import_array(torch_cpu, payload)
        assert back.dtype == x.dtype and back.stride() == x.stride()
        np.testing.assert_array_equal(torch_cpu.float8_bits(back), torch_cpu.float8_bits(x))


def test_float8_refused_where_absent() -> None:
    """QUANT-1: a backend without float8 dtypes (NumPy) says so by name."""
    numpy_backend = Backend("numpy")
    assert numpy_backend.float8_names == ()
    with pytest.raises(ValueError, match="dtype='float8_e4m3fn'"):
        numpy_backend.from_float8_bits(np.zeros(2, np.uint8), "float8_e4m3fn")
