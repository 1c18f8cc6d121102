"""Rollout results: per task and per game pass@k, scores, steps and infrastructure failures.

The numbers come from attempt verdicts (``AttemptOutcome``), which ``hx.environments.rollout``
reads back from the log through the ``TaskHistory`` projection; this module only
aggregates them and presents them: a rich table, a Markdown table and JSON.

>>> outs = [AttemptOutcome(task_id="mybench:game:dev:0", attempt=a, passed=a == 1, score=float(a == 1), steps=9)
...         for a in range(2)]
>>> report = summarise(outs, attempts=2)
>>> report.overall.pass_at_1, report.overall.pass_at_2
(0.5, 1.0)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import msgspec
from rich.table import Table

from hx.environments.errors import BenchmarkError, ResultsError
from hx.environments.registry import TaskId
from projections.task_history import pass_at_k
from schemas.lifecycle import AttemptStatus
from schemas.messages import Usage
from streams.redaction import scrub


class AttemptOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt's verdict as the report counts it (an infrastructure failure never passes)."""

    task_id: str
    attempt: int
    passed: bool
    score: float = 0.0
    steps: int = 0
    status: AttemptStatus = "completed"
    usage: Usage = Usage()
    """The tokens of the attempt's model calls."""

    @property
    def infra_failure(self) -> bool:
        """True when the attempt ended in an infrastructure failure."""
        return self.status == "infra_failure"


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """Aggregates over the attempts of a set of tasks (one game, or all of them)."""

    game: str
    """``benchmark:game``, or ``all``."""
    tasks: int
    attempts: int
    passes: int
    pass_at_1: float | None = msgspec.field(name="pass@1")
    """Mean over tasks of the unbiased pass@1; None when no task has an attempt."""
    pass_at_2: float | None = msgspec.field(name="pass@2")
    """Mean over tasks of the unbiased pass@2; None when tasks have fewer than 2 attempts."""
    mean_score: float | None
    mean_steps: float | None
    infra_failures: int
    """Attempts ended by an infrastructure failure (counted as failed in pass@k)."""


class TaskSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One task of the round: its attempts and their verdicts."""

    task_id: str
    game: str
    attempts: int
    passes: int
    pass_at_1: float | None = msgspec.field(name="pass@1")
    pass_at_2: float | None = msgspec.field(name="pass@2")
    scores: tuple[float, ...]
    steps: tuple[int, ...]
    infra_failures: int


class RolloutReport(msgspec.Struct, frozen=True, kw_only=True):
    """The results of one round of rollouts, as ``hx run`` prints and saves them."""

    run_id: str = ""
    round: int = 0
    role: str = "adaptation"
    """``adaptation`` (evolution may read it) or ``heldout`` (only ever evaluated)."""
    model: str = ""
    harness: str = ""
    """Where the harness came from (a file, or ``starter:<family>``)."""
    harness_digest: str = ""
    attempts_per_task: int = 0
    max_steps: int = 0
    seed: int = 0
    concurrency: int = 0
    games: tuple[Summary, ...] = ()
    overall: Summary
    tasks: tuple[TaskSummary, ...] = ()
    source: str = "log"
    """``log``: folded from the log (TaskHistory), cross-checked against the attempts' results;
    ``results``: from the attempts' results alone (the trace went nowhere)."""
    steps: int = 0
    """Steps taken over all attempts."""
    events: int = 0
    """Events the attempts put on the log."""
    elapsed_s: float = 0.0
    """Wall time of the attempts (not counting the report)."""

    @property
    def steps_per_s(self) -> float:
        """Steps per second of wall time."""
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def events_per_s(self) -> float:
        """Events per second of wall time."""
        return self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0


def game_of(task_id: str) -> str:
    """``benchmark:game`` of a task id (the first two fields of an id that does not parse)."""
    try:
        tid = TaskId.parse(task_id)
    except BenchmarkError:
        return ":".join(task_id.split(":")[:2])
    return f"{tid.benchmark}:{tid.game}"


def _pass_at(n: int, c: int, k: int) -> float | None:
    return pass_at_k(n, c, k) if n >= k else None


def _mean(values: Sequence[float]) -> float | None:
    return fmean(values) if values else None


def _summary(game: str, tasks: Sequence[TaskSummary]) -> Summary:
    def mean_pass(values: Iterable[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return fmean(known) if known and len(known) == len(tasks) else None
    scores = [s for t in tasks for s in t.scores]
    steps = [float(s) for t in tasks for s in t.steps]
    return Summary(game=game, tasks=len(tasks), attempts=sum(t.attempts for t in tasks),
                   passes=sum(t.passes for t in tasks), pass_at_1=mean_pass(t.pass_at_1 for t in tasks),
                   pass_at_2=mean_pass(t.pass_at_2 for t in tasks), mean_score=_mean(scores),
                   mean_steps=_mean(steps), infra_failures=sum(t.infra_failures for t in tasks))


def summarise(outcomes: Iterable[AttemptOutcome], *, attempts: int, task_order: Sequence[str] = (),
              **fields: Any) -> RolloutReport:
    """Aggregate attempt verdicts per task, per game and overall into a report (``fields`` fill the rest).

    Tasks are listed in ``task_order`` (then any others, sorted); games in order of first
    appearance. pass@k of a game is the mean over its tasks of the unbiased estimator.
    """
    by_task: dict[str, list[AttemptOutcome]] = {t: [] for t in task_order}
    for out in outcomes:
        by_task.setdefault(out.task_id, []).append(out)
    summaries: list[TaskSummary] = []
    for task_id in [*task_order, *sorted(set(by_task) - set(task_order))]:
        outs = sorted(by_task[task_id], key=lambda o: o.attempt)
        n, c = len(outs), sum(o.passed and not o.infra_failure for o in outs)
        summaries.append(TaskSummary(
            task_id=task_id, game=game_of(task_id), attempts=n, passes=c, pass_at_1=_pass_at(n, c, 1),
            pass_at_2=_pass_at(n, c, 2), scores=tuple(o.score for o in outs), steps=tuple(o.steps for o in outs),
            infra_failures=sum(o.infra_failure for o in outs)))
    games: dict[str, list[TaskSummary]] = {}
    for ts in summaries:
        games.setdefault(ts.game, []).append(ts)
    return RolloutReport(attempts_per_task=attempts, games=tuple(_summary(g, ts) for g, ts in games.items()),
                         overall=_summary("all", summaries), tasks=tuple(summaries), **fields)


# --- presentation ---------------------------------------------------------------------------

COLUMNS = ("game", "tasks", "pass@1", "pass@2", "mean score", "mean steps", "infra failures")


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _row(s: Summary) -> list[str]:
    return [s.game, str(s.tasks), _fmt(s.pass_at_1), _fmt(s.pass_at_2), _fmt(s.mean_score), _fmt(s.mean_steps, 1),
            str(s.infra_failures)]


def title(report: RolloutReport) -> str:
    """One line naming what the table shows."""
    return (f"run {report.run_id} · round {report.round} · {report.role} · {report.model} · "
            f"{report.attempts_per_task} attempt(s)/task · max {report.max_steps} steps")


def results_table(report: RolloutReport) -> Table:
    """A rich table: one row per game, and an ``all`` footer when there are several."""
    table = Table(title=title(report), show_footer=len(report.games) > 1, header_style="bold")
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i == 0 else "right")
    for game in report.games:
        table.add_row(*_row(game))
    if len(report.games) > 1:
        for column, footer in zip(table.columns, _row(report.overall), strict=True):
            column.footer = footer
    return table


def markdown_table(report: RolloutReport) -> str:
    """The same table in Markdown, with the title as a heading and the harness digest below."""
    rows = [*report.games, report.overall] if len(report.games) > 1 else list(report.games)
    lines = [f"### {title(report)}", "", "| " + " | ".join(COLUMNS) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + " |"]
    lines += ["| " + " | ".join(_row(s)) + " |" for s in rows]
    lines += ["", f"harness `{report.harness}` ({report.harness_digest}); {report.steps:,} steps, "
                  f"{report.events:,} events in {report.elapsed_s:.1f} s; numbers from the {report.source}", ""]
    return scrub("\n".join(lines))


def to_json(report: RolloutReport) -> str:
    """The report as indented JSON (with steps/s and events/s added)."""
    data: dict[str, Any] = msgspec.to_builtins(report)
    data["steps_per_s"] = round(report.steps_per_s, 1)
    data["events_per_s"] = round(report.events_per_s, 1)
    return scrub(json.dumps(data, indent=2) + "\n")


def from_json(text: str | bytes) -> RolloutReport:
    """Read a report saved by ``save_report`` (the derived rates are ignored)."""
    data = json.loads(text)
    data.pop("steps_per_s", None)
    data.pop("events_per_s", None)
    return msgspec.convert(data, RolloutReport)


def markdown_path(path: Path) -> Path:
    """Where the Markdown table goes beside the JSON at ``path`` (``.md``, or ``.md.md`` for ``x.md``)."""
    md = path.with_suffix(".md")
    return md if md != path else path.with_name(path.name + ".md")


class ResultsClaim:
    """Results files reserved for one run before it starts: created empty and exclusively, filled by ``save``.

    Two runs aiming at the same files (the same run id, or the same ``--out``) cannot both
    claim them: the second gets ``ResultsError`` before it runs anything. An unusable
    directory is found here too, not after the run.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.markdown = markdown_path(path)
        self._mine: list[Path] = []
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for target in (self.path, self.markdown):
                os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                self._mine.append(target)
        except FileExistsError as exc:
            self.release()
            raise ResultsError(f"results file {exc.filename} already exists (this run id or --out was used "
                               "before, or another run is writing it): choose another run id or --out") from None
        except OSError as exc:
            self.release()
            raise ResultsError(f"cannot write results to {exc.filename or path}: {exc.strerror or exc}") from None

    def save(self, report: RolloutReport) -> tuple[Path, Path]:
        """Write the JSON and the Markdown table into the claimed files (each replaced whole); return both paths."""
        self.write(to_json(report), markdown_table(report))
        return self.path, self.markdown

    def write(self, json_text: str, markdown: str | None = None) -> None:
        """Fill the claimed files (each replaced whole); a Markdown file with no text is given back."""
        for target, text in ((self.path, json_text), (self.markdown, markdown)):
            if text is None:
                continue
            tmp = target.with_name(f".{target.name}.tmp")
            try:
                tmp.write_text(text)
                tmp.replace(target)
            except OSError as exc:
                raise ResultsError(f"cannot write results to {target}: {exc.strerror or exc}") from None
            if target in self._mine:
                self._mine.remove(target)
        self.release()

    def release(self) -> None:
        """Give back files claimed but never written (a run that failed before its report)."""
        for target in self._mine:
            with contextlib.suppress(OSError):
                if target.stat().st_size == 0:
                    target.unlink()
        self._mine = []
