"""The gate's optional ``interval`` check: the keep rule over paired attempts, in the gate, in the audit, as a setting.

The rule is pure and fed given attempts; the gate run uses the real ``Trials`` on the toy world
against the test's own nats-server (as ``test_aegis_gate`` does), and its verdict is then
decided again by the audit from the ledger it records and the trace rounds it cites.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import msgspec
import pytest
from hx_cli import error_line, hx
from test_aegis_gate import BASE, K, candidate, gate, main_round, manifest, names, toy_tasks, trials_on

from hx.aegis.job import EvolveJob
from hx.aegis.session import recorded_job
from hx.aegis.settings import EvolveSettings, GateSettings
from hx.gate.interval import interval_figures
from hx.gate.rule import CHECKS, Fresh, Verdict, checks_of, disagreement, outcomes, seesaw
from hx.gate.sequential import Tries
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.intervals import Verdict as Keep
from hx.replay.ledger_checks import Problem, check_decisions
from hx.replay.trace_checks import check_trace
from projections.ledger import RunLedger
from schemas.edits import Reparam
from schemas.ledger import CandidateProposed, GateCheck, GateJudged, LedgerEvent, LedgerOpened, RoundDigested
from streams.config import NatsSettings
from streams.connection import Connection, connect


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    """A connection to the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


def thinned() -> Fresh:
    """Six solved tasks each kept on one paired seed of four (the seesaw's "hold"), one predicted flip gained."""
    solved = {f"b:g:dev:{i}": Tries(4, 1) for i in range(6)}
    base = {**{t: Tries(4, 4) for t in solved}, "b:g:dev:9": Tries(4, 0)}
    return Fresh(solved=solved, flips={"b:g:dev:9": Tries(4, 1)}, base=base)


# --- the rule, from given attempts ---------------------------------------------------------------------


def test_the_interval_check_turns_down_a_candidate_the_seesaw_ships() -> None:
    """Every solved task holds on a seed, a flip is won (the seesaw ships), but pass rates fall 4/4 -> 1/4: DISCARD."""
    off = seesaw(Verdict(), thinned(), allow_fork=True)
    assert off.outcome == "ship" and [c.name for c in off.checks] == ["seesaw", "effect"]
    for mode in ("no_discard", "keep"):
        v = seesaw(Verdict(), thinned(), allow_fork=True, interval=mode)
        assert v.outcome == "reject" and v.first_failure == "interval" and v.clusters == ()
        assert [c.name for c in v.checks] == ["seesaw", "interval"]  # effect never runs after a failure
        figures = interval_figures(outcomes(thinned().base), outcomes({**thinned().solved, **thinned().flips}))
        assert figures.verdict == Keep.DISCARD and figures.tasks == 7 and figures.difference is not None
        assert v.checks[-1].detail == (f"discard (mode {mode}): candidate - base {figures.difference} over 7 paired "
                                       "task(s), paired bootstrap tasks+attempts, 95%")
        assert round(figures.difference.estimate, 3) == round((6 * -0.75 + 0.25) / 7, 3)


def test_no_discard_lets_an_inconclusive_candidate_through_and_keep_does_not() -> None:
    """The same attempts as the variant's: the difference is 0, inconclusive; only ``keep`` turns that down."""
    same = {"b:g:dev:1": Tries(2, 2), "b:g:dev:2": Tries(2, 1)}
    fresh = Fresh(solved=same, flips={"b:g:dev:3": Tries(2, 1)}, base={**same, "b:g:dev:3": Tries(2, 1)})
    lenient = seesaw(Verdict(), fresh, allow_fork=False, interval="no_discard")
    assert lenient.outcome == "ship" and [c.name for c in lenient.checks] == ["seesaw", "interval", "effect"]
    assert lenient.checks[1].detail.startswith("inconclusive (mode no_discard): candidate - base 0.000 [")
    strict = seesaw(Verdict(), fresh, allow_fork=False, interval="keep")
    assert strict.outcome == "reject" and strict.first_failure == "interval"


def test_a_clear_gain_is_kept_and_a_seesaw_failure_still_forks_before_the_interval() -> None:
    """Flips won on every seed over many tasks: KEEP ships under ``keep``; a seesaw failure never reaches it."""
    flips = {f"b:x:dev:{i}": Tries(2, 2) for i in range(8)}
    fresh = Fresh(solved={}, flips=flips, base={t: Tries(2, 0) for t in flips})
    v = seesaw(Verdict(), fresh, allow_fork=True, interval="keep")
    assert v.outcome == "ship" and v.checks[1].detail.startswith("keep (mode keep): candidate - base 1.000")
    lost = Fresh(solved={"b:y:dev:1": Tries(2, 0)}, flips=flips, base={})
    forked = seesaw(Verdict(), lost, allow_fork=True, interval="keep")
    assert forked.outcome == "fork" and [c.name for c in forked.checks] == ["seesaw"]


def test_the_rule_orders_the_interval_check_between_seesaw_and_effect() -> None:
    """The checks a run's mode makes; a verdict recorded without the check its run asked for does not follow."""
    assert checks_of("off") == CHECKS
    assert checks_of("no_discard") == checks_of("keep") == (*CHECKS[:-1], "interval", "effect")
    early = tuple(GateCheck(name=n, passed=True) for n in CHECKS[:5])

    def judged(v: Verdict) -> GateJudged:
        return GateJudged(run_id="r", round=0, candidate="C", variant="v0", passed=v.passed, checks=early + tuple(
            v.checks), first_failure=v.first_failure, outcome=v.outcome)

    off = judged(seesaw(Verdict(), thinned(), allow_fork=False))
    rejected = judged(seesaw(Verdict(), thinned(), allow_fork=False, interval="keep"))
    assert disagreement(off, allow_fork=False) == disagreement(rejected, allow_fork=False, interval="keep") == ""
    assert "are not the gate's, in its order" in disagreement(off, allow_fork=False, interval="keep")
    assert "are not the gate's, in its order" in disagreement(rejected, allow_fork=False)


# --- the setting -----------------------------------------------------------------------------------------


def test_the_interval_check_is_off_by_default_and_recorded_in_the_job() -> None:
    """A job recorded before the setting reads as ``off``; a set mode is in the recorded job."""
    assert EvolveSettings().gate.interval == "off"
    old = {"run_id": "r", "benches": ["b"], "adaptation": [], "heldout": [], "loop": {"rounds": 2}}
    assert recorded_job(old).loop.gate == GateSettings() and GateSettings().seesaw == "retry"
    job = EvolveJob(run_id="r", benches=("b",), adaptation=(), heldout=(),
                    loop=EvolveSettings(gate=GateSettings.of("keep")))
    assert msgspec.to_builtins(job)["loop"]["gate"] == {"seesaw": "sequential", "interval": "keep"}


def test_an_unknown_interval_mode_is_one_error_line(tmp_path: object) -> None:
    """``hx evolve --gate-interval maybe``: one line naming the option and the modes, nothing run."""
    line = error_line(hx("--data-dir", str(tmp_path), "evolve", "--gate-interval", "maybe"))
    assert line == "error: --gate-interval: unknown interval mode 'maybe'; the modes are off, no_discard, keep"


# --- a gate run, and the audit deciding it again ---------------------------------------------------------


def ledger_of(run_id: str, gate: GateSettings, digested: RoundDigested, cand: CandidateProposed,
              verdict: GateJudged, opened: HarnessConfig = BASE) -> RunLedger:
    """The run's ledger as the loop records it (the fold the audit reads), its job with these gate settings, opened
    with the harness its main round played."""
    job = EvolveJob(run_id=run_id, benches=("toyworld",), adaptation=(), heldout=(),
                    loop=EvolveSettings(strategy="global", gate=gate))
    events: Sequence[LedgerEvent] = (
        LedgerOpened(run_id=run_id, strategy="global", harness=opened.spec(), digest=opened.digest,
                     settings=msgspec.to_builtins(job)), digested, cand, verdict)
    ledger = RunLedger(run_id=run_id)
    for position, event in enumerate(events, 1):
        ledger.fold(event, position)
    return ledger


def decisions(problems: Sequence[Problem]) -> list[str]:
    """The decision problems' texts."""
    return [p.text for p in problems if p.kind == "decision"]


async def test_a_gate_run_rejects_at_interval_what_the_seesaw_ships_and_the_audit_agrees(conn: Connection) -> None:
    """Relaxing a budget wins flips and keeps every solved task: the seesaw ships it, ``keep`` mode turns it down
    (the gain is not clear at this sample); the audit gives the same verdict from the trace, and names a forgery."""
    tasks, run_id = toy_tasks(5), "gate-interval"
    trials = trials_on(conn, run_id, tasks)
    tight = apply(BASE, (Reparam(group="budget", params={"max_model_calls": 3}),))
    digests = await main_round(trials, tight, tasks)
    main = trials.main_rounds["v0"]
    flips = [d.task for d in digests if not d.solved]
    relax = (Reparam(group="budget", params={"max_model_calls": 0}),)
    evidence = next(d.evidence for d in digests if d.evidence)[:1]  # anchors on this run's trace, for the audit
    cand = candidate(relax, base=tight, m=manifest(flips, evidence=evidence), run_id=run_id)
    shipped = await gate(cand, trials, base=tight)
    assert shipped.outcome == "ship", shipped.checks
    assert shipped.outcome == "ship" and names(shipped) == list(CHECKS)
    verdict = await gate(cand, trials, base=tight, interval="keep")
    assert names(verdict) == list(checks_of("keep"))[:-1] and verdict.first_failure == "interval"
    assert verdict.outcome == "reject" and verdict.flips == shipped.flips  # the same paired seeds
    base = {d.task: [1.0] * d.passes + [0.0] * (d.attempts - d.passes) for d in digests}
    after = {f.task: [1.0] * f.passes + [0.0] * (f.attempts - f.passes) for f in verdict.flips}
    figures = interval_figures(base, after)
    assert figures.verdict == Keep.INCONCLUSIVE and figures.difference is not None
    assert figures.difference.estimate > 0 and figures.tasks == len(digests)
    assert all(f.attempts == K for f in verdict.flips)  # no retry: no solved task lost a paired seed
    assert str(figures.difference) in verdict.checks[-1].detail

    digested = RoundDigested(run_id=run_id, round=0, actionability=1.0, digests=digests, trace_rounds=(main,))
    recorded = GateJudged(run_id=run_id, round=0, candidate=cand.candidate, variant="v0", passed=False,
                          checks=tuple(verdict.checks), first_failure="interval", flips=tuple(verdict.flips),
                          outcome="reject", trace_rounds=verdict.trace_rounds)
    honest = ledger_of(run_id, GateSettings(interval="keep"), digested, cand, recorded, opened=tight)
    assert decisions(check_decisions(honest)[1]) == []
    found = await check_trace(conn.log, honest)
    assert found.problems == [] and found.recomputed == 1 and found.played == 1 + len(verdict.trace_rounds)
    # A ledger that says the run began with the starter: its round digest reads a main round of another harness.
    [said] = (await check_trace(conn.log, ledger_of(run_id, GateSettings(interval="keep"), digested, cand,
                                                    recorded))).problems
    assert said.text == (f"event 2 (ledger.round_digested): trace round {main} played harness {tight.digest[:19]}..., "
                         f"but it stands for the harness v0 had during round 0, {BASE.digest[:19]}...")

    # A forger passes the interval check and ships: the verdict follows from its own checks, not from the trace.
    forged_checks = (*verdict.checks[:-1], msgspec.structs.replace(verdict.checks[-1], passed=True),
                     shipped.checks[-1])
    forged = msgspec.structs.replace(recorded, passed=True, checks=forged_checks, first_failure="", outcome="ship")
    ledger = ledger_of(run_id, GateSettings(interval="keep"), digested, cand, forged)
    assert decisions(check_decisions(ledger)[1]) == []
    [why] = decisions((await check_trace(conn.log, ledger)).problems)
    assert why == (f"event 4 (ledger.gate_judged): its interval check is passed ({verdict.checks[-1].detail}); from "
                   f"the trace rounds it cites ({', '.join(map(str, verdict.trace_rounds))}) the gate's rule gives "
                   f"failed ({verdict.checks[-1].detail})")
    # The honest verdict under a job that never asked for the check does not follow from the rule either.
    [stray] = decisions(check_decisions(ledger_of(run_id, GateSettings(interval="off"), digested, cand, recorded))[1])
    assert "are not the gate's, in its order" in stray
