"""ReplayBuffer: the learner's window of recent trajectories of one run, folded from the log.

A trajectory is one finished attempt with, per model turn of the trained roles, the exact
context the model saw (the logged ``ModelRequest``, its messages resolved from their
deltas), what it produced, the behaviour log-probabilities logged with it, and whether
the attempt went on with exactly that completion (``on_policy``: an after_model processor
may have changed it). The attempt's reward comes from its ``VerifierScore``.

The buffer holds the trajectories of the last ``window`` rounds of the run, FIFO: when a
round finishes and more than ``window`` are held, the oldest is evicted. In an evolution
run a round is an evolution round (``RoundStarted.stage_round``): its main, gate and retry
rollouts are trace rounds of their own, and they enter and leave the window together;
otherwise a round is a trace round. Attempts of
running rounds are held as partials (the conversation for delta resolution and the turns so
far) until they finish. Held-out rounds never enter, nor does any task a held-out round
evaluated (an adaptation round that listed one loses it too): training on the test split
would leak it. A round whose ``RoundStarted`` was not read has no known split, so it is
not admitted either.

The per-attempt extraction (``projections.trajectories``) is shared with
``hx.processors.training_bridge``, which turns the same records into RL records; the compact
checkpoint format is ``projections.buffer_snapshot``.

>>> buffer = ReplayBuffer("run-1")
>>> buffer.name, buffer.subjects, buffer.window, size(buffer.initial())
('replay_buffer.run-1', ('hx.trace.run-1.*.*.*',), 4, 0)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import ClassVar, cast

import msgspec

from projections.base import Projection
from projections.buffer_snapshot import ENCODER, BufferSnapshot, BufferState, restore, snapshot
from projections.trajectories import Partial, RewardField, Trajectory, absorb, trajectory
from schemas.envelope import Record
from schemas.hooks import HookRecord
from schemas.lifecycle import (
    AttemptFinished,
    AttemptStarted,
    RoundFinished,
    RoundStarted,
)
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import VerifierScore
from streams.topology import check_run_id, subject_token, trace_filter


def _trajectory_key(task_id: str, attempt: int) -> str:
    return f"{task_id}/{attempt}"


class ReplayBuffer(Projection[BufferState]):
    """The last ``window`` finished non-held-out rounds of one run, as trajectories, FIFO.

    ``ReplayBuffer(run_id, window, roles)`` gives an instance of a subclass made for that
    configuration (and cached), so that ``name`` and ``subjects`` stay class attributes,
    as the runner and the projection kit read them. The name is ``replay_buffer.<run>``
    for the defaults, plus a tag of the configuration otherwise: a checkpoint is never
    restored into a buffer of another window, roles or reward.
    """

    name: ClassVar[str] = "replay_buffer"
    reads = frozenset({RoundStarted.TYPE, RoundFinished.TYPE, AttemptStarted.TYPE, AttemptFinished.TYPE,
                       ModelRequest.TYPE, ModelResponse.TYPE, ModelError.TYPE, HookRecord.TYPE, VerifierScore.TYPE})
    state_type = BufferState
    version = 3
    """3: the window counts evolution rounds; 2: checkpoints are ``BufferSnapshot``s (1: the state in full)."""
    run_id: ClassVar[str] = ""
    window: ClassVar[int] = 4
    roles: ClassVar[tuple[str, ...]] = ("main",)
    """Model roles whose turns are samples: ``main``, plus any role the trained policy serves."""
    reward: ClassVar[RewardField] = "score"

    def __new__(cls, run_id: str, window: int = 4, roles: Sequence[str] = ("main",), *,
                reward: RewardField = "score", owner: str = "") -> ReplayBuffer:
        buffer: ReplayBuffer = object.__new__(_configured(run_id, window, tuple(roles), reward, owner))
        return buffer

    def initial(self) -> BufferState:
        """Nothing held."""
        return BufferState()

    def encode(self, state: BufferState) -> bytes:
        """The state as a ``BufferSnapshot``: each message and tool list once, contexts as deltas of indices."""
        return ENCODER.encode(snapshot(state))

    def decode(self, data: bytes) -> BufferState:
        """The state of a ``BufferSnapshot``, its turns sharing their messages again."""
        return restore(msgspec.msgpack.decode(data, type=BufferSnapshot))

    def fold(self, state: BufferState, record: Record) -> BufferState:
        """Admit, extend, finish or evict according to one record of the run."""
        ev = record.event
        if isinstance(ev, RoundStarted | RoundFinished | AttemptStarted) and ev.run_id != self.run_id:
            return state  # another run's records, folded without the subject filter
        if isinstance(ev, AttemptStarted):
            state.attempts.pop(record.subject, None)  # a re-run on the same subject starts over
            if ev.round in state.running and ev.task_id not in state.heldout_tasks:
                state.attempts[record.subject] = Partial(started=ev)
        elif isinstance(ev, AttemptFinished):
            partial = state.attempts.pop(record.subject, None)
            if partial is not None:
                traj = trajectory(partial, ev, self.reward)
                state.trajectories.setdefault(str(traj.round), {})[_trajectory_key(traj.task_id, traj.attempt)] = traj
        elif isinstance(ev, RoundStarted):
            self._round_started(state, ev)
        elif isinstance(ev, RoundFinished):
            self._round_finished(state, ev.round)
        else:
            partial = state.attempts.get(record.subject)
            if partial is not None and not absorb(partial, ev, self.roles):
                del state.attempts[record.subject]  # a wrong context is worse than none
                state.dropped += 1
        return state

    def _round_started(self, state: BufferState, ev: RoundStarted) -> None:
        if ev.split != "heldout" and ev.purpose != "heldout":
            if ev.round not in state.heldout_rounds and ev.round not in state.rounds:
                state.running.add(ev.round)
                state.slots[str(ev.round)] = ev.stage_round if ev.stage_round >= 0 else ev.round
            return
        state.heldout_rounds.add(ev.round)
        state.running.discard(ev.round)
        new = set(ev.task_ids) - state.heldout_tasks
        if not new:
            return
        state.heldout_tasks |= new
        # An adaptation round listed a task this held-out round evaluates: forget it there too.
        for subject in [s for s, p in state.attempts.items() if p.started.task_id in new]:
            del state.attempts[subject]
            state.dropped += 1
        for by_key in state.trajectories.values():
            for key in [k for k, t in by_key.items() if t.task_id in new]:
                del by_key[key]
                state.dropped += 1

    def _round_finished(self, state: BufferState, round: int) -> None:
        if round not in state.running:
            return
        state.running.discard(round)
        # Whatever of the round is still in flight will never finish: keep the partials bounded.
        for subject in [s for s, p in state.attempts.items() if p.started.round == round]:
            del state.attempts[subject]
            state.dropped += 1
        state.trajectories.setdefault(str(round), {})
        state.rounds.append(round)
        # The window counts slots: an evolution round's trace rounds (main, gate, retries) come and go together.
        slots = list(dict.fromkeys(state.slots.get(str(r), r) for r in state.rounds))
        while len(slots) > self.window:
            oldest = slots.pop(0)
            for r in [r for r in state.rounds if state.slots.get(str(r), r) == oldest]:
                state.rounds.remove(r)
                state.slots.pop(str(r), None)
                state.evicted += len(state.trajectories.pop(str(r), {}))


@lru_cache(maxsize=1024)
def _configured(run_id: str, window: int, roles: tuple[str, ...], reward: RewardField,
                owner: str = "") -> type[ReplayBuffer]:
    """The ``ReplayBuffer`` subclass of one configuration."""
    check_run_id(run_id)
    if window < 1:
        raise ValueError(f"a replay buffer holds at least one round, not window={window}")
    if not roles or not all(roles):
        raise ValueError(f"a replay buffer needs model roles to sample, got {roles!r}")
    if reward not in ("score", "reward", "passed"):
        raise ValueError(f"reward must be score, reward or passed, not {reward!r}")
    name = f"replay_buffer.{run_id}"
    if (window, roles, reward) != (4, ("main",), "score"):
        name += "." + hashlib.sha256(msgspec.json.encode([window, roles, reward])).hexdigest()[:10]
    if owner:  # a learner's own buffer: its checkpoint is nobody else's to reset
        name += f".{subject_token(owner)}"
    attrs = {"name": name, "subjects": (trace_filter(run_id),), "run_id": run_id, "window": window,
             "roles": roles, "reward": reward, "__module__": __name__}
    return cast("type[ReplayBuffer]", type(f"ReplayBuffer[{run_id}]", (ReplayBuffer,), attrs))


def rounds(state: BufferState) -> list[int]:
    """The finished rounds held, oldest first."""
    return list(state.rounds)


def trajectories(state: BufferState) -> list[Trajectory]:
    """Every trajectory of the rounds held, by round, task and attempt."""
    out = [t for r in state.rounds for t in state.trajectories.get(str(r), {}).values()]
    return sorted(out, key=lambda t: (state.rounds.index(t.round), t.task_id, t.attempt))


def size(state: BufferState) -> int:
    """How many trajectories the rounds held hold."""
    return sum(len(state.trajectories.get(str(r), {})) for r in state.rounds)


def groups(state: BufferState) -> dict[str, list[Trajectory]]:
    """The GRPO groups: trajectories by task, across rounds, harness versions and model versions."""
    out: dict[str, list[Trajectory]] = {}
    for t in trajectories(state):
        out.setdefault(t.task_id, []).append(t)
    return out
