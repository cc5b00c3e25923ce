"""The backward reference (spec/backward.md) against autodiff of the forward reference and
an independent NumPy loop, on every CPU backend; its conventions checked one by one.

Every comparison is within the BWD-17 bound of ``reference.tolerance_backward`` for the
dtype computed in (float64 here: the bound of a float64 kernel, which also covers the
other float64 evaluation's own rounding, as TOL-2's factor C does).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import oracle_backward
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import backend_or_skip, drawn

from attnspec.backends import REFERENCE_CONFIG, Backend
from attnspec.reference import scaled_dot_product_attention, sliding_window_mask, varlen_attention
from attnspec.reference.backward import (
    blocked_attention_backward,
    scaled_dot_product_attention_backward,
    varlen_attention_backward,
)
from attnspec.reference.tolerance_backward import gradient_error_bound

NAMES = ("dq", "dk", "dv", "dbias")


def _assert_within(got: Any, bound: Any, what: str) -> None:
    """Every gradient within its BWD-17 tolerance of the bound's float64 gradients."""
    for name, value, reference, tolerance in zip(NAMES, got, bound[:4], bound[4:], strict=True):
        if reference is None:
            assert value is None, (what, name)
            continue
        value = np.asarray(value, dtype=np.float64)
        assert value.shape == reference.shape, (what, name, value.shape, reference.shape)
        assert np.all(np.isfinite(value)), (what, name)
        excess = np.abs(value - reference) - tolerance
        assert np.all(excess <= 0), (what, name, float(np.max(excess)))


@st.composite
def problems(draw: st.DrawFn) -> dict[str, Any]:
    """Small problems with every feature: batch broadcasting, GQA, Lq != Lk, masks with
    blank rows, broadcast biases with -inf, both causal alignments, explicit scales,
    softcap, ALiBi, dropout keep masks and an upstream log-sum-exp gradient."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    batch = draw(st.sampled_from([(), (2,), (2, 1)]), label="batch")
    n_kv, group = draw(st.integers(1, 2), label="Hkv"), draw(st.integers(1, 3), label="G")
    n_q, n_k = draw(st.integers(1, 6), label="Lq"), draw(st.integers(1, 6), label="Lk")
    dim, value_dim = draw(st.integers(1, 4), label="E"), draw(st.integers(1, 3), label="Ev")
    heads = n_kv * group
    k_batch = (*batch[:-1], 1) if batch and draw(st.booleans(), label="k broadcast") else batch
    problem: dict[str, Any] = {
        "q": rng.standard_normal((*batch, heads, n_q, dim)) * 2,
        "k": rng.standard_normal((*k_batch, n_kv, n_k, dim)) * 2,
        "v": rng.standard_normal((*batch, n_kv, n_k, value_dim)),
        "grad_out": rng.standard_normal((*batch, heads, n_q, value_dim)),
    }
    scores_shape = (*batch, heads, n_q, n_k)
    if draw(st.booleans(), label="mask"):
        mask = rng.random(scores_shape) < 0.7
        if draw(st.booleans(), label="blank row"):
            mask[..., 0, :] = False  # a query that may attend nothing (BWD-4)
        problem["mask"] = mask
    if draw(st.booleans(), label="bias"):
        shape = draw(st.sampled_from([scores_shape, (heads, n_q, n_k), (1, n_q, n_k), (n_k,)]))
        bias = rng.standard_normal(shape)
        if draw(st.booleans(), label="-inf"):
            bias[..., -1] = -np.inf
        problem["bias"] = bias
    if draw(st.booleans(), label="causal"):
        problem["is_causal"] = True
        problem["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.booleans(), label="scale"):
        problem["scale"] = draw(st.sampled_from([0.3, -1.5, 2.0]))
    if draw(st.booleans(), label="softcap"):
        problem["softcap"] = draw(st.sampled_from([0.7, 3.0]))
    if draw(st.booleans(), label="alibi"):
        problem["alibi_slopes"] = rng.random((heads,))
    if draw(st.booleans(), label="dropout"):
        problem["dropout_p"] = 0.25
        problem["dropout_keep"] = rng.random(scores_shape) < 0.75
    if draw(st.booleans(), label="grad_lse"):
        problem["grad_lse"] = rng.standard_normal(scores_shape[:-1])
    return problem


def _forward_options(problem: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in problem.items() if k not in ("q", "k", "v", "grad_out", "grad_lse")}


OPERANDS = ("q", "k", "v", "grad_out")  # a backward's positional arguments, in order


def _operands(problem: dict[str, Any]) -> list[Any]:
    return [problem[name] for name in OPERANDS]


def _backward_options(problem: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in problem.items() if k not in OPERANDS}


def _bound(problem: dict[str, Any], dtype: str = "float64") -> Any:
    return gradient_error_bound(*_operands(problem), dtype=dtype, **_backward_options(problem))


def _normals(rng: np.random.Generator, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    """A standard normal array of each shape, drawn from ``rng`` in turn."""
    return [rng.standard_normal(shape) for shape in shapes]


def _torch_autograd(problem: dict[str, Any]) -> tuple[Any, ...]:
    """BWD-1 by torch.autograd through the forward reference on torch float64 tensors."""
    torch = pytest.importorskip("torch", reason="torch.autograd is the independent VJP")
    leaves = {
        name: torch.tensor(problem[name], requires_grad=True)
        for name in ("q", "k", "v", "bias")
        if name in problem
    }
    options = {
        key: torch.tensor(value) if isinstance(value, np.ndarray) else value
        for key, value in _forward_options(problem).items()
        if key != "bias"
    }
    out, lse = scaled_dot_product_attention(
        leaves["q"], leaves["k"], leaves["v"], bias=leaves.get("bias"), return_lse=True, **options
    )
    loss = (out * torch.tensor(problem["grad_out"])).sum()
    if "grad_lse" in problem:  # -inf rows are constants: d(lse) reaches nothing (BWD-4)
        finite = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        loss = loss + (finite * torch.tensor(problem["grad_lse"])).sum()
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    pairs = zip(names, grads, strict=True)
    found = {n: (torch.zeros_like(leaves[n]) if g is None else g).numpy() for n, g in pairs}
    return found["q"], found["k"], found["v"], found.get("bias")


@drawn(60)
@given(problems())
def test_matches_torch_autograd_of_the_forward(problem: dict[str, Any]) -> None:
    """BWD-1, BWD-2, BWD-6, BWD-7, BWD-8, BWD-9, BWD-10: the reference's gradients equal
    torch.autograd's VJP of the forward reference (float64) with every feature drawn."""
    bound = _bound(problem)
    _assert_within(_torch_autograd(problem), bound, "torch.autograd")
    got = scaled_dot_product_attention_backward(*_operands(problem), **_backward_options(problem))
    _assert_within(got, bound, "reference")


def _full(problem: dict[str, Any]) -> dict[str, Any]:
    """The problem with every array at its full shape, for the loop oracle."""
    q, k, v = problem["q"], problem["k"], problem["v"]
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    heads, n_q, n_k = q.shape[-3], q.shape[-2], k.shape[-2]
    scores = (*batch, heads, n_q, n_k)

    def flat(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(a, shape).reshape((-1, *shape[-3:]))

    allowed = (
        np.ones(scores, bool) if "mask" not in problem else np.broadcast_to(problem["mask"], scores)
    )
    if problem.get("is_causal"):
        offset = 0 if problem.get("causal_alignment", "top_left") == "top_left" else n_k - n_q
        allowed = allowed & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset)
    return {
        "q": flat(q, (*batch, *q.shape[-3:])),
        "k": flat(k, (*batch, *k.shape[-3:])),
        "v": flat(v, (*batch, *v.shape[-3:])),
        "grad_out": flat(problem["grad_out"], (*batch, *problem["grad_out"].shape[-3:])),
        "allowed": flat(allowed, scores),
        "bias": None if "bias" not in problem else flat(problem["bias"], scores),
        "keep": None if "dropout_keep" not in problem else flat(problem["dropout_keep"], scores),
        "grad_lse": None
        if "grad_lse" not in problem
        else problem["grad_lse"].reshape((-1, heads, n_q)),
    }


@drawn(40)
@given(problems())
def test_matches_the_loop_oracle(problem: dict[str, Any]) -> None:
    """BWD-1, BWD-2, BWD-3, BWD-4, BWD-7, BWD-9, BWD-10: the reference equals a plain
    NumPy loop written from the chain rule (tests/oracle_backward.py), without ALiBi."""
    problem.pop("alibi_slopes", None)
    full = _full(problem)
    dq, dk, dv, dbias = oracle_backward.gradients(
        full["q"],
        full["k"],
        full["v"],
        full["grad_out"],
        allowed=full["allowed"],
        bias=full["bias"],
        scale=problem.get("scale"),
        softcap=problem.get("softcap"),
        keep=full["keep"],
        dropout_p=problem.get("dropout_p", 0.0),
        grad_lse=full["grad_lse"],
    )
    bound = _bound(problem)

    def folded(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        batch = a.reshape(
            (*np.broadcast_shapes(*(problem[n].shape[:-3] for n in "qkv")), *a.shape[-3:])
        )
        extra = batch.ndim - len(shape)
        summed = batch.sum(axis=tuple(range(extra))) if extra else batch
        axes = tuple(i for i, s in enumerate(shape) if s == 1 and summed.shape[i] != 1)
        return summed.sum(axis=axes, keepdims=True) if axes else summed

    gradients = [
        folded(dq, problem["q"].shape),
        folded(dk, problem["k"].shape),
        folded(dv, problem["v"].shape),
    ]
    gradients.append(None if "bias" not in problem else folded(dbias, problem["bias"].shape))
    _assert_within(gradients, bound, "loop oracle")


@drawn(30)
@given(problems(), st.integers(1, 7), st.integers(1, 7))
def test_blocked_equals_plain(problem: dict[str, Any], chunk: int, block: int) -> None:
    """BWD-1 … BWD-4, BWD-10: FlashAttention 2's blocked backward (weights recomputed from
    the log-sum-exp per key block) equals the plain one, for every block size."""
    for feature in ("softcap", "alibi_slopes", "dropout_p", "dropout_keep"):
        problem.pop(feature, None)  # the blocked forward takes mask, bias, causal, scale
    got = blocked_attention_backward(
        *_operands(problem), query_chunk=chunk, key_block=block, **_backward_options(problem)
    )
    _assert_within(got, _bound(problem), "blocked")


def test_blocked_uses_the_given_statistics() -> None:
    """BWD-10: given the forward's output and log-sum-exp, the blocked backward uses them
    (D from the output, weights exp(s - lse)): a shifted lse scales every weight."""
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal((2, 5, 3)) for _ in range(4))
    out, lse = scaled_dot_product_attention(q, k, v, return_lse=True)
    plain = scaled_dot_product_attention_backward(q, k, v, do)
    given_stats = blocked_attention_backward(q, k, v, do, out=out, lse=lse, key_block=2)
    np.testing.assert_allclose(given_stats.dv, plain.dv, rtol=1e-12, atol=1e-13)
    shifted = blocked_attention_backward(q, k, v, do, out=out, lse=lse + np.log(2.0), key_block=2)
    np.testing.assert_allclose(shifted.dv, plain.dv / 2, rtol=1e-12, atol=1e-13)


def _every_backend_problem() -> dict[str, Any]:
    """GQA, a batch-broadcast mask and a head-broadcast bias, bottom-right causal with
    Lq != Lk, softcap and an upstream dLSE: the problem every CPU backend runs."""
    rng = np.random.default_rng(7)
    return {
        "q": rng.standard_normal((2, 4, 5, 3)),
        "k": rng.standard_normal((2, 2, 6, 3)),
        "v": rng.standard_normal((2, 2, 6, 2)),
        "grad_out": rng.standard_normal((2, 4, 5, 2)),
        "bias": rng.standard_normal((4, 5, 6)),
        "mask": rng.random((2, 1, 5, 6)) < 0.8,
        "is_causal": True,
        "causal_alignment": "bottom_right",
        "softcap": 2.0,
        "grad_lse": rng.standard_normal((2, 4, 5)),
    }


def _on_backend(backend: Backend, problem: dict[str, Any], dtype: str) -> dict[str, Any]:
    """``problem``'s arrays on ``backend``, in ``dtype`` (masks stay bool)."""
    return {
        name: backend.asarray(value, dtype=dtype if value.dtype != bool else None)
        if isinstance(value, np.ndarray)
        else value
        for name, value in problem.items()
    }


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_backend_gives_the_same_gradients(cpu_backend: Backend, dtype: str) -> None:
    """BWD-1, BWD-13: the reference runs on every CPU backend (array-api-strict included),
    returns each gradient in its input's dtype, within the bound of the dtype it ran in."""
    moved = _on_backend(cpu_backend, _every_backend_problem(), dtype)
    seen = {
        name: np.asarray(
            cpu_backend.to_numpy(value),
            dtype=np.float64 if value.dtype != cpu_backend.xp.bool else bool,
        )
        if name in moved and not isinstance(value, (bool, str, float))
        else value
        for name, value in moved.items()
    }
    got = scaled_dot_product_attention_backward(
        moved["q"], moved["k"], moved["v"], moved["grad_out"], **_backward_options(moved)
    )
    for name, gradient in zip(NAMES, got, strict=True):
        source = moved["bias" if name == "dbias" else name[1]]
        assert gradient.dtype == source.dtype, (name, gradient.dtype)
    _assert_within([cpu_backend.to_numpy(g) for g in got], _bound(seen, dtype), cpu_backend.name)


def test_jax_vjp_of_the_forward() -> None:
    """BWD-1, BWD-10: jax.vjp of the forward reference (x64), through Backend.vjp, equals
    the reference (the reference branches on values, so it is not jitted)."""
    backend = backend_or_skip("jax", REFERENCE_CONFIG.get("jax"))

    rng = np.random.default_rng(11)
    problem = {
        "q": rng.standard_normal((6, 4, 3)),
        "k": rng.standard_normal((2, 5, 3)),
        "v": rng.standard_normal((2, 5, 2)),
        "grad_out": rng.standard_normal((6, 4, 2)),
        "bias": rng.standard_normal((6, 4, 5)),
        "grad_lse": rng.standard_normal((6, 4)),
    }
    mask = rng.random((6, 4, 5)) < 0.7
    mask[0, 1] = False
    problem["mask"] = mask

    def forward(q: Any, k: Any, v: Any, bias: Any) -> Any:
        out, lse = scaled_dot_product_attention(
            q,
            k,
            v,
            bias=bias,
            mask=backend.asarray(mask),
            is_causal=True,
            softcap=1.5,
            return_lse=True,
        )
        return out, backend.xp.where(backend.xp.isfinite(lse), lse, 0.0)

    primals = [backend.asarray(problem[n], dtype="float64") for n in ("q", "k", "v", "bias")]
    upstream = (backend.asarray(problem["grad_out"]), backend.asarray(problem["grad_lse"]))
    _, grads = backend.vjp(forward, tuple(primals), upstream)
    problem.update(is_causal=True, softcap=1.5)
    _assert_within([np.asarray(g) for g in grads], _bound(problem), "jax.vjp")


def test_excluded_keys_get_exactly_zero() -> None:
    """BWD-3, BWD-12: keys no query may attend (masked, causally excluded, biased to -inf,
    outside a sliding window) get dk = dv = 0 exactly, and every excluded pair dbias = 0
    exactly, in the plain and the blocked backward."""
    rng = np.random.default_rng(5)
    q, k, v, do = _normals(rng, (2, 8, 4), (1, 12, 4), (1, 12, 3), (2, 8, 3))
    window = sliding_window_mask(8, 12, left=2, right=0, alignment="bottom_right", xp=np)
    window = np.asarray(window)
    bias = rng.standard_normal((2, 8, 12))
    bias[..., 0] = -np.inf
    for backward in (scaled_dot_product_attention_backward, blocked_attention_backward):
        g = backward(q, k, v, do, mask=window, bias=bias)
        unreached = ~window.any(axis=0)
        unreached[0] = True  # the -inf bias column
        assert np.all(g.dk[0, unreached] == 0) and np.all(g.dv[0, unreached] == 0), backward
        assert np.all(g.dbias[:, ~window] == 0) and np.all(g.dbias[..., 0] == 0), backward
        assert np.any(g.dk[0, ~unreached] != 0), backward  # reached keys do get gradients
    causal = scaled_dot_product_attention_backward(q, k, v, do, is_causal=True)
    assert np.all(causal.dk[0, 8:] == 0) and np.all(causal.dv[0, 8:] == 0)


def test_fully_masked_rows_have_zero_gradients() -> None:
    """BWD-4: rows with no allowed key (masked, all -inf bias, top-left causal with
    Lq > Lk in bottom-right alignment, Lk = 0) give dq = 0 exactly and no NaN, whatever
    their upstream gradients, in the plain and the blocked backward."""
    rng = np.random.default_rng(9)
    q, k, v = _normals(rng, (3, 6, 4), (3, 4, 4), (3, 4, 2))
    do, dl = rng.standard_normal((3, 6, 2)) * 100, rng.standard_normal((3, 6)) * 100
    mask = rng.random((3, 6, 4)) < 0.8
    mask[:, 2] = False
    for backward in (scaled_dot_product_attention_backward, blocked_attention_backward):
        g = backward(q, k, v, do, grad_lse=dl, mask=mask)
        assert np.all(g.dq[:, 2] == 0) and all(np.all(np.isfinite(x)) for x in g[:3])
        late = backward(q, k, v, do, grad_lse=dl, is_causal=True, causal_alignment="bottom_right")
        assert np.all(late.dq[:, :2] == 0) and all(np.all(np.isfinite(x)) for x in late[:3])
        empty = backward(q, k[:, :0], v[:, :0], do, grad_lse=dl)
        assert np.all(empty.dq == 0) and empty.dk.shape == (3, 0, 4)
    without = scaled_dot_product_attention_backward(q, k, v, do * 0, mask=mask)
    with_row = scaled_dot_product_attention_backward(
        q, k, v, np.where(np.arange(6)[:, None] == 2, do, 0), mask=mask
    )
    assert np.array_equal(without.dk, with_row.dk), "an empty row must add nothing to dk"


@pytest.mark.parametrize("length", [192, 65])
def test_rows_with_very_low_log_sum_exp_are_finite(length: int) -> None:
    """BWD-5: every score about -120 (log-sum-exp below -88.7, as in PyTorch #196678) with
    a mask, at L % 128 == 64, and keys padded with float32's most negative bias: finite
    gradients within the bound, plain and blocked with blocks of 128."""
    rng = np.random.default_rng(13)
    dim = 16
    q = rng.standard_normal((1, length, dim)) * 0.1
    k = rng.standard_normal((1, length, dim)) * 0.1
    q[..., 0], k[..., 0] = 1.0, -120 * np.sqrt(dim)
    v, do = rng.standard_normal((1, length, dim)), rng.standard_normal((1, length, dim))
    mask = np.tril(np.ones((length, length), bool))
    bias = np.zeros((1, 1, length))
    bias[..., -3:] = np.finfo(np.float32).min
    problem = {"q": q, "k": k, "v": v, "grad_out": do, "mask": mask, "bias": bias}
    _, lse = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, return_lse=True)
    assert np.all(lse < -88.7)
    bound = _bound(problem, "float32")
    _assert_within(
        scaled_dot_product_attention_backward(q, k, v, do, mask=mask, bias=bias), bound, "plain"
    )
    blocked = blocked_attention_backward(
        q, k, v, do, mask=mask, bias=bias, query_chunk=128, key_block=128
    )
    _assert_within(blocked, bound, "blocked")


def test_gqa_and_batch_broadcast_sum_the_shared_heads() -> None:
    """BWD-2: dk, dv of a key/value head shared by G query heads (and by a broadcast batch)
    are the sums of the gradients of G separate copies, exactly as repeating k, v makes them
    (SDPA-6.1: query head h reads head h // G)."""
    rng = np.random.default_rng(17)
    q, k, v, do = _normals(rng, (2, 6, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3), (2, 6, 3, 3))
    shared = scaled_dot_product_attention_backward(q, k, v, do)
    repeated_k = np.broadcast_to(np.repeat(k, 3, axis=1), (2, 6, 5, 4)).copy()
    repeated_v = np.broadcast_to(np.repeat(v, 3, axis=1), (2, 6, 5, 3)).copy()
    copies = scaled_dot_product_attention_backward(q, repeated_k, repeated_v, do)
    summed_k = copies.dk.reshape(2, 2, 3, 5, 4).sum(axis=(0, 2))[None]
    summed_v = copies.dv.reshape(2, 2, 3, 5, 3).sum(axis=(0, 2))[None]
    np.testing.assert_allclose(shared.dk, summed_k, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(shared.dv, summed_v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(shared.dq, copies.dq, rtol=1e-12, atol=1e-12)
    wrong = copies.dk.reshape(2, 3, 2, 5, 4).sum(axis=(0, 1))[None]  # h mod Hkv grouping
    assert not np.allclose(shared.dk, wrong)


def test_bias_gradient_is_reduced_over_its_broadcast_dims() -> None:
    """BWD-2: a bias broadcast over batch, heads and queries gets dS summed over them, in
    its own shape; the blocked backward agrees."""
    rng = np.random.default_rng(19)
    q, k, v, do = _normals(rng, (2, 3, 4, 2), (2, 3, 5, 2), (2, 3, 5, 2), (2, 3, 4, 2))
    full_bias = np.broadcast_to(rng.standard_normal((1, 5)), (2, 3, 4, 5)).copy()
    full = scaled_dot_product_attention_backward(q, k, v, do, bias=full_bias, is_causal=True)
    small = scaled_dot_product_attention_backward(
        q, k, v, do, bias=full_bias[0, 0, :1], is_causal=True
    )
    assert small.dbias.shape == (1, 5)
    np.testing.assert_allclose(
        small.dbias, full.dbias.sum(axis=(0, 1, 2))[None], rtol=1e-12, atol=1e-12
    )
    blocked = blocked_attention_backward(
        q, k, v, do, bias=full_bias[0, 0, :1], is_causal=True, query_chunk=3, key_block=2
    )
    np.testing.assert_allclose(blocked.dbias, small.dbias, rtol=1e-12, atol=1e-12)


def test_repeated_calls_are_bitwise_identical(cpu_backend: Backend) -> None:
    """BWD-15: the reference's backward is deterministic: identical inputs, identical bits,
    for dq, dk, dv and the bias's gradient, on the float32 problem of
    test_every_backend_gives_the_same_gradients (GQA, mask, bias, causal, softcap, dLSE),
    whose operations JAX has compiled there already (issue 33: 39 compilations before)."""
    moved = _on_backend(cpu_backend, _every_backend_problem(), "float32")
    operands = [moved[name] for name in OPERANDS]
    first = scaled_dot_product_attention_backward(*operands, **_backward_options(moved))
    second = scaled_dot_product_attention_backward(*operands, **_backward_options(moved))
    for name, a, b in zip(NAMES, first, second, strict=True):
        assert np.array_equal(cpu_backend.to_numpy(a), cpu_backend.to_numpy(b)), name


def test_varlen_gradients_stay_in_their_sequence() -> None:
    """BWD-11: packed gradients equal torch.autograd through the packed forward reference,
    and changing one sequence's upstream gradient changes no other sequence's gradient."""
    torch = pytest.importorskip("torch", reason="torch.autograd is the independent VJP")
    rng = np.random.default_rng(29)
    cu_q, cu_k = np.array([0, 3, 3, 7]), np.array([0, 2, 5, 9])
    q, k, v = _normals(rng, (7, 4, 3), (9, 2, 3), (9, 2, 2))
    do, dl = rng.standard_normal((7, 4, 2)), rng.standard_normal((4, 7))
    options = {"is_causal": True, "causal_alignment": "bottom_right", "softcap": 2.0}
    got = varlen_attention_backward(q, k, v, cu_q, cu_k, do, grad_lse=dl, **options)
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    out, lse = varlen_attention(
        *leaves, torch.tensor(cu_q), torch.tensor(cu_k), return_lse=True, **options
    )
    loss = (out * torch.tensor(do)).sum() + (lse * torch.tensor(dl)).sum()
    for mine, theirs in zip(got[:3], torch.autograd.grad(loss, leaves), strict=True):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-10, atol=1e-12)
    changed = do.copy()
    changed[:3] += 1.0  # sequence 0's queries
    moved = varlen_attention_backward(q, k, v, cu_q, cu_k, changed, grad_lse=dl, **options)
    assert np.array_equal(moved.dq[3:], got.dq[3:]) and np.array_equal(moved.dk[2:], got.dk[2:])
    assert not np.array_equal(moved.dk[:2], got.dk[:2])


def test_bad_upstream_gradients_are_rejected() -> None:
    """BWD-1: an upstream gradient of the wrong shape or dtype raises, naming it."""
    q = k = v = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"grad_out\.shape"):
        scaled_dot_product_attention_backward(q, k, v, np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match=r"grad_lse\.shape"):
        scaled_dot_product_attention_backward(q, k, v, np.zeros((2, 3, 4)), grad_lse=np.zeros(3))
    with pytest.raises(TypeError, match=r"grad_out\.dtype"):
        blocked_attention_backward(q, k, v, np.zeros((2, 3, 4), dtype=np.int32))
    with pytest.raises(ValueError, match=r"lse\.shape"):
        blocked_attention_backward(q, k, v, np.zeros((2, 3, 4)), lse=np.zeros((2, 4)))


@pytest.mark.parametrize(
    ("pattern", "params"),
    [
        ("sliding_window", {"left": 3, "right": 1}),
        ("block_sparse", {"layout": [[True, False, False], [False, True, False]], "block_size": 4}),
    ],
)
def test_sparse_kernels_gradients_are_the_masked_dense_ones(
    pattern: str, params: dict[str, Any]
) -> None:
    """BWD-12, BWD-3: torch.autograd through the reference's sparse kernel (which never reads
    excluded keys) equals the dense backward with the pattern's mask, and keys no query of
    the pattern reaches get exactly 0."""
    torch = pytest.importorskip("torch", reason="torch.autograd is the independent VJP")
    from attnspec.reference import sparse_attention, sparse_mask

    rng = np.random.default_rng(37)
    q, k, v, do = _normals(rng, (2, 8, 3), (2, 12, 3), (2, 12, 2), (2, 8, 2))
    options = {"alignment": "bottom_right", **params} if pattern == "sliding_window" else params
    mask = np.asarray(sparse_mask(pattern, 8, 12, xp=np, **options))
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = sparse_attention(*leaves, pattern=pattern, **options)
    grads = torch.autograd.grad(out, leaves, torch.tensor(do))
    dense = scaled_dot_product_attention_backward(q, k, v, do, mask=mask)
    problem = {"q": q, "k": k, "v": v, "grad_out": do, "mask": mask}
    _assert_within([g.numpy() for g in grads] + [None], _bound(problem), pattern)
    _assert_within(dense, _bound(problem), pattern)
    unreached = ~mask.any(axis=0)
    assert unreached.any(), "the pattern leaves some key unreached"
    assert np.all(grads[1].numpy()[:, unreached] == 0) and np.all(dense.dk[:, unreached] == 0)
