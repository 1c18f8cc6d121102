"""A click group whose subcommands are imported when invoked, listed in its help from a static table.

``hx --help`` shows every command with its one-line help without importing any of them;
``hx CMD ...`` imports only CMD's module (and what it imports). The table repeats each
command's short help, and ``tests/test_cli_lazy.py`` checks it against the commands
themselves, so it cannot drift.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import NamedTuple

import click


class LazyCommand(NamedTuple):
    """Where a subcommand lives, and its short help as its docstring's first sentence gives it."""

    module: str
    attribute: str
    short_help: str


class LazyGroup(click.Group):
    """A group whose subcommands come from a table of name -> ``LazyCommand``, imported on first use."""

    def __init__(self, *args: object, lazy: Mapping[str, LazyCommand] | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy: dict[str, LazyCommand] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, lazy and added, sorted."""
        return sorted({*self.lazy, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command called ``cmd_name``, its module imported now if it is a lazy one."""
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in self.lazy:
            return command
        where = self.lazy[cmd_name]
        # the table names modules of this same package (hx.cli), so no layer is hidden from the import check
        loaded = getattr(importlib.import_module(where.module), where.attribute)
        if not isinstance(loaded, click.Command):
            raise TypeError(f"{where.module}.{where.attribute} is not a click command")
        self.add_command(loaded, cmd_name)
        return loaded

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands section of the help, from the table: no command is imported to show it."""
        rows: dict[str, click.Command] = {name: click.Command(name, help=entry.short_help)
                                          for name, entry in self.lazy.items()}
        rows.update(self.commands)  # an added (or already loaded) command shows its own help
        shown = sorted(((name, cmd) for name, cmd in rows.items() if not cmd.hidden), key=lambda row: row[0])
        if not shown:
            return
        # the same layout as click.Group's own listing
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        with formatter.section("Commands"):
            formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in shown])
