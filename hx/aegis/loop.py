"""The AEGIS loop (Algorithm 1): run, digest, plan, propose, criticise, gate, ship; every step on the ledger.

Each round runs every variant on its tasks, digests the attempts (``alpha`` below which
the round is a no-op), plans the landscape (empty: no-op), asks the evolver for up to
``candidates`` candidates (none: no-op), lets the critic rank them (one revision at most;
no-op possible), and gates them in ranking order: per variant the first that passes ships
(bucket-disjoint ones with it), a split edit forks under ``ensemble``, a risky one waits
for a human. ``patience`` rounds in a row without a ship end the run early. The frozen
held-out split is evaluated before the first round and after the last (and every
``heldout_every`` rounds), never shown to a stage.

A round is an ordered list of stages (``hx.aegis.stage.Stage``; ``hx.aegis.stages.pipeline``
lists today's), each its own module; the loop runs them in turn on one ``RoundContext``.
Co-evolution steers the run between rounds through ``RunHooks`` (a spent budget stops it
before a round, the learner's pass runs after one).

Resuming is folding: the run's ledger says which rounds are decided and what the
undecided one already recorded (digests, landscape, candidates, verdicts); those are used
as recorded, and only what is missing runs. Rollouts are seeded per task and attempt, so
a rollout redone after a kill has the outcome the first would have had.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hx.aegis.errors import LedgerConflict, PipelineError
from hx.aegis.evolvers.base import Evolver
from hx.aegis.gate import Forbidden
from hx.aegis.ledger import Ledger
from hx.aegis.settings import EvolveSettings, Progress
from hx.aegis.stage import RoundContext, RunHooks, Stage
from hx.aegis.stages import pipeline
from hx.aegis.state import RunState
from hx.aegis.trials import Trials, game_scores
from hx.aegis.variants import route
from hx.harness.config import HarnessConfig
from hx.runtime.cancel import stop_if_cancelled
from projections.ledger import RunLedger
from schemas.ledger import (
    ApprovalGiven,
    EvolutionFinished,
    HeldoutScored,
    LedgerEvent,
    RoundDecided,
)


@dataclass
class Evolution:
    """One evolution run: its ledger, its trials, its evolver, and the stages of its rounds."""

    ledger: Ledger
    trials: Trials
    evolver: Evolver
    settings: EvolveSettings
    forbidden: Forbidden
    stages: Sequence[Stage[Any]] = field(default_factory=pipeline)
    """A round's stages in order (default: today's pipeline, deterministic critic, no approver)."""
    hooks: RunHooks | None = None
    """What steers the run between rounds (co-evolution); None: nothing does."""
    progress: Progress = field(default_factory=Progress)
    seconds: dict[int, float] = field(default_factory=dict)
    _folded: tuple[int, LedgerEvent, RunState] | None = field(default=None, init=False, repr=False)
    _built: dict[str, HarnessConfig] = field(default_factory=dict, init=False, repr=False)
    """Harnesses built from the ledger, by digest: every fold of the run shares them."""

    @property
    def run_id(self) -> str:
        """The run."""
        return self.ledger.run_id

    def state(self) -> RunState:
        """The run's state as its ledger has it now (folded again only when the ledger changed)."""
        records = self.ledger.records
        key = (len(records), records[-1])
        if self._folded is None or self._folded[0] != key[0] or self._folded[1] is not key[1]:
            # A fresh fold (a stage holding an earlier state keeps what it saw), sharing the built harnesses.
            state = RunState(RunLedger(), self._built)
            for record in records:
                state.fold(record)
            self._folded = (key[0], key[1], state)  # the record itself, not its id: never reused
        return self._folded[2]

    async def append(self, *events: LedgerEvent) -> None:
        """Append to the ledger; an approval answered meanwhile is folded in, any other writer is a conflict."""
        stop_if_cancelled()  # a stopped run appends nothing more, even when its cancellation was dropped
        known = len(self.ledger.records)
        try:
            await self.ledger.append(*events)
        except LedgerConflict:
            await self.ledger.load()
            news = self.ledger.records[known:]
            if not news or not all(isinstance(r, ApprovalGiven) for r in news):
                raise
            await self.ledger.append(*events)

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run (or finish) the loop: held-out first, then rounds until T or patience, then held-out again."""
        if self.state().ledger.finished is not None:
            return
        if not any(h.round == -1 for h in self.state().ledger.heldout):
            await self.heldout(-1)
        status: Literal["completed", "patience"] = "completed"
        reason = f"ran {self.settings.rounds} round(s)"
        while (t := self.state().next_round) < self.settings.rounds:
            stop_if_cancelled()
            if self.hooks is not None and (stop := self.hooks.spent()):
                reason = stop  # a run resumed after its last round spent the budget starts no new round
                break
            self.progress.round(t)
            began = time.perf_counter()
            decision = await self.round(t)
            self.seconds[t] = time.perf_counter() - began
            self.progress.decided(decision)
            stop = await self.hooks.after_round(decision) if self.hooks is not None else ""
            every = self.settings.heldout_every
            if every and (t + 1) % every == 0 and t + 1 < self.settings.rounds:
                await self.heldout(t)
            if stop:
                reason = stop
                break
            if decision.idle >= self.settings.patience:
                status, reason = "patience", f"{decision.idle} round(s) in a row without a ship"
                break
        last = self.state().next_round - 1
        if not any(h.round == last for h in self.state().ledger.heldout):
            await self.heldout(last)
        await self.append(EvolutionFinished(run_id=self.run_id, rounds=last + 1, status=status, reason=reason))

    async def heldout(self, after: int) -> HeldoutScored:
        """Evaluate the frozen held-out split under the current routing; aggregates go on the ledger."""
        state = self.state()
        self.trials.stage_round = max(after, 0)
        routes = {v: (state.variants[v].harness, tasks)
                  for v, tasks in route(state, self.trials.splits.heldout).items()}
        first, tasks, outcomes = await self.trials.heldout(routes)
        p1, p2, games = game_scores(outcomes, self.trials.settings.attempts)
        scored = HeldoutScored(run_id=self.run_id, round=after, trace_round=first,
                               heldout_digest=self.trials.splits.heldout_digest, tasks=tasks, pass_at_1=p1,
                               pass_at_2=p2, games=games)
        await self.append(scored)
        self.progress.heldout(scored)
        return scored

    # --- one round --------------------------------------------------------------------------

    async def round(self, t: int) -> RoundDecided:
        """Run round ``t`` (or finish it, on resume) through its stages and return its decision."""
        self.trials.stage_round, self.trials.rollouts = t, 0
        ctx = RoundContext(t, self)
        for stage in self.stages:
            if ctx.ending is not None and not stage.after_end:
                continue
            output = await stage.recorded(ctx)
            if output is None:
                if stage.name:
                    self.progress.stage(t, stage.name)
                output = await stage.run(ctx)
            stage.take(ctx, output)
            if stage.name and (line := stage.show(output)):
                self.progress.shown(t, stage.name, line)
        if ctx.decision is None:
            raise PipelineError(f"round {t}: no stage decided it (the pipeline ends with Decide)")
        return ctx.decision
