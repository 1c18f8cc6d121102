"""``hx export --trajectories``: each attempt's conversation written once, so a file grows with its attempt's length.

Real ``hx evolve`` runs on a toy world whose episodes never end by themselves (every attempt
runs to ``--max-steps``) are exported with ``--trajectories``; the files are read back with
``hx.cli.trajectories.read_trajectory`` and compared with the attempts' events resolved from
the log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
import toyworld
from hx_cli import hx, ok

from hx.cli.log import json_line
from hx.cli.trajectories import CONVERSATION, TrajectoryFiles, read_trajectory
from hx.environments.registry import TaskId, register_benchmark
from hx.runtime.task import Task
from schemas.envelope import Record
from schemas.event import Event, event_type
from schemas.history import resolve_async
from schemas.hooks import HookRecord, StepEnd
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import History, Message
from schemas.model import ModelRequest
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import TRACE

WINDOWLESS = """\
processors:
  - type: system_prompt_template
    hooks: [task_start]
    params:
      template: "$system_prompt Play the game. $instruction"
slots: {}
"""
"""A harness that never trims the conversation: each step's conversation is the last one plus the step's messages."""


class EndlessTask(toyworld.ToyWorldTask):
    """A toy world episode that never ends by itself: only the step cap stops it."""

    @property
    def done(self) -> bool:
        """Never."""
        return False


class Endless(toyworld.ToyWorld):
    """``toyendless``: toyworld's games, every attempt as long as ``--max-steps``."""

    name: ClassVar[str] = "toyendless"

    def make_task(self, task_id: TaskId) -> Task:
        """A fresh endless episode."""
        self.check_own(task_id)
        return EndlessTask(task_id)


register_benchmark("toyendless", Endless)


@dataclass(frozen=True)
class Exported:
    """An evolution run on the test server and its ``--trajectories`` export."""

    run_id: str
    out: Path

    def files(self) -> list[Path]:
        """Its trajectory files."""
        return sorted(self.out.glob("R*/trajectories/*.jsonl"))


@dataclass(frozen=True)
class Runs:
    """The server and the runs: windowless 20 and 40 steps, and the starter harness (its window trims) at 40."""

    url: str
    short: Exported
    long: Exported
    windowed: Exported


def make(url: str, root: Path, run_id: str, steps: int, harness: Path | None) -> Exported:
    """``hx evolve`` one round on one endless task (one attempt), exported with ``--trajectories``."""
    base = ("--nats-url", url, "--data-dir", str(root / "data"))
    ok(hx(*base, "evolve", "--bench", "toyendless:rooms", "--tasks", "1", "--heldout-tasks", "1", "--attempts", "1",
          "--rounds", "1", "--candidates", "1", "--max-steps", str(steps), "--seed", "5", "--run-id", run_id,
          *(("--harness", str(harness)) if harness else ())))
    out = root / run_id
    ok(hx(*base, "export", run_id, str(out), "--trajectories"))
    return Exported(run_id, out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("trajectories")
    server = NatsProcess(root / "nats")
    server.start(detach=False)
    try:
        harness = root / "windowless.yaml"
        harness.write_text(WINDOWLESS)
        yield Runs(server.url, make(server.url, root, "short", 20, harness),
                   make(server.url, root, "long", 40, harness), make(server.url, root, "windowed", 40, None))
    finally:
        server.stop()


async def resolved(url: str, subject: str) -> list[Record]:
    """The attempt's events read off the log, conversations resolved."""
    async with connect(NatsSettings(url=url)) as conn:
        return [r async for r in resolve_async(conn.log.read(TRACE.name, subjects=[subject]))]


def test_an_attempt_twice_as_long_makes_a_file_about_twice_as_large(runs: Runs) -> None:
    [short], [long] = runs.short.files(), runs.long.files()
    steps = [max(json.loads(line).get("event", {}).get("step", 0) for line in f.read_text().splitlines())
             for f in (short, long)]
    assert steps == [20, 40]  # the attempts ran to their caps: the long one is twice as long
    ratio = long.stat().st_size / short.stat().st_size
    assert ratio < 3, f"{long.stat().st_size} / {short.stat().st_size} bytes: grows faster than the attempt"


@pytest.mark.parametrize("which", ["long", "windowed"])
def test_read_trajectory_gives_back_the_events_resolved_from_the_log(runs: Runs, which: str) -> None:
    exported: Exported = getattr(runs, which)
    assert exported.files()
    for path in exported.files():
        raw = path.read_bytes().splitlines()
        head = json.loads(raw[0])
        assert head["type"] == CONVERSATION
        rebuilt = list(read_trajectory(raw))
        records = asyncio.run(resolved(runs.url, head["subject"]))
        assert rebuilt == [json.loads(json_line(r)) for r in records]  # the lines hx log dump writes of them
        assert [msgspec.convert(line["event"], event_type(line["type"])) for line in rebuilt] == [
            r.event for r in records]  # and the typed events
        conversations = [line["event"]["messages"] for line in rebuilt if line["type"] == "model.request"]
        assert len(conversations) == 40 and all(conversations)
        if which == "windowed":  # the window trimmed: some conversation is no prefix of the table
            spans = [json.loads(line)["event"]["messages"]["spans"] for line in raw[1:]
                     if json.loads(line)["type"] == "model.request"]
            assert any(len(s) > 1 for s in spans)


def test_each_message_is_written_once(runs: Runs) -> None:
    [path] = runs.long.files()
    raw = path.read_bytes().splitlines()
    table = json.loads(raw[0])["messages"]
    assert len(table) == len({json.dumps(m, sort_keys=True) for m in table})  # no message twice
    lines = [json.loads(line) for line in raw[1:]]
    refs = [line["event"]["messages"] for line in lines if line["type"] == "model.request"] + [
        line["event"]["event"]["messages"] for line in lines if "messages" in line["event"].get("event", {})]
    assert len(refs) == 40 * 7 and all(set(ref) == {"spans"} for ref in refs)  # every conversation a reference


def test_conversations_the_log_could_not_resolve_or_read_late_are_written_in_full(tmp_path: Path) -> None:
    subject = "hx.trace.r.1.toy_rooms_dev_0.0"
    hi, there = Message(role="user", content="hi"), Message(role="assistant", content="there")
    events: list[Event] = [
        AttemptStarted(run_id="r", round=1, task_id="toy:rooms:dev:0", attempt=0),
        ModelRequest(role="main", model="m", step=1, messages=(hi,)),
        # as read when its base conversation was not (the resolver passes it on still packed)
        ModelRequest(role="main", model="m", step=2, history=History(ordinal=3, parts=((0, 1),))),
        HookRecord(stage="emitted", step=2, event=StepEnd(step=2, messages=(hi, there))),
        AttemptFinished(run_id="r", round=1, task_id="toy:rooms:dev:0", attempt=0, passed=False),
        ModelRequest(role="main", model="m", step=3, messages=(hi, there)),  # after its file was written
    ]
    records = [Record(i + 1, 0, subject, type(e).TYPE, type(e).VERSION, 10**18 + i, e) for i, e in enumerate(events)]
    files = TrajectoryFiles(tmp_path)
    finished, unfinished = tmp_path / "finished.jsonl", tmp_path / "unfinished.jsonl"
    for record in records:
        files.add(finished, record)
    for record in records[:2]:
        files.add(unfinished, record)
    files.close()  # writes the attempt that never finished
    for path, written in ((finished, records), (unfinished, records[:2])):
        raw = path.read_bytes().splitlines()
        assert list(read_trajectory(raw)) == [json.loads(json_line(r)) for r in written]
    raw = finished.read_bytes().splitlines()
    both = json.loads(msgspec.json.encode([hi, there]))
    assert json.loads(raw[0])["messages"] == both
    assert [json.loads(line)["event"].get("messages") for line in raw[1:] if b'"model.request"' in line] == [
        {"spans": [[0, 1]]}, [], both]
    assert json.loads(raw[4])["event"]["event"]["messages"] == {"spans": [[0, 2]]}
