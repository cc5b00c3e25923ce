"""Reproduction snippets: Python that rebuilds a failing input exactly and calls the kernel
on it as the suite did, ``fn(q, k, v, ...)``, then prints what the property compared.

The inputs are NumPy literals of the float64 values the kernel saw (already rounded to
the dtype under test), reshaped to their exact shape, so empty arrays come back with their
shape (``q(1, 0, 1)`` is ``np.array([]).reshape(1, 0, 1)``).  The line that loads the
kernel (:data:`LOADER_LINE`) is replaced by :class:`~attnspec.conformance.api.KernelSetup`
with the lines that rebuild the kernel as the check built it (layout, renames, claims).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .failures import PropertyFailure
    from .isolation import KernelInfo
    from .kernel import KernelUnderTest, Problem

LOADER_LINE = "kernel = KernelUnderTest.load("


def array_literal(a: np.ndarray) -> str:
    """``np.array([...], dtype=...).reshape(shape)``: exact values (repr of float64 round-
    trips), exact shape (empty and 0-d arrays too)."""
    dtype = "bool" if a.dtype == np.bool_ else f"np.{a.dtype}"
    return f"np.array({a.tolist()!r}, dtype={dtype}).reshape({tuple(a.shape)!r})"


def _value(value: Any) -> str:
    return f"np.{value!r}" if isinstance(value, np.generic) else repr(value)


def snippet(problem: Problem, kernel: KernelUnderTest | KernelInfo, finding: str = "") -> str:
    """The reproduction of ``problem`` on ``kernel`` (loaded here, or in a worker process);
    ``finding`` is quoted as a comment."""
    def optional(a: np.ndarray | None) -> str:
        return "None" if a is None else array_literal(a)

    from .kernel import keyword_sources

    keywords = keyword_sources(kernel.declaration, problem)
    call = ", ".join(["q", "k", "v", *(f"{name}={name if source else _value(value)}"
                                       for name, (value, source) in keywords.items())])
    declaration = kernel.declaration
    target = ", ".join(["out", *(["weights"] if declaration.returns_weights else []),
                        *(["lse"] if declaration.returns_lse else [])])
    given = {"softcap": problem.softcap, "alibi_slopes": problem.alibi_slopes,
             "dropout_p": problem.dropout_p or None, "seed": problem.seed}
    features = "".join(
        f" {name}={array_literal(value) if isinstance(value, np.ndarray) else _value(value)},"
        for name, value in given.items() if value is not None)
    lines = [
        *(f"# {line}" for line in _wrapped(f"finding: {finding}") if finding),
        "import numpy as np",
        "nan, inf = np.nan, np.inf  # as NumPy prints non-finite values below",
        "from attnspec.backends import Backend",
        "from attnspec.conformance import KernelUnderTest, Problem, reference_bound",
        f"# the inputs as the kernel saw them: float64 values already rounded to {problem.dtype}",
        "problem = Problem(",
        f"    q={array_literal(problem.q)},",
        f"    k={array_literal(problem.k)},",
        f"    v={array_literal(problem.v)},",
        f"    dtype={problem.dtype!r}, is_causal={problem.is_causal!r}, "
        f"scale={_value(problem.scale)},",
        f"    mask={optional(problem.mask)},",
        f"    bias={optional(problem.bias)},{features}",
        f"    extra={problem.extra!r})",
        f"kernel = KernelUnderTest.load({kernel.target!r}, Backend({kernel.backend.name!r}))",
        "fn, backend = kernel.fn, kernel.backend"
        + ("  # fn pads E and Ev equal (equal_head_dims)" if kernel.declaration.equal_head_dims
           else ""),
        f"q, k, v = (backend.asarray(a, {problem.dtype!r}) for a in (problem.q, problem.k, "
        "problem.v))",
        *(f"{name} = {source}" for name, (_, source) in keywords.items() if source),
        f"{target} = fn({call})",
        "print('kernel output:', out)",
        "bound = reference_bound(problem, kernel.declaration)",
        "print('float64 definition (SDPA-7.1):', bound.out)",
        "print('allowed error (TOL-2):', bound.out_tolerance)",
    ]
    return "\n".join(lines)


def failure_snippet(failure: PropertyFailure) -> str:
    """The reproduction of ``failure`` (empty when it names no problem or no kernel)."""
    if failure.problem is None or failure.kernel is None:
        return ""
    return snippet(failure.problem, failure.kernel, failure.finding)


def _wrapped(text: str, width: int = 96) -> list[str]:
    import textwrap

    return textwrap.wrap(" ".join(text.split()), width) or [""]
