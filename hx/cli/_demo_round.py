"""A synthetic but realistic round for ``hx demo``: a scripted policy on a coin-finding task family.

Every outcome comes from one seeded ``random.Random``, so the same seed gives the same
event bodies; only the run id (in subjects and bodies) differs between runs. Each event
gets the deterministic key ``<subject>#<n>`` (its index on its subject), which makes a
rerun with the same run id a no-op: the server drops the duplicates.

>>> r = synthetic_round("demo-doc", events=200, attempts=2, seed=0)
>>> r.entries[0].key
'hx.trace.demo-doc._._._#0'
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field

from schemas.event import Event
from schemas.history import HistoryPacker
from schemas.hooks import (
    AfterModel,
    AfterTool,
    BeforeModel,
    BeforeTool,
    HookRecord,
    ProcessorTriggered,
    StepEnd,
    StepStart,
    TaskEnd,
    TaskStart,
)
from schemas.lifecycle import (
    AttemptFinished,
    AttemptStarted,
    AttemptStatus,
    RoundFinished,
    RoundStarted,
    RunFinished,
    RunStarted,
)
from schemas.messages import Message, TaskSpec, TokenLogprob, ToolCall, ToolResult, ToolSchema, TopLogprob, Usage
from schemas.model import ModelRequest, ModelResponse
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned, VerifierScore
from streams.outgoing import Entry
from streams.topology import trace_subject

MODEL = "scripted:coin-walker"
HARNESS_DIGEST = hashlib.sha256(b"hx demo harness: react + trim_history").hexdigest()
ROUND = 0
MAX_STEPS = 8
KEEP_MESSAGES = 6
ROOMS = ("kitchen", "pantry", "hallway", "living room", "bedroom", "garden", "cellar", "attic")
MOVES = ("go north", "go south", "go east", "go west", "open door", "look", "inventory")
SYSTEM_PROMPT = "You are an agent in a text world. Act with the `act` tool, one command per step."
ACT = ToolSchema(name="act", description="Send one command to the text world.",
                 input_schema={"type": "object", "properties": {"command": {"type": "string"}},
                               "required": ["command"]})


@dataclass
class SyntheticRound:
    """The events of one synthetic round, keyed, in append order, and what they add up to."""

    run_id: str
    tasks: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    attempts: int = 0
    passed: int = 0
    _seen: Counter[str] = field(default_factory=Counter)
    _packers: dict[str, HistoryPacker] = field(default_factory=dict)

    def add(self, subject: str, event: Event) -> None:
        """Append an event with its deterministic key ``<subject>#<n>``, its conversation as the run loop logs it."""
        n = self._seen[subject]
        self._seen[subject] = n + 1
        packer = self._packers.setdefault(subject, HistoryPacker())
        self.entries.append(Entry(subject, packer.pack(event), f"{subject}#{n}"))


def _observation(rng: random.Random, room: str, won: bool) -> str:
    if won:
        return f"You pick up the coin in the {room}. *** You have won ***"
    exits = ", ".join(sorted(rng.sample(("north", "south", "east", "west"), k=rng.randint(1, 3))))
    return f"-= {room.title()} =- You are in the {room}. Exits: {exits}. There is no coin here."


def _step(r: SyntheticRound, rng: random.Random, subject: str, step: int, history: list[Message],
          coin_room: str, last: bool, won: bool) -> list[Message]:
    rec = HookRecord
    r.add(subject, rec(stage="emitted", step=step, event=StepStart(step=step, messages=tuple(history))))
    if len(history) > KEEP_MESSAGES:
        history = [history[0], history[1], *history[-(KEEP_MESSAGES - 2):]]
        r.add(subject, rec(stage="returned", step=step, event=StepStart(step=step, messages=tuple(history))))
        r.add(subject, ProcessorTriggered(processor="trim_history", group="history", hook="step_start", step=step,
                                          action="changed", fields=("messages",), reason="history over budget"))
    r.add(subject, rec(stage="emitted", step=step, event=BeforeModel(step=step, messages=tuple(history),
                                                                     tools=(ACT,))))
    params = {"temperature": 0.7, "max_tokens": 256, "seed": rng.randrange(2**31)}
    r.add(subject, ModelRequest(role="main", model=MODEL, step=step, messages=tuple(history), tools=(ACT,),
                                params=params))
    command = "take coin" if last and won else rng.choice(MOVES)
    call = ToolCall(id=f"call_{step}", name="act", input={"command": command})
    content = f"The coin is not in sight yet; I will {command}." if not won or not last else "There it is."
    chosen = -round(rng.uniform(0.01, 2.5), 4)
    alternatives = tuple(TopLogprob(token=m, logprob=round(chosen - rng.uniform(0.1, 3.0), 4))
                         for m in rng.sample(MOVES, k=2) if m != command)
    usage = Usage(input_tokens=sum(len(m.content) for m in history) // 4 + 120, output_tokens=rng.randint(12, 60))
    r.add(subject, ModelResponse(role="main", model=MODEL, model_version="coin-walker-0", step=step,
                                 content=content, tool_calls=(call,), stop_reason="tool_use", usage=usage,
                                 logprobs=(TokenLogprob(token=command, logprob=chosen, top=alternatives),)))
    r.add(subject, rec(stage="emitted", step=step, event=AfterModel(step=step, content=content, tool_calls=(call,),
                                                                    stop_reason="tool_use", model=MODEL)))
    r.add(subject, rec(stage="emitted", step=step, event=BeforeTool(step=step, call=call)))
    r.add(subject, ToolInvoked(step=step, call=call))
    room = coin_room if last and won else rng.choice(ROOMS)
    text = _observation(rng, room, last and won)
    score = 1.0 if last and won else round(step / (MAX_STEPS * 2), 3)
    result = ToolResult(call_id=call.id, name="act", output=text, data={"score": score})
    r.add(subject, ToolReturned(step=step, result=result))
    r.add(subject, rec(stage="emitted", step=step, event=AfterTool(step=step, call=call, result=result)))
    r.add(subject, EnvObservation(step=step, observation=text, valid_actions=MOVES, score=score, done=last,
                                  success=last and won, failure=last and not won))
    history = [*history, Message(role="assistant", content=content, tool_calls=(call,)),
               Message(role="tool", content=text, tool_call_id=call.id, name="act")]
    r.add(subject, rec(stage="emitted", step=step, event=StepEnd(step=step, done=last)))
    return history


def _attempt(r: SyntheticRound, rng: random.Random, task: TaskSpec, attempt: int, p_pass: float,
             coin_room: str) -> None:
    subject = trace_subject(r.run_id, ROUND, task.id, attempt)
    r.add(subject, AttemptStarted(run_id=r.run_id, round=ROUND, task_id=task.id, attempt=attempt,
                                  harness_digest=HARNESS_DIGEST, model=MODEL, seed=rng.randrange(2**31)))
    r.add(subject, HookRecord(stage="emitted", step=0, event=TaskStart(task=task, system_prompt=SYSTEM_PROMPT,
                                                                         tools=(ACT,))))
    passed = rng.random() < p_pass
    infra = rng.random() < 0.03
    steps = rng.randint(2, MAX_STEPS - 2) if passed else rng.choice((MAX_STEPS, rng.randint(3, MAX_STEPS)))
    if infra:
        passed, steps = False, rng.randint(1, steps)
    history = [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=task.instruction)]
    for step in range(1, steps + 1):
        history = _step(r, rng, subject, step, history, coin_room, step == steps and not infra, passed)
    status: AttemptStatus = "completed"
    reason = ""
    if infra:
        status, reason = "infra_failure", "sandbox lost its connection"
    elif not passed and steps == MAX_STEPS:
        status, reason = "budget_exhausted", f"no coin after {MAX_STEPS} steps"
    score = 1.0 if passed else round(steps / (MAX_STEPS * 2), 3)
    if not infra:
        r.add(subject, VerifierScore(verifier="coin.found", passed=passed, score=score, reward=score,
                                     detail="coin in inventory" if passed else "coin not found"))
    r.add(subject, HookRecord(stage="emitted", step=0, event=TaskEnd(task_id=task.id, passed=passed, score=score,
                                                                       steps=steps, status=status)))
    r.add(subject, AttemptFinished(run_id=r.run_id, round=ROUND, task_id=task.id, attempt=attempt, passed=passed,
                                   score=score, steps=steps, status=status, reason=reason))
    r.attempts += 1
    r.passed += passed


def synthetic_round(run_id: str, *, events: int, attempts: int, seed: int) -> SyntheticRound:
    """One run of one round: tasks of ``attempts`` attempts each until about ``events`` events."""
    rng = random.Random(seed)
    r = SyntheticRound(run_id)
    body: list[tuple[TaskSpec, float, str]] = []
    attempt_entries = SyntheticRound(run_id)
    while not body or len(attempt_entries.entries) + 4 < events:
        i = len(body)
        coin_room = rng.choice(ROOMS)
        task = TaskSpec(id=f"demo:coin:dev:{i:03d}", benchmark="demo-coin", split="dev", seed=rng.randrange(2**31),
                        instruction=f"Find the coin. It is somewhere in the house (start: {rng.choice(ROOMS)}).")
        p_pass = rng.choice((0.9, 0.7, 0.5, 0.3, 0.1))
        body.append((task, p_pass, coin_room))
        for attempt in range(attempts):
            _attempt(attempt_entries, rng, task, attempt, p_pass, coin_room)
    r.tasks = [task.id for task, _, _ in body]
    run_subject, round_subject = trace_subject(run_id), trace_subject(run_id, ROUND)
    r.add(run_subject, RunStarted(run_id=run_id, kind="demo", seed=seed,
                                  config={"events": events, "attempts": attempts, "model": MODEL}))
    r.add(round_subject, RoundStarted(run_id=run_id, round=ROUND, harness_digest=HARNESS_DIGEST,
                                      task_ids=tuple(r.tasks), split="dev", attempts_per_task=attempts))
    r.entries.extend(attempt_entries.entries)
    r.attempts, r.passed = attempt_entries.attempts, attempt_entries.passed
    r.add(round_subject, RoundFinished(run_id=run_id, round=ROUND, attempts=r.attempts, passed=r.passed))
    r.add(run_subject, RunFinished(run_id=run_id, status="completed", rounds=1))
    return r
