"""The gate's rule read backwards (``hx.gate.rule.disagreement``): a recorded verdict either follows from its own
checks, or the audit is told why not.

The verdicts the gate itself writes follow; each forgery below changes one thing a forger would
(passed, outcome, first_failure, the checks, clusters) and must be named. The audit of a whole
forged ledger is ``tests/test_ledger_forgery.py``; this is the rule on its own.
"""

from __future__ import annotations

from typing import Any

import pytest

from hx.gate.rule import CHECKS, Fresh, Verdict, disagreement, seesaw
from hx.gate.sequential import Tries
from schemas.ledger import GateCheck, GateJudged


def judged(checks: tuple[tuple[str, bool], ...], **fields: Any) -> GateJudged:
    """A ``GateJudged`` with these checks, its outcome and first failure as the gate would write them unless given."""
    failed = [name for name, ok in checks if not ok]
    defaults: dict[str, Any] = {"passed": not failed, "outcome": "reject" if failed else "ship",
                                "first_failure": failed[0] if failed else ""}
    return GateJudged(run_id="r", round=0, candidate="C-R0-01", variant="v0",
                      checks=tuple(GateCheck(name=n, passed=ok) for n, ok in checks), **(defaults | fields))


def upto(last: str, failing: str = "") -> tuple[tuple[str, bool], ...]:
    """The gate's checks in order up to ``last``, all passing but ``failing``."""
    return tuple((n, n != failing) for n in CHECKS[:CHECKS.index(last) + 1])


def test_the_verdicts_the_gate_writes_follow_from_their_checks() -> None:
    assert disagreement(judged(upto("effect")), allow_fork=False) == ""
    for check in CHECKS:
        assert disagreement(judged(upto(check, failing=check)), allow_fork=False) == "", check
    fork = judged(upto("seesaw", failing="seesaw"), passed=True, outcome="fork", clusters=("b:x",))
    assert disagreement(fork, allow_fork=True) == ""
    made = seesaw(Verdict(checks=[GateCheck(name=n, passed=True) for n in CHECKS[:5]]),
                  Fresh(solved={"b:g:dev:1": Tries(2, 2)}, flips={"b:g:dev:2": Tries(2, 1)}), allow_fork=True)
    written = GateJudged(run_id="r", round=0, candidate="C", variant="v0", passed=made.passed, outcome=made.outcome,
                         checks=tuple(made.checks), first_failure=made.first_failure, flips=tuple(made.flips))
    assert disagreement(written, allow_fork=True) == ""


FORGED: dict[str, tuple[GateJudged, bool, str]] = {
    "passed though effect failed": (
        judged(upto("effect", failing="effect"), passed=True, outcome="ship"), False,
        "its outcome is 'ship', but it failed 'effect' (no fork: the strategy is global): the gate's outcome is "
        "'reject'"),
    "passed, outcome left at reject": (
        judged(upto("effect", failing="effect"), passed=True), False,
        "it says passed=True, but its outcome is 'reject'"),
    "rejected though all passed": (
        judged(upto("effect"), passed=False, outcome="reject"), False,
        "its outcome is 'reject', but every check passed: the gate's outcome is 'ship'"),
    "first failure renamed": (
        judged(upto("smoke", failing="smoke"), first_failure="leakage"), False,
        "its first_failure is 'leakage', but its first failing check is 'smoke'"),
    "first failure left out": (
        judged(upto("effect", failing="effect"), first_failure=""), False,
        "its first_failure is '(none)', but its first failing check is 'effect'"),
    "a check after the first failure": (
        judged((*upto("seesaw", failing="config"),)), False,
        "it records checks after its first failure 'config': the gate stops there"),
    "checks out of order": (
        judged((("config", True), ("manifest", True), *upto("effect")[2:])), False,
        "its checks config, manifest, smoke, leakage, counterfactual, seesaw, effect are not the gate's"),
    "a check skipped": (
        judged(upto("effect")[:3] + upto("effect")[4:]), False, "are not the gate's, in its order"),
    "stops early with nothing failed": (
        judged(upto("leakage")), False, "it stops after leakage with no check failed: the gate runs all seven"),
    "a fork under the global strategy": (
        judged(upto("seesaw", failing="seesaw"), passed=True, outcome="fork", clusters=("b:x",)), False,
        "its outcome is 'fork', but it failed 'seesaw' (no fork: the strategy is global)"),
    "a fork without clusters": (
        judged(upto("seesaw", failing="seesaw"), passed=True, outcome="fork"), True,
        "its outcome is 'fork', but it failed 'seesaw' (no fork: no cluster)"),
    "a fork at effect": (
        judged(upto("effect", failing="effect"), passed=True, outcome="fork", clusters=("b:x",)), True,
        "(no fork: only a seesaw failure may fork)"),
    "clusters on a ship": (
        judged(upto("effect"), clusters=("b:x",)), True, "it names clusters b:x without forking"),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_a_verdict_that_does_not_follow_from_its_checks_is_named(case: str) -> None:
    verdict, allow_fork, why = FORGED[case]
    found = disagreement(verdict, allow_fork=allow_fork)
    assert why in found, found
