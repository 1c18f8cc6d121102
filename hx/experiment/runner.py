"""Run an experiment on the log: every unit an attempt under the experiment's run, resumable, then concluded.

The run opens with ``RunStarted`` (kind ``experiment``, the spec digest in its config) and
``ExperimentStarted`` (the spec and the seeded unit order), and one ``RoundStarted`` per cell
(round = the cell's index, variant = its name, the cell's harness digest). Each unit is one
attempt ``hx.trace.<run>.<cell>.<task>.<attempt>`` with the cell's level applied through its
scope; everything else (model, harness, step cap, stop rule, seed of the agent) is the
spec's controlled variables, the same in every cell. When every unit has finished, the
conclusion (``hx.experiment.analysis``) is appended as ``ExperimentConcluded``, then
``RoundFinished`` per cell and ``RunFinished``.

``resume`` reads what the log holds through the ``attempt_outputs`` projection: a unit whose
attempt finished is skipped, one that started and did not finish is played again on a fresh
attempt number with the same agent seed, so the conclusion equals an uninterrupted run's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

import hx.environments  # noqa: F401 - registers the benchmark adapters
from hx.environments.errors import BenchmarkError
from hx.environments.registry import Benchmark, TaskId, benchmark
from hx.environments.rollout import Rollout, RolloutSettings, attempt_seed
from hx.experiment.analysis import conclude
from hx.experiment.design import Cell, Unit, attempt_number, design_cells, replication_of, units
from hx.experiment.errors import ExperimentError
from hx.experiment.levels import Arm, arm_of
from hx.experiment.procedure import check_procedures, make_products
from hx.experiment.spec import spec_digest, spec_to_dict
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.runtime.cancel import cancel_all
from hx.runtime.loop import AttemptResult, RunLoop
from hx.runtime.models import ModelConfig
from projections.attempt_outputs import AttemptOutput, AttemptOutputs
from projections.runner import ProjectionRunner
from schemas.event import Event
from schemas.experiment import ExperimentConcluded, ExperimentSpec, ExperimentStarted
from schemas.lifecycle import AttemptMark, RoundFinished, RoundStarted, RunFinished, RunStarted
from streams.connection import Connection
from streams.log import EventLog
from streams.signing import LedgerKey
from streams.topology import TRACE, subject_token, trace_subject

DEFAULT_MAX_STEPS = 50

UnitDone = Callable[[Unit, AttemptResult], None]
"""Called once per unit played, in completion order."""


@dataclass(frozen=True)
class Controlled:
    """The controlled variables the runner applies, the same in every arm."""

    model: str = "random:"
    harness: HarnessConfig | None = None
    """None: the starter harness of the tasks' benchmark family."""
    harness_source: str = ""
    max_steps: int = DEFAULT_MAX_STEPS
    timeout_s: float | None = None

    @classmethod
    def of(cls, spec: ExperimentSpec, base_dir: Path) -> Controlled:
        """The controlled variables a spec declares; a harness path is relative to the spec's folder."""
        cv = spec.controlled_variables
        harness = None
        source = ""
        if cv.get("harness"):
            path = Path(str(cv["harness"]))
            path = path if path.is_absolute() else base_dir / path
            harness, source = HarnessConfig.load(path), str(cv["harness"])
        try:
            max_steps = int(cv.get("max_steps", DEFAULT_MAX_STEPS))
            timeout = cv.get("timeout_s")
            timeout_s = float(timeout) if timeout is not None else None
        except (TypeError, ValueError) as exc:
            raise ExperimentError(f"controlled_variables: max_steps and timeout_s must be numbers ({exc})") from exc
        if max_steps < 1:
            raise ExperimentError("controlled_variables.max_steps: at least 1")
        return cls(model=str(cv.get("model", "random:")), harness=harness, harness_source=source,
                   max_steps=max_steps, timeout_s=timeout_s)


@dataclass
class Progress:
    """Where a run stands: units in the design, already done on the log, played now."""

    total: int = 0
    done_before: int = 0
    played: int = 0


def _benchmarks(spec: ExperimentSpec) -> tuple[dict[str, Benchmark], list[TaskId]]:
    """The benchmarks the spec's task ids name, and the ids parsed (known games checked)."""
    benches: dict[str, Benchmark] = {}
    ids: list[TaskId] = []
    try:
        for text in spec.tasks:
            try:
                tid = TaskId.parse(text)
            except (ValueError, BenchmarkError) as exc:
                raise ExperimentError(f"tasks: {text!r} is not a task id (BENCH:GAME:SPLIT:N): {exc}") from exc
            if tid.benchmark not in benches:
                benches[tid.benchmark] = benchmark(tid.benchmark)
            if tid.game not in benches[tid.benchmark].games():
                raise ExperimentError(f"tasks: {text!r}: {tid.benchmark} has no game {tid.game!r}")
            ids.append(tid)
    except BaseException:
        for bench in benches.values():
            bench.close()
        raise
    return benches, ids


def _base_harness(controlled: Controlled, benches: Mapping[str, Benchmark]) -> tuple[HarnessConfig, str]:
    if controlled.harness is not None:
        return controlled.harness, controlled.harness_source
    families = sorted({b.family for b in benches.values()})
    if len(families) != 1 or not families[0]:
        raise ExperimentError("controlled_variables.harness: the tasks span several benchmark families; "
                              "name one harness file for all arms")
    return starter_harness(families[0]), f"starter:{families[0]}"


def run_filter(run_id: str) -> str:
    """Every trace subject of one run (run-, round- and attempt-level)."""
    return f"hx.trace.{subject_token(run_id)}.>"


async def run_events(log: EventLog, run_id: str) -> list[Event]:
    """The run-level events of a run, in log order."""
    types = [RunStarted.TYPE, ExperimentStarted.TYPE, ExperimentConcluded.TYPE, RunFinished.TYPE]
    return [record.event async for record in log.read(TRACE.name, subjects=[trace_subject(run_id)], types=types)]


async def attempt_outputs(log: EventLog, run_id: str) -> dict[str, AttemptOutput]:
    """Every attempt of the run, folded by the ``attempt_outputs`` projection."""
    runner: ProjectionRunner[dict[str, AttemptOutput]] = ProjectionRunner(log, AttemptOutputs())
    async for record in log.read(TRACE.name, subjects=[run_filter(run_id)], types=AttemptOutputs.reads):
        runner.apply(record)
    return runner.state


def _units_on_log(spec: ExperimentSpec, outputs: Mapping[str, AttemptOutput],
                  by_key: Mapping[tuple[int, str, int], Unit]) -> tuple[dict[Unit, AttemptOutput], dict[Unit, int]]:
    """(finished units and their attempt, tries so far per unit) from the run's attempts."""
    finished: dict[Unit, AttemptOutput] = {}
    tries: dict[Unit, int] = {}
    for output in outputs.values():
        unit = by_key.get((output.round, output.task, replication_of(output.attempt, spec.replications)))
        if unit is None:
            continue
        tries[unit] = max(tries.get(unit, 0), output.attempt // spec.replications + 1)
        if output.finished and unit not in finished:
            finished[unit] = output
    return finished, tries


@contextlib.contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables for one attempt, restoring them after."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


class ExperimentRun:
    """One experiment's run on the log: start or resume, play the units, conclude."""

    def __init__(self, spec: ExperimentSpec, conn: Connection, *, run_id: str, base_dir: Path = Path("."),
                 concurrency: int = 1, key: LedgerKey | None = None) -> None:
        self.spec = spec
        self.key = key
        """What the evolutions of procedure levels sign their ledgers with (``hx experiment run``: the data
        directory's key, as ``hx evolve`` does)."""
        self.digest = spec_digest(spec)
        self.conn = conn
        self.log: EventLog = conn.log
        self.run_id = run_id
        self.controlled = Controlled.of(spec, base_dir)
        check_procedures(spec)
        self.cells = design_cells(spec)
        self.order = units(spec)
        self.seeds = max(1, len(spec.procedure_seeds))
        self.by_key = {(self.round_of(u), u.task, u.replication): u for u in self.order}
        # an env level is process-wide: its attempts run one at a time so no other arm sees it
        env_scope = any(f.scope.kind == "env" for f in spec.factors)
        self.concurrency = 1 if env_scope else max(1, concurrency)
        self.progress = Progress(total=len(self.order))
        self.unstarted = False

    def round_of(self, unit: Unit) -> int:
        """The trace round a unit plays in: its cell's, one per procedure seed (the product it plays)."""
        return unit.cell.index + len(self.cells) * (unit.replication % self.seeds)

    async def _arms(self, base: HarnessConfig, benches: Mapping[str, Benchmark]) -> dict[int, Arm]:
        """Each round's arm (a cell with one procedure seed's products); procedure levels' products are made first
        (or read back when resuming)."""
        models = ModelConfig(main=self.controlled.model)
        products = {}
        if any(f.scope.kind == "procedure" for f in self.spec.factors):
            products = await make_products(self.conn, self.spec, benches, run_id=self.run_id, base=base,
                                           model=self.controlled.model, max_steps=self.controlled.max_steps,
                                           concurrency=self.concurrency, key=self.key)
        return {cell.index + len(self.cells) * s: arm_of(self.spec, cell, base, models, products, s)
                for s in range(self.seeds) for cell in self.cells}

    def _rollout(self, base: HarnessConfig, source: str, benches: Mapping[str, Benchmark]) -> Rollout:
        """The run's brackets (RunStarted, RunFinished) and the tasks its units play."""
        c = self.controlled
        settings = RolloutSettings(attempts=self.spec.replications, concurrency=self.concurrency,
                                   max_steps=c.max_steps, seed=self.spec.seed, timeout_s=c.timeout_s)
        return Rollout(list(benches.values()), ModelConfig(main=c.model), base, log=self.log, settings=settings,
                       harness_source=source)

    async def _claim(self, base: HarnessConfig, source: str, benches: Mapping[str, Benchmark]) -> None:
        """RunStarted (kind experiment, the spec digest): a second run of this id is refused here."""
        extra = {"experiment": self.spec.title, "spec_digest": self.digest, "cells": [c.name for c in self.cells],
                 "replications": self.spec.replications}
        await self._rollout(base, source, benches).start(self.run_id, kind="experiment", extra=extra)

    async def _start(self, arms: Mapping[int, Arm], task_ids: tuple[str, ...]) -> None:
        """ExperimentStarted (the spec and the order) and one RoundStarted per cell."""
        subject = trace_subject(self.run_id)
        started = ExperimentStarted(run_id=self.run_id, spec=spec_to_dict(self.spec), spec_digest=self.digest,
                                    order=tuple(u.key for u in self.order))
        await self.log.append(subject, started, key=f"{subject}#{started.TYPE}")
        for number, cell in self._rounds():
            round_subject = trace_subject(self.run_id, number)
            event = RoundStarted(run_id=self.run_id, round=number, harness_digest=arms[number].harness.digest,
                                 task_ids=task_ids, split="dev",
                                 attempts_per_task=self.spec.replications // self.seeds, purpose="experiment",
                                 variant=self._round_name(number, cell))
            await self.log.append(round_subject, event, key=f"{round_subject}#{event.TYPE}")

    def _rounds(self) -> list[tuple[int, Cell]]:
        """Every (trace round, cell): each cell once per procedure seed."""
        return [(cell.index + len(self.cells) * s, cell) for s in range(self.seeds) for cell in self.cells]

    def _round_name(self, number: int, cell: Cell) -> str:
        """A round's name: its cell's, with the procedure seed when there are several."""
        if self.seeds == 1:
            return cell.name
        return f"{cell.name}@seed{self.spec.procedure_seeds[number // len(self.cells)]}"

    async def _check_resumable(self) -> ExperimentConcluded | None:
        """The run's conclusion if it has one; raises unless it is this spec's experiment."""
        events = await run_events(self.log, self.run_id)
        started = next((e for e in events if isinstance(e, RunStarted)), None)
        if started is None:
            raise ExperimentError(f"--resume {self.run_id}: no such run on the log")
        if started.kind != "experiment":
            raise ExperimentError(f"--resume {self.run_id}: the run is a {started.kind} run, not an experiment")
        logged = str(started.config.get("spec_digest", ""))
        if logged != self.digest:
            raise ExperimentError(f"--resume {self.run_id}: the spec differs from the one the run started with "
                                  f"({logged[:19]} on the log, {self.digest[:19]} given)")
        # stopped while its procedures ran: ExperimentStarted and the rounds are still to write
        self.unstarted = not any(isinstance(e, ExperimentStarted) for e in events)
        return next((e for e in events if isinstance(e, ExperimentConcluded)), None)

    async def run(self, *, resume: bool = False, max_units: int | None = None,
                  on_unit: UnitDone | None = None) -> ExperimentConcluded | None:
        """Play the units not yet done (at most ``max_units``); the conclusion once every unit is done, else None."""
        if resume:
            concluded = await self._check_resumable()
            if concluded is not None:
                return concluded
        benches, ids = _benchmarks(self.spec)
        try:
            base, source = _base_harness(self.controlled, benches)
            if not resume:  # claim the run id before any procedure runs under names derived from it
                await self._claim(base, source, benches)
            arms = await self._arms(base, benches)
            rollout = self._rollout(base, source, benches)
            if not resume or self.unstarted:
                await self._start(arms, tuple(str(t) for t in ids))
            finished, tries = _units_on_log(self.spec, await attempt_outputs(self.log, self.run_id), self.by_key)
            todo = [u for u in self.order if u not in finished]
            self.progress.done_before = len(self.order) - len(todo)
            if max_units is not None:
                todo = todo[:max_units]
            await self._play(rollout, arms, todo, tries, on_unit)
            finished, _ = _units_on_log(self.spec, await attempt_outputs(self.log, self.run_id), self.by_key)
            if len(finished) < len(self.order):
                return None
            return await self._conclude(rollout, finished)
        finally:
            for bench in benches.values():
                bench.close()

    async def _play(self, rollout: Rollout, arms: Mapping[int, Arm], todo: list[Unit], tries: Mapping[Unit, int],
                    on_unit: UnitDone | None) -> None:
        loops: dict[tuple[int, str], RunLoop] = {}  # (round, harness digest): a forked product plays several
        for index, arm in arms.items():
            for harness in (arm.harness, *arm.routes.values()):
                loops.setdefault((index, harness.digest), RunLoop(arm.models, harness, log=self.log))
        queue = iter(todo)
        c = self.controlled

        async def worker() -> None:
            for unit in queue:  # one shared iterator: the seeded order is the order units start in
                number = self.round_of(unit)
                arm = arms[number]
                tid = TaskId.parse(unit.task)
                attempt = attempt_number(unit, tries.get(unit, 0), self.spec.replications)
                with _environment(arm.env):
                    result = await loops[(number, arm.harness_for(unit.task).digest)].run(
                        rollout.make_task(tid), run_id=self.run_id, round=number, attempt=attempt,
                        seed=attempt_seed(self.spec.seed, unit.task, unit.replication), max_steps=c.max_steps,
                        timeout_s=c.timeout_s)
                self.progress.played += 1
                if on_unit is not None:
                    on_unit(unit, result)

        workers = [asyncio.create_task(worker()) for _ in range(min(self.concurrency, len(todo)))]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            await cancel_all(workers)
            raise

    async def _conclude(self, rollout: Rollout, finished: Mapping[Unit, AttemptOutput]) -> ExperimentConcluded:
        concluded = conclude(self.spec, self.cells, finished, run_id=self.run_id, spec_digest=self.digest)
        subject = trace_subject(self.run_id)
        await self.log.append(subject, concluded, key=f"{subject}#{concluded.TYPE}")
        for number, _ in self._rounds():
            marks = tuple(AttemptMark(task_id=u.task, attempt=out.attempt, passed=out.passed)
                          for u, out in sorted(finished.items(), key=lambda kv: (kv[0].task, kv[0].replication))
                          if self.round_of(u) == number)
            round_subject = trace_subject(self.run_id, number)
            event = RoundFinished(run_id=self.run_id, round=number, attempts=len(marks),
                                  passed=sum(m.passed for m in marks), outcomes=marks)
            await self.log.append(round_subject, event, key=f"{round_subject}#{event.TYPE}")
        await rollout.finish(self.run_id, rounds=len(self.cells) * self.seeds)
        return concluded


def conclusion_json(concluded: ExperimentConcluded) -> dict[str, Any]:
    """The conclusion as plain data (``--json``)."""
    data: dict[str, Any] = msgspec.to_builtins(concluded)
    return data
