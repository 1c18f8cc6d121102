"""``hx export``: an evolution run's directory (the HarnessX paper's appendix E.1 layout), folded from its ledger.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(export_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import click
import msgspec

from hx.cli._app import App, pass_app, quarantine_note, run, run_id_option
from hx.cli.trajectories import write_trajectories
from hx.replay.audit import verified_ledger
from hx.report.errors import ReportError
from hx.report.export import MARKER, ExportKind, ExportMarker, hx_version, render
from hx.report.inspect_export import inspect_export
from hx.report.mlflow_curves import EVOLUTION, RunCurves, read_curves
from hx.report.mlflow_store import check_store, mlflow_store_class, store_path, write_curves

_WHAT: dict[ExportKind, str] = {"hx export": "an hx export run directory",
                                "hx export --inspect": "an hx export --inspect log directory"}


@click.command("export")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.argument("directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--trajectories", is_flag=True,
              help="Also write each round's main-rollout attempts from the trace, one file each: the attempt's "
                   "messages once, then its events referring to them (R<n>/trajectories/TASK.ATTEMPT.jsonl).")
@click.option("--inspect", "inspect", is_flag=True,
              help="Write RUN's evaluations (each round's main rollout, each held-out evaluation) to DIR as Inspect "
                   "AI eval logs instead, for `inspect view --log-dir DIR`.")
@click.option("--force", is_flag=True,
              help="Replace DIR when an earlier hx export of the same kind wrote it (it has the .hx-export "
                   "marker); any other non-empty directory is refused.")
@click.option("--mlflow", "store", metavar="STORE",
              help="Instead of DIR, write RUN's evolution and learner curves into the MLflow tracking store STORE "
                   "(a SQLite file or sqlite:///PATH); again later adds only what is new (docs/viewers.md).")
@pass_app
def export_command(app: App, run_id: str, directory: Path | None, trajectories: bool, inspect: bool, force: bool,
                   store: str | None) -> None:
    """Write RUN's evolution record to DIR, folded from its edit ledger (``--inspect``: its evaluations as Inspect
    AI eval logs; ``--mlflow STORE``: its curves into an MLflow store).

    DIR gets INDEX.md, journal.md, curves.json, scoreboard.json, audit.jsonl, data/ and one
    R<n>/ folder per round (landscape, candidate cards, applied harnesses, decision, gate
    verdicts, regressions, task digests) and the marker .hx-export. The same ledger gives
    the same bytes. The files are written beside DIR first and moved into place at the end,
    so a failure leaves DIR as it was. DIR is never hx's data dir, a folder containing it
    or inside it, nor the current or home directory or a parent of them.

    With --inspect, DIR gets one Inspect AI eval log (JSON) per round's main rollout and per
    held-out evaluation, and the marker; attempts still in flight are left out, with a note.

    With --mlflow STORE (and no DIR), RUN's curves go to an MLflow experiment named RUN instead:
    one MLflow run for the evolution (a point per finished round) and one per learner.
    """
    if store is not None:
        export_mlflow(app, run_id, store, given=directory is not None or trajectories or force or inspect)
        return
    if directory is None:
        raise ReportError("hx export RUN DIR: give the directory DIR to write (or --mlflow STORE)")
    if inspect and trajectories:
        raise ReportError("--trajectories does not apply with --inspect (the eval logs hold the conversations)")
    kind: ExportKind = "hx export --inspect" if inspect else "hx export"
    target = check_target(directory, force=force, data_dir=app.settings.data_dir, kind=kind)
    if inspect:
        count = run(_export_inspect(app, run_id, target, force=force))
        click.echo(f"exported run {run_id} to {directory} as Inspect AI eval logs ({count} logs)")
        return
    count = run(_export(app, run_id, target, with_trajectories=trajectories, force=force))
    click.echo(f"exported run {run_id} to {directory} ({count} files)")


def export_mlflow(app: App, run_id: str, store: str, *, given: bool) -> None:
    """``hx export RUN --mlflow STORE``: the run's curves into an MLflow store (``hx.report.mlflow_store``)."""
    if given:
        raise ReportError("hx export --mlflow STORE writes no directory: leave out DIR, --inspect, --trajectories "
                          "and --force")
    mlflow_store_class()  # before reading the log: say at once when the extra is missing
    check_store(store_path(store), store)
    curves = run(_read_curves(app, run_id))
    if curves.in_flight:
        click.echo(f"note: round(s) {', '.join(map(str, curves.in_flight))} of run {run_id} not finished on the "
                   "ledger: left out (a later export adds them)", err=True)
    written = write_curves(store, curves)
    learners = sum(r.curve != EVOLUTION for r in curves.runs)
    click.echo(f"exported run {run_id} to MLflow store {store} (experiment {run_id!r}, id {written.experiment}: "
               f"evolution{f' and {learners} learner(s)' if learners else ''}; {written.points} new metric points)")


async def _read_curves(app: App, run_id: str) -> RunCurves:
    async with app.connect() as conn:
        curves = await read_curves(conn.log, run_id, app.settings.data_dir.resolve() / "plugins")
        quarantine_note(conn.log)
    return curves


def check_target(directory: Path, *, force: bool, data_dir: Path, kind: ExportKind = "hx export") -> Path:
    """The absolute target directory, if an export may go there; else ``ReportError`` saying why.

    Never hx's data dir, a folder containing it or one inside it, nor the current or home
    directory or a parent of them. A missing or empty directory is written; a non-empty one
    only when an earlier ``hx export`` wrote it (its ``.hx-export`` marker) and ``force`` is given.
    """
    target = directory.expanduser().absolute()
    try:
        real, data = target.resolve(), data_dir.expanduser().resolve()
        if real == data or real in data.parents:
            what = "is" if real == data else "contains"
            raise ReportError(f"refusing to export into {directory}: it {what} hx's data dir ({data_dir})")
        if data in real.parents:
            raise ReportError(f"refusing to export into {directory}: it is inside hx's data dir ({data_dir})")
        for name, place in (("the current directory", Path.cwd()), ("the home directory", _home())):
            if place is not None and (real == place.resolve() or real in place.resolve().parents):
                raise ReportError(f"refusing to export into {directory}: it is {name} or one of its parents")
        if target.exists() and not target.is_dir():
            raise ReportError(f"{directory} exists and is not a directory")
        replaceable(target, directory, force=force, kind=kind)
    except OSError as exc:
        raise ReportError(f"cannot use {directory}: {exc.strerror or exc}") from None
    return target


def _home() -> Path | None:
    try:
        return Path.home()
    except RuntimeError:  # no HOME and no passwd entry: there is no home to protect
        return None


def replaceable(target: Path, shown: Path, *, force: bool, kind: ExportKind = "hx export") -> bool:
    """Whether ``target`` holds an earlier export to replace (False: missing or empty); else ``ReportError``.

    A non-empty directory without a readable ``.hx-export`` marker, or with the marker of
    another kind of export, is refused, ``force`` or not; an earlier export of ``kind`` is
    replaced only with ``force``.
    """
    if not target.is_dir() or not any(target.iterdir()):
        return False
    marker = target / MARKER
    try:
        if marker.is_symlink() or not marker.is_file():
            raise ReportError(f"not an hx export: {shown} is not empty and has no {MARKER} (the marker hx export "
                              "writes); refusing to replace it, --force or not")
        found = ExportMarker.read(marker.read_bytes())
    except msgspec.DecodeError:
        raise ReportError(f"not an hx export: {shown}/{MARKER} is not the marker hx export writes; refusing to "
                          "replace it, --force or not") from None
    if found.kind != kind:
        raise ReportError(f"not {_WHAT[kind]}: {shown} holds {_WHAT[found.kind]} (run {found.run_id}); refusing "
                          "to replace it, --force or not")
    if not force:
        raise ReportError(f"{shown} holds an earlier export (run {found.run_id}); pass --force to replace it")
    return True


class Staging:
    """A scratch directory beside the target, moved into its place once every file is written."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.path = target.parent / f".{target.name}.export-{uuid.uuid4().hex[:12]}"
        self.done = False

    def __enter__(self) -> Staging:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.path.mkdir()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not self.done:
            shutil.rmtree(self.path, ignore_errors=True)

    def write(self, files: Mapping[str, bytes]) -> None:
        """Write files by relative path."""
        for rel, data in files.items():
            path = self.path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def commit(self, *, force: bool, kind: ExportKind = "hx export") -> None:
        """Put the written directory in the target's place (an earlier export only with ``force``; removed after)."""
        old: Path | None = None
        # checked again: it may have changed while we wrote
        if replaceable(self.target, self.target, force=force, kind=kind):
            old = self.target.parent / f".{self.target.name}.replaced-{uuid.uuid4().hex[:12]}"
            self.target.rename(old)
        elif self.target.is_dir():
            self.target.rmdir()
        try:
            self.path.rename(self.target)
        except OSError:
            if old is not None:
                old.rename(self.target)  # put the previous contents back
            raise
        self.done = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


async def _export(app: App, run_id: str, target: Path, *, with_trajectories: bool, force: bool) -> int:
    async with app.connect() as conn:
        ledger = await verified_ledger(conn.log, run_id, app.settings.data_dir.resolve() / "plugins")
        records = [e.event for e in ledger.entries]
        try:
            with Staging(target) as staging:
                trajectories = await write_trajectories(conn.log, run_id, ledger, staging.path) if (
                    with_trajectories) else {}
                files = render(records, trajectories)
                staging.write(files)
                staging.commit(force=force)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise ReportError(f"cannot write {target}: {exc.strerror or exc}{where}; nothing was exported") from None
        quarantine_note(conn.log)
    return len(files) + sum(len(v) for t in trajectories.values() for v in t.values())


async def _export_inspect(app: App, run_id: str, target: Path, *, force: bool) -> int:
    async with app.connect() as conn:
        ledger = await verified_ledger(conn.log, run_id, app.settings.data_dir.resolve() / "plugins")
        export = await inspect_export(conn.log, run_id, ledger)
        files = export.files | {MARKER: ExportMarker(kind="hx export --inspect", run_id=run_id,
                                                     hx_version=hx_version()).encode().encode()}
        try:
            with Staging(target) as staging:
                staging.write(files)
                staging.commit(force=force, kind="hx export --inspect")
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise ReportError(f"cannot write {target}: {exc.strerror or exc}{where}; nothing was exported") from None
        if export.in_flight:
            click.echo(f"note: {export.in_flight} attempt(s) still in flight (started, not finished) were left out; "
                       "export again once they finish", err=True)
        quarantine_note(conn.log)
    return len(export.files)
