"""The conformance suite on the recurrence catalogue (tests/catalogue/recurrent.py): the
two correct formulations pass every recurrence property in the quick profile, every
catalogued bug fails ``recurrent-matches-reference``, and every bug of the contracts
(state passing, packed sequences, chunk sizes) fails the property of its clause (issue 37)."""

from __future__ import annotations

import pytest

from attnspec.conformance import check
from catalogue import recurrent as catalogue

RECURRENT_PROPERTIES = (
    "recurrent-state-passing",
    "recurrent-decode",
    "recurrent-varlen",
    "recurrent-chunk-size",
    "recurrent-matches-reference",
)


def _statuses(fn: object, only: tuple[str, ...] | None = None, seed: int = 0) -> dict[str, str]:
    report = check(fn, backend="numpy", profile="quick", seed=seed, only=only)
    return {v.property: v.status for v in report.verdicts}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """One quick-profile check of every declared catalogue kernel on NumPy: every property
    for the correct ones, the one that must catch it for each bug."""
    results = {fn.__name__: _statuses(fn) for fn in catalogue.DECLARED_CORRECT}
    for fn in catalogue.DECLARED_BUGS:
        results[fn.__name__] = _statuses(fn, ("recurrent-matches-reference",))
    for fn, prop in catalogue.DECLARED_CONTRACT_BUGS:
        results[fn.__name__] = _statuses(fn, (prop,))
    return results


def test_correct_recurrences_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """REC-2.2, REC-3.3, REC-5.1, REC-6.2: the token recurrence and the chunked form pass
    every recurrence property (split runs, decode steps, packed sequences, every chunk size
    they take, the reference); no other property applies."""
    for fn in catalogue.DECLARED_CORRECT:
        statuses = verdicts[fn.__name__]
        assert {statuses[p] for p in RECURRENT_PROPERTIES} == {"passed"}, (fn.__name__, statuses)
        others = {s for p, s in statuses.items() if not p.startswith("recurrent-")}
        assert others == {"not applicable"}, (fn.__name__, others)


@pytest.mark.parametrize("name", [fn.__name__ for fn in catalogue.DECLARED_BUGS])
def test_every_recurrence_bug_is_caught(name: str, verdicts: dict[str, dict[str, str]]) -> None:
    """REC-6.2 (REC-1.2, REC-1.5, REC-2.2, REC-2.3, REC-3.1, REC-4.1, REC-5.1, REC-5.2): each
    catalogued bug fails the quick profile."""
    assert verdicts[name]["recurrent-matches-reference"] == "failed"


@pytest.mark.parametrize(
    ("name", "prop"), [(fn.__name__, prop) for fn, prop in catalogue.DECLARED_CONTRACT_BUGS]
)
def test_every_contract_bug_is_caught_by_its_property(
    name: str, prop: str, verdicts: dict[str, dict[str, str]]
) -> None:
    """REC-2.2 (a decode step that skips the gate or reads the state before its token),
    REC-3.3 (a state carried across a packed boundary, cu_seqlens ignored), REC-5.1 (a gate
    applied twice at a chunk edge, a chunk size that drops the last partial chunk): each
    fails the property of its clause in the quick profile."""
    assert verdicts[name][prop] == "failed"


@pytest.mark.parametrize("seed", range(1, 5))
def test_contract_properties_pass_the_correct_kernels_over_seeds(seed: int) -> None:
    """REC-2.2, REC-3.3, REC-5.1: no false failure of the contract properties on the two
    correct formulations over five seeds of 20 examples each (seed 0 is the fixture's)."""
    contracts = RECURRENT_PROPERTIES[:-1]
    for fn in catalogue.DECLARED_CORRECT:
        statuses = _statuses(fn, contracts, seed)
        assert {statuses[p] for p in contracts} == {"passed"}, (fn.__name__, seed, statuses)
