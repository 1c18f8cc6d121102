"""Run, round and task-attempt lifecycle events."""

from __future__ import annotations

from typing import Literal

from schemas.envelope import later_fields
from schemas.event import Event, JsonObject, Payload
from schemas.messages import Usage

AttemptStatus = Literal["completed", "interrupted", "budget_exhausted", "infra_failure"]
SCORED_STATUSES: tuple[AttemptStatus, ...] = ("completed", "budget_exhausted")
"""Statuses whose verifier result stands: the attempt ran to its end or to its step budget."""


class RunStarted(Event, frozen=True, kw_only=True):
    """A run (an evolution or evaluation campaign) began."""

    TYPE = "run.started"
    LEVEL = "run"

    run_id: str
    kind: str = "rollout"
    """What the run does: ``rollout``, ``evolve``, ``train``, ``demo``."""
    config: JsonObject = {}
    """The run's settings, secrets excluded: their keys depend on ``kind`` (a rollout records its harness in full
    under ``harness_config``)."""
    seed: int = 0


class RunFinished(Event, frozen=True, kw_only=True):
    """A run ended, normally or not."""

    TYPE = "run.finished"
    LEVEL = "run"

    run_id: str
    status: Literal["completed", "failed", "cancelled"] = "completed"
    reason: str = ""
    rounds: int = 0


class RoundStarted(Event, frozen=True, kw_only=True):
    """A round of a run began: one harness version applied to a batch of tasks."""

    TYPE = "round.started"
    VERSION = 2
    READS = (1,)
    """Version 1 had no ``purpose``, ``variant``, ``candidate``, ``stage_round`` or ``first_attempt``."""
    LEVEL = "round"

    run_id: str
    round: int
    harness_digest: str = ""
    task_ids: tuple[str, ...] = ()
    split: str = ""
    attempts_per_task: int = 1
    purpose: str = "main"
    """Why the round ran: ``main`` (a round's rollouts), ``gate`` (a candidate's fresh attempts),
    ``counterfactual`` (a candidate replayed over recorded responses) or ``heldout``."""
    variant: str = ""
    """The harness variant it ran (evolution runs)."""
    candidate: str = ""
    """The candidate it evaluated (gate and counterfactual rounds)."""
    stage_round: int = -1
    """The evolution round it belongs to (-1: none)."""
    first_attempt: int = 0
    """The number of its first attempt per task (attempts are ``first_attempt`` ..)."""


class AttemptMark(Payload, frozen=True, kw_only=True):
    """One attempt's verdict as its round's end records it (the ``attempt.finished`` on the log)."""

    task_id: str
    attempt: int
    passed: bool
    usage: Usage = Usage()
    """The tokens of the attempt's model calls (its ``AttemptFinished.usage``); zeros before hx counted them."""


class RoundFinished(Event, frozen=True, kw_only=True):
    """A round ended: how many attempts ran and passed, and each attempt's verdict.

    The verdicts sit on the round's own subject, so a reader that needs a round's outcomes (the
    audit re-checking a gate verdict, a task history of rounds) reads one message per round and
    never opens the attempts' frames.
    """

    TYPE = "round.finished"
    VERSION = 2
    READS = (1,)
    """Version 1 had no ``outcomes``."""
    LEVEL = "round"

    run_id: str
    round: int
    attempts: int = 0
    passed: int = 0
    outcomes: tuple[AttemptMark, ...] = ()
    """Every attempt's verdict as the log holds it, in task then attempt order (empty in version 1)."""
    usage: Usage = Usage()
    """The tokens of every model call of its attempts, kept when ``outcomes`` is left out (zeros: none counted)."""


class AttemptStarted(Event, frozen=True, kw_only=True):
    """One attempt at one task began."""

    TYPE = "attempt.started"
    LEVEL = "attempt"
    CHANNEL = "started"

    run_id: str
    round: int
    task_id: str
    attempt: int
    harness_digest: str = ""
    model: str = ""
    seed: int = 0


class AttemptFinished(Event, frozen=True, kw_only=True):
    """One attempt ended: the verdict that task history and pass@k are built from."""

    TYPE = "attempt.finished"
    LEVEL = "attempt"
    CHANNEL = "finished"

    run_id: str
    round: int
    task_id: str
    attempt: int
    passed: bool
    score: float = 0.0
    steps: int = 0
    status: AttemptStatus = "completed"
    reason: str = ""
    """Why an attempt was interrupted or failed for infrastructure reasons."""
    usage: Usage = Usage()
    """The summed ``usage`` of every ``model.response`` on the attempt's trace (the agent's calls and a judge's)."""


later_fields(AttemptFinished, {"usage": Usage()})
later_fields(RoundFinished, {"usage": Usage(), "outcomes": [{"usage": Usage()}]})
