"""A projection plugin whose own code fails: one line naming it, the event and the exception; nothing written.

Three plugins fold real ``hx run`` traces and fail on the second run's ``attempt.finished``:
``raises`` raises, ``exits`` calls ``sys.exit(0)`` (never the command's own exit), and
``unencodable`` puts a value msgspec cannot encode into its state (found when the state is
checkpointed). Each fold half-updates its state first, as an in-place fold does. The first run
folds cleanly and is checkpointed; after each failure the positions bucket and the blob store
hold exactly what they held before (``hx projections run --once``, ``--from-start``,
``rebuild``, ``rebuild --as-of``, and a follower in a process of its own). A plugin failing in
its ``decode()``, ``summary()``, ``initial()``, constructor or import is one line too.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hx_cli import error_line, hx, ok
from nats.js.errors import KeyDeletedError, NotFoundError
from subscribe_kit import output_of, records, toy_run

from schemas.lifecycle import AttemptFinished
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import BLOB_STORE, POSITIONS_BUCKET, trace_filter

PLUGINS = '''
import sys
from typing import ClassVar

from projections.base import Projection


class Counted(Projection[dict[str, object]]):
    """Counts events by type; fails (``fail``) on the attempt.finished of run ``second``."""

    name: ClassVar[str] = "counted"
    state_type = dict[str, int]

    def initial(self):
        return {}

    def fold(self, state, record):
        state[record.type] = state.get(record.type, 0) + 1  # updated in place before the failure
        if record.type == "attempt.finished" and record.subject.split(".")[2] == "second":
            self.fail(state)
        return state

    def fail(self, state):
        pass


class Raises(Counted):
    name: ClassVar[str] = "raises"

    def fail(self, state):
        raise ValueError("no finish line here")


class Exits(Counted):
    name: ClassVar[str] = "exits"

    def fail(self, state):
        sys.exit(0)


class Unencodable(Counted):
    name: ClassVar[str] = "unencodable"

    def fail(self, state):
        state["finished"] = object()


class ExitsOnDecode(Counted):
    name: ClassVar[str] = "exits_on_decode"

    def decode(self, data):
        sys.exit(0)


class RaisesInSummary(Counted):
    name: ClassVar[str] = "raises_in_summary"

    def summary(self, state):
        raise KeyError("total")


class RaisesInInitial(Counted):
    name: ClassVar[str] = "raises_in_initial"

    def initial(self):
        raise RuntimeError("no state for you")


class ExitsWhenBuilt(Counted):
    name: ClassVar[str] = "exits_when_built"

    def __init__(self):
        sys.exit(3)
'''
EXITS_ON_IMPORT = "import sys\nsys.exit(0)\n"
OTHER_METHODS = {
    "ExitsOnDecode": "projection 'exits_on_decode' (failing_plugins:ExitsOnDecode): decode() of its checkpoint failed: "
                     "it called sys.exit(0)",
    "RaisesInSummary": "projection 'raises_in_summary' (failing_plugins:RaisesInSummary): summary() failed: "
                       "KeyError: 'total'",
    "RaisesInInitial": "projection 'raises_in_initial' (failing_plugins:RaisesInInitial): initial() failed: "
                       "RuntimeError: no state for you",
    "ExitsWhenBuilt": "projection 'failing_plugins:ExitsWhenBuilt': building ExitsWhenBuilt() failed: "
                      "it called sys.exit(3)",
}
CLASSES = {"raises": "Raises", "exits": "Exits", "unencodable": "Unencodable"}
EXCEPTIONS = {"raises": "ValueError: no finish line here", "exits": "it called sys.exit(0)",
              "unencodable": "cannot be encoded: TypeError: Encoding objects of type object is unsupported"}


def stored(nats_url: str) -> tuple[dict[str, bytes], dict[str, str]]:
    """Everything checkpoints and snapshots live in: the positions bucket's entries, the blob store's objects."""
    async def read() -> tuple[dict[str, bytes], dict[str, str]]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            kv = await conn.js.key_value(POSITIONS_BUCKET)
            # The keys from the bucket stream's subject index (one request), not kv.keys(): its watcher gives up
            # after 5 s without a message, and then reports no keys at all (seen on a loaded machine).
            prefix = f"$KV.{POSITIONS_BUCKET}."
            info = await conn.js.stream_info(f"KV_{POSITIONS_BUCKET}", subjects_filter=prefix + ">")
            entries = {}
            for subject in info.state.subjects or {}:
                try:
                    entries[subject.removeprefix(prefix)] = (await kv.get(subject.removeprefix(prefix))).value or b""
                except KeyDeletedError:
                    continue
            store = await conn.js.object_store(BLOB_STORE)
            try:
                infos = await store.list()
            except NotFoundError:
                infos = []
            return entries, {i.name: str(i.digest) for i in infos if not i.deleted}
    return asyncio.run(read())


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "failing_plugins.py").write_text(PLUGINS)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def spec(name: str) -> str:
    return f"failing_plugins:{CLASSES[name]}"


def failing_event(nats_url: str) -> str:
    """Where the plugins fail, as the error line names it: the second run's attempt.finished."""
    [record] = records(nats_url, [trace_filter("second")], [AttemptFinished.TYPE])
    index = f", event {record.index} of the message" if record.index else ""
    return f"HX_TRACE seq {record.seq}{index} ({record.subject}, attempt.finished)"


def first_good_then_second(nats_url: str, tmp_path: Path, name: str) -> None:
    """The first run folds and is checkpointed; the second run, which the plugin fails on, is logged after it."""
    toy_run(nats_url, tmp_path, "first", tasks=1, attempts=1)
    ok(hx("--nats-url", nats_url, "projections", "run", spec(name), "--once"))
    toy_run(nats_url, tmp_path, "second", tasks=1, attempts=1)


@pytest.mark.parametrize("name", list(CLASSES))
def test_a_failing_plugin_is_one_line_and_writes_nothing(nats_url: str, tmp_path: Path, plugins: Path,
                                                         name: str) -> None:
    first_good_then_second(nats_url, tmp_path, name)
    before = stored(nats_url)
    assert name in before[0]  # the first run's checkpoint
    bad = failing_event(nats_url)
    last = max(r.seq for r in records(nats_url))
    for command in (("run", spec(name), "--once"), ("run", spec(name)), ("run", spec(name), "--once", "--from-start"),
                    ("rebuild", spec(name)), ("rebuild", spec(name), "--as-of", str(last))):
        result = hx("--nats-url", nats_url, "projections", *command)
        line = error_line(result)
        assert result.stderr.strip().splitlines() == [line], (command, result.stderr)
        assert f"projection {name!r} (failing_plugins:{CLASSES[name]})" in line, line
        assert EXCEPTIONS[name] in line, line
        if name == "unencodable":  # found when the state is encoded: after the last event folded
            assert "its state after HX_TRACE seq " in line and "the last event folded" in line, line
        else:
            assert f"failed on {bad}: " in line and "nothing was checkpointed from this event on" in line, line
        assert stored(nats_url) == before, command  # no checkpoint, snapshot or as-of snapshot written


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLASSES))
def test_a_follower_whose_plugin_fails_stops_with_one_line(nats_url: str, tmp_path: Path, plugins: Path,
                                                           name: str) -> None:
    toy_run(nats_url, tmp_path, "first", tasks=1, attempts=1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    follower = subprocess.Popen(
        [sys.executable, "-m", "hx", "--nats-url", nats_url, "projections", "run", spec(name),
         *(["--checkpoint-every", "1"] if name == "unencodable" else [])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stderr is not None
        assert "following the log" in follower.stderr.readline(), output_of(follower)  # the first run checkpointed
        before = stored(nats_url)
        toy_run(nats_url, tmp_path, "second", tasks=1, attempts=1)
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and EXCEPTIONS[name] in lines[0], err
    bad = failing_event(nats_url)
    assert bad in lines[0], err
    if name != "unencodable":
        assert stored(nats_url) == before  # the spoiled state was not checkpointed on the way out
    else:  # checkpointed after every event: up to the last one whose state encoded, never past it
        entries, _ = stored(nats_url)
        assert entries[name] != before[0][name]


def test_a_plugin_failing_elsewhere_is_one_line_too(nats_url: str, tmp_path: Path, plugins: Path) -> None:
    """Its decode(), summary(), initial(), constructor or import raising or exiting: one line, exit 1."""
    toy_run(nats_url, tmp_path, "first", tasks=1, attempts=1)
    ok(hx("--nats-url", nats_url, "projections", "run", "failing_plugins:ExitsOnDecode", "--once"))  # checkpointed
    (plugins / "exits_on_import.py").write_text(EXITS_ON_IMPORT)
    expected = {**{f"failing_plugins:{cls}": text for cls, text in OTHER_METHODS.items()},
                "exits_on_import:X": "projection 'exits_on_import:X': importing 'exits_on_import' failed: "
                                     "it called sys.exit(0)"}
    for name, text in expected.items():
        before = stored(nats_url)
        result = hx("--nats-url", nats_url, "projections", "run", name, "--once")
        assert error_line(result) == f"error: {text}", (name, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        if name != "failing_plugins:RaisesInSummary":  # (its fold and checkpoint went well before its summary)
            assert stored(nats_url) == before, name
