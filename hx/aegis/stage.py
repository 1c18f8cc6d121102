"""A stage of an AEGIS round: what it reads, what it appends, how a resumed run finds it, how it is shown.

A round is an ordered list of stages (``hx.aegis.stages.pipeline`` gives today's: approved
ships, model in force, rollouts, digest, plan, propose, criticise, gate and ship, decide).
The loop runs each in turn on one ``RoundContext``::

    output = await stage.recorded(ctx)     # what the ledger already holds (a resumed run)
    if output is None:
        progress.stage(t, stage.name)      # the live line: "round 2/6 · plan"
        output = await stage.run(ctx)      # the work; it appends its ledger events
    stage.take(ctx, output)                # what later stages read; ctx.end(...) ends the round

Once a stage ends the round (a no-op, or the gate's outcome) only the stages that run
``after_end`` still run: ``Decide``, which appends the ``RoundDecided``, and any stage that
reports on the decided round (``RoundLog``). Adding a stage is one module implementing
``Stage`` and one entry in the list handed to ``Evolution`` (``Parts.stages`` for a run
started through ``run_evolution``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from hx.aegis.evolvers.base import Evolver
from hx.aegis.gate import Forbidden
from hx.aegis.settings import EvolveSettings
from hx.aegis.shipping import Run
from hx.aegis.trials import Trials
from projections.ledger_records import RoundRecords
from schemas.ledger import (
    CandidateProposed,
    CriticJudged,
    LandscapePlanned,
    RoundDecided,
    RoundDigested,
    RoundOutcome,
)

Out = TypeVar("Out")


class RoundRun(Run, Protocol):
    """What a stage may use of the run: its ledger (``state``, ``append``), trials, evolver, settings, forbidden."""

    trials: Trials
    evolver: Evolver
    settings: EvolveSettings
    forbidden: Forbidden


@dataclass(frozen=True)
class Played:
    """What the round's main rollouts played: their trace rounds, the variant each task ran under, who rested."""

    trace_rounds: tuple[int, ...]
    variants: dict[str, str]
    """Task -> the variant it ran under (empty when the rollouts were recorded: the digests say it)."""
    rested: frozenset[str]


@dataclass(frozen=True)
class Ending:
    """How a stage ended the round: the outcome ``Decide`` records, why, and the candidates shipped."""

    outcome: RoundOutcome
    reason: str
    shipped: tuple[str, ...] = ()


@dataclass
class RoundContext:
    """What a stage of round ``round`` reads: the run, and what the round's earlier stages produced."""

    round: int
    run: RoundRun
    played: Played | None = None
    """The main rollouts (``Rollouts``)."""
    digested: RoundDigested | None = None
    """The round's digests (``Digest``)."""
    landscape: LandscapePlanned | None = None
    """The adaptation landscape (``Plan``)."""
    candidates: list[CandidateProposed] = field(default_factory=list)
    """The candidates as proposed (``Propose``)."""
    notes: list[str] = field(default_factory=list)
    """Why the evolver proposed nothing, when it says (``Propose``)."""
    judged: CriticJudged | None = None
    """The critic's ranking (``Criticise``)."""
    ending: Ending | None = None
    """Set by the stage that ended the round; from then on only ``after_end`` stages run."""
    decision: RoundDecided | None = None
    """The round's decision (``Decide``)."""

    @property
    def records(self) -> RoundRecords:
        """What the ledger recorded for this round so far (on a resume; empty otherwise)."""
        return self.run.state().ledger.rounds.get(self.round) or RoundRecords(self.round)

    def end(self, outcome: RoundOutcome, reason: str, shipped: tuple[str, ...] = ()) -> None:
        """End the round with ``outcome`` (the first stage to end it wins)."""
        if self.ending is None:
            self.ending = Ending(outcome, reason, shipped)


class Stage(Protocol[Out]):
    """One step of an AEGIS round; ``Out`` is what it produces (usually the ledger event it appends)."""

    name: str
    """How the progress line names the stage while it runs ("" : not shown)."""
    after_end: bool
    """Whether it still runs once an earlier stage ended the round (``Decide`` and reports do)."""

    async def recorded(self, ctx: RoundContext) -> Out | None:
        """Its output as the ledger already holds it for ``ctx.round`` (a resumed run); None: it has to run."""
        ...

    async def run(self, ctx: RoundContext) -> Out:
        """Do the stage's work for ``ctx.round``, appending its ledger events; its output."""
        ...

    def take(self, ctx: RoundContext, output: Out) -> None:
        """Put the output where later stages read it (and ``ctx.end`` the round when it says so)."""
        ...

    def show(self, output: Out) -> str:
        """One line for the output, for the live progress ("" : nothing to show)."""
        ...


class RunHooks(Protocol):
    """What steers a run between its rounds (co-evolution's learner and rollout budget)."""

    def spent(self) -> str:
        """Why no new round may start (a spent budget); "" while one may."""
        ...

    async def after_round(self, decision: RoundDecided) -> str:
        """Called after each decided round (the learner's pass); a non-empty answer ends the run, as reason."""
        ...


CodeSource = Callable[[CandidateProposed], Awaitable[Sequence[str]]]
"""A candidate's new code as texts, for the gate's leakage scan."""
