"""An evolution session: the job, its splits and parts, started fresh or resumed from the ledger.

``EvolveJob`` (``hx.aegis.job``) is everything a run needs, recorded in its ``LedgerOpened`` so a
resumed run (``hx evolve --resume RUN``) rebuilds the very same parts: benchmarks and games,
adaptation tasks (dev split) and frozen held-out tasks (test split), the task agent, the
initial harness, the rollout settings and the loop's. ``new_job`` makes it from the command
line's ``EvolveRequest``; ``recorded_job`` reads it back from a ledger, in either recorded
shape. ``run_evolution`` wires the loop
(ledger, trials, evolver, critic, gate inputs) and returns an ``EvolutionReport``
folded from the ledger: the table per round and held-out before and after.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hx.aegis.digester import ProseWriter
from hx.aegis.errors import LedgerError
from hx.aegis.evolvers.base import Evolver
from hx.aegis.gate import CodeCheck, Forbidden, SuiteCheck
from hx.aegis.job import EvolveJob, EvolveRequest
from hx.aegis.ledger import Ledger
from hx.aegis.loop import Evolution
from hx.aegis.settings import Progress
from hx.aegis.stage import CodeSource, Stage
from hx.aegis.stages import pipeline
from hx.aegis.stages.criticise import CriticFn
from hx.aegis.stages.gating import Approver
from hx.aegis.stages.rollouts import Resting
from hx.aegis.suite_gate import SuiteGate
from hx.aegis.trials import Trials
from hx.environments.errors import RunExists
from hx.environments.registry import Benchmark, TaskId
from hx.environments.splits import Splits, round_roles
from hx.harness.config import HarnessConfig
from hx.replay.scoreboard import EvolutionReport, report
from hx.runtime.code import CodeStore, restore_plugins
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from projections.ledger import RunLedger
from schemas.job import nested_job
from schemas.learn import PolicyGated, PolicyUpdated, UpdateSkipped
from schemas.ledger import (
    EvolutionFinished,
    LedgerOpened,
)
from schemas.lifecycle import RunFinished, RunStarted
from streams.connection import Connection
from streams.errors import ConcurrencyConflict
from streams.signing import LedgerKey
from streams.topology import check_run_id, trace_subject

HELDOUT_SPLITS = ("test", "train")
"""Where held-out tasks may come from: the test split, or the train split used as a validation split."""


def task_lists(benches: Sequence[Benchmark], specs: Sequence[str], adaptation: int,
               heldout: int, heldout_split: str = "test") -> tuple[list[str], list[str]]:
    """The first ``adaptation`` dev tasks and ``heldout`` tasks of ``heldout_split`` of each ``benchmark:game``.

    The held-out split is the test split; ``train`` makes it a validation split, for trying a
    setting out without looking at the test tasks.
    """
    by_name = {b.name: b for b in benches}
    dev: list[str] = []
    test: list[str] = []
    for spec in specs:
        name, _, game = spec.partition(":")
        bench = by_name[name]
        for g in [game] if game else bench.default_games():
            dev += [str(t) for t in bench.task_ids(g, "dev", limit=adaptation)]
            test += [str(t) for t in bench.task_ids(g, heldout_split, limit=heldout)]
    return dev, test


async def forbidden_texts(benches: Sequence[Benchmark], tasks: Sequence[str]) -> Forbidden:
    """What no candidate may contain: the run's task ids and their reference solutions."""
    by_name = {b.name: b for b in benches}
    solutions = []
    for tid in map(TaskId.parse, tasks):
        task = by_name[tid.benchmark].make_task(tid)
        try:
            await task.reset()
            solutions.append(task.solution())
        finally:
            await task.close()
    answers = [s[0] for s in solutions if len(s) == 1]
    return Forbidden.of(tasks, [s for s in solutions if len(s) > 1], answers)


@dataclass
class Parts:
    """What the command line supplies besides the job: the evolver, the optional LLM pieces, any added stages."""

    evolver: Evolver
    progress: Progress = field(default_factory=Progress)
    on_attempt: Callable[[AttemptResult], None] | None = None
    critic: CriticFn | None = None
    code_check: CodeCheck | None = None
    code_source: CodeSource | None = None
    approver: Approver | None = None
    prose: ProseWriter | None = None
    store: CodeStore | None = None
    """Where new processor code lives; a resumed run re-materializes the code its harnesses use."""
    on_update: Callable[[PolicyUpdated | UpdateSkipped | PolicyGated], None] | None = None
    """Called with each learner record of a co-evolution run."""
    key: LedgerKey | None = None
    """What the run's ledger events are signed with (the data directory's key)."""
    stages: tuple[Stage[Any], ...] = ()
    """Stages run after today's pipeline in every round (e.g. ``RoundLog``)."""

    def pipeline(self, resting: Resting | None = None, suite_check: SuiteCheck | None = None) -> list[Stage[Any]]:
        """A round's stages: today's pipeline with these parts plugged in, then the added ``stages``."""
        return [*pipeline(critic=self.critic, prose=self.prose, code_check=self.code_check,
                          code_source=self.code_source, approver=self.approver, resting=resting,
                          suite_check=suite_check), *self.stages]


async def run_evolution(conn: Connection, benches: Sequence[Benchmark], job: EvolveJob, parts: Parts, *,
                        resume: bool) -> EvolutionReport:
    """Start (or resume) the run of ``job`` and run it to its end; the report comes from the ledger."""
    check_run_id(job.run_id)
    splits = Splits.of(job.adaptation, job.heldout)
    ledger = Ledger(conn, job.run_id, parts.key)
    try:
        if resume:
            if await ledger.load() is None:
                raise LedgerError(f"run {job.run_id!r} has no ledger to resume")
        else:
            await _claim_trace(conn, job)
            harness = HarnessConfig.from_spec(job.harness)
            await ledger.start(LedgerOpened(run_id=job.run_id, strategy=job.loop.strategy,
                                            harness=harness.spec(), digest=harness.digest,
                                            settings=job.recorded(),
                                            heldout_digest=splits.heldout_digest))
        roles = await round_roles(conn.log, job.run_id)
        trials = Trials(conn.log, job.run_id, benches, ModelConfig(main=job.model), job.rollout, splits,
                        next_round=max(roles, default=-1) + 1, on_attempt=parts.on_attempt)
        forbidden = await forbidden_texts(benches, [*job.adaptation, *job.heldout])
        if parts.store is not None:
            await restore_plugins(parts.store, RunLedger.of(ledger.records))
        coevolution = None
        if job.coevolving:
            # imported here: the learner brings JAX, which plain evolution runs never load
            from hx.aegis.coevolution import Coevolution, CoevolveJob

            assert isinstance(job, CoevolveJob)
            coevolution = Coevolution.of(ledger, trials, job.coevolve)
            if parts.on_update is not None:
                coevolution.on_update = parts.on_update
            await coevolution.start()
        evolution = Evolution(ledger, trials, parts.evolver, job.loop, forbidden,
                              stages=parts.pipeline(coevolution.resting if coevolution else None,
                                                    SuiteGate.of(conn, trials, job.loop.gate)),
                              hooks=coevolution, progress=parts.progress)
        await evolution.run()
        await _finish_trace(conn, job.run_id, evolution.state().ledger.finished)
        result = report(evolution.state().ledger, evolution.seconds)
        if coevolution is not None:
            result.learner, result.policy = list(coevolution.learner.position.updates), coevolution.version
        return result
    finally:
        await ledger.close()


async def _claim_trace(conn: Connection, job: EvolveJob) -> None:
    """Claim the run on the trace (``RunStarted``): two evolvers cannot start one run id."""
    subject = trace_subject(job.run_id)
    event = RunStarted(run_id=job.run_id, kind="evolve", config={"benches": list(job.benches),
                                                                 "model": job.public().model, "evolver": job.evolver},
                       seed=job.rollout.seed)
    try:
        await conn.log.append(subject, event, key=f"{subject}#run.started@{uuid.uuid4().hex[:12]}",
                              expected_last_seq=0)
    except ConcurrencyConflict:
        raise RunExists(f"run {job.run_id!r} is already on the log; use another run id or --resume it") from None


async def _finish_trace(conn: Connection, run_id: str, finished: EvolutionFinished | None) -> None:
    if finished is None:
        return
    subject = trace_subject(run_id)
    await conn.log.append(subject, RunFinished(run_id=run_id, status="completed", reason=finished.reason,
                                               rounds=finished.rounds),
                          key=f"{subject}#run.finished@{uuid.uuid4().hex[:12]}")


def new_job(run_id: str, benches: Sequence[Benchmark], request: EvolveRequest, *, harness: HarnessConfig,
            harness_source: str) -> EvolveJob:
    """A fresh job from the command line's request (its model given: a fresh run has one)."""
    assert request.model is not None
    choice = request.tasks
    dev, test = task_lists(benches, choice.benches, choice.adaptation, choice.heldout, choice.heldout_split)
    job = EvolveJob(run_id=run_id, benches=tuple(choice.benches), adaptation=tuple(dev), heldout=tuple(test),
                    model=request.model, harness=harness.spec(), harness_source=harness_source,
                    evolver=request.evolver, meta_model=request.meta_model, rollout=request.rollout, loop=request.loop)
    if request.coevolve is None:
        return job
    from hx.aegis.coevolution import CoevolveJob  # the learner brings JAX: only co-evolution loads it

    return CoevolveJob(**msgspec.structs.asdict(job), coevolve=request.coevolve)


def recorded_job(settings: Mapping[str, Any]) -> EvolveJob:
    """The job a ledger recorded (``LedgerOpened.settings``), nested or flat (as older runs recorded it); an
    ``hx coevolve`` job as a ``CoevolveJob``."""
    job = nested_job(settings)
    # A job recorded before the gate's settings ran the seven checks with the retry rule: ``gate: {}`` says so (a
    # new job's default gate is the sequential rule, and it is recorded as such).
    job["loop"] = {"gate": {}, **(job.get("loop") or {})}
    if not job.get("coevolve"):
        return msgspec.convert(job, EvolveJob)
    from hx.aegis.coevolution import CoevolveJob  # the learner brings JAX: only co-evolution loads it

    return msgspec.convert(job, CoevolveJob)
