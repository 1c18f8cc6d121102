"""``hx replay`` and ``hx fork``: a logged round re-executed and compared; an attempt continued live from a step.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(replay_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

from pathlib import Path

import click

import hx.environments  # noqa: F401 - registers the benchmark adapters a live environment is rebuilt from
from hx.cli._app import App, check_round_or_stage, pass_app, run, run_id_option
from hx.cli._specs import check_spec_option
from hx.harness.config import HarnessConfig
from hx.replay.fork import ForkReport, fork_attempt
from hx.replay.logged import stage_rounds
from hx.replay.replayer import ENVS, Env, ReplayReport, replay_round
from schemas.lifecycle import AttemptFinished
from streams.log import EventLog

EXIT_DIVERGED = 3
"""``hx replay``'s exit status when the replay diverges from the log (1 stays for errors)."""

harness_option = click.option(
    "--harness", "harness_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
    help="Run under this harness instead of the logged one (.yaml/.json/.toml).")


def _plugins(app: App) -> Path:
    return app.settings.data_dir.resolve() / "plugins"


async def trace_rounds(log: EventLog, run_id: str, round_: int | None, stage: int | None) -> list[int]:
    """The trace rounds asked for: ``--round`` itself, or the main trace rounds of evolution round ``--stage``."""
    if stage is None:
        return [] if round_ is None else [round_]
    return [started.round for started in await stage_rounds(log, run_id, stage)]


@click.command("replay")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.option("--round", "round_", type=click.IntRange(min=0), metavar="N",
              help="The trace round to replay (gate, held-out and retried batches each have their own).")
@click.option("--stage", type=click.IntRange(min=0), metavar="N",
              help="The main rollouts of evolution round N (as hx evolve numbers them; every variant's).")
@click.option("--task", help="Only this task's attempts.")
@click.option("--attempt", type=click.IntRange(min=0), help="Only attempts with this number.")
@harness_option
@click.option("--env", type=click.Choice(ENVS), default="log", show_default=True,
              help="log: the environment's observations and tool results come from the log (no game runs); "
                   "live: the real environment runs again, only nondeterministic tools are fed from the log.")
@pass_app
def replay_command(app: App, run_id: str, round_: int | None, stage: int | None, task: str | None,
                   attempt: int | None, harness_path: Path | None, env: Env) -> None:
    """Re-execute a logged round with the run loop and compare every event body with the log.

    Model responses come from the log; nothing is written to it. Prints "identical: N
    attempts, E events" (exit 0) or the first divergence: log position, event type, field
    path, logged and replayed values (exit 3), per trace round replayed.
    """
    check_round_or_stage(round_, stage, required=True)
    harness = HarnessConfig.load(harness_path) if harness_path is not None else None

    async def go() -> list[ReplayReport]:
        async with app.connect() as conn:
            return [await replay_round(conn, run_id, number, task=task, attempt=attempt, harness=harness, env=env,
                                       plugin_dir=_plugins(app))
                    for number in await trace_rounds(conn.log, run_id, round_, stage)]

    diverged = False
    for report in run(go()):
        click.echo(f"replayed run {report.run_id}, {report.what}; harness {report.harness_note}, "
                   f"environment from the {'log' if report.env == 'log' else 'real benchmark'}, "
                   f"{report.seconds:.2f}s (logged: {report.logged_s:.2f}s of attempts, "
                   f"{report.logged_model_s:.2f}s of them in model calls)", err=True)
        if report.divergence is None:
            click.echo(f"identical: {report.attempts} attempts, {report.events} events")
            continue
        diverged = True
        task_id, number = report.first_attempt or ("?", -1)
        click.echo(f"diverged: {report.diverged} of {report.attempts} attempts; first in task {task_id} "
                   f"attempt {number}")
        click.echo(report.divergence.describe())
    if diverged:
        click.get_current_context().exit(EXIT_DIVERGED)


def _outcome(passed: bool, status: str, steps: int) -> str:
    return f"{'passed' if passed else 'failed'} ({status}, {steps} steps)"


@click.command("fork")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.option("--task", required=True, help="The task of the attempt to fork.")
@click.option("--attempt", type=click.IntRange(min=0), required=True, help="The attempt number.")
@click.option("--step", type=click.IntRange(min=0), required=True,
              help="Steps replayed from the log (0: live from the start).")
@click.option("--round", "round_", type=click.IntRange(min=0),
              help="The trace round  [default: the one trace round that ran the attempt]")
@harness_option
@click.option("--model", metavar="SPEC", help="The live model after the step  [default: the logged one; needed when "
                                              "the log masks its credentials]")
@click.option("--seed", type=int, help="The live model's seed after the step  [default: the attempt's]")
@click.option("--fork-id", callback=run_id_option, help="The fork's run id  [default: RUN-fork-<random>]")
@pass_app
def fork_command(app: App, run_id: str, task: str, attempt: int, step: int, round_: int | None,
                 harness_path: Path | None, model: str | None, seed: int | None, fork_id: str | None) -> None:
    """Replay an attempt up to a step from the log, then continue it live with another harness or model.

    The fork goes on the log under its own run id with its provenance (run, round, task,
    attempt, step, harness, model); its outcome is printed next to the original's.
    """
    harness = HarnessConfig.load(harness_path) if harness_path is not None else None
    if model is not None:
        check_spec_option("--model", model)

    async def go() -> ForkReport:
        async with app.connect() as conn:
            return await fork_attempt(conn, run_id, task, attempt, step, round=round_, harness=harness, model=model,
                                      seed=seed, fork_id=fork_id, plugin_dir=_plugins(app))

    report = run(go())
    original: AttemptFinished | None = report.original
    r = report.result
    replayed = f"steps 1-{report.step} from the log, then" if report.step else "live from the start with"
    click.echo(f"fork {report.fork_id}: round {report.round}, task {report.task}, attempt {report.attempt}, "
               f"{replayed} {report.model} under harness {report.harness_digest[:19]}")
    click.echo(f"  fork:     {_outcome(r.passed, r.status, r.steps)}")
    click.echo("  original: " + (_outcome(original.passed, original.status, original.steps) if original is not None
                                 else "(not finished on the log)"))
    d = report.departure
    if d is None:
        click.echo("  the fork's events equal the original's to the end")
    else:
        click.echo(f"  departs from the original at event #{d.ordinal}"
                   + (f" (step {d.step})" if d.step is not None else "") + f": {d.event_type} {d.path}")
