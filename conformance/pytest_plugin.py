"""pytest plugin: ``pytest --attnspec-kernel MODULE:FUNC`` runs the suite as test items.

One item per property, named ``attnspec::<property>[<clause>]``.  A failed MUST
property fails its item; a failed SHOULD property is a pytest warning (a failure with
``--attnspec-strict``, CONF-2); a property the kernel does not claim is skipped with
the reason (CONF-3).  Registered through the ``pytest11`` entry point, so it is loaded
in every pytest run: without ``--attnspec-kernel`` it only adds its options.

The items run unchanged under pytest-xdist (``pytest -n auto``, or remote workers): each
xdist worker loads the kernel and runs the items it is given; the verdicts travel back
to the controlling process, which prints the summary and the conformance claim.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported lazily: a pytest run without the option pays nothing
    from .claims.flags import Flag
    from .judge.registry import Property
    from .judge.verdict import Report, Verdict
    from .plan import RunPlan, Session


PREFIX = "attnspec"
VERDICTS_KEY = "attnspec_verdicts"  # pytest-xdist: a worker's verdicts, in its workeroutput


class AttnspecWarning(UserWarning):
    """A SHOULD clause the kernel does not follow (reported, not failed: CONF-2)."""


class PropertyFailed(Exception):
    """A MUST property failed; the message is the whole finding with its reproduction."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnspec", "attnspec conformance suite")
    group.addoption(
        "--attnspec-kernel",
        metavar="MODULE:FUNC",
        default=None,
        help="check this kernel (or path/to/file.py:FUNC) against the attention "
        "spec, one test item per property",
    )
    group.addoption(
        "--attnspec-backend",
        default=None,
        metavar="NAME",
        help="array library to run the kernel on (default: ATTNSPEC_BACKEND or numpy)",
    )
    group.addoption(
        "--attnspec-device",
        default=None,
        metavar="DEVICE",
        help="device on that backend, e.g. cpu or cuda:0",
    )
    group.addoption(
        "--attnspec-profile",
        default="quick",
        metavar="PROFILE",
        help="quick (20 small and 10 realistic examples per property), default "
        "(~5x) or thorough (~50x)",
    )
    group.addoption(
        "--attnspec-seed",
        default=None,
        type=int,
        metavar="N",
        help="random seed (default: derandomised, reproducible runs)",
    )
    group.addoption(
        "--attnspec-strict",
        action="store_true",
        default=False,
        help="fail on SHOULD clauses too, not only MUST",
    )
    group.addoption(
        "--attnspec-only",
        action="append",
        default=None,
        metavar="ID",
        help="run only these property ids (repeatable or comma list)",
    )
    group.addoption(
        "--attnspec-skip",
        action="append",
        default=None,
        metavar="ID",
        help="skip these property ids (repeatable or comma list)",
    )
    group.addoption(
        "--attnspec-claim",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="override a declaration field, e.g. bias=True or "
        "causal_alignment=bottom_right (repeatable)",
    )
    group.addoption(
        "--attnspec-isolate",
        action="store_true",
        default=False,
        help="run the kernel in a supervised worker process, as `attnspec check` "
        "does: a crash, exit or hang fails the property that was running "
        "instead of the pytest run",
    )
    # every declaration `attnspec check` takes, from the same tables, as --attnspec-<flag>
    for flag in _shared_flags():
        flag.add_prefixed(group, PREFIX)


def _shared_flags() -> tuple[Flag, ...]:
    """The flags the plugin shares with ``attnspec check`` (the size caps, the claims
    table's declarations, the worker's supervision), each as ``--attnspec-<flag>``."""
    from .claims.table import CLAIM_FLAGS, SETUP_FLAGS
    from .run.shared_flags import SIZE_FLAGS, SUPERVISION_FLAGS

    return (*SIZE_FLAGS, *SETUP_FLAGS, *CLAIM_FLAGS, *SUPERVISION_FLAGS)


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("attnspec_kernel")
    if target is None:
        return
    from .api import KernelSetup, SetupError, size_limits_from
    from .claims.flags import UsageError, comma_list, key_values
    from .claims.table import claims_from, setup_from
    from .plan import plan_run
    from .run.supervisor import isolation_options

    option = config.getoption

    def flag_value(dest: str) -> Any:
        return option(f"{PREFIX}_{dest}")

    try:
        claims = {
            **claims_from(flag_value),
            **key_values(option("attnspec_claim"), "--attnspec-claim"),
        }
        setup = KernelSetup(
            target,
            option("attnspec_backend"),
            option("attnspec_device"),
            claims=claims,
            **setup_from(flag_value),
        )
        isolation = isolation_options(
            option("attnspec_isolate"),
            flag_value,
            prefix=PREFIX,
            without="they need --attnspec-isolate",
        )
        plan = plan_run(
            setup,
            profile=option("attnspec_profile"),
            seed=option("attnspec_seed"),
            only=comma_list(option("attnspec_only")),
            skip=comma_list(option("attnspec_skip")),
            strict=option("attnspec_strict"),
            limits=size_limits_from(flag_value, prefix=PREFIX),
            isolation=isolation,
        )
        session = plan.session()
        session.start()  # load the kernel (in its worker when isolated) before collecting
    except (SetupError, UsageError, ValueError) as exc:
        raise pytest.UsageError(f"attnspec: {exc}") from None
    config.pluginmanager.register(AttnspecSession(config, session, plan), "attnspec-session")


class AttnspecSession:
    """Holds the kernel under test (loaded here, or in a worker process with
    ``--attnspec-isolate``) for one pytest session and adds its items."""

    def __init__(
        self,
        config: pytest.Config,
        session: Session,
        plan: RunPlan,
    ) -> None:
        self.config, self.session, self.plan = config, session, plan
        self.properties = list(plan.properties)
        self.kernel = session.start()
        self.verdicts: list[Verdict] = []

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.session.close()  # stops the worker process

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """In a pytest-xdist worker: hand this worker's verdicts to the controller."""
        output = getattr(self.config, "workeroutput", None)
        if output is not None:
            from dataclasses import asdict

            output[VERDICTS_KEY] = [asdict(verdict) for verdict in self.verdicts]

    @pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """In the pytest-xdist controller: collect the verdicts of a worker that ended."""
        from .judge.verdict import Verdict

        output = getattr(node, "workeroutput", None) or {}
        self.verdicts.extend(Verdict(**fields) for fields in output.get(VERDICTS_KEY, ()))

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselect, so they select properties too
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        collector = AttnspecCollector.from_parent(session, name="attnspec", nodeid="attnspec")
        collected = collector.collect()
        # Reported like any collector's result, so "collected N items" counts these.
        session.ihook.pytest_collectreport(
            report=pytest.CollectReport(collector.nodeid, "passed", None, list(collected))
        )
        items.extend(collected)

    def verdict(self, prop: Property) -> Verdict:
        from .call.side_effects import hypothesis_storage_elsewhere

        plan = self.plan
        with hypothesis_storage_elsewhere():
            verdict = self.session.run_property(
                prop, profile=plan.profile, seed=plan.seed, limits=plan.limits
            )
        self.verdicts.append(verdict)
        return verdict

    def rerun(self, verdict: Verdict) -> str:
        """A pytest command that reruns just this property."""
        from .judge.reproduce import pytest_rerun_command

        return pytest_rerun_command(
            self.kernel.target, self.config.getoption, _shared_flags(), PREFIX, verdict.property
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.verdicts:
            return
        from .judge.registry import all_properties
        from .plan import finish_report, start_report
        from .report.render import summary_line

        report = start_report(self.session, self.plan)
        order = {prop.id: i for i, prop in enumerate(self.properties)}  # xdist: any order
        report.verdicts = sorted(self.verdicts, key=lambda v: order.get(v.property, len(order)))
        # a claim needs every property to have run (no --attnspec-only/-skip, no -k)
        partial = len({v.property for v in self.verdicts}) < len(all_properties())
        finish_report(report, self.session, partial=partial)
        terminalreporter.write_sep("=", "attnspec")
        for note in report.notes:
            terminalreporter.write_line(f"note: {note}")
        for line in self.root_causes(report):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"{self.kernel.target}: {summary_line(report)}")
        for hint in report.hints:
            terminalreporter.write_line(f"hint: {hint}")
        terminalreporter.write_line(report.claim)

    def root_causes(self, report: Report) -> list[str]:
        """The failures re-run around the other clauses the kernel failed, as the CLI does
        (root_causes.draw_around), then the causes as the console tells them
        (:func:`.report.render.cause_summary`: each probed cause with its evidence, hint
        and the failures it explains, then the divergences no probe explains, with the
        failures that follow from them): the items above keep their own verdicts."""
        from .report.render import cause_summary
        from .run.root_causes import draw_around, one_at_a_time

        plan = self.plan
        # one at a time, as pytest ran the items, on the plugin's one session (plan_run's
        # jobs=1: one worker with --attnspec-isolate, else this process)
        draw_around(
            report,
            self.properties,
            one_at_a_time(
                lambda prop, around: self.session.run_property(
                    prop, profile=plan.profile, seed=plan.seed, limits=around
                )
            ),
            plan.limits,
        )
        return cause_summary(report)


class AttnspecCollector(pytest.Collector):
    """The virtual collector ``attnspec``: one item per selected property."""

    def collect(self) -> list[pytest.Item]:
        session = self.config.pluginmanager.get_plugin("attnspec-session")
        if not isinstance(session, AttnspecSession):
            raise RuntimeError("attnspec: the collector needs the attnspec-session plugin")
        return [
            AttnspecItem.from_parent(
                self, name=f"{prop.id}[{prop.clause}]", prop=prop, owner=session
            )
            for prop in session.properties
        ]


class AttnspecItem(pytest.Item):
    """One property of the spec run against the kernel."""

    def __init__(self, *, prop: Property, owner: AttnspecSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prop, self.owner = prop, owner

    def runtest(self) -> None:
        from .judge.reproduce import reproduction_file
        from .judge.verdict import FAILED, NOT_APPLICABLE, WAIVED, WARNING
        from .report.render import failure_text

        verdict = self.owner.verdict(self.prop)
        if verdict.status == NOT_APPLICABLE:
            pytest.skip(f"not applicable: {verdict.detail}")
        if verdict.status == WAIVED:  # the detail says "waived: ..." (CONF-7)
            pytest.skip(verdict.detail)
        # The finding comes first: pytest's short summary shows the first line.
        text = f"{verdict.detail}\n" + failure_text(
            verdict,
            self.owner.rerun,
            full_reproduction_in=reproduction_file,
        )
        if verdict.status == FAILED or (verdict.status == WARNING and self.owner.plan.strict):
            raise PropertyFailed(text)
        if verdict.status == WARNING:
            warnings.warn(AttnspecWarning(text), stacklevel=1)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, PropertyFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"attnspec {self.prop.id} [{self.prop.clause}]"
