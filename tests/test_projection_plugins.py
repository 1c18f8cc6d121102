"""Projection plugins: the example in docs/examples, loaded by spec and by entry point, subscribed to real runs."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hx_cli import error_line, hx, ok
from subscribe_kit import EXAMPLES, checkpoint, fresh_fold, interleaved_attempts, output_of, records, stop, toy_run

from projections.base import Projection
from projections.plugins import load
from projections.registry import BUILTINS
from projections.testing import ProjectionKit
from schemas.tools import ToolInvoked, ToolReturned
from streams.log import EventLog
from streams.topology import trace_filter

SPEC = f"{EXAMPLES / 'tool_usage.py'}:ToolUsage"
DIGEST = re.compile(r"digest\s+([0-9a-f]{64})")


def tool_usage() -> Projection[Any]:
    """The example projection, imported as a module from docs/examples (on sys.path)."""
    module = importlib.import_module("tool_usage")
    projection: Projection[Any] = module.ToolUsage()
    return projection


@pytest.fixture
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def calls(nats_url: str, run_id: str) -> int:
    return len(records(nats_url, [trace_filter(run_id)], [ToolInvoked.TYPE]))


class TestToolUsageKit(ProjectionKit):
    """The example passes the projection kit: polled, followed, resumed, rebuilt and as-of states agree."""

    def make_projection(self) -> Projection[Any]:
        projection: Projection[Any] = load(SPEC, BUILTINS)()
        return projection

    def append_events(self, log: EventLog) -> AsyncIterator[object]:
        return interleaved_attempts(log)


@pytest.mark.slow
def test_a_follower_alongside_the_writes_a_late_subscriber_and_a_restart_agree(
        nats_url: str, tmp_path: Path, examples_on_path: None) -> None:
    """Live alongside a real run, stopped, restarted after another run, and subscribed late: one state."""
    proj = tool_usage()
    follower = subprocess.Popen(
        [sys.executable, "-m", "hx", "--nats-url", nats_url, "projections", "run", SPEC,
         "--checkpoint-every", "10"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stderr is not None and follower.stdout is not None
        assert "following the log" in follower.stderr.readline()  # subscribed before anything was written
        toy_run(nats_url, tmp_path, "alongside")
        deadline = time.monotonic() + 60
        while (cp := checkpoint(nats_url, proj)) is None or cp.applied == 0:  # it folds the run as it is written
            assert time.monotonic() < deadline and follower.poll() is None, output_of(follower)
        stop(follower)
        assert "Traceback" not in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    live = checkpoint(nats_url, proj)
    assert live is not None and live.applied > 0
    # Where the follower stopped, its state is the fold of the log up to that position.
    digest, applied, _ = fresh_fold(nats_url, tool_usage(), (live.seq, live.index))
    assert (live.digest, live.applied) == (digest, applied)

    toy_run(nats_url, tmp_path, "while-down")  # written while no follower runs
    resumed = ok(hx("--nats-url", nats_url, "projections", "run", SPEC, "--once")).stdout
    assert f"tool_usage: resumed from {live.seq}.{live.index}" in resumed
    digest, applied, state = fresh_fold(nats_url, tool_usage())
    assert DIGEST.findall(resumed) == [digest]
    assert f"{applied} events applied" in resumed  # no event applied twice, none missed
    assert state["alongside"]["act"].calls == calls(nats_url, "alongside") > 0
    assert state["while-down"]["act"].calls == calls(nats_url, "while-down") > 0
    assert f"  while-down  act: {state['while-down']['act'].calls} call(s)" in resumed  # the plugin's summary

    late = ok(hx("--nats-url", nats_url, "projections", "run", "tool_usage:ToolUsage", "--once", "--from-start")).stdout
    assert "folding from the start" in late and DIGEST.findall(late) == [digest]
    assert f"{applied} events applied" in late
    status = ok(hx("--nats-url", nats_url, "projections", "status", "tool_usage:ToolUsage")).stdout
    assert "tool_usage (v1, HX_TRACE" in status and digest in status and "up to date" in status


def test_from_a_sequence_folds_only_what_follows(nats_url: str, tmp_path: Path, examples_on_path: None) -> None:
    toy_run(nats_url, tmp_path, "first", tasks=1, attempts=1)
    middle = max(r.seq for r in records(nats_url)) + 1
    toy_run(nats_url, tmp_path, "second", tasks=1, attempts=1)
    out = ok(hx("--nats-url", nats_url, "projections", "run", "tool_usage:ToolUsage", "--once",
                "--from", str(middle))).stdout
    assert f"folding from sequence {middle}" in out
    digest, applied, state = fresh_fold(nats_url, tool_usage(), since=middle)
    cp = checkpoint(nats_url, tool_usage())
    assert cp is not None and (cp.digest, cp.applied) == (digest, applied) and list(state) == ["second"]
    assert applied == len(records(nats_url, [trace_filter("second")], [ToolInvoked.TYPE, ToolReturned.TYPE]))
    end = max(r.seq for r in records(nats_url))
    assert f"past the end of HX_TRACE (last sequence {end}" in error_line(
        hx("--nats-url", nats_url, "projections", "run", "tool_usage:ToolUsage", "--once", "--from", str(end + 2)))
    assert hx("--nats-url", nats_url, "projections", "run", "tool_usage:ToolUsage", "--once", "--from", "3",
              "--from-start").exit_code == 2  # exclusive options: a usage error


BAD_MODULE = '''
from typing import ClassVar
import msgspec
from projections.base import Projection
from projections.plugins import load
from projections.registry import BUILTINS
from projections.testing import ProjectionKit

class Clash(Projection[dict[str, int]]):
    name: ClassVar[str] = "trace_store"
    state_type = dict[str, int]
    def initial(self): return {}
    def fold(self, state, record): return state

class NoFold(Projection[dict[str, int]]):
    name: ClassVar[str] = "no_fold"
    state_type = dict[str, int]

class Dotted(Clash):
    name: ClassVar[str] = "has.dot"

class Unknown(Clash):
    name: ClassVar[str] = "unknown_reads"
    reads = frozenset({"tool.exploded"})

class NeedsArgs(Clash):
    name: ClassVar[str] = "needs_args"
    def __init__(self, x: int) -> None: ...

not_a_class = 3
'''


def test_a_bad_spec_is_a_one_line_error_naming_it(nats_url: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_plugins.py").write_text(BAD_MODULE)
    (tmp_path / "broken_import.py").write_text("import no_such_dependency_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    expected = {
        "no_such_module:X": "no module named 'no_such_module'",
        "bad_plugins:Missing": "module 'bad_plugins' has no 'Missing'",
        "bad_plugins:not_a_class": "int value is not a projections.base.Projection subclass",
        "json:JSONDecoder": "class JSONDecoder is not a projections.base.Projection subclass",
        "bad_plugins:Clash": "name 'trace_store' is taken by the built-in projections.trace_store.TraceStore",
        "bad_plugins:NoFold": "must define initial() and fold()",
        "bad_plugins:Dotted": "name 'has.dot' must be letters, digits",
        "bad_plugins:Unknown": "reads unknown event type(s) 'tool.exploded'",
        "bad_plugins:NeedsArgs": "cannot be built without arguments",
        "broken_import:X": "importing 'broken_import' failed",
        f"{tmp_path / 'nowhere.py'}:X": "no file",
        "justaname": "unknown projection 'justaname'",
    }
    for spec, message in expected.items():
        line = error_line(hx("--nats-url", nats_url, "projections", "run", spec, "--once"))
        assert message in line, (spec, line)
        if ":" in spec:
            assert f"projection {spec!r}" in line
    assert "--otlp-endpoint is for the otel projection" in error_line(
        hx("--nats-url", nats_url, "projections", "run", "task_history", "--once", "--otlp-endpoint", "http://127.0.0.1:9"))


ENTRY_POINTS = """[hx.projections]
tool_usage = tool_usage:ToolUsage
half_built = bad_plugins_ep:Missing
"""


def test_an_installed_entry_point_is_listed_and_runs_by_name(nats_url: str, tmp_path: Path,
                                                             examples_on_path: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution declaring ``hx.projections`` entry points (a real dist-info on sys.path)."""
    dist = tmp_path / "site" / "hx_usage_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hx-usage-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (tmp_path / "site" / "bad_plugins_ep.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    listed = ok(hx("--nats-url", nats_url, "projections", "list"))
    row = next(line for line in listed.stdout.splitlines() if line.strip().startswith("tool_usage"))
    assert "plugin tool_usage:ToolUsage" in row and "tool.invoked" in listed.stdout
    assert "built-in" in next(line for line in listed.stdout.splitlines() if line.strip().startswith("otel"))
    assert "entry point 'half_built' skipped" in listed.stderr and "has no 'Missing'" in listed.stderr
    toy_run(nats_url, tmp_path, "installed", tasks=1, attempts=1)
    out = ok(hx("--nats-url", nats_url, "projections", "run", "tool_usage", "--once")).stdout
    digest, applied, _ = fresh_fold(nats_url, tool_usage())
    assert DIGEST.findall(out) == [digest] and f"{applied} events applied" in out
    assert "has no 'Missing'" in error_line(hx("--nats-url", nats_url, "projections", "run", "half_built", "--once"))
    assert "tool_usage" in error_line(hx("--nats-url", nats_url, "projections", "run", "nope", "--once"))  # known names
