#!/usr/bin/env python
"""What ``hx audit verify`` costs, and that it reads what the ledger cites, not the run's whole trace.

Run from the repository root::

    python bench/audit_cost.py --make default            # runs the default ``hx evolve`` first (~4-5 min)
    python bench/audit_cost.py --make 3000               # a run of about 3,000 attempts (~8 min)
    python bench/audit_cost.py --make 7500               # about 7,500 attempts, 10M trace events (~15 min)
    python bench/audit_cost.py --data-dir D --run RUN    # an existing run

``--make`` runs ``python -m hx evolve`` into a temporary data dir (kept with ``--keep``) and
prints the attempts and events it made. Then, in this process, on the run's data dir (the
embedded nats-server, as ``hx`` starts it), repeated ``--repeat`` times, median (best):

1. reading and folding the run's ledger (``read_ledger``);
2. the ledger-only checks (``verify_ledger(trace=False)``: chain, signatures, decisions, folds);
3. the full verification (``verify_run(trace=True)``, the read included), and its trace part
   broken down as ``check_trace`` does it: the round-level read (``trace_marks``), the verdicts
   of the gated candidates' rounds (``outcomes``), the seesaw recomputed (the gate's rule), the
   evidence anchors resolved (one direct get per distinct message);
4. the baseline, measured in the same run: one full read of the run's trace
   (``EventLog.read`` over ``hx.trace.<run>.*.*.*``, decoded), what a verifier that read
   everything would pay. The ratio full verification / full read is the figure.

What was read is counted on the client connection (``nc.stats``: messages and bytes received,
JetStream API replies included) and set against the run's whole trace (messages on its
subjects, events decoded, bytes received by the full read).

Last, the commands as a user pays them (each a subprocess): ``hx audit verify RUN`` and
``hx export RUN DIR --force`` (which verifies first), with no server running (the command
starts the embedded server) and joining the server this process holds; ``hx --version`` as the
cost of starting Python and importing hx; and, in-process, the export alone (``render`` and
the files written) against the verification it runs first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A sibling script's module, found because running a script puts its directory on sys.path.
from evolve_runs import JOBS, MadeRun, header, load, make_run

from hx.replay.anchors import AnchorResolver, anchors_of
from hx.replay.audit import verify_ledger, verify_run
from hx.replay.ledger_view import read_ledger
from hx.replay.trace_checks import recheck_seesaw
from hx.replay.trace_rounds import outcomes, round_level_filter, trace_marks
from hx.report.export import render
from projections.ledger import RunLedger
from projections.ledger_records import CandidateRecord
from schemas.edits import Anchor
from schemas.ledger import RoundDigested
from schemas.lifecycle import AttemptFinished
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.topology import TRACE, trace_filter


@dataclass
class Stage:
    """One timed stage: seconds per repetition, and what the client received during it."""

    label: str
    seconds: list[float] = field(default_factory=list)
    msgs: int = 0
    bytes: int = 0
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def best(self) -> float:
        return min(self.seconds) if self.seconds else float("nan")


async def timed(conn: Connection, stage: Stage, work: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``work`` once, adding its wall time to ``stage`` and what the client received during it."""
    stats = conn.nc.stats
    msgs, nbytes = stats["in_msgs"], stats["in_bytes"]
    began = time.perf_counter()
    out = await work()
    stage.seconds.append(time.perf_counter() - began)
    stage.msgs, stage.bytes = stats["in_msgs"] - msgs, stats["in_bytes"] - nbytes
    return out


@dataclass
class WholeTrace:
    """The run's whole trace as one full read saw it."""

    events: int = 0
    attempts: int = 0


async def full_read(conn: Connection, run_id: str) -> WholeTrace:
    """Every event of the run's trace, decoded (conversations left as logged): what reading everything costs."""
    out = WholeTrace()
    async for record in conn.log.read(TRACE.name, subjects=[trace_filter(run_id)]):
        out.events += 1
        if isinstance(record.event, AttemptFinished):
            out.attempts += 1
    return out


async def subject_messages(conn: Connection, subjects: str) -> tuple[int, int]:
    """(subjects, messages) stored on ``HX_TRACE`` under a subject filter."""
    info = await conn.js.stream_info(TRACE.name, subjects_filter=subjects)
    counts = info.state.subjects or {}
    return len(counts), sum(counts.values())


def cited_anchors(ledger: RunLedger) -> list[Anchor]:
    """Every evidence anchor the ledger cites: candidates' manifests (as proposed and revised) and round digests."""
    out: list[Anchor] = []
    for entry in ledger.entries:
        ev = entry.event
        out += [a for d in ev.digests for a in d.evidence] if isinstance(ev, RoundDigested) else anchors_of(ev)
    return out


def gated(ledger: RunLedger) -> list[CandidateRecord]:
    """The candidates whose verdict reached the seesaw (what ``check_trace`` recomputes)."""
    return [c for c in ledger.candidates.values() if c.gate is not None
            and any(check.name == "seesaw" for check in c.gate.checks)]


STAGES = [
    ("read", "read + fold the ledger (read_ledger)"),
    ("ledger", "ledger-only checks (verify_ledger, trace=False)"),
    ("run_no_trace", "verify_run(trace=False), read included"),
    ("full", "full verification: verify_run(trace=True)"),
    ("marks", "  trace: round-level read (trace_marks)"),
    ("outcomes", "  trace: gated rounds' verdicts (outcomes)"),
    ("seesaw", "  trace: seesaw recomputed (gate's rule)"),
    ("anchors", "  trace: evidence anchors resolved"),
    ("render", "export alone: render + write the files"),
    ("whole", "baseline: full read of the run's trace"),
]


async def in_process(conn: Connection, run_id: str, plugin_dir: Path, repeat: int, full_repeat: int,
                     scratch: Path) -> dict[str, Stage]:
    """Time every stage ``repeat`` times (the full trace read ``full_repeat`` times), interleaved."""
    st = {k: Stage(label) for k, label in STAGES}
    for rep in range(repeat):
        await repetition(conn, st, run_id, plugin_dir, scratch / f"export-{rep}", whole=rep < full_repeat)
        print(f"  repetition {rep + 1}/{repeat}: full verification {st['full'].seconds[-1]:.3f} s"
              + (f", full trace read {st['whole'].seconds[-1]:.2f} s" if rep < full_repeat else "")
              + f"  (load {load()})", flush=True)
    return st


async def repetition(conn: Connection, st: dict[str, Stage], run_id: str, plugin_dir: Path, out: Path, *,
                     whole: bool) -> None:
    """One timing of every stage (and of the full trace read with ``whole``)."""
    log = conn.log
    ledger: RunLedger = await timed(conn, st["read"], lambda: read_ledger(log, run_id))
    st["read"].note = f"{len(ledger.entries)} ledger events"
    result = await timed(conn, st["ledger"], lambda: verify_ledger(log, ledger, plugin_dir, trace=False))
    if not result.ok:
        raise SystemExit(f"the ledger of {run_id} does not verify: {result.first}")
    await timed(conn, st["run_no_trace"], lambda: verify_run(log, run_id, plugin_dir, trace=False))
    full = await timed(conn, st["full"], lambda: verify_run(log, run_id, plugin_dir, trace=True))
    if not full.ok:
        raise SystemExit(f"the run {run_id} does not verify against its trace: {full.first}")
    st["full"].note = f"{full.trace_rounds} trace rounds, {full.recomputed} seesaws recomputed, {full.anchors} anchors"

    # The trace part, stage by stage as check_trace runs it.
    marks = await timed(conn, st["marks"], lambda: trace_marks(log, run_id))
    st["marks"].note = f"{len(marks)} trace rounds on the trace"
    cands = gated(ledger)
    wanted = [marks[r] for c in cands if c.gate is not None for r in c.gate.trace_rounds if r in marks]
    verdicts = await timed(conn, st["outcomes"], lambda: outcomes(log, run_id, wanted))
    st["outcomes"].note = f"{len(verdicts)} rounds, {sum(map(len, verdicts.values()))} attempt verdicts"

    async def again() -> list[str]:
        return [recheck_seesaw(ledger, c, verdicts) for c in cands]
    whys = await timed(conn, st["seesaw"], again)
    if any(whys):
        raise SystemExit(f"a seesaw does not recompute: {next(w for w in whys if w)}")
    st["seesaw"].note = f"{len(cands)} gate verdicts"
    resolver = AnchorResolver(log, run_id)  # fresh: its cache would make a repetition free
    anchors = await timed(conn, st["anchors"], lambda: resolver.resolve_all(cited_anchors(ledger)))
    if not all(a.resolved for a in anchors):
        raise SystemExit(f"an evidence anchor does not resolve: {next(a.problem for a in anchors if not a.resolved)}")
    st["anchors"].note = f"{len(anchors)} anchors, {resolver.fetched} distinct messages fetched"

    async def export_alone() -> int:
        files = render([e.event for e in ledger.entries], {})
        for rel, data in files.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        shutil.rmtree(out)
        return len(files)
    st["render"].note = f"{await timed(conn, st['render'], export_alone)} files"
    if whole:
        read = await timed(conn, st["whole"], lambda: full_read(conn, run_id))
        st["whole"].note = f"{read.events:,} events, {read.attempts:,} attempts"


def hx_command(*args: str) -> float:
    """Wall seconds of ``python -m hx ARGS`` (a subprocess, as a user runs it); exit if it fails."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hx", *args], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"hx {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return seconds


def commands(data_dir: Path, run_id: str, out: Path, repeat: int) -> dict[str, list[float]]:
    """Each command ``repeat`` times, alternating."""
    times: dict[str, list[float]] = {"version": [], "verify": [], "export": []}
    for _ in range(repeat):
        times["version"].append(hx_command("--version"))
        times["verify"].append(hx_command("--data-dir", str(data_dir), "audit", "verify", run_id))
        times["export"].append(hx_command("--data-dir", str(data_dir), "export", run_id, str(out), "--force"))
    return times


def show_commands(label: str, times: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"  {label}: hx --version {med['version']:.2f} s; hx audit verify {med['verify']:.2f} s "
          f"(best {min(times['verify']):.2f}); hx export --force {med['export']:.2f} s "
          f"(best {min(times['export']):.2f})  [median of {len(times['verify'])}]")


def ms(x: float) -> str:
    return f"{x * 1000:,.1f}"


async def main(args: argparse.Namespace) -> int:
    header("hx audit cost")
    tmp = Path(tempfile.mkdtemp(prefix="hx-audit-bench-"))
    made: MadeRun | None = None
    try:
        if args.make:
            data_dir, run_id = tmp / "data", f"bench-audit-{args.make}"
            print(f"  making the run: hx evolve {' '.join(JOBS[args.make]) or '(defaults)'} into {data_dir} ...",
                  flush=True)
            made = make_run(args.make, data_dir, run_id)
            print(f"  hx evolve took {made.wall_s:.1f} s (load average now {load()})")
        else:
            data_dir, run_id = Path(args.data_dir), args.run
        plugin_dir = data_dir.resolve() / "plugins"
        out = tmp / "export"

        print(f"\n[commands, no server running] {args.command_repeat} times each ...", flush=True)
        cold = commands(data_dir, run_id, out, args.command_repeat)
        async with connect(NatsSettings(data_dir=data_dir)) as conn:
            print(f"\n[in-process] run {run_id}, {args.repeat} repetitions ({args.full_repeat} of the full read)",
                  flush=True)
            st = await in_process(conn, run_id, plugin_dir, args.repeat, args.full_repeat, tmp)
            trace_subjects, trace_msgs = await subject_messages(conn, trace_filter(run_id))
            level_subjects, level_msgs = await subject_messages(conn, round_level_filter(run_id))
            print(f"\n[commands, joining the server this process holds] {args.command_repeat} times each ...",
                  flush=True)
            warm = commands(data_dir, run_id, out, args.command_repeat)
    finally:
        if args.keep and made is not None:
            print(f"  kept the data dir: {made.data_dir} (run {made.run_id})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    whole = st["whole"]
    full = st["full"]
    print(f"\nrun {run_id}: {whole.note}; {trace_msgs:,} trace messages on {trace_subjects:,} subjects, "
          f"{whole.bytes / 1e6:,.1f} MB received by a full read; {level_msgs} round-level messages "
          f"on {level_subjects} subjects")
    print(f"\n  {'stage':50} {'median ms':>11} {'best ms':>10} {'msgs in':>9} {'bytes in':>12}  what")
    for s in st.values():
        print(f"  {s.label:50} {ms(s.median):>11} {ms(s.best):>10} {s.msgs:>9,} {s.bytes:>12,}  {s.note}")
    trace_part = full.median - st["run_no_trace"].median
    parts = sum(st[k].median for k in ("marks", "outcomes", "seesaw", "anchors"))
    print(f"\n  trace part of the verification (full - verify_run without trace): {ms(trace_part)} ms; "
          f"its four stages timed alone sum to {ms(parts)} ms")
    print(f"  read by the full verification: {full.msgs:,} messages, {full.bytes:,} bytes; by a full read of the "
          f"trace: {whole.msgs:,} messages, {whole.bytes:,} bytes ({full.bytes / whole.bytes:.4f} of the bytes)")
    ratio = full.median / whole.median
    print(f"  full verification / full read of the run's trace: {ratio:.3f} "
          f"({ms(full.median)} ms against {whole.median:.2f} s)")
    print(f"  export: verification {ms(full.median)} ms + export alone {ms(st['render'].median)} ms "
          f"(verification {full.median / (full.median + st['render'].median):.0%} of it, in-process)")
    show_commands("commands, no server running", cold)
    show_commands("commands, server already running", warm)
    print(f"\n  load average at the end {load()}")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--make", choices=sorted(JOBS), help="run hx evolve first (default job, or ~3,000 attempts)")
    where.add_argument("--data-dir", help="an existing data dir (with --run)")
    p.add_argument("--run", help="the run to verify in --data-dir")
    p.add_argument("--repeat", type=int, default=5, help="repetitions of the in-process stages (median)")
    p.add_argument("--full-repeat", type=int, default=3, help="repetitions of the full trace read (the baseline)")
    p.add_argument("--command-repeat", type=int, default=3, help="runs of each command (median)")
    p.add_argument("--keep", action="store_true", help="keep the data dir --make made")
    args = p.parse_args(argv)
    if args.data_dir and not args.run:
        p.error("--data-dir needs --run")
    args.full_repeat = max(1, min(args.full_repeat, args.repeat))  # the baseline is the figure's denominator
    return args


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(parse())))
