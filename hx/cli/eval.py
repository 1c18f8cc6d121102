"""``hx eval``: score a harness on the eval suite (full or ``--fast``), print the composite, compare with a base eval.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(eval_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

from pathlib import Path

import click
import msgspec
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import hx.environments  # noqa: F401 - registers the benchmark adapters (twx, sciworld, gaia)
from hx.cli._app import App, pass_app, run, run_id_option, stderr_console, stdout_console
from hx.cli._specs import check_spec_option
from hx.eval.errors import EvalError
from hx.eval.runner import SMOKE_PREFIX, EvalOutcome, EvalRunner, PlaySettings, plan
from hx.eval.score import interval
from hx.eval.suite import default_suite, load_generated, load_suite, with_tasks
from hx.harness.config import HarnessConfig
from hx.runtime.loop import AttemptResult
from schemas.evaluation import Bounds
from schemas.suite import Suite
from streams.redaction import mask_url


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (value or "").split(",") if n.strip())


def read_suite(path: Path | None, generated: Path | None) -> Suite:
    """The suite file (default: hx's default suite) with the tasks of a ``--generated`` file added."""
    suite = load_suite(path) if path is not None else default_suite()
    if generated is None:
        return suite
    return with_tasks(suite, load_generated(generated), f"generated tasks {generated}")


def _b(b: Bounds) -> str:
    return str(interval(b))


@click.command("eval")
@click.argument("suite_path", metavar="[SUITE]", required=False,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--fast", is_flag=True, help="Judge attempts already on the log (no model calls) instead of playing.")
@click.option("--runs", "runs", multiple=True, metavar="RUN[,RUN]",
              help="With --fast: the runs whose attempts to judge  [default: every run with attempts of the suite's "
                   "task ids]")
@click.option("--score", "score_only", is_flag=True,
              help="Print one line, 'composite 0.612 [0.540, 0.680]', for scripts.")
@click.option("--tasks", "only", metavar="A,B", help="Score only these suite tasks.")
@click.option("--generated", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
              help="Add the tasks of a generated-tasks JSON file (checked against its schema).")
@click.option("--against", default="", metavar="RUN",
              help="Compare with this base eval run: both composites, the difference, the keep rule, the flips.")
@click.option("--model", default="random:", show_default=True, metavar="SPEC", help="Main model (full mode).")
@click.option("--harness", "harness_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Harness config  [default: each benchmark family's starter harness]")
@click.option("--attempts", type=click.IntRange(min=1, max=64), help="Attempts per task  [default: the suite's]")
@click.option("--max-steps", type=click.IntRange(min=1), help="Step cap per attempt  [default: the suite's]")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=4, show_default=True,
              help="Attempts run at once (full mode).")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed, also the bootstrap's seed.")
@click.option("--run-id", callback=run_id_option, help="Eval run id  [default: eval-<UTC time>-<random>]")
@click.option("--json", "as_json", is_flag=True, help="Print the suite and task scores as JSON.")
@pass_app
def eval_command(app: App, suite_path: Path | None, fast: bool, runs: tuple[str, ...], score_only: bool,
                 only: str | None, generated: Path | None, against: str, model: str, harness_path: Path | None,
                 attempts: int | None, max_steps: int | None, concurrency: int, seed: int, run_id: str | None,
                 as_json: bool) -> None:
    """Score a harness on the eval suite (full or --fast), print the composite, compare with a base eval.

    Every verdict and score goes on the log (HX_TRACE, under the eval's own run id); the
    composite is 0.7 x success + 0.3 x criteria pass rate per attempt, with its interval.
    """
    from hx.eval.runner import new_eval_id

    # Everything a bad input could be is checked before the log is opened: nothing gets written.
    if runs and not fast:
        raise EvalError("--runs names the runs whose attempts --fast judges; the full mode plays its own")
    suite = read_suite(suite_path, generated)
    planned = plan(suite, _names(only))
    check_spec_option("--model", model)
    harness = (HarnessConfig.load(harness_path), str(harness_path)) if harness_path is not None else None
    run_list = tuple(r for value in runs for r in _names(value))
    play = PlaySettings(model=model, harness=harness, attempts=attempts, max_steps=max_steps, seed=seed,
                        concurrency=concurrency)
    eval_id = run_id or new_eval_id()

    async def go() -> EvalOutcome:
        async with app.connect() as conn:
            where = f"embedded nats-server ({app.settings.data_dir})" if conn.server else mask_url(conn.url)
            runner = EvalRunner(conn, suite, planned, seed=seed)
            if not (score_only or as_json):
                stderr_console().print(f"eval {eval_id}: suite {suite.name} ({len(planned)} tasks), "
                                       f"{'fast' if fast else 'full'} mode on {where}", highlight=False)
            if fast:
                return await runner.fast(eval_id, run_list, against=against)
            if score_only or as_json:
                return await runner.full(eval_id, play, against=against)
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("passed {task.fields[passed]}"), TimeElapsedColumn(),
                          console=stderr_console()) as bar:
                playable = {p.task for p in planned if not p.task.startswith(SMOKE_PREFIX)}
                job = bar.add_task("attempts", total=len(playable) * (attempts or suite.attempts), passed=0)
                passed = 0

                def progress(result: AttemptResult) -> None:
                    nonlocal passed
                    passed += result.passed
                    bar.update(job, advance=1, passed=passed)

                return await runner.full(eval_id, play, against=against, progress=progress)

    outcome = run(go())
    if score_only:
        click.echo(f"composite {_b(outcome.suite.composite)}")
    elif as_json:
        click.echo(msgspec.json.encode({"suite": outcome.suite, "tasks": outcome.tasks}).decode())
    else:
        show(outcome)


def show(outcome: EvalOutcome) -> None:
    """The task table, the suite's scores, the comparison if any, and the timings."""
    table = Table(title=f"eval {outcome.run_id}")
    for col in ("name", "task", "weight", "passed", "criteria", "composite"):
        table.add_column(col, no_wrap=col != "task", overflow="fold")
    for t in outcome.tasks:
        crit = f"{t.criteria_passed}/{t.criteria_checked}" if t.criteria_checked else "-"
        table.add_row(t.suite_task, t.task, f"{t.weight:g}", f"{t.passes}/{t.attempts}", crit, _b(t.composite))
    stdout_console().print(table)
    s = outcome.suite
    click.echo(f"success {_b(s.success)}  criteria {_b(s.criteria) if s.criteria.method != 'none' else '-'}")
    click.echo(f"composite {_b(s.composite)}  ({s.tasks} tasks, {s.attempts} attempts, {outcome.verdicts} verdicts)")
    if outcome.base is not None:
        click.echo(f"base {outcome.base.run_id}: composite {_b(outcome.base.composite)}")
        if s.difference is None:
            click.echo("no suite task scored by both: nothing compared")
        else:
            click.echo(f"difference {_b(s.difference)}  verdict {s.verdict.upper()}")
            click.echo("flipped: " + ("; ".join(s.flipped) if s.flipped else "none"))
    timings = ", ".join(f"{k} {v:.2f}s" for k, v in outcome.timings.items())
    click.echo(f"timings: {timings}")
