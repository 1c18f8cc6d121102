"""A projection runner killed mid-rebuild resumes from its checkpoint and ends exactly as one never killed.

The runner runs in a subprocess (``tests/projection_worker.py``) over a log of ~80k
events in frames, is SIGKILLed while folding, and a second process resumes from the
stored checkpoint. Its state digest, position and applied count must equal an
uninterrupted in-process rebuild's: every event folded exactly once across the crash.
To make the kill land mid-rebuild deterministically, the worker can pause for good
after its K-th checkpoint; one variant kills with no pause, wherever the kill lands.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from every_event import SPEC

from projections.registry import projection
from projections.runner import Checkpoint, ProjectionRunner
from schemas import (
    AttemptFinished,
    AttemptStarted,
    AttemptStatus,
    Event,
    HookRecord,
    StepEnd,
    StepStart,
    ToolCall,
    ToolInvoked,
    VerifierScore,
)
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.log import EventLog
from streams.outgoing import Entry
from streams.topology import trace_subject

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("projection_worker.py")
EVERY = 2000
ATTEMPTS = 160
STEPS = 166  # 3 events a step: 160 attempts x ~500 events = ~80k events
FRAME = 50


def attempt_events(run: str, rnd: int, task: str, n: int) -> list[Event]:
    status: AttemptStatus = "infra_failure" if n % 7 == 3 else "completed"
    passed = n % 3 != 0
    out: list[Event] = [AttemptStarted(run_id=run, round=rnd, task_id=task, attempt=n, harness_digest="h")]
    for step in range(1, STEPS + 1):
        out.append(HookRecord(stage="emitted", step=step, event=StepStart(step=step)))
        out.append(ToolInvoked(step=step, call=ToolCall(id=f"c{step}", name="act", input={"n": step})))
        out.append(HookRecord(stage="returned", step=step, event=StepEnd(step=step, done=step == STEPS)))
    out.append(VerifierScore(verifier="exact", passed=passed, score=0.5 + (n % 5) / 10))
    out.append(AttemptFinished(run_id=run, round=rnd, task_id=task, attempt=n, passed=passed, steps=STEPS,
                               score=float(passed), status=status))
    return out


async def append_big_log(log: EventLog) -> int:
    """Append ~80k events in frames, attempts interleaved frame by frame; return the last sequence."""
    attempts = []
    for i in range(ATTEMPTS):
        run, rnd, task, n = f"run{i % 2}", i // 40, f"task-{i % 10}", (i // 10) % 4
        subject = trace_subject(run, rnd, task, n)
        attempts.append([Entry(subject, ev, key=f"{subject}#{j}")
                         for j, ev in enumerate(attempt_events(run, rnd, task, n))])
    entries: list[Entry] = []
    for offset in range(0, max(len(a) for a in attempts), FRAME):
        for events in attempts:
            entries.extend(events[offset:offset + FRAME])
    assert len(entries) >= 60_000
    await log.append_batch(entries, frame_size=FRAME)
    return await log.last_seq()


@dataclass
class Worker:
    """One worker subprocess, its output going to files (a full pipe could block it)."""

    proc: subprocess.Popen[bytes]
    stdout: Path

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.read_text().splitlines() if line.startswith("{")]

    def paused(self) -> list[int] | None:
        return next((line["paused"] for line in self.lines() if "paused" in line), None)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


@pytest.fixture
def spawn(nats_url: str, tmp_path: Path) -> Any:
    """Start workers; any still running when the test ends is killed."""
    workers: list[Worker] = []

    def start(mode: str, name: str, *extra: str, every: int = EVERY) -> Worker:
        n = len(workers)
        out, err = tmp_path / f"worker{n}.out", tmp_path / f"worker{n}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen([sys.executable, str(WORKER), mode, nats_url, name,
                                     "--checkpoint-every", str(every), *extra], stdout=stdout, stderr=stderr)
        workers.append(Worker(proc, out))
        return workers[-1]

    yield start
    for worker in workers:
        worker.kill()


async def wait_for(condition: Callable[[], Any], worker: Worker, what: str, timeout: float = 25.0) -> Any:
    """Poll until ``condition()`` is truthy; fail early if the worker exits first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if worker.proc.poll() is not None:
            return None
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def stored(log: EventLog, name: str) -> Checkpoint | None:
    return await ProjectionRunner(log, projection(name)).status()


async def run_to_end(spawn: Any, name: str) -> dict[str, Any]:
    """Run a resuming worker to completion and return its report."""
    worker: Worker = spawn("resume", name)
    rc = await asyncio.to_thread(worker.proc.wait, 60)
    err = worker.stdout.with_suffix(".err").read_text()
    assert rc == 0, f"resume worker failed ({rc}): {err[-2000:]}"
    return worker.lines()[-1]


async def uninterrupted(log: EventLog, name: str) -> ProjectionRunner[Any]:
    reference = ProjectionRunner(log, projection(name), checkpoint_every=EVERY)
    await reference.rebuild()
    return reference


async def assert_exactly_once(conn: Connection, name: str, report: dict[str, Any]) -> None:
    final = await stored(conn.log, name)
    assert final is not None
    assert [final.seq, final.index] == report["position"] and final.digest == report["digest"]
    reference = await uninterrupted(conn.log, name)
    assert report["digest"] == reference.digest
    assert report["position"] == list(reference.position)
    assert report["applied"] == reference.applied


# A fold of every event, and the two narrow built-ins (they read only summary messages: a few
# hundred events here, so they checkpoint more often for the kill to land mid-rebuild).
@pytest.mark.parametrize(("name", "every"), [(SPEC, EVERY), ("task_history", 20), ("trace_store", 50)],
                         ids=["every_event", "task_history", "trace_store"])
async def test_runner_killed_mid_rebuild_resumes_from_its_checkpoint(
        conn: Connection, spawn: Any, name: str, every: int) -> None:
    last = await append_big_log(conn.log)
    worker: Worker = spawn("rebuild", name, "--pause-after-checkpoints", "5", every=every)
    paused = await wait_for(worker.paused, worker, "the worker's 5th checkpoint")
    assert paused is not None, f"worker exited: {worker.stdout.with_suffix('.err').read_text()[-2000:]}"
    cp = await stored(conn.log, name)
    assert cp is not None and [cp.seq, cp.index] == paused
    assert 0 < cp.seq < last  # the kill lands mid-rebuild
    assert cp.applied == 5 * every  # the runner reads only what the projection folds, and checkpoints on the count
    worker.kill()

    report = await run_to_end(spawn, name)
    assert report["resumed_from"] == paused  # from the checkpoint, not from scratch
    await assert_exactly_once(conn, name, report)


async def test_runner_killed_wherever_the_kill_lands_still_ends_exactly_once(conn: Connection, spawn: Any) -> None:
    last = await append_big_log(conn.log)
    worker: Worker = spawn("rebuild", SPEC)
    seen = await wait_for(lambda: stored(conn.log, SPEC), worker, "a first checkpoint")
    worker.kill()  # wherever it is now: folding, writing a snapshot, between snapshot and position
    # ``seen`` is None only when the rebuild finished before a poll saw a checkpoint.
    floor = [seen.seq, seen.index] if seen is not None else [1, 0]

    report = await run_to_end(spawn, SPEC)
    assert report["resumed_from"] is not None and report["resumed_from"] >= floor  # not from scratch
    assert report["position"][0] == last
    await assert_exactly_once(conn, SPEC, report)


async def test_runner_killed_twice_resumes_each_time_further_on(conn: Connection, spawn: Any) -> None:
    last = await append_big_log(conn.log)
    first: Worker = spawn("rebuild", SPEC, "--pause-after-checkpoints", "3")
    first_pause = await wait_for(first.paused, first, "the rebuild's 3rd checkpoint")
    assert first_pause is not None and 0 < first_pause[0] < last
    first.kill()

    second: Worker = spawn("resume", SPEC, "--pause-after-checkpoints", "3")
    second_pause = await wait_for(second.paused, second, "the resume's 3rd checkpoint")
    assert second_pause is not None and first_pause < second_pause and second_pause[0] < last
    second.kill()
    cp = await stored(conn.log, SPEC)
    assert cp is not None and cp.applied == 6 * EVERY

    report = await run_to_end(spawn, SPEC)
    assert report["resumed_from"] == second_pause
    await assert_exactly_once(conn, SPEC, report)
