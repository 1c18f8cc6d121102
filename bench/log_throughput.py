#!/usr/bin/env python
"""Throughput of hx's event log against raw nats-py and a JSON-lines file, and of projection rebuilds.

Run from the repository root::

    python bench/log_throughput.py           # default sizes, a few minutes
    python bench/log_throughput.py --quick   # smaller sizes, under 30 s

It starts its own nats-server (``streams.server.NatsProcess``) in a temporary directory,
applies hx's topology, and measures on the same payloads (a synthetic attempt: one
``AttemptStarted``, small ``HookRecord`` events cycling step_start / before_model /
after_model / step_end, one ``AttemptFinished``):

1. ``EventLog.append_batch`` one event per message vs raw ``js.publish_async`` with the
   same bodies and headers and gathered acks;
2. ``EventLog.append_batch(frame_size=64)``;
3. a JSON-lines file (msgspec.json per event + write; flush, and flush + fsync);
4. ``ProjectionRunner(TypeCount()).rebuild()`` (every event read and decoded) over logs of 64-event frames, step-sized
   frames (<= 12 events) and single events, with a breakdown into raw fetch, decode and fold
   rates measured separately, and a rebuild without intermediate checkpoints.

Write figures are the median of several trials (best shown too); the stream is purged
before each trial and every trial uses fresh subjects and keys, so each stores the same
number of new messages. Trials alternate between the contenders so drift hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar

import nats

# A sibling script's module, found because running a script puts its directory on sys.path.
from log_workload import (
    DEFAULT,
    EVENTS_PER_ATTEMPT,
    QUICK,
    Result,
    Sizes,
    TypeCount,
    atimed,
    chunks,
    entries,
    rate,
    write_jsonl,
)
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from projections.base import Projection
from projections.runner import ProjectionRunner
from projections.task_history import TaskHistory
from schemas.envelope import decode_message, encode_body, headers_for
from streams.log import EventLog
from streams.outgoing import Entry
from streams.server import NatsProcess, nats_server_binary
from streams.topology import TRACE, apply_topology

FRAME_SIZE = 64
STEP_FRAME = 12
"""About one step's events: what the run loop's tracer appends as one frame."""
_runs = itertools.count()
S = TypeVar("S")


# --- the trace stream --------------------------------------------------------------------


async def purge(js: JetStreamContext) -> None:
    await js.purge_stream(TRACE.name)


async def stored(js: JetStreamContext) -> int:
    info = await js.stream_info(TRACE.name)
    return int(info.state.messages)


# --- part 1-3: writes --------------------------------------------------------------------


async def write_eventlog(log: EventLog, batch: list[Entry], frame_size: int) -> tuple[float, float]:
    """Wall and client-CPU seconds of one ``append_batch`` (encoding included)."""
    return await atimed(log.append_batch(batch, frame_size=frame_size))


async def write_raw(js: JetStreamContext, batch: list[Entry]) -> tuple[float, float]:
    """Raw nats-py: same bodies and headers, published with publish_async, acks gathered.

    Bodies and headers are encoded before the clock starts, so this is the client alone.
    """
    now = time.time_ns()
    prepared = [(e.subject, encode_body(e.event), headers_for(type(e.event).TYPE, type(e.event).VERSION,
                                                                 e.key or "", now)) for e in batch]

    async def go() -> None:
        futs = [await js.publish_async(s, b, headers=h) for s, b, h in prepared]
        await asyncio.gather(*futs)

    return await atimed(go())


async def bench_writes(js: JetStreamContext, log: EventLog, sizes: Sizes, tmp: Path) -> dict[str, Result]:
    n = sizes.write_events
    res = {k: Result(label) for k, label in [
        ("raw", "raw nats-py publish_async + gather (1 event/msg)"),
        ("log1", "EventLog.append_batch, frame_size=1"),
        ("log64", f"EventLog.append_batch, frame_size={FRAME_SIZE}"),
        ("jsonl", "JSON lines file: encode + write + flush"),
        ("jsonl_fsync", "JSON lines file: ... + fsync at end"),
    ]}
    # One warm-up round so connection set-up and the first file blocks count nowhere.
    await purge(js)
    await write_raw(js, entries("warm-raw", 2000))
    await write_eventlog(log, entries("warm-log", 2000), 1)
    for trial in range(sizes.trials):
        for kind in ("raw", "log1", "log64"):
            await purge(js)
            batch = entries(f"w{trial}-{kind}", n)
            if kind == "raw":
                seconds, cpu = await write_raw(js, batch)
            else:
                seconds, cpu = await write_eventlog(log, batch, 1 if kind == "log1" else FRAME_SIZE)
            msgs = await stored(js)
            expect = n if kind != "log64" else framed_messages(batch, FRAME_SIZE)
            if msgs != expect:
                raise SystemExit(f"{kind}: stream holds {msgs} messages, expected {expect}")
            res[kind].rates.append(rate(n, seconds))
            res[kind].cpu_rates.append(rate(n, cpu))
        batch = entries(f"w{trial}-file", n)
        for kind, fsync in (("jsonl", False), ("jsonl_fsync", True)):
            seconds, cpu = write_jsonl(tmp / "events.jsonl", batch, fsync=fsync)
            res[kind].rates.append(rate(n, seconds))
            res[kind].cpu_rates.append(rate(n, cpu))
    await purge(js)
    return res


# --- part 4: reads and rebuilds ----------------------------------------------------------


async def fill(log: EventLog, run: str, n: int, frame_size: int) -> float:
    """Append ``n`` events of ``run``; return the seconds spent (encoding included)."""
    seconds = 0.0
    for chunk in chunks(run, n, 64 * 1024):
        seconds += (await write_eventlog(log, chunk, frame_size))[0]
    return seconds


Fetched = list[tuple[str, int, dict[str, str] | None, bytes]]


async def raw_fetch(js: JetStreamContext, expect: int, batch: int) -> tuple[float, Fetched]:
    """Fetch every message of the trace stream with a plain pull consumer, touching nothing; time it."""
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                            inactive_threshold=60.0, mem_storage=True, num_replicas=1, max_waiting=1)
    sub = await js.pull_subscribe("", stream=TRACE.name, config=config)
    got: list[Msg] = []
    gc.collect()
    t0 = time.perf_counter()
    while len(got) < expect:
        got.extend(await sub.fetch(batch, timeout=5.0))
    seconds = time.perf_counter() - t0
    info = await sub.consumer_info()
    await sub.unsubscribe()
    await js.delete_consumer(TRACE.name, info.name)
    # Sequences from the metadata, outside the timed part: what the decode step is handed.
    return seconds, [(m.subject, m.metadata.sequence.stream, m.headers, m.data) for m in got]


def decode_all(fetched: Fetched) -> tuple[float, int]:
    """Time ``decode_message`` over pre-fetched messages, dropping the records as a streaming read does."""
    decoded = 0
    gc.collect()
    t0 = time.perf_counter()
    for subject, seq, headers, body in fetched:
        decoded += len(decode_message(subject, seq, headers, body))
    return time.perf_counter() - t0, decoded


def fold_all(log: EventLog, projection: Projection[S], fetched: Fetched) -> tuple[float, str]:
    """Time ``ProjectionRunner.apply`` over pre-decoded records; return the seconds and the state digest."""
    records = [r for m in fetched for r in decode_message(*m)]
    # Frozen, the pre-decoded records are not rescanned by every GC pass the fold triggers:
    # a streaming rebuild holds only one fetch batch of them at a time.
    gc.collect()
    gc.freeze()
    runner = ProjectionRunner(log, projection)
    apply = runner.apply
    try:
        t0 = time.perf_counter()
        for r in records:
            apply(r)
        seconds = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    return seconds, runner.digest


def framed_messages(batch: list[Entry], frame_size: int) -> int:
    """The messages ``append_batch(batch, frame_size=...)`` stores: runs of one subject, cut every ``frame_size``
    events, an attempt's summary events each on a subject of their own (``Event.CHANNEL``, where the library
    under test has it)."""
    count, run, last = 0, 0, None
    for entry in batch:
        where = (entry.subject, getattr(type(entry.event), "CHANNEL", ""))
        if where != last or run == frame_size:
            count, run, last = count + 1, 0, where
        run += 1
    return count


async def bench_rebuild(js: JetStreamContext, log: EventLog, n: int, frame_size: int,
                        projection: Callable[[], Projection[S]], batch: int,
                        rebuilds: int = 1) -> dict[str, float]:
    """Fill a purged stream with ``n`` events and measure every stage of reading them back."""
    await purge(js)
    run = f"r{next(_runs)}-{frame_size}"  # fresh keys: a purge does not reset the duplicate window
    out: dict[str, float] = {"events": n, "write": rate(n, await fill(log, run, n, frame_size))}
    msgs = await stored(js)
    out["messages"] = msgs

    fetch_s, fetched = await raw_fetch(js, msgs, batch)
    out["fetch_msgs"] = rate(msgs, fetch_s)
    out["fetch_events"] = rate(n, fetch_s)

    seconds, decoded = decode_all(fetched)
    out["decode"] = rate(n, seconds)
    if decoded != n:
        raise SystemExit(f"decoded {decoded} records, expected {n}")
    seconds, folded_digest = fold_all(log, projection(), fetched)
    out["fold"] = rate(n, seconds)
    del fetched

    async def read_all() -> None:
        count = 0
        async for _ in log.read(TRACE.name, batch=batch):
            count += 1
        if count != n:
            raise SystemExit(f"EventLog.read yielded {count} records, expected {n}")

    out["read"] = rate(n, (await atimed(read_all()))[0])

    # The runner as shipped (a checkpoint every 50,000 events), then with the final checkpoint only.
    for key, every, times in (("rebuild", None, rebuilds), ("rebuild_nocp", n + 1, 1)):
        walls, cpus = [], []
        for _ in range(times):
            runner = ProjectionRunner(log, projection(), batch=batch) if every is None else \
                ProjectionRunner(log, projection(), batch=batch, checkpoint_every=every)
            wall, cpu = await atimed(runner.rebuild())
            walls.append(rate(n, wall))
            cpus.append(rate(n, cpu))
            if runner.digest != folded_digest:
                raise SystemExit("the rebuilt state differs from the one folded in-process")
            if every is None:
                out["checkpoints"] = n // runner.checkpoint_every + 1
            del runner
        out[key], out[key + "_best"] = statistics.median(walls), max(walls)
        out[key + "_cpu"] = statistics.median(cpus)
    await purge(js)
    return out


# --- report ------------------------------------------------------------------------------


def machine() -> list[tuple[str, str]]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    server = subprocess.run([str(nats_server_binary()), "--version"], capture_output=True, text=True,
                            check=False).stdout.strip()
    return [
        ("cores", f"{os.cpu_count()} ({cpu})"),
        ("python", f"{platform.python_implementation()} {platform.python_version()} on {platform.platform()}"),
        ("nats-server", server),
        ("nats-py / msgspec", f"{version('nats-py')} / {version('msgspec')}"),
    ]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fmt(x: float) -> str:
    return f"{x:,.0f}"


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths,
                                                                                            strict=True)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


def body_stats(n: int = 6400) -> tuple[float, float]:
    """Mean body bytes of one event alone, and per event inside a frame of FRAME_SIZE."""
    sample = entries("r1", n)
    single = statistics.fmean(len(encode_body(e.event)) for e in sample)
    from schemas.envelope import encode_frame
    framed = sum(len(encode_frame([e.event for e in sample[i:i + FRAME_SIZE]]))
                 for i in range(0, n, FRAME_SIZE)) / n
    return single, framed


async def main(quick: bool) -> None:
    sizes = QUICK if quick else DEFAULT
    started = time.perf_counter()
    print(f"hx log throughput ({'quick' if quick else 'default'} sizes), {time.strftime('%Y-%m-%d %H:%M')}")
    for k, v in machine():
        print(f"  {k:18} {v}")
    print(f"  {'load average':18} {load()} (other processes share these cores: figures are noisier when > 0.5)")
    single, framed = body_stats()
    print(f"  payload            {EVENTS_PER_ATTEMPT}-event attempts (AttemptStarted, HookRecord x"
          f"{EVENTS_PER_ATTEMPT - 2}, AttemptFinished); mean body {single:.1f} B/event alone, "
          f"{framed:.1f} B/event in a frame of {FRAME_SIZE}")

    tmp = Path(tempfile.mkdtemp(prefix="hx-bench-"))
    server = NatsProcess(tmp / "nats" / "store")
    server.start(detach=False)
    nc: NATS = await nats.connect(server.url, connect_timeout=5)
    try:
        js = nc.jetstream(publish_async_max_pending=4096)
        await apply_topology(js)
        log = EventLog(nc, js)

        print(f"\n[1-3] writes: {sizes.write_events:,} events per trial, {sizes.trials} trials, "
              "median (best)")
        w = await bench_writes(js, log, sizes, tmp)
        raw = w["raw"].median
        raw_cpu = w["raw"].cpu_median
        rows: list[tuple[str, ...]] = [
            (r.label, fmt(r.median), fmt(r.best), f"{r.median / raw:.2f}", fmt(r.cpu_median),
             f"{r.cpu_median / raw_cpu:.2f}") for r in w.values()]
        print(table(rows, ("writer", "events/s", "best", "vs raw", "per CPU-s", "vs raw")))
        print(f"  EventLog/raw, 1 event/msg: {w['log1'].median / raw:.2f} wall (medians), "
              f"{w['log1'].cpu_median / raw_cpu:.2f} per client CPU-second  (target >= 0.80)")
        print("  (per CPU-s: events per second of this process's CPU time; raw excludes encoding, "
              "EventLog includes it)")

        results = {}
        layouts = (("framed", sizes.rebuild_framed, FRAME_SIZE), ("step", sizes.rebuild_single, STEP_FRAME),
                   ("single", sizes.rebuild_single, 1))
        for label, n, fs in layouts:
            print(f"\n[4] rebuild, {label}: writing {n:,} events (frame_size={fs}) ...", flush=True)
            results[label] = await bench_rebuild(js, log, n, fs, TypeCount, batch=1000, rebuilds=sizes.rebuilds)
        print()
        f = results["framed"]
        rs = [results[label] for label, _, _ in layouts]

        def row(label: str, key: str) -> tuple[str, ...]:
            return (label, *(fmt(r[key]) for r in rs))

        rows = [
            row("events in the log", "events"),
            row("messages in the log", "messages"),
            row("append_batch (events/s)", "write"),
            row("raw fetch (messages/s)", "fetch_msgs"),
            row("raw fetch (events/s)", "fetch_events"),
            row("decode_message, in-process (events/s)", "decode"),
            row("TypeCount fold via runner.apply (events/s)", "fold"),
            row("EventLog.read, no fold (events/s)", "read"),
            row(f"ProjectionRunner.rebuild() (events/s, median of {sizes.rebuilds})", "rebuild"),
            row("  best", "rebuild_best"),
            row("  per client CPU-second", "rebuild_cpu"),
            row("  checkpoints written", "checkpoints"),
            row("rebuild, final checkpoint only (events/s)", "rebuild_nocp"),
        ]
        print(table(rows, ("stage", f"framed ({FRAME_SIZE}/msg)", f"step-sized (<= {STEP_FRAME}/msg)",
                           "1 event/msg")))
        print(f"  rebuild, framed: {f['rebuild']:,.0f} events/s (target >= 100,000); "
              "raw fetch, decode and fold are each timed alone, in-process")
        th = await bench_rebuild(js, log, sizes.rebuild_framed // 4, FRAME_SIZE, TaskHistory, batch=1000)
        print(f"  TaskHistory (folds AttemptFinished only) rebuild, framed, {th['events']:,.0f} events: "
              f"{th['rebuild']:,.0f} events/s")
    finally:
        await nc.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average now {load()}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (under 30 s)")
    args = parser.parse_args()
    asyncio.run(main(args.quick))


if __name__ == "__main__":
    cli()
