"""Running properties against a kernel and collecting one verdict per property."""

from __future__ import annotations

import inspect
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky, Unsatisfiable, UnsatisfiedAssumption

from ..draw import sizes
from ..draw.anchors import DTYPES, anchor_applies, anchor_options, anchors_of
from ..draw.input_features import avoided_dtype, features_of
from ..draw.one_example import SeededBesidesSizes, seeds_besides_sizes
from ..draw.realistic_values import COMBINATIONS
from ..draw.seeded import ShapePool
from ..draw.shape_pool import pool_for_run
from ..draw.sizes import SizeLimits, Stratum
from ..judge.failures import KernelExited, KernelHung, PropertyFailure, with_cause
from ..judge.kernel import KernelUnderTest
from ..judge.registry import Property, all_properties
from ..judge.reproduce import failure_snippet
from ..judge.verdict import FAILED, NOT_APPLICABLE, PASSED, WAIVED, WARNING, Report, Verdict
from .hypothesis_constants import no_local_constants
from .quick_bytes import quick_bytes

# Cost caps per example (sizes.problem_cost, ~ B Hq Lq Lk (E + Ev + 320)), set so that the
# default profile of PyTorch's SDPA takes about a quarter of its budget (measured with the
# row-chunked TOL-2 bound; docs/checking-your-kernel.md).  BLOCKS_COST fits one head of
# 203 x 203 at E = Ev = 8 or 129 x 129 at 64, decode against 4096 keys at any head dim, or
# 128 heads of 17 x 17; LONG_COST squares of 523 at E = Ev = 64, cross shapes of 129 x 4096;
# the huge stratum one head of max_len x max_len at E = Ev = 128 (huge_cost: 2^33.2 at
# 4096, the anchor).  Each stratum starts from its simplest example, of min_len keys:
# the first past a block of 16, 64, 256, 512 or 2048.
BLOCKS_COST, LONG_COST = 2**24, 2**28
# Anchors (conformance/draw/anchors.py) are fixed problems, each within ANCHOR_COST even
# observed through V = I (Ev = Lk; tests/conformance/test_strategies.py checks it).
ANCHOR_COST = 2**26
HUGE_HEAD_DIM = 128


def huge_cost(limits: SizeLimits) -> int:
    """The huge stratum's cap: one head of max_len x max_len at E = Ev = HUGE_HEAD_DIM."""
    length = limits.max_len
    return sizes.problem_cost(
        sizes.Dims(
            batch=(1,),
            n_kv_heads=1,
            groups=1,
            n_queries=length,
            n_keys=length,
            head_dim=HUGE_HEAD_DIM,
            value_dim=HUGE_HEAD_DIM,
        )
    )


@dataclass(frozen=True)
class Profile:
    """Examples per property, fewer the larger they may be (the cost model): ``small``
    of the small draws (they shrink well and cost little), ``anchors`` of each anchor
    problem (anchors.ANCHORS, fixed shapes from upstream test grids; a paged-batch
    property's own, ``anchors.anchors_of``), then realistic strata: ``blocks`` examples of
    at most BLOCKS_COST, ``decode`` ones (1-4 queries, at least 257 keys), ``wide`` ones
    (head dims past 128), ``corners`` of each option combination of values.COMBINATIONS
    (at least 65 keys) and as many mixed batches where a paged-batch property draws (query
    lengths from 1 to about 2000 in one batch: one more combination of its options),
    ``long`` ones of at most LONG_COST (at least 511 keys) and ``huge`` ones up to one
    max_len x max_len head.  ``budget_seconds``: the time the profile is sized for,
    PyTorch's SDPA on 2 CPU cores (docs/checking-your-kernel.md)."""

    small: int
    anchors: int = 0
    blocks: int = 0
    decode: int = 0
    wide: int = 0
    corners: int = 0
    long: int = 0
    huge: int = 0
    budget_seconds: float | None = None

    def strata(self, limits: SizeLimits, draws: str = "dense") -> list[Stratum]:
        """The strata in the order they run for a property drawing ``draws`` problems
        (``Property.draws``): small, its family's anchors, then ever larger random
        problems."""
        anchors = anchors_of(draws)
        strata = [
            Stratum("small", self.small),
            *(
                Stratum(
                    f"anchor: {anchor.name}" + (f", {dtype}" if dtype else ""),
                    self.anchors,
                    ANCHOR_COST,
                    anchor_options(anchor, dtype),
                    anchor=anchor,
                )
                for anchor in anchors
                for dtype in (DTYPES if anchor.each_dtype else (None,))
            ),
            Stratum("blocks", self.blocks, BLOCKS_COST, min_len=16),
            Stratum("decode", self.decode, BLOCKS_COST, (("shape", "decode"),), min_len=257),
            Stratum("wide heads", self.wide, BLOCKS_COST, min_len=16, min_head_dim=129),
            *(
                Stratum(
                    f"combination: {name}",
                    self.corners,
                    BLOCKS_COST,
                    tuple(forced.items()),
                    min_len=65,
                )
                for name, forced in COMBINATIONS
            ),
            *(
                [Stratum("mixed batch", self.corners, LONG_COST, (("shape", "mixed"),))]
                if draws == "paged-batch"
                else []
            ),
            Stratum("long", self.long, LONG_COST, min_len=511),
            Stratum("huge", self.huge, huge_cost(limits), min_len=2047),
        ]
        return [s for s in strata if s.examples > 0]

    def examples(self, dtypes: tuple[str, ...] = DTYPES, draws: str = "dense") -> int:
        """Examples per property (Hypothesis properties) drawing ``draws`` problems for a
        kernel checked in ``dtypes``: an anchor run in each dtype runs in each of those (a
        KV-cache anchor counted, which runs only where the kernel takes its options)."""
        anchors = sum(len(dtypes) if anchor.each_dtype else 1 for anchor in anchors_of(draws))
        return (
            self.small
            + self.anchors * anchors
            + self.blocks
            + self.decode
            + self.wide
            + self.long
            + self.huge
            + self.corners * len(COMBINATIONS)
            + (self.corners if draws == "paged-batch" else 0)
        )


PROFILES: dict[str, Profile] = {
    "quick": Profile(20, anchors=1, blocks=3, decode=1, wide=1, corners=1, budget_seconds=60),
    "default": Profile(
        100, anchors=1, blocks=20, decode=5, wide=5, corners=3, long=5, budget_seconds=300
    ),
    "thorough": Profile(
        1000,
        anchors=1,
        blocks=200,
        decode=50,
        wide=50,
        corners=20,
        long=40,
        huge=2,
        budget_seconds=3600,
    ),
}
# Profiles that nest (CONF-8): each runs every stratum of the one before it first, as
# that one runs it, so whatever a smaller profile finds the larger ones find too.
NESTED = ("quick", "default", "thorough")


def hypothesis_settings(
    profile: str, seed: int | None, examples: int | None = None, shrink: bool = True
) -> settings:
    """Reproducible, quiet, deadline-free settings: no flaky time limits, no database;
    ``examples`` (default: the profile's small stratum) examples; ``shrink`` False for
    fixed-size anchors, whose failure is reported as found."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r}, but should be one of {', '.join(PROFILES)}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed={seed!r}, but should be an int (or None: derandomised)")
    return settings(
        max_examples=PROFILES[profile].small if examples is None else examples,
        derandomize=seed is None,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
        # not inherited from a profile the user loaded: another backend draws otherwise
        backend="hypothesis",
        phases=(Phase.explicit, Phase.generate, *((Phase.shrink,) if shrink else ())),
    )


def _failed_verdict(
    prop: Property, failure: PropertyFailure, *, lost_control: bool = False, reproduce: bool = True
) -> Verdict:
    """The verdict of a failed property: FAILED for a MUST clause, a WARNING for a SHOULD
    one; ``lost_control``: the kernel crashed, exited or hung, which fails the property
    whatever its level (CONF-5 is a MUST: a SHOULD property that expects the kernel to
    raise, PAGED-6's, must not take a crash for a mere warning).  ``reproduce`` False: no
    reproduction (for callers that read the status and the finding only)."""
    level = prop.level
    kernel = failure.kernel
    return Verdict(
        property=prop.id,
        clause=prop.clause,
        level=level,
        status=FAILED if level == "MUST" or lost_control else WARNING,
        detail=failure.finding,
        counterexample=failure.counterexample,
        reproduction=failure_snippet(failure) if reproduce else "",
        hint=failure.hint,
        features=features_of(failure.problem, getattr(kernel, "declaration", None)),
    )


def _stratum_seed(seed: int | None, prop: Property, stratum: Stratum, part: str = "") -> int:
    """The Hypothesis seed of one (run seed, property, stratum): fixed without --seed, so a
    run reproduces whatever the runner's own code looks like, and different for every
    property and stratum, so they explore different examples.  ``part``: the smaller
    profile whose examples a later part of a nested stratum continues (CONF-8).  A property
    that draws as another (``prop.draws_as``) gets that one's seeds: the same examples."""
    salt = f":{part}" if part else ""
    return zlib.crc32(f"{seed}:{prop.draws_as or prop.id}:{stratum.name}{salt}".encode())


def _run_strata(
    prop: Property,
    kernel: KernelUnderTest,
    profile: str,
    seed: int | None,
    limits: SizeLimits,
    examples: list[int],
    shrink: bool = True,
) -> None:
    """Each stratum of the profile in turn, as one Hypothesis run; the first failure
    ends the property (smaller strata first, so it is the smallest stratum that fails;
    a failing anchor names itself).  ``examples[0]`` counts the examples checked: not
    those discarded because they have a feature ``limits.avoid`` leaves out."""
    # one pool per run; members are the same in every process (shape_pool)
    pool = pool_for_run(seed) if kernel.backend.compiles_per_shape else None
    avoided_dtypes = {avoided_dtype(name) for name in limits.avoid} - {None}
    if set(kernel.dtypes) <= avoided_dtypes:
        return  # a re-run drawing around every dtype checked: no example can be drawn
    for whole in PROFILES[profile].strata(limits, prop.draws):
        dtype = whole.option("dtype")
        if dtype not in (None, "widest", *kernel.dtypes) or dtype in avoided_dtypes:
            continue  # an anchor in a dtype the kernel is not checked in (or drawn around)
        if not anchor_applies(whole.anchor, kernel.declaration.kv_cache_features):
            continue  # a KV-cache anchor passing options the kernel does not take
        for stratum, count, part_seed in _nested_parts(profile, whole, limits, seed, prop):
            # one example of a realistic stratum: its sizes the simplest, nothing else
            seeded = part_seed if seeds_besides_sizes(stratum, count) else None

            @hypothesis_seed(part_seed)
            @hypothesis_settings(profile, seed, count, shrink=shrink and stratum.anchor is None)
            @given(st.data())
            def property_test(data: st.DataObject) -> None:
                examples[0] += 1
                # called in this iteration of the loop, so its seeded is this stratum's
                quick = QuickDraws(data) if QUICK_DRAWS else data
                drawn = quick if seeded is None else SeededBesidesSizes(quick, seeded)  # noqa: B023
                try:
                    prop.check(kernel, drawn)
                except UnsatisfiedAssumption:  # it had a feature the run draws around
                    examples[0] -= 1
                    raise

            # no example database (hypothesis_settings), so no database key: Hypothesis
            # would otherwise digest this function's source (inspect + tokenize) on every
            # run, ~5% of a small property's run; its own find() skips it the same way
            property_test._hypothesis_internal_database_key = None  # type: ignore[attr-defined]
            _run_part(property_test, stratum, limits, pool)


def _quick_draws_supported() -> bool:
    """Whether this Hypothesis has the internals QuickDraws draws through (``should_note``,
    ``ConjectureData.draw(..., observe_as=)``, checked against 6.170); where one is missing
    every draw is ``data.draw`` itself: slower, the same examples."""
    try:
        from hypothesis.internal.conjecture.data import ConjectureData
    except ImportError:
        return False
    return (
        should_note is not None
        and "observe_as" in inspect.signature(ConjectureData.draw).parameters
    )


try:  # once here, not on every draw
    from hypothesis.control import should_note
except ImportError:
    should_note = None  # type: ignore[assignment]
QUICK_DRAWS = _quick_draws_supported()


class QuickDraws:
    """Hypothesis's ``data`` (``st.data()``), drawing the same choices without the check
    that ``data.draw`` wraps around each draw for the global ``random`` module used inside
    a strategy (two ``random.getstate()`` of 625 words and their comparison: ~7 % of a
    small example's time, issue 33; no strategy of the suite touches ``random``).  Each
    draw is ``data.conjecture_data.draw(strategy)``, as ``data.draw`` makes it (the same
    choices, spans and labels: the same examples, shrinks and verdicts), counted as
    ``data.draw`` counts and names it.  Where Hypothesis prints the draws (the final replay of a
    failing example, a verbose run) every draw is ``data.draw`` itself, notes included."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data
        self.conjecture_data = data.conjecture_data  # small_values draws through it

    def draw(self, strategy: st.SearchStrategy[Any], label: Any = None) -> Any:
        if should_note():
            return self._data.draw(strategy, label)
        self._data.count += 1
        named = f"Draw {self._data.count}" + ("" if label is None else f" ({label})")
        return self.conjecture_data.draw(strategy, observe_as=f"generate:{named}")


def _nested_parts(
    profile: str, stratum: Stratum, limits: SizeLimits, seed: int | None, prop: Property
) -> list[tuple[Stratum, int, int]]:
    """The Hypothesis runs of one stratum of ``profile``, as (stratum, examples, seed):
    profiles nest (CONF-8), so a stratum of a profile of NESTED first runs exactly the
    same stratum of each smaller profile of NESTED (the same examples, seed and pools:
    ``stratum.examples`` sizes the pools, conformance/shape_pool.py), then its examples
    past those, under a seed of their own, from pools that extend the first part's
    (``pool_examples``).  Other profiles run as one part."""
    if profile not in NESTED:
        return [(stratum, stratum.examples, _stratum_seed(seed, prop, stratum))]
    parts: list[tuple[Stratum, int, int]] = []
    done = 0
    for smaller in NESTED[: NESTED.index(profile) + 1]:
        total = next(
            (
                s.examples
                for s in PROFILES[smaller].strata(limits, prop.draws)
                if s.name == stratum.name
            ),
            0,
        )
        total = min(total, stratum.examples)
        if total <= done:
            continue
        # the first part's seed is the one a profile of one part would use
        part_seed = _stratum_seed(seed, prop, stratum, smaller if parts else "")
        # every part's pools are keyed as the first part's, sized for its own total: they
        # hold the first part's members first (shape_pool.pool_key)
        first = parts[0][0].examples if parts else total
        pool_examples = total if parts else stratum.pool_examples
        part = replace(stratum, examples=first, pool_examples=pool_examples)
        parts.append((part, total - done, part_seed))
        done = total
    return parts


@contextmanager
def _drawing(
    stratum: Stratum, limits: SizeLimits | None, pool: ShapePool | None = None
) -> Iterator[None]:
    """``sizes.drawing``, and the reported failure (Hypothesis's shrunk example, a fixed
    property's one) made into what the report says: its cause probed, once and within the
    run's limits, not on every failing example tried while shrinking
    (``failures.with_cause``); a failing anchor named."""
    with sizes.drawing(stratum, limits, pool):
        try:
            yield
        except PropertyFailure as failure:
            with_cause(failure)
            if stratum.anchor is not None:
                failure.finding += (
                    f" [anchor problem {stratum.name.split(': ', 1)[1]!r}"
                    f" ({stratum.anchor.source}), conformance/draw/anchors.py]"
                )
            raise


def _run_part(
    property_test: Callable[[], None],
    stratum: Stratum,
    limits: SizeLimits,
    pool: ShapePool | None,
) -> None:
    """One Hypothesis run of (part of) ``stratum`` (:func:`_drawing`), drawing what its
    seed draws in any process: no constants of the modules imported (hypothesis_constants);
    its bytes choices drawn without Hypothesis's bookkeeping per byte (quick_bytes: the
    same bytes)."""
    with _drawing(stratum, limits, pool), no_local_constants(), quick_bytes():
        try:
            property_test()
        except Unsatisfiable:
            if not limits.avoid:
                raise
            # every draw of this stratum had an avoided feature: nothing to check here


def run_property(
    prop: Property,
    kernel: KernelUnderTest,
    *,
    profile: str = "quick",
    seed: int | None = None,
    limits: SizeLimits | None = None,
    shrink: bool = True,
    reproduce: bool = True,
) -> Verdict:
    """Run one property; a kernel that does not claim it gets "not applicable" (CONF-3).

    ``limits`` caps the sizes drawn (default: ``SizeLimits()``).  ``shrink=False`` reports
    the first failing example as found: the same status, for callers that need only that.
    ``reproduce=False`` leaves a failure's reproduction out (the same status and finding):
    its literals of every input are most of a failure's cost on a large problem (a first
    failing example at an anchor's size, ~45 MB of text and ~1 CPU-s)."""
    started = time.perf_counter()
    waivers = kernel.declaration.waivers()
    if prop.clause in waivers:
        return Verdict(
            prop.id,
            prop.clause,
            prop.level,
            WAIVED,
            detail=f"waived: the kernel declares {waivers[prop.clause]}, so "
            f"{prop.clause} is not checked (CONF-7)",
        )
    reason = prop.not_applicable(kernel.declaration, kernel.backend)
    if reason is not None:
        return Verdict(prop.id, prop.clause, prop.level, NOT_APPLICABLE, detail=reason)
    examples = [0]
    kernel.notes.clear()
    kernel_seconds = kernel.kernel_seconds
    try:
        if prop.kind == "fixed":
            with _drawing(sizes.SMALL, limits):  # its sizes within the user's limits
                prop.check(kernel, 0 if seed is None else seed)
            examples[0] = 1
        else:
            _run_strata(prop, kernel, profile, seed, limits or SizeLimits(), examples, shrink)
    except PropertyFailure as failure:
        verdict = _failed_verdict(prop, failure, reproduce=reproduce)
    except KernelExited as exited:
        verdict = _failed_verdict(prop, exited.failure, lost_control=True, reproduce=reproduce)
        verdict.stalled = isinstance(exited, KernelHung)
        # a crash, an exit or a hang is the finding whatever the inputs: not re-run
        # around their features (it would cost another timeout, root_causes)
        verdict.features = []
    except Flaky as flaky:
        verdict = _failed_verdict(
            prop,
            PropertyFailure(
                "a failure seen on one run did not recur when Hypothesis re-ran the same input: "
                f"the kernel's output is not reproducible (SDPA-7.5) [{type(flaky).__name__}]"
            ),
        )
    except Exception as exc:  # an unusable result, e.g. not an array: still a verdict
        verdict = _failed_verdict(
            prop,
            PropertyFailure(
                f"the property could not check the kernel's result: {type(exc).__name__}: "
                f"{str(exc)[:300]}"
            ),
        )
    else:
        verdict = Verdict(
            prop.id, prop.clause, prop.level, PASSED, detail="; ".join(kernel.notes[:2])
        )
    verdict.clause = declared_clause(verdict.clause, kernel.declaration)
    verdict.examples = examples[0]
    verdict.seconds = time.perf_counter() - started
    verdict.kernel_seconds = kernel.kernel_seconds - kernel_seconds
    return verdict


def declared_clause(clause: str, declaration: Any) -> str:
    """The clause a verdict cites for a kernel with ``declaration``: the causal properties
    are registered under SDPA-4.1 (top-left) and check the declared alignment, so a
    bottom-right kernel's verdicts cite SDPA-4.2 and its failures are headed so."""
    if clause == "SDPA-4.1" and getattr(declaration, "causal_alignment", "") == "bottom_right":
        return "SDPA-4.2"
    return clause


def select(only: Iterable[str] | None = None, skip: Iterable[str] | None = None) -> list[Property]:
    """The registered properties, filtered by id; unknown ids are a ValueError."""
    registry = all_properties()
    chosen = list(only) if only else list(registry)
    unknown = [p for p in [*chosen, *(skip or ())] if p not in registry]
    if unknown:
        raise ValueError(
            f"unknown property id(s) {', '.join(unknown)}; known: {', '.join(registry)}"
        )
    skipped = set(skip or ())
    return [registry[p] for p in chosen if p not in skipped]


def new_report(
    kernel: Any, *, profile: str, seed: int | None, strict: bool, limits: SizeLimits | None = None
) -> Report:
    """An empty report for ``kernel`` (a KernelUnderTest, or what a worker process says
    of one: anything with ``target``, ``backend.name`` / ``backend.device`` and
    ``declaration``), naming the MUST clauses its declaration waives (CONF-7)."""
    return Report(
        kernel.target,
        kernel.backend.name,
        str(kernel.backend.device),
        profile,
        seed,
        strict,
        limits=limits or SizeLimits(),
        waived=list(kernel.declaration.waived),
    )


def run_each(
    properties: Iterable[Property],
    run_one: Callable[[Property], Verdict],
    report: Report,
    progress: Callable[[Property, Verdict | None], None] | None = None,
) -> Report:
    """Append ``run_one(prop)`` for each property to ``report`` as it finishes, so a caller
    holding ``report`` keeps every finished verdict if the run is interrupted."""
    for prop in properties:
        if progress:
            progress(prop, None)
        verdict = run_one(prop)
        report.verdicts.append(verdict)
        if progress:
            progress(prop, verdict)
    return report
