"""An MLflow tracking store on local SQLite, written all or nothing: where ``hx export --mlflow`` puts a run's curves.

``write_curves(spec, curves)`` copies the store (SQLite's backup API: a consistent snapshot) to a
scratch file beside it, writes the run's experiment and MLflow runs into the copy with MLflow's own
``SqlAlchemyStore`` (which creates or checks its schema), and puts the copy in the store's place
(``staged``) only when everything is written and the store has not changed meanwhile: a failure
leaves the store as it was. Re-exporting is idempotent: the experiment is found by its ``hx.run_id`` tag and each
MLflow run by its ``hx.curve`` tag, and only the points the run lacks (by key, step and time) are
added; params already there are kept, tags are set again. A store hx may not write is refused
before anything is written: a file that is not SQLite, a SQLite database that is not an MLflow
store, an experiment of that name without hx's tag, or hx's experiment of another run of that id.
MLflow is imported here only, when an export runs: it is an optional extra.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hx.report.errors import ReportError
from hx.report.mlflow_curves import TAG_CURVE, TAG_LEDGER, TAG_RUN, CurveRun, RunCurves

Store = Any
"""MLflow's ``SqlAlchemyStore`` (its methods carry no annotations, so it is handled as ``Any``)."""

SQLITE_HEADER = b"SQLite format 3\x00"
MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs", "metrics"})
"""Tables every MLflow SQLite store has: a database with other tables and not these is someone else's."""
BATCH = 1000
"""Most metric points in one ``log_batch`` (MLflow's ``MAX_METRICS_PER_BATCH``); params and tags go 100 at a time."""
INSTALL = "hx export --mlflow needs MLflow's tracking client: pip install 'hx-foundry[mlflow]'"


@dataclass(frozen=True)
class Written:
    """What an export added to the store."""

    experiment: str
    created: list[str]
    """Curves whose MLflow run this export created (the others existed and were topped up)."""
    points: int
    """Metric points added (0: the store already held them all)."""


def store_path(spec: str) -> Path:
    """The SQLite file ``STORE`` names: a path or a ``sqlite:///`` URI (``ReportError`` for anything else)."""
    if spec.startswith("sqlite:///"):
        spec = spec[len("sqlite:///"):]  # sqlite:////abs keeps its slash: an absolute path
    elif "://" in spec or spec.startswith("sqlite:"):
        raise ReportError(f"MLflow store {spec!r}: only a local SQLite file is written (a path or sqlite:///PATH)")
    if not spec or spec.startswith(":memory:"):
        raise ReportError("MLflow store: give the path of a SQLite file (or sqlite:///PATH)")
    return Path(spec).expanduser().absolute()


def mlflow_store_class() -> Any:
    """MLflow's SQL tracking store, imported now (the extra is optional); ``ReportError`` saying how to install it."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # the optional extra: only when exporting
    except ImportError:
        raise ReportError(INSTALL) from None
    return SqlAlchemyStore


def check_store(path: Path, shown: str) -> None:
    """``ReportError`` when ``path`` exists and is no SQLite file (a missing or empty file becomes a new store)."""
    try:
        if path.exists() and not path.is_file():
            raise ReportError(f"MLflow store {shown} exists and is not a file")
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as f:
                if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                    raise ReportError(f"MLflow store {shown} exists and is not a SQLite file; refusing to write it")
    except OSError as exc:
        raise ReportError(f"cannot read MLflow store {shown}: {exc.strerror or exc}") from None


def write_curves(spec: str, curves: RunCurves) -> Written:
    """Write a run's curves into the SQLite MLflow store ``spec`` names, all or nothing (see the module)."""
    store_cls = mlflow_store_class()
    path = store_path(spec)
    check_store(path, spec)
    from mlflow.exceptions import MlflowException  # the optional extra, imported with the store
    from sqlalchemy.exc import SQLAlchemyError  # MLflow's dependency, as optional

    try:
        with quiet("mlflow", "alembic"), staged(path, spec) as scratch:
            store = store_cls(f"sqlite:///{scratch}", (path.parent / "mlartifacts").as_uri())
            try:
                return fill(store, curves, spec)
            finally:
                store.engine.dispose()  # close the copy's connections before it moves into place
                # MLflow caches engines by URI (a private map): drop the scratch file's, never used again
                getattr(store_cls, "_engine_map", {}).pop(f"sqlite:///{scratch}", None)
    except MlflowException as exc:
        raise ReportError(f"MLflow refused to write {spec}: {one_line(exc.message)}; nothing was exported") from None
    except (OSError, sqlite3.Error, SQLAlchemyError) as exc:
        raise ReportError(f"cannot write MLflow store {spec}: {exc}; nothing was exported") from None


@contextmanager
def staged(path: Path, shown: str) -> Iterator[Path]:
    """A scratch copy of the store beside it, put in the store's place if the block ends without error.

    An existing store is overwritten in place with SQLite's backup API (one write transaction on the
    store, so a reader sees it before or after, and an open ``mlflow ui`` keeps reading the same
    file); a new one is the scratch file renamed.
    """
    scratch = path.parent / f".{path.name}.hx-export-{uuid.uuid4().hex[:12]}"
    before = stamp(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if before is not None:
            with closing(sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)) as src, \
                    closing(sqlite3.connect(scratch)) as dst:
                src.backup(dst)
                tables = {row[0] for row in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and not tables >= MLFLOW_TABLES:
                raise ReportError(f"MLflow store {shown} is a SQLite database but not an MLflow store "
                                  f"(no {', '.join(sorted(MLFLOW_TABLES - tables))} table); refusing to write it")
        yield scratch
        if stamp(path) != before:
            raise ReportError(f"MLflow store {shown} changed while the export wrote; nothing was exported: run it "
                              "again")
        if before is None:
            os.replace(scratch, path)
        else:
            with closing(sqlite3.connect(scratch)) as src, closing(sqlite3.connect(path)) as dst:
                src.backup(dst)
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"MLflow store {shown} is not a readable SQLite database ({exc}); refusing to write it") \
            from None
    finally:
        scratch.unlink(missing_ok=True)


@contextmanager
def quiet(*names: str) -> Iterator[None]:
    """Loggers at WARNING for the block: MLflow announces every schema migration of a new store at INFO."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells a file changed: inode, size, modification time (None: missing or empty)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns) if st.st_size else None


def fill(store: Store, curves: RunCurves, shown: str) -> Written:
    """Find or create the run's experiment and its MLflow runs in ``store``, and add the points they lack."""
    experiment = hx_experiment(store, curves, shown)
    existing = {r.data.tags.get(TAG_CURVE): r for r in all_runs(store, experiment)}
    created: list[str] = []
    added = 0
    for curve in curves.runs:
        run = existing.get(curve.curve)
        if run is None:
            run = store.create_run(experiment, "hx", curve.start_ms, [], curve.name)
            created.append(curve.curve)
        added += top_up(store, run, curve)
    return Written(experiment, created, added)


def hx_experiment(store: Store, curves: RunCurves, shown: str) -> str:
    """The id of the run's experiment (created when missing); ``ReportError`` when the store's is not hx's run's."""
    from mlflow.entities import ExperimentTag, ViewType  # the optional extra: only when exporting

    ours = [e for e in all_experiments(store, ViewType.ALL) if e.tags.get(TAG_RUN) == curves.run_id]
    if not ours:
        named = store.get_experiment_by_name(curves.run_id)
        if named is not None:
            raise ReportError(f"MLflow store {shown} has an experiment named {curves.run_id!r} that hx did not write "
                              f"(no {TAG_RUN} tag); refusing to write into it")
        return str(store.create_experiment(curves.run_id, None, [ExperimentTag(k, v) for k, v in
                                                                  curves.tags.items()]))
    found = ours[0]
    if found.tags.get(TAG_LEDGER) != curves.ledger:
        raise ReportError(f"MLflow store {shown} holds another hx run of id {curves.run_id!r} (experiment "
                          f"{found.name!r}, ledger {found.tags.get(TAG_LEDGER)}); refusing to mix them")
    if found.lifecycle_stage != "active":
        raise ReportError(f"MLflow store {shown}: experiment {found.name!r} of run {curves.run_id} is deleted; "
                          "restore it (mlflow experiments restore) to export into it again")
    return str(found.experiment_id)


def all_experiments(store: Store, view: int) -> list[Any]:
    """Every experiment of the store, page by page."""
    out: list[Any] = []
    token = None
    while True:
        page = store.search_experiments(view_type=view, max_results=1000, page_token=token)
        out += page
        token = page.token
        if not token:
            return out


def all_runs(store: Store, experiment: str) -> list[Any]:
    """Every active MLflow run of an experiment, page by page (a run a user deleted is not reused)."""
    from mlflow.entities import ViewType  # the optional extra: only when exporting

    out: list[Any] = []
    token = None
    while True:
        page = store.search_runs([experiment], "", ViewType.ACTIVE_ONLY, 1000, None, token)
        out += page
        token = page.token
        if not token:
            return out


def top_up(store: Store, run: Any, curve: CurveRun) -> int:
    """Add the points, params and tags ``run`` lacks, then its status and end; the number of points added."""
    from mlflow.entities import Metric, Param, RunStatus, RunTag  # the optional extra: only when exporting

    run_id = run.info.run_id
    have: set[tuple[str, int, int]] = set()
    for k in {p.key for p in curve.points}:
        have |= {(k, m.step, m.timestamp) for m in store.get_metric_history(run_id, k)}
    new = [Metric(p.key, p.value, p.time_ms, p.step) for p in curve.points if (p.key, p.step, p.time_ms) not in have]
    known = run.data.params
    params = [Param(k, v) for k, v in sorted(curve.params.items()) if k not in known]
    tags = [RunTag(k, v) for k, v in sorted(curve.tags.items())]
    for chunk in chunks(new, BATCH):
        store.log_batch(run_id, chunk, [], [])
    for chunk in chunks([*params, *tags], 100):
        store.log_batch(run_id, [], [p for p in chunk if isinstance(p, Param)], [t for t in chunk if
                                                                                  isinstance(t, RunTag)])
    store.update_run_info(run_id, RunStatus.from_string(curve.status), curve.end_ms, curve.name)
    return len(new)


def chunks(items: Sequence[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of at most ``size``."""
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def one_line(text: str) -> str:
    """A message on one line."""
    return " ".join(str(text).split())
