"""A logged round read back: the run's and round's start, and each attempt's resolved records as its end is read.

``round_header`` reads two small subjects (the run's and the round's level);
``logged_attempts`` streams the round's attempt subjects once, in log order, and hands
over each attempt when the read reaches its ``attempt.finished``, so a reader of a round
of thousands of attempts holds only those the run had in flight at once. A message this
hx cannot decode (another schema version) makes the read fail with the reason: a replay
or a fork against part of the log would prove nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from hx.environments.splits import round_roles
from hx.replay.errors import NotOnLog, ReplayError
from projections.ledger import RunLedger
from schemas.envelope import Record
from schemas.errors import HistoryGap
from schemas.history import resolve_async
from schemas.job import nested_job
from schemas.lifecycle import AttemptFinished, AttemptStarted, RoundStarted, RunStarted
from schemas.model import ModelResponse
from streams.log import EventLog
from streams.topology import TRACE, TraceAddress, trace_filter, trace_subject

DEFAULT_MAX_STEPS = 100
"""The step cap when the run recorded none (``RolloutSettings``'s default)."""


# --- trace rounds and evolution rounds ---------------------------------------------------------

_PURPOSES = {"main": "main rollouts", "gate": "gate rollouts", "heldout": "held-out evaluation",
             "counterfactual": "counterfactual replay", "retry": "retried rollouts",
             "policy_gate": "policy gate rollouts"}


def round_purpose(started: RoundStarted) -> str:
    """What a trace round was, from its ``round.started``: "gate rollouts of candidate C on v0, evolution round 1"."""
    text = _PURPOSES.get(started.purpose, f"{started.purpose or 'main'} rollouts")
    if started.candidate:
        text += f" of candidate {started.candidate}"
    if started.variant:
        text += f" on {started.variant}"
    if started.stage_round >= 0:
        text += f", evolution round {started.stage_round}"
    return text


def describe_round(round: int, started: RoundStarted | None) -> str:
    """A trace round named with what it was ("trace round 11: gate rollouts of ..."), for headers."""
    return f"trace round {round}" + (f": {round_purpose(started)}" if started is not None else "")


async def stage_rounds(log: EventLog, run_id: str, stage: int) -> list[RoundStarted]:
    """The main trace rounds of evolution round ``stage`` (one per variant), in order; ``NotOnLog`` when none.

    Evolution rounds (what ``hx evolve`` prints, what ``regressions``/``diff``/``ledger`` take)
    and trace rounds differ: every gate, held-out or retried batch gets its own trace round.
    """
    rounds = await round_roles(log, run_id)
    main = [ev for _, ev in sorted(rounds.items()) if ev.purpose == "main" and ev.stage_round >= 0]
    found = [ev for ev in main if ev.stage_round == stage]
    if found:
        return found
    if not rounds and not [r async for r in log.read(TRACE.name, subjects=[trace_subject(run_id)])]:
        raise NotOnLog(f"run {run_id!r} is not on the log")
    stages = sorted({ev.stage_round for ev in main})
    raise NotOnLog(f"run {run_id!r} has no main rollouts of evolution round {stage}; "
                   + (f"its evolution rounds: {', '.join(map(str, stages))}" if stages
                      else "it has no evolution rounds (use --round for its trace rounds: "
                           f"{', '.join(str(r) for r in sorted(rounds)) or 'none'})"))


# --- the logged round -----------------------------------------------------------------------


def model_specs(records: Iterable[Record]) -> dict[str, str]:
    """Role -> the model spec the log names for it (main from ``attempt.started``)."""
    roles: dict[str, str] = {}
    for r in records:
        if isinstance(r.event, AttemptStarted) and r.event.model:
            roles.setdefault("main", r.event.model)
        elif isinstance(r.event, ModelResponse):
            roles.setdefault(r.event.role, r.event.model)
    return roles


@dataclass
class LoggedRound:
    """One round as the log holds it: the run's and round's start, and (once read) attempts' resolved records."""

    run_id: str
    round: int
    run: RunStarted | None
    started: RoundStarted
    attempts: dict[tuple[str, int], list[Record]] = field(default_factory=dict)
    """(task, attempt) -> the attempt's records, conversations resolved, in log order (``read_round`` fills it)."""

    @property
    def harness_digest(self) -> str:
        """The digest of the harness the round ran."""
        return self.started.harness_digest

    def setting(self, name: str, ledger: RunLedger | None = None) -> Any:
        """A rollout setting as the run recorded it (``run.started``, else the ledger's opening), or None."""
        if self.run is not None and name in self.run.config:
            return self.run.config[name]
        if ledger is None or ledger.opened is None:
            return None
        job = nested_job(ledger.opened.settings)
        return job["rollout"][name] if name in job["rollout"] else job.get(name)

    def max_steps(self, ledger: RunLedger | None) -> int:
        """The run's step cap."""
        return int(self.setting("max_steps", ledger) or DEFAULT_MAX_STEPS)


async def round_header(log: EventLog, run_id: str, round: int) -> LoggedRound:
    """The run's ``run.started`` and the round's ``round.started`` (two small reads); ``NotOnLog`` when missing."""
    run_subject, round_subject = trace_subject(run_id), trace_subject(run_id, round)
    run: RunStarted | None = None
    started: RoundStarted | None = None
    async for record in log.read(TRACE.name, subjects=[run_subject, round_subject]):
        if isinstance(record.event, RunStarted) and run is None:
            run = record.event
        elif isinstance(record.event, RoundStarted) and started is None:
            started = record.event
    if started is None:
        rounds = await round_roles(log, run_id)
        if not rounds and run is None:
            raise NotOnLog(f"run {run_id!r} is not on the log")
        raise NotOnLog(f"run {run_id!r} has no round {round}; its rounds: "
                       f"{', '.join(str(r) for r in sorted(rounds)) or 'none'}")
    return LoggedRound(run_id, round, run, started)


async def logged_attempts(log: EventLog, header: LoggedRound, *, task: str | None = None,
                          attempt: int | None = None) -> AsyncIterator[tuple[tuple[str, int], list[Record]]]:
    """Each attempt of the round (the task and attempt asked for, when given) as soon as the log holds its end.

    One subject-filtered read in log order; an attempt's records are kept only until its
    ``attempt.finished`` (attempts interleave as they ran, so memory follows the run's
    concurrency, not the round's size). Attempts the log never finished come last.
    """
    run_id, round = header.run_id, header.round
    pending: dict[str, list[Record]] = {}
    keys: dict[str, tuple[str, int]] = {}
    seen = 0
    skipped = log.quarantine.count

    def undecodable() -> None:
        if log.quarantine.count > skipped:
            bad = log.quarantine.records[-1]
            raise ReplayError(f"round {round} of run {run_id!r} holds messages this hx cannot decode (e.g. seq "
                              f"{bad.seq}, {bad.type or 'no type'}: {bad.reason}); a replay would compare against "
                              "part of the log")

    def whole(subject: str, records: list[Record]) -> tuple[tuple[str, int], list[Record]]:
        undecodable()
        if not isinstance(records[0].event, AttemptStarted):
            task_id, number = keys[subject]
            raise ReplayError(f"attempt {number} of task {task_id!r} in round {round} of run {run_id!r} does not "
                              "start with attempt.started on the log: it cannot be replayed")
        return keys[subject], records

    records = log.read(TRACE.name, subjects=[trace_filter(run_id, round, task, attempt)])
    try:
        async for record in resolve_async(records):
            subject = record.subject
            if subject not in keys:
                address = TraceAddress.parse(subject)
                if address.task is None or address.attempt is None:
                    continue
                keys[subject] = (address.task, address.attempt)
            pending.setdefault(subject, []).append(record)
            if isinstance(record.event, AttemptFinished):
                seen += 1
                yield whole(subject, pending.pop(subject))
    except HistoryGap:
        undecodable()  # a conversation whose base could not be decoded: say why
        raise
    for subject, rest in pending.items():
        seen += 1
        yield whole(subject, rest)
    undecodable()
    if (task is not None or attempt is not None) and not seen:
        raise NotOnLog(f"round {round} of run {run_id!r} has no attempt"
                       + ("" if task is None else f" of task {task!r}")
                       + ("" if attempt is None else f" numbered {attempt}")
                       + "; " + await _what_is_there(log, header, task))


async def _what_is_there(log: EventLog, header: LoggedRound, task: str | None) -> str:
    """The round's tasks (a task not in it) or the attempt numbers it holds (of the task, when given)."""
    tasks = header.started.task_ids
    if task is not None and tasks and task not in tasks:
        return f"its tasks: {', '.join(tasks[:5])}{' ...' if len(tasks) > 5 else ''}"
    # the attempt subjects from the stream's subject index: no message is read
    pattern = trace_filter(header.run_id, header.round, task, None)
    info = await log.js.stream_info(TRACE.name, subjects_filter=pattern)
    numbers: set[int] = set()
    for subject in info.state.subjects or {}:
        try:
            address = TraceAddress.parse(subject)
        except ValueError:
            continue
        if address.attempt is not None and (task is None or address.task == task):
            numbers.add(address.attempt)
    of = "" if task is None else f" of task {task!r}"
    return f"its attempts{of}: {', '.join(map(str, sorted(numbers))) or 'none'}"


async def read_round(log: EventLog, run_id: str, round: int, *, task: str | None = None,
                     attempt: int | None = None) -> LoggedRound:
    """The logged round with its attempts in memory (only the task and attempt asked for, when given)."""
    header = await round_header(log, run_id, round)
    async for key, records in logged_attempts(log, header, task=task, attempt=attempt):
        header.attempts[key] = records
    return header
