"""One attempt as a readable transcript: per step what the agent observed, chose, got back, and what processors did.

``locate`` finds which rounds and attempts of a task are on the log from the stream's subject
index alone (no message is read); ``read_transcript`` then reads only the attempt's own
subject, resolves its conversations from their deltas (``schemas.history``) and folds the
records into a ``Transcript`` with ``build``. A run, task, round or attempt that is not on
the log is a ``NotOnLog`` naming what is there.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from nats.js import JetStreamContext

from hx.replay.errors import NotOnLog
from hx.replay.logged import stage_rounds
from schemas.envelope import Record
from schemas.history import resolve_async
from schemas.hooks import AfterModel, AfterTool, BeforeModel, BeforeTool, HookRecord, ProcessorTriggered, TaskStart
from schemas.lifecycle import AttemptFinished, AttemptStarted, RoundStarted
from schemas.messages import Message, ToolCall, ToolResult, Usage
from schemas.model import ModelError, ModelResponse
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned, VerifierScore
from streams.log import EventLog
from streams.topology import NO_TOKEN, TRACE, TraceAddress, trace_filter, trace_subject

_SHOWN = 12
"""How many names an error lists before saying how many more there are."""


class Trigger(msgspec.Struct, frozen=True):
    """A processor that changed, split, intercepted or interrupted a hook event."""

    processor: str
    hook: str
    action: str
    fields: tuple[str, ...] = ()
    reason: str = ""


class ToolStep(msgspec.Struct):
    """One tool call of a step: the call as executed, the tool's result, and what the harness passed on."""

    call: ToolCall
    approved: bool = True
    result: ToolResult | None = None
    """What the tool returned."""
    passed_on: ToolResult | None = None
    """The result after the after_tool processors, when they changed it."""
    took_ms: float = 0.0
    """How long the tool took (0: not recorded)."""


class Choice(msgspec.Struct):
    """What the model answered at a step, and what the harness let through."""

    model: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str = ""
    usage: Usage = Usage()
    passed_on: AfterModel | None = None
    """The answer after the after_model processors, when they changed it."""
    took_ms: float = 0.0
    """How long the model call took (0: not recorded)."""


class Step(msgspec.Struct):
    """One step: observation, model choice, tool results, processor triggers."""

    number: int
    at_ms: float = 0.0
    """When the step began, in milliseconds since the attempt started."""
    observation: list[Message] = []
    """Messages the model saw for the first time at this step (after the before_model processors)."""
    environment: list[EnvObservation] = []
    choice: Choice | None = None
    errors: list[ModelError] = []
    tools: list[ToolStep] = []
    triggers: list[Trigger] = []


class Transcript(msgspec.Struct):
    """One attempt, step by step, with its start and verdict."""

    run: str
    round: int
    task: str
    attempt: int
    rounds: tuple[int, ...] = ()
    """Every round in which the task was attempted."""
    attempts: tuple[int, ...] = ()
    """Every attempt of the task in this round."""
    started: RoundStarted | None = None
    """The trace round's ``round.started``: what it was (purpose, variant, candidate, evolution round)."""
    harness_digest: str = ""
    model: str = ""
    instruction: str = ""
    system_prompt: str = ""
    setup: list[Trigger] = []
    """Processor triggers at task_start and task_end (step 0)."""
    steps: list[Step] = []
    verdict: VerifierScore | None = None
    finished: AttemptFinished | None = None
    events: int = 0
    started_ns: int = 0
    """When the attempt started (wall clock, ns)."""
    took_ms: float = 0.0
    """How long the attempt took, start to finish (0: still running)."""


# --- where attempts are --------------------------------------------------------------------


async def _subjects(js: JetStreamContext, pattern: str) -> list[TraceAddress]:
    """The trace addresses with messages under ``pattern``, from the stream's subject index (no message read)."""
    info = await js.stream_info(TRACE.name, subjects_filter=pattern)
    out = []
    for subject in (info.state.subjects or {}):
        try:
            out.append(TraceAddress.parse(subject))
        except ValueError:
            continue
    return out


def _listed(values: Iterable[object]) -> str:
    items = [str(v) for v in values]
    more = f" (and {len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


async def locate(log: EventLog, run: str, task: str, round: int | None = None,
                 attempt: int | None = None) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    """(round, attempt, rounds of the task, attempts in that round); defaults: the latest round, its first attempt."""
    found = [a for a in await _subjects(log.js, trace_filter(run, None, task, None))
             if a.run == run and a.task == task and a.round is not None and a.attempt is not None]
    if not found:
        in_run = await _subjects(log.js, trace_filter(run))
        if not in_run:
            # Run-level events are on hx.trace.<run>._._._: one subject per run, cheap to list.
            known = sorted({a.run for a in await _subjects(log.js, f"hx.trace.*.{NO_TOKEN}.{NO_TOKEN}.{NO_TOKEN}")})
            raise NotOnLog(f"no run {run!r} on the log; runs: {_listed(known) or 'none'}")
        tasks = sorted({a.task for a in in_run if a.task is not None})
        raise NotOnLog(f"run {run!r} has no task {task!r}; its tasks: {_listed(tasks) or 'none'}")
    rounds = tuple(sorted({a.round for a in found if a.round is not None}))
    chosen = rounds[-1] if round is None else round
    if chosen not in rounds:
        raise NotOnLog(f"task {task!r} of run {run!r} has no attempt in round {chosen}; "
                       f"rounds with attempts: {_listed(rounds)}")
    attempts = tuple(sorted({a.attempt for a in found if a.round == chosen and a.attempt is not None}))
    number = attempts[0] if attempt is None else attempt
    if number not in attempts:
        raise NotOnLog(f"task {task!r} of run {run!r} has no attempt {number} in round {chosen}; "
                       f"attempts: {_listed(attempts)}")
    return chosen, number, rounds, attempts


async def stage_round(log: EventLog, run: str, task: str, stage: int) -> int:
    """The main trace round of evolution round ``stage`` in which ``task`` was attempted."""
    mains = await stage_rounds(log, run, stage)
    found = [a.round for a in await _subjects(log.js, trace_filter(run, None, task, None))
             if a.run == run and a.task == task and a.round is not None]
    with_task = [s for s in mains if s.round in found]
    if len(with_task) == 1:
        return with_task[0].round
    named = _listed(f"{s.round} ({s.variant or 'main'})" for s in (with_task or mains))
    if not with_task:
        raise NotOnLog(f"task {task!r} of run {run!r} has no attempt in the main rollouts of evolution round "
                       f"{stage} (trace rounds {named})")
    raise NotOnLog(f"task {task!r} was attempted in several main rollouts of evolution round {stage}, "
                   f"one per variant: pass --round with one of trace rounds {named}")


async def read_transcript(log: EventLog, run: str, task: str, round: int | None = None,
                          attempt: int | None = None, *, stage: int | None = None) -> Transcript:
    """The transcript of one attempt, read from its own subject only, conversations resolved.

    ``stage`` picks the main trace round of that evolution round instead of ``round``.
    """
    if stage is not None:
        round = await stage_round(log, run, task, stage)
    chosen, number, rounds, attempts = await locate(log, run, task, round, attempt)
    subject = trace_subject(run, chosen, task, number)
    records = [r async for r in resolve_async(log.read(TRACE.name, subjects=[subject]))]
    transcript = build(records, run, chosen, task, number)
    transcript.rounds, transcript.attempts = rounds, attempts
    # the round's level subject holds little besides its round.started: what the round was
    async for record in log.read(TRACE.name, subjects=[trace_subject(run, chosen)], types=[RoundStarted.TYPE]):
        if isinstance(record.event, RoundStarted) and transcript.started is None:
            transcript.started = record.event
    return transcript


# --- folding an attempt's records ------------------------------------------------------------


def _observation(messages: tuple[Message, ...]) -> list[Message]:
    """The messages after the model's last answer (the whole non-system conversation before its first)."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return [m for m in messages[last + 1:] if m.role != "system"]


def _step(steps: dict[int, Step], number: int) -> Step:
    step = steps.get(number)
    if step is None:
        step = steps[number] = Step(number)
    return step


def build(records: Iterable[Record], run: str, round: int, task: str, attempt: int) -> Transcript:
    """Fold one attempt's records (in log order, conversations resolved) into a transcript."""
    out = Transcript(run, round, task, attempt)
    steps: dict[int, Step] = {}
    emitted_after_model: dict[int, AfterModel] = {}
    for record in records:
        out.events += 1
        event = record.event
        if not out.started_ns:
            out.started_ns = record.time_ns
        step_of = getattr(event, "step", None)
        if isinstance(step_of, int) and step_of > 0 and step_of not in steps:
            _step(steps, step_of).at_ms = (record.time_ns - out.started_ns) / 1e6
        if isinstance(event, AttemptStarted):
            out.harness_digest, out.model = event.harness_digest, event.model
        elif isinstance(event, HookRecord):
            _hook(out, steps, emitted_after_model, event)
        elif isinstance(event, ProcessorTriggered):
            trigger = Trigger(event.processor, event.hook, event.action, event.fields, event.reason)
            (out.setup if event.hook in ("task_start", "task_end") else _step(steps, event.step).triggers).append(
                trigger)
        elif isinstance(event, ModelResponse):
            if event.role == "main" or _step(steps, event.step).choice is None:
                _step(steps, event.step).choice = Choice(event.model_version or event.model, event.content,
                                                         event.tool_calls, event.stop_reason, event.usage,
                                                         took_ms=record.took_ns / 1e6)
        elif isinstance(event, ModelError):
            _step(steps, event.step).errors.append(event)
        elif isinstance(event, ToolInvoked):
            _step(steps, event.step).tools.append(ToolStep(event.call))
        elif isinstance(event, ToolReturned):
            tool = _tool(_step(steps, event.step), event.result.call_id)
            if tool is not None:
                tool.result, tool.took_ms = event.result, record.took_ns / 1e6
        elif isinstance(event, EnvObservation):
            _step(steps, event.step).environment.append(event)
        elif isinstance(event, VerifierScore):
            out.verdict = event
        elif isinstance(event, AttemptFinished):
            out.finished, out.took_ms = event, (record.time_ns - out.started_ns) / 1e6
    out.steps = [steps[n] for n in sorted(steps) if n > 0]
    for previous, step in zip(out.steps, out.steps[1:], strict=False):
        shown = {t.call.id: result.output for t in previous.tools
                 if (result := t.passed_on or t.result) is not None}
        # A tool result the previous step already shows is not repeated as this step's observation.
        step.observation = [m for m in step.observation
                            if not (m.role == "tool" and shown.get(m.tool_call_id or "") == m.content)]
    return out


def _tool(step: Step, call_id: str) -> ToolStep | None:
    return next((t for t in reversed(step.tools) if t.call.id == call_id), None)


def _hook(out: Transcript, steps: dict[int, Step], emitted: dict[int, AfterModel], record: HookRecord) -> None:
    event = record.event
    if record.stage == "emitted":
        if isinstance(event, AfterModel):
            emitted[event.step] = event
        return
    if isinstance(event, TaskStart):
        out.instruction, out.system_prompt = event.task.instruction, event.system_prompt
    elif isinstance(event, BeforeModel):
        _step(steps, event.step).observation = _observation(event.messages)
    elif isinstance(event, AfterModel):
        step = _step(steps, event.step)
        before = emitted.get(event.step)
        if step.choice is not None and before is not None and before != event:
            step.choice.passed_on = event
    elif isinstance(event, BeforeTool):
        if not event.approved:
            step = _step(steps, event.step)
            step.tools.append(ToolStep(event.call, approved=False))
    elif isinstance(event, AfterTool):
        tool = _tool(_step(steps, event.step), event.call.id)
        if tool is not None and tool.result is not None and event.result != tool.result:
            tool.passed_on = event.result
