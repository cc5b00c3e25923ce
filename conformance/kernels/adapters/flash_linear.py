"""flash-linear-attention's recurrences (spec/recurrent.md, section 7) as matrix rows: each
row is the library's own function, declared as ``attnspec check`` flags declare it, with no
wrapper of ours.

The naive PyTorch forms (``fla.ops.*.naive``, the references the library tests its Triton
kernels against; CPU) and the Triton kernels (``chunk_gated_delta_rule``,
``fused_recurrent_gated_delta_rule``; the GPU run) take ``[B, T, H, K]`` arrays, ``g`` as
natural-log decays ``[B, T, H]`` (or ``[B, T, H, K]`` per key channel), ``beta [B, T, H]``,
``initial_state [B, H, K, V]``, and return ``(o, final_state)``, the final state only with
``output_final_state=True``.  So a row is ``--layout blhd --kwarg output_final_state=True``
with its ``--recurrent`` claims (the rule, the gate's shape, the largest chunk, its
``chunk_size=`` values, value-head groups), and ``--rename g=gk`` for ``naive_recurrent_gla``;
``delta_rule_recurrence`` alone takes the spec's heads-first layout.  A row is built when it
is first read (importing ``fla`` imports Triton, which must be installed even on a CPU).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...call.layouts import from_layout, rename_arguments
from ...claims.family_claims import RecurrentClaim

# what fla computes in: its Triton kernels take float16, bfloat16 and float32 (its naive
# forms cast to float32, so a float64 input would be computed in float32: not claimed)
FLA_DTYPES = ("float16", "bfloat16", "float32")
CHUNK_SIZES = (16, 32, 64)


@dataclass(frozen=True)
class Row:
    """One fla function and the flags that declare it: ``module:function``, its layout,
    its renames (spec name -> fla's) and its recurrent claim; ``device``: where it runs
    (the Triton kernels' rows, "cuda", join the GPU run); ``keywords``: its own switches
    passed as True besides ``output_final_state`` (``use_qk_l2norm_in_kernel``)."""

    target: str
    claim: RecurrentClaim
    layout: str = "blhd"
    rename: tuple[tuple[str, str], ...] = ()
    device: str = "cpu"
    keywords: tuple[str, ...] = ()  # its own flags set True on every call (--kwarg NAME=True)

    def flags(self) -> list[str]:
        """The ``attnspec check`` flags that declare the row (with its target, the
        check of the library's function that the row is)."""
        claim = self.claim
        flags = ["--recurrent", claim.rule, "--recurrent-chunk-size", str(claim.chunk_size)]
        if claim.gate == "channel":
            flags += ["--recurrent-gate", "channel"]
        if claim.qk_l2norm is not None:
            flags += ["--recurrent-qk-l2norm", str(claim.qk_l2norm)]
        if claim.chunk_sizes:
            flags += ["--recurrent-chunk-sizes", ",".join(map(str, claim.chunk_sizes))]
        flags += [
            flag
            for flag, claimed in (
                ("--recurrent-rounded-operands", claim.rounded_operands),
                ("--recurrent-varlen", claim.varlen),
                ("--recurrent-value-groups", claim.value_groups),
            )
            if claimed
        ]
        for spec_name, theirs in self.rename:
            flags += ["--rename", f"{spec_name}={theirs}"]
        flags += ["--layout", self.layout]
        for keyword in self.switches():
            flags += ["--kwarg", f"{keyword}=True"]
        return [*flags, "--dtype", ",".join(FLA_DTYPES)]

    def switches(self) -> tuple[str, ...]:
        """The keywords the row passes as True on every call."""
        return ("output_final_state", *self.keywords)


def _naive(module: str, function: str, claim: RecurrentClaim, **options: Any) -> Row:
    return Row(f"fla.ops.{module}.naive:{function}", claim, **options)


def _chunked(rule: str, gate: str = "head", **more: Any) -> RecurrentClaim:
    return RecurrentClaim(rule, gate, 64, chunk_sizes=CHUNK_SIZES, **more)


ROWS: dict[str, Row] = {
    "naive_recurrent_gated_delta_rule": _naive(
        "gated_delta_rule",
        "naive_recurrent_gated_delta_rule",
        RecurrentClaim("gated_delta", "head", 1),
    ),
    "naive_chunk_gated_delta_rule": _naive(
        "gated_delta_rule", "naive_chunk_gated_delta_rule", _chunked("gated_delta")
    ),
    "delta_rule_recurrence": _naive(
        "delta_rule", "delta_rule_recurrence", RecurrentClaim("delta", "head", 1), layout="bhld"
    ),
    "naive_recurrent_gla": _naive(
        "gla",
        "naive_recurrent_gla",
        RecurrentClaim("gated", "channel", 1),
        rename=(("g", "gk"),),
    ),
    "naive_recurrent_simple_gla": _naive(
        "simple_gla", "naive_recurrent_simple_gla", RecurrentClaim("gated", "head", 1)
    ),
    "naive_chunk_simple_gla": _naive("simple_gla", "naive_chunk_simple_gla", _chunked("gated")),
    "naive_recurrent_kda": _naive(
        "kda",
        "naive_recurrent_kda",
        RecurrentClaim("gated_delta", "channel", 1, value_groups=True),
    ),
    "naive_chunk_kda": _naive(
        "kda", "naive_chunk_kda", _chunked("gated_delta", "channel", value_groups=True)
    ),
    "naive_recurrent_linear_attn": _naive(
        "linear_attn", "naive_recurrent_linear_attn", RecurrentClaim("linear", "head", 1)
    ),
    # the GPU run's (scripts/gpu-check): Triton kernels, operands of products in the input
    # dtype (u_p of REC-6.2), packed sequences by cu_seqlens, value-head groups (GVA)
    "chunk_gated_delta_rule": Row(
        "fla.ops.gated_delta_rule:chunk_gated_delta_rule",
        RecurrentClaim("gated_delta", "head", 64, True, True, value_groups=True),
        device="cuda",
    ),
    "fused_recurrent_gated_delta_rule": Row(
        "fla.ops.gated_delta_rule:fused_recurrent_gated_delta_rule",
        RecurrentClaim("gated_delta", "head", 1, True, True, value_groups=True),
        device="cuda",
    ),
}


def library_function(target: str) -> Callable[..., Any]:
    """``module:function`` imported."""
    module, _, name = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def declare_row(row: Row) -> Callable[..., Any]:
    """``row``'s function in the spec's convention, declared: what ``attnspec check TARGET
    --layout L --rename ... --kwarg output_final_state=True --recurrent ...`` checks."""
    fn = library_function(row.target)
    if row.rename:
        fn = rename_arguments(fn, **dict(row.rename))
    return from_layout(
        fn,
        row.layout,
        recurrent=row.claim,
        dtypes=FLA_DTYPES,
        extra_kwargs=dict.fromkeys(row.switches(), True),
    )


def rows_by_name(rows: dict[str, Row], module: str) -> Callable[[str], Callable[..., Any]]:
    """A module's ``__getattr__`` (PEP 562) that builds each of ``rows`` once, when first
    read (``adapters.flash_linear:naive_chunk_kda``), and knows no other name."""

    @functools.cache
    def row(name: str) -> Callable[..., Any]:
        if name not in rows:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return declare_row(rows[name])

    return row


__getattr__ = rows_by_name(ROWS, __name__)
