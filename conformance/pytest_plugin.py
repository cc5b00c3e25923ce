"""pytest plugin: ``pytest --attnspec-kernel MODULE:FUNC`` runs the suite as test items.

One item per property, named ``attnspec::<property>[<clause>]``.  A failed MUST
property fails its item; a failed SHOULD property is a pytest warning (a failure with
``--attnspec-strict``, CONF-2); a property the kernel does not claim is skipped with
the reason (CONF-3).  Registered through the ``pytest11`` entry point, so it is loaded
in every pytest run: without ``--attnspec-kernel`` it only adds its options.
"""

from __future__ import annotations

import shlex
import warnings
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported lazily: a pytest run without the option pays nothing
    from .api import KernelSetup
    from .kernel import KernelUnderTest
    from .registry import Property
    from .runner import Verdict
    from .sizes import SizeLimits


MAX_SHOWN_REPRODUCTION = 6000  # characters of a reproduction shown in a failure
SIZE_OPTIONS = (("max-len", 4096, "Lq and Lk"), ("max-head-dim", 256, "head dims E and Ev"),
                ("max-batch-heads", 512, "batch x query heads"))


class AttnspecWarning(UserWarning):
    """A SHOULD clause the kernel does not follow (reported, not failed: CONF-2)."""


class PropertyFailed(Exception):
    """A MUST property failed; the message is the whole finding with its reproduction."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnspec", "attnspec conformance suite")
    group.addoption("--attnspec-kernel", metavar="MODULE:FUNC", default=None,
                    help="check this kernel (or path/to/file.py:FUNC) against the attention "
                         "spec, one test item per property")
    group.addoption("--attnspec-backend", default=None, metavar="NAME",
                    help="array library to run the kernel on (default: ATTNSPEC_BACKEND or numpy)")
    group.addoption("--attnspec-device", default=None, metavar="DEVICE",
                    help="device on that backend, e.g. cpu or cuda:0")
    group.addoption("--attnspec-profile", default="quick", metavar="PROFILE",
                    help="quick (20 small and 10 realistic examples per property), default "
                         "(~5x) or thorough (~50x)")
    for name, default, what in SIZE_OPTIONS:
        group.addoption(f"--attnspec-{name}", default=None, type=int, metavar="N",
                        help=f"largest {what} drawn (default {default})")
    group.addoption("--attnspec-seed", default=None, type=int, metavar="N",
                    help="random seed (default: derandomised, reproducible runs)")
    group.addoption("--attnspec-strict", action="store_true", default=False,
                    help="fail on SHOULD clauses too, not only MUST")
    group.addoption("--attnspec-only", action="append", default=None, metavar="ID",
                    help="run only these property ids (repeatable or comma list)")
    group.addoption("--attnspec-skip", action="append", default=None, metavar="ID",
                    help="skip these property ids (repeatable or comma list)")
    group.addoption("--attnspec-layout", default="bhld", metavar="LAYOUT",
                    help="bhld (the spec's layout) or blhd (JAX/FlashAttention)")
    group.addoption("--attnspec-claim", action="append", default=None, metavar="KEY=VALUE",
                    help="override a declaration field, e.g. bias=True or "
                         "causal_alignment=bottom_right (repeatable)")


def _ids(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("attnspec_kernel")
    if target is None:
        return
    from .api import KernelSetup, SetupError, size_limits
    from .cli import UsageError, key_values
    from .runner import select

    option = config.getoption
    try:
        setup = KernelSetup(
            target, option("attnspec_backend"), option("attnspec_device"),
            option("attnspec_layout"), claims=key_values(option("attnspec_claim"),
                                                          "--attnspec-claim"),
        )
        properties = select(_ids(option("attnspec_only")), _ids(option("attnspec_skip")))
        limits = size_limits(*(option(f"attnspec_{name.replace('-', '_')}")
                               for name, _, _ in SIZE_OPTIONS))
        kernel = setup.prepare()
        from .runner import hypothesis_settings

        hypothesis_settings(option("attnspec_profile"), option("attnspec_seed"))
    except (SetupError, UsageError, ValueError) as exc:
        raise pytest.UsageError(f"attnspec: {exc}") from None
    config.pluginmanager.register(AttnspecSession(config, setup, kernel, properties, limits),
                                  "attnspec-session")


class AttnspecSession:
    """Holds the kernel under test for one pytest session and adds its items."""

    def __init__(self, config: pytest.Config, setup: KernelSetup, kernel: KernelUnderTest,
                 properties: list[Property], limits: SizeLimits) -> None:
        self.config, self.setup, self.kernel, self.properties = config, setup, kernel, properties
        self.limits = limits
        self.verdicts: list[Verdict] = []

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselect, so they select properties too
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        collector = AttnspecCollector.from_parent(session, name="attnspec", nodeid="attnspec")
        collected = collector.collect()
        # Reported like any collector's result, so "collected N items" counts these.
        session.ihook.pytest_collectreport(
            report=pytest.CollectReport(collector.nodeid, "passed", None, collected)
        )
        items.extend(collected)

    def verdict(self, prop: Property) -> Verdict:
        option = self.config.getoption
        report = self.setup.run(
            profile=option("attnspec_profile"), seed=option("attnspec_seed"), only=[prop.id],
            strict=option("attnspec_strict"), kernel=self.kernel, limits=self.limits,
        )
        self.verdicts.extend(report.verdicts)
        return report.verdicts[0]

    def rerun(self, verdict: Verdict) -> str:
        """A pytest command that reruns just this property."""
        option = self.config.getoption
        tokens = ["pytest", "--attnspec-kernel", self.kernel.target]
        for name in ("backend", "device", "seed", *(n for n, _, _ in SIZE_OPTIONS)):
            value = option(f"attnspec_{name.replace('-', '_')}")
            if value is not None:
                tokens += [f"--attnspec-{name}", str(value)]
        for name in ("profile", "layout"):
            tokens += [f"--attnspec-{name}", option(f"attnspec_{name}")]
        for claim in option("attnspec_claim") or ():
            tokens += ["--attnspec-claim", claim]
        return shlex.join([*tokens, "--attnspec-only", verdict.property])

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.verdicts:
            return
        from .report import summary_line
        from .runner import Report

        option = self.config.getoption
        report = Report(self.kernel.target, self.kernel.backend.name,
                        str(self.kernel.backend.device), option("attnspec_profile"),
                        option("attnspec_seed"), option("attnspec_strict"), self.verdicts)
        terminalreporter.write_sep("=", "attnspec")
        terminalreporter.write_line(f"{self.kernel.target}: {summary_line(report)}")


class AttnspecCollector(pytest.Collector):
    """The virtual collector ``attnspec``: one item per selected property."""

    def collect(self) -> list[pytest.Item]:
        session: AttnspecSession = self.config.pluginmanager.get_plugin("attnspec-session")
        return [
            AttnspecItem.from_parent(self, name=f"{prop.id}[{prop.clause}]", prop=prop,
                                     owner=session)
            for prop in session.properties
        ]


class AttnspecItem(pytest.Item):
    """One property of the spec run against the kernel."""

    def __init__(self, *, prop: Property, owner: AttnspecSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prop, self.owner = prop, owner

    def runtest(self) -> None:
        from .report import failure_text
        from .runner import FAILED, NOT_APPLICABLE, WARNING

        verdict = self.owner.verdict(self.prop)
        if verdict.status == NOT_APPLICABLE:
            pytest.skip(f"not applicable: {verdict.detail}")
        # The finding comes first: pytest's short summary shows the first line.
        text = f"{verdict.detail}\n" + failure_text(
            verdict, self.owner.rerun, max_reproduction=MAX_SHOWN_REPRODUCTION,
            full_reproduction_in="the JSON report of: attnspec check ... --json PATH",
        )
        if verdict.status == FAILED or (
            verdict.status == WARNING and self.config.getoption("attnspec_strict")
        ):
            raise PropertyFailed(text)
        if verdict.status == WARNING:
            warnings.warn(AttnspecWarning(text), stacklevel=1)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, PropertyFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"attnspec {self.prop.id} [{self.prop.clause}]"
