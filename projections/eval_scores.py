"""EvalScores: the scoreboard of eval runs, per eval its suite score and its tasks' scores.

It folds only ``eval.task_scored`` and ``eval.suite_scored``, and reads only run- and
round-level subjects (``hx.trace.*.*._._``): the server never sends it an attempt's events nor
a verdict's, so the scoreboard stays cheap however many attempts were judged. ``hx eval
--against RUN`` reads the base eval from here.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.evaluation import SuiteScored, TaskScored
from streams.topology import NO_TOKEN

RUN_AND_ROUND_LEVEL = f"hx.trace.*.*.{NO_TOKEN}.{NO_TOKEN}"
"""Run-level (``hx.trace.R._._._``) and round-level (``hx.trace.R.N._._``) subjects, no attempt's."""


class EvalScore(msgspec.Struct):
    """One eval run's scores: its tasks' (by suite task name) and, once scored, the suite's."""

    run: str
    tasks: dict[str, TaskScored] = {}
    suite: SuiteScored | None = None


class EvalScores(Projection[dict[str, EvalScore]]):
    """Per eval run: the suite score with its interval and each task's scores."""

    name: ClassVar[str] = "eval_scores"
    reads = frozenset({TaskScored.TYPE, SuiteScored.TYPE})
    subjects: ClassVar[tuple[str, ...]] = (RUN_AND_ROUND_LEVEL,)
    state_type = dict[str, EvalScore]

    def initial(self) -> dict[str, EvalScore]:
        """No evals yet."""
        return {}

    def fold(self, state: dict[str, EvalScore], record: Record) -> dict[str, EvalScore]:
        """Record a task's or the suite's score under its eval run (a later score replaces an earlier)."""
        event = record.event
        if isinstance(event, TaskScored):
            score = state.get(event.run_id) or state.setdefault(event.run_id, EvalScore(event.run_id))
            score.tasks[event.suite_task] = event
        elif isinstance(event, SuiteScored):
            score = state.get(event.run_id) or state.setdefault(event.run_id, EvalScore(event.run_id))
            score.suite = event
        return state
