"""Regressions of a round: tasks whose pass@k state worsened against the round before, the ships between, the evidence.

A task is *lost* in round ``N`` when it was solved in round ``N-1`` (some of its ``k``
attempts passed) and is solved in none of round ``N``'s: the gate's seesaw definition,
computed by the planner's own ``regressions`` over the ledger's digests. A task still solved
whose share of passing attempts fell (``2/2 -> 1/2``) has *worsened*: k-aware, so listed
too, as a second group after the lost ones. For each one this
module gathers what an engineer needs to find the cause: the ships recorded between the two
rounds' rollouts (candidates, levers, manifests, operations), the failing attempts' verdicts
(status, reason, steps, the digest's failure category and evidence anchors), and the model
versions each round ran (a co-evolution run changes the policy between rounds too, so a
regression may be the model's), with the learner's updates in between.

It reads the run's ledger (one subject filter), the round-level trace events, and only the
attempt subjects of the regressed tasks in the two rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hx.harness.edits import describe
from hx.replay.errors import TimeTravelError
from hx.replay.timetravel import RunMarks, run_marks
from hx.replay.trace_rounds import read_decoded
from projections.ledger import RunLedger
from projections.ledger_records import CandidateRecord, ShipEvent
from schemas.edits import Anchor
from schemas.landscape import TaskDigest
from schemas.learn import PolicyGated, PolicyUpdated
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.model import ModelResponse
from streams.log import EventLog
from streams.topology import LEARN, TRACE, subject_token, trace_filter


@dataclass
class AttemptEvidence:
    """One attempt of a task in one round: where it ran and how it ended."""

    trace_round: int
    attempt: int
    passed: bool = False
    status: str = ""
    reason: str = ""
    steps: int = 0
    score: float = 0.0
    seed: int = 0
    harness: str = ""
    model: str = ""
    versions: set[str] = field(default_factory=set)
    """Model versions its responses reported (the policy version in a co-evolution run)."""


@dataclass
class ShipBetween:
    """A ship (or fork) recorded between the two rounds: what it changed and what it promised."""

    event: ShipEvent
    candidates: list[CandidateRecord]

    @property
    def operations(self) -> list[str]:
        """Its builder operations, one line each."""
        return [describe(op) for op in self.event.operations]


@dataclass
class Regression:
    """One regressed task with its digests of both rounds and its attempts in each."""

    task: str
    variant: str
    before: TaskDigest
    after: TaskDigest
    attempts_before: list[AttemptEvidence]
    attempts_after: list[AttemptEvidence]
    suspects: tuple[str, ...]
    """Candidates shipped to the task's variant between the rounds (the planner's suspects)."""

    @property
    def anchors(self) -> tuple[Anchor, ...]:
        """The failing round's evidence anchors (log positions on ``HX_TRACE``)."""
        return self.after.evidence


@dataclass
class RoundRegressions:
    """``hx regressions``: a round's regressions against the round before."""

    run: str
    round: int
    tasks: int
    regressions: list[Regression]
    """Lost: solved in round N-1, solved in no attempt of round N (the gate's seesaw rule)."""
    worsened: list[Regression]
    """Still solved, but a smaller share of the attempts passed (``2/2 -> 1/2``)."""
    ships: list[ShipBetween]
    policy_before: list[str]
    policy_after: list[str]
    updates: list[PolicyUpdated]
    """Learner updates between the two rounds' rollouts (co-evolution)."""
    gates: list[PolicyGated]
    """The policy gate's verdicts on those updates (``hx coevolve --policy-gate``)."""


def ledger_of(marks: RunMarks) -> RunLedger:
    """The run's ledger fold (a plain run has none: a ``TimeTravelError``)."""
    if marks.fold is None:
        raise TimeTravelError(f"run {marks.run!r} has no ledger: it is not an evolution run")
    return marks.fold


def check_pair(marks: RunMarks, state: RunLedger, round: int) -> None:
    """Raise ``TimeTravelError`` unless rounds ``round - 1`` and ``round`` were both digested."""
    known = sorted(state.digests)
    if round not in state.digests:
        have = f"rounds {known[0]}..{known[-1]}" if known else "no digested round"
        raise TimeTravelError(f"run {marks.run!r} has no round {round} ({have})")
    if round - 1 not in state.digests:
        raise TimeTravelError(f"round {round} of run {marks.run!r} has no round before it to compare with")


async def attempts_of(log: EventLog, run: str, trace_rounds: list[int], tasks: list[str]) -> dict[str, list[
        AttemptEvidence]]:
    """The attempts of ``tasks`` in ``trace_rounds``: one read of just those tasks' attempt subjects."""
    out: dict[str, dict[tuple[int, int], AttemptEvidence]] = {t: {} for t in tasks}
    subjects = [trace_filter(run, n, t) for n in trace_rounds for t in tasks]
    if not subjects:
        return {t: [] for t in tasks}
    async for r in read_decoded(log, TRACE.name, subjects, [AttemptStarted.TYPE, AttemptFinished.TYPE,
                                                            ModelResponse.TYPE], what=f"the attempts of run {run!r}"):
        ev = r.event
        parts = r.subject.split(".")
        task = next((t for t in tasks if subject_token(t) == parts[4]), None)
        if task is None:
            continue
        key = (int(parts[3]), int(parts[5]))
        a = out[task].setdefault(key, AttemptEvidence(*key))
        if isinstance(ev, AttemptStarted):
            a.seed, a.harness, a.model = ev.seed, ev.harness_digest, ev.model
        elif isinstance(ev, AttemptFinished):
            a.passed, a.status, a.reason, a.steps, a.score = ev.passed, ev.status, ev.reason, ev.steps, ev.score
        elif isinstance(ev, ModelResponse) and ev.model_version:
            a.versions.add(ev.model_version)
    return {t: [v for _, v in sorted(by.items())] for t, by in out.items()}


async def learner_updates(log: EventLog, run: str, after_trace: int,
                          through_trace: int) -> tuple[list[PolicyUpdated], list[PolicyGated]]:
    """Policy updates a run's learners made after trace round ``after_trace`` and before ``through_trace``,
    and the policy gate's verdicts on them."""
    updates: list[PolicyUpdated] = []
    gates: list[PolicyGated] = []
    async for r in read_decoded(log, LEARN.name, [f"hx.learn.{subject_token(run)}.*"],
                                [PolicyUpdated.TYPE, PolicyGated.TYPE], what=f"the learner records of run {run!r}"):
        ev = r.event
        if not (isinstance(ev, PolicyUpdated | PolicyGated) and after_trace <= ev.through_round < through_trace):
            continue
        if isinstance(ev, PolicyUpdated):
            updates.append(ev)
        else:
            gates.append(ev)
    return updates, gates


def worsened(before: TaskDigest, after: TaskDigest) -> bool:
    """A smaller share of the task's attempts passed (k-aware; attempt counts may differ between rounds)."""
    return after.passes * before.attempts < before.passes * after.attempts


def _policies(attempts: dict[str, list[AttemptEvidence]]) -> list[str]:
    seen = {v for rows in attempts.values() for a in rows for v in (a.versions or {a.model})}
    return sorted(v for v in seen if v)


async def round_regressions(log: EventLog, run: str, round: int) -> RoundRegressions:
    """The regressions of ``round`` against ``round - 1``, with the ships between and their evidence."""
    marks = await run_marks(log, run)
    if not marks.evolution:
        raise TimeTravelError(f"run {run!r} has no ledger: regressions are read from an evolution run's rounds")
    state = ledger_of(marks)
    check_pair(marks, state, round)
    after = {d.task: d for d in state.digests[round]}
    before = {d.task: d for d in state.digests[round - 1]}
    found = state.regressions(round, state.digests[round])
    lost = {r.task for r in found}
    fell = [d for d in state.digests[round] if d.task in before and d.task not in lost and d.solved
            and worsened(before[d.task], d)]
    names = [*(r.task for r in found), *(d.task for d in fell)]
    trace_before = [t.number for t in marks.main_rounds(round - 1)]
    trace_after = [t.number for t in marks.main_rounds(round)]
    attempts_before = await attempts_of(log, run, trace_before, names)
    attempts_after = await attempts_of(log, run, trace_after, names)
    between = state.rounds[round].between if round in state.rounds else []
    ships = [ShipBetween(s.event, [state.candidates[c] for c in s.candidates if c in state.candidates])
             for s in between]
    regs = [Regression(r.task, r.variant, before[r.task], after[r.task], attempts_before[r.task],
                       attempts_after[r.task], r.suspects) for r in found]
    # the planner's suspects, for a task the planner does not count: ships to its variant in round N-1
    worse = [Regression(d.task, d.variant, before[d.task], d, attempts_before[d.task], attempts_after[d.task],
                        tuple(s.candidate for s in state.ships if s.round == round - 1 and s.variant == d.variant))
             for d in fell]
    updates, gates = (await learner_updates(log, run, max(trace_before), min(trace_after))
                      if trace_before and trace_after else ([], []))
    return RoundRegressions(run, round, len(after), regs, worse, ships, _policies(attempts_before),
                            _policies(attempts_after), updates, gates)
