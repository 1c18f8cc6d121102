#!/usr/bin/env python
"""Reading a large log: narrow readers, ``hx trace``, and the full trace_store fold's rate and memory.

Run from the repository root::

    python bench/large_log.py                             # makes a run of about 3,000 attempts (~10 min), then times
    python bench/large_log.py --attempts 200              # a small run (a check of the script, ~1-2 min)
    python bench/large_log.py --data-dir D                # makes the log into D/now once, reuses it after
    python bench/large_log.py --data-dir D --run RUN      # an existing data dir and run (nothing made)
    python bench/large_log.py --data-dir D --base         # also the base tree (272f197), see below
    python bench/large_log.py --data-dir D --base REF

The log is an ``hx evolve`` run (``random:`` agent, two games) sized by ``--attempts``
(3,000 attempts are about 3.7M trace events). While a tree's figures are taken, that tree's
``hx server`` holds the data dir's nats-server, so every command joins a running server; each
figure comes from a fresh subprocess (start-up and memory are per measurement), and with a base
the trees alternate figure by figure (base, now, base, now), so a change of load hits both:

1. ``hx projections rebuild task_history`` (wall) minus the start-up floor, ``hx projections status
   task_history`` (wall): the fold time beyond start-up (goal <= 0.5 s);
2. ``PassCount``, a plugin projection defined here that reads only ``attempt.finished``, folded with
   ``ProjectionRunner(log, PassCount()).rebuild()``: the fold's own wall (goal <= 0.5 s);
3. ``hx trace RUN TASK`` of one attempt (wall, median of 5);
4. ``ProjectionRunner(log, TraceStore()).rebuild()`` (it reads only the attempts' summary channels), the log's
   events over its wall as events/s, and a fold reading and decoding every event (``TypeCount``): events/s
   (goal >= 300,000) and the subprocess's peak RSS (``ru_maxrss``); then the same fold stopped
   (``catch_up(stop=seq)``) where about ``--part`` events (1M; a quarter of a smaller log) have been
   read, the sequence taken from the full fold's events per message: peak(all) / peak(part)
   (goal <= 1.5).

With ``--base REF`` a detached worktree of REF is made and a second log is made by it (cached in
``D/base-REF``); the base tree and this tree are both timed on that log (the ``now/base`` ratios),
and this tree on its own log (``D/now``, the figures set against the goals). A log written by one
tree may not read the same with the other: the events each narrow fold counted are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from projections.base import Projection
from projections.runner import ProjectionRunner
from projections.trace_store import TraceStore
from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished
from streams.config import NatsSettings
from streams.connection import connect

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASE = "272f197"
PART_EVENTS = 1_000_000
GOAL_NARROW_S = 0.5
GOAL_RATE = 300_000
GOAL_MEMORY = 1.5
CODE = ("hx", "streams", "projections", "schemas")
"""The packages whose last commit a made log records."""
MARKER = "large_log.json"
"""What a made log's directory holds beside ``nats/``: its run, the options and how long making it took."""


# --- the subprocess side: what runs inside one measurement -------------------------------------------------
# Every measurement is a subprocess with the timed tree (this one or the base) first on PYTHONPATH, so these
# imports are that tree's.

class PassTally(msgspec.Struct):
    """Attempts finished and passed on the log, and the first task of the measured run (for ``hx trace``)."""

    finished: int = 0
    passed: int = 0
    task: str = ""


class PassCount(Projection[PassTally]):
    """A plugin read model that declares it reads only ``attempt.finished``: counts passes.

    Also a plugin as a user loads one: ``hx projections rebuild bench/large_log.py:PassCount``.
    """

    name: ClassVar[str] = "bench_pass_count"
    reads: ClassVar[frozenset[str]] = frozenset({"attempt.finished"})
    state_type = PassTally

    def __init__(self, run: str = "") -> None:
        self.run = run

    def initial(self) -> PassTally:
        """No attempt yet."""
        return PassTally()

    def fold(self, state: PassTally, record: Record) -> PassTally:
        """Count a finished attempt, and whether it passed."""
        ev = record.event
        if isinstance(ev, AttemptFinished):
            state.finished += 1
            state.passed += ev.passed
            if not state.task and ev.run_id == self.run:
                state.task = ev.task_id
        return state


async def fold(kind: str, data_dir: Path, run_id: str, stop: int) -> dict[str, Any]:
    """One measured fold: ``narrow`` (PassCount), ``every``/``every_part`` (TypeCount, reading every event, all
    of the log or to ``stop``), ``full``/``part`` (TraceStore, all of the log or to ``stop``)."""
    # A sibling script's module (a script's directory is on sys.path), imported here: PassCount above is also
    # loaded as a plugin by path, where the sibling is not importable.
    from log_workload import TypeCount

    async with connect(NatsSettings(data_dir=data_dir)) as conn:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        proj: Projection[Any] = (PassCount(run_id) if kind == "narrow" else
                                 TypeCount() if kind.startswith("every") else TraceStore())
        runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj)
        last = await conn.log.last_seq(proj.stream)
        began = time.perf_counter()
        if kind in ("part", "every_part"):
            runner.restart()
            await runner.catch_up(stop=stop)
        else:
            await runner.rebuild()
        seconds = time.perf_counter() - began
        out: dict[str, Any] = {"seconds": seconds, "applied": runner.applied, "last": last,
                               "position": runner.position[0], "rss_before_kb": before}
        if isinstance(runner.state, PassTally):
            out.update(finished=runner.state.finished, passed=runner.state.passed, task=runner.state.task)
    out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out


# --- the measuring side -------------------------------------------------------------------------------------

@dataclass
class Tree:
    """A source tree whose code is timed (put on PYTHONPATH)."""

    label: str
    root: Path

    def env(self) -> dict[str, str]:
        """The environment of a subprocess running this tree's code."""
        return {**os.environ, "PYTHONPATH": str(self.root)}


@dataclass
class Log:
    """A data dir holding a run, and which tree wrote it."""

    label: str
    data_dir: Path
    run_id: str


@dataclass
class Figures:
    """One tree's measurements on one log."""

    tree: str
    log: str
    floor: list[float] = field(default_factory=list)
    rebuild: list[float] = field(default_factory=list)
    narrow: list[float] = field(default_factory=list)
    trace: list[float] = field(default_factory=list)
    tally: dict[str, Any] = field(default_factory=dict)
    full: dict[str, Any] = field(default_factory=dict)
    part: dict[str, Any] = field(default_factory=dict)
    every: dict[str, Any] = field(default_factory=dict)
    every_part: dict[str, Any] = field(default_factory=dict)

    @property
    def beyond(self) -> float:
        """Seconds ``hx projections rebuild task_history`` takes beyond the start-up floor (medians)."""
        return statistics.median(self.rebuild) - statistics.median(self.floor)

    @property
    def events(self) -> int:
        """The log's trace events (what the every-event fold read)."""
        return int(self.every["applied"])

    @property
    def rate(self) -> float:
        """Log events per second of the full trace_store fold (it reads only what its state needs)."""
        return float(self.events) / float(self.full["seconds"])

    @property
    def every_rate(self) -> float:
        """Events per second of a fold that reads and decodes every event."""
        return float(self.every["applied"]) / float(self.every["seconds"])

    @property
    def memory(self) -> float:
        """Peak RSS of the full trace_store fold over the stopped fold's."""
        return float(self.full["maxrss_kb"]) / float(self.part["maxrss_kb"])

    @property
    def every_memory(self) -> float:
        """Peak RSS of the full every-event fold over the stopped one's."""
        return float(self.every["maxrss_kb"]) / float(self.every_part["maxrss_kb"])

    def headline(self) -> dict[str, float]:
        """The figures compared between trees, each with lower is better."""
        return {"fold beyond start-up, hx projections rebuild task_history (s)": self.beyond,
                "narrow fold, PassCount (s)": statistics.median(self.narrow),
                "hx trace RUN TASK, median of 5 (s)": statistics.median(self.trace),
                "full trace_store fold (s per 1M log events)": 1e6 / self.rate,
                "peak RSS, full trace_store fold (MB)": self.full["maxrss_kb"] / 1024,
                "peak RSS ratio all/part": self.memory,
                "every-event fold (s per 1M events)": 1e6 / self.every_rate}


def run_cmd(tree: Tree, argv: list[str]) -> tuple[float, str]:
    """Wall seconds and stdout of one subprocess with ``tree`` on PYTHONPATH; exit if it fails."""
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=tree.env(), cwd=tree.root, check=False)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"[{tree.label}] {' '.join(argv[1:])} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return seconds, done.stdout


def hx(tree: Tree, log: Log, *args: str) -> float:
    """Wall seconds of ``python -m hx --data-dir D ARGS`` run from ``tree``."""
    return run_cmd(tree, [sys.executable, "-m", "hx", "--data-dir", str(log.data_dir), *args])[0]


def measured_child(tree: Tree, log: Log, kind: str, stop: int = 0) -> dict[str, Any]:
    """Run ``fold`` in a fresh subprocess of this script with ``tree`` on PYTHONPATH; its JSON result."""
    _, out = run_cmd(tree, [sys.executable, str(Path(__file__).resolve()), "--child", kind,
                            "--data-dir", str(log.data_dir), "--run", log.run_id, "--stop", str(stop)])
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


class HeldServer:
    """``hx server`` of one tree on a data dir, held while that tree's figures are taken."""

    def __init__(self, tree: Tree, data_dir: Path) -> None:
        self.tree, self.data_dir = tree, data_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> HeldServer:
        record = self.data_dir / "nats" / "server.json"
        record.unlink(missing_ok=True)  # a stale record from a killed run would look ready
        self.proc = subprocess.Popen([sys.executable, "-m", "hx", "--data-dir", str(self.data_dir), "server"],
                                     env=self.tree.env(), cwd=self.tree.root, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"[{self.tree.label}] hx server exited {self.proc.returncode} on {self.data_dir}")
            if self._ready(record):
                return self
            time.sleep(0.1)  # polling a file the server writes when it is ready, not synchronising on a delay
        self.__exit__()
        raise SystemExit(f"[{self.tree.label}] hx server not ready after 120 s on {self.data_dir}")

    @staticmethod
    def _ready(record: Path) -> bool:
        try:
            data = json.loads(record.read_text())
            with socket.create_connection((str(data["host"]), int(data["port"])), timeout=1):
                return True
        except (OSError, ValueError, KeyError):
            return False

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # hx server stops its nats-server on SIGTERM
            self.proc.wait(timeout=60)


def evolve_options(attempts: int) -> list[str]:
    """``hx evolve`` options for about ``attempts`` attempts (bench/evolve_runs.py's 3000 job, scaled)."""
    scale = attempts / 3000
    return ["--tasks", str(max(1, round(40 * scale))), "--heldout-tasks", str(max(1, round(100 * scale)))]


def make_log(tree: Tree, data_dir: Path, attempts: int) -> Log:
    """The run ``tree`` made in ``data_dir`` (made now with ``hx evolve`` unless its marker says it is there)."""
    marker = data_dir / MARKER
    # The last commit of the code that writes the log (a commit of bench/ alone does not make it stale).
    commit = subprocess.run(["git", "-C", str(tree.root), "log", "-1", "--format=%h", "--", *CODE],
                            capture_output=True, text=True, check=False).stdout.strip()
    if marker.exists():
        made = json.loads(marker.read_text())
        by = made.get("commit", "?")
        print(f"  [{tree.label}] reusing {data_dir} (run {made['run']}, {made['options']}, made in "
              f"{made['seconds']:.0f} s by {by})", flush=True)
        if by != commit:
            print(f"  [{tree.label}] note: the tree's code is at {commit} now; remove {data_dir} to make its log again",
                  flush=True)
        return Log(tree.label, data_dir, made["run"])
    shutil.rmtree(data_dir, ignore_errors=True)  # a half-made log (no marker) is made again
    data_dir.mkdir(parents=True)
    run_id = f"large-log-{attempts}"
    options = evolve_options(attempts)
    argv = [sys.executable, "-m", "hx", "--data-dir", str(data_dir), "evolve", "--run-id", run_id,
            "--out", str(data_dir / f"{run_id}.json"), *options]
    print(f"  [{tree.label}] making the log: hx evolve {' '.join(options)} into {data_dir} ...", flush=True)
    began = time.perf_counter()
    with subprocess.Popen(argv, env=tree.env(), cwd=tree.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stderr is not None
        tail: list[str] = []
        for line in proc.stderr:  # hx evolve's log lines: one per stage, shown as progress
            tail = [*tail[-19:], line.rstrip()]
            print(f"    {time.perf_counter() - began:6.0f} s  {line.rstrip()[:150]}", flush=True)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"[{tree.label}] hx evolve exited {proc.returncode}:\n" + "\n".join(tail))
    marker.write_text(json.dumps({"run": run_id, "options": " ".join(options), "seconds": seconds,
                                  "commit": commit}))
    print(f"  [{tree.label}] made run {run_id} in {seconds:.0f} s", flush=True)
    return Log(tree.label, data_dir, run_id)


def commands(tree: Tree, log: Log, fig: Figures, repeat: int, part: int) -> str:
    """``hx projections rebuild task_history`` and its start-up floor, alternating."""
    for _ in range(repeat):
        fig.floor.append(hx(tree, log, "projections", "status", "task_history"))
        fig.rebuild.append(hx(tree, log, "projections", "rebuild", "task_history"))
    return (f"hx projections rebuild task_history {statistics.median(fig.rebuild):.2f} s, status "
            f"{statistics.median(fig.floor):.2f} s")


def narrow(tree: Tree, log: Log, fig: Figures, repeat: int, part: int) -> str:
    """The PassCount fold, ``repeat`` times."""
    for _ in range(repeat):
        fig.tally = measured_child(tree, log, "narrow")
        fig.narrow.append(fig.tally["seconds"])
    if not fig.tally["task"]:
        raise SystemExit(f"[{tree.label}] no attempt.finished of run {log.run_id} on {log.data_dir}")
    return (f"PassCount fold {statistics.median(fig.narrow):.3f} s: {fig.tally['finished']:,} attempt.finished "
            f"read, {fig.tally['passed']:,} passed")


def trace(tree: Tree, log: Log, fig: Figures, repeat: int, part: int) -> str:
    """``hx trace RUN TASK`` five times (the task PassCount found)."""
    fig.trace = [hx(tree, log, "trace", log.run_id, fig.tally["task"]) for _ in range(5)]
    return f"hx trace {log.run_id} {fig.tally['task']}: {statistics.median(fig.trace):.2f} s"


def full(tree: Tree, log: Log, fig: Figures, repeat: int, part: int) -> str:
    """A fold of every event and the full trace_store fold, each also stopped where about ``part`` events lie."""
    fig.every = measured_child(tree, log, "every")
    # The sequence where about ``part`` events have been read, from the every-event fold's events per message.
    target = min(part, fig.every["applied"] // 4)
    stop = max(1, math.ceil(fig.every["last"] * target / max(1, fig.every["applied"])))
    fig.every_part = measured_child(tree, log, "every_part", stop)
    fig.full = measured_child(tree, log, "full")
    fig.part = measured_child(tree, log, "part", stop)
    return (f"every-event fold: {fig.every['applied']:,} events in {fig.every['seconds']:.1f} s; full trace_store "
            f"fold {fig.full['seconds']:.1f} s ({fig.full['applied']:,} events applied); to seq {stop:,}: "
            f"{fig.every_part['applied']:,} events")


STEPS = (commands, narrow, trace, full)
"""The measurements, in order (``trace`` needs the task ``narrow`` found)."""


def warm(log: Log) -> None:
    """Read the log's store files once (untimed), so no tree's first figure pays the disk for the page cache."""
    for path in sorted((log.data_dir / "nats" / "store").rglob("*")):
        if path.is_file():
            with path.open("rb") as fh:
                while fh.read(1 << 20):
                    pass


def measure(pairs: list[tuple[Tree, Log]], repeat: int, part: int) -> list[Figures]:
    """Every figure of each (tree, log), step by step, the trees alternating within a step so drift hits all.

    Each step of a tree runs while that tree's own ``hx server`` holds the log's data dir.
    """
    figs = [Figures(tree.label, log.label) for tree, log in pairs]
    for log in {log.data_dir: log for _, log in pairs}.values():
        warm(log)
    for step in STEPS:
        for (tree, log), fig in zip(pairs, figs, strict=True):
            began = time.perf_counter()
            with HeldServer(tree, log.data_dir):
                said = step(tree, log, fig, repeat, part)
            print(f"  [{tree.label} on {log.label}'s log] {said} ({time.perf_counter() - began:.0f} s)", flush=True)
    return figs


def verdict(ok: bool) -> str:
    """How a figure stands against its goal."""
    return "ok" if ok else "MISSES THE GOAL"


def show(fig: Figures) -> None:
    """One tree's figures on one log, the goals beside them."""
    full, part = fig.full, fig.part
    where = "the given log" if fig.log == "given" else f"the log {fig.log} made"
    print(f"\n{fig.tree} tree on {where}: {fig.events:,} trace events in {full['last']:,} "
          f"messages; {fig.tally['finished']:,} attempt.finished events read by PassCount")
    beyond, narrow = fig.beyond, statistics.median(fig.narrow)
    print(f"  hx projections rebuild task_history  {statistics.median(fig.rebuild):7.2f} s  - start-up floor "
          f"(hx projections status task_history) {statistics.median(fig.floor):.2f} s = fold beyond start-up "
          f"{beyond:.2f} s  (goal <= {GOAL_NARROW_S}): {verdict(beyond <= GOAL_NARROW_S)}  [medians of "
          f"{len(fig.rebuild)}; best rebuild - best status {min(fig.rebuild) - min(fig.floor):.2f} s]")
    print(f"  PassCount (reads attempt.finished) fold, ProjectionRunner.rebuild()  {narrow:.3f} s  "
          f"(goal <= {GOAL_NARROW_S}): {verdict(narrow <= GOAL_NARROW_S)}  [median of {len(fig.narrow)}]")
    print(f"  hx trace {fig.tally['task']}  {statistics.median(fig.trace):.2f} s  [median of 5, best "
          f"{min(fig.trace):.2f}]")
    print(f"  trace_store full fold  {full['seconds']:.2f} s for the log's {fig.events:,} events = {fig.rate:,.0f} "
          f"log events/s  (goal >= {GOAL_RATE:,}): {verdict(fig.rate >= GOAL_RATE)}  ({full['applied']:,} events "
          "applied: it reads only the attempts' summary channels)")
    print(f"  peak RSS of trace_store: all {full['maxrss_kb'] / 1024:,.0f} MB, to seq {part['position']:,} "
          f"{part['maxrss_kb'] / 1024:,.0f} MB (before the fold {full['rss_before_kb'] / 1024:,.0f} MB); ratio "
          f"{fig.memory:.2f}  (goal <= {GOAL_MEMORY}): {verdict(fig.memory <= GOAL_MEMORY)}")
    every, every_part = fig.every, fig.every_part
    print(f"  a fold that decodes every event (TypeCount)  {fig.every_rate:,.0f} events/s  (goal >= {GOAL_RATE:,}): "
          f"{verdict(fig.every_rate >= GOAL_RATE)}  ({every['applied']:,} events in {every['seconds']:.1f} s); "
          f"peak RSS all {every['maxrss_kb'] / 1024:,.0f} MB, to seq {every_part['position']:,} "
          f"({every_part['applied']:,} events) {every_part['maxrss_kb'] / 1024:,.0f} MB; ratio "
          f"{fig.every_memory:.2f}  (goal <= {GOAL_MEMORY}): {verdict(fig.every_memory <= GOAL_MEMORY)}")


def compare(base: Figures, now: Figures) -> None:
    """now/base for every headline figure, both trees on the same log."""
    print(f"\nnow/base on the log {base.log} made (lower is better for every row):")
    print(f"  {'figure':64} {'base':>10} {'now':>10} {'now/base':>9}")
    b, n = base.headline(), now.headline()
    for key in b:
        print(f"  {key:64} {b[key]:10.3f} {n[key]:10.3f} {n[key] / b[key] if b[key] else math.nan:9.2f}")
    if base.tally.get("finished") != now.tally.get("finished"):
        print(f"  note: PassCount read {base.tally.get('finished')} attempt.finished events with the base tree and "
              f"{now.tally.get('finished')} with this one: the trees do not read this log alike")


def base_worktree(ref: str, where: Path) -> Tree:
    """A detached worktree of ``ref`` at ``where``."""
    done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), ref],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git worktree add {ref}: {done.stderr.strip()}")
    return Tree(f"base {ref}", where)


def main(args: argparse.Namespace) -> int:
    """Make or reuse the logs, take every tree's figures, print them."""
    started = time.perf_counter()
    print(f"hx large-log bench, {time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} cores, Python "
          f"{sys.version.split()[0]}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="hx-large-log-"))
    now = Tree("now", REPO)
    base: Tree | None = None
    try:
        if args.base:
            base = base_worktree(args.base, tmp / "base-tree")
        data = Path(args.data_dir).resolve() if args.data_dir else tmp / "data"
        if args.run:
            given = Log("given", data, args.run)
            logs = {"now": given, "base": given}
        else:
            logs = {"now": make_log(now, data / "now", args.attempts)}
            if base is not None:
                logs["base"] = make_log(base, data / f"base-{args.base}", args.attempts)
        print(flush=True)
        if base is None:
            show(measure([(now, logs["now"])], args.repeat, args.part)[0])
        else:
            pairs = [(base, logs["base"]), (now, logs["base"])] + ([] if args.run else [(now, logs["now"])])
            figs = measure(pairs, args.repeat, args.part)
            for fig in figs:
                show(fig)
            compare(figs[0], figs[1])
            print("\n  The goals are read on the 'now tree on its own log' figures; the ratios compare both trees "
                  "on the log the base tree made.")
        if not args.data_dir:
            print("\n  (the log was made in a temporary dir, removed now: --data-dir D keeps it for the next run)")
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base.root)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--attempts", type=int, default=3000, help="about how many attempts the made run has")
    p.add_argument("--data-dir", help="where the logs are made and kept (reused when there); with --run: the data dir")
    p.add_argument("--run", help="an existing run in --data-dir (nothing is made)")
    p.add_argument("--base", nargs="?", const=DEFAULT_BASE, default=None, metavar="REF",
                   help=f"also time a worktree of REF (default {DEFAULT_BASE}) on a log it makes")
    p.add_argument("--repeat", type=int, default=3, help="runs of the rebuild, status and PassCount figures (median)")
    p.add_argument("--part", type=int, default=PART_EVENTS, help="events of the stopped fold (memory ratio)")
    p.add_argument("--child", choices=("narrow", "full", "part", "every", "every_part"), help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run and not args.data_dir:
        p.error("--run needs --data-dir")
    return args


if __name__ == "__main__":
    opts = parse()
    if opts.child:
        print(json.dumps(asyncio.run(fold(opts.child, Path(opts.data_dir), opts.run, opts.stop))))
        sys.exit(0)
    sys.exit(main(opts))
