"""RoundLog: one structlog line per decided round (outcome and counts); it appends nothing to the ledger.

Enable it by adding it to a run's stages, e.g. ``Parts(evolver, stages=(RoundLog(),))``. It runs
after ``Decide``; a round decided just before a kill is not logged again on resume (a decided
round does not run again), so the log line is a report, never a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from hx.aegis.stage import RoundContext

log = structlog.get_logger("hx.aegis")


@dataclass
class RoundLog:
    """Logs ``round decided`` with the round, its outcome and its counts."""

    name: str = ""
    after_end: bool = True

    async def recorded(self, ctx: RoundContext) -> dict[str, Any] | None:
        """Nothing recorded: a log line is not on the ledger."""
        return None

    async def run(self, ctx: RoundContext) -> dict[str, Any]:
        """Log the decided round."""
        decision = ctx.decision
        digests = ctx.digested.digests if ctx.digested is not None else ()
        line: dict[str, Any] = {
            "run_id": ctx.run.run_id, "round": ctx.round, "outcome": decision.outcome if decision else None,
            "tasks": len(digests), "solved": sum(d.solved for d in digests), "candidates": len(ctx.candidates),
            "shipped": len(decision.shipped) if decision else 0,
            "rollouts": decision.metrics.rollouts if decision else 0}
        log.info("round decided", **line)
        return line

    def take(self, ctx: RoundContext, output: dict[str, Any]) -> None:
        """Nothing for later stages."""

    def show(self, output: dict[str, Any]) -> str:
        """The logged fields."""
        return " ".join(f"{k}={v}" for k, v in output.items() if k != "run_id")
