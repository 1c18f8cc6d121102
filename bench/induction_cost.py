#!/usr/bin/env python
"""What the rule induction adds to an evolution run's wall time, measured on a real run.

Run from the repository root::

    python bench/induction_cost.py                       # a 30-task, 6-round run (coin, mapreader)
    python bench/induction_cost.py --games sorting,twc   # other TextWorldExpress games
    python bench/induction_cost.py --data-dir D --run R  # an existing run, not a new one

It runs ``hx evolve --evolver offline+induced --heldout-split train`` with the main job's other
settings in a fresh data directory (timed, the process start to exit), then, for every round the
run digested, times what the induced evolver does on it: read the round's adaptation steps off
the log and induce the rules (``hx.aegis.induction``; deterministic, so re-doing it costs what it
cost in the run). It prints each round's induction time, their sum, the run's wall time and the
share: the issue's bar is under 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hx.aegis.evidence import Evidence
from hx.aegis.induction import induce, read_traces
from hx.aegis.session import recorded_job
from projections.ledger_reader import read_run_ledger
from streams.config import NatsSettings
from streams.connection import connect


def make_run(data_dir: Path, games: list[str], tasks: int, rounds: int) -> tuple[str, float]:
    """A fresh ``hx evolve --evolver offline+induced`` run: its id and wall seconds."""
    run_id = "induction-cost"
    benches = [a for g in games for a in ("--bench", f"twx:{g}")]
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hx", "--data-dir", str(data_dir), "evolve", *benches,
                          "--tasks", str(tasks), "--rounds", str(rounds), "--heldout-split", "train",
                          "--evolver", "offline+induced", "--run-id", run_id, "--concurrency", "2"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"hx evolve failed: {out.stderr.strip().splitlines()[-1:]}")
    return run_id, time.perf_counter() - began


async def induction_seconds(data_dir: Path, run_id: str) -> list[tuple[int, int, int, float]]:
    """Per digested round: (round, attempts read, rules induced, seconds to read and induce)."""
    out = []
    async with connect(NatsSettings(data_dir=data_dir)) as conn:
        ledger = await read_run_ledger(conn.log, run_id)
        if ledger is None or ledger.opened is None:
            raise SystemExit(f"run {run_id} left no ledger in {data_dir}")
        settings = recorded_job(ledger.opened.settings).loop.induction
        for n, rnd in sorted(ledger.rounds.items()):
            digested = rnd.digested
            if digested is None:
                continue
            evidence = Evidence(conn.log, run_id)
            began = time.perf_counter()
            traces = await read_traces(evidence, list(digested.trace_rounds))
            rules = induce(traces, settings)
            out.append((n, len(traces), len(rules), time.perf_counter() - began))
    return out


def main() -> None:
    """Make (or take) a run, time its induction per round, print the share of the run's wall time."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--games", default="coin,mapreader")
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--data-dir", type=Path, default=None, help="an existing data directory (with --run)")
    parser.add_argument("--run", default=None, help="an existing run in --data-dir")
    parser.add_argument("--wall", type=float, default=None, help="the existing run's wall seconds")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="hx-induction-cost-") as tmp:
        if args.run:
            if args.data_dir is None or args.wall is None:
                parser.error("--run needs --data-dir and --wall")
            data_dir, run_id, wall = args.data_dir, args.run, args.wall
        else:
            data_dir = Path(tmp)
            run_id, wall = make_run(data_dir, [g for g in args.games.split(",") if g], args.tasks, args.rounds)
        rounds = asyncio.run(induction_seconds(data_dir, run_id))
    for rnd, attempts, rules, seconds in rounds:
        print(f"round {rnd}: {attempts} attempts read, {rules} rule(s) induced, {seconds:.2f} s")
    total = sum(r[3] for r in rounds)
    print(f"induction {total:.1f} s of the run's {wall:.0f} s: {100 * total / wall:.1f} % (bar: under 10 %)")


if __name__ == "__main__":
    main()
