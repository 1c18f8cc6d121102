"""Co-evolution (paper section 5): AEGIS evolves the harness and the learner trains the policy, on one log.

Per round: the rollouts run with the current (harness, policy); AEGIS digests, proposes,
criticises, gates and ships as in ``hx evolve``; then the learner folds the same trace
into its replay buffer and takes its GRPO pass; the next round's rollouts use the new
policy. Three modes share that loop and the held-out split:

- ``harness``: the policy stays at its first version, AEGIS edits the harness;
- ``model``: the harness stays as it is (a frozen evolver), the learner trains;
- ``both``: both move.

A rollout budget (attempts, gate rollouts included) ends a run as soon as it is spent, so
the three modes can be compared on equal rollouts. The learner is the same consumer as
``hx learn``: resumed, it picks up at its last record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hx.aegis.settings import CoevolveMode
from hx.aegis.trials import Trials
from hx.learner.trainer import Learner, LearnerSettings
from schemas.learn import PolicyUpdated, UpdateSkipped
from schemas.ledger import RoundDecided
from streams.log import EventLog


class CoevolveSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What co-evolution adds to an evolution job: the mode, the rollout budget, the learner."""

    mode: CoevolveMode = "both"
    budget: int = 0
    """Attempts (main, gate and retry rollouts; held-out excluded) after which no new round starts; 0: no budget."""
    learner: LearnerSettings = LearnerSettings()


@dataclass
class Coevolution:
    """Keeps the trials' model at the learner's current policy and trains it after each round."""

    learner: Learner
    trials: Trials
    settings: CoevolveSettings
    rollouts: int = 0
    """Attempts spent by the decided rounds."""
    on_update: Callable[[PolicyUpdated | UpdateSkipped], None] = field(default=lambda record: None)

    @classmethod
    def of(cls, log: EventLog, run_id: str, trials: Trials, settings: CoevolveSettings,
           decided: Sequence[Any] = ()) -> Coevolution:
        """The co-evolution of a run; ``decided`` are its ledger records so far (a resumed run's spent budget)."""
        spent = sum(r.metrics.rollouts for r in decided if isinstance(r, RoundDecided))
        return cls(Learner(log, run_id, settings.learner), trials, settings, rollouts=spent)

    @property
    def version(self) -> str:
        """The policy the rollouts use now."""
        return self.learner.position.version

    async def start(self) -> None:
        """Open the learner (its first policy, or where it stopped), train on anything not yet trained on."""
        await self.learner.open()
        if self.settings.mode != "harness":
            await self._update()
        self._use()

    def _use(self) -> None:
        # only the task agent changes: judge, other roles, fallbacks and parameters stay as configured
        self.trials.models = msgspec.structs.replace(self.trials.models, main=f"policy:{self.version}")

    async def _update(self) -> None:
        record = await self.learner.update()
        if record is not None:
            self.on_update(record)

    async def after_round(self, decision: RoundDecided) -> str:
        """Train on the round (unless the model is frozen); a reason to stop when the budget is spent."""
        self.rollouts += decision.metrics.rollouts
        if self.settings.mode != "harness":
            await self._update()
            self._use()
        return self.spent()

    def spent(self) -> str:
        """Why no new round may start: the rollout budget is spent (empty while it is not)."""
        budget = self.settings.budget
        if budget and self.rollouts >= budget:
            return f"rollout budget spent ({self.rollouts:,} of {budget:,} attempts)"
        return ""
