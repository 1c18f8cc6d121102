"""What a run's report shows, folded from its log: the export fold of its ledger and its learner's records.

``ReportData.of(records, learner)`` reuses the fold behind ``hx export`` (``RunFold``, its
``curves``) and the run report of ``hx evolve`` (``hx.replay.scoreboard.report``), and reduces them to
the figures' series: one ``RoundFigures`` per round, the held-out evaluations in ledger
order, and the learner's passes. It reads no clock and no memory: the same log gives the
same data.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hx.aegis import levers
from hx.replay.scoreboard import EvolutionReport, report
from hx.report.evals import EvalData
from hx.report.export import curves
from hx.report.export_fold import RunFold
from projections.ledger_records import RoundRecords
from projections.ledger_rules import RuleRecord
from schemas.edits import BUCKETS
from schemas.event import Event
from schemas.learn import PolicyGated, PolicyUpdated, UpdateSkipped
from schemas.ledger import HeldoutScored, LedgerEvent, RoundTokens
from streams.log import EventLog
from streams.topology import LEARN, subject_token

LearnerRecord = PolicyUpdated | UpdateSkipped


@dataclass(frozen=True)
class RoundFigures:
    """One round's numbers, as the figures plot them."""

    round: int
    outcome: str
    pass_at_k: float | None
    """Adaptation pass@k over all the round's tasks."""
    variants: dict[str, float]
    """Variant -> share of its tasks solved this round (pass@k)."""
    lever_mix: dict[str, int]
    """Shipped edits so far per bucket (``RoundMetrics.lever_mix``)."""
    proposed: dict[str, int]
    """Bucket -> candidates proposed this round that touch it."""
    passed: dict[str, int]
    """Bucket -> of those, candidates that passed the gate."""
    shipped: dict[str, int]
    """Bucket -> of those, candidates shipped or forked this round (``shipped / proposed``: the ship rate)."""
    predicted: dict[str, int]
    """Bucket -> flips predicted by this round's ships touching it, on tasks the next round ran."""
    realised: dict[str, int]
    """Bucket -> of those, flips that happened (``realised / predicted``: the hit rate, as ``levers.ship_outcome``)."""
    ships: int
    """Harness ships (``ledger.harness_shipped``) this round."""
    forks: int
    retirements: int
    regressions: int
    shipped_names: tuple[str, ...]
    took_s: float | None = None
    """Wall time from the previous round's decision (or the ledger's opening) to this round's, from the signed
    ``at_ns`` of the ledger events (None: undecided, or recorded before hx kept the time)."""
    tokens: RoundTokens | None = None
    """The round's tokens per meta-model stage and of the task agent (``RoundMetrics.tokens``; None: undecided, or
    decided before hx counted tokens)."""


@dataclass
class ReportData:
    """Everything the report page and its figures show."""

    run_id: str
    strategy: str
    benches: tuple[str, ...]
    model: str
    summary: EvolutionReport
    """The run report ``hx evolve`` prints: status, held-out before and after per game, live variants."""
    reason: str
    rounds: list[RoundFigures] = field(default_factory=list)
    heldout: list[HeldoutScored] = field(default_factory=list)
    """Every held-out evaluation in ledger order (round -1: before the first round)."""
    learner: list[LearnerRecord] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    """Passes (by the round they trained through) whose policy the policy gate rejected."""
    ledger_events: int = 0
    rules: list[RuleRecord] = field(default_factory=list)
    """The rules ships and forks put into the variants' harnesses, in order, with their fate
    (``projections.ledger_rules``)."""
    evals: EvalData = field(default_factory=EvalData)
    """The eval suite scores and experiment results about the run (``hx.report.evals``): set by the caller."""

    @classmethod
    def of(cls, records: Sequence[LedgerEvent], learner: Sequence[Event] = ()) -> ReportData:
        """Fold a run's ledger records and its learner records (``ReportError`` if the ledger does not fold)."""
        fold = RunFold.of(records)
        settings = fold.opened.settings
        summary = report(fold.ledger, {})
        updates = [r for r in learner if isinstance(r, PolicyUpdated | UpdateSkipped)]
        gates = [r for r in learner if isinstance(r, PolicyGated)]
        if updates:  # the report folds the ledger only; the learner's passes come from HX_LEARN
            summary.learner = [r for r in learner if isinstance(r, PolicyUpdated | UpdateSkipped | PolicyGated)]
            summary.policy = current_policy(learner)
        rows = {row["round"]: row for row in curves(fold)["rounds"]}
        ordered = fold.ordered()
        decided = [rnd.decided.at_ns if rnd.decided else 0 for rnd in ordered]
        return cls(run_id=fold.opened.run_id, strategy=fold.opened.strategy,
                   benches=tuple(str(b) for b in settings.get("benches", ())), model=str(settings.get("model", "")),
                   summary=summary, reason=fold.finished.reason if fold.finished else "",
                   rounds=_timed([round_figures(fold, rnd, rows[rnd.round]) for rnd in ordered],
                                 fold.opened.at_ns, decided),
                   heldout=list(fold.heldout), learner=updates,
                   rejected=[g.through_round for g in gates if not g.adopted], ledger_events=len(records),
                   rules=fold.rules())

    @property
    def coevolution(self) -> bool:
        """True when the run has learner passes (a co-evolution run)."""
        return bool(self.learner)

    def variant_names(self) -> list[str]:
        """Every variant that ran a round, in order of first appearance."""
        return list(dict.fromkeys(v for r in self.rounds for v in r.variants))


def _timed(rounds: list[RoundFigures], opened_ns: int, decided_ns: list[int]) -> list[RoundFigures]:
    """``rounds`` with each one's wall time, from one decision's signed time to the next."""
    out, since = [], opened_ns
    for figures, at in zip(rounds, decided_ns, strict=True):
        took = (at - since) / 1e9 if at and since else None
        out.append(replace(figures, took_s=took))
        since = at
    return out


def round_figures(fold: RunFold, rnd: RoundRecords, curve: dict[str, Any]) -> RoundFigures:
    """One round's figures from its records and its row of ``curves.json``."""
    digests = rnd.digested.digests if rnd.digested else ()
    tasks: Counter[str] = Counter(d.variant for d in digests)
    solved: Counter[str] = Counter(d.variant for d in digests if d.solved)
    shipped_ids = {c for s in rnd.ships for c in s.candidates}
    proposed: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    shipped: Counter[str] = Counter()
    for first in rnd.proposed:
        cid = first.candidate
        gate = rnd.gates.get(cid)
        for bucket in fold.final(cid).buckets:
            proposed[bucket] += 1
            passed[bucket] += bool(gate is not None and gate.passed)
            shipped[bucket] += cid in shipped_ids
    predicted: Counter[str] = Counter()
    realised: Counter[str] = Counter()
    for ship in fold.state.ships:
        if ship.round == rnd.round:
            p, r = levers.ship_outcome(fold.state, ship)
            for bucket in ship.buckets:
                predicted[bucket] += p
                realised[bucket] += r
    metrics = rnd.decided.metrics if rnd.decided else None
    return RoundFigures(
        round=rnd.round, outcome=str(curve["outcome"] or "undecided"), pass_at_k=curve["pass_at_k"],
        variants={v: solved[v] / n for v, n in tasks.items()},
        lever_mix={b: (metrics.lever_mix.get(b, 0) if metrics else 0) for b in BUCKETS},
        proposed={b: proposed[b] for b in BUCKETS}, passed={b: passed[b] for b in BUCKETS},
        shipped={b: shipped[b] for b in BUCKETS}, predicted={b: predicted[b] for b in BUCKETS},
        realised={b: realised[b] for b in BUCKETS},
        ships=sum(s.kind == "ship" for s in rnd.ships),
        forks=sum(s.kind == "fork" for s in rnd.ships), retirements=len(rnd.retired),
        regressions=int(curve["regressions"] or 0), shipped_names=tuple(c for s in rnd.ships for c in s.candidates),
        tokens=metrics.tokens if metrics else None)


def current_policy(learner: Sequence[Event]) -> str:
    """The policy the rollouts use after these learner records: the last new one, unless the gate rejected it."""
    version = ""
    for r in learner:
        if isinstance(r, PolicyUpdated):
            version = r.version
        elif isinstance(r, PolicyGated):
            version = r.candidate if r.adopted else r.parent
    return version


def learn_filter(run_id: str) -> str:
    """The ``HX_LEARN`` subjects of every learner of a run (``learn_subject`` with any learner)."""
    # Built here rather than imported from hx.learner.trainer, which loads JAX (seconds) for one string.
    return f"{LEARN.subjects[0].rstrip('>')}{subject_token(run_id)}.*"


async def learner_records(log: EventLog, run_id: str) -> list[Event]:
    """Every learner record of a run on ``HX_LEARN``, in log order (none for a run without a learner)."""
    return [r.event async for r in log.read(LEARN.name, subjects=[learn_filter(run_id)])]
