"""One attempt's model turns as training data: the extraction shared by the replay buffer and the training bridge.

An attempt's records are absorbed into a ``Partial`` (its conversation, resolved from the
log's deltas, the requests and responses of the trained roles, the after_model returns, the
verifier score); when it finishes, ``trajectory`` turns it into a ``Trajectory``: per turn
the exact context the model saw, what it produced, the behaviour log-probabilities logged
with it, and whether the attempt went on with exactly that completion (``on_policy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from schemas.errors import HistoryGap
from schemas.event import Event
from schemas.history import apply, packed
from schemas.hooks import AfterModel, HookRecord
from schemas.lifecycle import SCORED_STATUSES, AttemptFinished, AttemptStarted, AttemptStatus
from schemas.messages import Message, ToolSchema
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import VerifierScore

RewardField = Literal["score", "reward", "passed"]
"""Which field of the ``VerifierScore`` is the reward (``passed``: 1.0 or 0.0)."""

class ModelTurn(msgspec.Struct, frozen=True):
    """A model call of an attempt: the request as sent (messages resolved) and the response."""

    request: ModelRequest | None
    """None when the request was not read (the response alone was)."""
    response: ModelResponse


class Partial(msgspec.Struct, kw_only=True):
    """An attempt being read: what its trajectory needs, and nothing more."""

    started: AttemptStarted
    ordinal: int = -1
    """Number of the attempt's last conversation read (-1: none), the base of the next delta."""
    conversation: tuple[Message, ...] = ()
    """That conversation, resolved."""
    requests: dict[str, ModelRequest] = {}
    """Requests awaiting their response, by ``step/try``."""
    turns: list[ModelTurn] = []
    returned: dict[str, list[AfterModel]] = {}
    """The after_model events the processors returned, by step: they decide ``on_policy``."""
    score: VerifierScore | None = None


def absorb(partial: Partial, event: Event, roles: Sequence[str]) -> bool:
    """Fold one event of the attempt into ``partial``; False when its conversation delta cannot be resolved.

    Events already resolved (``schemas.history.resolve``) pass as they are.
    """
    history = packed(event)
    if history is not None:
        if history.ordinal != 0 and partial.ordinal != history.ordinal - 1:
            return False  # its base conversation was not read
        try:
            messages = apply(partial.conversation if history.ordinal else (), history.parts)
        except HistoryGap:
            return False
        partial.ordinal, partial.conversation = history.ordinal, messages
        if isinstance(event, ModelRequest):
            event = msgspec.structs.replace(event, messages=messages, history=None)
    if isinstance(event, ModelRequest):
        if event.role in roles:
            partial.requests[f"{event.step}/{event.try_index}"] = event
    elif isinstance(event, ModelResponse):
        if event.role in roles:
            partial.turns.append(ModelTurn(partial.requests.pop(f"{event.step}/{event.try_index}", None), event))
    elif isinstance(event, ModelError):
        if event.role in roles:
            partial.requests.pop(f"{event.step}/{event.try_index}", None)  # answered by no response
    elif isinstance(event, HookRecord):
        if event.stage == "returned" and isinstance(event.event, AfterModel):
            partial.returned.setdefault(str(event.step), []).append(event.event)
    elif isinstance(event, VerifierScore):
        partial.score = event
    return True


def on_policy(partial: Partial, response: ModelResponse) -> bool:
    """True when the attempt went on with exactly ``response`` (one after_model result, unchanged)."""
    returned = partial.returned.get(str(response.step), [])
    return (len(returned) == 1 and returned[0].content == response.content
            and returned[0].tool_calls == response.tool_calls)


def reward_of(score: VerifierScore | None, finished: AttemptFinished | None, field: RewardField) -> float:
    """The attempt's reward: 0 without a score, or when it ended without a standing verdict (interrupted)."""
    if score is None or (finished is not None and finished.status not in SCORED_STATUSES):
        return 0.0
    if field == "passed":
        return 1.0 if score.passed else 0.0
    return float(score.reward if field == "reward" else score.score)


# --- trajectories ----------------------------------------------------------------------------------------------


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """One model turn as the learner trains on it."""

    step: int
    role: str
    model: str
    """The model spec that answered."""
    model_version: str
    """The behaviour policy of ``logprobs``: the exact checkpoint or snapshot."""
    messages: tuple[Message, ...]
    """The full context the model saw."""
    tools: tuple[ToolSchema, ...]
    params: dict[str, Any]
    completion: Message
    """What the model produced, as an assistant message."""
    logprobs: tuple[float, ...]
    """Behaviour log-probability of each produced unit, as logged (empty when the provider gave none)."""
    on_policy: bool


class Trajectory(msgspec.Struct, frozen=True, kw_only=True):
    """One finished attempt: its turns and its reward."""

    run_id: str
    round: int
    task_id: str
    attempt: int
    harness_digest: str
    model: str
    model_version: str
    """The first turn's model version (each turn carries its own)."""
    reward: float
    passed: bool
    status: AttemptStatus
    turns: tuple[Turn, ...]


def trajectory(partial: Partial, finished: AttemptFinished | None, reward: RewardField = "score") -> Trajectory:
    """The trajectory of an attempt read into ``partial`` (``finished`` None: cut off, no reward)."""
    st = partial.started
    turns = tuple(_turn(t, on_policy(partial, t.response)) for t in partial.turns)
    return Trajectory(run_id=st.run_id, round=st.round, task_id=st.task_id, attempt=st.attempt,
                      harness_digest=st.harness_digest, model=st.model,
                      model_version=turns[0].model_version if turns else "",
                      reward=reward_of(partial.score, finished, reward),
                      passed=finished.passed if finished is not None else False,
                      status=finished.status if finished is not None else "completed", turns=turns)


def _turn(t: ModelTurn, policy: bool) -> Turn:
    req, resp = t.request, t.response
    return Turn(step=resp.step, role=resp.role, model=resp.model, model_version=resp.model_version,
                messages=req.messages if req is not None else (), tools=req.tools if req is not None else (),
                params=dict(req.params) if req is not None else {},
                completion=Message(role="assistant", content=resp.content, tool_calls=resp.tool_calls),
                logprobs=tuple(lp.logprob for lp in resp.logprobs), on_policy=policy)

