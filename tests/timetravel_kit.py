"""A small real evolution run with a regression in it, for the time-travel tests (and anyone who needs one).

Two evolution rounds on the toy world (``toyworld:bell`` and ``toyworld:rooms``) with the
random agent, each a real main rollout on the trace, and the ledger written as the loop
writes it. Round 0 runs the TextWorld starter harness and ships two edits: ``C-R0-01``
attaches ``visited_states`` (changes no outcome here) and ``C-R0-02`` attaches
``task_objects``, which prefers actions naming the task's words and so rings the bell:
``toyworld:bell:dev:0``, solved in round 0, fails every attempt of round 1. A learner record
between the rounds (``policy-0`` -> ``policy-1`` on ``HX_LEARN``) stands for a co-evolution
run's policy update. Everything is seeded, so the run is the same every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import toyworld

from hx.aegis.ledger import Ledger
from hx.aegis.operations import buckets_of, dimensions_of
from hx.environments.results import game_of
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.gate.rule import CHECKS
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.processor import processor_type
from hx.harnesses import starter_harness
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from schemas.edits import Attach, Manifest
from schemas.identities import PolicyVersion
from schemas.landscape import TaskDigest
from schemas.learn import PolicyGated, PolicyUpdated
from schemas.ledger import (
    CandidateProposed,
    EvolutionFinished,
    GateCheck,
    GateJudged,
    HarnessShipped,
    LedgerOpened,
    RoundDecided,
    RoundDigested,
    RoundMetrics,
)
from streams.config import NatsSettings
from streams.connection import connect

RUN = "tt-run"
REGRESSED = "toyworld:bell:dev:0"
TASKS = (REGRESSED, "toyworld:bell:dev:1", "toyworld:rooms:dev:0", "toyworld:rooms:dev:2")
SETTINGS = RolloutSettings(attempts=2, concurrency=2, max_steps=12, seed=0)
RANDOM = ModelConfig(main="random:")


def attach(name: str, **params: Any) -> tuple[Attach, ...]:
    """One attach operation of a library processor at every hook it accepts."""
    return (Attach(processor=name, hooks=processor_type(name).accepted_hooks(), params=params),)


EDIT_1 = attach("visited_states")
EDIT_2 = attach("task_objects")


@dataclass
class BuiltRun:
    """What the run holds: its harness versions and each round's digests."""

    harnesses: tuple[HarnessConfig, HarnessConfig, HarnessConfig]
    digests: dict[int, tuple[TaskDigest, ...]]


def digests_of(results: Sequence[AttemptResult]) -> tuple[TaskDigest, ...]:
    """One digest per task, as the digester would count it (k-aware: solved when any attempt passed)."""
    passes: dict[str, list[bool]] = {}
    for r in results:
        passes.setdefault(r.task_id, []).append(r.passed)
    return tuple(TaskDigest(task=t, cluster=game_of(t), variant="v0", attempts=len(p), passes=sum(p),
                            category="" if any(p) else "no_progress") for t, p in sorted(passes.items()))


def metrics(digests: Sequence[TaskDigest]) -> RoundMetrics:
    """The round's figures."""
    solved = sum(d.solved for d in digests)
    return RoundMetrics(tasks=len(digests), passes=solved, pass_at_k=solved / len(digests),
                        rollouts=sum(d.attempts for d in digests))


def proposal(cid: str, base: HarnessConfig, ops: tuple[Attach, ...], flips: Sequence[str],
             run: str = RUN) -> CandidateProposed:
    """A candidate on ``base`` with a complete manifest."""
    return CandidateProposed(run_id=run, round=0, candidate=cid, variant="v0", evolver="offline", operations=ops,
                             buckets=buckets_of(ops), dimensions=dimensions_of(ops, base),
                             manifest=Manifest(intended_effect=f"attach {ops[0].processor}",
                                               categories=("no_progress",), predicted_flips=tuple(flips),
                                               attribution=ops[0].processor),
                             base_digest=base.digest, digest=apply(base, ops).digest, risk=0.1)


def passed(cand: CandidateProposed) -> GateJudged:
    """The gate's verdict that lets a candidate ship: every check passed (on the ledger alone: no trace round)."""
    return GateJudged(run_id=cand.run_id, round=cand.round, candidate=cand.candidate, variant=cand.variant,
                      passed=True, outcome="ship", checks=tuple(GateCheck(name=n, passed=True) for n in CHECKS))


async def build_run(url: str, run: str = RUN) -> BuiltRun:
    """Write the run: ledger opened, round 0 rolled out, digested, two ships, round 1 rolled out, digested."""
    h0 = starter_harness("textworld")
    h1 = apply(h0, EDIT_1)
    h2 = apply(h1, EDIT_2)
    job = {"run_id": run, "benches": ["toyworld:bell", "toyworld:rooms"], "adaptation": list(TASKS), "heldout": [],
           "model": "random:", "attempts": SETTINGS.attempts, "concurrency": SETTINGS.concurrency,
           "max_steps": SETTINGS.max_steps, "seed": SETTINGS.seed, "settings": {"rounds": 2, "strategy": "global"}}
    bench = toyworld.ToyWorld()
    async with connect(NatsSettings(url=url)) as conn:
        ledger = Ledger(conn, run)
        try:
            await ledger.start(LedgerOpened(run_id=run, strategy="global", harness=h0.spec(), digest=h0.digest,
                                            settings=job))
            first = Rollout(bench, RANDOM, h0, log=conn.log, settings=SETTINGS)
            await first.start(run, kind="evolve")
            out0 = await first.run_round(run, 0, TASKS, label=RoundLabel(purpose="main", variant="v0",
                                                                          stage_round=0))
            d0 = digests_of(out0.results)
            failing = [d.task for d in d0 if not d.solved]
            await ledger.append(RoundDigested(run_id=run, round=0, actionability=len(failing) / len(d0), digests=d0,
                                              trace_rounds=(0,)))
            c1, c2 = proposal("C-R0-01", h0, EDIT_1, failing[:1], run), proposal("C-R0-02", h1, EDIT_2, failing, run)
            await ledger.append(c1, passed(c1), HarnessShipped(
                run_id=run, round=0, variant="v0", candidates=("C-R0-01",), digest_before=h0.digest,
                digest_after=h1.digest, operations=EDIT_1, harness=h1.spec()))
            await ledger.append(c2, passed(c2), HarnessShipped(
                run_id=run, round=0, variant="v0", candidates=("C-R0-02",), digest_before=h1.digest,
                digest_after=h2.digest, operations=EDIT_2, harness=h2.spec()))
            await ledger.append(RoundDecided(run_id=run, round=0, outcome="shipped", shipped=("C-R0-01", "C-R0-02"),
                                             metrics=metrics(d0)))
            # A learner's pass after round 0, as a co-evolution run records it (the agent stays random here).
            await conn.log.append(f"hx.learn.{run}.default", PolicyUpdated(
                run_id=run, through_round=0, rounds=(0,), parent=PolicyVersion("policy-0"),
                version=PolicyVersion("policy-1"), steps=1))
            await conn.log.append(f"hx.learn.{run}.default", PolicyGated(  # and its policy gate's verdict
                run_id=run, through_round=0, candidate=PolicyVersion("policy-1"), parent=PolicyVersion("policy-0"),
                adopted=False, solved=3,
                lost=(REGRESSED,), rollouts=8))
            second = Rollout(bench, RANDOM, h2, log=conn.log, settings=SETTINGS)
            out1 = await second.run_round(run, 1, TASKS, label=RoundLabel(purpose="main", variant="v0",
                                                                           stage_round=1))
            d1 = digests_of(out1.results)
            await ledger.append(RoundDigested(run_id=run, round=1, actionability=0.5, digests=d1, trace_rounds=(1,)))
            await ledger.append(RoundDecided(run_id=run, round=1, outcome="all_rejected", metrics=metrics(d1), idle=1))
            await ledger.append(EvolutionFinished(run_id=run, rounds=2, reason="ran 2 round(s)"))
            await second.finish(run, rounds=2)
        finally:
            await ledger.close()
    return BuiltRun((h0, h1, h2), {0: d0, 1: d1})


async def build_ledger_run(url: str, run: str, before: dict[str, tuple[int, int]],
                           after: dict[str, tuple[int, int]]) -> None:
    """A run's ledger alone, event by event: two digested rounds (task -> (passes, attempts)) and no ship between."""
    h0 = starter_harness("textworld")

    def digests(passes: dict[str, tuple[int, int]]) -> tuple[TaskDigest, ...]:
        return tuple(TaskDigest(task=t, cluster=game_of(t), variant="v0", attempts=n, passes=p,
                                category="" if p else "no_progress") for t, (p, n) in sorted(passes.items()))

    async with connect(NatsSettings(url=url)) as conn:
        ledger = Ledger(conn, run)
        try:
            await ledger.start(LedgerOpened(run_id=run, strategy="global", harness=h0.spec(), digest=h0.digest,
                                            settings={"run_id": run, "model": "random:", "attempts": 2}))
            for n, passes in enumerate((before, after)):
                d = digests(passes)
                await ledger.append(RoundDigested(run_id=run, round=n, actionability=0.5, digests=d))
                await ledger.append(RoundDecided(run_id=run, round=n, outcome="all_rejected", metrics=metrics(d),
                                                 idle=n + 1))
            await ledger.append(EvolutionFinished(run_id=run, rounds=2, reason="ran 2 round(s)"))
        finally:
            await ledger.close()
