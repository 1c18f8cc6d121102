"""``hx run``: rollouts of a harness on benchmark tasks, with a progress bar, a results table and a saved report.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(run_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

import hx.environments  # noqa: F401 - registers the benchmark adapters (twx, sciworld, gaia)
from hx.cli._app import App, pass_app, run, run_id_option, stderr_console, stdout_console
from hx.cli._specs import check_spec_option
from hx.environments.errors import BenchmarkError
from hx.environments.registry import SPLITS, Benchmark, TaskId, benchmark
from hx.environments.results import ResultsClaim, results_table, to_json
from hx.environments.rollout import PlayedRound, Rollout, RolloutSettings
from hx.environments.splits import ROLES, SplitRole
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from schemas.errors import HxError
from streams.redaction import mask_url, scrub

DEFAULT_BENCH = "twx:coin"
DEFAULT_TASKS = 50


def new_run_id() -> str:
    """A fresh run id: UTC time (names sort by start) and a random suffix."""
    return f"run-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


def select_tasks(specs: Sequence[str], split: str, tasks: int) -> tuple[list[Benchmark], list[TaskId]]:
    """The benchmarks named by ``benchmark`` or ``benchmark:game`` specs and the first ``tasks`` ids of each game."""
    benches: dict[str, Benchmark] = {}
    ids: list[TaskId] = []
    seen: set[TaskId] = set()
    try:
        for spec in dict.fromkeys(specs):
            name, _, game = spec.partition(":")
            bench = benches.get(name)
            if bench is None:
                bench = benches[name] = benchmark(name)
            games = bench.games()
            if game and game not in games:
                raise BenchmarkError(f"{name} has no game {game!r}; games: {', '.join(games)}")
            for g in [game] if game else bench.default_games():
                new = [t for t in bench.task_ids(g, split, limit=tasks) if t not in seen]
                seen.update(new)
                ids += new
        if not ids:
            raise BenchmarkError(f"no {split} tasks in {', '.join(specs)}")
    except BaseException:
        for bench in benches.values():
            bench.close()
        raise
    return list(benches.values()), ids


def read_harness(path: Path | None) -> tuple[HarnessConfig, str] | None:
    """The harness ``--harness`` names and its source, read before anything is claimed or started (None: no file)."""
    return (HarnessConfig.load(path), str(path)) if path is not None else None


def choose_harness(given: tuple[HarnessConfig, str] | None,
                   benches: Sequence[Benchmark]) -> tuple[HarnessConfig, str]:
    """The harness read from ``--harness`` (``read_harness``), else the starter harness of the benchmarks' family."""
    if given is not None:
        return given
    families = sorted({b.family for b in benches})
    if len(families) != 1 or not families[0]:
        named = ", ".join(f"{b.name} ({b.family or 'no family'})" for b in benches)
        raise BenchmarkError(f"no single starter harness fits {named}; pass --harness FILE or run them apart")
    return starter_harness(families[0]), f"starter:{families[0]}"


@click.command("run")
@click.option("--bench", "benches", multiple=True, default=(DEFAULT_BENCH,), show_default=True, metavar="BENCH[:GAME]",
              help="Benchmark, or benchmark:game (repeatable); a benchmark alone means all its games.")
@click.option("--split", type=click.Choice(SPLITS), default="dev", show_default=True, help="Which split's tasks.")
@click.option("--tasks", type=click.IntRange(min=1), default=DEFAULT_TASKS, show_default=True,
              help="Tasks per game (the split's first N).")
@click.option("--attempts", type=click.IntRange(min=1, max=64), default=2, show_default=True,
              help="Attempts per task (pass@k for k up to this).")
@click.option("--model", default="random:", show_default=True, metavar="SPEC",
              help="Main model, e.g. random:, anthropic:claude-sonnet-4-6, openai:MODEL@URL.")
@click.option("--harness", "harness_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Harness config (.yaml/.json/.toml)  [default: the benchmark family's starter "
                                   "harness from hx/harnesses/]")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=4, show_default=True,
              help="Attempts run at once.")
@click.option("--max-steps", type=click.IntRange(min=1), default=100, show_default=True, help="Step cap per attempt.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Wall-clock limit per attempt (an infrastructure failure when exceeded).")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed (agent seeds derive from it).")
@click.option("--role", type=click.Choice(ROLES), default=None,
              help="Split role recorded on the log  [default: heldout for --split test, else adaptation]")
@click.option("--run-id", callback=run_id_option, help="Run id  [default: run-<UTC time>-<random>]")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout (no table).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Where to save the JSON results (a .md table goes beside it)  [default: DATA_DIR/results/RUN.json]")
@pass_app
def run_command(app: App, benches: tuple[str, ...], split: str, tasks: int, attempts: int, model: str,
                harness_path: Path | None, concurrency: int, max_steps: int, timeout_s: float | None, seed: int,
                role: SplitRole | None, run_id: str | None, as_json: bool, out: Path | None) -> None:
    """Run a harness on benchmark tasks, k attempts each; print pass@k per game and save the results.

    Every attempt goes on the log under hx.trace.RUN.ROUND.TASK.ATTEMPT; the table is
    folded back from the log. Runs anywhere with the defaults: random agent, embedded
    nats-server, no API key.
    """
    run_id = run_id or new_run_id()
    settings = RolloutSettings(attempts=attempts, concurrency=concurrency, max_steps=max_steps, seed=seed,
                               timeout_s=timeout_s)
    chosen_role: SplitRole = role or ("heldout" if split == "test" else "adaptation")
    check_spec_option("--model", model)  # before anything is claimed, started or appended
    models = ModelConfig(main=model)
    given = read_harness(harness_path)  # so is a harness file that cannot be read
    claim = ResultsClaim(out or app.private_data_dir() / "results" / f"{run_id}.json")
    try:
        outcome = run(_run(app, run_id, list(benches), split, tasks, models, given, settings, chosen_role))
    except BaseException:
        claim.release()
        raise
    report = outcome.report
    path, md = claim.save(report)
    if as_json:
        click.echo(to_json(report), nl=False)
        click.echo(f"saved {path} and {md}", err=True)
    else:
        stdout_console().print(results_table(report))
        click.echo(f"{report.steps:,} steps, {report.events:,} events in {report.elapsed_s:.1f}s "
                   f"({report.steps_per_s:,.0f} steps/s, {report.events_per_s:,.0f} events/s)")
        click.echo(f"saved {path} and {md}")
    if outcome.infra_failure:
        raise HxError(f"run {run_id}: {outcome.infra_failure}")


async def _run(app: App, run_id: str, specs: list[str], split: str, tasks: int, models: ModelConfig,
               given: tuple[HarnessConfig, str] | None, settings: RolloutSettings, role: SplitRole) -> PlayedRound:
    benches, ids = select_tasks(specs, split, tasks)
    try:
        harness, source = choose_harness(given, benches)
        async with app.connect() as conn:
            where = f"embedded nats-server ({app.settings.data_dir})" if conn.server else mask_url(conn.url)
            total = len(ids) * settings.attempts
            console = stderr_console()
            console.print(f"run {run_id}: {len(ids)} tasks × {settings.attempts} attempts of {scrub(models.main)} "
                          f"with {source} on {where}", highlight=False)
            rollout = Rollout(benches, models, harness, log=conn.log, settings=settings, harness_source=source)
            extra: dict[str, Any] = {"bench": specs, "split": split, "tasks_per_game": tasks, "role": role}
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("passed {task.fields[passed]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                          console=console) as bar:
                job = bar.add_task("attempts", total=total, passed=0)
                passed = 0

                def progress(result: AttemptResult) -> None:
                    nonlocal passed
                    passed += result.passed
                    bar.update(job, advance=1, passed=passed)

                return await rollout.rollout(run_id, ids, role=role, progress=progress, extra=extra)
    finally:
        for bench in benches:
            bench.close()
