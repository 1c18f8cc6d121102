#!/usr/bin/env python
"""What time on every event costs: bytes on the log and decode speed, stamped frames against unstamped ones.

Run from the repository root::

    python bench/event_stamps.py            # a real run of 40 attempts, about 30 s
    python bench/event_stamps.py --tasks 4  # smaller

It starts its own nats-server in a temporary directory, plays a real ``hx run`` (TextWorldExpress,
the random agent), reads the run's trace back, and rebuilds every message twice from the same
records: once as hx writes it now (each event with its ``Stamp``: wall and monotonic clocks and a
call's duration) and once unstamped (as hx wrote frames before). It prints, for both, the bytes
per event (as encoded, and deflated as the log stores large frames) and the decode rate of
``decode_message`` over all the messages (median of several passes, alternating), and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from schemas.envelope import (
    UNSTAMPED,
    Record,
    Stamp,
    decode_message,
    deflate,
    encode_frame_bodies,
    encoded,
    frame_headers,
)
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import TRACE, trace_filter

RUN = "stamps"
PASSES = 7


async def _records(url: str) -> list[Record]:
    async with connect(NatsSettings(url=url)) as conn:
        return [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter(RUN)])]


def _messages(records: list[Record], stamped: bool) -> list[tuple[str, int, dict[str, str], bytes]]:
    """The run's messages rebuilt from its records, with or without each event's stamp."""
    by_seq: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        by_seq[r.seq].append(r)
    out = []
    for seq, group in sorted(by_seq.items()):
        items = [encoded(r.event, Stamp(r.time_ns, r.mono_ns, r.took_ns) if stamped else UNSTAMPED) for r in group]
        # the frame's monotonic send time: its last event's plus the wall time between them
        sent = Stamp(group[0].frame_ns, group[-1].mono_ns + group[0].frame_ns - group[-1].time_ns)
        headers = frame_headers(f"m{seq}", sent, len(items))
        out.append((group[0].subject, seq, headers, encode_frame_bodies(items, sent)))
    return out


def _decode_rate(messages: list[tuple[str, int, dict[str, str], bytes]], events: int) -> float:
    began = time.perf_counter()
    for subject, seq, headers, body in messages:
        decode_message(subject, seq, headers, body)
    return events / (time.perf_counter() - began)


def main() -> None:
    """Play the run, rebuild its messages both ways, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--attempts", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc = NatsProcess(Path(tmp) / "nats")
        proc.start(detach=False)
        try:
            subprocess.run([sys.executable, "-m", "hx", "--nats-url", proc.url, "--data-dir", tmp, "run",
                            "--tasks", str(args.tasks), "--attempts", str(args.attempts), "--run-id", RUN],
                           check=True, capture_output=True)
            records = asyncio.run(_records(proc.url))
        finally:
            proc.stop()
    n = len(records)
    stamped, bare = _messages(records, True), _messages(records, False)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(PASSES):  # alternate, so drift hits both
        rates[True].append(_decode_rate(stamped, n))
        rates[False].append(_decode_rate(bare, n))
    print(f"run: {args.tasks} tasks x {args.attempts} attempts, {n:,} events in {len(stamped):,} messages")
    print(f"{'':<12}{'bytes/event':>12}{'deflated':>10}{'decode ev/s':>14}")
    figures = {}
    for name, msgs, key in (("stamped", stamped, True), ("unstamped", bare, False)):
        raw = sum(len(b) for *_, b in msgs) / n
        packed = sum(len(deflate(b)) for *_, b in msgs) / n
        rate = statistics.median(rates[key])
        figures[name] = (raw, packed, rate)
        print(f"{name:<12}{raw:>12.1f}{packed:>10.1f}{rate:>14,.0f}")
    (sr, sp, sd), (ur, up, ud) = figures["stamped"], figures["unstamped"]
    print(f"ratio       {sr / ur:>12.3f}{sp / up:>10.3f}{sd / ud:>14.3f}   (stamped / unstamped)")


if __name__ == "__main__":
    main()
