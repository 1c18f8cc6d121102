"""The gate's optional ``suite`` check: the eval suite played by base and candidate, in the gate, the audit, the CLI.

The gate run uses the real ``Trials`` on the toy world (family ``textworld``) against the test's own
nats-server, as ``test_gate_interval`` does, and the suite check plays a tiny suite of two real
TextWorldExpress games with the random agent: the candidate's harness plays them (same family),
the variant's harness is the base. The audit then decides the check again from the two eval runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from hx_cli import error_line, hx
from test_aegis_gate import BASE, candidate, gate, main_round, manifest, names, toy_tasks, trials_on
from test_gate_interval import decisions, ledger_of

from hx.aegis.settings import EvolveSettings, GateSettings
from hx.aegis.suite_gate import SuiteGate
from hx.eval.suite import load_suite, suite_digest
from hx.gate.rule import CHECKS, Fresh, Verdict, checks_of, disagreement, seesaw
from hx.gate.sequential import Tries
from hx.gate.suite import parse_detail
from hx.harness.edits import apply
from hx.replay.ledger_checks import check_decisions
from hx.replay.trace_checks import check_trace
from schemas.edits import Reparam
from schemas.ledger import GateCheck, GateJudged, RoundDigested
from streams.config import NatsSettings
from streams.connection import Connection, connect

SUITE = Path(__file__).parent / "data" / "gate_suite.yaml"


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    """A connection to the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


# --- the rule and the setting -----------------------------------------------------------------------------


def test_the_rule_orders_the_suite_check_after_interval_and_before_effect() -> None:
    """``suite`` sits after ``interval`` and before ``effect``; a failed suite check stops the gate there."""
    assert checks_of("off", suite=True) == (*CHECKS[:-1], "suite", "effect")
    assert checks_of("keep", suite=True) == (*CHECKS[:-1], "interval", "suite", "effect")
    fresh = Fresh(solved={"b:g:dev:1": Tries(2, 2)}, flips={"b:g:dev:2": Tries(2, 1)})
    failed = seesaw(Verdict(), fresh, allow_fork=True, suite=GateCheck(name="suite", passed=False, detail="d"))
    assert failed.outcome == "reject" and failed.first_failure == "suite"
    assert [c.name for c in failed.checks] == ["seesaw", "suite"]
    early = tuple(GateCheck(name=n, passed=True) for n in CHECKS[:5])
    judged = GateJudged(run_id="r", round=0, candidate="C", variant="v0", passed=False,
                        checks=early + tuple(failed.checks), first_failure="suite", outcome="reject")
    assert disagreement(judged, allow_fork=True, suite=True) == ""
    assert "are not the gate's, in its order" in disagreement(judged, allow_fork=True)


def test_the_suite_check_is_off_by_default_and_recorded_with_its_digest() -> None:
    """A default job records no suite (only its seesaw rule); a set suite is recorded by path and digest."""
    assert msgspec.to_builtins(EvolveSettings())["gate"] == {"seesaw": "sequential"}
    settings = GateSettings.of("off", str(SUITE))
    assert settings.suite == str(SUITE.resolve()) and settings.suite_digest == suite_digest(load_suite(SUITE))
    assert GateSettings.of("off", "default").suite == "default"


def test_an_unknown_gate_suite_is_one_error_line_before_anything_is_written(tmp_path: Path) -> None:
    """``hx evolve``/``hx coevolve --gate-suite nope.yaml``: one line naming the option and the file, no data written;
    a suite file that does not load is one line too."""
    line = error_line(hx("--data-dir", str(tmp_path), "evolve", "--gate-suite", "nope.yaml"))
    assert line == "error: --gate-suite: no suite file 'nope.yaml' (a path, or 'default' for hx's suite)"
    assert list(tmp_path.iterdir()) == []
    assert error_line(hx("--data-dir", str(tmp_path), "coevolve", "--gate-suite", "nope.yaml")) == line
    assert list(tmp_path.iterdir()) == []
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ntasks: [{name: a, task: twx:coin:dev:0, criteria: [{name: nope}]}]\n")
    line = error_line(hx("--data-dir", str(tmp_path), "evolve", "--gate-suite", str(broken)))
    assert line.startswith("error: ") and "nope" in line and "\n" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.yaml"]


# --- a gate run, and the audit deciding it again ----------------------------------------------------------




async def test_a_candidate_that_regresses_the_suite_is_rejected_at_suite_and_the_audit_agrees(
        conn: Connection) -> None:
    """Relaxing a tight budget wins toy-world flips (the seesaw ships it) but lets the agent wander past the suite's
    step criterion on every attempt: the suite's composite falls, DISCARD, rejected at ``suite``; the base's eval is
    played once for the round; the audit decides the same from the eval runs and names a forged verdict."""
    tasks, run_id = toy_tasks(5), "gate-suite"
    trials = trials_on(conn, run_id, tasks)
    tight = apply(BASE, (Reparam(group="budget", params={"max_model_calls": 3}),))
    digests = await main_round(trials, tight, tasks)
    flips = [d.task for d in digests if not d.solved]
    evidence = next(d.evidence for d in digests if d.evidence)[:1]
    cand = candidate((Reparam(group="budget", params={"max_model_calls": 0}),), base=tight,
                     m=manifest(flips, evidence=evidence), run_id=run_id)
    shipped = await gate(cand, trials, base=tight)
    assert shipped.outcome == "ship" and names(shipped) == list(CHECKS)

    suite = load_suite(SUITE)
    played = SuiteGate(conn, suite, trials)
    verdict = await gate(cand, trials, base=tight, suite=played)
    assert names(verdict) == list(checks_of("off", suite=True))[:-1] and verdict.first_failure == "suite"
    assert verdict.outcome == "reject" and verdict.flips == shipped.flips
    figures = parse_detail(verdict.checks[-1].detail)
    assert figures is not None and figures.verdict == "discard", verdict.checks[-1].detail
    assert figures.difference.startswith("-") and figures.base_eval != figures.candidate_eval
    again = await gate(cand, trials, base=tight, suite=played)  # a second candidate on the same variant harness
    assert played.evals == 3 and parse_detail(again.checks[-1].detail).base_eval == figures.base_eval  # type: ignore[union-attr]

    settings = GateSettings(suite=str(SUITE), suite_digest=suite_digest(suite))
    digested = RoundDigested(run_id=run_id, round=0, actionability=1.0, digests=digests,
                             trace_rounds=(trials.main_rounds["v0"],))
    recorded = GateJudged(run_id=run_id, round=0, candidate=cand.candidate, variant="v0", passed=False,
                          checks=tuple(verdict.checks), first_failure="suite", flips=tuple(verdict.flips),
                          outcome="reject", trace_rounds=verdict.trace_rounds)
    honest = ledger_of(run_id, settings, digested, cand, recorded)
    assert decisions(check_decisions(honest)[1]) == []
    found = await check_trace(conn.log, honest)
    assert decisions(found.problems) == [] and found.recomputed == 1

    # A forger passes the suite check and ships: the verdict follows from its own checks, not from the eval runs.
    forged_checks = (*verdict.checks[:-1], msgspec.structs.replace(verdict.checks[-1], passed=True),
                     shipped.checks[-1])
    forged = msgspec.structs.replace(recorded, passed=True, checks=forged_checks, first_failure="", outcome="ship")
    ledger = ledger_of(run_id, settings, digested, cand, forged)
    assert decisions(check_decisions(ledger)[1]) == []
    [why] = decisions((await check_trace(conn.log, ledger)).problems)
    assert why == ("event 4 (ledger.gate_judged): its suite check passed on the verdict 'discard': the gate "
                   "rejects it")
    # ... or rewrites the verdict it states: the eval runs give another.
    told = msgspec.structs.replace(verdict.checks[-1], passed=True,
                                   detail=verdict.checks[-1].detail.replace("discard:", "inconclusive:", 1))
    ledger = ledger_of(run_id, settings, digested, cand, msgspec.structs.replace(
        forged, checks=(*verdict.checks[:-1], told, shipped.checks[-1])))
    [why] = decisions((await check_trace(conn.log, ledger)).problems)
    assert why == ("event 4 (ledger.gate_judged): its suite check states verdict 'inconclusive'; the eval runs it "
                   "names give 'discard'")
    # The honest verdict under a job that never asked for the check does not follow from the rule.
    [stray] = decisions(check_decisions(ledger_of(run_id, GateSettings(), digested, cand, recorded))[1])
    assert "are not the gate's, in its order" in stray
