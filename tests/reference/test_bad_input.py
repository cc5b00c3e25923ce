"""Bad input raises ValueError/TypeError naming the argument, its value and the rule.

Each row is one misuse; the test asserts the exception type and that the message
names the argument with what it was (e.g. ``k.shape[-1]=3``) and what it should be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from attnspec.reference import causal_mask, padding_mask, scaled_dot_product_attention
from attnspec.reference.mha import multi_head_attention
from attnspec.reference.positional import apply_rope, sinusoidal_positional_encoding

rng = np.random.default_rng(0)
Q = rng.standard_normal((1, 4, 3, 8))
K = rng.standard_normal((1, 2, 5, 8))
V = rng.standard_normal((1, 2, 5, 6))
X = rng.standard_normal((2, 3, 12))
Y = rng.standard_normal((2, 5, 10))
WEIGHTS = {  # num_heads=4, num_kv_heads=2, E=3, Ev=2, d_out=7
    "w_q": rng.standard_normal((12, 12)),
    "w_k": rng.standard_normal((10, 6)),
    "w_v": rng.standard_normal((10, 4)),
    "w_o": rng.standard_normal((8, 7)),
}


def sdpa(**changes: Any) -> Callable[[], Any]:
    arrays = {"q": Q, "k": K, "v": V}
    options = {n: changes.pop(n) for n in list(changes) if n not in arrays}
    arrays.update(changes)
    return lambda: scaled_dot_product_attention(arrays["q"], arrays["k"], arrays["v"], **options)


def mha(**changes: Any) -> Callable[[], Any]:
    arguments = {"x": X, "y": Y, **WEIGHTS, "num_heads": 4, "num_kv_heads": 2, **changes}
    return lambda: multi_head_attention(**arguments)


def numpy_namespace() -> Any:
    import array_api_compat.numpy as xp

    return xp


def torch_tensor(a: np.ndarray) -> Any:
    torch = pytest.importorskip("torch", reason="mixing needs a second library: torch")
    return torch.from_numpy(a)


BAD_SDPA = [
    # (id, call, exception, what the message must contain)
    ("E-mismatch", sdpa(k=K[..., :7]), ValueError, "k.shape[-1]=7, but should equal q.shape[-1]=8"),
    ("v-length", sdpa(v=V[..., :4, :]), ValueError, "v.shape[-3:-1]=(2, 4), but should equal"),
    ("v-heads", sdpa(v=V[:, :1]), ValueError, "v.shape[-3:-1]=(1, 5), but should equal"),
    ("E-zero", sdpa(q=Q[..., :0], k=K[..., :0]), ValueError, "q.shape[-1]=0"),
    ("heads-not-multiple", sdpa(q=Q[:, :3]), ValueError, "q has 3 heads and k/v have 2"),
    ("ndim", sdpa(q=Q[0, 0]), ValueError, "q.shape=(3, 8), but should have at least 3 dims"),
    (
        "batch",
        sdpa(k=np.concatenate([K, K]), v=np.concatenate([V, V, V])),
        ValueError,
        "batch shapes do not broadcast",
    ),
    (
        "mask-shape",
        sdpa(mask=np.ones((3, 4), bool)),
        ValueError,
        "mask.shape=(3, 4), but should broadcast to (1, 4, 3, 5)",
    ),
    (
        "mask-too-many-dims",
        sdpa(mask=np.ones((1, 1, 1, 3, 5), bool)),
        ValueError,
        "mask.shape=(1, 1, 1, 3, 5), but should broadcast to",
    ),
    (
        "bias-shape",
        sdpa(bias=np.zeros((2, 3, 5))),
        ValueError,
        "bias.shape=(2, 3, 5), but should broadcast to (1, 4, 3, 5)",
    ),
    (
        "float-mask",
        sdpa(mask=np.zeros((3, 5))),
        TypeError,
        "mask.dtype=float64, but should be bool (True = may attend); pass an additive float "
        "mask as bias=",
    ),
    (
        "int-mask",
        sdpa(mask=np.ones((3, 5), np.int8)),
        TypeError,
        "mask.dtype=int8, but should be bool",
    ),
    (
        "int-q",
        sdpa(q=Q.astype(np.int32)),
        TypeError,
        "q.dtype=int32, but should be a real floating",
    ),
    (
        "int-v",
        sdpa(v=V.astype(np.int64)),
        TypeError,
        "v.dtype=int64, but should be a real floating",
    ),
    ("bool-k", sdpa(k=K > 0), TypeError, "k.dtype=bool, but should be a real floating"),
    ("complex-q", sdpa(q=Q.astype(np.complex128)), TypeError, "q.dtype=complex128"),
    ("int-bias", sdpa(bias=np.zeros((3, 5), np.int32)), TypeError, "bias.dtype=int32"),
    (
        "mixed-dtypes",
        sdpa(k=K.astype(np.float32)),
        TypeError,
        "q.dtype=float64, k.dtype=float32, v.dtype=float64, but should all be the same",
    ),
    ("list-q", sdpa(q=Q.tolist()), TypeError, "q is a list, but should be an array"),
    ("scalar-bias", sdpa(bias=0.5), TypeError, "bias is a float, but should be an array"),
    (
        "alignment",
        sdpa(is_causal=True, causal_alignment="bottom-right"),
        ValueError,
        "causal_alignment='bottom-right', but should be one of 'top_left', 'bottom_right'",
    ),
    ("is-causal-int", sdpa(is_causal=1), TypeError, "is_causal=1, but should be True or False"),
    ("is-causal-str", sdpa(is_causal="yes"), TypeError, "is_causal='yes', but should be True"),
    ("return-weights", sdpa(return_weights=None), TypeError, "return_weights=None, but should be"),
    ("scale-nan", sdpa(scale=float("nan")), ValueError, "scale=nan, but should be finite"),
    ("scale-inf", sdpa(scale=float("inf")), ValueError, "scale=inf, but should be finite"),
    ("scale-str", sdpa(scale="0.5"), TypeError, "scale='0.5', but should be None or a real number"),
    ("scale-bool", sdpa(scale=True), TypeError, "scale=True, but should be None or a real number"),
    ("scale-vector", sdpa(scale=np.ones(2)), TypeError, "but should be None or a real number"),
]

BAD_BUILDERS = [
    (
        "pe-n-negative",
        lambda: sinusoidal_positional_encoding(-1, 4, xp=numpy_namespace()),
        ValueError,
        "n=-1, but should be an int >= 0",
    ),
    (
        "pe-n-float",
        lambda: sinusoidal_positional_encoding(2.5, 4, xp=numpy_namespace()),
        TypeError,
        "n=2.5, but should be an int >= 0",
    ),
    (
        "pe-d-zero",
        lambda: sinusoidal_positional_encoding(4, 0, xp=numpy_namespace()),
        ValueError,
        "d=0, but should be an int >= 1",
    ),
    (
        "pe-d-str",
        lambda: sinusoidal_positional_encoding(4, "8", xp=numpy_namespace()),
        TypeError,
        "d='8', but should be an int >= 1",
    ),
    (
        "pe-base-zero",
        lambda: sinusoidal_positional_encoding(4, 8, base=0, xp=numpy_namespace()),
        ValueError,
        "base=0, but should be finite and > 0",
    ),
    (
        "pe-base-nan",
        lambda: sinusoidal_positional_encoding(4, 8, base=float("nan"), xp=numpy_namespace()),
        ValueError,
        "base=nan, but should be finite and > 0",
    ),
    (
        "pe-base-str",
        lambda: sinusoidal_positional_encoding(4, 8, base="1e4", xp=numpy_namespace()),
        TypeError,
        "base='1e4', but should be a real number",
    ),
    (
        "pe-dtype-int-name",
        lambda: sinusoidal_positional_encoding(4, 8, dtype="int32", xp=numpy_namespace()),
        ValueError,
        "dtype='int32', but should be one of",
    ),
    (
        "pe-dtype-int",
        lambda: sinusoidal_positional_encoding(4, 8, dtype=np.int32, xp=numpy_namespace()),
        TypeError,
        "but should be a real floating dtype",
    ),
    (
        "pe-dtype-unsupported",
        lambda: sinusoidal_positional_encoding(4, 8, dtype="bfloat16", xp=numpy_namespace()),
        ValueError,
        "dtype='bfloat16', but should be one of ['float16', 'float32', 'float64']",
    ),
    (
        "rope-odd-d",
        lambda: apply_rope(np.zeros((3, 5))),
        ValueError,
        "x.shape[-1]=5, but should be even",
    ),
    (
        "rope-zero-d",
        lambda: apply_rope(np.zeros((3, 0))),
        ValueError,
        "x.shape[-1]=0, but should be even and >= 2",
    ),
    (
        "rope-layout",
        lambda: apply_rope(np.zeros((3, 4)), layout="rotate_half"),
        ValueError,
        "layout='rotate_half', but should be one of 'interleaved', 'half'",
    ),
    (
        "rope-positions-float",
        lambda: apply_rope(np.zeros((3, 4)), np.arange(3.0)),
        TypeError,
        "positions.dtype=float64, but should be an integer dtype",
    ),
    (
        "rope-positions-shape",
        lambda: apply_rope(np.zeros((3, 4)), np.arange(4)),
        ValueError,
        "positions.shape=(4,), but should broadcast to (3,)",
    ),
    (
        "rope-positions-list",
        lambda: apply_rope(np.zeros((3, 4)), [0, 1, 2]),
        TypeError,
        "positions is a list, but should be an array",
    ),
    (
        "rope-x-int",
        lambda: apply_rope(np.zeros((3, 4), np.int64)),
        TypeError,
        "x.dtype=int64, but should be a real floating",
    ),
    ("rope-x-1d", lambda: apply_rope(np.zeros(4)), ValueError, "x.shape=(4,), but should be"),
    (
        "rope-base",
        lambda: apply_rope(np.zeros((3, 4)), base=-1.0),
        ValueError,
        "base=-1.0, but should be finite and > 0",
    ),
    (
        "causal-mask-negative",
        lambda: causal_mask(-1, 3, xp=numpy_namespace()),
        ValueError,
        "n_queries=-1, but should be an int >= 0",
    ),
    (
        "causal-mask-alignment",
        lambda: causal_mask(2, 3, "diagonal", xp=numpy_namespace()),
        ValueError,
        "alignment='diagonal', but should be one of",
    ),
    (
        "padding-mask-floats",
        lambda: padding_mask([1.5, 2.0], 3, xp=numpy_namespace()),
        ValueError,
        "key_lengths should be a 1-d sequence of ints",
    ),
]

BAD_MHA = [
    ("x-1d", mha(x=X[0, 0]), ValueError, "x.shape=(12,), but should have at least 2 dims"),
    (
        "w_q-rows",
        mha(w_q=WEIGHTS["w_q"][:11]),
        ValueError,
        "w_q.shape=(11, 12), but should be (12,",
    ),
    (
        "w_q-heads",
        mha(w_q=WEIGHTS["w_q"][:, :10]),
        ValueError,
        "w_q.shape=(12, 10), but should be (12, num_heads * E)",
    ),
    (
        "w_k-head-dim",
        mha(w_k=WEIGHTS["w_k"][:, :4]),
        ValueError,
        "w_k.shape=(10, 4), but should be (10, 6)",
    ),
    ("y-features", mha(y=Y[..., :9]), ValueError, "w_k.shape=(10, 6), but should be (9,"),
    ("w_v-heads", mha(w_v=WEIGHTS["w_v"][:, :3]), ValueError, "w_v.shape=(10, 3), but should be"),
    ("w_o-rows", mha(w_o=WEIGHTS["w_o"][:6]), ValueError, "w_o.shape=(6, 7), but should be (8,"),
    ("b_q-shape", mha(b_q=np.zeros(13)), ValueError, "b_q.shape=(13,), but should broadcast to"),
    ("b_o-shape", mha(b_o=np.zeros((2, 7))), ValueError, "b_o.shape=(2, 7), but should broadcast"),
    ("num-heads-zero", mha(num_heads=0), ValueError, "num_heads=0, but should be an int >= 1"),
    ("num-heads-float", mha(num_heads=4.0), TypeError, "num_heads=4.0, but should be an int"),
    (
        "kv-heads-not-divisor",
        mha(num_heads=4, num_kv_heads=3),
        ValueError,
        "num_heads=4, num_kv_heads=3, but num_heads should be a whole multiple",
    ),
    (
        "mixed-dtype",
        mha(w_o=WEIGHTS["w_o"].astype(np.float32)),
        TypeError,
        "w_o.dtype=float32, but should all be the same",
    ),
    ("int-x", mha(x=X.astype(np.int64)), TypeError, "x.dtype=int64, but should be a real floating"),
    (
        "list-w",
        mha(w_v=WEIGHTS["w_v"].tolist()),
        TypeError,
        "w_v is a list, but should be an array",
    ),
    ("mask-dtype", mha(mask=np.zeros((3, 5))), TypeError, "mask.dtype=float64, but should be bool"),
]


def bad_inputs(table: Sequence[tuple[Any, ...]]) -> pytest.MarkDecorator:
    """Parametrize a test over a table's (call, error, message) rows, each named by its
    first column."""
    return pytest.mark.parametrize(
        ("call", "error", "message"), [row[1:] for row in table], ids=[row[0] for row in table]
    )


def _raised(call: Callable[[], Any], error: type, message: str) -> str:
    """The text of the ``error`` that ``call()`` raises, which must contain ``message``."""
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)
    return str(raised.value)


@bad_inputs(BAD_SDPA)
def test_sdpa_bad_input(call: Callable[[], Any], error: type, message: str) -> None:
    """SDPA-1.1, 1.2, 1.4, 2.2, 3.1, 3.2, 4.1-4.3, 6.2: each misuse names its argument."""
    assert "scaled_dot_product_attention(q, k, v)" in _raised(call, error, message)


@bad_inputs(BAD_BUILDERS)
def test_builder_bad_input(call: Callable[[], Any], error: type, message: str) -> None:
    """POS-1, ROPE-1, SDPA-4: bad sizes, bases, dtypes, layouts and positions are named."""
    _raised(call, error, message)


@bad_inputs(BAD_MHA)
def test_mha_bad_input(call: Callable[[], Any], error: type, message: str) -> None:
    """MHA-1, SDPA-6.2: bad projection shapes, head counts and dtypes are named."""
    _raised(call, error, message)


@pytest.mark.parametrize("argument", ["k", "mask", "bias"])
def test_two_libraries_mixed(argument: str) -> None:
    """SDPA-1.4: a torch tensor among NumPy arrays is named with both libraries."""
    problem = {"q": Q, "k": K, "v": V, "mask": np.ones((3, 5), bool), "bias": np.zeros((3, 5))}
    problem[argument] = torch_tensor(problem[argument])
    with pytest.raises(TypeError) as raised:
        scaled_dot_product_attention(**problem)
    message = str(raised.value)
    assert "arrays from different libraries were mixed" in message
    assert f"{argument}: torch.Tensor" in message and "q: numpy.ndarray" in message


def test_mha_two_libraries_mixed() -> None:
    """MHA-2: cross-attention whose y comes from another library than x is named."""
    with pytest.raises(TypeError) as raised:
        multi_head_attention(X, torch_tensor(Y), **WEIGHTS, num_heads=4, num_kv_heads=2)
    assert "y: torch.Tensor" in str(raised.value)
