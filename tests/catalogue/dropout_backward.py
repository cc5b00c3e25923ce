"""Backward passes with dropout for BWD-9: three correct ways of handing the backward the
keep indicators its forward call drew, and three buggy backward passes.

Every kernel is ``fn(q, k, v, *, is_causal=False, scale=None, dropout_p=0.0, seed=None)`` on
float32 torch tensors in the spec's layout (SDPA-1.1), drawing its keep indicators from a
generator seeded with ``seed`` (DROP-4), and declared with ``backward_dropout=True``:

- ``dropout_autograd``: torch.autograd of a plain forward, whose graph keeps the mask (as
  PyTorch's math SDPA's ``dropout`` does);
- ``dropout_flash2``: a custom ``torch.autograd.Function`` that saves the seed, not the mask,
  and regenerates the indicators in its backward, as FlashAttention's backward regenerates
  them from the Philox seed and offset its forward returned (``rng_state``);
- ``dropout_explicit``: the same backward as an explicit function in FlashAttention's
  convention (``--backward-fn``), given the forward's keywords, the seed among them.

The bugs (``DROPOUT_BUGS``), each in the Function's backward: a backward that draws a mask
of its own (a generator advanced past the forward's draw instead of reset to its state), one
that ignores the mask (differentiates the undropped forward), one that keeps the mask but
not its rescaling by 1/(1 - p).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnspec.conformance import declare
from catalogue.backward import BackwardBug

DROPOUT_CLAIMS: dict[str, Any] = dict(
    mask=False,
    dtypes=("float32",),
    batch_ndim=1,
    dropout=True,
    backward=True,
    backward_dropout=True,
)


def _scores(q: Any, k: Any, is_causal: bool, scale: float | None) -> Any:
    """The scaled scores, causally excluded keys at -inf (top-left, SDPA-4.1)."""
    alpha = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * alpha
    if is_causal:
        n_queries, n_keys = s.shape[-2:]
        allowed = torch.arange(n_keys)[None, :] <= torch.arange(n_queries)[:, None]
        s = s.masked_fill(~allowed, -math.inf)
    return s


def _keep(seed: int | None, shape: tuple[int, ...], dropout_p: float, draws: int = 1) -> Any:
    """The keep indicators of ``seed`` (DROP-3); ``draws`` > 1: the generator's later
    draw, a mask other than the forward's."""
    generator = torch.Generator()
    generator.manual_seed(0 if seed is None else seed)
    draws_before = [torch.rand(shape, generator=generator) for _ in range(draws - 1)]
    del draws_before  # the forward's draw, for a mask after it
    return torch.rand(shape, generator=generator) >= dropout_p


def _call_options(
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
) -> tuple[bool, float | None, float, int | None]:
    """The keywords every kernel here takes, with their defaults."""
    return is_causal, scale, dropout_p, seed


def _plain_dropout_forward(q: Any, k: Any, v: Any, **call: Any) -> tuple[Any, Any]:
    """DROP-2's output and the log-sum-exp of the scores (LSE-1), differentiable."""
    is_causal, scale, dropout_p, seed = _call_options(**call)
    s = _scores(q, k, is_causal, scale)
    weights = torch.softmax(s, dim=-1)
    if dropout_p:
        weights = weights * _keep(seed, tuple(s.shape), dropout_p) / (1 - dropout_p)
    return weights @ v, torch.logsumexp(s, dim=-1)


def flash_dropout_backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, *, bug: str = "", **call: Any
) -> tuple[Any, Any, Any]:
    """FlashAttention 2's backward with dropout: P recomputed from the log-sum-exp, the
    indicators regenerated from the seed, W = xi P / (1 - p), dV = W^T dO,
    dP = (xi / (1 - p)) dO V^T, D = rowsum(dO * O) of the dropped output, dS = P (dP - D).
    ``bug`` names one step done wrong (:data:`DROPOUT_BUGS`); "" is the correct one."""
    is_causal, scale, dropout_p, seed = _call_options(**call)
    alpha = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, is_causal, scale)
    p = torch.exp(s - lse[..., None])
    rescale = torch.ones_like(p)
    if dropout_p and bug != "mask-ignored":
        keep = _keep(seed, tuple(p.shape), dropout_p, draws=2 if bug == "fresh-mask" else 1)
        rescale = keep / (1.0 if bug == "not-rescaled" else 1 - dropout_p)
    dv = (p * rescale).transpose(-1, -2) @ dout
    dp = (dout @ v.transpose(-1, -2)) * rescale
    ds = p * (dp - (dout * out).sum(-1, keepdim=True))
    return ds @ k * alpha, ds.transpose(-1, -2) @ q * alpha, dv


class _SeedSaved(torch.autograd.Function):
    """Forward: :func:`_plain_dropout_forward`, saving the seed (FlashAttention's
    ``rng_state``) rather than the mask; backward: :func:`flash_dropout_backward`."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, options: dict[str, Any]) -> Any:
        keywords = {key: value for key, value in options.items() if key != "bug"}
        out, lse = _plain_dropout_forward(q, k, v, **keywords)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options  # the seed, not the mask
        return out

    @staticmethod
    def backward(ctx: Any, dout: Any) -> Any:  # type: ignore[override]
        return (*flash_dropout_backward(dout, *ctx.saved_tensors, **ctx.options), None)


def _seed_saved(bug: str, name: str) -> Any:
    def kernel(q: Any, k: Any, v: Any, **options: Any) -> Any:
        return _SeedSaved.apply(q, k, v, {**options, "bug": bug})

    kernel.__name__ = kernel.__qualname__ = name
    return declare(kernel, **DROPOUT_CLAIMS)


def _plain(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """The output of :func:`_plain_dropout_forward`, differentiated by torch.autograd."""
    return _plain_dropout_forward(q, k, v, **options)[0]


dropout_autograd = declare(_plain, **DROPOUT_CLAIMS)
dropout_flash2 = _seed_saved("", "dropout_flash2")
dropout_explicit = declare(  # forward (out, lse); backward flash_dropout_backward, given the seed
    _plain_dropout_forward,
    **DROPOUT_CLAIMS,
    returns_lse=True,
    backward_fn="catalogue.dropout_backward:flash_dropout_backward",
)

CORRECT_DROPOUT_KERNELS = {
    "autograd": dropout_autograd,
    "flash2": dropout_flash2,
    "explicit": dropout_explicit,
}
DROPOUT_BUGS = (
    BackwardBug(
        "fresh-mask",
        "the backward draws a mask of its own (a generator not reset to the forward's state)",
        "gradients-dropout",
    ),
    BackwardBug(
        "mask-ignored", "the backward of the undropped forward (p = 0)", "gradients-dropout"
    ),
    BackwardBug(
        "not-rescaled", "the mask kept without its rescaling by 1/(1 - p)", "gradients-dropout"
    ),
)
BUGGY_DROPOUT = {bug.name: _seed_saved(bug.name, f"dropout_{bug.name}") for bug in DROPOUT_BUGS}
