"""When a run stops early, so that it always ends in bounded time with a complete report.

A kernel that hangs on every call would otherwise cost one ``--timeout`` per applicable
property (about 29 on the quick profile: a quarter of an hour at 60 s).  The
:class:`RunBudget` of a run counts the properties whose kernel call outlasted the timeout
(``Verdict.stalled``); once ``stall_budget`` of them have, no further property starts,
and each property left gets a ``not run`` verdict saying why.  ``deadline`` seconds of
wall time after the run starts, the same.  The verdicts already given stand: a stalled
property is FAILED (CONF-5), so such a run exits 1 with every property listed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..judge.registry import Property
from ..judge.verdict import NOT_RUN, Verdict


@dataclass
class RunBudget:
    """How many stalls and how much wall time a run may take (see the module doc)."""

    stall_budget: int | None = None  # None: no limit (an in-process run cannot time out)
    deadline: float | None = None  # seconds from ``started``
    started: float = field(default_factory=time.monotonic)
    stalls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def heard(self, verdict: Verdict) -> None:
        """Count ``verdict`` against the budget (thread-safe: workers report at once)."""
        if verdict.stalled:
            with self._lock:
                self.stalls += 1

    def reason_to_stop(self) -> str:
        """Why no property should start now ("" while the run may go on)."""
        with self._lock:
            stalls = self.stalls
        if self.stall_budget is not None and stalls >= self.stall_budget:
            return (
                f"not run: the kernel hung (a call outlasted --timeout) in {stalls} "
                f"properties, the run's stall budget (--stall-budget {self.stall_budget}); "
                "the check stopped starting properties [CONF-5]"
            )
        if self.deadline is not None and time.monotonic() - self.started >= self.deadline:
            return (
                f"not run: the run's --deadline of {self.deadline:g} s passed before this "
                "property started"
            )
        return ""

    def not_run(self, prop: Property, reason: str) -> Verdict:
        """The verdict of a property the run did not start."""
        return Verdict(prop.id, prop.clause, prop.level, NOT_RUN, detail=reason)
