"""``hx projections``: list the read models and plugins, show their checkpoints, rebuild or run them.

A projection is named by its registered name (built-in or an installed ``hx.projections``
entry point) or as ``module:Class`` / ``path/to/file.py:Class`` (``projections.plugins``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import click
import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hx.cli._app import App, named_projection, pass_app, quarantine_note, run, stderr_console, stdout_console
from hx.replay.errors import TimeTravelError
from hx.replay.timetravel import AsOf, parse_as_of, run_marks
from projections.base import Projection
from projections.errors import ProjectionFailed
from projections.failures import PROJECTION_FAILURES, call_failed
from projections.registry import BUILTINS, PROJECTIONS, available
from projections.runner import START, ProjectionRunner
from schemas.errors import HxError
from streams.log import EventLog
from streams.redaction import scrub

log = structlog.get_logger("hx.cli")
_UPDATES = 200
"""Progress bar updates per run: rich's per-update cost would dominate a fold of cheap events."""
_WHOLE = 2**31
"""A frame index past any real one: position ``(seq, _WHOLE)`` has seen all of message ``seq``."""


@click.group("projections")
def projections_group() -> None:
    """Read models folded from the log."""


@projections_group.command("list")
def list_projections() -> None:
    """List projections: name, stream, event types read, version, and where each comes from.

    Built-in ones first, then plugins installed under the ``hx.projections`` entry point;
    an entry point that cannot be loaded is reported on stderr.
    """
    found, broken = available()
    table = Table("name", "stream", "reads", "version", box=None, header_style="bold")
    table.add_column("source", no_wrap=True)  # a plugin's module:Class stays copyable
    for name, cls in sorted(found.items(), key=lambda item: (item[0] not in BUILTINS, item[0])):
        reads = ", ".join(sorted(cls.reads)) if cls.reads else "all"
        source = "built-in" if name in BUILTINS else f"plugin {cls.__module__}:{cls.__qualname__}"
        table.add_row(name, cls.stream, reads, str(cls.version), source)
    stdout_console().print(table)
    for name, reason in sorted(broken.items()):
        click.echo(f"warning: entry point {name!r} skipped: {reason}", err=True)


@projections_group.command("status")
@click.argument("name", required=False)
@pass_app
def status(app: App, name: str | None) -> None:
    """Show checkpoints: position, events applied, digest, lag.

    NAME may be a built-in, an installed plugin or ``module:Class``. Without NAME: every
    built-in read model, and the other projections (exports, plugins) that have a checkpoint.
    The lag is how many messages the log's end is past the checkpoint.
    """
    names = [name] if name else sorted(available()[0])
    for n in names:
        named_projection(n)  # fail on an unknown name before connecting
    run(_status(app, names, every=name is None))


async def _status(app: App, names: list[str], every: bool = False) -> None:
    async with app.connect() as conn:
        for name in names:
            proj = named_projection(name)
            runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj)
            cp = await runner.status()
            if cp is None and every and name not in PROJECTIONS:
                continue  # an export or plugin never run here is not news
            end = await conn.log.last_seq(proj.stream)
            click.echo(f"{proj.name} (v{proj.version}, {proj.stream} at {end})")
            if cp is None:
                click.echo("  no checkpoint: never run (`hx projections rebuild` builds it)")
                continue
            behind = max(0, end - cp.seq)
            click.echo(f"  position  {_position((cp.seq, cp.index))}")
            click.echo(f"  applied   {cp.applied} events")
            click.echo(f"  behind    {behind} message(s)" if behind else "  behind    0 (up to date)")
            click.echo(f"  digest    {cp.digest}")
            if cp.version != proj.version:
                click.echo(f"  stale: checkpoint of version {cp.version}; the next run rebuilds it")


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields the ``progress(seq, stop)`` callback runners take."""
    console = stderr_console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=None)
        shown = 0

        def update(seq: int, stop: int) -> None:
            nonlocal shown
            if seq - shown >= max(1, stop // _UPDATES) or seq >= stop:
                bar.update(task, completed=seq, total=stop)
                shown = seq

        yield update


def _position(pos: tuple[int, int]) -> str:
    """``seq.index``; a position set by ``--from`` (past any frame index) shows as its sequence."""
    return f"{pos[0]}" if pos[1] >= _WHOLE else f"{pos[0]}.{pos[1]}"


def _summary(runner: ProjectionRunner[Any], elapsed: float, applied: int) -> None:
    rate = applied / elapsed if elapsed > 0 else 0.0
    click.echo(f"{runner.projection.name}: position {_position(runner.position)}, "
               f"{runner.applied} events applied")
    click.echo(f"  digest    {runner.digest}")
    click.echo(f"  folded    {applied} events in {elapsed:.2f}s ({rate:,.0f} events/s)")


@projections_group.command("rebuild")
@click.argument("name")
@click.option("--as-of", "as_of", default=None, metavar="ROUND|SEQ",
              help="Fold only up to rN (round N of --run) or a sequence of the projection's stream, from the nearest "
                   "snapshot at or before it; the checkpoint is left as it is.")
@click.option("--run", "run_id", default=None, metavar="RUN", help="The run whose round --as-of rN names.")
@pass_app
def rebuild(app: App, name: str, as_of: str | None, run_id: str | None) -> None:
    """Forget the checkpoint and fold the whole log again (--as-of: the state at a point, checkpoint untouched)."""
    from projections.otel_spans import OtelSpans  # here: it loads OpenTelemetry's SDK

    if isinstance(named_projection(name), OtelSpans) and as_of is None:
        # A rebuild without exporting would checkpoint past every span: the next export would skip them all.
        raise HxError("otel exports spans as it folds: "
                      "use `hx projections run otel --from-start --once --otlp-endpoint URL`")
    if as_of is None:
        run(_rebuild(app, name))
        return
    point = parse_as_of(as_of)
    if point.round is not None and run_id is None:
        raise TimeTravelError(f"--as-of {as_of} names a round: say whose with --run RUN")
    run(_rebuild_as_of(app, name, point, run_id))


async def _rebuild_as_of(app: App, name: str, point: AsOf, run_id: str | None) -> None:
    async with app.connect() as conn:
        proj = named_projection(name)
        seq = point.seq if point.seq is not None else (await run_marks(conn.log, run_id or "")).position(
            point, proj.stream)
        started = time.perf_counter()
        fold = await ProjectionRunner(conn.log, proj).fold_as_of(seq)
        elapsed = time.perf_counter() - started
        click.echo(f"{name} as of {point} ({proj.stream} {seq}): position {fold.position[0]}.{fold.position[1]}")
        click.echo(f"  digest    {fold.digest}")
        click.echo(f"  folded    {fold.folded} events in {elapsed:.2f}s from {fold.start_kind} {fold.start}, "
                   f"{fold.written} snapshot(s) stored")
        quarantine_note(conn.log)


async def _rebuild(app: App, name: str) -> None:
    async with app.connect() as conn:
        runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, named_projection(name))
        started = time.perf_counter()
        with progress_bar(f"rebuilding {name}") as progress:
            await runner.rebuild(progress=progress)
        _summary(runner, time.perf_counter() - started, runner.applied)
        _view(runner)
        quarantine_note(conn.log)


@projections_group.command("run")
@click.argument("name", metavar="NAME|module:Class")
@click.option("--once", is_flag=True, help="Build to the log's end and stop, instead of following it.")
@click.option("--from-start", is_flag=True, help="Forget the checkpoint and fold the whole log again.")
@click.option("--from", "from_seq", type=click.IntRange(min=1), metavar="SEQ",
              help="Forget the checkpoint and fold the events from log sequence SEQ on (earlier ones are skipped).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None, metavar="N",
              help="Checkpoint after every N applied events (default: every 50,000, or less often for a large state).")
@click.option("--otlp-endpoint", metavar="URL",
              help="otel only: the OTLP/HTTP endpoint spans go to (http://host:4318, or a full .../v1/traces URL).")
@click.option("--otlp-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="otel only: seconds an export may take, the exporter's retries included.")
@click.option("--project", metavar="NAME",
              help="otel only: the project every span goes to (openinference.project.name); "
                   "default: each run's benchmark, else hx.")
@click.option("--content", is_flag=True,
              help="otel only: add message content and tool input/output to the spans (secrets scrubbed).")
@pass_app
def run_projection(app: App, name: str, once: bool, from_start: bool, from_seq: int | None,
                   checkpoint_every: int | None, otlp_endpoint: str | None, otlp_timeout: float, project: str | None,
                   content: bool) -> None:
    """Build a projection from the log, resuming from its checkpoint, then follow it (--once: stop at its end).

    NAME is a built-in (``hx projections list``), an installed plugin, or a class given as
    ``module:Class`` or ``path/to/file.py:Class``. ``otel`` exports every finished attempt
    as an OpenTelemetry trace to ``--otlp-endpoint``.
    """
    from projections.otel_spans import OtelSpans  # here: it loads OpenTelemetry's SDK

    if from_start and from_seq is not None:
        raise click.UsageError("--from-start and --from are exclusive")
    proj = named_projection(name)
    if isinstance(proj, OtelSpans) and not otlp_endpoint:
        raise HxError("the otel projection exports spans: give --otlp-endpoint URL (e.g. http://127.0.0.1:4318)")
    for flag, given in (("--otlp-endpoint", otlp_endpoint), ("--project", project), ("--content", content)):
        if given and not isinstance(proj, OtelSpans):
            raise HxError(f"{flag} is for the otel projection, not {proj.name!r}")
    if project is not None and not project.strip():
        raise HxError("--project: give a project name")
    otlp = OtlpTarget(otlp_endpoint, otlp_timeout, project or "", content) if otlp_endpoint else None
    run(_run(app, name, not once, checkpoint_every, from_start=from_start, from_seq=from_seq, otlp=otlp))


class OtlpTarget(NamedTuple):
    """Where and how the otel projection exports: endpoint, timeout, project (empty: each run's), content."""

    endpoint: str
    timeout: float
    project: str
    content: bool


def _runner(event_log: EventLog, proj: Projection[Any], checkpoint_every: int | None,
            otlp: OtlpTarget | None) -> ProjectionRunner[Any]:
    """A plain runner, or for ``otel`` one that exports each finished attempt's spans."""
    from projections.otel_spans import OtelSpans, SpanExportRunner, otlp_exporter  # here: it loads OpenTelemetry's SDK

    if otlp is not None and isinstance(proj, OtelSpans):
        return SpanExportRunner(event_log, OtelSpans(content=otlp.content), otlp_exporter(otlp.endpoint, otlp.timeout),
                                target=otlp.endpoint, checkpoint_every=checkpoint_every, project=otlp.project)
    return ProjectionRunner(event_log, proj, checkpoint_every=checkpoint_every)


async def _start(runner: ProjectionRunner[Any], name: str, from_start: bool, from_seq: int | None) -> None:
    """Resume from the checkpoint, or reset to the start or to just before ``from_seq``."""
    if from_start or from_seq is not None:
        last = await runner.log.last_seq(runner.projection.stream)
        if from_seq is not None and from_seq > last + 1:
            raise HxError(f"--from {from_seq} is past the end of {runner.projection.stream} "
                          f"(last sequence {last}; --from {last + 1} folds only new events)")
        runner.restart()  # the stored checkpoint stays until this fold's first one replaces it
        if from_seq is not None and from_seq > 1:
            # Everything in messages before SEQ counts as seen: the first event folded is (SEQ, 0).
            runner.position = (from_seq - 1, _WHOLE)
        click.echo(f"{name}: folding from {'the start' if runner.position == START else f'sequence {from_seq}'}")
        return
    await runner.load()
    if runner.resumed_from is None:
        click.echo(f"{name}: no usable checkpoint, folding from the start")
    else:
        click.echo(f"{name}: resumed from {_position(runner.resumed_from)}")


async def _run(app: App, name: str, follow: bool, checkpoint_every: int | None, *, from_start: bool = False,
               from_seq: int | None = None, otlp: OtlpTarget | None = None) -> None:
    async with app.connect() as conn:
        proj = named_projection(name)
        name = proj.name
        runner = _runner(conn.log, proj, checkpoint_every, otlp)
        await _start(runner, name, from_start, from_seq)
        before, started = runner.applied, time.perf_counter()
        # A failed export raises ExportFailed out of here: its error line is the whole report (no summary
        # of what did not go out).
        with progress_bar(f"catching up {name}") as progress:
            await runner.catch_up(progress=progress)
        _summary(runner, time.perf_counter() - started, runner.applied - before)
        _exported(runner)
        if not follow:
            _view(runner)
        quarantine_note(conn.log)
        if follow:
            await _follow(runner, name)


async def _follow(runner: ProjectionRunner[Any], name: str) -> None:
    """Fold new events as they arrive until stopped; report where it stopped (not after a failed export)."""
    from projections.errors import ExportFailed
    from projections.otel_spans import SpanExportRunner

    if isinstance(runner, SpanExportRunner):
        runner.live = True  # following: each finished attempt goes out at once
    click.echo(f"{name}: following the log (Ctrl-C stops; --once builds to the end and stops)", err=True)
    failed = False
    try:
        while True:
            try:
                await runner.follow()
                break
            except TimeoutError:
                # A timeout creating or inspecting the consumer gets out of EventLog.subscribe;
                # the runner resumes from its position, so following again loses nothing.
                log.debug("follow timed out while idle; following again", projection=name)
    except (ExportFailed, ProjectionFailed):  # its error line is the whole report
        failed = True
        raise
    finally:
        if not failed:
            click.echo(f"{name}: stopped at {_position(runner.position)}, "
                       f"{runner.applied} events applied, digest {runner.digest}", err=True)
            _exported(runner, err=True)


def _view(runner: ProjectionRunner[Any]) -> None:
    """The projection's own short view of its state, when it offers one (a ``summary(state) -> str`` method)."""
    summary = getattr(runner.projection, "summary", None)
    if callable(summary):
        try:
            text = str(summary(runner.state)).rstrip()
        except PROJECTION_FAILURES as exc:  # a plugin's own failure (any exception, or its sys.exit)
            raise call_failed(runner.projection, "summary()", exc) from exc
        if text:
            click.echo(text)


def _exported(runner: ProjectionRunner[Any], err: bool = False) -> None:
    """Report what an export runner sent (nothing for another runner)."""
    from projections.otel_spans import SpanExportRunner  # here: it loads OpenTelemetry's SDK

    if isinstance(runner, SpanExportRunner):
        click.echo(f"  exported  {runner.exported_spans} spans of {runner.exported_traces} attempt traces "
                   f"to {scrub(runner.target)}", err=err)
        if runner.state.open:
            click.echo(f"  {len(runner.state.open)} attempts still running: exported when they finish "
                       f"(a later run of the projection sends them)", err=err)
