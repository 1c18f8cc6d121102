"""The ``hx`` command invoked in-process through click's CliRunner, and what its tests assert about every exit."""

from __future__ import annotations

from click.testing import CliRunner, Result

from hx.cli.main import cli


def hx(*args: str, env: dict[str, str | None] | None = None, input: str | None = None) -> Result:
    """Invoke the command in-process (stdout and stderr captured apart), blind to the caller's HX_ variables."""
    blind: dict[str, str | None] = {"HX_NATS_URL": None, "HX_DATA_DIR": None, "HX_NATS_AUDITOR_USER": None,
                                    "HX_NATS_AUDITOR_PASSWORD": None, "HX_NATS_AUDITOR_CREDS": None}
    return CliRunner().invoke(cli, list(args), env={**blind, **(env or {})}, input=input)


def ok(result: Result) -> Result:
    """Assert a clean exit, showing what went wrong otherwise."""
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def error_line(result: Result) -> str:
    """Exit 1, the last stderr line an ``error:`` line, no traceback; that line."""
    assert result.exit_code == 1, (result.output, result.exception)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in result.output, result.stderr
    return last
