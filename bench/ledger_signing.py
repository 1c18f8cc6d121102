#!/usr/bin/env python
"""What signing the edit ledger costs per event, against what appending one costs, on a run's real ledger.

Run from the repository root::

    python bench/ledger_signing.py                        # makes a default ``hx evolve`` run first (~4-5 min)
    python bench/ledger_signing.py --data-dir D --run RUN # an existing run's ledger (no whole-run figure)

1. Per ledger event of the run (its real events: a ``ledger.opened`` carries a whole harness,
   a ``ledger.round_digested`` every task's digest), best of ``--repeat`` timings of
   ``--number`` calls each: ``ledger_digest`` as it was before ledgers were signed (sha256
   over the type and the encoded body) and as it is now (the body decoded and encoded again
   without its signature), Ed25519 ``sign`` of the digest, and ``verify`` of the signature
   (the key parsed from ``ledger.opened``'s text, as the audit does).
2. The same events appended one at a time through the ``Ledger`` aggregate (``hx.aegis.ledger``:
   chained, signed, saved through ``eventsourcing`` to ``HX_LEDGER`` with its optimistic
   concurrency, the stream's head recorded) on a real embedded nats-server in a temporary data
   dir, measured in the same run; ``--passes`` fresh ledgers signed with a key and as many
   unsigned, appends alternating between the two. The figure is the ratio of a signature's
   cost (new digest + sign) to one append.
3. With the default run made here (not given with ``--data-dir``): the whole run's ledger
   digests, signatures and verifications as counted inside its own process
   (``evolve_runs.py --count``), against the run's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
import timeit
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

# A sibling script's module, found because running a script puts its directory on sys.path.
from evolve_runs import COUNTED, Counted, MadeRun, header, load, make_run

from hx.aegis.ledger import Ledger
from hx.replay.ledger_view import read_ledger
from schemas.envelope import encode_body
from schemas.ledger import LedgerEvent, LedgerOpened, ledger_digest
from streams.config import NatsSettings
from streams.connection import connect
from streams.signing import LedgerKey, verify


def old_digest(event: LedgerEvent) -> str:
    """``ledger_digest`` before ledgers were signed (b02f12c): sha256 over the type and the encoded body."""
    return "sha256:" + hashlib.sha256(type(event).TYPE.encode() + b"\0" + encode_body(event)).hexdigest()


@dataclass
class EventCost:
    """What one ledger event costs to digest, sign and verify (seconds per call)."""

    type: str
    size: int
    old: float
    new: float
    sign: float
    verify: float


def best(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Seconds per call: the best of ``repeat`` timings of ``number`` calls (the least disturbed by other load)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def costs(events: Sequence[LedgerEvent], key: LedgerKey, number: int, repeat: int) -> list[EventCost]:
    """Every event's digest (old, new), sign and verify cost."""
    public = key.public_key
    out = []
    for ev in events:
        digest = ledger_digest(ev)
        signature = key.sign(digest)
        if verify(public, digest, signature):
            raise SystemExit(f"a signature does not verify on {type(ev).TYPE}")
        out.append(EventCost(
            type(ev).TYPE, len(encode_body(ev)),
            best(lambda ev=ev: old_digest(ev), number, repeat),  # type: ignore[misc]
            best(lambda ev=ev: ledger_digest(ev), number, repeat),  # type: ignore[misc]
            best(lambda d=digest: key.sign(d), number, repeat),  # type: ignore[misc]
            best(lambda d=digest, s=signature: verify(public, d, s), number, repeat)))  # type: ignore[misc]
    return out


def fresh(event: LedgerEvent, run_id: str) -> LedgerEvent:
    """``event`` of another run, unchained and unsigned (``Ledger`` chains and signs it again)."""
    changes: dict[str, object] = {"run_id": run_id, "prev": "", "signature": ""}
    if isinstance(event, LedgerOpened):
        changes["public_key"] = ""
    return msgspec.structs.replace(event, **changes)


async def appends(events: Sequence[LedgerEvent], passes: int, tmp: Path) -> dict[str, list[tuple[str, float]]]:
    """Per mode (signed, unsigned): (type, seconds) of every append through the ``Ledger`` aggregate."""
    key = LedgerKey.generate()
    out: dict[str, list[tuple[str, float]]] = {"signed": [], "unsigned": []}
    opened, rest = events[0], events[1:]
    assert isinstance(opened, LedgerOpened)
    async with connect(NatsSettings(data_dir=tmp / "append-data")) as conn:
        for n in range(passes + 1):  # pass 0 warms the connection, the threads and the library
            order = ("signed", "unsigned") if n % 2 == 0 else ("unsigned", "signed")
            ledgers = {mode: Ledger(conn, f"sign-bench-{n}-{mode}", key if mode == "signed" else None)
                       for mode in order}
            try:
                for mode in order:
                    began = time.perf_counter()
                    await ledgers[mode].start(fresh(opened, ledgers[mode].run_id))  # type: ignore[arg-type]
                    if n:
                        out[mode].append((opened.TYPE, time.perf_counter() - began))
                for ev in rest:
                    for mode in order:
                        ledger = ledgers[mode]
                        began = time.perf_counter()
                        await ledger.append(fresh(ev, ledger.run_id))
                        if n:
                            out[mode].append((type(ev).TYPE, time.perf_counter() - began))
            finally:
                for ledger in ledgers.values():
                    await ledger.close()
            if n:
                print(f"  pass {n}/{passes}: {len(events)} appends per ledger, load {load()}", flush=True)
    return out


def us(x: float) -> str:
    return f"{x * 1e6:,.1f}"


def report_costs(per_event: list[EventCost]) -> None:
    by_type: dict[str, list[EventCost]] = defaultdict(list)
    for c in per_event:
        by_type[c.type].append(c)
    print(f"\n  {'event type':28} {'n':>3} {'body bytes':>15} {'old digest':>11} {'new digest':>11} {'sign':>8} "
          f"{'verify':>8}   (us per call, median over the type's events)")
    rows = sorted(by_type.items(), key=lambda kv: -max(c.size for c in kv[1]))
    for name, cs in [*rows, ("all events", per_event)]:
        sizes = [c.size for c in cs]
        shown = f"{min(sizes):,}-{max(sizes):,}" if min(sizes) != max(sizes) else f"{sizes[0]:,}"

        def med(attr: str, cs: list[EventCost] = cs) -> str:
            return us(statistics.median(getattr(c, attr) for c in cs))
        print(f"  {name:28} {len(cs):>3} {shown:>15} {med('old'):>11} {med('new'):>11} {med('sign'):>8} "
              f"{med('verify'):>8}")
    tot = {a: sum(getattr(c, a) for c in per_event) for a in ("old", "new", "sign", "verify")}
    print(f"  whole ledger ({len(per_event)} events, {sum(c.size for c in per_event):,} bytes): old digest "
          f"{tot['old'] * 1e3:.2f} ms, new digest {tot['new'] * 1e3:.2f} ms, sign {tot['sign'] * 1e3:.2f} ms, "
          f"verify {tot['verify'] * 1e3:.2f} ms")


async def main(args: argparse.Namespace) -> int:
    header("hx ledger signing cost")
    tmp = Path(tempfile.mkdtemp(prefix="hx-sign-bench-"))
    made: MadeRun | None = None
    try:
        if args.data_dir is None:
            print("  making the run: hx evolve (defaults), its ledger crypto counted in its process ...", flush=True)
            made = make_run("default", tmp / "data", "bench-signing")
            data_dir, run_id = made.data_dir, made.run_id
            print(f"  hx evolve took {made.wall_s:.1f} s (load average now {load()})")
        else:
            data_dir, run_id = Path(args.data_dir), args.run
        async with connect(NatsSettings(data_dir=data_dir)) as conn:
            ledger = await read_ledger(conn.log, run_id)
        events = [e.event for e in ledger.entries]
        print(f"\n[1] digest, sign, verify: {len(events)} ledger events of run {run_id}, best of {args.repeat} x "
              f"{args.number} calls each", flush=True)
        per_event = costs(events, LedgerKey.generate(), args.number, args.repeat)
        report_costs(per_event)

        print(f"\n[2] appends through the Ledger aggregate on a real nats-server: {args.passes} passes of "
              f"{len(events)} events, signed and unsigned alternating", flush=True)
        times = await appends(events, args.passes, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    sig = statistics.median(c.new + c.sign for c in per_event)
    added = statistics.median(c.new - c.old + c.sign for c in per_event)
    med = {m: statistics.median(t for _, t in v) for m, v in times.items()}
    low = {m: min(t for _, t in v) for m, v in times.items()}
    print(f"\n  append median: signed {med['signed'] * 1e3:.2f} ms (best {low['signed'] * 1e3:.2f}), "
          f"unsigned {med['unsigned'] * 1e3:.2f} ms (best {low['unsigned'] * 1e3:.2f}); "
          f"{len(times['signed'])} appends each")
    biggest = max(per_event, key=lambda c: c.size)
    opened = [t for name, t in times["signed"] if name == biggest.type]
    print(f"  signature per event (new digest + sign), median over the events: {us(sig)} us = "
          f"{sig / med['signed']:.4f} of an append")
    print(f"  added by signing (new digest - old digest + sign), median: {us(added)} us = "
          f"{added / med['signed']:.4f} of an append")
    if opened:
        print(f"  largest event ({biggest.type}, {biggest.size:,} bytes): new digest + sign "
              f"{us(biggest.new + biggest.sign)} us against its append {statistics.median(opened) * 1e3:.2f} ms")
    print(f"  signed / unsigned append (medians, same run): {med['signed'] / med['unsigned']:.3f}")

    if made is not None:
        calls = {k: made.counted.get(k, Counted()) for k in COUNTED}
        crypto = sum(c.seconds for c in calls.values())
        old_mean = statistics.fmean(c.old for c in per_event)
        new_mean = statistics.fmean(c.new for c in per_event)
        before = calls["ledger_digest"].calls * old_mean
        print(f"\n[3] the whole default hx evolve (run {made.run_id}, {len(events)} ledger events): wall "
              f"{made.wall_s:.1f} s ({made.main_s:.1f} s inside the command); wall time of each call in the run's "
              "process (waits for the GIL and the CPU included)")
        for name, c in calls.items():
            rest = (c.seconds - c.first) / (c.calls - 1) if c.calls > 1 else 0.0
            print(f"  {name:14} {c.calls:6,} calls  {c.seconds * 1e3:8.2f} ms  (first call {c.first * 1e3:.2f} ms, "
                  f"the others {rest * 1e6:,.1f} us on average, slowest {c.slowest * 1e3:.2f} ms)")
        print(f"  ledger crypto in the run: {crypto * 1e3:.1f} ms = {crypto / made.wall_s:.5f} of its wall time "
              f"({crypto / made.main_s:.5f} of the command's own time)")
        print(f"  the same digests the old way would have cost about {before * 1e3:.1f} ms (calls x the mean old "
              f"digest, {us(old_mean)} us against {us(new_mean)} us now): signing added about "
              f"{(crypto - before) * 1e3:.1f} ms = {(crypto - before) / made.wall_s:.5f} of the wall time")
    print(f"\n  load average at the end {load()}")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    p.add_argument("--data-dir", help="an existing data dir (with --run); default: make a default hx evolve run")
    p.add_argument("--run", help="the run whose ledger to use")
    p.add_argument("--number", type=int, default=200, help="calls per timing")
    p.add_argument("--repeat", type=int, default=5, help="timings per event (best kept)")
    p.add_argument("--passes", type=int, default=5, help="signed and unsigned ledgers appended")
    args = p.parse_args(argv)
    if (args.data_dir is None) != (args.run is None):
        p.error("--data-dir and --run go together")
    return args


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(parse())))
