"""The model in force: the task agent's model recorded before the round's rollouts when it changed."""

from __future__ import annotations

from dataclasses import dataclass

from hx.aegis.stage import RoundContext
from hx.replay.ledger_view import headline
from schemas.ledger import ModelChanged


@dataclass
class ModelInForce:
    """Appends ``ModelChanged`` when the trials' model differs from the ledger's (co-evolution's new policy)."""

    name: str = "model"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> tuple[ModelChanged, ...] | None:
        """Nothing owed once the round is digested (its rollouts ran under the recorded model) or the model is
        the ledger's; None when a change is still to be recorded."""
        model = ctx.run.trials.models.public().main  # the ledger records specs masked
        if ctx.records.digested is not None or model == ctx.run.state().model:
            return ()
        return None

    async def run(self, ctx: RoundContext) -> tuple[ModelChanged, ...]:
        """Record the change."""
        run = ctx.run
        changed = ModelChanged(run_id=run.run_id, round=ctx.round, model=run.trials.models.public().main,
                               previous=run.state().model)
        await run.append(changed)
        return (changed,)

    def take(self, ctx: RoundContext, output: tuple[ModelChanged, ...]) -> None:
        """Nothing for later stages: the state folds the change."""

    def show(self, output: tuple[ModelChanged, ...]) -> str:
        """The new model, if it changed, as ``hx ledger`` shows it."""
        return headline(output[0]) if output else ""
