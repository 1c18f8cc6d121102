"""The eval runner: play the suite (full mode) or take attempts already logged (fast mode), judge, score, record.

An eval is a run of its own, ``eval-<UTC time>-<random>``, bracketed by ``RunStarted`` and
``RunFinished`` of kind ``eval``. The full mode plays every benchmark and free task of the suite
``attempts`` times with ``hx.environments.rollout.Rollout`` under the eval run (one round per
benchmark family, each with its family's starter harness unless one is given) and runs the
memory smoke; the fast mode plays nothing and judges the finished attempts of other runs whose
task ids are the suite's. Both read attempts only through the ``attempt_outputs`` projection
(resumed from its checkpoint, so catching up is incremental and timed apart), judge each
criterion of the suite task an attempt played, and append every verdict (``CriterionJudged``,
framed in batches on the eval's round subject), each task's ``TaskScored`` and the suite's
``SuiteScored``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from hx.environments.registry import Benchmark, TaskId, benchmark
from hx.environments.rollout import Rollout, RolloutSettings
from hx.eval.criteria import Check, judge
from hx.eval.errors import EvalError
from hx.eval.free import free_benchmark
from hx.eval.score import AttemptScore, Comparison, TaskOutcomes, Weights, compare, suite_scores, task_scored
from hx.eval.smoke import memory_smoke
from hx.eval.suite import checks_of, suite_digest
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from projections.attempt_outputs import AttemptOutput, AttemptOutputs
from projections.eval_scores import EvalScore, EvalScores
from projections.runner import ProjectionRunner
from schemas.evaluation import CriterionJudged, EvalMode, SuiteScored, TaskScored
from schemas.lifecycle import RunFinished, RunStarted
from schemas.suite import CriterionSpec, Suite, SuiteTask
from streams.connection import Connection
from streams.errors import ConcurrencyConflict
from streams.log import EventLog
from streams.outgoing import Entry
from streams.redaction import public, scrub
from streams.topology import check_run_id, trace_subject

VERDICTS_PER_FRAME = 500
"""Verdicts packed into one message (~250 bytes each: far below the server's 1 MiB message limit)."""
SMOKE_PREFIX = "smoke:"


def new_eval_id() -> str:
    """A fresh eval run id: UTC time (evals sort by start) and a random suffix."""
    return f"eval-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


def task_id_of(task: SuiteTask) -> str:
    """The task id a suite task runs as: its benchmark task, ``free:<name>:dev:0`` or ``smoke:<kind>``."""
    return f"{SMOKE_PREFIX}{task.smoke}" if task.smoke else task.task_id


@dataclass(frozen=True)
class Planned:
    """A suite task with the task id it runs as and its criteria's checks (built when the suite loaded)."""

    suite_task: SuiteTask
    task: str
    checks: tuple[tuple[CriterionSpec, Check], ...]

    @property
    def name(self) -> str:
        """The suite task's name."""
        return self.suite_task.name


def plan(suite: Suite, only: Sequence[str] = ()) -> list[Planned]:
    """The suite's tasks to score (``only``: these suite tasks, each of which must exist)."""
    names = [t.name for t in suite.tasks]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise EvalError(f"--tasks: suite {suite.name!r} has no task {unknown[0]!r}; its tasks: {', '.join(names)}")
    chosen = [t for t in suite.tasks if not only or t.name in only]
    return [Planned(t, task_id_of(t), tuple(checks_of(t))) for t in chosen]


@dataclass(frozen=True)
class PlaySettings:
    """How the full mode plays: model, harness, attempts, steps, seed and concurrency."""

    model: str = "random:"
    harness: tuple[HarnessConfig, str] | None = None
    """A harness and where it came from; None: each family's starter harness."""
    families: Mapping[str, tuple[HarnessConfig, str]] = field(default_factory=dict)
    """A harness (and where it came from) for the tasks of one benchmark family, before ``harness``."""
    attempts: int | None = None
    """Attempts per task; None: the suite's."""
    max_steps: int | None = None
    """The step cap; None: the suite's."""
    seed: int = 0
    concurrency: int = 4
    timeout_s: float | None = None


@dataclass
class EvalOutcome:
    """What an eval recorded: its suite and task scores, how many verdicts, the comparison asked for, timings."""

    run_id: str
    suite: SuiteScored
    tasks: tuple[TaskScored, ...]
    verdicts: int
    comparison: Comparison | None = None
    base: SuiteScored | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``play``, ``catch_up`` (the projection), ``judge`` (judging and scoring), ``write``."""


Progress = Callable[[AttemptResult], None]
"""Called once per finished attempt of the full mode."""


def judge_all(run_id: str, planned: Sequence[Planned], outputs: Sequence[AttemptOutput]) -> tuple[
        list[CriterionJudged], list[TaskOutcomes]]:
    """Every verdict of every criterion of the suite task each attempt played, and each suite task's outcomes."""
    by_task: dict[str, list[AttemptOutput]] = {}
    for out in sorted(outputs, key=lambda o: (o.run, o.round, o.attempt)):
        by_task.setdefault(out.task, []).append(out)
    verdicts: list[CriterionJudged] = []
    tasks: list[TaskOutcomes] = []
    for p in planned:
        scores: list[AttemptScore] = []
        for out in by_task.get(p.task, ()):
            passed = 0
            for spec, check in p.checks:
                ok, detail = judge(check, out)
                passed += ok
                verdicts.append(CriterionJudged(
                    run_id=run_id, suite_task=p.name, criterion=spec.name, params=spec.params, passed=ok,
                    detail=detail, judged_run=out.run, judged_round=out.round, task=out.task,
                    judged_attempt=out.attempt))
            scores.append(AttemptScore(out.passed, len(p.checks), passed))
        if scores:
            tasks.append(TaskOutcomes(p.name, p.task, p.suite_task.weight, tuple(scores)))
    return verdicts, tasks


class EvalRunner:
    """Runs one eval of a suite on the log (``full`` or ``fast``), optionally compared with a base eval."""

    def __init__(self, conn: Connection, suite: Suite, planned: Sequence[Planned], *, seed: int = 0) -> None:
        self.conn = conn
        self.log: EventLog = conn.log
        self.suite = suite
        self.planned = list(planned)
        self.seed = seed
        self.weights = Weights(suite.success_weight, suite.criteria_weight)

    # --- reading through projections --------------------------------------------------------

    async def outputs(self) -> tuple[dict[str, AttemptOutput], float]:
        """The ``attempt_outputs`` state, caught up from its checkpoint, and how long catching up took."""
        runner: ProjectionRunner[dict[str, AttemptOutput]] = ProjectionRunner(self.log, AttemptOutputs())
        began = time.perf_counter()
        await runner.load()
        before = runner.applied
        await runner.catch_up(checkpoint=False)
        if runner.applied != before:  # a checkpoint stores the whole state: only worth it when it changed
            await runner.checkpoint()
        return runner.state, time.perf_counter() - began

    async def base(self, against: str) -> EvalScore:
        """The base eval from the scoreboard; ``EvalError`` when it is not there or shares no task with this one."""
        runner: ProjectionRunner[dict[str, EvalScore]] = ProjectionRunner(self.log, EvalScores())
        await runner.load()
        await runner.catch_up()
        score = runner.state.get(against)
        if score is None or score.suite is None:
            raise EvalError(f"--against {against!r}: no scored eval run of that id on the scoreboard "
                            f"(eval_scores knows {len(runner.state)} eval run(s))")
        if not {p.name for p in self.planned} & set(score.tasks):
            raise EvalError(f"--against {against!r}: that eval scored none of this eval's suite tasks")
        return score

    # --- the two modes ------------------------------------------------------------------------

    async def full(self, run_id: str, play: PlaySettings, *, against: str = "",
                   progress: Progress | None = None) -> EvalOutcome:
        """Play the suite under ``run_id``, run its smoke tasks, judge, score and record."""
        base = await self.base(against) if against else None
        groups = self._groups()
        try:
            return await self._play(run_id, play, groups, base, progress)
        finally:
            for benches, _ in groups:
                for bench in benches:
                    bench.close()

    async def _play(self, run_id: str, play: PlaySettings, groups: list[tuple[list[Benchmark], list[str]]],
                    base: EvalScore | None, progress: Progress | None) -> EvalOutcome:
        settings = RolloutSettings(attempts=play.attempts or self.suite.attempts, concurrency=play.concurrency,
                                   max_steps=play.max_steps or self.suite.max_steps, seed=play.seed,
                                   timeout_s=play.timeout_s)
        rollouts = [self._rollout(benches, play, settings) for benches, _ in groups]
        config = {"model": scrub(play.model), "attempts": settings.attempts, "max_steps": settings.max_steps,
                  "seed": play.seed, "concurrency": play.concurrency,
                  "harness": play.harness[1] if play.harness else "starter",
                  **({"families": {f: source for f, (_, source) in sorted(play.families.items())}}
                     if play.families else {})}
        await self._start(run_id, "full", config)
        try:
            began = time.perf_counter()
            for round_, (rollout, (_, ids)) in enumerate(zip(rollouts, groups, strict=True)):
                await rollout.run_round(run_id, round_, ids, progress=progress)
            # the smoke reads the log as it stands before this eval's verdicts: one result per smoke task id
            smoked = [(await memory_smoke(self.conn)).output(run_id, 0, task, 0)
                      for task in dict.fromkeys(p.task for p in self.planned if p.task.startswith(SMOKE_PREFIX))]
            played = time.perf_counter() - began
            outputs, catch_up = await self.outputs()
            mine = [o for o in outputs.values() if o.run == run_id and o.finished]
            outcome = await self._score(run_id, "full", mine + smoked, (run_id,), config, base, rounds=len(groups))
        except BaseException as exc:
            await self._failed(run_id, exc)
            raise
        outcome.timings.update(play=played, catch_up=catch_up)
        return outcome

    async def fast(self, run_id: str, runs: Sequence[str] = (), *, against: str = "") -> EvalOutcome:
        """Judge attempts already on the log (of ``runs``, default every run that played a suite task id)."""
        base = await self.base(against) if against else None
        outputs, catch_up = await self.outputs()
        ids = {p.task for p in self.planned}
        chosen = [o for o in outputs.values() if o.finished and o.task in ids and (o.run in runs if runs else True)]
        found = {o.run for o in chosen}
        missing = [r for r in runs if r not in found]
        if missing:
            raise EvalError(f"--runs: run {missing[0]!r} has no finished attempt of a task of suite "
                            f"{self.suite.name!r} on the log")
        if not chosen:
            raise EvalError(f"--fast: no finished attempt of a task of suite {self.suite.name!r} is on the log; "
                            "play some (hx eval, hx run) or pass --runs")
        judged = tuple(sorted(found))
        config: dict[str, Any] = {"runs": list(judged)}
        await self._start(run_id, "fast", config)
        try:
            outcome = await self._score(run_id, "fast", chosen, judged, config, base, rounds=0)
        except BaseException as exc:
            await self._failed(run_id, exc)
            raise
        outcome.timings["catch_up"] = catch_up
        return outcome

    # --- playing ------------------------------------------------------------------------------

    def _groups(self) -> list[tuple[list[Benchmark], list[str]]]:
        """The playable tasks, one group per benchmark family (one round each), each task id once."""
        benches: dict[str, Benchmark] = {}
        families: dict[str, tuple[list[Benchmark], list[str]]] = {}
        try:
            for p in self.planned:
                if p.task.startswith(SMOKE_PREFIX):
                    continue
                name = TaskId.parse(p.task).benchmark
                bench = benches.get(name)
                if bench is None:
                    bench = benches[name] = free_benchmark(self.suite) if p.suite_task.free else benchmark(name)
                group = families.setdefault(bench.family, ([], []))
                if bench not in group[0]:
                    group[0].append(bench)
                if p.task not in group[1]:
                    group[1].append(p.task)
        except BaseException:
            for bench in benches.values():
                bench.close()
            raise
        return list(families.values())

    def _rollout(self, benches: list[Benchmark], play: PlaySettings, settings: RolloutSettings) -> Rollout:
        family = benches[0].family
        harness, source = play.families.get(family) or play.harness or (starter_harness(family), f"starter:{family}")
        return Rollout(benches, ModelConfig(main=play.model), harness, log=self.log, settings=settings,
                       harness_source=source)

    # --- judging, scoring, recording ----------------------------------------------------------

    async def _score(self, run_id: str, mode: EvalMode, outputs: Sequence[AttemptOutput], judged: tuple[str, ...],
                     config: Mapping[str, Any], base: EvalScore | None, *, rounds: int) -> EvalOutcome:
        """Judge ``outputs``, score them, compare with ``base``; append verdicts, scores and ``RunFinished``."""
        began = time.perf_counter()
        verdicts, outcomes = judge_all(run_id, self.planned, outputs)
        if not outcomes:
            raise EvalError(f"eval {run_id}: no attempt of a task of suite {self.suite.name!r} to judge")
        tasks = [task_scored(run_id, o, self.weights, seed=self.seed) for o in outcomes]
        scores = suite_scores(tasks, seed=self.seed)
        comparison = None
        if base is not None and {t.suite_task for t in tasks} & set(base.tasks):
            comparison = compare(base.tasks, {t.suite_task: t for t in tasks}, seed=self.seed)
        suite = SuiteScored(
            run_id=run_id, suite=self.suite.name, suite_digest=suite_digest(self.suite), mode=mode,
            tasks=scores.tasks, attempts=scores.attempts, success=scores.success, criteria=scores.criteria,
            composite=scores.composite, judged_runs=judged, against=base.run if base else "",
            difference=comparison.difference if comparison else None,
            verdict=comparison.verdict if comparison else "", flipped=comparison.flipped if comparison else (),
            config=public(dict(config)))
        judged_s = time.perf_counter() - began
        began = time.perf_counter()
        round_subject = trace_subject(run_id, 0)
        await self.log.append_batch([Entry(round_subject, v, f"{run_id}/verdict/{i}") for i, v in enumerate(verdicts)],
                                    frame_size=VERDICTS_PER_FRAME)
        await self.log.append_batch([Entry(round_subject, t, f"{run_id}/task/{t.suite_task}") for t in tasks])
        run_subject = trace_subject(run_id)
        await self.log.append(run_subject, suite, key=f"{run_id}/suite")
        await self.log.append(run_subject, RunFinished(run_id=run_id, rounds=rounds), key=f"{run_id}/finished")
        return EvalOutcome(run_id, suite, tuple(tasks), len(verdicts), comparison, base.suite if base else None,
                           {"judge": judged_s, "write": time.perf_counter() - began})

    async def _start(self, run_id: str, mode: EvalMode, config: Mapping[str, Any]) -> None:
        """Claim the eval run: its ``RunStarted`` goes on only while its subject is empty."""
        check_run_id(run_id)
        settings = {"suite": self.suite.name, "suite_digest": suite_digest(self.suite), "mode": mode,
                    "tasks": [p.name for p in self.planned], "score_seed": self.seed, **config}
        event = RunStarted(run_id=run_id, kind="eval", config=public(settings), seed=self.seed)
        try:
            # a key of this claim's own: the log takes a resend of this very append as stored, and refuses any other
            await self.log.append(trace_subject(run_id), event, key=f"{run_id}/started@{uuid.uuid4().hex[:12]}",
                                  expected_last_seq=0)
        except ConcurrencyConflict:
            raise EvalError(f"run {run_id!r} is already on the log; use another run id") from None

    async def _failed(self, run_id: str, exc: BaseException) -> None:
        cancelled = isinstance(exc, asyncio.CancelledError | KeyboardInterrupt)
        status: Literal["failed", "cancelled"] = "cancelled" if cancelled else "failed"
        with contextlib.suppress(Exception):  # best effort: the log itself may be what failed
            await asyncio.shield(self.log.append(trace_subject(run_id), RunFinished(
                run_id=run_id, status=status, reason=scrub(f"{type(exc).__name__}: {exc}")), key=f"{run_id}/finished"))
