"""The test process's guard against a forging kernel run in it (tests/conftest.py's
teardown hook calls it after every test; test_forgery.py shows it works)."""

from __future__ import annotations

from typing import Any

from attnspec.conformance.judge.registration import REGISTRY
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.run import property_runner

# the runner's entry point and each property's check as registered (a test's own
# property as first seen after a test), by the property object: a test after which
# another is found there ran a forging kernel here
_GENUINE_RUN_PROPERTY = property_runner.run_property
_CHECKS_SEEN: dict[int, tuple[Any, Any]] = {
    id(prop): (prop, prop.check) for prop in all_properties().values()
}


def undo_forgery_in_this_process() -> list[str]:
    """Put back what a kernel of catalogue/forgers.py changed in this process's property
    runner (CONF-9: its entry point, a registered property's check) and say what it was.
    Such a kernel run in the test process (``--no-isolate``, a check called in-process)
    would otherwise make every later in-process check of the worker pass."""
    forged = []
    if property_runner.run_property is not _GENUINE_RUN_PROPERTY:
        forged.append(f"property_runner.run_property was {property_runner.run_property!r}")
        property_runner.run_property = _GENUINE_RUN_PROPERTY
    for prop in REGISTRY.values():
        seen, check = _CHECKS_SEEN.setdefault(id(prop), (prop, prop.check))
        if seen is prop and prop.check is not check:
            forged.append(f"the check of {prop.id} was {prop.check!r}")
            object.__setattr__(prop, "check", check)
    return forged
