"""An evolution run's evaluations as Inspect AI eval logs: one log per round's main rollout and per held-out evaluation.

Which trace rounds make an evaluation comes from the ledger: a round's main rollout is the
trace rounds its ``RoundDigested`` names (one per variant), a held-out evaluation the trace
rounds from its ``HeldoutScored.trace_round`` on that together ran its tasks. Main and
held-out trace rounds the ledger does not name yet (a round still running) make logs of
status ``started``. Each finished attempt is a sample (id = task, epoch = attempt + 1) with
its last conversation resolved from the trace, the verifier's score and hx's verdict; an
attempt started and not finished is left out and counted (``InspectExport.in_flight``), so a
later export, once it finished, has it. Nothing comes from memory, the clock or the settings:
the same log gives the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from statistics import fmean
from typing import Literal

import msgspec

from hx.replay.trace_rounds import TraceRound, trace_marks
from hx.report.inspect_log import (
    LOG_VERSION,
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    EvalDataset,
    EvalLog,
    EvalMetric,
    EvalPlan,
    EvalPlanStep,
    EvalResults,
    EvalSample,
    EvalScore,
    EvalSpec,
    EvalStats,
    EvalStatus,
    ModelOutput,
    Score,
    StopReason,
    ToolCall,
    encode,
    error,
    file_name,
)
from projections.ledger import RunLedger
from schemas.history import conversation, resolve_async
from schemas.hooks import HookRecord, TaskStart
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import Message
from schemas.model import ModelRequest, ModelResponse
from schemas.tools import VerifierScore
from streams.log import EventLog
from streams.topology import TRACE, TraceAddress, trace_filter

Kind = Literal["main", "heldout"]
PASSED, SCORE = "passed", "score"
"""The two scorers of every log: hx's pass/fail verdict (``C``/``I``) and the verifier's score."""
_STOP: dict[str, StopReason] = {"tool_use": "tool_calls", "tool_calls": "tool_calls", "end_turn": "stop",
                                "stop": "stop", "max_tokens": "max_tokens", "length": "max_tokens"}
_READ_TYPES = (AttemptStarted.TYPE, AttemptFinished.TYPE, VerifierScore.TYPE, HookRecord.TYPE, ModelRequest.TYPE,
               ModelResponse.TYPE)
"""What an export reads of an attempt: every conversation-bearing event (deltas chain), verdict and score."""


@dataclass(frozen=True)
class Evaluation:
    """One eval log's worth of a run: a round's main rollout or a held-out evaluation, and its trace rounds."""

    kind: Kind
    round: int
    """The evolution round (a held-out evaluation: the round it followed, -1 before the first)."""
    trace_rounds: tuple[int, ...]
    on_ledger: bool
    """False while the ledger does not name it yet (its round is still running)."""

    @property
    def title(self) -> str:
        """How the log is shown (``task_display_name``)."""
        if self.kind == "main":
            return f"round {self.round} main rollout"
        return "held-out before round 0" if self.round < 0 else f"held-out after round {self.round}"


class AttemptRead(msgspec.Struct, kw_only=True):
    """What the export keeps of one attempt while reading its trace: lifecycle, task, last conversation, score."""

    started: AttemptStarted
    started_ns: int
    finished: AttemptFinished | None = None
    finished_ns: int = 0
    instruction: str = ""
    conversation: tuple[Message, ...] = ()
    response: ModelResponse | None = None
    verifier: VerifierScore | None = None


@dataclass(frozen=True)
class InspectExport:
    """The log files by name, and how many attempts were left out because they had not finished."""

    files: dict[str, bytes]
    in_flight: int


def evaluations(ledger: RunLedger, marks: Mapping[int, TraceRound]) -> list[Evaluation]:
    """The run's evaluations: the ledger's main rollouts and held-out evaluations, then those it does not name yet."""
    out: list[Evaluation] = []
    for rnd in ledger.ordered():
        if rnd.digested is not None:
            rounds = tuple(t for t in rnd.digested.trace_rounds if t in marks and marks[t].started.purpose == "main")
            out.append(Evaluation("main", rnd.round, rounds, on_ledger=True))
    for held in ledger.heldout:
        ran: list[int] = []
        tasks, n = 0, held.trace_round
        # the variants' held-out rounds run back to back, each on the tasks its clusters route to
        while tasks < held.tasks and n in marks and marks[n].started.purpose == "heldout":
            ran.append(n)
            tasks += len(marks[n].started.task_ids)
            n += 1
        out.append(Evaluation("heldout", held.round, tuple(ran), on_ledger=True))
    claimed = {t for e in out for t in e.trace_rounds}
    pending: list[tuple[Kind, int, list[int]]] = []
    for n in sorted(marks):
        started = marks[n].started
        if n in claimed or started.purpose not in ("main", "heldout"):
            continue
        kind: Kind = "main" if started.purpose == "main" else "heldout"
        last = pending[-1] if pending else None
        if last is not None and last[:2] == (kind, started.stage_round) and last[2][-1] == n - 1:
            last[2].append(n)
        else:
            pending.append((kind, started.stage_round, [n]))
    out += [Evaluation(kind, rnd, tuple(rounds), on_ledger=False) for kind, rnd, rounds in pending]
    return out


async def read_attempts(log: EventLog, run_id: str, rounds: Sequence[int]) -> dict[int, list[AttemptRead]]:
    """Trace round -> its attempts in (task, attempt) order, conversations resolved (one read for all rounds)."""
    found: dict[str, AttemptRead] = {}
    order: dict[str, tuple[int, str, int]] = {}
    if rounds:
        reads = log.read(TRACE.name, subjects=[trace_filter(run_id, t) for t in rounds], types=_READ_TYPES)
        async for record in resolve_async(reads, strict=False):
            ev = record.event
            if isinstance(ev, AttemptStarted):
                found[record.subject] = AttemptRead(started=ev, started_ns=record.time_ns)
                addr = TraceAddress.parse(record.subject)
                order[record.subject] = (addr.round or 0, ev.task_id, ev.attempt)
                continue
            read = found.get(record.subject)
            if read is None:
                continue
            if isinstance(ev, AttemptFinished):
                read.finished, read.finished_ns = ev, record.time_ns
            elif isinstance(ev, VerifierScore):
                read.verifier = ev
            elif isinstance(ev, ModelResponse) and ev.role == "main":
                read.response = ev
            elif isinstance(ev, HookRecord) and isinstance(ev.event, TaskStart) and not read.instruction:
                read.instruction = ev.event.task.instruction
            messages = conversation(ev)
            if messages and (not isinstance(ev, ModelRequest) or ev.role == "main"):
                read.conversation = messages
    out: dict[int, list[AttemptRead]] = {t: [] for t in rounds}
    for subject in sorted(found, key=order.__getitem__):
        out[order[subject][0]].append(found[subject])
    return out


def _time(ns: int) -> str:
    """The log's nanoseconds as an ISO 8601 UTC time, to the microsecond (integers throughout: no float rounding)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest // 1000).isoformat()


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:22]


def _message(m: Message, mid: str, model: str) -> ChatMessage:
    if m.role == "system":
        return ChatMessageSystem(id=mid, content=m.content)
    if m.role == "user":
        return ChatMessageUser(id=mid, content=m.content)
    if m.role == "tool":
        return ChatMessageTool(id=mid, content=m.content, tool_call_id=m.tool_call_id, function=m.name)
    calls = tuple(ToolCall(id=c.id, function=c.name, arguments=dict(c.input)) for c in m.tool_calls)
    return ChatMessageAssistant(id=mid, content=m.content, tool_calls=calls or None, model=model or None)


def _output(read: AttemptRead, key: str) -> ModelOutput:
    r = read.response
    if r is None:
        return ModelOutput()
    reply = _message(Message(role="assistant", content=r.content, tool_calls=r.tool_calls), f"{key}/output", r.model)
    assert isinstance(reply, ChatMessageAssistant)
    choice = ChatCompletionChoice(message=reply, stop_reason=_STOP.get(r.stop_reason, "unknown"))
    return ModelOutput(model=r.model, choices=(choice,), completion=r.content)


def sample(read: AttemptRead, trace_round: TraceRound) -> EvalSample:
    """A finished attempt as an Inspect sample: its task, conversation, verdict and score, hx's figures as metadata."""
    done, start = read.finished, read.started
    assert done is not None
    key = f"{trace_round.number}.{start.task_id}.{start.attempt}"
    messages = tuple(_message(m, f"{key}/{i}", start.model) for i, m in enumerate(read.conversation))
    first_user = next((m.content for m in read.conversation if m.role == "user"), "")
    scores = {PASSED: Score(value="C" if done.passed else "I", explanation=done.reason or None)}
    if read.verifier is not None:
        v = read.verifier
        scores[SCORE] = Score(value=v.score, explanation=v.detail or None,
                              metadata={"verifier": v.verifier, "passed": v.passed, "reward": v.reward})
    meta = {"status": done.status, "steps": done.steps, "harness_digest": start.harness_digest,
            "variant": trace_round.started.variant, "trace_round": trace_round.number, "seed": start.seed}
    return EvalSample(
        id=start.task_id, epoch=start.attempt + 1, input=read.instruction or first_user, target="",
        messages=messages, output=_output(read, key), scores=scores, metadata=meta,
        started_at=_time(read.started_ns), completed_at=_time(read.finished_ns),
        total_time=round((read.finished_ns - read.started_ns) / 1e9, 6), uuid=_digest(start.run_id, key),
        error=error(f"{done.status}: {done.reason}") if done.status == "infra_failure" else None)


def results(samples: Sequence[EvalSample]) -> EvalResults:
    """Accuracy (the mean pass over samples) and, over the samples the verifier scored, the mean score."""
    passed = [1.0 if s.scores and s.scores[PASSED].value == "C" else 0.0 for s in samples]
    scores = [EvalScore(name=PASSED, scorer=PASSED, scored_samples=len(samples), unscored_samples=0,
                        metrics={"accuracy": EvalMetric(name="accuracy", value=fmean(passed) if passed else 0.0)})]
    scored = [float(s.scores[SCORE].value) for s in samples if s.scores and SCORE in s.scores]
    if scored:
        scores.append(EvalScore(name=SCORE, scorer=SCORE, scored_samples=len(scored),
                                unscored_samples=len(samples) - len(scored),
                                metrics={"mean": EvalMetric(name="mean", value=fmean(scored))}))
    return EvalResults(total_samples=len(samples), completed_samples=len(samples), scores=tuple(scores))


def status(ev: Evaluation, marks: Mapping[int, TraceRound], samples: Sequence[EvalSample]) -> EvalStatus:
    """``started`` until the ledger names it and every trace round finished; ``error`` when more than half its
    samples are infrastructure failures; else ``success``."""
    if not ev.on_ledger or any(marks[t].finished is None for t in ev.trace_rounds):
        return "started"
    infra = sum(1 for s in samples if s.metadata.get("status") == "infra_failure")
    return "error" if samples and infra * 2 > len(samples) else "success"


def eval_log(run_id: str, ev: Evaluation, marks: Mapping[int, TraceRound],
             attempts: Mapping[int, Sequence[AttemptRead]], fallback_model: str) -> EvalLog:
    """One evaluation as an Inspect eval log (finished attempts only)."""
    rounds = [marks[t] for t in ev.trace_rounds]
    reads = [(marks[t], a) for t in ev.trace_rounds for a in attempts.get(t, ()) if a.finished is not None]
    samples = tuple(sample(a, tr) for tr, a in reads)
    model = next((a.started.model for _, a in reads if a.started.model), fallback_model) or "none/none"
    split = rounds[0].started.split if rounds else ""
    ended = [tr.end_ns for tr in rounds if tr.finished is not None]
    first_ns = min((tr.time_ns for tr in rounds), default=0)
    state = status(ev, marks, samples)
    infra = sum(1 for s in samples if s.error is not None)
    variants = {tr.started.variant: tr.started.harness_digest for tr in rounds}
    spec = EvalSpec(
        eval_id=_digest(run_id, ev.kind, ev.round, ev.trace_rounds), run_id=run_id, created=_time(first_ns),
        task=split or ev.kind, task_id=_digest(run_id, ev.kind, ev.round), task_display_name=ev.title,
        dataset=EvalDataset(name=split or ev.kind, samples=len(samples),
                            sample_ids=tuple(dict.fromkeys(s.id for s in samples))),
        model=model, config={}, metadata={"hx_run": run_id, "kind": ev.kind, "round": ev.round,
                               "trace_rounds": list(ev.trace_rounds), "variants": variants,
                               "on_ledger": ev.on_ledger})
    plan = EvalPlan(steps=tuple(EvalPlanStep(solver=f"hx harness {v}", params={"variant": v, "digest": d})
                                for v, d in variants.items()))
    return EvalLog(
        version=LOG_VERSION, status=state, eval=spec, plan=plan, results=results(samples),
        stats=EvalStats(started_at=_time(first_ns), completed_at=_time(max(ended)) if len(ended) == len(rounds)
                        and ended else ""),
        error=error(f"{infra} of {len(samples)} attempts ended in an infrastructure failure") if state == "error"
        else None, samples=samples)


async def inspect_export(log: EventLog, run_id: str, ledger: RunLedger) -> InspectExport:
    """Every evaluation of a run as Inspect eval log files (by file name), and the count of attempts in flight."""
    marks = await trace_marks(log, run_id)
    evs = [e for e in evaluations(ledger, marks) if e.trace_rounds]
    attempts = await read_attempts(log, run_id, sorted({t for e in evs for t in e.trace_rounds}))
    files: dict[str, bytes] = {}
    for ev in evs:
        entry = eval_log(run_id, ev, marks, attempts, ledger.model)
        files[file_name(entry)] = encode(entry)
    return InspectExport(files=dict(sorted(files.items())), in_flight=_in_flight(attempts.values()))


def _in_flight(rounds: Iterable[Sequence[AttemptRead]]) -> int:
    return sum(1 for reads in rounds for a in reads if a.finished is None)
