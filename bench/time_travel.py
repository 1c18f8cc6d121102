#!/usr/bin/env python
"""What time travel costs: a projection folded as of a mid-log position against a full rebuild, same log, same run.

Run from the repository root::

    python bench/time_travel.py                     # random: on twx:coin, 4 rounds of 30 tasks x 2 attempts
    python bench/time_travel.py --quick             # 3 rounds of 10 tasks
    python bench/time_travel.py --nats-url nats://127.0.0.1:4222 --run RUN   # an existing log and run

It starts its own nats-server in a temporary directory (unless ``--nats-url``), writes a run
of a few rounds (the random agent, through the same rollout code as ``hx run``), then for
each projection (``task_history``, ``trace_store``, ``edit_ledger`` when the run has a
ledger) times, through ``ProjectionRunner`` (``catch_up`` and ``fold_as_of``):

1. a full rebuild: the fold of the whole stream from sequence 1 (no checkpoint written);
2. ``--as-of`` the middle round, cold: no snapshot yet, so it folds from the start to the
   round's position, storing one snapshot at the last multiple of ``--every`` before it;
3. ``--as-of`` the same round, warm: it starts from the nearest snapshot at or before it;
4. ``--as-of`` the last round, warm: from the nearest snapshot, not from the start.

Target (issue 11): the as-of fold costs no more than the full rebuild (ratio <= 1).
Each figure is the median of ``--trials`` runs (cold runs clear the snapshots first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import hx.environments  # noqa: F401 - benchmark adapters register themselves on import
from hx.environments.registry import benchmark
from hx.environments.rollout import Rollout, RolloutSettings
from hx.harnesses import starter_harness
from hx.replay.timetravel import AsOf, run_marks
from hx.runtime.models import ModelConfig
from projections.base import Projection
from projections.ledger_reader import EditLedger
from projections.runner import ProjectionRunner
from projections.snapshots import SNAPSHOT_EVERY, Snapshots
from projections.task_history import TaskHistory
from projections.trace_store import TraceStore
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.server import NatsProcess


async def write_run(log: EventLog, run: str, bench: str, rounds: int, tasks: int, max_steps: int) -> None:
    """A plain run of ``rounds`` trace rounds of the random agent on ``bench``."""
    name, _, game = bench.partition(":")
    adapter = benchmark(name)
    try:
        ids = adapter.task_ids(game or adapter.default_games()[0], "dev", limit=tasks)
        rollout = Rollout(adapter, ModelConfig(main="random:"), starter_harness(adapter.family), log=log,
                          settings=RolloutSettings(attempts=2, concurrency=4, max_steps=max_steps))
        await rollout.start(run, kind="bench")
        for r in range(rounds):
            began = time.perf_counter()
            await rollout.run_round(run, r, ids)
            print(f"  wrote round {r}: {time.perf_counter() - began:.1f}s", flush=True)
        await rollout.finish(run, rounds=rounds)
    finally:
        adapter.close()


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """Wall seconds of one awaited call, and its result."""
    began = time.perf_counter()
    out = await fn()
    return time.perf_counter() - began, out


async def measure(log: EventLog, proj: Projection[Any], middle: int, last: int, every: int,
                  trials: int) -> dict[str, Any]:
    """Median seconds of a full rebuild and of cold and warm as-of folds; digests checked equal to stopped rebuilds."""
    full_s, cold_s, warm_s, late_s = [], [], [], []
    folded: dict[str, int] = {}
    for _ in range(trials):
        # never checkpoint (catch_up otherwise checkpoints every 200,000 events): as-of would start from it
        runner: ProjectionRunner[Any] = ProjectionRunner(log, proj, checkpoint_every=sys.maxsize)
        s, _ = await timed(lambda r=runner: r.catch_up(checkpoint=False))  # type: ignore[misc]
        full_s.append(s)
        await Snapshots(log, proj).clear()
        travel: ProjectionRunner[Any] = ProjectionRunner(log, proj, snapshot_every=every)
        s, cold = await timed(partial(travel.fold_as_of, middle))
        cold_s.append(s)
        s, warm = await timed(partial(travel.fold_as_of, middle))
        warm_s.append(s)
        s, late = await timed(partial(travel.fold_as_of, last))
        late_s.append(s)
        folded = {"full": runner.applied, "cold": cold.folded, "warm": warm.folded, "late": late.folded}
        assert late.digest == runner.digest, "as-of the end differs from the full rebuild"
    stopped: ProjectionRunner[Any] = ProjectionRunner(log, proj)
    await stopped.catch_up(stop=middle, checkpoint=False)
    assert cold.digest == warm.digest == stopped.digest, "as-of differs from a rebuild stopped there"
    await Snapshots(log, proj).clear()
    med = statistics.median
    return {"full": med(full_s), "cold": med(cold_s), "warm": med(warm_s), "late": med(late_s), "folded": folded}


async def main(args: argparse.Namespace) -> None:
    data = Path(tempfile.mkdtemp(prefix="hx-tt-bench-"))
    server = None
    url = args.nats_url
    if url is None:
        server = NatsProcess(data / "nats")
        server.start(detach=False)
        url = server.url
    try:
        async with connect(NatsSettings(url=url)) as conn:
            log = conn.log
            run = args.run
            if run is None:
                run = f"tt-bench-{os.getpid()}"
                print(f"writing run {run}: {args.rounds} rounds of {args.tasks} {args.bench} tasks x 2 attempts")
                await write_run(log, run, args.bench, args.rounds, args.tasks, args.max_steps)
            marks = await run_marks(log, run)
            rounds = marks.rounds()
            mid_round = rounds[(len(rounds) - 1) // 2]
            print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, load "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            projections: list[Projection[Any]] = [TaskHistory(), TraceStore()]
            if marks.evolution:
                projections.append(EditLedger())
            for every in args.every:
                print(f"\nrun {run}: rounds {rounds[0]}..{rounds[-1]}, as of r{mid_round}; snapshots every {every} "
                      f"messages; median of {args.trials}")
                print(f"{'projection':<14}{'stream':<11}{'at/last':>12}{'full s':>9}{'cold s':>9}{'warm s':>9}"
                      f"{'end s':>9}{'cold/full':>11}{'warm/full':>11}  events folded full/cold/warm/end")
                for proj in projections:
                    last = await log.last_seq(proj.stream)
                    middle = marks.position(AsOf(round=mid_round), proj.stream)
                    m = await measure(log, proj, middle, last, every, args.trials)
                    f = m["folded"]
                    print(f"{proj.name:<14}{proj.stream:<11}{f'{middle}/{last}':>12}{m['full']:>9.3f}"
                          f"{m['cold']:>9.3f}{m['warm']:>9.3f}{m['late']:>9.3f}{m['cold'] / m['full']:>11.2f}"
                          f"{m['warm'] / m['full']:>11.2f}  {f['full']}/{f['cold']}/{f['warm']}/{f['late']}",
                          flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(data, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bench", default="twx:coin")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tasks", type=int, default=30)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--every", type=int, nargs="+", default=[SNAPSHOT_EVERY],
                   help="messages between snapshots (several values: one table each, same log)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="3 rounds of 10 tasks, 1 trial")
    p.add_argument("--nats-url", default=None, help="measure on this server's log (with --run)")
    p.add_argument("--run", default=None, help="an existing run to measure (rounds from its ledger or trace)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.tasks, args.trials = 3, 10, 1
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
