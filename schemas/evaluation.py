"""The eval suite's events: each criterion verdict, each task's scores and the suite's, all with intervals.

An eval is a run of its own (``eval-<UTC time>-<random>``) on ``HX_TRACE``. In the full mode its
attempts are played under its own attempt subjects like any run's; in ``--fast`` mode it plays
nothing and judges attempts of other runs. Either way its verdicts and scores are on the eval
run's own subjects, never on the judged run's:

- ``eval.criterion_judged`` and ``eval.task_scored``: round-level, ``hx.trace.<eval>.0._._``;
- ``eval.suite_scored``: run-level, ``hx.trace.<eval>._._._``.

So a reader of scores only (the scoreboard, the report) is served by the server's subject
filters and never opens an attempt's frames. The judged attempt is named in the body
(``judged_run``, ``judged_round``, ``task``, ``judged_attempt``).
"""

from __future__ import annotations

from typing import Literal

from schemas.event import Event, JsonObject, Payload

EvalMode = Literal["full", "fast"]
KeepVerdict = Literal["keep", "discard", "inconclusive", ""]


class Bounds(Payload, frozen=True, kw_only=True):
    """An estimate with its interval, as ``hx.intervals.Interval`` computed it."""

    estimate: float
    low: float
    high: float
    confidence: float = 0.95
    method: str = ""
    """How the interval was computed: ``wilson``, ``bootstrap`` (tasks and attempts resampled), ..."""


class CriterionJudged(Event, frozen=True, kw_only=True):
    """One criterion's verdict on one attempt: passed or not, and why."""

    TYPE = "eval.criterion_judged"
    LEVEL = "round"

    run_id: str
    """The eval run."""
    round: int = 0
    suite_task: str
    """The suite task whose criterion this is."""
    criterion: str
    """The criterion's name in the registry (``hx.eval.criteria``)."""
    params: JsonObject = {}
    passed: bool
    detail: str = ""
    """What the criterion saw (``812 bytes (need >= 400)``), or the error it raised."""
    judged_run: str
    judged_round: int
    task: str
    """The judged attempt's task id."""
    judged_attempt: int


class TaskScored(Event, frozen=True, kw_only=True):
    """One suite task's scores over its attempts: success, criteria pass rate and the composite."""

    TYPE = "eval.task_scored"
    LEVEL = "round"

    run_id: str
    round: int = 0
    suite_task: str
    task: str
    """The task id the suite task ran as (``twx:coin:dev:3``, ``free:markdown-guide:dev:0``, ``smoke:memory``)."""
    weight: float = 1.0
    attempts: int
    passes: int
    criteria_checked: int = 0
    criteria_passed: int = 0
    success: Bounds
    criteria: Bounds
    composite: Bounds
    composites: tuple[float, ...] = ()
    """Each attempt's composite, in attempt order: what comparing two evals resamples (``hx eval --against``)."""


class SuiteScored(Event, frozen=True, kw_only=True):
    """The suite's composite score with its interval, and the keep rule's verdict against a base eval if asked."""

    TYPE = "eval.suite_scored"
    LEVEL = "run"

    run_id: str
    suite: str
    suite_digest: str
    mode: EvalMode = "full"
    tasks: int
    attempts: int
    success: Bounds
    criteria: Bounds
    composite: Bounds
    judged_runs: tuple[str, ...] = ()
    """The runs whose attempts were judged (the eval run itself in the full mode)."""
    against: str = ""
    """The base eval run this one was compared with (empty: none)."""
    difference: Bounds | None = None
    """This composite minus the base's, paired over the tasks both scored."""
    verdict: KeepVerdict = ""
    flipped: tuple[str, ...] = ()
    """Suite tasks whose success changed between base and this eval, each as ``name: base -> this``."""
    config: JsonObject = {}
    """The settings the eval ran with (model, attempts, seed, ...), secrets excluded."""
