"""Every reproduction a failure report gives, built here and nowhere else.

- :func:`snippet`: Python that rebuilds a failing input exactly and calls the kernel on it
  as the suite did, ``fn(q, k, v, ...)``, then prints what the property compared.  The
  inputs are NumPy literals of the float64 values the kernel saw (already rounded to the
  dtype under test), reshaped to their exact shape, so empty arrays come back with their
  shape (``q(1, 0, 1)`` is ``np.array([]).reshape(1, 0, 1)``); an input of mostly zeros
  (a shrunk counterexample's often is) is ``np.zeros`` and an assignment per nonzero value.
- :func:`loader_source`, :func:`rebuild_source`, :func:`declaration_source`: the lines
  in it that rebuild the kernel as its :class:`~.kernel_setup.KernelSetup` built it
  (through the same :func:`~.kernel_setup.kernel_function`: a known kernel's adapter,
  layout, renames; the environment it needs; the claims); the setup keeps them on the
  kernel (``KernelUnderTest.loader``).
- :func:`rerun_command`, :func:`rerun_flags`, :func:`pytest_rerun_command`: the command
  that reruns one property, for ``attnspec check`` and for the pytest plugin.
- :func:`reproduction_lines`, :func:`reproduction_file`: a failure text's reproduction,
  or the file a reproduction too long to show is written to.
"""

from __future__ import annotations

import os
import shlex
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration, qualified_name
from ..claims.family_claims import FAMILY_CLAIMS
from ..claims.flags import Flag, Getter
from ..kernels.known import KNOWN_KERNELS
from .failures import PropertyFailure, ShownKernel
from .verdict import Verdict

PROGRAM = "attnspec"
#: a float input with at most this many nonzero values (fewer than its zeros) is written as
#: np.zeros and one assignment per nonzero value, as a shrunk counterexample reads best
SPARSE_VALUES = 8
#: where a reproduction too long to show is: a place, or a function writing it there
Where = str | Callable[["Verdict"], str]


def array_literal(a: np.ndarray) -> str:
    """``np.array([...], dtype=...).reshape(shape)``: exact values (repr of float64 round-
    trips), exact shape (empty and 0-d arrays too); ``np.full(shape, value, dtype=...)``
    for an array of one value (a shrunk counterexample's are often all zeros)."""
    dtype = "bool" if a.dtype == np.bool_ else f"np.{a.dtype}"
    if a.size > 1 and _one_value(a):
        return f"np.full({tuple(a.shape)!r}, {a.flat[0].item()!r}, dtype={dtype})"
    return f"np.array({a.tolist()!r}, dtype={dtype}).reshape({tuple(a.shape)!r})"


def _one_value(a: np.ndarray) -> bool:
    """Whether every element of ``a`` is its first, bit for bit (0.0 and -0.0 differ)."""
    same = a == a.flat[0]
    if a.dtype.kind == "f":
        same &= np.signbit(a) == np.signbit(a.flat[0])
    return bool(same.all())


def _sparse(a: np.ndarray) -> bool:
    """Whether a float array is best written as zeros and an assignment per nonzero value
    (a shrunk counterexample's arrays often are): at most SPARSE_VALUES of them, fewer
    than its zeros, and no -0.0 (which np.zeros would not give back)."""
    return (
        a.dtype.kind == "f"
        and int(np.count_nonzero(a)) <= min(SPARSE_VALUES, a.size // 2)
        and not bool(np.any((a == 0) & np.signbit(a)))
    )


def _value(value: Any) -> str:
    return f"np.{value!r}" if isinstance(value, np.generic) else repr(value)


def _problem_lines(problem: Problem, name: str = "problem") -> list[str]:
    """``name = Problem(...)`` with ``problem``'s inputs as literals (a sparse input as
    np.zeros and one assignment per nonzero value)."""
    nonzero: list[str] = []  # assignments of the few nonzero values of sparse arrays

    def literal(field: str, a: np.ndarray) -> str:
        if not _sparse(a):
            return array_literal(a)
        nonzero.extend(
            f"{name}.{field}[{', '.join(map(str, index))}] = {float(a[index])!r}"
            for index in zip(*np.nonzero(a), strict=True)
        )
        return f"np.zeros({tuple(a.shape)!r}, dtype=np.{a.dtype})"

    def optional(field: str, a: np.ndarray | None) -> str:
        return "None" if a is None else literal(field, a)

    given = {
        "softcap": problem.softcap,
        "alibi_slopes": problem.alibi_slopes,
        "dropout_p": problem.dropout_p or None,
        "seed": problem.seed,
        "chunk": problem.chunk,
    }
    features = "".join(
        f" {field}={array_literal(value) if isinstance(value, np.ndarray) else _value(value)},"
        for field, value in given.items()
        if value is not None
    )
    return [
        f"{name} = Problem(",
        f"    q={literal('q', problem.q)},",
        f"    k={literal('k', problem.k)},",
        f"    v={literal('v', problem.v)},",
        f"    dtype={problem.dtype!r}, is_causal={problem.is_causal!r}, "
        f"scale={_value(problem.scale)},",
        f"    mask={optional('mask', problem.mask)},",
        f"    bias={optional('bias', problem.bias)},{features}",
        f"    extra={problem.extra!r})",
        *nonzero,
    ]


def _call_lines(
    problem: Problem, kernel: ShownKernel, name: str = "problem", out: str = "out"
) -> tuple[list[str], Callable[[str], str]]:
    """The lines that move ``problem`` (built as ``name``) to the backend and call the
    kernel on it as the suite did, its output in ``out``; with the function that writes
    the call's argument list for a given value argument (``v``, or ``eye``)."""
    from .kernel import keyword_sources

    keywords = keyword_sources(kernel.declaration, problem)
    declaration = kernel.declaration

    def call(values: str) -> str:
        return ", ".join(
            [
                "q",
                "k",
                values,
                *(
                    f"{keyword}={keyword if source else _value(value)}"
                    for keyword, (value, source) in keywords.items()
                ),
            ]
        )

    target = ", ".join(
        [
            out,
            *(["weights"] if declaration.returns_weights else []),
            *(["lse"] if declaration.returns_lse else []),
        ]
    )
    lines = [
        f"q, k, v = (backend.asarray(a, {problem.dtype!r}) for a in ({name}.q, {name}.k, "
        f"{name}.v))",
        *(
            f"{keyword} = {source.replace('problem.', f'{name}.')}"
            for keyword, (_, source) in keywords.items()
            if source
        ),
        f"{target} = fn({call('v')})",
    ]
    return lines, call


def snippet(
    problem: Problem,
    kernel: ShownKernel,
    finding: str = "",
    shows_weights: bool = False,
) -> str:
    """The reproduction of ``problem`` on ``kernel`` (loaded here, or in a worker process);
    ``finding`` is quoted as a comment.  ``shows_weights``: the finding is about weights
    observed through V = I, so the snippet also calls the kernel with V = I (one call,
    however the suite observed them) and prints its output, the weights, against their
    definition and bound."""
    declaration = kernel.declaration
    calls, call = _call_lines(problem, kernel)
    weights_target = ", ".join(
        [
            "observed",
            *(["weights"] if declaration.returns_weights else []),
            *(["lse"] if declaration.returns_lse else []),
        ]
    )
    lines = [
        *(f"# {line}" for line in _wrapped(f"finding: {finding}") if finding),
        "import numpy as np",
        "nan, inf = np.nan, np.inf  # as NumPy prints non-finite values below",
        "from attnspec.backends import Backend",
        "from attnspec.conformance import KernelUnderTest, Problem, reference_bound",
        f"# the inputs as the kernel saw them: float64 values already rounded to {problem.dtype}",
        *_problem_lines(problem),
        _loader_line(kernel),
        "fn, backend = kernel.fn, kernel.backend"
        + (
            "  # fn pads E and Ev equal (equal_head_dims)"
            if kernel.declaration.equal_head_dims
            else ""
        ),
        *calls,
        "print('kernel output:', out)",
        "bound = reference_bound(problem, kernel.declaration)",
        "print('float64 definition (SDPA-7.1):', bound.out)",
        "print('allowed error (TOL-2):', bound.out_tolerance)",
        *(_weights_lines(problem.dtype, weights_target, call("eye")) if shows_weights else []),
    ]
    return "\n".join(lines)


class ReplayedFailure(PropertyFailure):
    """A failure of a property that compared calls of the kernel with each other (a
    permutation, a bias shift, a linear combination, SDPA-7.6; values the mask hides,
    SDPA-8; keys beyond the causal boundary, SDPA-4): ``problem`` is the call that failed,
    ``calls`` the others it was compared with (name, problem), ``expected`` the Python
    expression of what the failing call's output should be, in the others' outputs
    ``out_NAME``, and ``allowed`` that of the allowed difference beyond the failing call's
    own TOL-2 bound, in ``bound(problem_NAME)``, or None when the outputs must be
    identical; ``compared``, where given, the positions of the output the property
    compared (broadcast to it).  The reproduction replays every call and the comparison."""

    def __init__(
        self,
        failure: PropertyFailure,
        calls: Sequence[tuple[str, Problem]],
        expected: str,
        allowed: str | None,
        compared: np.ndarray | None = None,
    ) -> None:
        super().__init__(
            failure.finding,
            failure.problem,
            failure.kernel,
            hint=failure.hint,
            shows_weights=failure.shows_weights,
        )
        self.calls, self.expected, self.allowed = tuple(calls), expected, allowed
        self.compared = compared


@contextmanager
def replaying(
    calls: Sequence[tuple[str, Problem]],
    expected: str,
    allowed: str | None = None,
    compared: np.ndarray | None = None,
) -> Iterator[None]:
    """A :class:`PropertyFailure` raised inside becomes a :class:`ReplayedFailure` of
    these other ``calls`` and this comparison (see there), so its reproduction replays
    them; ``allowed`` None: the outputs must be identical."""
    try:
        yield
    except ReplayedFailure:
        raise
    except PropertyFailure as failure:
        raise ReplayedFailure(failure, calls, expected, allowed, compared) from None


def replay_lines(failure: ReplayedFailure) -> list[str]:
    """The lines a reproduction adds for the other calls of ``failure`` and the comparison
    the property made."""
    kernel = failure.kernel
    if kernel is None:
        return []
    lines = [
        "# the other calls the property made, and the comparison it failed",
        "def numpy(a):",
        "    return np.asarray(backend.to_numpy(a), dtype=np.float64)",
        "def bound(p):",
        "    return np.asarray(reference_bound(p, kernel.declaration).out_tolerance)",
    ]
    for name, problem in failure.calls:
        calls, _ = _call_lines(problem, kernel, f"problem_{name}", f"out_{name}")
        lines.extend([*_problem_lines(problem, f"problem_{name}"), *calls])
        lines.append(f"out_{name} = numpy(out_{name})")
    identical = failure.allowed is None
    lines.extend(
        [
            f"expected = {failure.expected}",
            "actual = numpy(out)",
            "allowed = "
            + ("0.0  # identical: IEEE ==, NaN matching NaN" if identical else "bound(problem) + ")
            + ("" if identical else str(failure.allowed)),
            "difference = np.abs(actual - expected)",
            "agree = (actual == expected) | (np.isnan(actual) & np.isnan(expected))",
            "agree |= difference <= allowed",
        ]
    )
    if failure.compared is not None:
        lines.extend(
            [
                "# the positions the property compared (the others the spec does not fix)",
                f"compared = np.broadcast_to({array_literal(failure.compared)}, actual.shape)",
                "agree |= ~compared",
                "difference = np.where(compared, difference, 0.0)",
            ]
        )
    lines.extend(
        [
            "print('largest difference between the calls:', np.nanmax(difference, initial=0.0))",
            "print('allowed'"
            + (
                ", '(none: the outputs must be identical):'"
                if identical
                else ", '(the sum of their TOL-2 bounds):'"
            )
            + ", allowed)",
            "print('beyond it at:', np.argwhere(~agree)[:5].tolist())",
        ]
    )
    return lines


def _weights_lines(dtype: str, target: str, call: str) -> list[str]:
    """The lines of a snippet that observe the weights as the property did: the output of
    one call with V = I (SDPA-7.1), against the V = I problem's definition and TOL-2 bound."""
    return [
        "# the weights, observed through V = I: the output with V = I is the weight matrix",
        "from attnspec.conformance.judge.bounds import observed_weights_bound",
        "from attnspec.conformance.judge.kernel import identity_values",
        f"eye = backend.asarray(identity_values(problem).v, {dtype!r})",
        f"{target} = fn({call})",
        "print('kernel weights:', observed)",
        "expected, tolerance = observed_weights_bound(problem, kernel.declaration)",
        "print('float64 weights (SDPA-7.1):', expected)",
        "print('allowed error (TOL-2):', tolerance)",
    ]


def _wrapped(text: str, width: int = 96) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), width) or [""]


def failure_snippet(failure: PropertyFailure) -> str:
    """The reproduction of ``failure`` (empty when it names no problem or no kernel)."""
    if failure.problem is None or failure.kernel is None:
        return ""
    text = snippet(failure.problem, failure.kernel, failure.finding, failure.shows_weights)
    if isinstance(failure, ReplayedFailure):
        text += "\n" + "\n".join(replay_lines(failure))
    return text


def _loader_line(kernel: ShownKernel) -> str:
    """The lines that rebuild the kernel: those of its setup (:func:`loader_source`, kept
    on the kernel), else loading it by its target, as a check does, with its declaration."""
    return kernel.loader or rebuild_source(kernel.target, kernel.backend.name, kernel.declaration)


def known_environment(fn: Callable[..., Any]) -> dict[str, str]:
    """The environment variables the known kernel ``fn`` (an adapter) is checked with
    (Keras's ``KERAS_BACKEND``: the backend it imports with); empty for any other."""
    name = qualified_name(fn)
    for entry in KNOWN_KERNELS:
        if entry.env and name == entry.adapter.replace(":", "."):
            return dict(entry.env)
    return {}


def rebuild_source(
    target: str,
    backend: str,
    declaration: KernelDeclaration,
    *,
    layout: str = "bhld",
    rename: Mapping[str, str] | None = None,
    device: str | None = None,
    jax_x64: bool | None = None,
    environment: Mapping[str, str] | None = None,
) -> str:
    """Python lines that build ``kernel`` (a :class:`KernelUnderTest`) from ``target``
    the way a check does (:func:`.kernel_setup.kernel_function`), on ``backend``, with
    ``declaration`` spelled out (the claims and overrides included)."""
    declaration_names = {"KernelDeclaration", "KernelUnderTest"} | {
        claim.__name__ for name, _, claim in FAMILY_CLAIMS if getattr(declaration, name) is not None
    }
    lines = []
    if environment:
        # set before the kernel's library is imported (Keras reads KERAS_BACKEND then)
        lines += ["import os", f"os.environ.update({dict(environment)!r})  # as the check ran"]
    lines += [
        f"from attnspec.conformance import {', '.join(sorted(declaration_names))}",
        "from attnspec.conformance.run.kernel_setup import kernel_function",
    ]
    arguments = [repr(target)]
    if layout != "bhld" or rename:
        arguments.append(repr(layout))
    if rename:
        arguments.append(repr(dict(rename)))
    lines.append(f"fn = kernel_function({', '.join(arguments)})")
    where = "" if device is None else f", {device!r}"
    if jax_x64 is not None:
        where += f", config={{'jax_enable_x64': {jax_x64!r}}}"
    lines.append(
        f"kernel = KernelUnderTest(fn, Backend({backend!r}{where}), "
        f"{declaration_source(declaration)}, {target!r})"
    )
    return "\n".join(lines)


def declaration_source(declaration: KernelDeclaration) -> str:
    """``KernelDeclaration(...)`` naming only the fields that differ from the defaults."""
    changed = (f"{name}={value!r}" for name, value in declaration.changed().items())
    return f"KernelDeclaration({', '.join(changed)})"


def rerun_flags(flags: Iterable[Flag], get: Getter, *, prefix: str | None = None) -> list[str]:
    """The tokens of the ``flags`` that matter for a rerun (``Flag.rerun``: not --only,
    --skip or output files; not --seed, which the rerun commands place themselves), with
    the values ``get(dest)`` gives."""
    tokens: list[str] = []
    for flag in flags:
        if flag.rerun and flag.option != "--seed":
            tokens += flag.tokens(get(flag.dest), prefix=prefix)
    return tokens


#: environment variables a kernel's library reads once, at import, that pick what is
#: checked: the library (the first part of the target's module) -> the variable
_IMPORT_SETTINGS = {"keras": "KERAS_BACKEND"}


def rerun_environment(target: str) -> list[str]:
    """``NAME=value`` for each setting of ``target``'s library read at import that is set
    now (Keras's backend): a rerun command repeats it, so it checks the same thing in a
    shell where it is not set.  (A known Keras adapter sets its own; a reproduction
    snippet sets what the loaded kernel needs: :func:`loader_source`.)"""
    library = target.rpartition(":")[0].split(".")[0]
    name = _IMPORT_SETTINGS.get(library)
    value = None if name is None else os.environ.get(name)
    return [] if value is None else [f"{name}={value}"]


def rerun_command(target: str, flags: Sequence[str], property_id: str, seed: int | None) -> str:
    """The one-line ``attnspec check`` that reruns just this property, with the same
    inputs (``flags``: :func:`rerun_flags` of the run) and library settings
    (:func:`rerun_environment`)."""
    tokens = [PROGRAM, "check", target, *flags, "--only", property_id]
    if seed is not None:
        tokens += ["--seed", str(seed)]
    return shlex.join([*rerun_environment(target), *tokens])


def pytest_rerun_command(
    target: str, option: Callable[[str], Any], flags: Iterable[Flag], prefix: str, property_id: str
) -> str:
    """The pytest command that reruns just this property (the plugin's options read with
    ``option(dest)``; ``flags``: those it shares with ``attnspec check``, as
    ``--<prefix>-<flag>``)."""
    tokens = [*rerun_environment(target), "pytest", f"--{prefix}-kernel", target]
    for name in ("backend", "device", "seed"):
        if option(f"{prefix}_{name}") is not None:
            tokens += [f"--{prefix}-{name}", str(option(f"{prefix}_{name}"))]
    tokens += [f"--{prefix}-profile", option(f"{prefix}_profile")]
    if option(f"{prefix}_isolate"):
        tokens.append(f"--{prefix}-isolate")
    tokens += rerun_flags(flags, lambda dest: option(f"{prefix}_{dest}"), prefix=prefix)
    for claim in option(f"{prefix}_claim") or ():
        tokens += [f"--{prefix}-claim", claim]
    return shlex.join([*tokens, f"--{prefix}-only", property_id])


def reproduction_lines(
    verdict: Verdict, max_reproduction: int | None, full_reproduction_in: Where
) -> list[str]:
    """A failure text's reproduction: the snippet indented, or where it is when longer
    than ``max_reproduction`` characters (a path, or a function of the verdict giving one,
    e.g. :func:`reproduction_file`)."""
    size = len(verdict.reproduction)
    if not size:
        return []
    if max_reproduction is not None and size > max_reproduction:
        where = (
            full_reproduction_in(verdict)
            if callable(full_reproduction_in)
            else full_reproduction_in
        )
        return [
            f"  reproduction: {size} characters of literal inputs, too long to show "
            f"here; it is in {where}"
        ]
    return ["  reproduction (runs on its own):", textwrap.indent(verdict.reproduction, "    ")]


# Where reproductions too long to show go when no directory is named: beside the report
# the user reads, never the temporary directory (where a later reader would not look).
REPRODUCTIONS_DIRECTORY = "attnspec-reproductions"


def reproductions_in(directory: str | os.PathLike[str] | None = None) -> Callable[[Verdict], str]:
    """A function that writes a verdict's full reproduction to ``DIRECTORY/PROPERTY.py``
    (made if missing; default :data:`REPRODUCTIONS_DIRECTORY` in the working directory)
    and returns its path, for a reproduction too long to show in a message."""
    chosen = Path(directory if directory is not None else REPRODUCTIONS_DIRECTORY)

    def write(verdict: Verdict) -> str:
        chosen.mkdir(parents=True, exist_ok=True)
        path = chosen / f"{verdict.property}.py"
        path.write_text(verdict.reproduction, encoding="utf-8")
        return str(path)

    return write


def reproduction_file(verdict: Verdict) -> str:
    """Write ``verdict``'s full reproduction to :data:`REPRODUCTIONS_DIRECTORY` in the
    working directory (one too long to show in a message); returns its path."""
    return reproductions_in()(verdict)
