"""Fork: a logged attempt replayed up to a step, then continued live under another harness or model.

``fork_attempt`` runs the attempt again in the real environment, under a new run id (the
fork's): up to step S the model's answers (every role) and the nondeterministic tools'
results come from the log, so the environment is driven to exactly the state it was in;
from step S+1 on the live model (``--model``, default the logged one) answers, under the
given harness (default the round's). The fork is on the log like any run, with its
provenance in its ``run.started`` (``kind: fork``, ``config.fork``: source run, round,
task, attempt, step, the harness digests and the model), so "what if this harness had
been used from here" is itself a replayable, auditable record.

The fork's model is called through the ``fork:`` provider (``fork:SPEC`` answers from
the log up to the step, then as ``SPEC``), which the events name; comparisons with the
original map it back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from hx.environments.splits import round_roles
from hx.harness.config import HarnessConfig
from hx.replay.compare import Aliases, Divergence, compare_attempt
from hx.replay.errors import NotOnLog, ReplayError
from hx.replay.logged import LoggedRound, model_specs, read_round
from hx.replay.recorded import FedTask, Recording
from hx.replay.replayer import close_benchmarks, live_task, open_benchmarks, round_harness, run_ledger
from hx.runtime.loop import AttemptResult, RunLoop
from hx.runtime.models import ModelConfig, restore_spec
from hx.runtime.providers.base import CallContext, Completion, Provider, make_provider
from hx.runtime.providers.replay import ReplayProvider
from hx.runtime.task import Task
from schemas.history import resolve
from schemas.lifecycle import AttemptFinished, RoundFinished, RoundStarted, RunFinished, RunStarted
from schemas.messages import Message, ToolSchema
from streams.connection import Connection
from streams.errors import ConcurrencyConflict
from streams.redaction import scrub
from streams.topology import TRACE, check_run_id, trace_subject


class ForkProvider(Provider):
    """``fork:SPEC``: the logged responses of ``source_run`` up to ``until_step``, then the model ``SPEC``.

    Options: ``source_run`` (required), ``source_round``, ``until_step`` (required),
    ``seed`` (the live model's seed instead of the attempt's), ``live_options`` (the
    live provider's options).
    """

    scheme = "fork"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.until_step = int(self.options["until_step"])
        seed = self.options.get("seed")
        self.seed: int | None = None if seed is None else int(seed)
        recorded = {k: self.options[k] for k in ("source_run", "source_round") if k in self.options}
        self.recorded = ReplayProvider("", log=self.log, options=recorded)
        self.live = make_provider(model, log=self.log, options=self.options.get("live_options") or {},
                                  resources=self.resources)

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """The logged response while ``ctx.step`` is at most ``until_step``, else the live model's."""
        if ctx.step <= self.until_step:
            return await self.recorded.complete(messages, tools, params, ctx)
        if self.seed is not None:
            ctx = msgspec.structs.replace(ctx, seed=self.seed)
        return await self.live.complete(messages, tools, params, ctx)

    async def aclose(self) -> None:
        """Close both providers."""
        await self.recorded.aclose()
        await self.live.aclose()


def fork_spec(spec: str) -> str:
    """The spec a fork calls for a live model spec."""
    return f"fork:{spec}"


@dataclass(frozen=True)
class ForkReport:
    """A fork and the attempt it came from."""

    fork_id: str
    source_run: str
    round: int
    task: str
    attempt: int
    step: int
    harness_digest: str
    model: str
    """The live model's spec as shown (credentials masked)."""
    result: AttemptResult
    original: AttemptFinished | None
    departure: Divergence | None
    """Where the fork's events first differ from the original's (None: identical to the end)."""


async def attempt_round(conn: Connection, run_id: str, task: str, attempt: int) -> int:
    """The one round of the run that ran ``attempt`` of ``task``; ``NotOnLog`` or a request for ``--round``."""
    rounds = await round_roles(conn.log, run_id)
    if not rounds:
        raise NotOnLog(f"run {run_id!r} is not on the log")
    holding = sorted(r for r, ev in rounds.items() if task in ev.task_ids
                     and ev.first_attempt <= attempt < ev.first_attempt + ev.attempts_per_task)
    if not holding:
        raise NotOnLog(f"no round of run {run_id!r} ran attempt {attempt} of task {task!r}")
    if len(holding) > 1:
        raise ReplayError(f"attempt {attempt} of task {task!r} is in rounds {', '.join(map(str, holding))} of run "
                          f"{run_id!r}; pass --round")
    return holding[0]


def _live_options(run: RunStarted | None, spec: str) -> dict[str, Any]:
    """The provider options the source run recorded for ``spec`` (none when it recorded no model config)."""
    model = run.config.get("model") if run is not None else None
    if isinstance(model, dict):
        options = model.get("provider_options", {}).get(spec)
        if isinstance(options, dict):
            return dict(options)
    return {}


async def fork_attempt(conn: Connection, run_id: str, task: str, attempt: int, step: int, *,
                       round: int | None = None, harness: HarnessConfig | None = None, model: str | None = None,
                       seed: int | None = None, fork_id: str | None = None,
                       plugin_dir: Path | None = None) -> ForkReport:
    """Replay ``attempt`` of ``task`` up to ``step`` from the log, then go on live; the fork is on the log."""
    if round is None:
        round = await attempt_round(conn, run_id, task, attempt)
    logged = await read_round(conn.log, run_id, round, task=task, attempt=attempt)
    records = logged.attempts[(task, attempt)]
    recording = Recording.of(records)
    if not 0 <= step <= recording.steps:
        raise ReplayError(f"attempt {attempt} of task {task!r} in round {round} of run {run_id!r} has "
                          f"{recording.steps} steps; --step must be 0 to {recording.steps}")
    ledger = await run_ledger(conn, run_id, plugin_dir)
    config = harness or (await round_harness(conn, logged, ledger, plugin_dir))[0]
    specs = model_specs(records)
    original_main = specs.get("main", "random:")  # as logged: credentials masked
    live = model if model is not None else restore_spec(
        original_main, None, option="--model", what=f"attempt {attempt} of task {task!r} in run {run_id!r}")
    shown = scrub(live)
    fork_id = check_run_id(fork_id or f"{run_id}-fork-{uuid.uuid4().hex[:6]}")
    options: dict[str, Any] = {"source_run": run_id, "source_round": round, "until_step": step,
                               "live_options": _live_options(logged.run, shown)}
    if seed is not None:
        options["seed"] = seed
    roles = {r: fork_spec(s) for r, s in specs.items() if r != "main"}
    models = ModelConfig(main=fork_spec(live), roles=roles, retries=0,
                         provider_options={s: options for s in {fork_spec(live), *roles.values()}})
    max_steps = logged.max_steps(ledger)
    provenance = {"source_run": run_id, "source_round": round, "task": task, "attempt": attempt, "step": step,
                  "harness_digest": config.digest, "source_harness_digest": logged.harness_digest,
                  "model": shown, "source_model": original_main, "seed": seed}
    started = RunStarted(run_id=fork_id, kind="fork", seed=recording.started.seed, config={
        "fork": provenance, "max_steps": max_steps, "harness": "fork", "harness_digest": config.digest,
        "harness_config": config.to_dict(), "model": {"main": shown}})
    loop = RunLoop(models, config.validate(), log=conn.log)
    benches = open_benchmarks([task])
    try:
        job = FedTask(live_task(benches, task), recording.nondeterministic(until_step=step))  # before any write
        result = await _run(conn, fork_id, logged, started, loop, job, attempt, recording.started.seed, max_steps)
    finally:
        close_benchmarks(benches)
    subject = trace_subject(fork_id, round, task, attempt)
    forked = [r.event for r in resolve([r async for r in conn.log.read(TRACE.name, subjects=[subject])])]
    aliases = Aliases(models={**{fork_spec(s): s for s in specs.values()}, scrub(fork_spec(live)): original_main},
                      run_ids={fork_id: run_id}, digests={config.digest: logged.harness_digest})
    departure = compare_attempt(trace_subject(run_id, round, task, attempt), records, forked, aliases)
    return ForkReport(fork_id=fork_id, source_run=run_id, round=round, task=task, attempt=attempt, step=step,
                      harness_digest=config.digest, model=shown, result=result, original=recording.finished,
                      departure=departure)


async def _run(conn: Connection, fork_id: str, logged: LoggedRound, started: RunStarted, loop: RunLoop, job: Task,
               attempt: int, seed: int, max_steps: int) -> AttemptResult:
    """The fork as a run of one round of one attempt on the log: claimed, run, finished."""
    await _claim(conn, fork_id, started)
    round, task = logged.round, job.spec.id
    round_subject = trace_subject(fork_id, round)
    await conn.log.append(round_subject, RoundStarted(
        run_id=fork_id, round=round, harness_digest=loop.harness.digest, task_ids=(task,),
        split=logged.started.split, attempts_per_task=1, purpose="fork", first_attempt=attempt),
        key=f"{round_subject}#round.started")
    result = await loop.run(job, run_id=fork_id, round=round, attempt=attempt, seed=seed, max_steps=max_steps)
    finished = RoundFinished(run_id=fork_id, round=round, attempts=1, passed=int(result.passed))
    await conn.log.append(round_subject, finished, key=f"{round_subject}#round.finished")
    run_subject = trace_subject(fork_id)
    await conn.log.append(run_subject, RunFinished(run_id=fork_id, status="completed", rounds=1),
                          key=f"{run_subject}#run.finished")
    return result


async def _claim(conn: Connection, fork_id: str, started: RunStarted) -> None:
    """Append the fork's ``run.started`` only while its run id is unused."""
    subject = trace_subject(fork_id)
    try:
        await conn.log.append(subject, started, key=f"{subject}#run.started", expected_last_seq=0)
    except ConcurrencyConflict:
        raise ReplayError(f"run {fork_id!r} is already on the log; use another --fork-id") from None
