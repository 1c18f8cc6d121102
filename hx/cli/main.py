"""The ``hx`` command: the root group, its options and the one place errors become exit codes.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(cli, ["--help"]).exit_code
0
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from pathlib import Path
from typing import Any

import click
import nats.errors

from hx.cli._app import EXIT_TERMINATED, App, Terminated
from hx.cli.approve import approve_command
from hx.cli.audit import audit_group, ledger_command
from hx.cli.coevolve import coevolve_command
from hx.cli.demo import demo
from hx.cli.evolve import evolve_command
from hx.cli.export import export_command
from hx.cli.integrity import accept_loss, verify
from hx.cli.learn import learn_command
from hx.cli.log import log_group
from hx.cli.projections import projections_group
from hx.cli.replay import fork_command, replay_command
from hx.cli.report import report_command
from hx.cli.run import run_command
from hx.cli.server import server
from hx.cli.timetravel import bisect_command, diff_command, regressions_command, state_command
from hx.cli.trace import trace_command
from hx.logging import configure_logging
from schemas.errors import HxError
from streams.config import NatsSettings
from streams.redaction import scrub
from streams.server import EmbeddedServer

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return scrub(re.sub(r"\s*\n\s*", " ", text))


def report_error(exc: BaseException, *, debug: bool, prefix: str = "") -> None:
    """Write ``error: <message>`` to stderr, after the traceback when debugging."""
    if debug:
        sys.stderr.write(scrub("".join(traceback.format_exception(exc))))
    click.echo(f"error: {prefix}{_one_line(exc)}", err=True)


class HxGroup(click.Group):
    """The root group: hx errors become ``error:`` lines, Ctrl-C exit code 130, SIGTERM 143."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; translate deliberate failures at this boundary."""
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


@click.group(cls=HxGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    configure_logging(json=json_logs, level=logging.DEBUG if debug else logging.INFO)
    settings = NatsSettings.from_env(data_dir=data_dir, url=nats_url or None)
    EmbeddedServer(settings.data_dir).check()  # a data dir another user planted: refused before anything is written
    ctx.obj = App(settings=settings, debug=debug, json_logs=json_logs)


cli.add_command(server)
log_group.add_command(verify)
log_group.add_command(accept_loss)
cli.add_command(log_group)
cli.add_command(projections_group)
cli.add_command(trace_command)
cli.add_command(demo)
cli.add_command(run_command)
cli.add_command(evolve_command)
cli.add_command(coevolve_command)
cli.add_command(learn_command)
cli.add_command(approve_command)
cli.add_command(ledger_command)
cli.add_command(audit_group)
cli.add_command(export_command)
cli.add_command(replay_command)
cli.add_command(fork_command)
cli.add_command(report_command)
cli.add_command(state_command)
cli.add_command(regressions_command)
cli.add_command(diff_command)
cli.add_command(bisect_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``hx`` console script."""
    cli.main(args=argv, prog_name="hx")
