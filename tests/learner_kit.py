"""Parts the learner tests share: tools to act on, a policy that is not uniform, a benchmark whose tool has no
enum, and what a run's trace says about its model turns and attempts, read straight from the log."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
from flax import nnx

from hx.environments.registry import Benchmark, TaskId
from hx.learner.policy import Policy, Sample
from hx.learner.scorer import ChoiceScorer, ScorerPolicy
from hx.learner.scorer import _ids as scorer_ids
from hx.learner.trainer import learn_subject
from hx.runtime.task import Task, Tool
from schemas.envelope import Record
from schemas.event import Event
from schemas.history import resolve
from schemas.lifecycle import SCORED_STATUSES, AttemptFinished, RoundStarted
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import VerifierScore
from streams.log import EventLog
from streams.topology import LEARN, TRACE, TraceAddress, trace_filter

GO = ToolSchema(name="go", description="Walk somewhere.", input_schema={
    "type": "object", "properties": {"dir": {"type": "string", "enum": ["north", "south"]},
                                     "note": {"type": "string"},
                                     "speed": {"type": "integer", "enum": [1, 2, 3]}}})
"""Two enumerated properties (one of integers) and a free one."""
SAY = ToolSchema(name="say", description="Say something.", input_schema={
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
"""A tool without any enum: nothing a choice policy can play."""


def perturbed(policy: Policy, seed: int = 1, scale: float = 0.1) -> Policy:
    """``policy`` with Gaussian noise added to every parameter (in place): its choices are no longer uniform."""
    rng = np.random.default_rng(seed)
    for _, node in nnx.iter_graph(policy.model):
        if isinstance(node, nnx.Param):
            value = np.asarray(node[...])
            node[...] = jnp.asarray(value + scale * rng.standard_normal(value.shape).astype(value.dtype))
    return policy


def avoiding(policy: Policy, word: str) -> Policy:
    """``policy`` (a scorer) set, in place, to never pick an option with ``word`` in it: a policy that forgot a skill.

    Only ``word``'s embedding is non-zero (200 on its first axis: 100 pooled over a two-word option), one option
    unit reads that axis and the prior scores the unit at -0.5: such an option scores -50 (probability ~e^-50),
    every other option 0 (uniform among them).
    """
    assert isinstance(policy, ScorerPolicy)
    model: ChoiceScorer = policy.model  # type: ignore[assignment]
    embedding = np.zeros(model.embed.embedding.shape, np.float32)
    (row,) = scorer_ids([word], policy.config["vocab"])
    embedding[row, 0] = 200.0
    model.embed.embedding[...] = jnp.asarray(embedding)
    kernel = np.zeros(model.option.kernel.shape, np.float32)
    kernel[0, 0] = 1.0
    model.option.kernel[...] = jnp.asarray(kernel)  # its bias starts at zero
    prior = np.zeros(model.prior.kernel.shape, np.float32)
    prior[0, 0] = -0.5
    model.prior.kernel[...] = jnp.asarray(prior)
    return policy


def completion(*calls: ToolCall) -> Message:
    """An assistant message making ``calls``."""
    return Message(role="assistant", tool_calls=calls)


def sample_of(messages: Sequence[Message], tools: Sequence[ToolSchema], *calls: ToolCall) -> Sample:
    """A sample whose completion makes ``calls``."""
    return Sample(messages=tuple(messages), tools=tuple(tools), completion=completion(*calls))


# --- a benchmark whose only tool takes free text ----------------------------------------------------------


class Chat(Task):
    """Say anything; never passes."""

    system_prompt = "Talk."

    def __init__(self, tid: TaskId) -> None:
        self.spec = TaskSpec(id=str(tid), instruction="Say hello.", benchmark=tid.benchmark, split=tid.split,
                             seed=tid.seed, meta={"game": tid.game})

    def tools(self) -> Sequence[Tool]:
        """The ``say`` tool."""
        return [SayTool()]

    async def reset(self) -> str:
        """The first observation."""
        return "Someone waves at you."

    async def verify(self, final_answer: str) -> VerifierScore:
        """Never passed."""
        return VerifierScore(verifier="talk", passed=False, score=0.0)


class SayTool(Tool):
    """Answers anything with a nod."""

    schema = SAY

    async def call(self, call: ToolCall) -> ToolResult:
        """A nod."""
        return ToolResult(call_id=call.id, name=call.name, output="They nod.")


class TalkBench(Benchmark):
    """``talk``: one game, ``chat``, whose tool has no enumerated input."""

    name: ClassVar[str] = "talk"

    def games(self) -> tuple[str, ...]:
        """The one game."""
        return ("chat",)

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        """Three tasks a split unless told otherwise."""
        return [TaskId("talk", game, split, i) for i in range(limit or 3)]

    def make_task(self, task_id: TaskId) -> Task:
        """A chat."""
        return Chat(task_id)


# --- what the trace says ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelTurn:
    """One answered model call of the main role, its conversation in full."""

    round: int
    task: str
    attempt: int
    request: ModelRequest
    response: ModelResponse

    def sample(self) -> Sample:
        """The turn as a policy scores it."""
        return Sample(messages=self.request.messages, tools=self.request.tools,
                      completion=Message(role="assistant", content=self.response.content,
                                         tool_calls=self.response.tool_calls))


async def trace(log: EventLog, run_id: str) -> list[Record]:
    """The run's trace records, in log order, conversations resolved."""
    return list(resolve([r async for r in log.read(TRACE.name, subjects=[trace_filter(run_id)])]))


async def model_turns(log: EventLog, run_id: str) -> list[ModelTurn]:
    """Every main-role request that got a response, paired with it, in log order."""
    pending: dict[tuple[str, int, int], ModelRequest] = {}
    out = []
    for rec in await trace(log, run_id):
        ev = rec.event
        if isinstance(ev, ModelRequest) and ev.role == "main":
            pending[(rec.subject, ev.step, ev.try_index)] = ev
        elif isinstance(ev, ModelResponse) and ev.role == "main":
            a = TraceAddress.parse(rec.subject)
            assert a.round is not None and a.task is not None and a.attempt is not None
            out.append(ModelTurn(a.round, a.task, a.attempt, pending.pop((rec.subject, ev.step, ev.try_index)), ev))
    return out


async def model_errors(log: EventLog, run_id: str) -> list[ModelError]:
    """Every model error of the run."""
    return [r.event for r in await trace(log, run_id) if isinstance(r.event, ModelError)]


async def finished(log: EventLog, run_id: str) -> list[AttemptFinished]:
    """Every attempt's verdict."""
    return [r.event for r in await trace(log, run_id) if isinstance(r.event, AttemptFinished)]


@dataclass(frozen=True)
class Expected:
    """What one GRPO pass over some rounds should use, worked out from the trace alone."""

    samples: int
    groups_used: int
    groups_skipped: int


async def expected_pass(log: EventLog, run_id: str, rounds: Sequence[int]) -> Expected:
    """Turns of the tasks whose attempts in ``rounds`` do not all share one reward; the groups used and not."""
    records = await trace(log, run_id)
    heldout = {r.event.round for r in records if isinstance(r.event, RoundStarted) and r.event.split == "heldout"}
    assert not heldout & set(rounds), "held-out rounds are never a pass's rounds"
    turns: Counter[tuple[int, str, int]] = Counter()
    rewards: dict[str, list[float]] = {}
    for rec in records:
        ev = rec.event
        a = TraceAddress.parse(rec.subject)
        if a.round is None or a.round not in rounds:
            continue
        if isinstance(ev, ModelResponse) and ev.role == "main":
            turns[(a.round, str(a.task), int(a.attempt or 0))] += 1
        elif isinstance(ev, AttemptFinished):
            rewards.setdefault(ev.task_id, []).append(ev.score if ev.status in SCORED_STATUSES else 0.0)
    spread = {task for task, rs in rewards.items() if len(rs) > 1 and max(rs) != min(rs)}
    return Expected(samples=sum(n for (_, task, _), n in turns.items() if task in spread),
                    groups_used=len(spread), groups_skipped=len(rewards) - len(spread))


async def learn_records(log: EventLog, run_id: str, learner: str = "default") -> list[Event]:
    """A learner's records on HX_LEARN, in order."""
    return [r.event async for r in log.read(LEARN.name, subjects=[learn_subject(run_id, learner)])]
