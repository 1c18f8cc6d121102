"""The experiment panel: three personas, their verdict scales, the precedence cascade, and what they read.

The panel judges an experiment as a source of knowledge, not the agent it measured:

- the Methodologist (SOUND / MARGINAL / UNSOUND): is the design able to answer its question;
- the Knowledge Auditor (VALID / INCONCLUSIVE / INVALID): does the conclusion follow from the data;
- the Loop Optimizer (ADVANCE / REVISE / REDESIGN): what to run next, as an ``ExperimentSpec``.

The cascade turns the three verdicts into one decision: an UNSOUND design is REDESIGN whatever
the data say; all three agreeing (SOUND or MARGINAL, VALID, ADVANCE) is KEEP; an optimizer's
REDESIGN is REDESIGN; anything else is REVISE.

>>> decide("SOUND", "VALID", "ADVANCE"), decide("UNSOUND", "VALID", "ADVANCE"), decide("MARGINAL", "INVALID", "REVISE")
('KEEP', 'REDESIGN', 'REVISE')
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hx.environments.errors import BenchmarkError
from hx.environments.registry import TaskId
from hx.experiment.errors import ExperimentError
from hx.experiment.falsify import evaluate, parse
from hx.experiment.runner import attempt_outputs
from projections.attempt_outputs import AttemptOutput
from schemas.evaluation import Bounds
from schemas.experiment import EffectSummary, ExperimentConcluded, ExperimentSpec, ExperimentStarted
from schemas.lifecycle import AttemptStarted, RunStarted
from schemas.panel import Decision, PanelReviewed, Persona
from streams.log import EventLog
from streams.topology import TRACE, trace_subject

PERSONAS: tuple[Persona, ...] = ("methodologist", "auditor", "optimizer")
SCALES: dict[Persona, tuple[str, str, str]] = {
    "methodologist": ("SOUND", "MARGINAL", "UNSOUND"),
    "auditor": ("VALID", "INCONCLUSIVE", "INVALID"),
    "optimizer": ("ADVANCE", "REVISE", "REDESIGN"),
}
"""Each persona's scale, best first; a rejected reply counts as the last (worst)."""
TITLES: dict[Persona, str] = {"methodologist": "Methodologist", "auditor": "Knowledge Auditor",
                              "optimizer": "Loop Optimizer"}
LOST = ("infra_failure", "interrupted")
"""Attempt statuses that are no measurement of the arm: an alternative explanation when arms differ in them."""


def worst(persona: Persona) -> str:
    """The worst verdict on a persona's scale (what a rejected reply counts as)."""
    return SCALES[persona][-1]


def decide(methodologist: str, auditor: str, optimizer: str) -> Decision:
    """The precedence cascade: the methodologist's veto, then agreement, then the optimizer's redesign."""
    if methodologist == "UNSOUND":
        return "REDESIGN"
    if methodologist in ("SOUND", "MARGINAL") and auditor == "VALID" and optimizer == "ADVANCE":
        return "KEEP"
    if optimizer == "REDESIGN":
        return "REDESIGN"
    return "REVISE"


@dataclass(frozen=True)
class ArmFacts:
    """What one arm's attempts recorded: the models and harnesses they ran, their step caps, their losses."""

    cell: int
    models: frozenset[str] = frozenset()
    harnesses: frozenset[str] = frozenset()
    step_caps: frozenset[int] = frozenset()
    """Step counts of attempts that ended on their step budget (``budget_exhausted``): the cap they ran under."""
    units: int = 0
    """Finished attempts (retries included)."""
    lost: int = 0
    """Attempts interrupted or failed for infrastructure reasons."""


@dataclass(frozen=True)
class ExperimentRecord:
    """Everything the panel reads about one experiment run, as the log holds it."""

    run_id: str
    spec: ExperimentSpec
    started: ExperimentStarted
    concluded: ExperimentConcluded
    attempts: tuple[AttemptOutput, ...] = ()
    reused_test_tasks: tuple[str, ...] = ()
    """Test-split tasks of the spec that an earlier run on the log had already played."""
    reviews: int = 0
    """Panel reviews of this run already on the log."""
    arms: dict[int, ArmFacts] = field(default_factory=dict)

    @classmethod
    def of(cls, run_id: str, spec: ExperimentSpec, started: ExperimentStarted, concluded: ExperimentConcluded,
           attempts: Sequence[AttemptOutput] = (), reused_test_tasks: Sequence[str] = (),
           reviews: int = 0) -> ExperimentRecord:
        """A record with its per-arm facts folded from the attempts."""
        return cls(run_id, spec, started, concluded, tuple(attempts), tuple(reused_test_tasks), reviews,
                   arm_facts(attempts))


def arm_facts(attempts: Sequence[AttemptOutput]) -> dict[int, ArmFacts]:
    """Per cell (round), what its attempts recorded."""
    models: dict[int, set[str]] = {}
    harnesses: dict[int, set[str]] = {}
    caps: dict[int, set[int]] = {}
    units: Counter[int] = Counter()
    lost: Counter[int] = Counter()
    for out in attempts:
        if out.model:
            models.setdefault(out.round, set()).add(out.model)
        if out.harness_digest:
            harnesses.setdefault(out.round, set()).add(out.harness_digest)
        if out.status == "budget_exhausted":
            caps.setdefault(out.round, set()).add(out.steps)
        units[out.round] += out.finished
        lost[out.round] += out.status in LOST
    cells = sorted({out.round for out in attempts})
    return {c: ArmFacts(c, frozenset(models.get(c, ())), frozenset(harnesses.get(c, ())),
                        frozenset(caps.get(c, ())), units[c], lost[c]) for c in cells}


def excludes_zero(b: Bounds) -> int:
    """+1 when an interval lies above 0, -1 below, 0 when it holds 0."""
    return 1 if b.low > 0 else -1 if b.high < 0 else 0


class _Imagined:
    """A conclusion in which every non-reference level is far above (or below) the reference."""

    def __init__(self, spec: ExperimentSpec, sign: float) -> None:
        self.sign = sign
        self.references = {f.levels[0] for f in spec.factors} | {f"{f.name}={f.levels[0]}" for f in spec.factors}

    def _is_reference(self, level: str) -> bool:
        return all(part in self.references or part.split("=", 1)[-1] in self.references for part in level.split(","))

    def level_mean(self, variable: str, level: str) -> Bounds | None:
        """The reference at 0, other levels at +-1e6."""
        value = 0.0 if self._is_reference(level) else self.sign * 1e6
        return Bounds(estimate=value, low=value, high=value, confidence=0.95, method="imagined")

    def effect(self, variable: str, level: str, reference: str) -> tuple[Bounds, Bounds]:
        """A difference of +-1e6 (0 between two references)."""
        value = 0.0 if self._is_reference(level) else self.sign * 1e6
        b = Bounds(estimate=value, low=value, high=value, confidence=0.95, method="imagined")
        return b, b


def claimed_direction(spec: ExperimentSpec) -> int:
    """The direction the hypothesis claims for the treatment levels: +1 up, -1 down, 0 when it cannot be told.

    Read off the falsified_if itself: the claim is the direction in which it would not refute.
    """
    expression = parse(spec.falsified_if)
    up, _ = evaluate(expression, _Imagined(spec, 1.0))
    down, _ = evaluate(expression, _Imagined(spec, -1.0))
    if up is False and down is True:
        return 1
    if down is False and up is True:
        return -1
    return 0


def relevant_effects(spec: ExperimentSpec, concluded: ExperimentConcluded) -> list[EffectSummary]:
    """The effects the falsified_if speaks of (its variables and level pairs), else every effect on its variables."""
    expression = parse(spec.falsified_if)
    pairs = {frozenset((a.split("=", 1)[-1], b.split("=", 1)[-1])) for a, b in expression.pairs}
    on_variables = [e for e in concluded.effects if e.variable in expression.variables]
    named = [e for e in on_variables if frozenset((e.level, e.reference)) in pairs]
    return named or on_variables


def tasks_on_test_split(spec: ExperimentSpec) -> list[str]:
    """The spec's tasks on the test split."""
    out = []
    for text in spec.tasks:
        try:
            if TaskId.parse(text).split == "test":
                out.append(text)
        except BenchmarkError:
            continue
    return out


async def _reused_test_tasks(log: EventLog, spec: ExperimentSpec, run_id: str, before: int) -> list[str]:
    """Test-split tasks of the spec that another run's attempt played before sequence ``before``."""
    wanted = set(tasks_on_test_split(spec))
    if not wanted or before <= 1:
        return []
    seen: set[str] = set()
    async for record in log.read(TRACE.name, stop=before - 1, subjects=["hx.trace.>"],
                                 types=[AttemptStarted.TYPE]):
        event = record.event
        if isinstance(event, AttemptStarted) and event.run_id != run_id and event.task_id in wanted:
            seen.add(event.task_id)
    return sorted(seen)


async def load_record(log: EventLog, run_id: str) -> ExperimentRecord:
    """The experiment run as the panel reads it; ``ExperimentError`` when it is no concluded experiment."""
    started_seq = 0
    events = []
    async for record in log.read(TRACE.name, subjects=[trace_subject(run_id)],
                                 types=[RunStarted.TYPE, ExperimentStarted.TYPE, ExperimentConcluded.TYPE,
                                        PanelReviewed.TYPE]):
        if isinstance(record.event, RunStarted) and not started_seq:
            started_seq = record.seq
        events.append(record.event)
    if not started_seq:
        raise ExperimentError(f"RUN {run_id}: no such run on the log")
    started = next((e for e in events if isinstance(e, ExperimentStarted)), None)
    if started is None:
        kind = next(e.kind for e in events if isinstance(e, RunStarted))
        raise ExperimentError(f"RUN {run_id}: a {kind} run, not an experiment")
    concluded = next((e for e in events if isinstance(e, ExperimentConcluded)), None)
    if concluded is None:
        raise ExperimentError(f"RUN {run_id}: not concluded yet; finish it with hx experiment run SPEC "
                              f"--resume {run_id}")
    try:
        spec = msgspec.convert(started.spec, ExperimentSpec)
    except msgspec.ValidationError as exc:
        raise ExperimentError(f"RUN {run_id}: its logged spec does not decode: {exc}") from exc
    outputs = await attempt_outputs(log, run_id)
    attempts = [o for o in outputs.values() if not o.task.startswith("panel:")]
    reused = await _reused_test_tasks(log, spec, run_id, started_seq)
    reviews = sum(isinstance(e, PanelReviewed) for e in events)
    return ExperimentRecord.of(run_id, spec, started, concluded, attempts, reused, reviews)


async def append_review(log: EventLog, review: PanelReviewed) -> None:
    """Put a review on the experiment run's run-level subject (once per review number)."""
    subject = trace_subject(review.run_id)
    await log.append(subject, review, key=f"{subject}#{review.TYPE}#{review.review}")


def proposal_json(spec: ExperimentSpec) -> dict[str, Any]:
    """A proposed spec as the JSON object the event carries (lists, not tuples: as it reads back from the log)."""
    data: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(spec))
    return data


def verdicts_of(review: PanelReviewed) -> Mapping[str, str]:
    """Persona to verdict."""
    return {v.persona: v.verdict for v in review.verdicts}


__all__ = [
    "LOST", "PERSONAS", "SCALES", "TITLES", "ArmFacts", "ExperimentRecord", "append_review", "arm_facts",
    "claimed_direction", "decide", "excludes_zero", "load_record", "proposal_json", "relevant_effects",
    "tasks_on_test_split", "verdicts_of", "worst",
]
