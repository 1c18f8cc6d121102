"""``hx projections``: list the read models, show their checkpoints, rebuild or run them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hx.cli._app import App, named_projection, pass_app, quarantine_note, run, stderr_console, stdout_console
from projections.registry import PROJECTIONS
from projections.runner import ProjectionRunner

log = structlog.get_logger("hx.cli")
_UPDATES = 200
"""Progress bar updates per run: rich's per-update cost would dominate a fold of cheap events."""


@click.group("projections")
def projections_group() -> None:
    """Read models folded from the log."""


@projections_group.command("list")
def list_projections() -> None:
    """List projections: name, stream, event types read, version."""
    table = Table("name", "stream", "reads", "version", box=None, header_style="bold")
    for name, cls in sorted(PROJECTIONS.items()):
        reads = ", ".join(sorted(cls.reads)) if cls.reads else "all"
        table.add_row(name, cls.stream, reads, str(cls.version))
    stdout_console().print(table)


@projections_group.command("status")
@click.argument("name", required=False)
@pass_app
def status(app: App, name: str | None) -> None:
    """Show checkpoints: position, events applied, digest, lag.

    The lag is how many messages the log's end is past the checkpoint.
    """
    names = [name] if name else sorted(PROJECTIONS)
    for n in names:
        named_projection(n)  # fail on an unknown name before connecting
    run(_status(app, names))


async def _status(app: App, names: list[str]) -> None:
    async with app.connect() as conn:
        for name in names:
            proj = named_projection(name)
            runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj)
            cp = await runner.status()
            end = await conn.log.last_seq(proj.stream)
            click.echo(f"{name} (v{proj.version}, {proj.stream} at {end})")
            if cp is None:
                click.echo("  no checkpoint: never run (`hx projections rebuild` builds it)")
                continue
            behind = max(0, end - cp.seq)
            click.echo(f"  position  {cp.seq}.{cp.index}")
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


def _summary(runner: ProjectionRunner[Any], elapsed: float, applied: int) -> None:
    rate = applied / elapsed if elapsed > 0 else 0.0
    click.echo(f"{runner.projection.name}: position {runner.position[0]}.{runner.position[1]}, "
               f"{runner.applied} events applied")
    click.echo(f"  digest    {runner.digest}")
    click.echo(f"  folded    {applied} events in {elapsed:.2f}s ({rate:,.0f} events/s)")


@projections_group.command("rebuild")
@click.argument("name")
@pass_app
def rebuild(app: App, name: str) -> None:
    """Forget the checkpoint and fold the whole log again."""
    named_projection(name)
    run(_rebuild(app, name))


async def _rebuild(app: App, name: str) -> None:
    async with app.connect() as conn:
        runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, named_projection(name))
        started = time.perf_counter()
        with progress_bar(f"rebuilding {name}") as progress:
            await runner.rebuild(progress=progress)
        _summary(runner, time.perf_counter() - started, runner.applied)
        quarantine_note(conn.log)


@projections_group.command("run")
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="After catching up, apply new events until Ctrl-C.")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Checkpoint after this many applied events.")
@pass_app
def run_projection(app: App, name: str, follow: bool, checkpoint_every: int) -> None:
    """Resume from the checkpoint and catch up (--follow: stay live)."""
    named_projection(name)
    run(_run(app, name, follow, checkpoint_every))


async def _run(app: App, name: str, follow: bool, checkpoint_every: int) -> None:
    async with app.connect() as conn:
        runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, named_projection(name),
                                                         checkpoint_every=checkpoint_every)
        await runner.load()
        if runner.resumed_from is None:
            click.echo(f"{name}: no usable checkpoint, folding from the start")
        else:
            click.echo(f"{name}: resumed from {runner.resumed_from[0]}.{runner.resumed_from[1]}")
        before, started = runner.applied, time.perf_counter()
        with progress_bar(f"catching up {name}") as progress:
            await runner.catch_up(progress=progress)
        _summary(runner, time.perf_counter() - started, runner.applied - before)
        quarantine_note(conn.log)
        if follow:
            click.echo(f"{name}: following the log (Ctrl-C stops)", err=True)
            try:
                while True:
                    try:
                        await runner.follow()
                        break
                    except TimeoutError:
                        # A timeout creating or inspecting the consumer gets out of EventLog.subscribe;
                        # the runner resumes from its position, so following again loses nothing.
                        log.debug("follow timed out while idle; following again", projection=name)
            finally:
                click.echo(f"{name}: stopped at {runner.position[0]}.{runner.position[1]}, "
                           f"{runner.applied} events applied, digest {runner.digest}", err=True)
