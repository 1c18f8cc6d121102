"""The AEGIS loop end to end on the toy world, against a real nats-server: ledger, ships, forks, resume, conflicts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import pytest
from click.testing import CliRunner
from evolve_worker import job
from toybench import RANDOM, ToyBench
from toybench import ids as toy_ids
from toyworld import ToyWorld

from hx.aegis.errors import HeldoutAccess, LedgerConflict
from hx.aegis.evidence import Evidence
from hx.aegis.evolvers.base import Context, Evolver, Proposal
from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.gate import Forbidden, judge
from hx.aegis.ledger import Ledger
from hx.aegis.session import Parts, run_evolution
from hx.aegis.state import RunState
from hx.aegis.trials import Trials
from hx.cli.main import cli
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.environments.splits import Splits, round_roles
from hx.harness.edits import apply
from hx.harness.processor import processor_type
from hx.harnesses import starter_harness
from hx.runtime.models import ModelConfig
from projections.ledger_reader import EditLedger
from projections.runner import ProjectionRunner
from schemas.edits import Anchor, Attach, Manifest, Remove
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CriticJudged,
    EvolutionFinished,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LedgerEvent,
    LedgerOpened,
    ModelChanged,
    RoundDecided,
    RoundDigested,
    VariantForked,
    ledger_digest,
)
from schemas.lifecycle import AttemptStarted, RunFinished
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.topology import LEDGER, TRACE, trace_filter, trace_subject

WORKER = Path(__file__).with_name("evolve_worker.py")


async def evolve(conn: Connection, run_id: str, *, evolver: Evolver | None = None, rounds: int = 4,
                 resume: bool = False, **parts: object) -> list[LedgerEvent]:
    bench = ToyWorld()
    the_job = job(run_id, bench, rounds)
    await run_evolution(conn, [bench], the_job, Parts(evolver or OfflineEvolver(), **parts), resume=resume)  # type: ignore[arg-type]
    ledger = Ledger(conn, run_id)
    try:
        await ledger.load()
        return list(ledger.records)
    finally:
        await ledger.close()


def of(records: Sequence[LedgerEvent], kind: type) -> list:  # type: ignore[type-arg]
    return [r for r in records if isinstance(r, kind)]


def chain_holds(records: Sequence[LedgerEvent]) -> bool:
    return all(b.prev == ledger_digest(a) for a, b in pairwise(records)) and not records[0].prev


async def test_a_run_ships_every_step_on_the_ledger_and_never_scores_lower(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "evo-main")
        trace = [r async for r in conn.log.read(TRACE.name, subjects=[trace_subject("evo-main")])]
        ledger_records = [r async for r in conn.log.read(LEDGER.name)]
    assert isinstance(records[0], LedgerOpened) and chain_holds(records)
    held = of(records, HeldoutScored)
    assert [h.round for h in held] == [-1, 3] and held[0].tasks == 20
    decisions = of(records, RoundDecided)
    assert [d.round for d in decisions] == [0, 1, 2, 3]
    assert len(of(records, RoundDigested)) == 4 and isinstance(records[-1], EvolutionFinished)
    assert not of(records, ModelChanged) and RunState.of(records).model == "random:"  # the configured model throughout
    edits = [r for r in records if isinstance(r, HarnessShipped | VariantForked)]
    assert edits, [d.reason for d in decisions]
    state = RunState.of(records[:1])
    for record in records[1:]:  # every new harness is the fold of its operations on the variant it came from
        if isinstance(record, HarnessShipped):
            assert apply(state.variants[record.variant].harness, record.operations).digest == record.digest_after
        if isinstance(record, VariantForked):
            assert apply(state.variants[record.parent].harness, record.operations).digest == record.digest
        state.fold(record)
    scores = [d.metrics.pass_at_k for d in decisions]
    assert all(b >= a for a, b in pairwise(scores)), scores  # peak == final on adaptation
    assert max(scores) == scores[-1]
    assert [r.type for r in trace] == ["run.started", RunFinished.TYPE]
    assert len(ledger_records) == len(records)  # the aggregate's events are hx events any reader decodes


async def test_the_edit_ledger_projection_equals_what_the_loop_ran(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "evo-state", rounds=3)
        runner: ProjectionRunner[dict] = ProjectionRunner(conn.log, EditLedger())  # type: ignore[type-arg]
        projected = (await runner.catch_up())["evo-state"]
        roles = await round_roles(conn.log, "evo-state")
        ran: dict[tuple[int, str], set[str]] = {}
        async for rec in conn.log.read(TRACE.name, subjects=[trace_filter("evo-state")], types=[AttemptStarted.TYPE]):
            started = roles[rec.event.round]  # type: ignore[attr-defined]
            if started.purpose == "main":
                ran.setdefault((started.stage_round, started.variant), set()).add(rec.event.harness_digest)  # type: ignore[attr-defined]
    state = RunState.of(records)
    assert {n: v.current.digest for n, v in projected.variants.items()} == {n: v.harness.digest
                                                                            for n, v in state.variants.items()}
    for (rnd, variant), digests in ran.items():
        assert digests == {projected.as_of(rnd)[variant].digest}, (rnd, variant)


async def test_evidence_refuses_heldout_rounds(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "evo-guard", rounds=1)
        heldout = of(records, HeldoutScored)[0].trace_round
        with pytest.raises(HeldoutAccess, match=f"trace round {heldout} of run 'evo-guard' is a heldout round"):
            await Evidence(conn.log, "evo-guard").attempts([heldout])
        with pytest.raises(HeldoutAccess, match="does not exist"):
            await Evidence(conn.log, "evo-guard").attempts([999])


async def test_evidence_refuses_a_heldout_round_whose_role_it_has_already_read(nats_url: str) -> None:
    """Evidence reads a run's round roles once and keeps them: a held-out round among them is still refused."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        rollout = Rollout([ToyBench()], RANDOM, starter_harness("textworld"), log=conn.log,
                          settings=RolloutSettings(attempts=1, max_steps=6))
        await rollout.start("evo-cached")
        await rollout.run_round("evo-cached", 0, toy_ids("walk", 2))
        await rollout.run_round("evo-cached", 1, toy_ids("easy", 2, "test"), role="heldout",
                                label=RoundLabel(purpose="heldout"))
        evidence = Evidence(conn.log, "evo-cached")
        assert len(await evidence.attempts([0])) == 2  # both rounds' roles are read now
        for asked in ([1], [0, 1], [1, 0]):
            with pytest.raises(HeldoutAccess, match="trace round 1 of run 'evo-cached' is a heldout round"):
                await evidence.attempts(asked)
        await rollout.run_round("evo-cached", 2, toy_ids("easy", 1, "test"), role="heldout",
                                label=RoundLabel(purpose="heldout"))  # a round begun after the roles were read
        with pytest.raises(HeldoutAccess, match="trace round 2 of run 'evo-cached' is a heldout round"):
            await evidence.attempts([0, 2])
        assert [f.trace_round for f in await evidence.attempts([0])] == [0, 0]


class Fixed(Evolver):
    """An evolver that always proposes the same attachment (to steer the loop into a known situation)."""

    name = "fixed"

    def __init__(self, processor: str) -> None:
        self.processor = processor

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        failing = [d for d in context.digests if not d.solved]
        if not failing or any(self.processor in v.harness.groups() for v in context.state.live().values()):
            return []
        hooks = processor_type(self.processor).accepted_hooks()
        return [Proposal("v0", (Attach(processor=self.processor, hooks=hooks),), Manifest(
            intended_effect="test", categories=tuple({d.category for d in failing}),
            predicted_flips=tuple(d.task for d in failing), evidence=failing[0].evidence or (),
            attribution=self.processor))]


class Idle(Evolver):
    """An evolver with nothing to propose."""

    name = "idle"

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        return []


async def test_an_edit_that_closes_a_winning_path_is_rejected_not_forked(nats_url: str) -> None:
    """task_objects rings the bell at once: a solved bell attempt's winning path closed, the gate rejects it before
    any fork (a fork takes only a seesaw failure; a closed path is a regression the candidate causes)."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "evo-fork", evolver=Fixed("task_objects"), rounds=2)
    judged = of(records, GateJudged)
    assert judged and all(j.first_failure == "counterfactual" and j.outcome == "reject" for j in judged)
    assert all("toyworld:bell:" in j.checks[-1].detail and " no longer offered" in j.checks[-1].detail
               for j in judged)
    assert not of(records, VariantForked) and not of(records, HarnessShipped)


@pytest.mark.slow
def test_a_risky_candidate_waits_for_a_human_then_ships(nats_url: str) -> None:
    killed_mid_round(nats_url, "evo-approve", "1:rollouts", "--risk-threshold", "0.05")

    async def records() -> list[LedgerEvent]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            ledger = Ledger(conn, "evo-approve")
            await ledger.load()
            await ledger.close()
            return list(ledger.records)

    before = asyncio.run(records())
    asked = of(before, ApprovalRequested)[0]
    assert of(before, RoundDecided)[-1].outcome == "waiting"
    assert not [r for r in before if isinstance(r, HarnessShipped | VariantForked)]
    runner = CliRunner()
    result = runner.invoke(cli, ["--nats-url", nats_url, "approve", "evo-approve", asked.candidate, "--note",
                                 "looks right"])
    assert result.exit_code == 0, result.output
    again = runner.invoke(cli, ["--nats-url", nats_url, "approve", "evo-approve", asked.candidate])
    assert again.exit_code == 1 and "was already answered" in again.stderr
    missing = runner.invoke(cli, ["--nats-url", nats_url, "approve", "evo-approve", "C-R9-09"])
    assert missing.exit_code == 1 and "has no candidate 'C-R9-09'" in missing.stderr
    resumed = worker(nats_url, "evo-approve", "--resume", "--risk-threshold", "0.05")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    after = asyncio.run(records())
    [given] = of(after, ApprovalGiven)
    edits = [r for r in after if isinstance(r, HarnessShipped | VariantForked)]
    assert given.approved and given.note == "looks right"
    assert edits and edits[0].round == 1
    assert asked.candidate in getattr(edits[0], "candidates", (getattr(edits[0], "candidate", ""),))


def worker(nats_url: str, *args: str) -> subprocess.Popen[str]:
    """The evolve worker in a process of its own."""
    # the caller's PYTHONPATH kept: a worktree under test runs its own hx, not the installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(WORKER), nats_url, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def killed_mid_round(nats_url: str, run_id: str, at: str, *extra: str) -> None:
    """Leave ``run_id`` unfinished: its evolver killed when the round reaches the stage ``at`` (``round:stage``)."""
    proc = worker(nats_url, run_id, "--pause-at", at, *extra)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    round_, _, stage = at.partition(":")
    assert json.loads(line) == {"paused": [int(round_), stage]}


@pytest.mark.slow
async def test_two_evolvers_on_one_run_one_gets_a_conflict_and_nothing_is_lost(nats_url: str) -> None:
    await asyncio.to_thread(killed_mid_round, nats_url, "evo-two", "0:gate")
    async with connect(NatsSettings(url=nats_url)) as conn:
        results = await asyncio.gather(evolve(conn, "evo-two", resume=True), evolve(conn, "evo-two", resume=True),
                                       return_exceptions=True)
        ledger = Ledger(conn, "evo-two")
        await ledger.load()
        records = list(ledger.records)
        await ledger.close()
    conflicts = [r for r in results if isinstance(r, LedgerConflict)]
    assert len(conflicts) == 1, results
    assert chain_holds(records) and isinstance(records[-1], EvolutionFinished)
    assert [d.round for d in of(records, RoundDecided)] == [0, 1, 2, 3]  # each round decided once
    assert len({c.candidate for c in of(records, CandidateProposed)}) == len(of(records, CandidateProposed))


@pytest.mark.slow
def test_a_killed_evolver_resumes_to_the_result_of_one_never_killed(nats_url: str) -> None:
    whole = worker(nats_url, "evo-whole")
    out, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, err
    reference = json.loads(out.strip().splitlines()[-1])
    killed_mid_round(nats_url, "evo-killed", "0:gate")
    resumed = worker(nats_url, "evo-killed", "--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["rounds"] == reference["rounds"] and result["variants"] == reference["variants"]
    assert result["heldout"] == reference["heldout"] and result["routing"] == reference["routing"]
    # Each round counts the attempts it used, on the log: the rollouts before the kill too.
    assert result["rollouts"] == reference["rollouts"] and min(reference["rollouts"]) > 0


async def test_the_gate_forks_on_real_attempts(nats_url: str) -> None:
    """The gate on its own: an edit gaining in one cluster and losing in another forks, and says where."""
    bench = ToyWorld()
    base = starter_harness("textworld")
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "evo-gate", evolver=Idle(), rounds=1)
        state = RunState.of(records)
        digests = of(records, RoundDigested)[0].digests
        trials = Trials(conn.log, "evo-gate", [bench], ModelConfig(), RolloutSettings(attempts=2, max_steps=30, seed=3),
                        Splits.of([d.task for d in digests]), next_round=100)
        trials.digests = {"v0": digests}
        op = Attach(processor="task_objects", hooks=("task_start", "after_tool", "before_model"))
        failing = tuple(d.task for d in digests if not d.solved)
        evidence = next(d.evidence for d in digests if d.evidence)
        manifest = Manifest(intended_effect="x", predicted_flips=failing, attribution="task_objects", evidence=evidence)
        cand = CandidateProposed(run_id="evo-gate", round=0, candidate="C-T", variant="v0", evolver="t",
                                 operations=(op,), buckets=("processor",), manifest=manifest,
                                 base_digest=base.digest, digest=apply(base, (op,)).digest)
        verdict = await judge(cand, lambda: apply(base, (op,)), base, trials, Forbidden.of([], [], []), allow_fork=True)
    assert state.variants["v0"].harness.digest == base.digest
    assert [c.name for c in verdict.checks] == ["manifest", "config", "smoke", "leakage", "counterfactual", "seesaw"]
    assert verdict.outcome == "fork" and verdict.clusters == ("toyworld:rooms",)


class Broken(Evolver):
    """An evolver that raises, or proposes edits that cannot build (to see the loop record, not crash)."""

    name = "broken"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        if self.mode == "raise":
            raise RuntimeError("the evolver tripped over its own feet")
        failing = [d for d in context.digests if not d.solved]
        manifest = Manifest(intended_effect="test", categories=("loop",), predicted_flips=(failing[0].task,),
                            evidence=failing[0].evidence or (Anchor(seq=1),), attribution="nowhere")
        return [Proposal("v0", (Remove(group="no_such_processor_here"),), manifest),
                Proposal("v0", (Attach(processor="not_a_registered_processor", hooks=("pre_step",)),), manifest)]


async def test_a_raising_evolver_makes_recorded_no_candidate_rounds(nats_url: str) -> None:
    """The exception's type and message are the round's reason; the run still finishes and holds held-out."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "evo-raise", evolver=Broken("raise"), rounds=2)
    decisions = of(records, RoundDecided)
    assert [d.outcome for d in decisions] == ["no_candidate", "no_candidate"]
    assert all("RuntimeError: the evolver tripped over its own feet" in d.reason for d in decisions)
    assert isinstance(records[-1], EvolutionFinished) and chain_holds(records)
    assert [h.round for h in of(records, HeldoutScored)] == [-1, 1]


async def test_candidates_that_do_not_build_are_recorded_and_rejected(nats_url: str) -> None:
    """A build error is on the candidate, the critic names it and keeps it from the gate, nothing ships."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "evo-nobuild", evolver=Broken("build"), rounds=1)
    proposed = of(records, CandidateProposed)
    assert len(proposed) == 2 and all(p.build_error and not p.digest for p in proposed)
    assert "no_such_processor_here" in proposed[0].build_error
    assert "not_a_registered_processor" in proposed[1].build_error
    [critic] = of(records, CriticJudged)
    assert not critic.ranking and {c.candidate for c in critic.concerns} == {p.candidate for p in proposed}
    assert all(any("does not build" in n for n in c.concerns) for c in critic.concerns)
    assert not of(records, GateJudged)  # the critic kept them from the gate's rollouts
    [decision] = of(records, RoundDecided)
    assert decision.outcome == "all_rejected" and not of(records, HarnessShipped)
    assert chain_holds(records)


async def dropped_cancellation() -> None:
    """Cancel the current task as a request's answer lands: Python 3.11's ``wait_for`` returns the answer and drops
    the cancellation (the task runs on, ``cancelling()`` still counts it), as nats-py's requests can."""
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    answer: asyncio.Future[None] = loop.create_future()

    def land_together() -> None:
        answer.set_result(None)
        me.cancel()

    loop.call_soon(land_together)
    await asyncio.wait_for(answer, 10)
    assert me.cancelling() == 1  # asked to stop, and still running


class DroppingEvolver(OfflineEvolver):
    """The offline evolver, whose first proposal call drops a cancellation of the run's task (a SIGTERM, say)."""

    dropped = False

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        if not self.dropped:
            self.dropped = True
            await dropped_cancellation()
        return await super().propose(context, k)


async def test_a_run_whose_cancellation_was_dropped_stops_at_its_next_step(nats_url: str) -> None:
    """Stopped (Ctrl-C, SIGTERM) as a 3.11 wait_for swallowed it: the run appends nothing more and ends cancelled."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        evolver = DroppingEvolver()
        running = asyncio.create_task(evolve(conn, "evo-dropped", evolver=evolver, rounds=3))
        with pytest.raises(asyncio.CancelledError):
            await running
        assert evolver.dropped
        ledger = Ledger(conn, "evo-dropped")
        try:
            await ledger.load()
            records = list(ledger.records)
        finally:
            await ledger.close()
    assert not of(records, CandidateProposed) and not of(records, RoundDecided)  # round 0 went no further
    assert not of(records, EvolutionFinished)
