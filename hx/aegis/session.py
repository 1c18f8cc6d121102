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
from pathlib import Path
from typing import Any

import msgspec

from hx.aegis.code import CodeStore
from hx.aegis.evolvers.base import Evolver
from hx.aegis.gate import Forbidden
from hx.aegis.ledger import Ledger, LedgerError, read_records
from hx.aegis.loop import Evolution
from hx.aegis.settings import EvolveSettings, Progress, RoundRow
from hx.aegis.state import RunState
from hx.aegis.trials import Trials
from hx.bench.registry import Benchmark, TaskId
from hx.bench.rollout import RolloutSettings, RunExists
from hx.bench.splits import Splits, round_roles
from hx.harness.config import HarnessConfig
from hx.runtime.models import ModelConfig, restore_spec
from schemas.ledger import (
    CandidateProposed,
    EvolutionFinished,
    GameScore,
    GateJudged,
    HeldoutScored,
    LedgerEvent,
    LedgerOpened,
    RoundDecided,
)
from schemas.lifecycle import RunFinished, RunStarted
from streams.connection import Connection
from streams.errors import ConcurrencyConflict
from streams.redaction import scrub
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


@dataclass
class EvolutionReport:
    """What a run did, from its ledger: a row per round, held-out before and after, the variants."""

    run_id: str
    status: str
    rounds: list[RoundRow] = field(default_factory=list)
    heldout_before: HeldoutScored | None = None
    heldout_after: HeldoutScored | None = None
    variants: dict[str, str] = field(default_factory=dict)
    """Live variant -> its harness digest."""
    routing: dict[str, str] = field(default_factory=dict)
    learner: list[Any] = field(default_factory=list)
    """Co-evolution: the learner's records (``PolicyUpdated``, ``UpdateSkipped``, ``PolicyGated``), in order."""
    policy: str = ""
    """Co-evolution: the policy version the run ended with."""
    heldout_split: str = "test"
    """Where the held-out tasks came from (``train``: a validation split)."""

    def games(self) -> list[tuple[str, GameScore | None, GameScore | None]]:
        """Per game: held-out figures before and after."""
        before = {g.game: g for g in (self.heldout_before.games if self.heldout_before else ())}
        after = {g.game: g for g in (self.heldout_after.games if self.heldout_after else ())}
        return [(g, before.get(g), after.get(g)) for g in sorted({*before, *after})]


def report(records: Sequence[Any], seconds: dict[int, float]) -> EvolutionReport:
    """Fold a run's ledger records into its report."""
    state = RunState.of(records)
    finished = next((r for r in records if isinstance(r, EvolutionFinished)), None)
    held = [r for r in records if isinstance(r, HeldoutScored)]
    rows = []
    for r in records:
        if isinstance(r, RoundDecided):
            rows.append(RoundRow(round=r.round, outcome=r.outcome,
                                 variants=len({d.variant for d in state.digests.get(r.round, ())}) or 1,
                                 shipped=r.shipped, pass_at_k=r.metrics.pass_at_k, rollouts=r.metrics.rollouts,
                                 seconds=seconds.get(r.round)))
    return EvolutionReport(
        run_id=state.opened.run_id, status=finished.status if finished else "unfinished", rounds=rows,
        heldout_before=next((h for h in held if h.round == -1), None),
        heldout_after=held[-1] if len(held) > 1 else None,
        variants={n: v.harness.digest for n, v in state.live().items()}, routing=dict(state.routing),
        heldout_split=", ".join(sorted({TaskId.parse(t).split for t in state.opened.settings.get("heldout", ())}))
        or "test")


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
    for tid in tasks:
        task = by_name[TaskId.parse(tid).benchmark].make_task(TaskId.parse(tid))
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


async def run_evolution(conn: Connection, benches: Sequence[Benchmark], job: EvolveJob, parts: Parts, *,
                        resume: bool) -> EvolutionReport:
    """Start (or resume) the run of ``job`` and run it to its end; the report comes from the ledger."""
    check_run_id(job.run_id)
    splits = Splits.of(job.adaptation, job.heldout)
    ledger = Ledger(conn, job.run_id)
    try:
        if resume:
            if await ledger.load() is None:
                raise LedgerError(f"run {job.run_id!r} has no ledger to resume")
        else:
            await _claim_trace(conn, job)
            harness = HarnessConfig.from_dict(job.harness)
            await ledger.start(LedgerOpened(run_id=job.run_id, strategy=job.loop_settings.strategy,
                                            harness=harness.to_dict(), digest=harness.digest,
                                            settings=msgspec.to_builtins(job.public()),
                                            heldout_digest=splits.heldout_digest))
        roles = await round_roles(conn.log, job.run_id)
        trials = Trials(conn.log, job.run_id, benches, ModelConfig(main=job.model), job.rollout_settings, splits,
                        next_round=max(roles, default=-1) + 1, on_attempt=parts.on_attempt)
        forbidden = await forbidden_texts(benches, [*job.adaptation, *job.heldout])
        if parts.store is not None:
            await restore_plugins(parts.store, ledger.records)
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
        await _finish_trace(conn, job.run_id, ledger)
        result = report(ledger.records, evolution.seconds)
        if coevolution is not None:
            result.learner, result.policy = list(coevolution.learner.position.updates), coevolution.version
        return result
    finally:
        await ledger.close()


async def restore_plugins(store: CodeStore, records: Sequence[Any]) -> None:
    """Write back the code of every candidate that passed the gate, so its harnesses build in this process."""
    if not any(isinstance(r, CandidateProposed) and r.code for r in records):
        return  # no new processor code on this ledger: nothing to put on the path
    store.activate()
    passed = {r.candidate for r in records if isinstance(r, GateJudged) and r.passed}
    for r in records:
        if isinstance(r, CandidateProposed) and r.candidate in passed:
            for asset in r.code:
                await store.materialize(asset)


async def read_run(conn: Connection, run_id: str, plugin_dir: Path) -> list[LedgerEvent] | None:
    """A run's ledger records (None: no ledger), the new processor code its harnesses name restored to ``plugin_dir``.

    Harnesses that name new processor code build only with its (gate-proven) modules on the path.
    """
    records = await read_records(conn, run_id)
    if records is not None:
        await restore_plugins(CodeStore(conn.log, plugin_dir), records)
    return records


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


async def _finish_trace(conn: Connection, run_id: str, ledger: Ledger) -> None:
    finished = next((r for r in ledger.records if isinstance(r, EvolutionFinished)), None)
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

