"""``hx experiment``: run a controlled experiment from its spec (``run``) and have the panel judge it (``review``).

>>> from click.testing import CliRunner
>>> CliRunner().invoke(experiment_group, ["run", "--help"]).exit_code
0
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import click
import msgspec
from rich.table import Table

from hx.cli._app import App, pass_app, run, run_id_option, stderr_console, stdout_console
from hx.cli._lazy import LazyCommand, LazyGroup
from hx.cli._specs import check_spec_option
from hx.experiment.claims import check_claim
from hx.experiment.design import Unit
from hx.experiment.runner import ExperimentRun, conclusion_json
from hx.experiment.spec import check_spec, load_spec
from hx.runtime.loop import AttemptResult
from schemas.evaluation import Bounds
from schemas.experiment import ExperimentConcluded, ExperimentSpec
from streams.signing import LedgerKey


def new_experiment_id() -> str:
    """A fresh experiment run id: ``exp-`` UTC time and a random suffix."""
    return f"exp-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


def _shown(b: Bounds) -> str:
    return f"{b.estimate:.3f} [{b.low:.3f}, {b.high:.3f}]"


def conclusion_table(spec: ExperimentSpec, concluded: ExperimentConcluded) -> Table:
    """The results as a table: per level mean [low, high] per variable, then each effect, its size d and verdict."""
    table = Table(title=f"{spec.title} ({concluded.run_id}, {concluded.units} units)")
    table.add_column("level / effect")
    # the spec's variables, then any per game (``per_game``: ``<variable> <bench:game>``)
    variables = list(dict.fromkeys([*spec.response_variables, *(s.variable for s in concluded.levels)]))
    for variable in variables:
        table.add_column(variable, justify="right")
    means = {(s.level, s.variable): s for s in concluded.levels}
    for level in dict.fromkeys(s.level for s in concluded.levels):
        table.add_row(level, *(_shown(means[(level, v)].mean) if (level, v) in means else "-" for v in variables))
    effects = {(e.factor, e.level, e.reference, e.variable): e for e in concluded.effects}
    for factor, level, reference in dict.fromkeys((e.factor, e.level, e.reference) for e in concluded.effects):
        row = [effects.get((factor, level, reference, v)) for v in variables]
        shown = [f"{_shown(e.difference)} d={e.effect_size.estimate:.2f} {e.verdict}" if e else "-" for e in row]
        table.add_row(f"{factor}: {level} - {reference}", *shown)
    for inter in concluded.interactions:
        contrasts = [_shown(inter.contrast) if inter.variable == v else "-" for v in variables]
        table.add_row(f"interaction {inter.factors[0]} x {inter.factors[1]}", *contrasts)
    return table


REVIEW = LazyCommand("hx.cli.experiment_review", "review_command",
                     "Judge the concluded experiment RUN: three personas, the cascade's decision, the next "
                     "experiment's spec.")
"""The panel's command, imported only when named (the LLM panel's imports are not ``run``'s)."""


@click.group("experiment", cls=LazyGroup, lazy={"review": REVIEW})
def experiment_group() -> None:
    """Controlled experiments: a spec's arms in a seeded random order on the log, concluded with intervals."""


@experiment_group.command("run")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--resume", "resume", metavar="RUN", callback=run_id_option,
              help="Continue RUN from the log: units whose attempt finished are skipped.")
@click.option("--model", default=None, metavar="SPEC",
              help="Main model of every arm (replaces the spec's controlled model; part of the spec digest).")
@click.option("--concurrency", type=click.IntRange(min=1, max=64), default=1, show_default=True,
              help="Units run at once (an env scope always runs one at a time).")
@click.option("--units", "max_units", type=click.IntRange(min=1), default=None,
              help="Play at most this many units now, then stop (continue with --resume RUN).")
@click.option("--run-id", callback=run_id_option, help="Run id  [default: exp-<UTC time>-<random>]")
@click.option("--json", "as_json", is_flag=True, help="Print the conclusion as JSON on stdout (no table).")
@click.option("--registry", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="The committed claim specs a claim's test tasks are checked against  [default: the spec's "
                   "directory]")
@pass_app
def run_command(app: App, spec_path: Path, resume: str | None, model: str | None, concurrency: int,
                max_units: int | None, run_id: str | None, as_json: bool, registry: Path | None) -> None:
    """Run the experiment SPEC (YAML, TOML or JSON): every (task, level, replication) unit, then the conclusion.

    A spec that changes more than one thing is rejected before anything is written.
    """
    spec = load_spec(spec_path)
    check_claim(spec, spec_path, registry or spec_path.parent)
    if model is not None:
        check_spec_option("--model", model)
        spec = check_spec(msgspec.structs.replace(
            spec, controlled_variables={**spec.controlled_variables, "model": model}), where=str(spec_path))
    if resume and run_id and resume != run_id:
        raise click.UsageError("--resume RUN and --run-id name two runs; give one")
    run_id = resume or run_id or new_experiment_id()
    concluded, experiment = run(_run(app, spec, spec_path, run_id, resume is not None, concurrency, max_units))
    if concluded is None:
        progress = experiment.progress
        click.echo(f"run {run_id}: {progress.done_before + progress.played} of {progress.total} units done; "
                   f"continue with: hx experiment run {spec_path} --resume {run_id}")
        return
    if as_json:
        click.echo(json.dumps(conclusion_json(concluded), indent=2, sort_keys=True))
        return
    stdout_console().print(conclusion_table(spec, concluded))
    click.echo(f"falsified_if: {concluded.falsified} ({concluded.detail})")
    click.echo(f"run {run_id}")


async def _run(app: App, spec: ExperimentSpec, spec_path: Path, run_id: str, resume: bool, concurrency: int,
               max_units: int | None) -> tuple[ExperimentConcluded | None, ExperimentRun]:
    async with app.connect() as conn:
        experiment = ExperimentRun(spec, conn, run_id=run_id, base_dir=spec_path.parent,
                                   concurrency=concurrency, key=LedgerKey.of(app.settings.data_dir))
        console = stderr_console()
        console.print(f"experiment {run_id}: {len(experiment.order)} units "
                      f"({len(spec.tasks)} tasks x {len(experiment.cells)} cells x {spec.replications} "
                      f"replications){', resumed' if resume else ''}"
                      + (f"; its author expects about {spec.expected_wall_s / 60:.0f} min"
                         if spec.expected_wall_s else ""), highlight=False)

        def on_unit(unit: Unit, result: AttemptResult) -> None:
            p = experiment.progress
            console.print(f"  {p.done_before + p.played}/{p.total} {unit.key}: "
                          f"{'passed' if result.passed else result.status}", highlight=False)

        concluded = await experiment.run(resume=resume, max_units=max_units, on_unit=on_unit)
        return concluded, experiment
