"""BWD-18's comparison implementation, floor and scope (reference/same_dtype.py): FlashAttention's
``attention_ref(upcast=False, reorder_ops=True)`` differentiated in the input dtype, against a
NumPy loop oracle in float16 (tests/oracle_same_dtype.py) and against torch.autograd of that
forward written in torch float16 and bfloat16; the floor's root-sum-squares against the
oracle's; the score bound above every score; pure Array API (array-api-strict)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from oracle_same_dtype import floor_roots, same_dtype_gradients
from support import backend_or_skip

from attnspec.reference.backward import scaled_dot_product_attention_backward
from attnspec.reference.same_dtype import (
    SCORE_LIMIT,
    comparative_floors,
    comparative_threshold,
    largest_score,
    last_place,
    same_dtype_attention_backward,
)
from attnspec.reference.tolerance import UNDERFLOW_THRESHOLD, UNIT_ROUNDOFF

NAMES = ("dq", "dk", "dv", "dbias")


def _half_problem(seed: int = 3) -> dict[str, Any]:
    """GQA (2 query heads per key/value head), a batch of 2, a mask with a row and a key
    masked out, a bias, all in float16."""
    rng = np.random.default_rng(seed)
    half = lambda a: a.astype(np.float16)  # noqa: E731
    mask = rng.random((2, 2, 6, 7)) < 0.8
    mask[0, 1, 2] = False  # a row with no key (BWD-4)
    return {
        "q": half(rng.standard_normal((2, 2, 6, 4))),
        "k": half(rng.standard_normal((2, 1, 7, 4))),
        "v": half(rng.standard_normal((2, 1, 7, 3))),
        "grad_out": half(rng.standard_normal((2, 2, 6, 3))),
        "bias": half(rng.standard_normal((2, 2, 6, 7))),
        "mask": mask,
    }


def _ulps(a: np.ndarray) -> np.ndarray:
    """One float16 unit in the last place of each element (at least the smallest normal's)."""
    return np.spacing(np.maximum(np.abs(a), 2.0**-14).astype(np.float16)).astype(np.float64)


@pytest.mark.parametrize(("softcap", "from_output"), [(None, False), (2.0, True)])
def test_matches_the_float16_loop_oracle(softcap: float | None, from_output: bool) -> None:
    """BWD-18: on NumPy float16 the comparison implementation gives the loop oracle's
    gradients within one float16 ulp per element (float32 sums may round in another order),
    zero for the row with no key (BWD-4), each in its input's dtype (BWD-13); with the delta
    term from autograd's rowsum(P dP) and from the stored output's rowsum(dO O)."""
    p = _half_problem()
    got = same_dtype_attention_backward(
        p["q"], p["k"], p["v"], p["grad_out"], bias=p["bias"], mask=p["mask"], softcap=softcap,
        delta_from_output=from_output,
    )  # fmt: skip
    arrays = (p["q"], p["k"], p["v"], p["grad_out"])
    want = same_dtype_gradients(
        arrays, allowed=p["mask"], bias=p["bias"], softcap=softcap, delta_from_output=from_output
    )
    for name, mine, theirs in zip(NAMES, got, want, strict=True):
        assert mine.dtype == np.float16, (name, mine.dtype)
        mine64, theirs64 = mine.astype(np.float64), theirs.astype(np.float64)
        assert np.all(np.abs(mine64 - theirs64) <= _ulps(theirs64)), name
    assert np.all(got.dq[0, 1, 2] == 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matches_torch_autograd_of_attention_ref(dtype: str) -> None:
    """BWD-18: on torch float16 and bfloat16 the comparison implementation is torch.autograd
    of attention_ref(upcast=False, reorder_ops=True) (k scaled, scores, causal -inf, bias,
    softmax and P V in the dtype, GQA by repeated heads): the same values but for a few
    elements, which float32 sums in another order round otherwise (at most one ulp of the
    gradient's largest element), and the same largest error against the float64 definition
    within 5%."""
    torch = pytest.importorskip("torch", reason="torch.autograd in half precision")
    low = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    q, do = (torch.randn(1, 4, 40, 16, generator=gen).to(low) for _ in range(2))
    k, v = (torch.randn(1, 2, 40, 16, generator=gen).to(low) for _ in range(2))
    bias = torch.randn(1, 1, 40, 40, generator=gen).to(low)
    leaves = [a.clone().requires_grad_() for a in (q, k, v, bias)]
    lq, lk, lv, lb = leaves
    repeated_k, repeated_v = lk.repeat_interleave(2, dim=1), lv.repeat_interleave(2, dim=1)
    scores = lq @ (repeated_k / math.sqrt(16)).transpose(-1, -2)
    scores = scores.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), -math.inf) + lb
    out = torch.softmax(scores, dim=-1) @ repeated_v
    theirs = torch.autograd.grad(out, leaves, do)
    mine = same_dtype_attention_backward(q, k, v, do, bias=bias, is_causal=True)
    exact = scaled_dot_product_attention_backward(
        *(a.double().numpy() for a in (q, k, v, do)), bias=bias.double().numpy(), is_causal=True
    )
    ulp = torch.finfo(low).eps
    for name, a, b, e in zip(NAMES, mine, theirs, exact, strict=True):
        assert a.dtype == low, (name, a.dtype)
        a64, b64 = a.double().numpy(), b.double().numpy()
        differ = np.abs(a64 - b64)
        assert np.all(differ <= ulp * np.max(np.abs(b64))) and np.mean(differ > 0) < 0.02, name
        errors = [float(np.max(np.abs(x - e))) for x in (a64, b64)]
        assert errors[0] == pytest.approx(errors[1], rel=0.05), (name, errors)


def test_a_dtype_its_namespace_lacks_is_stored_by_the_caller() -> None:
    """BWD-18: with ``store`` (NumPy float32 values, each step rounded to bfloat16 through
    ml_dtypes, as the judge does for JAX's bfloat16) the comparison implementation gives
    PyTorch's bfloat16 one, but for float32 sums rounded in another order."""
    torch = pytest.importorskip("torch", reason="the bfloat16 comparison runs on torch")
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="NumPy's bfloat16 is ml_dtypes'")
    rng = np.random.default_rng(9)
    values = [rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((1, 2, 30, 8),) * 4]
    wide = [a.astype(np.float32) for a in values]

    def store(a: np.ndarray) -> np.ndarray:
        return np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32)

    mine = same_dtype_attention_backward(*wide, store=store, is_causal=True)
    theirs = same_dtype_attention_backward(
        *(torch.from_numpy(a).to(torch.bfloat16) for a in wide), is_causal=True
    )
    for name, a, b in zip(NAMES[:3], mine[:3], theirs[:3], strict=True):
        b64 = b.double().numpy()
        differ = np.abs(a.astype(np.float64) - b64)
        assert np.all(differ <= 2.0**-7 * np.max(np.abs(b64))), name
        assert np.mean(differ > 0) < 0.05, name


@pytest.mark.parametrize("name", ["numpy", "array_api_strict"])
def test_runs_on_array_api_strict(name: str) -> None:
    """BWD-18: pure Array API: on array-api-strict (and NumPy) in float32, where nothing is
    stored coarser than it is computed, the comparison implementation is the float32
    evaluation of the gradients (within float32's rounding of the float64 ones)."""
    cpu_backend = backend_or_skip(name)
    p = _half_problem(5)
    moved = {
        n: cpu_backend.asarray(a, None if a.dtype == bool else "float32") for n, a in p.items()
    }
    got = same_dtype_attention_backward(
        moved["q"], moved["k"], moved["v"], moved["grad_out"], bias=moved["bias"],
        mask=moved["mask"],
    )  # fmt: skip
    wide = {n: a if a.dtype == bool else a.astype(np.float64) for n, a in p.items()}
    exact = scaled_dot_product_attention_backward(
        wide["q"], wide["k"], wide["v"], wide["grad_out"], bias=wide["bias"], mask=wide["mask"]
    )
    for name, a, e in zip(NAMES, got, exact, strict=True):
        values = np.asarray(cpu_backend.to_numpy(a), dtype=np.float64)
        assert values.dtype == np.float64 and str(a.dtype).endswith("float32"), name
        assert np.allclose(values, e, rtol=1e-5, atol=1e-6), name


def test_the_floor_is_twice_float32s_roundings_of_the_terms() -> None:
    """BWD-18's floor: 2 (u_a max r^Y + sigma_d), with the root-sum-squares r^Y of the loop
    oracle (each term in magnitude, times E_v + 2 + |s_ij| + |lse_i|), for dq, dk and dv;
    the threshold is the larger of it and 3 times the comparison implementation's error."""
    p = {n: a if a.dtype == bool else a.astype(np.float64) for n, a in _half_problem(8).items()}
    arrays = (p["q"], p["k"], p["v"], p["grad_out"])
    floors = comparative_floors(*arrays, dtype="float16", mask=p["mask"])
    roots = floor_roots(*arrays, allowed=p["mask"])
    u_a, sigma_d = UNIT_ROUNDOFF["float32"], UNDERFLOW_THRESHOLD["float16"]
    for floor, root in zip(floors[:3], roots, strict=True):
        assert root > 0
        assert floor == pytest.approx(2 * (u_a * root + sigma_d))
    assert floors.dbias is None
    assert comparative_threshold(1e-3, floors.dq) == pytest.approx(max(3e-3, floors.dq))
    assert comparative_threshold(0.0, floors.dq) == floors.dq > 0


def test_the_score_bound_is_above_every_score() -> None:
    """BWD-18's scope: largest_score bounds every allowed score's magnitude (softcap,
    finite bias entries, ALiBi), and a padding bias of bfloat16's most negative value puts a
    problem outside it (float32 does not resolve its scores)."""
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((1, 2, 5, 8)) * 3, rng.standard_normal((1, 2, 9, 8)) * 3
    bias = rng.standard_normal((5, 9)) * 4
    bias[:, -1] = -np.inf
    slopes = np.array([0.5, 0.25])
    scores = np.einsum("bhie,bhje->bhij", q, k) / math.sqrt(8)
    distance = np.abs(np.arange(5)[:, None] - np.arange(9)[None, :])
    full = scores + bias - slopes[:, None, None] * distance
    assert largest_score(q, k, bias=bias, alibi_slopes=slopes) >= np.max(np.abs(full[..., :-1]))
    capped = 5.0 * np.tanh(scores / 5.0)
    assert largest_score(q, k, softcap=5.0) >= np.max(np.abs(capped))
    padded = np.where(np.arange(9) < 6, 0.0, -3.3895313892515355e38)[None, :]
    assert largest_score(q, k, bias=padded) >= SCORE_LIMIT > largest_score(q, k, bias=bias)


def test_bad_input_is_rejected() -> None:
    """BWD-18: a gradient of the log-sum-exp (which FlashAttention's reference does not
    return), an unknown dtype and a negative error are refused, naming the argument."""
    p = _half_problem()
    arrays = (p["q"], p["k"], p["v"], p["grad_out"])
    with pytest.raises(ValueError, match=r"grad_lse.*BWD-18"):
        same_dtype_attention_backward(*arrays, grad_lse=np.zeros((2, 2, 6), np.float16))
    wide = tuple(a.astype(np.float64) for a in arrays)
    with pytest.raises(ValueError, match=r"dtype='float8'.*BWD-18"):
        comparative_floors(*wide, dtype="float8")
    with pytest.raises(TypeError, match=r"float64.*BWD-16"):
        comparative_floors(*arrays, dtype="float16")
    with pytest.raises(ValueError, match=r"reference_error=-1.0.*BWD-18"):
        comparative_threshold(-1.0, 0.0)


def test_last_place_is_the_spacing_of_the_dtype() -> None:
    """BWD-18's floor: one unit in the last place of the dtype at a gradient's largest
    magnitude (float16 and bfloat16 spacings at and between powers of two), sigma_d at 0
    or below the normal range, and an unknown dtype refused."""
    assert last_place(1.0, "float16") == 2.0**-10 == last_place(1.999, "float16")
    assert last_place(1.3016, "float16") == 2.0**-10
    assert last_place(0.75, "bfloat16") == 2.0**-8
    assert last_place(0.0, "float16") == UNDERFLOW_THRESHOLD["float16"]
    assert last_place(1e-7, "float16") == 2.0**-24
    with pytest.raises(ValueError, match=r"dtype.*BWD-18"):
        last_place(1.0, "float8")
