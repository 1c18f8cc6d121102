"""The ``hx`` command: the root group, its options and the one place errors become exit codes.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(cli, ["--help"]).exit_code
0

Start-up is part of every command (``hx trace`` of one attempt is mostly start-up), so this
module imports only click at import time: ``hx --help`` lists the commands from ``COMMANDS``
without importing them, and what the root needs to run a command (the log's settings,
logging, the error types it translates) is imported when a command runs.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from hx.cli._lazy import LazyCommand, LazyGroup

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def _one_line(exc: BaseException) -> str:
    from streams.redaction import scrub

    text = str(exc).strip() or type(exc).__name__
    return scrub(re.sub(r"\s*\n\s*", " ", text))


def report_error(exc: BaseException, *, debug: bool, prefix: str = "") -> None:
    """Write ``error: <message>`` to stderr, after the traceback when debugging."""
    from streams.redaction import scrub

    if debug:
        sys.stderr.write(scrub("".join(traceback.format_exception(exc))))
    click.echo(f"error: {prefix}{_one_line(exc)}", err=True)


class HxGroup(LazyGroup):
    """The root group: hx errors become ``error:`` lines, Ctrl-C exit code 130, SIGTERM 143."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; translate deliberate failures at this boundary."""
        import nats.errors

        from hx.cli._app import EXIT_TERMINATED, Terminated
        from schemas.errors import HxError

        debug = bool(ctx.params.get("debug"))
        try:
            return super().invoke(ctx)
        except HxError as exc:
            report_error(exc, debug=debug)
        except nats.errors.Error as exc:  # a NATS failure no lower layer translated
            report_error(exc, debug=debug, prefix=f"NATS: {type(exc).__name__}: ")
        except TimeoutError as exc:  # nats-py also raises the bare asyncio.TimeoutError
            report_error(exc, debug=debug, prefix="timed out waiting for NATS: ")
        except KeyboardInterrupt:
            ctx.exit(EXIT_INTERRUPTED)
        except Terminated:
            ctx.exit(EXIT_TERMINATED)
        ctx.exit(EXIT_ERROR)


COMMANDS: dict[str, LazyCommand] = {
    "approve": LazyCommand("hx.cli.approve", "approve_command",
                           "Approve (or --reject) CANDIDATE of RUN, which passed the gate and waits for a human."),
    "audit": LazyCommand("hx.cli.audit", "audit_group",
                         "Check an evolution run's edit ledger: its hash chain, its ships, its verdicts' inputs."),
    "bisect": LazyCommand("hx.cli.timetravel", "bisect_command",
                          "Apply the edits shipped between two rounds one at a time, re-run TASK under each, "
                          "name the first change."),
    "coevolve": LazyCommand("hx.cli.coevolve", "coevolve_command",
                            "Co-evolve harness and model: per round, rollouts with the current pair, then AEGIS "
                            "and a GRPO update."),
    "demo": LazyCommand("hx.cli.demo", "demo", "Append a synthetic round, rebuild projections, show pass@k."),
    "diff": LazyCommand("hx.cli.timetravel", "diff_command",
                        "TASK's harness change between rounds A and B of RUN (builder operations) and where its "
                        "trajectories split."),
    "eval": LazyCommand("hx.cli.eval", "eval_command",
                        "Score a harness on the eval suite (full or --fast), print the composite, compare with a "
                        "base eval."),
    "evolve": LazyCommand("hx.cli.evolve", "evolve_command",
                          "Evolve a harness from its traces (AEGIS), every decision on the edit ledger."),
    "experiment": LazyCommand("hx.cli.experiment", "experiment_group",
                              "Controlled experiments: a spec's arms in a seeded random order on the log, "
                              "concluded with intervals."),
    "export": LazyCommand("hx.cli.export", "export_command",
                          "Write RUN's evolution record to DIR, folded from its edit ledger (``--inspect``: its "
                          "evaluations as Inspect AI eval logs; ``--mlflow STORE``: its curves into an MLflow "
                          "store)."),
    "fork": LazyCommand("hx.cli.replay", "fork_command",
                        "Replay an attempt up to a step from the log, then continue it live with another harness "
                        "or model."),
    "learn": LazyCommand("hx.cli.learn", "learn_command",
                         "Train RUN's policy (cross-harness GRPO, or --algorithm) from its trace, after each round, "
                         "until the run ends."),
    "ledger": LazyCommand("hx.cli.audit", "ledger_command",
                          "List RUN's candidates, verdicts and ships, round by round, with their evidence resolved "
                          "on the trace."),
    "log": LazyCommand("hx.cli.log", "log_group", "Read the event log."),
    "projections": LazyCommand("hx.cli.projections", "projections_group", "Read models folded from the log."),
    "regressions": LazyCommand("hx.cli.timetravel", "regressions_command",
                               "Tasks of RUN lost (solved in round N-1, no attempt of round N) or worsened, the "
                               "ships between, the evidence."),
    "replay": LazyCommand("hx.cli.replay", "replay_command",
                          "Re-execute a logged round with the run loop and compare every event body with the log."),
    "report": LazyCommand("hx.cli.report", "report_command",
                          "Write RUN's report to DIR: report.html (self-contained) and one PNG per figure."),
    "run": LazyCommand("hx.cli.run", "run_command",
                       "Run a harness on benchmark tasks, k attempts each; print pass@k per game and save the "
                       "results."),
    "server": LazyCommand("hx.cli.server", "server", "Run the embedded nats-server in the foreground."),
    "state": LazyCommand("hx.cli.timetravel", "state_command",
                         "The harness of every variant, the task history and the scoreboard of RUN as of a round "
                         "or position."),
    "trace": LazyCommand("hx.cli.trace", "trace_command", "Show one attempt of TASK in RUN step by step."),
}
"""Every subcommand: its module, the click command in it, and its short help (the docstring's first sentence),
so ``hx --help`` lists them all and ``hx CMD`` imports only CMD's module."""


@click.group(cls=HxGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), envvar="HX_DATA_DIR",
              show_envvar=True, help="Where the embedded nats-server keeps its data  [default: ./.hx]")
@click.option("--nats-url", envvar="HX_NATS_URL", show_envvar=True, metavar="URL",
              help="Use this NATS server or cluster instead of the embedded one.")
@click.option("--json-logs", is_flag=True, help="Log JSON lines to stderr instead of the console format.")
@click.option("--debug", is_flag=True, help="Debug logging, and full tracebacks on errors.")
@click.version_option(package_name="hx-foundry", prog_name="hx")
@click.pass_context
def cli(ctx: click.Context, data_dir: Path | None, nats_url: str | None, json_logs: bool, debug: bool) -> None:
    """hx: a harness foundry for AI agents, event-sourced on NATS JetStream."""
    from hx.cli._app import App
    from hx.logging import configure_logging
    from streams.config import NatsSettings
    from streams.server import EmbeddedServer

    configure_logging(json=json_logs, level="DEBUG" if debug else "INFO")
    settings = NatsSettings.from_env(data_dir=data_dir, url=nats_url or None)
    EmbeddedServer(settings.data_dir).check()  # a data dir another user planted: refused before anything is written
    ctx.obj = App(settings=settings, debug=debug, json_logs=json_logs)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``hx`` console script."""
    cli.main(args=argv, prog_name="hx")
