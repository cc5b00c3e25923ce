"""Rotary position embedding: partial rotary dimensions in the reference (ROPE-1), the
ROPE-3 bound as the spec displays it, and its soundness on correct formulations at positions
up to 2^17 in every dtype (the suite on the RoPE catalogue:
tests/catalogue/test_serving_families.py)."""

from __future__ import annotations

import math
import re

import numpy as np
import oracle
import pytest
from catalogue import rope as catalogue
from support import backend_or_skip

from attnspec.backends import Backend
from attnspec.conformance import check
from attnspec.conformance.claims.clauses import SPEC_DIR
from attnspec.reference import apply_rope
from attnspec.reference.rope_tolerance import rope_error_bound
from attnspec.reference.tolerance import UNDERFLOW_THRESHOLD, UNIT_ROUNDOFF

DTYPES = ("float16", "float32", "float64")
NUMPY_DTYPE = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


# --- the reference: partial rotary dimensions -------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_partial_rotary_rotates_the_first_r_features_with_frequencies_from_r(
    layout: str, cpu_backend: Backend
) -> None:
    """ROPE-1, on every CPU backend: with rotary_dim r the first r features are the
    oracle's RoPE of dimension r (theta_i = base^(-2i/r)), the others come back unchanged,
    bit for bit; and the ROPE-3 bound evaluates to the same numbers as on NumPy."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 10))
    positions = np.array([0, 4095])[:, None, None] + np.arange(5)
    xb, pb = cpu_backend.asarray(x, "float64"), cpu_backend.asarray(positions)
    out = cpu_backend.to_numpy(apply_rope(xb, pb, layout=layout, rotary_dim=6, base=500.0))
    np.testing.assert_allclose(
        out[..., :6],
        oracle.rope(x[..., :6], positions, base=500.0, layout=layout),
        rtol=0,
        atol=1e-12,
    )
    np.testing.assert_array_equal(out[..., 6:], x[..., 6:])
    full = cpu_backend.to_numpy(apply_rope(xb, pb, layout=layout, rotary_dim=10))
    np.testing.assert_array_equal(full, cpu_backend.to_numpy(apply_rope(xb, pb, layout=layout)))
    bound = rope_error_bound(xb, pb, dtype="float32", layout=layout, rotary_dim=6, base=500.0)
    on_numpy = rope_error_bound(
        x, positions, dtype="float32", layout=layout, rotary_dim=6, base=500.0
    )
    np.testing.assert_allclose(
        cpu_backend.to_numpy(bound.tolerance), np.asarray(on_numpy.tolerance), rtol=1e-12, atol=0
    )


@pytest.mark.parametrize(
    ("rotary_dim", "error", "message"),
    [
        (3, ValueError, "rotary_dim=3 with x.shape[-1]=8, but should be even, >= 2 and <= 8"),
        (10, ValueError, "rotary_dim=10 with x.shape[-1]=8, but should be even, >= 2 and <= 8"),
        (0, ValueError, "rotary_dim=0, but should be an int >= 2"),
        (True, ValueError, "rotary_dim=True, but should be an int >= 2"),
        (4.0, TypeError, "rotary_dim=4.0, but should be an int >= 2"),
    ],
)
def test_bad_rotary_dim_is_named(rotary_dim: object, error: type, message: str) -> None:
    """ROPE-1 (note): the reference names a rotary dimension that is odd, too large or not
    an int, and the clause it violates."""
    with pytest.raises(error, match=re.escape(message) + r".*ROPE-1"):
        apply_rope(np.zeros((3, 8)), rotary_dim=rotary_dim)  # type: ignore[arg-type]


# --- ROPE-3: the bound as displayed, and sound ------------------------------------------------


def _rope3_text() -> str:
    dense = (SPEC_DIR / "dense.md").read_text(encoding="utf-8")
    return dense.split('<a id="ROPE-3"></a>')[1].split("### How the conformance suite")[0]


DISPLAYED = (
    r"\tau_f = C\Big[(|a_i| + |b_i|)\big(\kappa_i\,|\varphi_i| + 4u_a + 2u_d\big) "
    r"+ 2u_d\,|y_f|\Big] + 3\sigma_d",
    r"\kappa_i = (3\,x_i + 6)\,u_a, \quad x_i = \tfrac{2i}{r}\ln \mathrm{base}",
    "$C = 4$",
)


@pytest.mark.parametrize("dtype", (*DTYPES, "bfloat16"))
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_displayed_bound_is_what_the_reference_evaluates(dtype: str, layout: str) -> None:
    """ROPE-3: the formula in dense.md, evaluated element by element with the constants of
    tolerance.md, equals rope_error_bound (rotary dim 6 of 8: the last two features exact)."""
    text = _rope3_text()
    for term in DISPLAYED:
        assert term in text, f"dense.md no longer displays {term}"
    u_d, u_a = UNIT_ROUNDOFF[dtype], min(UNIT_ROUNDOFF[dtype], 2.0**-24)
    sigma, base, r = UNDERFLOW_THRESHOLD[dtype], 300.0, 6
    rng = np.random.default_rng(5)
    x = np.round(rng.standard_normal((2, 4, 8)) * 8) / 8
    positions = np.array([[0, 1, 90, 70000]]).repeat(2, 0)
    y = oracle.rope(x[..., :r], positions, base=base, layout=layout)
    expected = np.zeros_like(x)
    for index in np.ndindex(*x.shape[:-1]):
        for i in range(r // 2):
            f, g = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + r // 2)
            a, b = x[(*index, f)], x[(*index, g)]
            phi = positions[index] * base ** (-2 * i / r)
            kappa = (3 * (2 * i / r) * math.log(base) + 6) * u_a
            for feature in (f, g):
                expected[(*index, feature)] = (
                    4
                    * (
                        (abs(a) + abs(b)) * (kappa * abs(phi) + 4 * u_a + 2 * u_d)
                        + 2 * u_d * abs(y[(*index, feature)])
                    )
                    + 3 * sigma
                )
    bound = rope_error_bound(x, positions, dtype=dtype, base=base, layout=layout, rotary_dim=r)
    np.testing.assert_allclose(np.asarray(bound.tolerance), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(np.asarray(bound.rotated)[..., :r], y, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(bound.rotated)[..., r:], x[..., r:])


def _worst_ratio(fn: object, dtype: str, starts: tuple[int, ...], head_dim: int = 128) -> float:
    """max |fn(x) - ROPE-1| / tau over a (len(starts), 2, 9, head_dim) problem whose
    decoding steps start at ``starts``, values N(0, 30^2) rounded to ``dtype``."""
    claim = fn.__attnspec__.rope  # type: ignore[attr-defined]
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((len(starts), 2, 9, head_dim)) * 30).astype(NUMPY_DTYPE[dtype])
    positions = np.asarray(starts)[:, None, None] + np.arange(9)
    actual = fn(x, positions).astype(np.float64)  # type: ignore[operator]
    bound = rope_error_bound(
        x.astype(np.float64),
        positions,
        dtype=dtype,
        base=claim.base,
        layout=claim.pairing,
        rotary_dim=claim.rotary_dim,
    )
    error, tolerance = np.abs(actual - np.asarray(bound.rotated)), np.asarray(bound.tolerance)
    assert np.all(error[tolerance == 0] == 0), "a feature beyond the rotary dim changed"
    return float(np.max(np.divide(error, tolerance, out=np.zeros_like(error), where=tolerance > 0)))


STARTS = (0, 1000, 4095, 32767, 131062)  # positions up to 2^17 - 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", catalogue.CORRECT, ids=lambda fn: fn.__name__)
def test_correct_formulations_stay_within_the_bound(fn: object, dtype: str) -> None:
    """ROPE-3 is sound: Hugging Face's rotate_half, Meta's complex pairs and GPT-NeoX's
    partial rotary, computed as they are (float32 angles for float16, cos/sin stored in the
    input dtype), stay within the bound at positions up to 2^17 with |x| ~ 30 (measured
    worst ratios: 0.11 in float16, 0.06 in float32 and float64)."""
    ratio = _worst_ratio(fn, dtype, STARTS)
    assert ratio <= 1, f"{fn.__name__} ({dtype}) reaches {ratio:.3g} of the ROPE-3 bound"  # type: ignore[attr-defined]


def test_the_bound_rejects_half_precision_angles_at_realistic_positions() -> None:
    """ROPE-3 has power where it matters: angles computed in float16 are outside the bound
    already for a decoding step at position 1000 (not only past float16's range)."""
    assert _worst_ratio(catalogue.rope_half_precision_angles, "float16", (1000,)) > 10


# --- ROPE-3 in bfloat16, through the suite too -------------------------------------------------


def test_pytorch_formulation_conforms_in_bfloat16_too() -> None:
    """ROPE-3 in every dtype the suite draws: Hugging Face's PyTorch RoPE passes both RoPE
    properties on the torch backend, bfloat16 included (cos and sin rounded to 8 bits)."""
    pytest.importorskip("torch", reason="the PyTorch check needs torch (scripts/setup)")
    report = check(
        catalogue.rope_rotate_half_torch,
        backend="torch",
        profile="quick",
        seed=0,
        only=["rope-shape-and-dtype", "rope-matches-reference"],
    )
    assert {v.property: v.status for v in report.verdicts} == {
        "rope-shape-and-dtype": "passed",
        "rope-matches-reference": "passed",
    }
    torch = backend_or_skip("torch")
    rng = np.random.default_rng(11)
    x = torch.to_numpy(torch.asarray(rng.standard_normal((5, 2, 9, 128)) * 30, "bfloat16"))
    positions = np.asarray(STARTS)[:, None, None] + np.arange(9)
    actual = torch.to_numpy(
        catalogue.rope_rotate_half_torch(torch.asarray(x, "bfloat16"), torch.asarray(positions))
    )
    bound = rope_error_bound(x.astype(np.float64), positions, dtype="bfloat16", layout="half")
    ratio = np.abs(actual.astype(np.float64) - bound.rotated) / bound.tolerance
    assert ratio.max() <= 1, ratio.max()  # measured 0.12 at positions up to 2^17
