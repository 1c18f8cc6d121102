"""Real runs for the subscription tests: ``hx run`` on the toy corridor, and reading back what it logged."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import toybench  # noqa: F401 - registers the toy benchmark with the in-process command
from hx_cli import hx, ok

from projections.base import Projection, state_digest
from projections.runner import Checkpoint, LogPosition, ProjectionRunner
from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import ToolCall, ToolResult, Usage
from schemas.model import ModelRequest, ModelResponse
from schemas.tools import ToolInvoked, ToolReturned
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import TRACE, trace_subject

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
"""Where the example projection plugin lives (``docs/examples/tool_usage.py``)."""


def toy_run(nats_url: str, data_dir: Path, run_id: str, *extra: str, tasks: int = 2, attempts: int = 2,
            max_steps: int = 8, env: dict[str, str | None] | None = None) -> None:
    """One real ``hx run`` on ``toy:walk`` (random agent unless ``extra`` names a model), logged on ``nats_url``."""
    ok(hx("--nats-url", nats_url, "--data-dir", str(data_dir), "run", "--bench", "toy:walk", "--tasks", str(tasks),
          "--attempts", str(attempts), "--max-steps", str(max_steps), "--run-id", run_id, "--json", *extra, env=env))


def records(nats_url: str, subjects: Sequence[str] = (), types: Sequence[str] = ()) -> list[Record]:
    """Every trace record matching the subject filters and types, in log order."""
    async def read() -> list[Record]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return [r async for r in conn.log.read(TRACE.name, subjects=subjects, types=types)]
    return asyncio.run(read())


def fresh_fold(nats_url: str, projection: Projection[Any], upto: LogPosition | None = None,
               since: int = 1) -> tuple[str, int, Any]:
    """(digest, events applied, state) of ``projection`` folded afresh from sequence ``since`` to ``upto``."""
    async def fold() -> tuple[str, int, Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, projection)
            async for record in conn.log.read(projection.stream, start=since,
                                                stop=None if upto is None else upto[0]):
                if upto is None or record.position <= upto:
                    runner.apply(record)
            return state_digest(runner.state), runner.applied, runner.state
    return asyncio.run(fold())


def checkpoint(nats_url: str, projection: Projection[Any]) -> Checkpoint | None:
    """The stored checkpoint of ``projection``, if any."""
    async def read() -> Checkpoint | None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return await ProjectionRunner(conn.log, projection).status()
    return asyncio.run(read())


def output_of(proc: subprocess.Popen[str]) -> str:
    """A follower's stderr for a failure message, killed first if it still runs (reading a live pipe blocks)."""
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate(timeout=10)
    return f"exit {proc.returncode}; stderr:\n{err}"


def stop(proc: subprocess.Popen[str], expected: int = 143) -> None:
    """SIGTERM a follower and check its exit code (a second SIGTERM, as a user would, if the first was swallowed)."""
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=10) == expected
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143


async def interleaved_attempts(log: EventLog, run: str = "kit", attempts: int = 3) -> AsyncIterator[object]:
    """Attempts written step by step and interleaved (a model call and a tool call each; odd ones fail the tool)."""
    subjects = [trace_subject(run, 0, "t", n) for n in range(attempts)]
    for n, subject in enumerate(subjects):
        await log.append(subject, AttemptStarted(run_id=run, round=0, task_id="t", attempt=n, model="openai:m"))
    yield "started"
    for n, subject in enumerate(subjects):
        call = ToolCall(id=f"c{n}", name="act", input={"action": "look"})
        await log.append_frame(subject, [
            ModelRequest(role="main", model="openai:m", step=1, params={"temperature": 0.5}),
            ModelResponse(role="main", model="openai:m", model_version="m-1", step=1, tool_calls=(call,),
                          stop_reason="tool_use", usage=Usage(input_tokens=7, output_tokens=3)),
            ToolInvoked(step=1, call=call)])
        yield n
    for n, subject in enumerate(subjects):
        await log.append_frame(subject, [
            ToolReturned(step=1, result=ToolResult(call_id=f"c{n}", name="act", output="ok", is_error=n % 2 == 1))])
        # A summary event goes in a message of its own, on the attempt's channel (streams.channels).
        await log.append(subject, AttemptFinished(run_id=run, round=0, task_id="t", attempt=n, passed=n % 2 == 0,
                                                  steps=1))
        yield n
