"""Co-evolution (paper section 5): AEGIS evolves the harness and the learner trains the policy, on one log.

Per round: the rollouts run with the current (harness, policy); AEGIS digests, proposes,
criticises, gates and ships as in ``hx evolve``; then the learner folds the same trace
into its replay buffer and takes its GRPO pass; the next round's rollouts use the new
policy. Three modes share that loop and the held-out split:

- ``harness``: the policy stays at its first version, AEGIS edits the harness;
- ``model``: the harness stays as it is (a frozen evolver), the learner trains;
- ``both``: both move.

With ``learn_after_stall`` (``both`` only), the learner waits for the harness search to stall:
it takes its first pass after the first round that ships no edit, and from then on trains
after every round. Until then the rollouts run under the first policy, so those rounds are
the harness-only run's, and the first pass sees every round of the buffer's window (the
trajectories of each harness version so far, one cross-harness group per task). The paper
observes that its co-evolution and harness-only curves coincide until joint training takes
effect; this makes that order explicit: edits first, while they still ship, then the policy
learns what the edits could not fix, without the two racing for the same fault.

With the policy gate on, a new policy is adopted for the rollouts only when it keeps every
task the round solved in every attempt, as AEGIS's gate never lets an edit lose a solved
task: it plays them under the harness the next round uses, on the main rollouts' seeds, a
loss retried on fresh seeds (``Trials.kept``). A rejected policy gives way to its parent, for
the rollouts and for the learner's next pass. Without it, a policy that forgets a solved
task would show up in AEGIS's next digest as a regression of the edits shipped in between.

With ``rest_barren`` R, a task whose last R played rounds failed every attempt sits out the
next R rounds (``hx.aegis.resting``): its rollouts would give the learner no group to learn
from, and the budget they would spend buys other tasks' rounds and more passes.

A rollout budget (attempts, harness and policy gate rollouts included) ends a run as soon as
it is spent, so the three modes can be compared on equal rollouts. The learner is the same
consumer as ``hx learn``: resumed, it picks up at its last record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import msgspec

from hx.aegis.job import EvolveJob
from hx.aegis.ledger import Ledger
from hx.aegis.resting import resting
from hx.aegis.settings import CoevolveMode
from hx.aegis.state import RunState
from hx.aegis.trials import Trials
from hx.learner.store import PolicyStore
from hx.learner.trainer import Learner, LearnerSettings
from projections.ledger import RunLedger
from schemas.identities import PolicyVersion, policy_spec, short
from schemas.learn import PolicyGated, PolicyUpdated, UpdateSkipped
from schemas.ledger import RoundDecided

LearnerRecord = PolicyUpdated | UpdateSkipped | PolicyGated


class CoevolveSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What co-evolution adds to an evolution job: the mode, the rollout budget, the learner."""

    mode: CoevolveMode = "both"
    budget: int = 0
    """Attempts (main, gate and retry rollouts; held-out excluded) after which no new round starts; 0: no budget."""
    learner: LearnerSettings = LearnerSettings()
    policy_gate: bool = False
    """Adopt a new policy only when it keeps the tasks the round solved in every attempt (``--policy-gate``)."""
    learn_after_stall: bool = False
    """``both``: the learner starts after the first round that ships no edit (``--learn-after-stall``)."""
    rest_barren: int = 0
    """R: a task whose last R played rounds failed every attempt sits out R rounds (``--rest-barren``); 0: never."""


class CoevolveJob(EvolveJob, frozen=True, kw_only=True):
    """An ``hx coevolve`` job: an evolution job and what co-evolution adds (its own type, not an optional field
    of ``EvolveJob``, because its learner settings bring JAX, which plain evolution runs never load)."""

    coevolving: ClassVar[bool] = True
    coevolve: CoevolveSettings


@dataclass
class Coevolution:
    """Keeps the trials' model at the learner's current policy and trains it after each round (the loop's
    ``RunHooks``: ``spent`` before a round, ``after_round`` after one; ``resting`` goes to the ``Rollouts`` stage)."""

    learner: Learner
    trials: Trials
    settings: CoevolveSettings
    ledger: Ledger
    rollouts: int = 0
    """Attempts spent by the decided rounds and the policy gate."""
    on_update: Callable[[LearnerRecord], None] = field(default=lambda record: None)

    @classmethod
    def of(cls, ledger: Ledger, trials: Trials, settings: CoevolveSettings) -> Coevolution:
        """The co-evolution of a run, with the budget its decided rounds spent (a resumed run's)."""
        spent = sum(d.metrics.rollouts for d in RunLedger.of(ledger.records).decisions.values())
        # one store for both sides: the policy a pass files is the one the next rollouts' providers serve
        store = trials.resources.setdefault(PolicyStore, PolicyStore)
        learner = Learner(trials.log, ledger.run_id, settings.learner, store=store)
        return cls(learner, trials, settings, ledger, rollouts=spent)

    @property
    def version(self) -> PolicyVersion:
        """The policy the rollouts use now."""
        return self.learner.position.version

    async def start(self) -> None:
        """Open the learner (its first policy, or where it stopped), train on anything not yet trained on."""
        position = await self.learner.open()
        self.rollouts += sum(r.rollouts for r in position.updates if isinstance(r, PolicyGated))
        if self.learning:
            await self._update()  # a pass cut off before its record, or one a stopped run still owes
            if self.settings.policy_gate and position.ungated is not None:
                await self._gate(position.ungated)  # stopped between the pass and its verdict
        self._use()

    @property
    def learning(self) -> bool:
        """Whether the learner trains after a round: never in ``harness`` mode; in ``both`` with
        ``learn_after_stall``, only once a decided round shipped nothing (read from the ledger, so a
        resumed run agrees with the one that stopped)."""
        if self.settings.mode == "harness":
            return False
        if self.settings.mode == "model" or not self.settings.learn_after_stall:
            return True
        return any(d.idle for d in RunLedger.of(self.ledger.records).decisions.values())

    def _use(self) -> None:
        # only the task agent changes: judge, other roles, fallbacks and parameters stay as configured
        self.trials.models = msgspec.structs.replace(self.trials.models, main=policy_spec(self.version))

    async def _update(self) -> None:
        record = await self.learner.update()
        if record is None:
            return
        self.on_update(record)
        if isinstance(record, PolicyUpdated) and self.settings.policy_gate:
            await self._gate(record)

    async def _gate(self, update: PolicyUpdated) -> PolicyGated:
        """Judge the pass's new policy on the tasks the last digested round solved; record the verdict."""
        state = RunState.of(self.ledger.records)
        last = max(state.digests, default=None)
        digested = state.ledger.rounds[last].digested if last is not None else None
        before = self.trials.rollouts
        lost: list[str] = []
        rounds: list[int] = []
        solved = 0
        if digested is not None:
            self.trials.stage_round = digested.round
            models = msgspec.structs.replace(self.trials.models, main=policy_spec(update.version))
            for name, variant in sorted(state.live().items()):
                # Only what the parent solved in every attempt: a near-uniform policy solves many tasks by
                # luck, and no policy, however good, repeats every lucky draw (the gate would reject all).
                tasks = [d.task for d in digested.digests if d.variant == name and d.solved and d.passes == d.attempts]
                if not tasks:
                    continue
                solved += len(tasks)
                gone, trace_rounds = await self.trials.kept(variant.harness, name, tasks, models,
                                                            candidate=policy_spec(short(update.version)))
                lost += gone
                rounds += trace_rounds
        spent = self.trials.rollouts - before
        self.rollouts += spent
        verdict = PolicyGated(run_id=update.run_id, learner=update.learner, through_round=update.through_round,
                              candidate=update.version, parent=update.parent, adopted=not lost, solved=solved,
                              lost=tuple(lost), rollouts=spent, trace_rounds=tuple(rounds))
        await self.learner.gated(verdict)
        self.on_update(verdict)
        return verdict

    async def after_round(self, decision: RoundDecided) -> str:
        """Train on the round (unless the model is frozen); a reason to stop when the budget is spent."""
        self.rollouts += decision.metrics.rollouts
        if self.learning:
            await self._update()
            self._use()
        return self.spent()

    def resting(self, state: RunState, t: int) -> frozenset[str]:
        """The adaptation tasks that sit out round ``t``: the barren ones (``hx.aegis.resting``)."""
        return resting(state.digests, self.trials.splits.adaptation, t, self.settings.rest_barren)

    def spent(self) -> str:
        """Why no new round may start: the rollout budget is spent (empty while it is not)."""
        budget = self.settings.budget
        if budget and self.rollouts >= budget:
            return f"rollout budget spent ({self.rollouts:,} of {budget:,} attempts)"
        return ""
