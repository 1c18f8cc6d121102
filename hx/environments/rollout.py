"""Rollouts: a harness on a task set, k attempts per task at a given concurrency, every attempt on the log.

A round writes ``RoundStarted`` (harness digest, task ids, attempts, split role), runs
each attempt through the run loop on ``hx.trace.<run>.<round>.<task>.<attempt>`` with a
fresh task from the benchmark, then ``RoundFinished``; a run brackets its rounds with
``RunStarted`` (its settings, secrets excluded) and ``RunFinished``. The round's report
is folded back from the log through the ``TaskHistory`` projection and cross-checked
against the attempts' own results, so the numbers printed are the log's numbers.

Splits are kept apart (``hx.environments.splits``): a round runs the tasks of one role only, and
the held-out split is run only through ``hx.environments.heldout.evaluate_heldout``, which hands
back aggregate scores and no per-task detail.

>>> attempt_seed(0, "mybench:game:dev:0", 1) == attempt_seed(0, "mybench:game:dev:0", 1)
True
>>> attempt_seed(0, "mybench:game:dev:0", 1) != attempt_seed(0, "mybench:game:dev:0", 0)
True
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from hx.environments.errors import BenchmarkError, ReportMismatch, RolloutError, RunExists
from hx.environments.registry import Benchmark, TaskId
from hx.environments.results import AttemptOutcome, RolloutReport, summarise
from hx.environments.splits import ROLES, SplitRole, Splits
from hx.harness.config import HarnessConfig
from hx.runtime.cancel import cancel_all
from hx.runtime.loop import AttemptResult, RunLoop
from hx.runtime.models import ModelConfig
from hx.runtime.providers.resources import ProviderResources
from hx.runtime.task import Task, Tool
from hx.runtime.tracer import TraceWriter
from projections.runner import ProjectionRunner
from projections.task_history import TaskHistory, TaskRound
from schemas.event import Event
from schemas.lifecycle import AttemptFinished, AttemptMark, RoundFinished, RoundStarted, RunFinished, RunStarted
from schemas.messages import TaskSpec, summed
from schemas.tools import VerifierScore
from streams.errors import ConcurrencyConflict
from streams.log import EventLog
from streams.redaction import public, scrub
from streams.topology import TRACE, check_run_id, trace_filter, trace_subject

Progress = Callable[[AttemptResult], None]
"""Called once per finished attempt, in completion order."""


# --- settings and seeds ---------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutSettings:
    """How a round runs its attempts."""

    attempts: int = 2
    """Attempts per task (k of pass@k is at most this)."""
    concurrency: int = 4
    """Attempts in flight at once."""
    max_steps: int = 100
    """The step cap of every attempt."""
    seed: int = 0
    """The run seed; each attempt's agent seed derives from it (``attempt_seed``)."""
    timeout_s: float | None = None
    """Wall-clock limit of one attempt (an infrastructure failure when exceeded)."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.concurrency < 1 or self.max_steps < 1:
            raise RolloutError("attempts, concurrency and max_steps must each be at least 1")


def attempt_seed(seed: int, task_id: str, attempt: int) -> int:
    """The agent seed of one attempt: stable across runs, different across attempts and tasks.

    The episode itself is seeded by the task id; this seeds the agent (``random:`` draws
    from it), so attempts of a task explore differently yet replay the same in any run.
    """
    digest = hashlib.sha256(f"{seed}\x1f{task_id}\x1f{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


# --- a task that could not be built ---------------------------------------------------------


class _UnbuiltTask(Task):
    """Stands in for a task the benchmark failed to build, so the failure is an attempt on the log."""

    def __init__(self, task_id: str, error: BaseException) -> None:
        self.spec = TaskSpec(id=task_id, instruction="")
        self.error = error

    def tools(self) -> Sequence[Tool]:
        """None."""
        return ()

    async def reset(self) -> str:
        """Raise what building the task raised: the run loop records an infrastructure failure."""
        raise RolloutError(f"the benchmark could not build task {self.spec.id!r}: "
                           f"{type(self.error).__name__}: {self.error}")

    async def verify(self, final_answer: str) -> VerifierScore:
        """Never reached."""
        return VerifierScore(verifier="none", passed=False)


# --- the service ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundLabel:
    """What a round is for, as ``RoundStarted`` records it (evolution runs label their rounds)."""

    purpose: str = "main"
    variant: str = ""
    candidate: str = ""
    stage_round: int = -1
    first_attempt: int = 0


@dataclass(frozen=True)
class PlayedRound:
    """What a round produced: the report (from the log) and each attempt's own result."""

    report: RolloutReport
    results: tuple[AttemptResult, ...] = field(default=())

    @property
    def infra_failure(self) -> str:
        """Why the round failed as a whole when every attempt failed for infrastructure reasons, else ``""``.

        The reason names the most frequent attempt reason (credentials masked) and how many shared it.
        """
        if not self.results or any(r.status != "infra_failure" for r in self.results):
            return ""
        reasons = Counter(r.reason for r in self.results)
        reason, count = reasons.most_common(1)[0]
        return scrub(f"all {len(self.results)} attempts failed for infrastructure reasons; {count} of them: {reason}")


OUTCOMES_MAX = 10_000
"""Attempt verdicts a ``RoundFinished`` records at most (~44 bytes each: well under the server's 1 MiB message
limit); a larger round records none, and its readers read its ``attempt.finished`` events instead."""


def _key(subject: str, event: Event) -> str:
    return f"{subject}#{type(event).TYPE}"


class Rollout:
    """Runs rounds of attempts of one harness and model on benchmark tasks, everything on the log.

    ``writer`` replaces where attempts' events go (a ``NullWriter`` measures the loop
    alone); then the report comes from the attempts' results instead of the log.
    """

    def __init__(self, benchmarks: Benchmark | Iterable[Benchmark], models: ModelConfig, harness: HarnessConfig, *,
                 log: EventLog, settings: RolloutSettings | None = None, writer: TraceWriter | None = None,
                 splits: Splits | None = None, harness_source: str = "",
                 resources: ProviderResources | None = None) -> None:
        benches = [benchmarks] if isinstance(benchmarks, Benchmark) else list(benchmarks)
        self.benchmarks: dict[str, Benchmark] = {b.name: b for b in benches}
        self.models = models
        self.harness = harness.validate()
        self.harness_source = harness_source or "inline"
        self.log = log
        self.settings = settings or RolloutSettings()
        self.writer = writer
        self.splits = splits
        self.loop = RunLoop(models, self.harness, log=log, writer=writer, resources=resources)
        self.resources = self.loop.resources
        """Lent to the providers of every attempt (a co-evolution's policy store)."""

    # --- run brackets -----------------------------------------------------------------------

    def run_config(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The settings ``RunStarted`` records, secrets excluded."""
        s = self.settings
        config: dict[str, Any] = {
            "benchmarks": sorted(self.benchmarks), "model": msgspec.to_builtins(self.models),
            "harness": self.harness_source, "harness_digest": self.harness.digest,
            # the whole harness, so a replay never depends on a file that may have changed since
            "harness_config": self.harness.to_dict(), "attempts": s.attempts,
            "concurrency": s.concurrency, "max_steps": s.max_steps, "seed": s.seed, "timeout_s": s.timeout_s,
        }
        if self.splits is not None:
            config["splits"] = {"adaptation": len(self.splits.adaptation), "heldout": len(self.splits.heldout),
                                "heldout_digest": self.splits.heldout_digest}
        config.update(extra or {})
        result: dict[str, Any] = public(config)
        return result

    async def _claim(self, subject: str, event: Event, taken: str) -> None:
        """Append the first event of ``subject`` only while the subject is empty: of several claimants, one wins.

        The server checks and appends in one step (an expected last subject sequence of 0).
        Each claim has a message id of its own: the log recognises a resend of this very
        append (after a lost ack) as stored, and refuses every other claim, a second one of
        this rollout included.
        """
        try:
            await self.log.append(subject, event, key=f"{_key(subject, event)}@{uuid.uuid4().hex[:12]}",
                                  expected_last_seq=0)
        except ConcurrencyConflict:
            raise RunExists(taken) from None

    async def start(self, run_id: str, *, kind: str = "rollout", extra: Mapping[str, Any] | None = None) -> None:
        """Claim the run: append ``RunStarted`` unless the run id is already on the log (``RunExists``)."""
        check_run_id(run_id)
        subject = trace_subject(run_id)
        event = RunStarted(run_id=run_id, kind=kind, config=self.run_config(extra), seed=self.settings.seed)
        await self._claim(subject, event, f"run {run_id!r} is already on the log; use another run id")

    async def finish(self, run_id: str, *, rounds: int, status: Literal["completed", "failed", "cancelled"] =
                     "completed", reason: str = "") -> None:
        """Append ``RunFinished``."""
        subject = trace_subject(run_id)
        event = RunFinished(run_id=run_id, status=status, reason=reason, rounds=rounds)
        await self.log.append(subject, event, key=_key(subject, event))

    # --- a round ----------------------------------------------------------------------------

    def resolve(self, task_ids: Iterable[TaskId | str]) -> list[TaskId]:
        """Parse task ids and check each names a known benchmark and game."""
        out: list[TaskId] = []
        games: dict[str, tuple[str, ...]] = {}
        for value in task_ids:
            tid = value if isinstance(value, TaskId) else TaskId.parse(value)
            bench = self.benchmarks.get(tid.benchmark)
            if bench is None:
                raise BenchmarkError(f"task {str(tid)!r}: benchmark {tid.benchmark!r} is not part of this rollout "
                                     f"({', '.join(sorted(self.benchmarks)) or 'none'})")
            known = games.get(tid.benchmark)
            if known is None:
                known = games[tid.benchmark] = bench.games()
            if tid.game not in known:
                raise BenchmarkError(f"task {str(tid)!r}: {tid.benchmark} has no game {tid.game!r}; "
                                     f"games: {', '.join(known)}")
            out.append(tid)
        if len({str(t) for t in out}) != len(out):
            raise RolloutError("a round lists the same task twice; use more attempts instead")
        return out

    def make_task(self, tid: TaskId) -> Task:
        """A fresh task for one attempt; a benchmark that fails to build it yields an attempt that fails."""
        try:
            return self.benchmarks[tid.benchmark].make_task(tid)
        except Exception as exc:  # noqa: BLE001 - recorded on the log as the attempt's infrastructure failure
            return _UnbuiltTask(str(tid), exc)

    async def run_round(self, run_id: str, round: int, task_ids: Iterable[TaskId | str], *,
                        role: SplitRole = "adaptation", progress: Progress | None = None,
                        label: RoundLabel | None = None) -> PlayedRound:
        """Run every task ``settings.attempts`` times; return the report folded from the log.

        ``label`` says what the round is for in an evolution run (purpose, variant,
        candidate, evolution round) and from which attempt number to count.
        """
        label = label or RoundLabel()
        if role not in ROLES:
            raise RolloutError(f"split role {role!r} is not one of {', '.join(ROLES)}")
        tids = self.resolve(task_ids)
        names = tuple(str(t) for t in tids)
        if self.splits is not None:
            self.splits.check(names, role)
        s = self.settings
        subject = trace_subject(run_id, round)
        started = RoundStarted(run_id=run_id, round=round, harness_digest=self.harness.digest, task_ids=names,
                               split=role, attempts_per_task=s.attempts, purpose=label.purpose,
                               variant=label.variant, candidate=label.candidate, stage_round=label.stage_round,
                               first_attempt=label.first_attempt)
        await self._claim(subject, started,
                          f"round {round} of run {run_id!r} is already on the log; use another round or run id")
        began = time.perf_counter()
        results = await self._attempts(run_id, round, tids, progress, label.first_attempt)
        elapsed = time.perf_counter() - began
        fields: dict[str, Any] = {
            "run_id": run_id, "round": round, "role": role, "model": scrub(self.models.main),
            "harness": self.harness_source, "harness_digest": self.harness.digest, "max_steps": s.max_steps,
            "seed": s.seed, "concurrency": s.concurrency, "steps": sum(r.steps for r in results),
            "events": sum(r.events for r in results), "elapsed_s": round_s(elapsed)}
        mine = [AttemptOutcome(task_id=r.task_id, attempt=r.attempt, passed=r.passed, score=r.score, steps=r.steps,
                               status=r.status, usage=r.usage) for r in results]
        if self.writer is not None:  # the trace went elsewhere: the results are all there is
            await self._finish(subject, run_id, round, mine)
            report = summarise(mine, attempts=s.attempts, task_order=names, source="results", **fields)
            return PlayedRound(report, tuple(results))
        logged = await round_outcomes(self.log, run_id, round)
        cross_check(mine, logged)
        await self._finish(subject, run_id, round, logged)
        report = summarise(logged, attempts=s.attempts, task_order=names, source="log", **fields)
        return PlayedRound(report, tuple(results))

    async def _finish(self, subject: str, run_id: str, round: int, outcomes: Sequence[AttemptOutcome]) -> None:
        """``RoundFinished`` with every attempt's verdict, on the round's own subject (none past ``OUTCOMES_MAX``)."""
        marks = tuple(AttemptMark(task_id=o.task_id, attempt=o.attempt, passed=o.passed, usage=o.usage)
                      for o in sorted(outcomes, key=lambda o: (o.task_id, o.attempt)))
        finished = RoundFinished(run_id=run_id, round=round, attempts=len(marks), passed=sum(m.passed for m in marks),
                                 outcomes=marks if len(marks) <= OUTCOMES_MAX else (),
                                 usage=summed(m.usage for m in marks))
        await self.log.append(subject, finished, key=_key(subject, finished))

    async def _attempts(self, run_id: str, round: int, tids: Sequence[TaskId],
                        progress: Progress | None, first: int = 0) -> list[AttemptResult]:
        s = self.settings
        numbers = range(first, first + s.attempts)
        todo = iter([(tid, a) for tid in tids for a in numbers])
        done: dict[tuple[str, int], AttemptResult] = {}

        async def worker() -> None:
            for tid, attempt in todo:  # one shared iterator: each pair is taken by exactly one worker
                name = str(tid)
                result = await self.loop.run(self.make_task(tid), run_id=run_id, round=round, attempt=attempt,
                                             seed=attempt_seed(s.seed, name, attempt), max_steps=s.max_steps,
                                             timeout_s=s.timeout_s)
                done[(name, attempt)] = result
                if progress is not None:
                    progress(result)

        workers = [asyncio.create_task(worker()) for _ in range(min(s.concurrency, len(tids) * s.attempts))]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            await cancel_all(workers)
            raise
        return [done[(str(tid), a)] for tid in tids for a in numbers]

    async def rollout(self, run_id: str, task_ids: Iterable[TaskId | str], *, round: int = 0,
                      role: SplitRole = "adaptation", progress: Progress | None = None, kind: str = "rollout",
                      extra: Mapping[str, Any] | None = None) -> PlayedRound:
        """One run of one round: ``start``, ``run_round``, ``finish`` (a failed or cancelled run says so)."""
        await self.start(run_id, kind=kind, extra=extra)
        try:
            outcome = await self.run_round(run_id, round, task_ids, role=role, progress=progress)
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError | KeyboardInterrupt)
            reason = f"cancelled ({exc})" if cancelled and str(exc) else "cancelled" if cancelled else (
                f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):  # best effort: the log itself may be what failed
                await asyncio.shield(self.finish(run_id, rounds=0, status="cancelled" if cancelled else "failed",
                                                 reason=scrub(reason)))
            raise
        infra = outcome.infra_failure
        await self.finish(run_id, rounds=1, status="failed" if infra else "completed", reason=infra)
        return outcome


def round_s(seconds: float) -> float:
    """Seconds rounded to milliseconds (reports carry no false precision)."""
    return round(seconds, 3)


# --- reading rounds back --------------------------------------------------------------------


async def round_outcomes(log: EventLog, run_id: str, round: int) -> list[AttemptOutcome]:
    """Every attempt verdict of one round, folded from the log through ``TaskHistory``.

    Pass state comes from the projection (a repeated verdict replaces the earlier one);
    status, scores and steps from the same ``AttemptFinished`` events (the last of each).
    """
    runner: ProjectionRunner[dict[str, TaskRound]] = ProjectionRunner(log, TaskHistory())
    finished: dict[tuple[str, int], AttemptFinished] = {}
    async for record in log.read(TRACE.name, subjects=[trace_filter(run_id, round)], types=[AttemptFinished.TYPE]):
        runner.apply(record)
        event = record.event
        if isinstance(event, AttemptFinished):
            finished[(event.task_id, event.attempt)] = event
    out: list[AttemptOutcome] = []
    for tr in TaskHistory.rounds_of(runner.state, run_id, round):
        for attempt, passed in tr.attempts.items():
            ev = finished[(tr.task, int(attempt))]
            out.append(AttemptOutcome(task_id=tr.task, attempt=int(attempt), passed=passed, score=ev.score,
                                      steps=ev.steps, status=ev.status, usage=ev.usage))
    return out


def cross_check(results: Sequence[AttemptOutcome], logged: Sequence[AttemptOutcome]) -> None:
    """Raise ``ReportMismatch`` unless the log holds exactly the attempts' verdicts."""
    mine = {(o.task_id, o.attempt): (o.passed, o.infra_failure) for o in results}
    theirs = {(o.task_id, o.attempt): (o.passed, o.infra_failure) for o in logged}
    if mine != theirs:
        missing = sorted(set(mine) - set(theirs))
        differ = sorted(k for k in set(mine) & set(theirs) if mine[k] != theirs[k])
        extra = sorted(set(theirs) - set(mine))
        raise ReportMismatch(f"the log disagrees with the attempts: {len(missing)} missing, {len(differ)} "
                             f"different, {len(extra)} unexpected verdict(s); first: "
                             f"{(missing or differ or extra)[0]}")
