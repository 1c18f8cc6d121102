"""The log throughput benchmark's workload: synthetic attempts, sizes, the JSON-lines file baseline, timers."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.event import Event
from schemas.hooks import AfterModel, BeforeModel, HookRecord, StepEnd, StepStart
from schemas.lifecycle import AttemptFinished, AttemptStarted
from streams.outgoing import Entry
from streams.topology import trace_subject

EVENTS_PER_ATTEMPT = 64


@dataclass(frozen=True)
class Sizes:
    """How much each part of the benchmark writes and reads."""

    write_events: int
    """Events per write trial (parts 1-3)."""
    trials: int
    rebuild_framed: int
    """Events in the framed log a projection is rebuilt from (part 4)."""
    rebuild_single: int
    """Events in the one-event-per-message log (part 4)."""
    rebuilds: int
    """Times each rebuild is repeated (the median is reported)."""


QUICK = Sizes(write_events=10_000, trials=3, rebuild_framed=100_000, rebuild_single=10_000, rebuilds=1)
DEFAULT = Sizes(write_events=50_000, trials=5, rebuild_framed=1_000_000, rebuild_single=100_000, rebuilds=3)


# --- payloads --------------------------------------------------------------------------


def attempt_events(run: str, rnd: int, task: str, attempt: int, n: int = EVENTS_PER_ATTEMPT) -> list[Event]:
    """One attempt's events: started, ``n - 2`` small hook records, finished."""
    events: list[Event] = [AttemptStarted(run_id=run, round=rnd, task_id=task, attempt=attempt,
                                          harness_digest="sha256:4f1c2a9e0b7d", model="claude-sonnet-4-5",
                                          seed=attempt)]
    for i in range(n - 2):
        step = i // 4 + 1
        kind = i % 4
        if kind == 0:
            hook: StepStart | BeforeModel | AfterModel | StepEnd = StepStart(step=step)
        elif kind == 1:
            hook = BeforeModel(step=step)
        elif kind == 2:
            hook = AfterModel(step=step, content="go north", stop_reason="end_turn", model="claude-sonnet-4-5")
        else:
            hook = StepEnd(step=step, done=False)
        events.append(HookRecord(stage="emitted", step=step, event=hook))
    events.append(AttemptFinished(run_id=run, round=rnd, task_id=task, attempt=attempt, passed=attempt % 3 == 0,
                                  score=1.0 if attempt % 3 == 0 else 0.0, steps=(n - 2) // 4))
    return events


def entries(run: str, n: int, start: int = 0) -> list[Entry]:
    """``n`` events of consecutive attempts of ``run``, from event number ``start``, keyed by position."""
    out: list[Entry] = []
    first = start // EVENTS_PER_ATTEMPT
    a = first
    while len(out) < n:
        task = f"twx:coin:dev:{a % 100}"
        subject = trace_subject(run, 1, task, a)
        events = attempt_events(run, 1, task, a)
        skip = start - a * EVENTS_PER_ATTEMPT if a == first else 0
        for i, ev in enumerate(events[skip:], skip):
            out.append(Entry(subject, ev, f"{subject}#{i}"))
            if len(out) == n:
                break
        a += 1
    return out


def chunks(run: str, n: int, size: int) -> Iterator[list[Entry]]:
    """The entries of ``entries(run, n)`` in lists of ``size`` (aligned on attempts)."""
    for start in range(0, n, size):
        yield entries(run, min(size, n - start), start)


# --- measuring -------------------------------------------------------------------------


@dataclass
class Result:
    """One measured quantity over its trials (a rate: units per second)."""

    label: str
    rates: list[float] = field(default_factory=list)
    cpu_rates: list[float] = field(default_factory=list)
    """Per second of this process's CPU time (less sensitive to other load on the machine)."""

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def best(self) -> float:
        return max(self.rates) if self.rates else 0.0

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_rates) if self.cpu_rates else 0.0


def rate(count: int, seconds: float) -> float:
    """``count`` per second of ``seconds``; infinite when the clock saw no time pass."""
    return count / seconds if seconds > 0 else float("inf")


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and process-CPU seconds of ``fn()``, after a full collection."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


async def atimed(coro: Awaitable[object]) -> tuple[float, float]:
    """Wall and process-CPU seconds of awaiting ``coro``, after a full collection."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    await coro
    return time.perf_counter() - t0, time.process_time() - c0


# --- the JSON-lines file baseline ------------------------------------------------------


class JsonLine(msgspec.Struct):
    """One event as the JSON-lines baseline stores it: what the log's headers and body carry."""

    subject: str
    key: str
    type: str
    version: int
    time_ns: int
    event: Event


def write_jsonl(path: Path, batch: list[Entry], fsync: bool) -> tuple[float, float]:
    """Each event as one JSON line (its subject, key, type, time and fields), buffered writes."""
    enc = msgspec.json.Encoder()

    def go() -> None:
        now = time.time_ns()
        with open(path, "wb") as fh:
            for e in batch:
                cls = type(e.event)
                fh.write(enc.encode(JsonLine(e.subject, e.key or "", cls.TYPE, cls.VERSION, now, e.event)))
                fh.write(b"\n")
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())

    seconds = timed(go)
    path.unlink()
    return seconds


class TypeCount(Projection[dict[str, int]]):
    """Events of each type over the whole trace: a fold that reads and decodes every event, with a state that does
    not grow with the log (the trace store, which once read every event, now reads only the summary channels)."""

    name: ClassVar[str] = "bench_type_count"
    state_type = dict[str, int]

    def initial(self) -> dict[str, int]:
        """Nothing counted."""
        return {}

    def fold(self, state: dict[str, int], record: Record) -> dict[str, int]:
        """Count the record under its type."""
        state[record.type] = state.get(record.type, 0) + 1
        return state
