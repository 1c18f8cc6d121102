"""An evolution session: the job, its splits and parts, started fresh or resumed from the ledger.

``EvolveJob`` is everything a run needs, recorded in its ``LedgerOpened`` so a resumed
run (``hx evolve --resume RUN``) rebuilds the very same parts: benchmarks and games,
adaptation tasks (dev split) and frozen held-out tasks (test split), the task agent, the
initial harness, the rollout settings and the loop's. ``run_evolution`` wires the loop
(ledger, trials, evolver, critic, gate inputs) and returns an ``EvolutionReport``
folded from the ledger: the table per round and held-out before and after.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hx.aegis.evolvers.base import Evolver
from hx.aegis.gate import Forbidden
from hx.aegis.ledger import Ledger, LedgerError
from hx.aegis.loop import Evolution
from hx.aegis.settings import EvolveSettings, Progress
from hx.aegis.trials import Trials
from hx.environments.registry import Benchmark, TaskId
from hx.environments.rollout import RolloutSettings, RunExists
from hx.environments.splits import Splits, round_roles
from hx.harness.config import HarnessConfig
from hx.replay.scoreboard import EvolutionReport, report
from hx.runtime.code import CodeStore, restore_plugins
from hx.runtime.models import ModelConfig, restore_spec
from projections.ledger import RunLedger
from schemas.ledger import (
    EvolutionFinished,
    LedgerOpened,
)
from schemas.lifecycle import RunFinished, RunStarted
from streams.connection import Connection
from streams.errors import ConcurrencyConflict
from streams.redaction import scrub
from streams.signing import LedgerKey
from streams.topology import check_run_id, trace_subject


class EvolveJob(msgspec.Struct, frozen=True, kw_only=True):
    """What an evolution run is: recorded on its ledger (credentials masked), so a resume rebuilds it exactly."""

    run_id: str
    benches: tuple[str, ...]
    adaptation: tuple[str, ...]
    """Adaptation task ids (evolution works on these)."""
    heldout: tuple[str, ...]
    """The frozen held-out task ids (only ever evaluated)."""
    model: str = "random:"
    harness: dict[str, Any] = {}
    harness_source: str = ""
    evolver: str = "offline"
    meta_model: str = ""
    attempts: int = 2
    concurrency: int = 4
    max_steps: int = 100
    seed: int = 0
    timeout_s: float | None = None
    settings: dict[str, Any] = {}
    """``EvolveSettings`` as plain data."""
    coevolve: dict[str, Any] = {}
    """``CoevolveSettings`` as plain data for ``hx coevolve`` (empty: the model is not trained)."""

    def public(self) -> EvolveJob:
        """This job as it is recorded and shown: credentials in its model specs masked."""
        return msgspec.structs.replace(self, model=scrub(self.model), meta_model=scrub(self.meta_model))

    def restored(self, model: str | None, meta_model: str | None) -> EvolveJob:
        """A recorded job with the credentials of its model specs given back (``restore_spec``); None: none given."""
        what = f"run {self.run_id!r}"
        return msgspec.structs.replace(
            self, model=restore_spec(self.model, model, option="--model", what=what),
            meta_model=restore_spec(self.meta_model, meta_model, option="--meta-model", what=what))

    @property
    def loop_settings(self) -> EvolveSettings:
        """The loop's settings."""
        return EvolveSettings(**self.settings)

    @property
    def rollout_settings(self) -> RolloutSettings:
        """How each rollout runs."""
        return RolloutSettings(attempts=self.attempts, concurrency=self.concurrency, max_steps=self.max_steps,
                               seed=self.seed, timeout_s=self.timeout_s)


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
    """What the command line supplies besides the job: the evolver and the optional LLM pieces."""

    evolver: Evolver
    progress: Progress = field(default_factory=Progress)
    on_attempt: Any = None
    critic: Any = None
    code_check: Any = None
    code_source: Any = None
    approver: Any = None
    prose: Any = None
    store: CodeStore | None = None
    """Where new processor code lives; a resumed run re-materializes the code its harnesses use."""
    on_update: Any = None
    """Called with each learner record of a co-evolution run."""
    key: LedgerKey | None = None
    """What the run's ledger events are signed with (the data directory's key)."""


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
            harness = HarnessConfig.from_dict(job.harness)
            await ledger.start(LedgerOpened(run_id=job.run_id, strategy=job.loop_settings.strategy,
                                            harness=harness.spec(), digest=harness.digest,
                                            settings=msgspec.to_builtins(job.public()),
                                            heldout_digest=splits.heldout_digest))
        roles = await round_roles(conn.log, job.run_id)
        trials = Trials(conn.log, job.run_id, benches, ModelConfig(main=job.model), job.rollout_settings, splits,
                        next_round=max(roles, default=-1) + 1, on_attempt=parts.on_attempt)
        forbidden = await forbidden_texts(benches, [*job.adaptation, *job.heldout])
        if parts.store is not None:
            await restore_plugins(parts.store, RunLedger.of(ledger.records))
        coevolution = None
        if job.coevolve:
            # imported here: the learner brings JAX, which plain evolution runs never load
            from hx.aegis.coevolution import Coevolution, CoevolveSettings

            settings = msgspec.convert(job.coevolve, CoevolveSettings)
            coevolution = Coevolution.of(ledger, trials, settings)
            if parts.on_update is not None:
                coevolution.on_update = parts.on_update
            await coevolution.start()
        evolution = Evolution(ledger, trials, parts.evolver, job.loop_settings, forbidden, critic=parts.critic,
                              code_check=parts.code_check, code_source=parts.code_source, approver=parts.approver,
                              progress=parts.progress, prose=parts.prose,
                              after_round=coevolution.after_round if coevolution else None,
                              spent=coevolution.spent if coevolution else None,
                              resting=coevolution.resting if coevolution else None)
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
                       seed=job.seed)
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


def new_job(run_id: str, benches: Sequence[Benchmark], specs: Sequence[str], *, tasks: int, heldout_tasks: int,
            heldout_split: str = "test", model: str, harness: HarnessConfig, harness_source: str, evolver: str,
            meta_model: str, rollout: RolloutSettings, settings: EvolveSettings) -> EvolveJob:
    """A fresh job from command-line choices."""
    dev, test = task_lists(benches, specs, tasks, heldout_tasks, heldout_split)
    return EvolveJob(run_id=run_id, benches=tuple(specs), adaptation=tuple(dev), heldout=tuple(test), model=model,
                     harness=harness.to_dict(), harness_source=harness_source, evolver=evolver, meta_model=meta_model,
                     attempts=rollout.attempts, concurrency=rollout.concurrency, max_steps=rollout.max_steps,
                     seed=rollout.seed, timeout_s=rollout.timeout_s,
                     settings=msgspec.to_builtins(dataclasses.asdict(settings)))

