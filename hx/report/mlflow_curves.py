"""A run's evolution and learner curves as MLflow runs: what ``hx export --mlflow`` writes, folded from the log.

``run_curves(ledger, learner)`` takes the run's ledger events and its ``HX_LEARN`` records, each
with its time on the log, and returns one ``CurveRun`` for the evolution (one point per finished
round, step = round: the figures of ``curves.json``, from the same fold) and one per learner
(one point per learner pass or policy-gate verdict, step = the trace round it trained through, as
``hx report`` plots them). A round without its ``ledger.round_decided`` is in flight: it is left out
and named in ``in_flight``, and a later export adds it. Nothing comes from the clock: the points'
times are the events' times on the log.

>>> from hx.harness.config import HarnessConfig
>>> from schemas.ledger import LedgerOpened
>>> h = HarnessConfig()
>>> job = {"loop": {"rounds": 2}}
>>> opened = LedgerOpened(run_id="r", strategy="global", harness=h.spec(), digest=h.digest, settings=job)
>>> out = run_curves([(opened, 1_700_000_000_000_000_000)], [])
>>> [(r.curve, r.params, r.status) for r in out.runs]
[('evolution', {'loop.rounds': '2'}, 'RUNNING')]
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hx.replay.audit import verified_ledger
from hx.report.data import current_policy, learn_filter
from hx.report.export import curves
from hx.report.export_fold import RunFold
from schemas.event import Event
from schemas.job import nested_job
from schemas.learn import PolicyGated, PolicyInitialised, PolicyUpdated, UpdateSkipped
from schemas.ledger import EvolutionFinished, HeldoutScored, LedgerEvent, RoundDecided, ledger_digest
from streams.edit_ledger import ledger_filter
from streams.log import EventLog
from streams.topology import LEARN, LEDGER

Stamped = tuple[Any, int]
"""An event and its time on the log (``Record.time_ns``)."""

TAG_RUN, TAG_LEDGER, TAG_CURVE = "hx.run_id", "hx.ledger", "hx.curve"
"""Tags hx puts on what it writes: the experiment's run id and ledger, and which curve an MLflow run holds."""
EVOLUTION = "evolution"
ROUND_FIGURES = ("pass_at_k", "tasks", "passes", "rollouts", "regressions", "predicted", "realised", "attribution",
                 "actionability")
"""The numeric columns of a ``curves.json`` round row that become metrics (plus ``shipped``, ``variants``)."""
UPDATE_FIGURES = ("loss", "kl", "clip_fraction", "entropy", "grad_norm", "samples", "steps", "groups_used", "seconds",
                  "bytes")
"""``PolicyUpdated`` fields that become learner metrics (plus ``updated``, ``groups_skipped``, ``skipped/<reason>``)."""
STATUS = {"completed": "FINISHED", "patience": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
"""``EvolutionFinished.status`` -> MLflow run status (no end yet: ``RUNNING``)."""
PARAM_MAX = 6000
"""MLflow's longest parameter value (``mlflow.utils.validation.MAX_PARAM_VAL_LENGTH``)."""
_KEY = re.compile(r"[^A-Za-z0-9_\-. :/]")


@dataclass(frozen=True)
class Point:
    """One metric value at a step, at its event's time (milliseconds, as MLflow keeps them)."""

    key: str
    value: float
    step: int
    time_ms: int


@dataclass(frozen=True)
class CurveRun:
    """One MLflow run to write: which curve, its name, times, status, params, tags and points."""

    curve: str
    """``evolution`` or ``learner:<name>`` (the ``hx.curve`` tag: how a later export finds the run again)."""
    name: str
    start_ms: int
    end_ms: int | None
    status: str
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)


@dataclass(frozen=True)
class RunCurves:
    """Everything an export writes for one hx run, and the rounds it leaves out."""

    run_id: str
    ledger: str
    """The digest of the run's ``ledger.opened``: tells this run from another of the same id."""
    runs: list[CurveRun]
    in_flight: list[int]
    """Rounds begun on the ledger but not decided: left out until a later export."""

    @property
    def tags(self) -> dict[str, str]:
        """The experiment's tags."""
        return {TAG_RUN: self.run_id, TAG_LEDGER: self.ledger}


def run_curves(ledger: Sequence[Stamped], learner: Sequence[Stamped]) -> RunCurves:
    """The MLflow runs of an hx run: its ledger events and learner records, each with its time in ns."""
    events: list[LedgerEvent] = [e for e, _ in ledger]
    fold = RunFold.of(events)
    opened = fold.opened
    decided = {e.round: ms(t) for e, t in ledger if isinstance(e, RoundDecided)}
    finished = next(((e, ms(t)) for e, t in ledger if isinstance(e, EvolutionFinished)), None)
    status, end = (STATUS.get(finished[0].status, "FINISHED"), finished[1]) if finished else ("RUNNING", None)
    table = curves(fold)
    points: list[Point] = []
    in_flight: list[int] = []
    for row in table["rounds"]:
        if row["round"] not in decided:
            in_flight.append(row["round"])
            continue
        at, step = decided[row["round"]], row["round"]
        points += [Point(k, float(row[k]), step, at) for k in ROUND_FIGURES if row[k] is not None]
        points += [Point("shipped", float(len(row["shipped"])), step, at),
                   Point("variants", float(len(row["variants"])), step, at)]
    held = [ms(t) for e, t in ledger if isinstance(e, HeldoutScored)]  # ledger order, as the fold keeps them
    for h, at in zip(table["heldout"], held, strict=True):
        points += heldout_points(h, at)
    start = ms(ledger[0][1])
    runs = [CurveRun(EVOLUTION, EVOLUTION, start, end, status, params(nested_job(opened.settings)),
                     {TAG_CURVE: EVOLUTION, "hx.strategy": opened.strategy, "hx.harness": opened.digest}, points)]
    runs += learner_runs(learner, status, end)
    return RunCurves(opened.run_id, ledger_digest(opened), runs, in_flight)


def heldout_points(row: Mapping[str, Any], at: int) -> list[Point]:
    """A held-out evaluation's figures (``curves.json``'s row), overall and per game, at step = its round."""
    step = int(row["round"])
    out = [Point(f"heldout/{k}", float(row[k]), step, at) for k in ("tasks", "pass_at_1", "pass_at_2")
           if row[k] is not None]
    for game in row["games"]:
        name = key(str(game["game"]))
        out += [Point(f"heldout/{name}/{k}", float(game[k]), step, at) for k in ("tasks", "pass_at_1", "pass_at_2")
                if game.get(k) is not None]
    return out


def learner_runs(learner: Sequence[Stamped], status: str, end: int | None) -> list[CurveRun]:
    """One MLflow run per learner of the run: its passes and the policy gate's verdicts, step = through_round."""
    by_name: dict[str, list[Stamped]] = {}
    for event, t in learner:
        if isinstance(event, PolicyInitialised | PolicyUpdated | UpdateSkipped | PolicyGated):
            by_name.setdefault(event.learner, []).append((event, t))
    out = []
    for name, records in by_name.items():
        points: list[Point] = []
        found: dict[str, str] = {}
        for event, t in records:
            at = ms(t)
            if isinstance(event, PolicyInitialised):
                found = params({"version": event.version, "kind": event.kind,
                                "algorithm": event.algorithm if isinstance(event.algorithm, str) else "grpo",
                                "config": event.config})
            elif isinstance(event, PolicyUpdated | UpdateSkipped):
                step = event.through_round
                points.append(Point("updated", float(isinstance(event, PolicyUpdated)), step, at))
                points.append(Point("groups_skipped", float(event.groups_skipped), step, at))
                points += [Point(f"skipped/{key(r)}", float(n), step, at) for r, n in sorted(event.skipped.items())]
                if isinstance(event, PolicyUpdated):
                    points += [Point(k, float(getattr(event, k)), step, at) for k in UPDATE_FIGURES]
            else:
                step = event.through_round
                points += [Point("gate/adopted", float(event.adopted), step, at),
                           Point("gate/solved", float(event.solved), step, at),
                           Point("gate/lost", float(len(event.lost)), step, at),
                           Point("gate/rollouts", float(event.rollouts), step, at)]
        events: list[Event] = [e for e, _ in records]
        tags = {TAG_CURVE: f"learner:{name}", "hx.learner": name, "hx.policy": current_policy(events)}
        run_name = "learner" if name == "default" else f"learner {name}"
        out.append(CurveRun(f"learner:{name}", run_name, ms(records[0][1]), end, status, found, tags, points))
    return out


def params(settings: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Settings flattened to MLflow params: ``a.b`` keys, values as text (JSON for non-strings), cut to fit."""
    out: dict[str, str] = {}
    for k, value in settings.items():
        name = f"{prefix}{key(str(k))}"
        if isinstance(value, dict) and value:
            out |= params(value, f"{name}.")
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
        out[name] = text if len(text) <= PARAM_MAX else text[:PARAM_MAX - 3] + "..."
    return out


def key(name: str) -> str:
    """A name MLflow takes as a metric or param key: characters it refuses become ``_``."""
    return _KEY.sub("_", name) or "_"


def ms(time_ns: int) -> int:
    """Nanoseconds on the log as MLflow's milliseconds."""
    return time_ns // 1_000_000


async def read_curves(log: EventLog, run_id: str, plugin_dir: Path) -> RunCurves:
    """A run's curves from the log: its verified ledger and its learner records, with their times on the log."""
    ledger = await verified_ledger(log, run_id, plugin_dir)
    times = {r.seq: r.time_ns async for r in log.read(LEDGER.name, subjects=[ledger_filter(run_id)])}
    learner = [(r.event, r.time_ns) async for r in log.read(LEARN.name, subjects=[learn_filter(run_id)])]
    return run_curves([(e.event, times.get(e.seq, 0)) for e in ledger.entries], learner)
