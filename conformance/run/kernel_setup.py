"""Setting up a kernel for a check: what the CLI, the pytest plugin and the Python API share.

:class:`KernelSetup` loads the kernel, adapts its layout and argument names,
applies the claims, checks that the kernel can be called the way the suite will call
it (before anything runs), and makes every failure's reproduction snippet rebuild
exactly that kernel; :mod:`.api` runs it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ...backends import FLOAT_DTYPE_NAMES, Backend, BackendError, get_backend
from ..call.layouts import LAYOUTS, from_layout, rename_arguments
from ..claims.declaration import KernelDeclaration, declaration_of
from ..claims.family_claims import MLA_PAGED_KEYWORDS
from ..claims.loading import KernelLoadError, load_kernel, on_sys_path
from ..claims.table import Getter, suite_keywords
from ..draw.sizes import SizeLimits
from ..judge.call_guard import guard_calls
from ..judge.convention_hints import class_target_hint, signature_hints
from ..judge.favor_bound import FAVOR_TEST_QUERIES, favor_usage_error
from ..judge.kernel import KernelUnderTest
from ..judge.reproduce import known_environment, rebuild_source
from ..kernels.known import known_adapter, known_backend
from .shared_flags import SIZE_FLAGS


class SetupError(ValueError):
    """The check cannot start: bad target, kernel signature, backend, dtype or option.

    The message is one line that says what was wrong and what was expected.
    """


def _name_of(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def absolute_target(target: str) -> str:
    """``path/to/file.py:FUNC`` with an absolute path, so a reproduction runs anywhere."""
    module_part, sep, attribute = target.rpartition(":")
    if sep and module_part.endswith(".py"):
        return f"{Path(module_part).resolve()}:{attribute}"
    return target


def importable_from_working_directory() -> contextlib.AbstractContextManager[None]:
    """While loading a kernel, ``MODULE:FUNC`` also imports from the working directory
    (as with ``python -m``); ``sys.path`` is restored afterwards."""
    return on_sys_path(os.getcwd())


def loaded_kernel(kernel: str | Callable[..., Any], *, adapt_known: bool) -> Callable[..., Any]:
    """``kernel`` loaded (a target, imported as ``attnspec check`` imports it) and, with
    ``adapt_known``, a known library kernel replaced by its declared adapter
    (:func:`.known_kernels.known_adapter`): the first half of :func:`kernel_function`."""
    if isinstance(kernel, str):
        with importable_from_working_directory():
            fn = load_kernel(absolute_target(kernel))
    elif callable(kernel):
        fn = kernel
    else:
        raise TypeError(
            f"kernel={kernel!r}, but should be a callable or a target string, "
            "'MODULE:FUNC' or 'path/to/file.py:FUNC'"
        )
    return known_adapter(fn) if adapt_known else fn


def in_spec_convention(
    fn: Callable[..., Any], layout: str, rename: Mapping[str, str]
) -> Callable[..., Any]:
    """``fn`` with its argument names (``rename``) and ``layout`` translated to the spec's:
    the second half of :func:`kernel_function`."""
    if rename:
        fn = rename_arguments(fn, **rename)
    return from_layout(fn, layout)


def kernel_function(
    kernel: str | Callable[..., Any],
    layout: str = "bhld",
    rename: Mapping[str, str] | None = None,
) -> Callable[..., Any]:
    """The callable a check of ``kernel`` runs: loaded, a known kernel adapted (unless a
    layout or renames are given: then the caller adapts it), renamed and relaid out.
    :meth:`KernelSetup.prepare` builds it this way and every reproduction calls this."""
    rename = dict(rename or {})
    fn = loaded_kernel(kernel, adapt_known=layout == "bhld" and not rename)
    return in_spec_convention(fn, layout, rename)


def resolve_backend(
    backend: str | Backend | None, device: Any = None, config: Mapping[str, Any] | None = None
) -> Backend:
    """The backend to run on, with library ``config`` applied (see :class:`Backend`);
    :class:`SetupError` naming it when it is unknown or unusable."""
    if config:
        name = backend.name if isinstance(backend, Backend) else backend or get_backend().name
        where = backend.device if isinstance(backend, Backend) else device
        try:
            return Backend(name, where, config=config)
        except (BackendError, ValueError) as exc:
            raise SetupError(f"backend {name!r} with {dict(config)}: {exc}") from None
    if isinstance(backend, Backend):
        return backend
    if backend is None and device is None:
        try:
            return get_backend()
        except (BackendError, ValueError) as exc:
            raise SetupError(f"the default backend is unusable here: {exc}") from None
    name = backend or get_backend().name
    try:
        return Backend(name, device)
    except (BackendError, ValueError) as exc:
        on = "" if device is None else f" on device {device!r}"
        raise SetupError(f"backend {name!r}{on} is unusable here: {exc}") from None


def check_signature(fn: Callable[..., Any], declaration: KernelDeclaration, name: str) -> None:
    """Raise :class:`SetupError` unless ``fn(q, k, v, **keywords)`` binds (SDPA-1.1).

    Kernels without an introspectable signature (C builtins) are let through.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    if declaration.family == "rope":
        try:
            signature.bind(None, None, **declaration.extra_kwargs)
        except TypeError as exc:
            raise SetupError(
                f"function {name}{signature} cannot be called as fn(x, positions) ({exc}) [ROPE-1]"
            ) from None
        return
    if declaration.mla is not None:
        paged = declaration.mla.paged
        mla_keywords: dict[str, Any] = (
            {**dict.fromkeys(MLA_PAGED_KEYWORDS[:4]), "softmax_scale": 1.0}
            if paged
            else {"scale": 1.0}
        )
        try:
            signature.bind(None, None, **mla_keywords, **declaration.extra_kwargs)
        except TypeError as exc:
            shown = (
                "fn(q, k_cache, block_table=, cache_seqlens=, head_dim_v=, softmax_scale=)"
                if paged
                else "fn(q, kv, scale=)"
            )
            raise SetupError(
                f"function {name}{signature} cannot be called as {shown} ({exc}) "
                f"[{'MLA-4' if paged else 'MLA-1, MLA-2'}]"
            ) from None
        return
    if declaration.family == "fp8":
        fp8 = declaration.fp8
        assert fp8 is not None  # the family is fp8 only with a claim
        descales: dict[str, Any] = dict.fromkeys(fp8.descale_keywords.values())
        if declaration.varlen:  # QUANT-7: packed sequences as VARLEN-1 passes them
            max_seqlen = ("max_seqlen_q", "max_seqlen_k") if declaration.varlen_max_seqlen else ()
            descales.update(dict.fromkeys(("cu_seqlens_q", "cu_seqlens_k", *max_seqlen)))
        try:
            signature.bind(None, None, None, scale=1.0, **descales, **declaration.extra_kwargs)
        except TypeError as exc:
            raise SetupError(
                f"function {name}{signature} cannot be called as fn(q, k, v, "
                f"{', '.join(k + '=' for k in descales)}, scale=) ({exc}) "
                f"[QUANT-1{', QUANT-7' if declaration.varlen else ''}"
                f"{', QUANT-8' if fp8.kv_only else ''}]"
            ) from None
        # the suite passes these too unless the declaration says the kernel has none
        # (a packed float8 call gets no mask: QUANT-7's property draws none)
        mask = declaration.mask and not declaration.varlen
        options = {"is_causal": declaration.causal, declaration.mask_keyword: mask}
        for keyword, remedy in zip(options, ("--no-causal", "--no-mask"), strict=True):
            if not options[keyword]:
                continue
            try:
                signature.bind(None, None, None, scale=1.0, **descales, **{keyword: None})
            except TypeError:
                raise SetupError(
                    f"function {name}{signature} does not accept the keyword {keyword!r}, "
                    f"which the suite passes to a float8 kernel unless declared {remedy} "
                    f"(or --rename {keyword}=NAME)"
                ) from None
        return
    if declaration.family == "recurrent":
        claim = declaration.recurrent
        assert claim is not None  # the family is recurrent only with a claim
        keywords = {"initial_state": None, **declaration.extra_kwargs}
        if claim.rule in ("gated", "gated_delta"):
            keywords["g"] = None
        if claim.rule in ("delta", "gated_delta"):
            keywords["beta"] = None
        if claim.varlen:
            keywords["cu_seqlens"] = None
        if claim.chunk_sizes:
            keywords["chunk_size"] = claim.chunk_sizes[0]
        try:
            signature.bind(None, None, None, **keywords)
        except TypeError as exc:
            raise SetupError(
                f"function {name}{signature} cannot be called as fn(q, k, v, "
                f"{', '.join(k + '=' for k in keywords)}) ({exc}) [REC-1.1]"
            ) from None
        return
    if declaration.family == "merge":
        try:
            signature.bind(None, None, None, None, **declaration.extra_kwargs)
        except TypeError as exc:
            raise SetupError(
                f"function {name}{signature} cannot be called as fn(o_a, lse_a, o_b, lse_b) "
                f"({exc}) [MERGE-1]"
            ) from None
        return
    arrays = (None, None, None)
    # a packed or KV-cache kernel may take its offsets or cache lengths positionally
    # (FlashAttention's varlen does): the suite passes them by name
    given = (
        {keyword: None for keyword in suite_keywords(declaration)}
        if declaration.family in ("varlen", "kv-cache", "paged-batch")
        else {}
    )
    try:
        signature.bind(*arrays, **given)
    except TypeError as exc:
        raise SetupError(
            f"kernel {name}{signature} cannot be called as fn(q, k, v): it does not accept "
            f"three positional arrays ({exc}) [SDPA-1.1]"
        ) from None
    for keyword, because in suite_keywords(declaration).items():
        try:
            signature.bind(*arrays, **{**given, keyword: None})
        except TypeError:
            raise SetupError(
                f"kernel {name}{signature} does not accept the keyword {keyword!r}, which the "
                f"suite passes because the declaration says {because}"
            ) from None


def _restrict_dtypes(
    declaration: KernelDeclaration, backend: Backend, wanted: Iterable[str] | None
) -> KernelDeclaration:
    available = backend.dtype_names
    claimed = declaration.dtypes or available
    if wanted is not None:
        wanted = tuple(wanted)
        unknown = [d for d in wanted if d not in FLOAT_DTYPE_NAMES]
        if unknown or not wanted:
            raise SetupError(
                f"dtype {', '.join(unknown) or '(none)'} is not one of "
                f"{', '.join(FLOAT_DTYPE_NAMES)}"
            )
        claimed = tuple(d for d in claimed if d in wanted)
    usable = tuple(d for d in available if d in claimed)
    if not usable:
        asked = claimed if wanted is None else wanted
        reasons = [
            f"{d}: {backend.missing_dtype_reason(d)}"
            for d in asked
            if backend.missing_dtype_reason(d)
        ]
        raise SetupError(
            f"no dtype to test: the kernel claims {declaration.dtypes or 'every dtype'}, "
            f"backend {backend.name!r} has {', '.join(available)}"
            + (f", and only {', '.join(wanted)} was asked for" if wanted is not None else "")
            + (f" ({'; '.join(reasons)})" if reasons else "")
        )
    return replace(declaration, dtypes=usable) if wanted is not None else declaration


@dataclass(frozen=True)
class WorkerStart:
    """What a judging worker is sent first (:meth:`.supervisor.IsolatedKernel.worker_start`
    builds it, :func:`.worker.serve` reads it): the kernel's setup pickled for the kernel's
    own process (``setup_bytes``, the kernel's callables included) with the address space
    that process may add, the setup the judge makes its backend from (``judge_setup``: no
    kernel callable, which would import the kernel's module where it is judged), the
    seconds a kernel call and a load may take, and ``strict`` (``--judge``: every call
    made twice and its inputs re-read).  :func:`.worker.kernel_process_for` makes the
    kernel's process from it."""

    setup_bytes: bytes
    memory_limit_gib: float
    judge_setup: KernelSetup
    timeout: float
    load_timeout: float
    strict: bool = False


@dataclass(frozen=True)
class KernelSetup:
    """Everything needed to build a :class:`KernelUnderTest` (and to rebuild it elsewhere).

    ``kernel`` is a callable or a ``"MODULE:FUNC"`` / ``"path/to/file.py:FUNC"`` target;
    ``layout`` is "bhld" (the spec's) or "blhd" (see :func:`layouts.from_blhd`);
    ``rename`` maps spec keywords to the kernel's (see :func:`layouts.rename_arguments`);
    ``dtypes`` restricts the dtypes tested; ``claims`` override the declaration;
    ``jax_x64`` sets JAX's process-wide ``jax_enable_x64`` (None: leave it as it is, JAX's
    default being off, so float64 is then not checked; the report says so).
    """

    kernel: str | Callable[..., Any]
    backend: str | Backend | None = None
    device: str | None = None
    layout: str = "bhld"
    rename: Mapping[str, str] = field(default_factory=dict)
    dtypes: tuple[str, ...] | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)
    jax_x64: bool | None = None

    def make_backend(self) -> Backend:
        """The backend to check on, in the JAX configuration asked for (``jax_x64``);
        :class:`SetupError` when it is unusable."""
        backend = self.backend
        if backend is None and self.device is None:  # a known kernel's own library
            backend = known_backend(self.kernel)
        if self.jax_x64 is None:
            return resolve_backend(backend, self.device)
        name = backend.name if isinstance(backend, Backend) else backend
        if (name or get_backend().name) != "jax":
            raise SetupError(
                f"jax_x64 (--jax-x64) is a setting of the jax backend, but the "
                f"backend is {name or get_backend().name!r}"
            )
        return resolve_backend(backend, self.device, {"jax_enable_x64": self.jax_x64})

    def prepare(self, backend: Backend | None = None) -> KernelUnderTest:
        """Load and adapt the kernel; :class:`SetupError` (one line) on any problem.

        ``backend``: one already made by :meth:`make_backend` (a worker process makes it
        before capping its memory).
        """
        if self.layout not in LAYOUTS:
            raise SetupError(f"layout={self.layout!r}, but should be one of {', '.join(LAYOUTS)}")
        known = {f.name for f in fields(KernelDeclaration)}
        unknown = sorted(set(self.claims) - known)
        if unknown:
            raise SetupError(
                f"unknown claim(s) {', '.join(unknown)}; a declaration has "
                f"{', '.join(sorted(known))}"
            )
        backend = backend or self.make_backend()
        target = absolute_target(self.kernel) if isinstance(self.kernel, str) else None
        try:
            # kernel_function's steps, with the checks on the loaded kernel in between
            fn = loaded_kernel(self.kernel, adapt_known=self.layout == "bhld" and not self.rename)
            not_a_kernel = class_target_hint(fn, target or _name_of(fn))
            if not_a_kernel:
                raise SetupError(not_a_kernel)
            hints = signature_hints(fn, dict(self.rename))
            fn = in_spec_convention(fn, self.layout, self.rename)
            declaration = declaration_of(fn, **self.claims)
            if "softmax_scale" in suite_keywords(declaration):  # the family's own names
                hints = []
        except (KernelLoadError, ValueError, TypeError) as exc:
            raise SetupError(str(exc)) from None
        except SystemExit as exc:  # at import: exit status 0 must not read as "conforms"
            raise SetupError(
                f"loading kernel {self.kernel!r} called sys.exit({exc.code!r}) "
                "(at import?): nothing was checked"
            ) from None
        if declaration.rope is not None and self.layout != "bhld":
            raise SetupError(
                "a --rope function takes x (B, H, L, d), the spec's layout "
                "(ROPE-1): --layout does not apply"
            )
        if declaration.varlen and self.layout != "bhld":
            raise SetupError(
                "a --varlen kernel takes packed (total, heads, dim) arrays, "
                "FlashAttention's own layout (VARLEN-1): --layout does not apply"
            )
        declaration = _restrict_dtypes(declaration, backend, self.dtypes)
        _check_favor_features(declaration)
        _check_backward(declaration, backend)
        kernel = KernelUnderTest(fn, backend, declaration, target)
        check_signature(fn, declaration, kernel.target)
        kernel.setup_hints = hints
        guard_calls(kernel)
        kernel.loader = loader_source(self, kernel)
        return kernel


def _check_backward(declaration: KernelDeclaration, backend: Backend) -> None:
    """--backward on a library without automatic differentiation needs --backward-fn."""
    if declaration.backward and declaration.backward_fn is None and not backend.has_vjp:
        raise SetupError(
            f"--backward (backward=True) differentiates the kernel with its library's "
            f"automatic differentiation, which {backend.name} has none of: check it on "
            "torch or jax (--backend), or declare an explicit backward function "
            "(--backward-fn MODULE:FUNC, backward_fn=)"
        )


def _check_favor_features(declaration: KernelDeclaration) -> None:
    """A FAVOR+ kernel declared with too few features for LIN-6.2's test is a usage error
    (it would otherwise be a "could not check" failure)."""
    claim = declaration.linear
    if claim is None or claim.feature_map != "favor+":
        return
    problem = favor_usage_error(claim.num_features, FAVOR_TEST_QUERIES)
    if problem:
        raise SetupError(problem)


def size_limits(
    max_len: int | None = None,
    max_head_dim: int | None = None,
    max_batch_heads: int | None = None,
) -> SizeLimits:
    """The caps on drawn sizes, defaults where None (4096, 256, 512); a bad value is a
    :class:`SetupError` naming it."""
    given = {"max_len": max_len, "max_head_dim": max_head_dim, "max_batch_heads": max_batch_heads}
    try:
        chosen: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
        return SizeLimits(**chosen)
    except ValueError as exc:
        raise SetupError(str(exc)) from None


def size_limits_from(get: Getter, *, prefix: str | None = None) -> SizeLimits:
    """:func:`size_limits` from the :data:`SIZE_FLAGS` (``get(dest)``, None when not given;
    flags named ``--PREFIX-x`` when ``prefix``); the :class:`SetupError` for a bad value
    names the flag (``--max-len -3``), not the field."""
    try:
        return size_limits(**{flag.dest: get(flag.dest) for flag in SIZE_FLAGS})
    except SetupError as exc:
        message = str(exc)
        for flag in SIZE_FLAGS:
            name = flag.option if prefix is None else f"--{prefix}-{flag.option[2:]}"
            message = message.replace(f"{flag.dest}=", f"{name} ")
        raise SetupError(message) from None


def loader_source(setup: KernelSetup, kernel: KernelUnderTest) -> str:
    """Python lines that rebuild ``kernel`` as ``setup.prepare()`` built it: the
    environment a known kernel needs, the loading, adapter, renames and layout (one call
    of :func:`.kernel_setup.kernel_function`, which ``prepare`` builds it with too),
    device, JAX's x64 setting and the claims."""
    return rebuild_source(
        kernel.target,
        kernel.backend.name,
        kernel.declaration,
        layout=setup.layout,
        rename=setup.rename,
        device=setup.device,
        jax_x64=setup.jax_x64,
        environment=known_environment(kernel.fn),
    )
