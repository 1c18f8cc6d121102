"""The learner's records on ``HX_LEARN``: the starting policy, every update, every skipped update.

A learner of a run writes to ``hx.learn.<run>.<learner>``. Each update names the trace
round it trained through: the learner resumes after the last one it finds, so a round is
never trained on twice, and the policy version it produced is a checkpoint in the object
store (``policy/<version>/...``). Figures are means over the round's optimiser steps.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, UnsetType

from schemas.event import Event
from schemas.identities import PolicyVersion


class PolicyInitialised(Event, frozen=True, kw_only=True):
    """A learner began from this policy: its first behaviour policy and its KL reference."""

    TYPE = "learn.policy_initialised"

    run_id: str
    learner: str = "default"
    version: PolicyVersion
    """Checkpoint version (sha256 of its files) in the object store."""
    kind: str
    algorithm: str | UnsetType = UNSET
    """The learner algorithm it trains with (an ``hx.algorithms`` name); unset on records written before algorithms
    were named, which trained with GRPO (unset, not a default: an old record encodes to the very bytes it was stored
    as)."""
    config: dict[str, Any] = {}
    """The learner's settings as plain data (``LearnerSettings``: it reads this back, old shapes too), no secrets."""


class LearnerPass(Event, frozen=True, kw_only=True):
    """Base of a learner pass's record: which run, learner and rounds, and the policy it started from."""

    run_id: str
    learner: str = "default"
    through_round: int
    """The last trace round of the run this pass has seen."""
    trace_seq: int = 0
    """The ``HX_TRACE`` sequence the buffer was folded to: where a restarted learner resumes."""
    rounds: tuple[int, ...] = ()
    """The trace rounds in the buffer's window at this pass."""
    parent: PolicyVersion
    """The policy version trained from."""
    groups_skipped: int = 0
    """Groups dropped because every trajectory had the same reward."""
    skipped: dict[str, int] = {}
    """Samples left out, by reason (``no_logprobs``, ``off_policy``, ``unservable``, ``unit_mismatch``)."""


class PolicyUpdated(LearnerPass, frozen=True, kw_only=True):
    """One training pass over the replay buffer after a round: the new policy and how the step went."""

    TYPE = "learn.policy_updated"

    version: PolicyVersion
    """The policy version produced."""
    kind: str = ""
    steps: int = 0
    samples: int = 0
    """Training samples (model turns) used."""
    groups_used: int = 0
    loss: float = 0.0
    kl: float = 0.0
    clip_fraction: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0
    bytes: int = 0
    """Size of the checkpoint."""
    seconds: float = 0.0
    device: str = ""
    """Where it trained (``cpu``, ``gpu``, ``tpu``)."""


class UpdateSkipped(LearnerPass, frozen=True, kw_only=True):
    """A round gave nothing to train on, or training failed safely: the policy stays as it was."""

    TYPE = "learn.update_skipped"

    reason: str
    """``no_usable_group`` (every group had one reward, or no sample could be scored) or ``non_finite``."""


class PolicyGated(Event, frozen=True, kw_only=True):
    """The policy gate's verdict on a new policy: adopted for the next rollouts, or rejected for losing solved tasks.

    Co-evolution runs it after a learner pass, as AEGIS gates an edit: the new policy plays
    the tasks the round solved in every attempt, under the harness the next round uses, on
    the main rollouts' seeds (a loss retried on fresh seeds). A rejected policy stays in the
    object store, but the rollouts and the learner's next pass go on from ``parent``.
    """

    TYPE = "learn.policy_gated"

    run_id: str
    learner: str = "default"
    through_round: int
    """The learner pass's round (its ``PolicyUpdated.through_round``)."""
    candidate: PolicyVersion
    """The policy version judged."""
    parent: PolicyVersion
    """The policy it would replace: what the rollouts keep when it is rejected."""
    adopted: bool
    solved: int = 0
    """Tasks it was judged on: those the round solved in every attempt (every live variant's)."""
    lost: tuple[str, ...] = ()
    """Solved tasks it failed in every attempt and retry."""
    rollouts: int = 0
    """Attempts the gate ran (counted in a co-evolution's rollout budget)."""
    trace_rounds: tuple[int, ...] = ()
