"""D9 training bridge: turn logged attempts into RL records for cross-harness GRPO.

The learner trains on what the model actually saw and produced, with the behaviour
log-probabilities recorded when it produced it, and on the verifier's reward. All of
that is on the log, and only there: hook events do not carry log-probabilities. So the
bridge is a pure function over an attempt's log records, the same records the
replay-buffer projection folds:

- the prompt of each main-model turn is the ``ModelRequest`` that was sent (after every
  before_model processor), with its tools and sampling parameters;
- the completion and its log-probabilities are the ``ModelResponse`` that answered it;
- ``on_policy`` says whether the trajectory went on with exactly that completion: an
  after_model processor (a self-check, a judge, a tool filter) may have changed it,
  and then the tokens the history shows are not the tokens the log-probabilities
  belong to. The learner decides whether to drop such turns;
- the reward comes from the ``VerifierScore`` and the attempt's ``AttemptFinished``
  (an interrupted attempt has no verifier score: reward 0, not passed).

``group_advantages`` then computes the paper's group-relative advantage: trajectories
are grouped by task across harness versions, and each turn of a trajectory gets
``(r - mean) / (std + eps)`` of its group (``standardised``, the one place that computation
lives: the learner's GRPO uses it too). A group whose rewards are all equal carries no
signal: its advantages are 0; whether to drop it is the caller's choice.

>>> group_advantages([])
[]
>>> standardised([1.0, 0.0]), standardised([0.1, 0.1, 0.1])
([0.999998000004, -0.999998000004], [0.0, 0.0, 0.0])
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import msgspec

from projections.trajectories import Partial, RewardField, absorb, on_policy, reward_of
from schemas.envelope import Record
from schemas.history import resolve
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import Message, TokenLogprob, ToolSchema


class RLRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One model turn of one attempt, with the attempt's reward: a GRPO training sample."""

    group: str
    """The GRPO group key: the task id (cross-harness grouping)."""
    run_id: str = ""
    round: int = 0
    task_id: str
    attempt: int = 0
    harness_digest: str = ""
    """The harness version that built the prompt."""
    turn: int
    """Position of this model call among the attempt's turns, from 0."""
    step: int
    model: str = ""
    """The model spec that answered."""
    model_version: str = ""
    """The exact checkpoint or snapshot: the behaviour policy of ``logprobs``."""
    prompt: tuple[Message, ...] = ()
    tools: tuple[ToolSchema, ...] = ()
    params: dict[str, Any] = {}
    """Sampling parameters of the call (temperature matters for re-scoring)."""
    completion: Message
    """What the model produced, as an assistant message."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """Behaviour log-probabilities of the completion's tokens (or choices), when the provider gave them."""
    on_policy: bool | None = None
    """True when the trajectory continued with exactly this completion; None when unknown."""
    reward: float = 0.0
    passed: bool = False
    status: str = "completed"
    advantage: float = 0.0
    """Group-relative advantage, set by ``group_advantages``."""
    source: Literal["log", "hooks"] = "log"
    """Built from the log (complete) or from hook events (``rl_records``: no log-probabilities)."""


def attempt_to_rl_records(records: Iterable[Record], *, reward: RewardField = "score",
                          roles: tuple[str, ...] = ("main",), complete_only: bool = True) -> list[RLRecord]:
    """The RL records of every attempt among ``records`` (one per model turn), in log order.

    Records of several attempts may be mixed; they are told apart by subject. With
    ``complete_only`` an attempt without ``AttemptFinished`` (still running, cut off)
    gives nothing. ``roles`` are the model roles whose turns are samples: ``main``, plus
    any role a D1 router sends turns to when the trained policy serves it.
    """
    attempts: dict[str, Partial] = {}
    finished: dict[str, AttemptFinished] = {}
    for rec in resolve(records):  # prompts are logged as deltas of the conversation
        ev = rec.event
        if isinstance(ev, AttemptStarted):
            attempts[rec.subject] = Partial(started=ev)  # a re-run on the same subject starts over
            finished.pop(rec.subject, None)
        elif rec.subject in attempts:
            if isinstance(ev, AttemptFinished):
                finished[rec.subject] = ev
            else:
                absorb(attempts[rec.subject], ev, roles)  # the replay buffer's extraction, on resolved records
    out: list[RLRecord] = []
    for subject, a in attempts.items():
        fin = finished.get(subject)
        if complete_only and fin is None:
            continue
        out += _records(a, fin, reward)
    return out


def _records(a: Partial, fin: AttemptFinished | None, reward_field: RewardField) -> list[RLRecord]:
    st = a.started
    passed = fin.passed if fin is not None else False
    value = reward_of(a.score, fin, reward_field)
    out = []
    for turn, t in enumerate(a.turns):
        req, resp = t.request, t.response
        out.append(RLRecord(
            group=st.task_id, run_id=st.run_id, round=st.round, task_id=st.task_id, attempt=st.attempt,
            harness_digest=st.harness_digest, turn=turn, step=resp.step, model=resp.model,
            model_version=resp.model_version,
            prompt=req.messages if req is not None else (), tools=req.tools if req is not None else (),
            params=dict(req.params) if req is not None else {},
            completion=Message(role="assistant", content=resp.content, tool_calls=resp.tool_calls),
            logprobs=resp.logprobs, on_policy=on_policy(a, resp), reward=value, passed=passed,
            status=fin.status if fin is not None else "completed"))
    return out


def trajectory_key(record: RLRecord) -> tuple[str, int, str, int, str]:
    """Which trajectory a record belongs to."""
    return (record.run_id, record.round, record.task_id, record.attempt, record.harness_digest)


def has_spread(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards tell its members apart: two or more, not all equal."""
    # Exact test: the std of equal floats can come out as a tiny non-zero number.
    return len(rewards) >= 2 and max(rewards) != min(rewards)


def standardised(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """A group's rewards as ``(r - mean) / (std + eps)`` (population std); all 0 for a group without spread."""
    if not has_spread(rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def group_advantages(records: Iterable[RLRecord], *, eps: float = 1e-6) -> list[RLRecord]:
    """``records`` with ``advantage`` set: each trajectory's reward standardised within its group.

    Every trajectory counts once in its group's mean and standard deviation, however
    many turns it has; a group of one trajectory (or of equal rewards) gets advantage 0.
    """
    records = list(records)
    rewards: dict[str, dict[tuple[str, int, str, int, str], float]] = defaultdict(dict)
    for r in records:
        rewards[r.group][trajectory_key(r)] = r.reward
    advantage: dict[tuple[str, tuple[str, int, str, int, str]], float] = {}
    for group, by_traj in rewards.items():
        for key, value in zip(by_traj, standardised(list(by_traj.values()), eps), strict=True):
            advantage[group, key] = value
    return [msgspec.structs.replace(r, advantage=advantage[r.group, trajectory_key(r)]) for r in records]
