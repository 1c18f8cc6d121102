"""The report's eval suite scores and experiment results, read from their run- and round-level events only.

An eval's ``eval.suite_scored`` and an experiment's ``experiment.started`` / ``experiment.concluded``
(and, once the panel has reviewed it, its ``panel.reviewed``) are run-level: one subject-filtered
read of ``hx.trace.*._._._`` by type serves them all, whatever the size of the log, and opens no
attempt frame. The per-task scores (``eval.task_scored``, round-level) are read for the latest
eval shown only, from its own round subject.

Which are shown: ``hx report RUN`` shows the evals that judged RUN (RUN among a suite score's
``judged_runs``) and the experiments whose spec names RUN; with ``everything`` (``--evals``), every
eval and experiment on the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.evaluation import SuiteScored, TaskScored
from schemas.event import event_types
from schemas.experiment import ExperimentConcluded, ExperimentStarted
from streams.log import EventLog
from streams.topology import NO_TOKEN, TRACE, trace_subject

PANEL_REVIEWED = "panel.reviewed"
"""The panel's event, read by its type name: the report needs only its decision, and reads it if this hx knows it."""
RUN_LEVEL_TYPES = (SuiteScored.TYPE, ExperimentStarted.TYPE, ExperimentConcluded.TYPE)
EVAL_FIGURE = "eval_suite"
"""The eval suite figure's name (``hx.report.figures.eval_suite``): the page draws it in its own section."""
RUN_LEVEL = f"hx.trace.*.{NO_TOKEN}.{NO_TOKEN}.{NO_TOKEN}"
"""Every run's run-level trace subject (no round, task or attempt)."""


@dataclass(frozen=True)
class EvalPoint:
    """One eval run's suite score, when it reached the log."""

    run_id: str
    time_ns: int
    scored: SuiteScored


@dataclass(frozen=True)
class ExperimentResult:
    """One experiment: its spec's title and hypothesis, what it concluded, and the panel's decision if reviewed."""

    run_id: str
    title: str
    hypothesis: str
    concluded: ExperimentConcluded
    decision: str = ""
    """The panel's KEEP / REVISE / REDESIGN (empty: not reviewed)."""


@dataclass
class EvalData:
    """What the report's "Eval suite" and "Experiments" sections show (both empty: neither section is drawn)."""

    evals: list[EvalPoint] = field(default_factory=list)
    """Suite scores in the order they reached the log."""
    tasks: list[TaskScored] = field(default_factory=list)
    """The latest eval's per-task scores, by suite task name."""
    experiments: list[ExperimentResult] = field(default_factory=list)
    everything: bool = False
    """True when every eval and experiment on the log is shown, not only those about the run."""

    @property
    def latest(self) -> EvalPoint | None:
        """The last eval shown (its per-task scores are the table's)."""
        return self.evals[-1] if self.evals else None


def _names(value: Any, run_id: str) -> bool:
    """True when ``run_id`` is one of the strings in a spec (a JSON value), at any depth."""
    if isinstance(value, str):
        return value == run_id
    if isinstance(value, dict):
        return any(_names(v, run_id) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_names(v, run_id) for v in value)
    return False


def _decision(event: object) -> str:
    """The panel's decision from a ``panel.reviewed`` event, whatever else its type holds."""
    value = msgspec.to_builtins(event).get("decision", "") if isinstance(event, msgspec.Struct) else ""
    return str(value) if value else ""


async def eval_data(log: EventLog, run_id: str, *, everything: bool = False) -> EvalData:
    """The evals and experiments about ``run_id`` (``everything``: all on the log), read by type from their subjects."""
    types = [*RUN_LEVEL_TYPES, *((PANEL_REVIEWED,) if PANEL_REVIEWED in event_types() else ())]
    evals: list[EvalPoint] = []
    started: dict[str, ExperimentStarted] = {}
    concluded: dict[str, ExperimentConcluded] = {}
    decisions: dict[str, str] = {}
    async for r in log.read(TRACE.name, subjects=[RUN_LEVEL], types=types):
        e = r.event
        if isinstance(e, SuiteScored) and (everything or run_id in e.judged_runs):
            evals.append(EvalPoint(e.run_id, r.time_ns, e))
        elif isinstance(e, ExperimentStarted):
            started[e.run_id] = e
        elif isinstance(e, ExperimentConcluded):
            concluded[e.run_id] = e
        elif r.type == PANEL_REVIEWED:
            decisions[str(getattr(e, "run_id", ""))] = _decision(e)
    experiments = []
    for exp_run, done in concluded.items():
        spec = dict(started[exp_run].spec) if exp_run in started else {}
        if everything or _names(spec, run_id):
            experiments.append(ExperimentResult(exp_run, str(spec.get("title") or exp_run),
                                                str(spec.get("hypothesis") or ""), done,
                                                decisions.get(exp_run, "")))
    out = EvalData(evals=evals, experiments=experiments, everything=everything)
    if out.latest is not None:
        out.tasks = await latest_tasks(log, out.latest.run_id)
    return out


async def latest_tasks(log: EventLog, eval_run: str) -> list[TaskScored]:
    """An eval's per-task scores (its round-level ``eval.task_scored``), by suite task name."""
    rows = [r.event async for r in log.read(TRACE.name, subjects=[trace_subject(eval_run, 0)],
                                            types=[TaskScored.TYPE])]
    return sorted((e for e in rows if isinstance(e, TaskScored)), key=lambda t: t.suite_task)


def bounds_text(estimate: float, low: float, high: float) -> str:
    """``0.612 [0.540, 0.690]``: an estimate and its interval as the report prints them."""
    return f"{estimate:.3f} [{low:.3f}, {high:.3f}]"

