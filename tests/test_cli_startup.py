"""``hx`` starts fast: ``hx --help`` imports no command, ``hx CMD`` only CMD, ``import hx`` nothing heavy.

The root group lists its commands from a static table (``hx.cli.main.COMMANDS``); these tests
keep the table equal to the commands themselves. What a fresh process imports is checked in a
subprocess (``sys.modules`` after the command), since this one has imported everything.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
from hx_cli import hx, ok

import hx as hx_package
from hx.cli._lazy import LazyCommand, LazyGroup
from hx.cli.main import COMMANDS, cli
from hx.harness import libraries
from hx.harness.processor import registered
from streams.processes import free_port
from streams.server import NatsProcess

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "hx" / "cli"
GAMES = ("hx.environments.twx", "hx.environments.sciworld", "hx.environments.gaia", "textworld_express",
         "scienceworld")
HEAVY = ("jax", "flax", "optax", "matplotlib", "hx.learner", "hx.report", "hx.aegis", "hx.processors",
         "opentelemetry.sdk", "anthropic", "aiohttp", *GAMES)
"""What no command that does not use it may import, nor ``hx --help``."""


def imported(args: list[str], *, before: str = "") -> set[str]:
    """The modules a fresh ``hx ARGS`` process has imported when it is done (it must exit 0)."""
    probe = textwrap.dedent(f"""
        import json, sys
        {before}
        from hx.cli.main import main
        try:
            main({args!r})
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        print("\\nMODULES " + json.dumps(sorted(sys.modules)))
        """)
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found: list[str] = json.loads(done.stdout.rsplit("\nMODULES ", 1)[1])
    return set(found)


def heavy(modules: set[str]) -> list[str]:
    """The heavy modules (or their submodules) among ``modules``."""
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def commands_in_modules() -> dict[str, click.Command]:
    """Every top-level command the modules of ``hx/cli`` define (not the subcommands of their groups), by name."""
    modules = [importlib.import_module(f"hx.cli.{p.stem}") for p in sorted(CLI.glob("*.py"))
               if p.stem not in ("__init__", "main")]
    found = {id(obj): obj for module in modules for obj in vars(module).values() if isinstance(obj, click.Command)}
    nested = {id(sub) for obj in found.values() if isinstance(obj, click.Group) for sub in obj.commands.values()}
    nested |= {id(lazy_command(entry)) for obj in found.values() if isinstance(obj, LazyGroup)
               for entry in obj.lazy.values()}
    return {str(cmd.name): cmd for key, cmd in found.items() if key not in nested}


def lazy_command(entry: LazyCommand) -> click.Command:
    """The command a lazy table's entry names."""
    command = getattr(importlib.import_module(entry.module), entry.attribute)
    assert isinstance(command, click.Command)
    return command


def test_a_lazy_subcommand_has_its_own_short_help_in_its_groups_table() -> None:
    groups = [obj for p in sorted(CLI.glob("*.py")) if p.stem not in ("__init__", "main")
              for obj in vars(importlib.import_module(f"hx.cli.{p.stem}")).values() if isinstance(obj, LazyGroup)]
    entries = [(name, entry) for group in groups if group is not cli for name, entry in group.lazy.items()]
    assert entries  # hx experiment's review
    for name, entry in entries:
        command = lazy_command(entry)
        assert command.name == name and entry.short_help == command.get_short_help_str(limit=10_000), name


# --- the table cannot drift -----------------------------------------------------------------------------------------


def test_the_table_names_every_command_with_its_own_short_help() -> None:
    defined = commands_in_modules()
    assert sorted(COMMANDS) == sorted(defined)  # a new command in hx/cli must get its line in the table
    for name, entry in COMMANDS.items():
        command = getattr(importlib.import_module(entry.module), entry.attribute)
        assert command is defined[name] and command.name == name
        # the first sentence of its docstring, as click shows it
        assert entry.short_help == command.get_short_help_str(limit=10_000), name


@pytest.mark.parametrize("width", [60, 80, 120])
def test_hx_help_lists_the_commands_as_click_would_with_every_one_imported(width: int) -> None:
    lazy = LazyGroup("hx", lazy=COMMANDS)
    eager = click.Group("hx", commands=commands_in_modules())
    shown = {}
    for group in (lazy, eager):
        formatter = click.HelpFormatter(width=width)
        group.format_commands(click.Context(group), formatter)
        shown[group is lazy] = formatter.getvalue()
    assert shown[True] == shown[False] and shown[True].count("\n") == len(COMMANDS) + 1


def test_every_command_runs_through_the_lazy_table() -> None:
    for name in COMMANDS:
        assert ok(hx(name, "--help")).stdout.startswith(f"Usage: cli {name} ")
    assert "accept-loss" in ok(hx("log", "--help")).stdout  # log's subcommands from hx.cli.integrity are still there


# --- what a fresh process imports -----------------------------------------------------------------------------------


def test_hx_help_imports_no_command_and_nothing_heavy() -> None:
    modules = imported(["--help"])
    assert heavy(modules) == []
    assert sorted(m for m in modules if m.startswith("hx.cli.")) == ["hx.cli._lazy", "hx.cli.main"]
    assert "nats" not in modules and "hx.runtime" not in modules  # nor the log, nor the run loop


def test_hx_report_help_does_not_draw() -> None:
    modules = imported(["report", "--help"])
    assert "hx.cli.report" in modules and "matplotlib" not in modules


def test_hx_trace_imports_only_what_a_transcript_needs(nats_url: str) -> None:
    ok(hx("--nats-url", nats_url, "demo", "--events", "20", "--run-id", "quick"))
    modules = imported(["--nats-url", nats_url, "trace", "quick", "demo:coin:dev:000"])
    assert "hx.cli.trace" in modules and "hx.replay.transcript" in modules
    assert heavy(modules) == []
    other = {entry.module for entry in COMMANDS.values()} - {"hx.cli.trace"}
    assert sorted(other & modules) == []
    assert "hx.runtime.loop" not in modules and "hx.harness.config" not in modules


# --- import hx --------------------------------------------------------------------------------------------------------


def test_import_hx_imports_neither_the_run_loop_nor_the_library_nor_nats() -> None:
    probe = "import json, sys, hx\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    modules = set(json.loads(done.stdout))
    assert heavy(modules) == []
    assert not {"hx.runtime", "hx.harness.config", "nats", "schemas", "msgspec"} & modules


def test_the_public_names_of_hx_are_still_there() -> None:
    from hx import HarnessConfig, ModelConfig, RunLoop, TaskEnd  # noqa: F401 - importable as before
    from hx.harness.config import HarnessConfig as Defined

    assert HarnessConfig is Defined
    assert all(getattr(hx_package, name) is not None for name in hx_package.__all__)
    assert set(hx_package.__all__) <= set(dir(hx_package))
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        _ = hx_package.Nope


def test_a_processor_named_in_a_config_is_found_without_importing_the_library_first() -> None:
    probe = textwrap.dedent("""
        import sys
        from hx.harness.config import HarnessConfig
        assert "hx.processors" not in sys.modules
        config = HarnessConfig.from_dict({"processors": [{"type": "history_window", "params": {"keep_last": 4},
                                                          "hooks": ["step_start"]}]})
        print(type(config.pipeline("step_start")[0].build()).__module__)
        """)
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "hx.processors.history_window"


def test_a_library_that_fails_to_import_fails_each_lookup_until_it_imports() -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ImportError("the library is broken")

    libraries.add_library(flaky)
    with pytest.raises(ImportError, match="the library is broken"):
        registered()
    assert "history_window" in registered() and len(calls) == 2
    registered()
    assert len(calls) == 2  # imported once, never again


# --- nats without aiohttp -----------------------------------------------------------------------------------------


def test_nats_is_imported_without_aiohttp_after_hx() -> None:
    probe = textwrap.dedent("""
        import sys
        import hx
        import streams.connection
        import nats.aio.transport as transport
        assert "aiohttp" not in sys.modules and "multidict" not in sys.modules
        print(repr(transport.aiohttp))
        """)
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported when nats first uses a WebSocket" in done.stdout


def test_a_websocket_url_still_works(tmp_path: Path) -> None:
    port = free_port()
    conf = tmp_path / "ws.conf"
    conf.write_text(f"websocket {{\n  host: 127.0.0.1\n  port: {port}\n  no_tls: true\n}}\n")
    server = NatsProcess(tmp_path / "store", config=conf)
    server.start(detach=False)
    try:
        url = f"ws://127.0.0.1:{port}"
        modules = imported(["--nats-url", url, "demo", "--events", "20", "--run-id", "over-ws"],
                           before="import hx  # nats is imported after hx, as the hx command does")
        assert "aiohttp" in modules  # imported when the WebSocket transport was made, not before
        out = ok(hx("--nats-url", server.url, "trace", "over-ws", "demo:coin:dev:000")).stdout
        assert out.startswith("run over-ws · trace round 0")  # what went over the WebSocket is on the log
    finally:
        server.stop()
