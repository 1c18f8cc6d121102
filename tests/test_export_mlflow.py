"""``hx export RUN --mlflow STORE`` on a real co-evolution: its curves read back with MLflow's own client.

One tiny real ``hx coevolve`` (harness and policy) of the toy world runs on a real nats-server; its
evolution and learner curves go into a SQLite MLflow store and are read back with
``mlflow.MlflowClient``: values equal hx's own figures (the export fold's ``curves`` and the learner's
records on ``HX_LEARN``), steps are rounds, times are the events' times on the log. A second export
adds nothing, a round in flight is left out and added later, and a store hx must not write is
refused with one line and left byte for byte as it was.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import mlflow
import pytest
import toyworld  # noqa: F401 - registers the toy benchmark with the in-process command
from hx_cli import error_line, hx, ok
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException

from hx.report import mlflow_store
from hx.report.data import learn_filter
from hx.report.export import curves
from hx.report.export_fold import RunFold
from hx.report.mlflow_curves import run_curves
from hx.report.mlflow_store import write_curves
from schemas.envelope import Record
from schemas.event import Event
from schemas.learn import PolicyGated, PolicyUpdated
from schemas.ledger import HeldoutScored, LedgerEvent, RoundDecided
from streams.config import NatsSettings
from streams.connection import connect
from streams.edit_ledger import ledger_filter
from streams.server import NatsProcess
from streams.topology import LEARN, LEDGER

RUN = "mlflow-coevolve"
E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class Coevolved:
    """The module's server and data dir, and the run's records as the log holds them."""

    url: str
    data: Path
    ledger: list[Record]
    learner: list[Record]

    def hx(self, *args: str) -> Any:
        """The ``hx`` command on this server."""
        return hx("--nats-url", self.url, "--data-dir", str(self.data), *args)

    def stamped(self) -> tuple[list[tuple[Any, int]], list[tuple[Any, int]]]:
        """The ledger events and learner records with their times on the log."""
        return [(r.event, r.time_ns) for r in self.ledger], [(r.event, r.time_ns) for r in self.learner]


async def _records(url: str) -> tuple[list[Record], list[Record]]:
    async with connect(NatsSettings(url=url)) as conn:
        ledger = [r async for r in conn.log.read(LEDGER.name, subjects=[ledger_filter(RUN)])]
        learner = [r async for r in conn.log.read(LEARN.name, subjects=[learn_filter(RUN)])]
        return ledger, learner


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coevolved]:
    """A tiny real co-evolution of the toy world (two rounds, policy gate on): ledger and learner records."""
    root = tmp_path_factory.mktemp("mlflow")
    server = NatsProcess(root / "nats")
    server.start(detach=False)
    try:
        ok(hx("--nats-url", server.url, "--data-dir", str(root / "data"), "coevolve", "--mode", "both", "--bench",
              "toyworld:rooms", "--tasks", "4", "--heldout-tasks", "2", "--rounds", "2", "--max-steps", "30",
              "--concurrency", "2", "--policy-gate", "--run-id", RUN))
        ledger, learner = asyncio.run(_records(server.url))
        yield Coevolved(server.url, root / "data", ledger, learner)
    finally:
        server.stop()


def of(records: list[Record], cls: type[E]) -> list[tuple[E, int]]:
    """The records holding a ``cls`` event, with their times on the log in milliseconds (MLflow's unit)."""
    return [(r.event, r.time_ns // 1_000_000) for r in records if isinstance(r.event, cls)]


def client(store: Path) -> mlflow.MlflowClient:
    """MLflow's own client on a SQLite store."""
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}")


def history(c: mlflow.MlflowClient, run_id: str, key: str) -> list[tuple[int, float, int]]:
    """A metric's (step, value, timestamp) points in step order."""
    return sorted((m.step, m.value, m.timestamp) for m in c.get_metric_history(run_id, key))


def mlflow_runs(c: mlflow.MlflowClient) -> dict[str, Any]:
    """The experiment's MLflow runs by their hx.curve tag."""
    exp = c.get_experiment_by_name(RUN)
    assert exp is not None
    return {r.data.tags["hx.curve"]: r for r in c.search_runs([exp.experiment_id], run_view_type=ViewType.ALL)}


def test_the_curves_read_back_with_mlflow_equal_hx_figures(run: Coevolved, tmp_path: Path) -> None:
    store = tmp_path / "curves.db"
    out = ok(run.hx("export", RUN, "--mlflow", f"sqlite:///{store}"))
    assert f"exported run {RUN} to MLflow store" in out.stdout and "learner" in out.stdout
    assert not out.stderr  # MLflow's migration chatter kept off the terminal
    c = client(store)
    exp = c.get_experiment_by_name(RUN)
    assert exp is not None and exp.tags["hx.run_id"] == RUN
    runs = mlflow_runs(c)
    assert sorted(runs) == ["evolution", "learner:default"]
    evo, learn = runs["evolution"], runs["learner:default"]
    assert evo.info.status == "FINISHED" and evo.info.run_name == "evolution"

    fold = RunFold.of([e for e, _ in of(run.ledger, LedgerEvent)])
    table = curves(fold)
    decided = {e.round: t for e, t in of(run.ledger, RoundDecided)}
    assert sorted(decided) == [0, 1]
    for name, column in (("pass_at_k", "pass_at_k"), ("tasks", "tasks"), ("passes", "passes"),
                         ("rollouts", "rollouts")):
        assert history(c, evo.info.run_id, name) == [(row["round"], float(row[column]), decided[row["round"]])
                                                     for row in table["rounds"]], name
    assert history(c, evo.info.run_id, "shipped") == [(row["round"], float(len(row["shipped"])),
                                                       decided[row["round"]]) for row in table["rounds"]]
    held = of(run.ledger, HeldoutScored)
    assert sorted(h.round for h, _ in held) == [-1, 1]  # before the first round and after the last
    assert history(c, evo.info.run_id, "heldout/pass_at_2") == sorted(
        (h.round, h.pass_at_2, t) for h, t in held if h.pass_at_2 is not None)
    params = evo.data.params  # the recorded job, flattened
    assert (params["run_id"], params["rollout.max_steps"], params["coevolve.mode"]) == (RUN, "30", "both")

    updates = of(run.learner, PolicyUpdated)
    assert updates
    for name in ("loss", "kl", "entropy", "samples"):
        assert history(c, learn.info.run_id, name) == [
            (u.through_round, float(getattr(u, name)), t) for u, t in updates], name
    gates = of(run.learner, PolicyGated)
    assert gates and history(c, learn.info.run_id, "gate/adopted") == [
        (g.through_round, float(g.adopted), t) for g, t in gates]
    assert (learn.data.params["algorithm"], learn.data.params["kind"]) == ("grpo", "scorer")


def test_a_second_export_adds_nothing_and_a_round_in_flight_comes_later(run: Coevolved, tmp_path: Path) -> None:
    store = tmp_path / "curves.db"
    ledger, learner = run.stamped()
    last = max(i for i, (e, _) in enumerate(ledger) if isinstance(e, RoundDecided))
    early = run_curves(ledger[:last], learner)  # the ledger as it stood before round 1 was decided
    assert early.in_flight == [1]
    first = write_curves(str(store), early)
    assert sorted(first.created) == ["evolution", "learner:default"]
    c = client(store)
    evo = mlflow_runs(c)["evolution"].info.run_id
    assert [s for s, _, _ in history(c, evo, "pass_at_k")] == [0]
    assert mlflow_runs(c)["evolution"].info.status == "RUNNING"

    out = ok(run.hx("export", RUN, "--mlflow", str(store)))  # the finished run: round 1 added to the same runs
    assert "new metric points" in out.stdout and " 0 new" not in out.stdout
    runs = mlflow_runs(c)
    assert runs["evolution"].info.run_id == evo and runs["evolution"].info.status == "FINISHED"
    assert [s for s, _, _ in history(c, evo, "pass_at_k")] == [0, 1]
    before = {k: history(c, r.info.run_id, k) for r in runs.values() for k in r.data.metrics}

    again = ok(run.hx("export", RUN, "--mlflow", str(store)))
    assert "(experiment" in again.stdout and "; 0 new metric points" in again.stdout
    assert len(c.search_experiments(view_type=ViewType.ALL)) == 2  # MLflow's Default and the run's
    runs = mlflow_runs(c)
    assert len(runs) == 2
    assert {k: history(c, r.info.run_id, k) for r in runs.values() for k in r.data.metrics} == before


def test_a_store_hx_may_not_write_is_refused_and_left_as_it_was(run: Coevolved, tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("my notes\n")
    assert error_line(run.hx("export", RUN, "--mlflow", str(text))) == \
        f"error: MLflow store {text} exists and is not a SQLite file; refusing to write it"
    assert text.read_text() == "my notes\n"

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE mine (x INTEGER)")
    kept = other.read_bytes()
    assert "is a SQLite database but not an MLflow store" in error_line(run.hx("export", RUN, "--mlflow", str(other)))
    assert other.read_bytes() == kept

    foreign = tmp_path / "foreign.db"
    client(foreign).create_experiment(RUN)  # someone's own experiment with the run's name
    kept = foreign.read_bytes()
    assert error_line(run.hx("export", RUN, "--mlflow", f"sqlite:///{foreign}")) == (
        f"error: MLflow store sqlite:///{foreign} has an experiment named {RUN!r} that hx did not write (no "
        "hx.run_id tag); refusing to write into it")
    assert foreign.read_bytes() == kept

    twin = tmp_path / "twin.db"
    ok(run.hx("export", RUN, "--mlflow", str(twin)))
    c = client(twin)
    exp = c.get_experiment_by_name(RUN)
    assert exp is not None
    c.set_experiment_tag(exp.experiment_id, "hx.ledger", "another run's ledger")
    kept = twin.read_bytes()
    assert "holds another hx run of id" in error_line(run.hx("export", RUN, "--mlflow", str(twin)))
    assert twin.read_bytes() == kept

    assert error_line(run.hx("export", "nope", "--mlflow", str(tmp_path / "new.db"))) == \
        "error: run 'nope' has no ledger (no evolution run of that id is on HX_LEDGER)"
    assert "only a local SQLite file" in error_line(run.hx("export", RUN, "--mlflow", "postgresql://h/db"))
    assert "writes no directory" in error_line(run.hx("export", RUN, str(tmp_path / "d"), "--mlflow", "x.db"))
    assert error_line(run.hx("export", RUN)) == \
        "error: hx export RUN DIR: give the directory DIR to write (or --mlflow STORE)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.db", "notes.db", "other.db", "twin.db"]


def test_a_failure_mid_way_leaves_the_store_as_it_was(run: Coevolved, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "curves.db"
    ledger, learner = run.stamped()
    last = max(i for i, (e, _) in enumerate(ledger) if isinstance(e, RoundDecided))
    write_curves(str(store), run_curves(ledger[:last], learner))
    kept = store.read_bytes()
    top_up = mlflow_store.top_up
    calls: list[str] = []

    def fail_on_the_second_run(store: Any, mlflow_run: Any, curve: Any) -> int:
        calls.append(curve.curve)
        if len(calls) == 2:  # the evolution's points are in the copy by now
            raise MlflowException("disk on fire")
        return top_up(store, mlflow_run, curve)

    monkeypatch.setattr(mlflow_store, "top_up", fail_on_the_second_run)
    assert error_line(run.hx("export", RUN, "--mlflow", str(store))) == \
        f"error: MLflow refused to write {store}: disk on fire; nothing was exported"
    assert calls == ["evolution", "learner:default"]
    assert store.read_bytes() == kept
    assert [p.name for p in tmp_path.iterdir()] == ["curves.db"]  # no scratch copy left


def test_without_the_extra_the_command_says_how_to_install_it(run: Coevolved, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow.store.tracking.sqlalchemy_store", None)  # as if not installed
    assert error_line(run.hx("export", RUN, "--mlflow", str(tmp_path / "s.db"))) == \
        "error: hx export --mlflow needs MLflow's tracking client: pip install 'hx-foundry[mlflow]'"
    assert not any(tmp_path.iterdir())
