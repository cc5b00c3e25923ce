"""Calling a kernel under test (loaded by :mod:`.loading`): its arguments and its output.

Properties describe inputs as a :class:`Problem` of NumPy float64 arrays holding values
exactly representable in the dtype under test; :class:`KernelUnderTest` moves them to
the backend in that dtype, calls the kernel as its declaration says, and brings the
output back as float64 NumPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import array_api_compat
import numpy as np

from ...backends import Backend
from ..call.gradients import BackwardCall, kernel_gradients
from ..call.layouts import describe_padding, pad_head_dims, pad_head_dims_on_host
from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration, declaration_of
from ..draw import sizes
from ..draw.input_features import BY_NAME, CALLED_AROUND, UNEQUAL_HEAD_DIMS
from .exception_hints import library_of_module, raised_hint
from .failures import KERNEL_RAISED, KernelRaised, PropertyFailure


def describe_inputs(declaration: KernelDeclaration, problem: Problem) -> str:
    """``problem.describe()``, plus what an adapter changed on the way to the kernel (the
    zero padding of ``equal_head_dims``), so the inputs shown are those passed."""
    text = problem.describe()
    if pads_head_dims(declaration):
        padding = describe_padding(
            problem.q.shape[-1], problem.v.shape[-1], problem.scale is not None
        )
        if padding:
            text += f" ({padding})"
    return text


def keyword_sources(
    declaration: KernelDeclaration, problem: Problem
) -> dict[str, tuple[Any, str | None]]:
    """The keywords a kernel with ``declaration`` is called with on ``problem``: each with
    its value (a NumPy array for a mask or bias: a boolean one moves to the backend as
    is, a float one in the dtype under test) and the Python expression that builds it from
    ``problem`` and ``backend`` (None for plain values).  Needs no backend, so a
    reproduction can be written where the kernel is not loaded."""
    decl, dtype = declaration, problem.dtype
    bias_dtype = decl.bias_dtype(dtype)

    def as_passed(bias: np.ndarray) -> np.ndarray:  # a float32 array stays float32 (moved)
        return bias.astype(np.float32) if bias_dtype == "float32" else bias

    keywords: dict[str, tuple[Any, str | None]] = {
        name: (value, None) for name, value in decl.extra_kwargs.items()
    }
    if problem.is_causal:
        keywords["is_causal"] = (True, None)
    if problem.scale is not None:
        keywords["scale"] = (problem.scale, None)
    if decl.gqa_keyword is not None and problem.q.shape[-3] != problem.k.shape[-3]:
        keywords[decl.gqa_keyword] = (True, None)
    if decl.bias_shares_mask_argument and problem.bias is not None:
        # one float argument: the bias, with -inf where the mask excludes (PyTorch)
        bias, source = problem.bias, "problem.bias"
        if problem.mask is not None:
            bias = np.where(problem.mask, bias, -np.inf)
            source = "np.where(problem.mask, problem.bias, -inf)"
        keywords[decl.mask_keyword] = (
            as_passed(bias),
            f"backend.asarray({source}, {bias_dtype!r})",
        )
    else:
        if problem.mask is not None:
            keywords[decl.mask_keyword] = (problem.mask, "backend.asarray(problem.mask)")
        if problem.bias is not None:
            keywords[decl.bias_keyword] = (
                as_passed(problem.bias),
                f"backend.asarray(problem.bias, {bias_dtype!r})",
            )
    keywords.update(feature_keywords(decl, problem))
    keywords.update((name, (value, None)) for name, value in problem.extra.items())
    return keywords


def feature_keywords(
    declaration: KernelDeclaration, problem: Problem
) -> dict[str, tuple[Any, str | None]]:
    """The keywords of spec/features.md and dropout, as :func:`keyword_sources` gives them:
    the softcap, the ALiBi slopes (float32, as FlashAttention takes them; True for a kernel
    with built-in slopes, which turns ALiBi on), the chunk of chunked local attention
    (CHUNK-1), the log-sum-exp request, the dropout
    probability (0.0 on every call of a dropout kernel but the dropout checks) and its
    seed."""
    decl = declaration
    keywords: dict[str, tuple[Any, str | None]] = {}
    if problem.softcap is not None:
        keywords[decl.softcap_keyword] = (problem.softcap, None)
    if problem.alibi_slopes is not None and decl.alibi_builtin_slopes:
        keywords[decl.alibi_keyword] = (True, None)  # ALiBi on, the kernel's own slopes
    elif problem.alibi_slopes is not None:
        keywords[decl.alibi_keyword] = (
            problem.alibi_slopes.astype(np.float32),
            "backend.asarray(problem.alibi_slopes, 'float32')",
        )
    if problem.chunk is not None:
        keywords["attention_chunk"] = (problem.chunk, None)  # FlashAttention 3's (CHUNK-1)
    if decl.returns_lse and decl.lse_keyword:
        keywords[decl.lse_keyword] = (True, None)
    if decl.dropout:
        keywords[decl.dropout_keyword] = (problem.dropout_p, None)
        if decl.dropout_seeded and problem.seed is not None:
            keywords[decl.dropout_seed_keyword] = (problem.seed, None)
    return keywords


class KernelOutputs(tuple[Any, ...]):
    """``(out, weights)`` of one call, unpacking as two as it always did, with the
    log-sum-exp of a kernel that returns one as ``.lse`` (None otherwise)."""

    lse: Any

    def __new__(cls, out: Any, weights: Any, lse: Any = None) -> KernelOutputs:
        outputs = super().__new__(cls, (out, weights))
        outputs.lse = lse
        return outputs


class KernelUnderTest:
    """A kernel, its declaration and the backend it runs on."""

    def __init__(
        self,
        fn: Callable[..., Any],
        backend: Backend,
        declaration: KernelDeclaration | None = None,
        target: str | None = None,
    ) -> None:
        self.backend = backend
        self.declaration = declaration if declaration is not None else declaration_of(fn)
        self.raw_fn = fn  # as loaded and adapted, before the suite pads its head dims
        if self.declaration.equal_head_dims:
            fn = padded_head_dims(fn, backend)
        self.fn = fn
        self._padded: Callable[..., Any] | None = None  # fn zero-padded to E = Ev, made once
        module, name = getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", "?")
        self.target = target or f"{module}:{name}"
        self.notes: list[str] = []
        # hints read off the kernel before anything ran (see hints.signature_hints)
        self.setup_hints: list[str] = []
        # the lines that rebuild this kernel in a reproduction (reproduce.loader_source,
        # set by KernelSetup.prepare); empty: it is loaded by its target
        self.loader = ""
        # seconds spent in the kernel's own calls so far (the report's kernel share; see
        # call_guard.CallGuard.call_raw)
        self.kernel_seconds = 0.0

    def describe(self, problem: Problem) -> str:
        """The inputs of ``problem`` as passed to this kernel (see :func:`describe_inputs`)."""
        return describe_inputs(self.declaration, problem)

    def note(self, observation: str) -> None:
        """Record something a passing property should report (e.g. SDPA-1.7's SHOULD)."""
        if observation not in self.notes:
            self.notes.append(observation)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes to test: those claimed that the backend has, in precision order."""
        available = self.backend.dtype_names
        claimed = self.declaration.dtypes or available
        return tuple(d for d in available if d in claimed)

    @property
    def widest_dtype(self) -> str:
        """The most precise claimed dtype: where small errors are easiest to see."""
        return self.dtypes[-1]

    def rounded(self, a: np.ndarray, dtype: str) -> np.ndarray:
        """``a`` rounded to ``dtype`` on the backend and back: the values the kernel sees
        (on the host where the backend rounds there: no round trip to its device)."""
        on_host = self.backend.rounded_on_host(a, dtype)
        return self.numpy(self.backend.asarray(a, dtype)) if on_host is None else on_host

    def arguments(self, problem: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Backend arrays and keywords for calling the kernel on ``problem``: q, k, v and
        the keywords of :func:`keyword_sources` (the lines a reproduction writes out),
        their arrays moved to the backend."""
        b, dtype = self.backend, problem.dtype
        args = tuple(b.asarray(a, dtype) for a in (problem.q, problem.k, problem.v))

        def moved(value: np.ndarray) -> Any:  # float32 arrays (ALiBi slopes) stay float32
            if value.dtype == np.bool_:
                return b.asarray(value)
            return b.asarray(value, "float32" if value.dtype == np.float32 else dtype)

        keywords = {
            name: value if source is None else moved(value)
            for name, (value, source) in keyword_sources(self.declaration, problem).items()
        }
        return args, keywords

    def call_raw(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The kernel's raw result (backend arrays), exactly as it returned it; while a
        re-run draws around Ev != E (SDPA-1.1), on inputs zero-padded to E = Ev, as
        ``equal_head_dims`` would call it."""
        if pads_head_dims(self.declaration) and not self.declaration.equal_head_dims:
            if self._padded is None:
                self._padded = padded_head_dims(self.fn, self.backend, **_fields(self.declaration))
            return self._padded(*args, **kwargs)
        return self.fn(*args, **kwargs)

    def call_gradients(self, call: BackwardCall, problem: Problem | None = None) -> Any:
        """The kernel's raw gradients ``(dq, dk, dv, dbias)`` (backend arrays) for ``call``,
        computed where the kernel runs (spec/backward.md): in its process when it has one,
        else here; on the kernel as loaded (an ``equal_head_dims`` kernel is not padded: the
        backward properties call it with E = Ev).  ``problem`` only names the inputs in
        messages."""
        fn = self.raw_fn  # self.fn may be the suite's padding around it
        if hasattr(fn, "vjp") and hasattr(fn, "call_description"):  # in its own process
            return fn.vjp(call)
        return kernel_gradients(self.backend, self.raw_fn, self.declaration, call)

    def bias_keyword(self, problem: Problem) -> str | None:
        """The keyword the bias of ``problem`` is passed under (None: it has none)."""
        if problem.bias is None:
            return None
        decl = self.declaration
        return decl.mask_keyword if decl.bias_shares_mask_argument else decl.bias_keyword

    def split(self, result: Any, problem: Problem | None = None) -> tuple[Any, Any]:
        """(out, weights or None) from a raw result, per the declaration (see
        :meth:`results`)."""
        out, weights, _ = self.results(result, problem)
        return out, weights

    def results(self, result: Any, problem: Problem | None = None) -> tuple[Any, Any, Any]:
        """(out, weights or None, lse or None) from a raw result, per the declaration: the
        output, then the weights (``returns_weights``), then the log-sum-exp
        (``returns_lse``).  A result that is not what SDPA-1.3 asks for (None, a tuple,
        another library's array) is a failure that says so, with the flag to use when it is
        a convention mismatch."""

        decl = self.declaration
        expected = [
            "out",
            *(["weights"] if decl.returns_weights else []),
            *(["lse"] if decl.returns_lse else []),
        ]
        if len(expected) > 1:
            if not isinstance(result, (tuple, list)) or len(result) != len(expected):
                claimed = " and ".join(
                    f"{name}=True"
                    for name, claims in (
                        ("returns_weights", decl.returns_weights),
                        ("returns_lse", decl.returns_lse),
                    )
                    if claims
                )
                raise PropertyFailure(
                    f"the kernel returned {_what_it_is(result)}, but declares {claimed}, so "
                    f"it should return ({', '.join(expected)}) [SDPA-1.3]",
                    problem,
                    self,
                    hint=_declared_results_hint(decl),
                )
            parts = dict(zip(expected, result, strict=True))
        elif isinstance(result, (tuple, list)):
            raise PropertyFailure(
                f"the kernel returned {_what_it_is(result)}, but should return the output "
                f"array [SDPA-1.3]",
                problem,
                self,
                hint=_sequence_hint(result),
            )
        else:
            parts = {"out": result}
        for what in expected:
            x = parts[what]
            if not self.backend.is_array(x):
                raise PropertyFailure(
                    self._not_an_array(what, x), problem, self, hint=self._array_hint(x)
                )
        return parts["out"], parts.get("weights"), parts.get("lse")

    def _not_an_array(self, what: str, x: Any) -> str:
        library = self.backend.name
        if x is None:
            return (
                f"the kernel returned None as {what}, but should return a {library} array "
                "(does it end with `return ...`?) [SDPA-1.3]"
            )
        if array_api_compat.is_array_api_obj(x):
            return (
                f"{what} is a {_type_name(x)}, but the kernel runs on {library}: it should "
                f"return a {library} array, like its inputs [SDPA-1.3]"
            )
        return f"{what} is {_what_it_is(x)}, but should be a {library} array [SDPA-1.3]"

    def _array_hint(self, x: Any) -> str:
        if x is not None and array_api_compat.is_array_api_obj(x):
            return (
                f"convert the result to the input's library inside the kernel, or check it "
                f"on the backend it returns (--backend {_library_of(x)})"
            )
        return ""

    def call_on(self, problem: Problem) -> KernelOutputs:
        """(out, weights or None) as backend arrays, the log-sum-exp (or None) as ``.lse``;
        a kernel exception becomes a failure."""
        reject_avoided(problem, self.declaration)  # a re-run drawing around a clause
        result = self.call_checked(*self.arguments(problem), problem)
        return KernelOutputs(*self.results(result, problem))

    def call_checked(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        problem: Problem | None = None,
        context: str = "",
    ) -> Any:
        """:meth:`call_raw`, an exception the kernel raises made a :class:`KernelRaised`
        failure that shows ``problem`` (when the call has one) and ``context`` (how the
        arguments were made, e.g. " [call: ...]"), with a hint where one applies."""
        try:
            return self.call_raw(args, kwargs)
        except Exception as exc:
            raise KernelRaised(
                f"{KERNEL_RAISED}{type(exc).__name__}: {str(exc)[:300]}{context}",
                problem,
                self,
                hint=raised_hint(exc, self, problem),
            ) from exc

    def numpy(self, x: Any) -> np.ndarray:
        """A backend array as float64 NumPy."""
        values: np.ndarray = self.backend.to_numpy(x)
        return values.astype(np.float64)

    def output(self, problem: Problem) -> np.ndarray:
        """The kernel's output for ``problem`` as float64 NumPy."""
        return self.numpy(self.call_on(problem)[0])

    def output_with_lse(self, problem: Problem) -> tuple[np.ndarray, np.ndarray, str]:
        """Output and log-sum-exp as float64 NumPy, and the log-sum-exp's dtype name (the
        kernel declares ``returns_lse``)."""
        outputs = self.call_on(problem)
        dtype = str(outputs.lse.dtype).rsplit(".", 1)[-1]
        return self.numpy(outputs[0]), self.numpy(outputs.lse), dtype

    @property
    def observes_weights(self) -> bool:
        """Whether :meth:`output_with_weights` observes the weights through V = I (the
        kernel does not return them)."""
        return not self.declaration.returns_weights

    def output_with_weights(self, problem: Problem) -> tuple[np.ndarray, np.ndarray]:
        """Output and weights; weights are observed (:meth:`observed_weights`) when not
        returned."""
        if self.declaration.returns_weights:
            out, weights = self.call_on(problem)
            return self.numpy(out), self.numpy(weights)
        weights = self.observed_weights(problem)
        return self.output(problem), weights

    def observed_weights(self, problem: Problem) -> np.ndarray:
        """The weights ``(..., Hq, Lq, Lk)`` of ``problem`` read off the kernel's output
        with V = I (SDPA-7.1: output column c is then sum_j p_ij I_jc = p_ic), as float64.

        On a backend that compiles per shape, in column blocks (:func:`identity_blocks`):
        one call per block of Ev columns of I, each with the problem's own shapes (compiled
        already, as a rule), where one call with V = I (Ev = Lk, and for ``equal_head_dims``
        q and k padded to Lk) is a compilation of its own.  Each output column is still one
        weight times 1 plus exact zeros, so the blocks give the one call's weights to the
        bit where the kernel computes the scores of both calls alike (the reference,
        PyTorch's math SDPA: tests/conformance/test_observed_weights.py), and the one
        call's TOL-2 bound holds (:func:`.bounds.observed_weights_bound`).  A kernel that
        pads E up to Ev (``equal_head_dims``) or picks its algorithm by Ev computes the
        blocks' scores as for the problem itself, which can differ from the one call in
        the last bit.  Elsewhere, and where blocks would take more than MAX_WEIGHT_BLOCKS
        calls, one call with V = I."""
        blocks = identity_blocks(problem) if self.backend.compiles_per_shape else None
        if blocks is None:
            return self.output(identity_values(problem))
        n_keys = problem.k.shape[-2]
        columns = [
            self.output(block)[..., : min(n_keys - start, block.v.shape[-1])]
            for start, block in blocks
        ]
        return np.concatenate(columns, axis=-1)


def _type_name(x: Any) -> str:
    kind = type(x)
    module = kind.__module__.split(".")[0]
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _what_it_is(x: Any) -> str:
    """ "None", "a tuple of 2 (ndarray, ndarray)", "a str", ... for failure messages."""
    if x is None:
        return "None"
    if isinstance(x, (tuple, list)):
        parts = ", ".join(_type_name(item) for item in x[:4]) + (", ..." if len(x) > 4 else "")
        return f"a {type(x).__name__} of {len(x)} ({parts})"
    return f"a {_type_name(x)}"


def _library_of(x: Any) -> str:
    return library_of_module(type(x).__module__)


def _declared_results_hint(declaration: KernelDeclaration) -> str:
    if declaration.returns_weights and not declaration.returns_lse:
        return "if it returns only the output, drop --returns-weights (returns_weights=False)"
    return (
        "if it returns only the output, drop --returns-lse (returns_lse=False); the "
        "log-sum-exp comes last, after the weights where both are returned"
    )


def _sequence_hint(result: Any) -> str:
    if len(result) == 2:
        return (
            "if it returns (out, weights), declare it: --returns-weights "
            "(returns_weights=True); if it returns (out, lse), declare --returns-lse "
            "(returns_lse=True); otherwise check a wrapper that returns result[0]"
        )
    if len(result) == 3:
        return (
            "if it returns (out, weights, lse), declare --returns-weights --returns-lse; "
            "otherwise check a wrapper that returns only the output, e.g. result[0]"
        )
    return "check a wrapper that returns only the output, e.g. result[0]"


def identity_values(problem: Problem) -> Problem:
    """``problem`` with V = I, so the output is the weight matrix (SDPA-7.1)."""
    n_keys = problem.k.shape[-2]
    eye = np.broadcast_to(np.eye(n_keys), (*problem.k.shape[:-1], n_keys))
    return problem.with_(v=np.ascontiguousarray(eye))


# The most calls one weights observation makes in column blocks.  Each block call is an
# attention of the problem's own size: ceil(Lk / Ev) of them do ~Lk (E + Ev) / Ev work per
# score row where the one V = I call does E + Lk, under twice as much for E <= Ev, but
# Ev = 1 against Lk = 2063 keys would be 2063 calls.  Measured on the jitted JAX kernel
# (CPU, load ~2): a block call of the problem compiled already takes 0.2 ms (Lq = Lk = 64)
# to 1.5 ms (6 heads, one query, 2063 keys, E = Ev = 64: 33 blocks, 0.05 s in all), the
# one V = I call 0.3-0.65 s cold (its compilation), so 64 calls stay below a compilation.
MAX_WEIGHT_BLOCKS = 64


def identity_blocks(problem: Problem) -> list[tuple[int, Problem]] | None:
    """``problem`` with V = I cut into blocks of its own Ev columns: (j, the problem with
    V_j = I[:, j:j + Ev]) for j = 0, Ev, 2 Ev, ... < Lk, the last block's columns past Lk
    zero (one block, all zero, for Lk = 0); V_j has the problem's own v shape, so output
    columns 0 .. min(Ev, Lk - j) - 1 of the call are the weights of keys j, j + 1, ...
    None where blocks do not serve: Ev = 0 (no columns to read), or more than
    MAX_WEIGHT_BLOCKS of them."""
    n_keys, value_dim = problem.k.shape[-2], problem.v.shape[-1]
    if value_dim == 0 or math.ceil(n_keys / value_dim) > MAX_WEIGHT_BLOCKS:
        return None
    blocks = []
    for start in range(0, max(n_keys, 1), value_dim):
        # row r of column c is 1 where r = start + c: columns past key Lk - 1 are all zero
        block = np.broadcast_to(np.eye(n_keys, value_dim, k=-start), problem.v.shape)
        blocks.append((start, problem.with_(v=np.ascontiguousarray(block))))
    return blocks


def reject_avoided(problem: Problem, declaration: KernelDeclaration) -> None:
    """Discard the current example (as Hypothesis' ``reject()``) when ``problem`` has a feature
    the run avoids: the one hook every kernel call goes through, so a problem a property
    builds itself is drawn around too."""
    avoid = [name for name in sizes.avoided_now() if name not in CALLED_AROUND]
    if avoid and any(BY_NAME[name].present(problem, declaration) for name in avoid):
        from hypothesis.errors import UnsatisfiedAssumption

        raise UnsatisfiedAssumption  # what hypothesis.reject() raises, here outside a test too


def pads_head_dims(declaration: KernelDeclaration) -> bool:
    """Whether the kernel is called on inputs zero-padded to E = Ev: it declares
    ``equal_head_dims``, or a re-run draws around Ev != E (SDPA-1.1, input_features)."""
    return declaration.equal_head_dims or UNEQUAL_HEAD_DIMS in sizes.avoided_now()


def padded_head_dims(fn: Callable[..., Any], backend: Backend, **claims: Any) -> Callable[..., Any]:
    """``fn`` zero-padded to E = Ev (:func:`.layouts.pad_head_dims`); on a backend that
    compiles per shape, with the padding done on the host, where it compiles nothing."""
    if backend.compiles_per_shape:
        return pad_head_dims_on_host(fn, backend, **claims)
    return pad_head_dims(fn, **claims)


def _fields(declaration: KernelDeclaration) -> dict[str, Any]:
    return {f.name: getattr(declaration, f.name) for f in fields(declaration)}
