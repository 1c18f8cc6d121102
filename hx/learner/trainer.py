"""The learner: a consumer of a run's trace that trains the policy (GRPO, or another algorithm) after each round.

It never rolls out. It folds the run's trace into the replay-buffer projection, and when
rounds have finished since its last update it takes one training pass over the buffer:
trajectories grouped by task across harness and model versions, group-relative
advantages (the learner algorithm's, ``hx.learner.algorithm``), clipped steps against the
behaviour log-probabilities logged when the samples were produced. The new policy goes to
the object store and a ``PolicyUpdated`` record to ``HX_LEARN``; a pass with nothing to
learn from is an ``UpdateSkipped``.

Its position is its last record: the round it trained through, the trace position of that
round's end and the policy it produced. Killed and restarted, it rebuilds the buffer as of
that position and goes on from there, so no round is trained on twice; a pass cut off
before its record is redone from the same parent, buffer and seed, and gives the same
policy (the record's message id deduplicates a retried append).
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import jax
import msgspec
from msgspec import UNSET, UnsetType

from hx.learner import checkpoint
from hx.learner.algorithm import Algorithm, algorithm_of
from hx.learner.errors import NonFiniteLoss, PolicyError, Unservable
from hx.learner.grpo import GRPOConfig
from hx.learner.minibatches import Minibatches, TurnKey
from hx.learner.policy import Batch, Policy, Sample
from hx.learner.policy_gradient import PolicyGradientConfig
from hx.learner.provider import resolve_version
from hx.learner.rloo import RLOOConfig
from hx.learner.step_groups import turn_advantages
from hx.learner.store import PolicyStore
from hx.learner.train_step import PolicyTrainer, RoundMetrics
from projections.buffer_snapshot import BufferState
from projections.replay_buffer import ReplayBuffer, groups
from projections.runner import ProjectionRunner
from projections.trajectories import Trajectory
from schemas.identities import NO_VERSION, PolicyVersion
from schemas.learn import PolicyGated, PolicyInitialised, PolicyUpdated, UpdateSkipped
from streams.errors import ConcurrencyConflict
from streams.log import EventLog
from streams.topology import LEARN, subject_token

AlgorithmConfig = GRPOConfig | RLOOConfig
"""The config of a learner algorithm, tagged with its name (``{"name": "rloo", ...}``)."""
_CONFIGS: tuple[type[PolicyGradientConfig], ...] = get_args(AlgorithmConfig) or (AlgorithmConfig,)


class LearnerSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a learner trains and how: recorded on its ``PolicyInitialised``."""

    learner: str = "default"
    kind: str = "scorer"
    config: dict[str, int | float] = {}
    """The fresh policy kind's settings (sizes; the scorer's ``context_gain``)."""
    init: str = ""
    """Start from this stored checkpoint version instead of a fresh policy."""
    init_seed: int = 0
    window: int = 4
    """Trace rounds the replay buffer holds."""
    per_trajectory: bool = True
    """Weigh every trajectory the same in a pass, however many turns it has (else every turn the same)."""
    off_policy_turns: bool = False
    """Train on turns an after_model processor changed (their log-probs then describe another completion)."""
    step_weight: float = 1.0
    """Weight of step-level advantages (``hx.learner.step_groups``) added to each turn's; 0 turns them off."""
    step_discount: float = 0.95
    """Discount per remaining turn of a step-level return."""
    algorithm: AlgorithmConfig = GRPOConfig()
    """The learner algorithm (its config's tag) and its hyper-parameters."""
    grpo: GRPOConfig | UnsetType = UNSET
    """Read only: settings recorded before the learner named its algorithm held GRPO's config here."""

    def __post_init__(self) -> None:
        if not isinstance(self.grpo, UnsetType):  # the old shape: it was GRPO, with this config
            msgspec.structs.force_setattr(self, "algorithm", self.grpo)
            msgspec.structs.force_setattr(self, "grpo", UNSET)
        if not isinstance(self.algorithm, _CONFIGS):  # recorded settings must read back
            raise PolicyError(f"LearnerSettings.algorithm: {type(self.algorithm).__name__} is not one of "
                              f"{', '.join(t.__name__ for t in _CONFIGS)} (hx.learner.trainer.AlgorithmConfig)")
        # NaN fails both checks: isfinite, and every comparison
        if not (math.isfinite(self.step_weight) and self.step_weight >= 0):
            raise PolicyError(f"LearnerSettings.step_weight must be >= 0 and finite, got {self.step_weight!r}")
        if not (0 < self.step_discount <= 1):
            raise PolicyError(f"LearnerSettings.step_discount must be in (0, 1], got {self.step_discount!r}")


def learn_subject(run_id: str, learner: str) -> str:
    """Where a learner of a run writes."""
    return f"{LEARN.subjects[0].rstrip('>')}{subject_token(run_id)}.{subject_token(learner)}"


@dataclass
class LearnerPosition:
    """Where a learner stands: its starting policy, its current policy, the round it trained through."""

    initial: PolicyVersion = NO_VERSION
    version: PolicyVersion = NO_VERSION
    through_round: int = -1
    seq: int = 0
    """Trace sequence of the last record folded into the update."""
    updates: list[PolicyUpdated | UpdateSkipped | PolicyGated] = field(default_factory=list)
    """Every pass's record and every gate verdict, in order."""

    @property
    def ungated(self) -> PolicyUpdated | None:
        """The last pass's new policy when no gate has judged it yet (a gated run was stopped in between)."""
        last = self.updates[-1] if self.updates else None
        return last if isinstance(last, PolicyUpdated) else None


class Learner:
    """Trains one run's policy from its trace; ``catch_up`` and ``update`` are the whole cycle."""

    def __init__(self, log: EventLog, run_id: str, settings: LearnerSettings | None = None, *,
                 store: PolicyStore | None = None) -> None:
        self.log = log
        self.store = store if store is not None else PolicyStore()
        """Where each new policy is filed: the store the session's ``policy:`` providers serve from."""
        self.run_id = run_id
        self.settings = settings or LearnerSettings()
        self.subject = learn_subject(run_id, self.settings.learner)
        self.buffer = ProjectionRunner(log, ReplayBuffer(run_id, window=self.settings.window,
                                                         owner=self.settings.learner), checkpoint_every=10**12)
        self._last = 0
        """Sequence of this learner's last record on ``HX_LEARN``: the next record is appended only after it."""
        self.position = LearnerPosition()
        self.policy: Policy | None = None
        self.reference: Policy | None = None
        self.trainer: PolicyTrainer | None = None
        self.algorithm: Algorithm[Any] = algorithm_of(self.settings.algorithm)
        self._behaviour: dict[str, Policy] = {}
        self.minibatches = Minibatches()

    # --- position -----------------------------------------------------------------------------

    async def open(self) -> LearnerPosition:
        """Read this learner's records, create its first policy if it has none, rebuild the buffer to its position."""
        pos = LearnerPosition()
        async for rec in self.log.read(LEARN.name, subjects=[self.subject]):
            ev = rec.event
            self._last = rec.seq
            if isinstance(ev, PolicyInitialised):
                self._check_settings(ev)
                pos.initial = pos.version = ev.version
            elif isinstance(ev, PolicyUpdated | UpdateSkipped):
                pos.updates.append(ev)
                pos.through_round = ev.through_round
                pos.seq = ev.trace_seq
                if isinstance(ev, PolicyUpdated):
                    pos.version = ev.version
            elif isinstance(ev, PolicyGated):
                pos.updates.append(ev)
                pos.version = ev.candidate if ev.adopted else ev.parent
        if not pos.initial:
            pos.initial = pos.version = await self._initialise()
        self.position = pos
        self.policy = await checkpoint.fetch(self.log, pos.version)
        if self.settings.algorithm.needs_reference:
            self.reference = await checkpoint.fetch(self.log, pos.initial)
        self.trainer = PolicyTrainer(self.policy.model, self.settings.algorithm, self.algorithm)
        await self.buffer.load()
        if self.buffer.position[0] != pos.seq:  # the buffer's checkpoint is not this learner's: fold to its position
            await self.buffer.reset()
            if pos.seq:
                await self.buffer.catch_up(stop=pos.seq, checkpoint=False)
        return pos

    def _check_settings(self, first: PolicyInitialised) -> None:
        """Refuse settings that contradict how this learner began: its records would describe another policy."""
        recorded = first.config
        mine = msgspec.to_builtins(self.settings)
        differ = [k for k in ("kind", "config", "init", "init_seed") if recorded.get(k) != mine.get(k)]
        if differ:
            shown = ", ".join(f"{k} {recorded.get(k)!r} (asked: {mine.get(k)!r})" for k in differ)
            raise PolicyError(f"learner {self.settings.learner!r} of run {self.run_id!r} began with {shown}; "
                              "resume it with those settings or give this one another --learner name")

    async def _initialise(self) -> PolicyVersion:
        s = self.settings
        if s.init:
            policy = await checkpoint.fetch(self.log, await resolve_version(self.log, s.init))
        else:
            policy = checkpoint.create(s.kind, s.config, seed=s.init_seed)
        ver, _ = await checkpoint.store(self.log, policy)
        await self._append(PolicyInitialised(run_id=self.run_id, learner=s.learner, version=ver, kind=policy.kind,
                                             algorithm=self.algorithm.name, config=msgspec.to_builtins(s)), "init")
        return ver

    async def _append(self, record: PolicyInitialised | PolicyUpdated | UpdateSkipped | PolicyGated,
                      what: str) -> None:
        """Append a record after this learner's last one: a second learner of the same name is refused, not merged."""
        try:
            done = await self.log.append(self.subject, record, key=f"{self.subject}#{what}",
                                         expected_last_seq=self._last)
        except ConcurrencyConflict:
            raise self._conflict() from None
        if done.duplicate:  # the same pass was recorded before (a retry, or a twin learner): only the same record
            stored = [r.event async for r in self.log.read(LEARN.name, start=done.seq, stop=done.seq,
                                                           subjects=[self.subject])]
            if [_timeless(r) for r in stored] != [_timeless(record)]:
                raise self._conflict()
        self._last = done.seq

    def _conflict(self) -> PolicyError:
        return PolicyError(f"another learner named {self.settings.learner!r} is writing to run {self.run_id!r}; "
                           "give this one another --learner name")

    # --- one cycle ----------------------------------------------------------------------------

    async def catch_up(self) -> int:
        """Fold the trace into the buffer up to its current end; the last round finished in the buffer."""
        await self.buffer.catch_up(checkpoint=False)  # checkpointed with the pass's record, never between
        state = self.buffer.state
        return max(state.rounds, default=-1)

    async def update(self, progress: Callable[[str], None] | None = None) -> PolicyUpdated | UpdateSkipped | None:
        """Train once over the buffer if rounds finished since the last update; its record (None: nothing new)."""
        assert self.policy is not None and self.trainer is not None, "open() first"
        last = await self.catch_up()
        if not self._news(last):
            return None
        began = time.perf_counter()
        state: BufferState = self.buffer.state
        samples, skipped, used, dropped = await self.samples(state)
        # A pass (encoding, then the steps) takes seconds to minutes: on a worker thread, so the event
        # loop keeps serving the NATS connection meanwhile (its pings, and the server's: a client that
        # misses two is dropped as stale). Nothing else touches the policy until the pass returns.
        batches = await asyncio.to_thread(self.minibatches.of_pass, self.policy, self.reference, samples,
                                          self.settings.algorithm, skipped, last)
        parent, seq = self.position.version, self.buffer.position[0]
        common: dict[str, Any] = {"run_id": self.run_id, "learner": self.settings.learner, "through_round": last,
                                  "trace_seq": seq, "rounds": tuple(state.rounds), "parent": parent}
        record: PolicyUpdated | UpdateSkipped
        if not batches:
            record = UpdateSkipped(**common, reason="no_usable_group", groups_skipped=dropped, skipped=dict(+skipped))
        else:
            try:
                metrics = await asyncio.to_thread(self._train, batches)
            except NonFiniteLoss as exc:
                await self._restore(parent)
                record = UpdateSkipped(**common, reason="non_finite", groups_skipped=dropped,
                                       skipped={**(+skipped), "non_finite": len(samples)})
                if progress:
                    progress(f"update skipped: {exc}")
            else:
                files = checkpoint.files_of(self.policy)
                version, size = await checkpoint.store_files(self.log, files)
                record = PolicyUpdated(**common, version=version, kind=self.policy.kind, steps=metrics.steps,
                                       samples=len(samples) - skipped["unservable"] - skipped["unit_mismatch"],
                                       groups_used=used, groups_skipped=dropped,
                                       skipped=dict(+skipped), loss=metrics.loss, kl=metrics.kl,
                                       clip_fraction=metrics.clip_fraction, entropy=metrics.entropy,
                                       grad_norm=metrics.grad_norm, bytes=size,
                                       seconds=time.perf_counter() - began, device=jax.default_backend())
        await self._append(record, str(last))
        await self.buffer.checkpoint()
        self.position.through_round, self.position.seq = last, seq
        self.position.updates.append(record)
        if isinstance(record, PolicyUpdated):
            self.position.version = record.version
            self.store.put(record.version, checkpoint.from_files(files, "learner"), record.version)
        return record

    def _train(self, batches: list[Batch]) -> RoundMetrics:
        """One pass over ``batches`` from a fresh optimiser (run on a worker thread)."""
        assert self.trainer is not None
        self.trainer.reset_optimizer()  # a pass depends on its parent and samples only: restarts are exact
        return self.trainer.train(batches)

    def _news(self, last: int) -> bool:
        """Whether a round finished since the last pass: more trace rounds of the evolution round it trained
        through (co-evolution's policy gate rollouts) do not count, or a resumed run would train twice on it."""
        through = self.position.through_round
        if last <= through:
            return False
        state = self.buffer.state
        slot = state.slots.get(str(through))
        return slot is None or any(state.slots.get(str(r), r) != slot for r in state.rounds if r > through)

    async def gated(self, verdict: PolicyGated) -> None:
        """Record the gate's verdict on the last pass's policy; a rejected one gives way to its parent.

        The rollouts and the next pass then go on from the parent, as if the pass had not
        been taken; its samples stay in the window, so the next pass learns from them again.
        """
        pending = self.position.ungated
        if pending is None or pending.version != verdict.candidate or pending.parent != verdict.parent:
            raise PolicyError(f"learner {self.settings.learner!r} of run {self.run_id!r}: a gate verdict on "
                              f"{verdict.candidate[:12]} does not follow the pass that produced it")
        await self._append(verdict, f"gate-{verdict.through_round}")
        self.position.updates.append(verdict)
        if not verdict.adopted:
            self.position.version = verdict.parent
            await self._restore(verdict.parent)

    async def _restore(self, version: str) -> None:
        self.policy = await checkpoint.fetch(self.log, version)
        self.trainer = PolicyTrainer(self.policy.model, self.settings.algorithm, self.algorithm)

    # --- samples --------------------------------------------------------------------------------

    async def samples(self, state: BufferState) -> tuple[list[tuple[TurnKey, Sample]], Counter[str], int, int]:
        """The buffer's training samples (keyed by turn) with their advantages; skips, groups used, groups dropped."""
        skipped: Counter[str] = Counter()
        by_group: dict[str, list[Trajectory]] = {}
        for task, trajs in groups(state).items():
            # An infrastructure failure says nothing about the policy: its 0 would shift the others' advantages.
            fine = [t for t in trajs if t.status != "infra_failure"]
            skipped["infra_failure"] += sum(len(t.turns) for t in trajs) - sum(len(t.turns) for t in fine)
            if fine:
                by_group[task] = fine
        s = self.settings
        rule = functools.partial(self.algorithm.advantages, config=s.algorithm)
        advantages = turn_advantages(by_group, s.step_weight, s.step_discount, rule)
        used = [traj for task, trajs in by_group.items() if task in advantages for traj in trajs]
        mean_turns = sum(len(t.turns) for t in used) / max(len(used), 1)
        out: list[tuple[TurnKey, Sample]] = []
        for task, trajs in sorted(by_group.items()):
            if task not in advantages:
                continue
            for traj, adv in zip(trajs, advantages[task], strict=True):
                # Every turn is a sample, so a trajectory would weigh as many turns as it has: a failed
                # attempt that ran to its step limit would outweigh a short success. Scaled by
                # mean/own length, each trajectory weighs the same (the clipped loss is linear in A).
                weight = mean_turns / len(traj.turns) if self.settings.per_trajectory and traj.turns else 1.0
                out += await self._turns(traj, [a * weight for a in adv], skipped)
        return out, skipped, len(advantages), len(by_group) - len(advantages)

    async def _turns(self, traj: Trajectory, advantages: Sequence[float],
                     skipped: Counter[str]) -> list[tuple[TurnKey, Sample]]:
        out: list[tuple[TurnKey, Sample]] = []
        for turn, advantage in zip(traj.turns, advantages, strict=True):
            if turn.on_policy is False and not self.settings.off_policy_turns:
                skipped["off_policy"] += 1
                continue
            if float(turn.params.get("temperature", 1.0)) != 1.0:
                skipped["temperature"] += 1  # its log-probs are of a tempered distribution, training scores at 1
                continue
            if not all(math.isfinite(lp) and lp <= 1e-6 for lp in turn.logprobs):
                skipped["bad_logprobs"] += 1  # one would make every pass over the window non-finite
                continue
            sample = Sample(messages=turn.messages, tools=turn.tools, completion=turn.completion,
                            logprobs=tuple(turn.logprobs), advantage=advantage)
            if not sample.logprobs:
                rescored = await self._rescore(turn.model_version, sample)
                if rescored is None:
                    skipped["no_logprobs"] += 1
                    continue
                sample = rescored
            out.append(((traj.round, traj.task_id, traj.attempt, turn.step, turn.role), sample))
        return out

    async def _rescore(self, version: str, sample: Sample) -> Sample | None:
        """The sample with log-probs recomputed under its generating checkpoint, when that is a stored policy."""
        if version not in self._behaviour:
            if not (len(version) == 64 and await checkpoint.stored(self.log, version)):
                return None
            self._behaviour[version] = await checkpoint.fetch(self.log, version)
        try:
            (logprobs,) = self._behaviour[version].score([sample])
        except Unservable:
            return None
        return msgspec.structs.replace(sample, logprobs=logprobs)


def _timeless(record: Any) -> Any:
    """A record without its wall time (``seconds``): what two runs of the same pass agree on."""
    return msgspec.structs.replace(record, seconds=0.0) if isinstance(record, PolicyUpdated) else record
