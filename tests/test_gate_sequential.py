"""The seesaw's sequential rule: its stated error rates, its verdict in the gate, and the audit deciding it again.

The rule and its operating characteristic are pure; the gate run uses the real ``Trials`` on the
toy world against the test's own nats-server (as ``test_aegis_gate`` does), where attaching
``task_objects`` makes the random agent ring the bell: a real regression of the ``bell`` tasks.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator

import msgspec
import pytest
from hx_cli import error_line, hx
from test_aegis_gate import BASE, K, candidate, gate, main_round, manifest, names, toy_tasks, trials_on
from test_gate_interval import decisions, ledger_of

from hx.aegis.settings import GateSettings
from hx.gate.rule import CHECKS, Fresh, Verdict, seesaw
from hx.gate.sequential import SequentialRule, Tries, decide, operating_characteristic, trailing_p
from hx.harness.processor import processor_type
from hx.replay.ledger_checks import check_decisions
from hx.replay.trace_checks import check_trace
from schemas.edits import Attach
from schemas.ledger import GateJudged, RoundDigested, TaskFlip, ledger_digest
from streams.config import NatsSettings
from streams.connection import Connection, connect

RULE = SequentialRule()


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    """A connection to the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


# --- the rule and its error rates ------------------------------------------------------------------------


def simulate(rule: SequentialRule | None, k: int, pb: float, pc: float, runs: int, seed: int = 0) -> float:
    """How often a solved task is called regressed, by playing the rule (None: ``retry``) on coin flips."""
    rng = random.Random(seed)
    called = solved = 0
    while solved < runs:
        b = Tries(k, sum(rng.random() < pb for _ in range(k)))
        if b.passes == 0:
            continue  # not solved: the seesaw does not ask
        solved += 1
        c = Tries(k, sum(rng.random() < pc for _ in range(k)))
        if rule is None:  # retry: up to 2k fresh attempts, held at the first pass
            called += c.passes == 0 and not any(rng.random() < pc for _ in range(2 * k))
            continue
        wave = 1
        while (d := decide(rule, b, c, waves=wave)) == "continue":
            wave += 1
            b += Tries(k, sum(rng.random() < pb for _ in range(k)))
            c += Tries(k, sum(rng.random() < pc for _ in range(k)))
        called += d == "regressed"
    return called / runs


def test_the_exact_test_takes_the_candidate_and_the_base_as_its_two_independent_samples() -> None:
    """Candidate 0 of 6 against base 2 of 6: one-sided p 0.0985 (the table transposed, a side a row: 0.1048)."""
    assert trailing_p(Tries(6, 2), Tries(6, 0)) == pytest.approx(0.0985, abs=5e-5)
    assert trailing_p(Tries(6, 3), Tries(6, 0)) == pytest.approx(0.0338, abs=5e-5)
    # 1 of 6 against 4 of 6 is p 0.073 (0.0535 transposed): at alpha 0.06 the task holds
    assert decide(SequentialRule(alpha=0.06), Tries(6, 4), Tries(6, 1), waves=3) == "held"


@pytest.mark.parametrize(("pb", "pc"), [(0.5, 0.5), (0.9, 0.4), (1.0, 0.0), (0.5, 0.0), (0.3, 0.3)])
def test_the_stated_error_rates_are_what_playing_the_rule_gives(pb: float, pc: float) -> None:
    """The exact operating characteristic agrees with 4,000 simulated solved tasks (within 3 standard errors)."""
    exact = operating_characteristic(RULE, K, pb, pc)
    seen = simulate(RULE, K, pb, pc, 4000)
    assert abs(seen - exact) <= 3 * (exact * (1 - exact) / 4000) ** 0.5 + 1e-9


def test_an_unchanged_task_is_rarely_called_regressed_and_a_broken_one_is_caught() -> None:
    """Against the retry rule: fewer false alarms at low pass rates, more of a halved pass rate caught."""
    # the stated false-alarm rate (docs/aegis.md): at most 6.2 % whatever the unchanged pass rate (the worst
    # near 0.2, where a solved task's base got lucky more often than not)
    assert max(operating_characteristic(RULE, K, p / 100, p / 100) for p in range(1, 101)) <= 0.062
    assert operating_characteristic(RULE, K, 1.0, 0.0) == pytest.approx(1.0)
    assert operating_characteristic(RULE, K, 0.75, 0.0) > 0.95
    # The retry rule lets a task whose pass rate fell from 0.9 to 0.4 through ~95 % of the time,
    # and calls an unchanged task at 0.2 regressed a quarter of the time.
    assert simulate(None, K, 0.9, 0.4, 4000) < 0.06 < operating_characteristic(RULE, K, 0.9, 0.4)
    assert simulate(None, K, 0.2, 0.2, 4000) > 0.2 > operating_characteristic(RULE, K, 0.2, 0.2)


def test_the_seesaw_records_both_sides_and_the_decision() -> None:
    """Each solved task's flip carries the variant's and the candidate's attempts on the same seeds, and why."""
    fresh = Fresh(solved={"b:g:dev:1": Tries(2, 2), "b:g:dev:2": Tries(2, 0)}, flips={"b:g:dev:3": Tries(2, 1)},
                  base={"b:g:dev:1": Tries(2, 1), "b:g:dev:2": Tries(2, 2), "b:g:dev:3": Tries(2, 0)},
                  waves={"b:g:dev:2": (Tries(4, 4), Tries(4, 0), 3)})
    v = seesaw(Verdict(), fresh, allow_fork=False, rule=RULE)
    held, regressed, gained = v.flips
    assert (held.decision, held.after, held.base_passes, held.base_attempts) == ("held", True, 1, 2)
    assert (regressed.decision, regressed.after, regressed.passes, regressed.attempts) == ("regressed", False, 0, 6)
    assert (regressed.base_passes, regressed.base_attempts, gained.decision) == (6, 6, "gained")
    assert v.first_failure == "seesaw" and "'b:g:dev:2': 0/6 against the variant's 6/6" in v.checks[0].detail
    cut_short = Fresh(solved=fresh.solved, flips=fresh.flips, base=fresh.base,
                      waves={"b:g:dev:2": (Tries(2, 2), Tries(2, 0), 2)})
    assert seesaw(Verdict(), cut_short, allow_fork=False, rule=RULE).flips[1].decision == "regressed"


@pytest.mark.parametrize(("option", "value", "line"), [
    ("--gate-seesaw", "sometimes", "error: --gate-seesaw: unknown seesaw rule 'sometimes'; the rules are "
                                   "sequential, retry"),
    ("--gate-drop", "0", "error: --gate-drop: 0 is not a fall in pass rate in (0, 1]"),
    ("--gate-alpha", "0.7", "error: --gate-alpha: 0.7 is not an error rate in (0, 0.5]"),
    ("--gate-waves", "0", "error: --gate-waves: 0 is not a number of waves from 1 to 10"),
])
def test_a_rule_setting_out_of_range_is_one_error_line(tmp_path: object, option: str, value: str,
                                                       line: str) -> None:
    """``hx evolve --gate-alpha 0.7``: one line naming the option and its range, nothing run."""
    assert error_line(hx("--data-dir", str(tmp_path), "evolve", option, value)) == line


# --- in the gate, and in the audit ----------------------------------------------------------------------


async def test_a_regression_is_played_out_in_waves_and_the_audit_decides_it_again(conn: Connection) -> None:
    """Ringing the bell breaks the bell tasks: the candidate trails, base and candidate play more waves on the same
    fresh seeds, and the rule calls the regression; the audit gives the same verdict from the trace rounds, and
    names a verdict that says the task held."""
    tasks, run_id = toy_tasks(8), "gate-sequential"
    trials = trials_on(conn, run_id, tasks)
    digests = await main_round(trials, BASE, tasks)
    op = Attach(processor="task_objects", hooks=processor_type("task_objects").accepted_hooks())
    evidence = next(d.evidence for d in digests if d.evidence)[:1]
    cand = candidate((op,), m=manifest([d.task for d in digests if not d.solved], attribution="task_objects",
                                       evidence=evidence), run_id=run_id)
    main = trials.main_rounds["v0"]
    trials.main_rounds.clear()  # no recorded attempt to replay (so no closed path): the fresh attempts decide
    verdict = await gate(cand, trials, rule=RULE)
    assert names(verdict) == list(CHECKS[:-1]) and verdict.first_failure == "seesaw"
    regressed = [f for f in verdict.flips if f.decision == "regressed"]
    assert regressed and all(f.attempts == f.base_attempts == K * RULE.waves and f.passes == 0 for f in regressed)
    assert all(f.base_passes > 0 and ":bell:" in f.task for f in regressed)
    held = [f for f in verdict.flips if f.decision == "held"]
    assert all(f.passes / f.attempts >= f.base_passes / f.base_attempts or f.attempts == K * RULE.waves
               for f in held)
    waves = len(verdict.trace_rounds) - 1
    assert waves == 2 * (RULE.waves - 1)  # a base round and a candidate round per wave after the first

    digested = RoundDigested(run_id=run_id, round=0, actionability=1.0, digests=digests, trace_rounds=(main,))
    recorded = GateJudged(run_id=run_id, round=0, candidate=cand.candidate, variant="v0", passed=False,
                          checks=tuple(verdict.checks), first_failure="seesaw", flips=tuple(verdict.flips),
                          outcome="reject", trace_rounds=verdict.trace_rounds)
    rule = GateSettings(seesaw="sequential")
    honest = ledger_of(run_id, rule, digested, cand, recorded)
    assert decisions(check_decisions(honest)[1]) == []
    found = await check_trace(conn.log, honest)
    assert decisions(found.problems) == [] and found.recomputed == 1
    assert found.problems == [] and found.played == 1 + len(verdict.trace_rounds)  # the main round and each gate's
    # Each wave's halves cited the other way round: the counts may still fit a verdict, the harnesses do not.
    first, *later = verdict.trace_rounds
    swapped = (first, *(r for i in range(0, len(later), 2) for r in (later[i + 1], later[i])))
    crossed = await check_trace(conn.log, ledger_of(run_id, rule, digested, cand,
                                                    msgspec.structs.replace(recorded, trace_rounds=swapped)))
    said = [p.text for p in crossed.problems if p.kind == "input"]
    assert said == [f"event 4 (ledger.gate_judged): trace round {swapped[1]} played harness {cand.digest[:19]}..., "
                    f"but it stands for v0's harness (a wave's base half), {BASE.digest[:19]}..."]
    # Decided by the retry rule, the same rounds are not what that rule plays.
    [retry] = decisions((await check_trace(conn.log, ledger_of(run_id, GateSettings(), digested, cand,
                                                                recorded))).problems)
    assert "a retry round ran" in retry
    # A forger says the first regressed task held: the flips are not what the rounds show.
    task = regressed[0].task
    flips = tuple(msgspec.structs.replace(f, after=True, decision="held") if f.task == task else f
                  for f in verdict.flips)
    forged = ledger_of(run_id, rule, digested, cand, msgspec.structs.replace(recorded, flips=flips))
    [why] = decisions((await check_trace(conn.log, forged)).problems)
    assert why.startswith("event 4 (ledger.gate_judged): its flips are not what the trace rounds it cites show")


def test_a_verdict_recorded_before_the_sequential_rule_keeps_its_digest() -> None:
    """The flips' new fields hold their defaults on an old verdict: its digest is the bytes the older hx chained."""
    flip = TaskFlip(task="b:g:dev:1", before=True, after=True, attempts=2, passes=1)
    judged = GateJudged(run_id="r", round=0, candidate="C", variant="v0", passed=False, checks=(), flips=(flip,))
    body = msgspec.msgpack.decode(msgspec.msgpack.encode(judged))
    del body["signature"]
    for absent in ("public_key", "at_ns"):
        body.pop(absent, None)
    for item in body["flips"]:  # what the older hx encoded: no variant side, no decision
        for name in ("base_attempts", "base_passes", "decision"):
            del item[name]
    older = "sha256:" + hashlib.sha256(GateJudged.TYPE.encode() + b"\0" + msgspec.msgpack.encode(body)).hexdigest()
    assert ledger_digest(judged) == older
    recorded = msgspec.structs.replace(flip, base_attempts=2, base_passes=2, decision="held")
    assert ledger_digest(msgspec.structs.replace(judged, flips=(recorded,))) != older
