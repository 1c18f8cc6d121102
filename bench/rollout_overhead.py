#!/usr/bin/env python
"""What logging every event to NATS costs a rollout: the same rollouts with the log writer and with a no-op.

Run from the repository root::

    python bench/rollout_overhead.py                 # random: on twx:coin, 40 tasks x 2 attempts, 5 trial pairs
    python bench/rollout_overhead.py --quick         # 20 tasks x 2 attempts, 3 trial pairs
    python bench/rollout_overhead.py --bench twx:mapreader --harness hx/harnesses/textworld.yaml

It starts its own nats-server in a temporary directory and runs, in one process and
alternating so drift hits both, the same round (same tasks, seeds, harness, ``random:``
agent, concurrency) twice per trial pair: once with every attempt's events framed onto
the log (``LogWriter``, the default) and once with the trace writer replaced by a
``NullWriter``. Both take the same steps (the agent is seeded per task and attempt), so
the wall-time ratio is the logging overhead. Target: ratio <= 1.10.

Times cover the attempts only (``RolloutReport.elapsed_s``), not the report folded from
the log afterwards, which is timed separately. Prints steps/s and events/s per mode
(median and best of the trials), the per-pair ratios and their median.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import hx.environments  # noqa: F401 - benchmark adapters register themselves on import
from hx.environments.registry import benchmark
from hx.environments.results import RolloutReport
from hx.environments.rollout import Rollout, RolloutSettings, round_outcomes
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from hx.runtime.tracer import NullWriter
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.server import NatsProcess


@dataclass
class Mode:
    """Trials of one writer."""

    label: str
    reports: list[RolloutReport] = field(default_factory=list)
    cpu: list[tuple[float, float, float]] = field(default_factory=list)
    """Per trial: CPU seconds of this process, of nats-server, of the environments (child processes)."""

    def rates(self, what: str) -> list[float]:
        return [getattr(r, what) for r in self.reports]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of this process's child processes now running (the benchmark's JVMs)."""
    me, total = str(os.getpid()), 0.0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    if Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                        total += cpu_seconds(int(entry.name))
    return total


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def timed_fold(log: EventLog, run_id: str) -> float:
    """Seconds to fold a round's verdicts back from the log (what the report costs after the attempts)."""
    began = time.perf_counter()
    await round_outcomes(log, run_id, 0)
    return time.perf_counter() - began


async def main(args: argparse.Namespace) -> int:
    name, _, game = args.bench.partition(":")
    bench = benchmark(name)
    game = game or bench.games()[0]
    ids = bench.task_ids(game, args.split, limit=args.tasks)
    harness = HarnessConfig.load(args.harness) if args.harness else starter_harness(bench.family)
    settings = RolloutSettings(attempts=args.attempts, concurrency=args.concurrency, max_steps=args.max_steps,
                               seed=args.seed)
    models = ModelConfig(main="random:")
    print(f"hx rollout overhead, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"  cores {os.cpu_count()}, {platform.python_implementation()} {platform.python_version()}, "
          f"load average {load()}")
    print(f"  {name}:{game} {args.split}, {len(ids)} tasks x {args.attempts} attempts, random:, concurrency "
          f"{args.concurrency}, max {args.max_steps} steps, harness {args.harness or 'starter:' + bench.family} "
          f"({harness.digest[:19]})")
    tmp = Path(tempfile.mkdtemp(prefix="hx-rollout-bench-"))
    server = NatsProcess(tmp / "nats" / "store")
    server.start(detach=False)
    logged, null = Mode("log (LogWriter)"), Mode("no-op (NullWriter)")
    fold_s: list[float] = []
    try:
        async with connect(NatsSettings(url=server.url)) as conn:
            for writer in (NullWriter(), None):  # JVMs (their JIT takes more than one round), caches, imports
                warm = Rollout(bench, models, harness, log=conn.log, settings=settings, writer=writer)
                await warm.rollout(f"warmup-{'null' if writer else 'log'}", ids)
            for trial in range(args.trials):
                order = (logged, null) if trial % 2 == 0 else (null, logged)
                for mode in order:
                    writer = None if mode is logged else NullWriter()
                    ro = Rollout(bench, models, harness, log=conn.log, settings=settings, writer=writer)
                    run_id = f"bench-{trial}-{'log' if mode is logged else 'null'}"
                    await ro.start(run_id)
                    before = after = (time.process_time(), cpu_seconds(server.pid), children_cpu())
                    left = len(ids) * args.attempts

                    def tick(_: AttemptResult) -> None:
                        nonlocal after, left
                        left -= 1
                        if not left:  # CPU up to the last attempt's end, not the report after it
                            after = (time.process_time(), cpu_seconds(server.pid), children_cpu())
                    outcome = await ro.run_round(run_id, 0, ids, progress=tick)
                    await ro.finish(run_id, rounds=1)
                    r = outcome.report
                    if mode is logged:
                        fold_s.append(await timed_fold(conn.log, run_id))
                    mode.reports.append(r)
                    mode.cpu.append(tuple(b - a for a, b in zip(before, after, strict=True)))  # type: ignore[arg-type]
                    py, srv, env = mode.cpu[-1]
                    print(f"  trial {trial + 1} {mode.label:20} {r.elapsed_s:6.2f} s  {r.steps_per_s:6,.0f} steps/s "
                          f"{r.events_per_s:7,.0f} events/s  CPU s: hx {py:5.2f} nats-server {srv:4.2f} "
                          f"env {env:5.2f}  pass@1 {r.overall.pass_at_1 or 0:.3f}", flush=True)
    finally:
        bench.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    steps = {r.steps for r in logged.reports + null.reports}
    ratios = [a.elapsed_s / b.elapsed_s for a, b in zip(logged.reports, null.reports, strict=True)]
    print()
    print(f"  {'writer':20} {'steps/s (median, best)':>26} {'events/s (median, best)':>28}")
    for mode in (logged, null):
        s, e = mode.rates("steps_per_s"), mode.rates("events_per_s")
        print(f"  {mode.label:20} {statistics.median(s):14,.0f} {max(s):11,.0f} "
              f"{statistics.median(e):16,.0f} {max(e):11,.0f}")
    cpu_ratio = []
    for a, b in zip(logged.cpu, null.cpu, strict=True):
        cpu_ratio.append(sum(a) / sum(b) if sum(b) else 0.0)
    for mode in (logged, null):
        py, srv, env = (statistics.median(c[i] for c in mode.cpu) for i in range(3))
        print(f"  {mode.label:20} CPU s per round (median): hx {py:.2f}, nats-server {srv:.2f}, env {env:.2f}; "
              f"{(py + srv + env) / mode.reports[0].steps * 1e6:,.0f} CPU-us per step")
    r0 = logged.reports[0]
    print(f"  per round: {r0.steps:,} steps, {r0.events:,} events ({r0.events / max(r0.steps, 1):.1f} per step), "
          f"{r0.overall.attempts} attempts read back; report fold from the log "
          f"{statistics.median(fold_s):.2f} s (median)")
    print(f"  same steps in every trial: {len(steps) == 1}")
    print(f"  ratio log/no-op wall time per pair: {', '.join(f'{x:.3f}' for x in ratios)}")
    print(f"  ratio log/no-op CPU seconds (hx + nats-server + env) per pair: "
          f"{', '.join(f'{x:.3f}' for x in cpu_ratio)}; median {statistics.median(cpu_ratio):.3f}")
    ratio = statistics.median(ratios)
    print(f"  median ratio {ratio:.3f}  (target <= 1.10): {'ok' if ratio <= 1.10 else 'OVER TARGET'}")
    return 0 if len(steps) == 1 else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    p.add_argument("--bench", default="twx:coin", help="benchmark:game (default twx:coin)")
    p.add_argument("--split", default="dev")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--attempts", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trials", type=int, default=5, help="trial pairs (log, no-op)")
    p.add_argument("--harness", help="harness file (default: the family's starter harness)")
    p.add_argument("--quick", action="store_true", help="20 tasks, 3 trial pairs")
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.trials = 20, 3
    return args


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(parse())))
