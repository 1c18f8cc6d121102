"""``hx demo``: append a synthetic round, rebuild the trace store and task history, show pass@k."""

from __future__ import annotations

import time
import uuid
from statistics import mean
from typing import Any

import click
from rich.table import Table

from hx.cli._app import App, pass_app, quarantine_note, run, run_id_option, stdout_console
from hx.cli._demo_round import ROUND, SyntheticRound, synthetic_round
from projections.runner import ProjectionRunner
from projections.task_history import TaskHistory, TaskRound
from projections.trace_store import AttemptTrace, TraceStore, attempt_key
from schemas.lifecycle import RunFinished
from streams.connection import Connection
from streams.log import Appended, EventLog
from streams.redaction import mask_url
from streams.topology import TRACE, trace_subject

FRAME_SIZE = 256
"""Events per frame: one attempt fits in one message, well under NATS's 1 MiB payload limit."""


@click.command("demo")
@click.option("--events", type=click.IntRange(min=1), default=2000, show_default=True,
              help="About how many events to append (whole tasks, so a few more).")
@click.option("--attempts", type=click.IntRange(min=1, max=32), default=2, show_default=True,
              help="Attempts per task.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic outcomes.")
@click.option("--run-id", callback=run_id_option, help="Run id  [default: a fresh one]. Rerunning one appends nothing.")
@pass_app
def demo(app: App, events: int, attempts: int, seed: int, run_id: str | None) -> None:
    """Append a synthetic round, rebuild projections, show pass@k.

    Runs anywhere: no API key, no network, the embedded nats-server unless --nats-url is given.
    """
    run(_demo(app, run_id or f"demo-{uuid.uuid4().hex[:12]}", run_id is not None, events, attempts, seed))


async def _already_finished(log: EventLog, run_id: str) -> bool:
    async for _ in log.read(TRACE.name, subjects=[trace_subject(run_id)], types=[RunFinished.TYPE]):
        return True
    return False


async def _append(conn: Connection, synthetic: SyntheticRound, given_id: bool) -> None:
    if given_id and await _already_finished(conn.log, synthetic.run_id):
        # Past the server's duplicate window the keys alone would no longer catch a rerun.
        click.echo(f"deduplicated: run {synthetic.run_id} is already on the log; nothing appended")
        return
    started = time.perf_counter()
    acks: list[Appended] = await conn.log.append_batch(synthetic.entries, frame_size=FRAME_SIZE)
    elapsed = time.perf_counter() - started
    duplicates = sum(a.duplicate for a in acks)
    n = len(synthetic.entries)
    if duplicates == len(acks):
        click.echo(f"deduplicated: all {len(acks)} messages of run {synthetic.run_id} were already on the log; "
                   "nothing appended")
        return
    click.echo(f"appended {n:,} events in {len(acks):,} messages in {elapsed:.2f}s "
               f"({n / max(elapsed, 1e-9):,.0f} events/s)")
    if duplicates:
        click.echo(f"  {duplicates} message(s) were already on the log (deduplicated by key)")


async def _rebuild(runner: ProjectionRunner[Any]) -> str:
    started = time.perf_counter()
    await runner.rebuild()
    elapsed = time.perf_counter() - started
    return f"rebuilt from {runner.applied:,} events in {elapsed:.2f}s"


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def task_table(rounds: list[TaskRound], traces: dict[str, AttemptTrace], run_id: str, attempts: int) -> Table:
    """One row per task: attempts, passes, pass@1, pass@2 and mean steps, plus a mean row."""
    table = Table(title=f"run {run_id}, round {ROUND}", show_footer=len(rounds) > 1, header_style="bold")
    for name, justify in (("task", "left"), ("attempts", "right"), ("passes", "right"), ("pass@1", "right"),
                          ("pass@2", "right"), ("mean steps", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    p1s: list[float] = []
    p2s: list[float] = []
    all_steps: list[float] = []
    for tr in rounds:
        steps = [traces[k].steps for a in tr.attempts if (k := attempt_key(run_id, ROUND, tr.task, int(a))) in traces]
        p1 = tr.pass_at(1)
        p2 = tr.pass_at(2) if tr.n >= 2 else None
        p1s.append(p1)
        if p2 is not None:
            p2s.append(p2)
        all_steps.extend(steps)
        table.add_row(tr.task, str(tr.n), str(tr.passes), _fmt(p1), _fmt(p2), _fmt(mean(steps) if steps else None))
    footers = ["all", f"{sum(t.n for t in rounds)}", f"{sum(t.passes for t in rounds)}",
               _fmt(mean(p1s) if p1s else None), _fmt(mean(p2s) if p2s else None),
               _fmt(mean(all_steps) if all_steps else None)]
    for column, footer in zip(table.columns, footers, strict=True):
        column.footer = footer
    return table


async def _demo(app: App, run_id: str, given_id: bool, events: int, attempts: int, seed: int) -> None:
    synthetic = synthetic_round(run_id, events=events, attempts=attempts, seed=seed)
    async with app.connect() as conn:
        where = f"embedded nats-server ({app.settings.data_dir})" if conn.server else mask_url(conn.url)
        click.echo(f"run {run_id}: {len(synthetic.tasks)} tasks × {attempts} attempts on {where}")
        await _append(conn, synthetic, given_id)
        traces: ProjectionRunner[Any] = ProjectionRunner(conn.log, TraceStore())
        history: ProjectionRunner[Any] = ProjectionRunner(conn.log, TaskHistory())
        notes = [await _rebuild(traces), await _rebuild(history)]
        end = await conn.log.last_seq(TRACE.name)
        stdout_console().print(task_table(TaskHistory.rounds_of(history.state, run_id, ROUND), traces.state,
                                          run_id, attempts))
        click.echo(f"{TRACE.name} at seq {end}")
        click.echo(f"trace_store digest  {traces.digest}  ({notes[0]})")
        click.echo(f"task_history digest {history.digest}  ({notes[1]})")
        quarantine_note(conn.log)
