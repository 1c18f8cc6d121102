#!/usr/bin/env python
"""No regression against a base: the existing benches run from this tree and from a base ref, same machine, same run.

Run from the repository root::

    python bench/against_base.py                  # base 272f197, every bench
    python bench/against_base.py --base main~3    # another base
    python bench/against_base.py --only log_throughput time_travel --pairs 3

A detached worktree of the base ref is made (``git worktree add --detach``) and removed at the
end. Each bench is its tree's own script, run with that tree on PYTHONPATH and as its working
directory: ``rollout_overhead.py --quick``, ``log_throughput.py --quick``, ``replay.py`` (its
defaults: 10 tasks and a 4-task latency round) and ``time_travel.py --quick``. Runs alternate
base, now, base, now: a bench whose first pair took at most ``--short`` seconds gets ``--pairs``
pairs, a longer one a single pair. The headline figures are parsed from each run's printed lines
(the raw output of every run is kept in a temporary directory whose path is printed).

The table shows per figure the median over the runs of each tree, now/base, and a judgement.
The noise of a figure is the larger of its relative spread over each tree's runs ((max - min) /
median) and ``--tolerance`` (default 10 %: the run-to-run spread these benches show on two shared
cores). "no worse" means now is not worse than base by more than the noise ("better" when it is
better by more); "WORSE" means it is worse by more than the noise.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASE = "272f197"
NUMBER = r"([\d,]+(?:\.\d+)?)"


@dataclass(frozen=True)
class Figure:
    """One headline figure of a bench: the pattern of the line that carries it, and which way is better."""

    name: str
    pattern: str
    higher_is_better: bool

    def parse(self, text: str) -> float | None:
        """The figure's value in a run's output, or None when no line carries it."""
        found = re.search(self.pattern, text, re.MULTILINE)
        return float(found.group(1).replace(",", "")) if found else None


@dataclass(frozen=True)
class Bench:
    """A bench script, its options, and the figures read from its output."""

    name: str
    argv: tuple[str, ...]
    figures: tuple[Figure, ...]
    same_script: bool = False
    """Run this tree's script for both trees (only the library on PYTHONPATH differs): for a bench whose own
    script changed with what it measures."""


def _time_travel(projection: str) -> tuple[Figure, ...]:
    # A row: name, stream, at/last, full s, cold s, warm s, end s, cold/full, warm/full.
    row = rf"^{projection}\s+\S+\s+\S+\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}"
    return (Figure(f"{projection} full rebuild (s)", row, False),
            Figure(f"{projection} as-of, cold (s)", rf"^{projection}\s+\S+\s+\S+\s+\S+\s+{NUMBER}", False),
            Figure(f"{projection} as-of, warm (s)", rf"^{projection}\s+\S+\s+\S+\s+\S+\s+\S+\s+{NUMBER}", False))


BENCHES = (
    Bench("rollout_overhead", ("bench/rollout_overhead.py", "--quick"), (
        Figure("log/no-op wall ratio (median of pairs)", rf"median ratio {NUMBER}", False),
        Figure("steps/s with the log writer (median)", rf"^\s+log \(LogWriter\)\s+{NUMBER}\s", True),
        Figure("report folded from the log (s)", rf"report fold from the log {NUMBER} s", False),
    )),
    Bench("log_throughput", ("bench/log_throughput.py", "--quick"), (
        Figure("append_batch 1 event/msg (events/s)", rf"EventLog\.append_batch, frame_size=1\s+{NUMBER}", True),
        Figure("append_batch frame_size=64 (events/s)", rf"EventLog\.append_batch, frame_size=64\s+{NUMBER}", True),
        Figure("TypeCount rebuild, framed (events/s)", rf"rebuild, framed: {NUMBER} events/s", True),
        Figure("TaskHistory rebuild, framed (events/s)", rf"TaskHistory .*: {NUMBER} events/s", True),
    ), same_script=True),
    Bench("replay", ("bench/replay.py",), (
        Figure("random: live round (s)", rf"^random:, replay --env log\s+live\s+{NUMBER} s", False),
        Figure("replay --env log / live", rf"^random:, replay --env log .*ratio\s+{NUMBER}", False),
        Figure("replay --env live / live", rf"^random:, replay --env live .*ratio\s+{NUMBER}", False),
        Figure("latency model: replay / live", rf"s/call model, replay --env log .*ratio\s+{NUMBER}", False),
    )),
    Bench("time_travel", ("bench/time_travel.py", "--quick"), (*_time_travel("task_history"),
                                                             *_time_travel("trace_store"))),
)


@dataclass
class Tree:
    """A source tree whose benches run (its root on PYTHONPATH and as the working directory)."""

    label: str
    root: Path


@dataclass
class Runs:
    """One bench's runs: per tree, the parsed figures of each run, and the runs that failed."""

    bench: Bench
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)
    """The 1-minute load average at the start and end of each run."""


def run_once(bench: Bench, tree: Tree, raw: Path, n: int, runs: Runs) -> float:
    """Run ``bench`` from ``tree`` once; keep its output under ``raw``; add its figures to ``runs``; its wall."""
    script = (REPO if bench.same_script else tree.root) / bench.argv[0]
    out = raw / f"{bench.name}-{tree.label}-{n}.txt"
    if not script.exists():
        runs.failed.append(f"{tree.label}: {bench.argv[0]} is not in that tree")
        return 0.0
    runs.loads.append(os.getloadavg()[0])
    began = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(tree.root)}
    done = subprocess.run([sys.executable, str(script), *bench.argv[1:]], cwd=tree.root, env=env,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - began
    runs.loads.append(os.getloadavg()[0])
    out.write_text(done.stdout + ("\n--- stderr ---\n" + done.stderr if done.stderr else ""))
    runs.seconds.setdefault(tree.label, []).append(seconds)
    if done.returncode != 0:
        runs.failed.append(f"{tree.label} run {n}: exit {done.returncode} (see {out})")
        return seconds
    mine = runs.values.setdefault(tree.label, {})
    for fig in bench.figures:
        value = fig.parse(done.stdout)
        if value is None:
            runs.failed.append(f"{tree.label} run {n}: no line carries {fig.name!r} (see {out})")
        else:
            mine.setdefault(fig.name, []).append(value)
    print(f"  {bench.name:18} {tree.label:5} run {n}: {seconds:6.1f} s", flush=True)
    return seconds


def spread(values: list[float]) -> float:
    """Relative spread of a figure over one tree's runs ((max - min) / median; 0 for one run)."""
    med = statistics.median(values)
    return (max(values) - min(values)) / abs(med) if len(values) > 1 and med else 0.0


def judge(fig: Figure, base: list[float], now: list[float], tolerance: float) -> tuple[float, str]:
    """(noise, judgement) of now against base for one figure."""
    noise = max(tolerance, spread(base), spread(now))
    b, n = statistics.median(base), statistics.median(now)
    if not b:
        return noise, "?"
    change = (n - b) / abs(b) if fig.higher_is_better else (b - n) / abs(b)  # > 0: now is better
    if change < -noise:
        return noise, "WORSE"
    return noise, "better" if change > noise else "no worse"


def table(all_runs: list[Runs], base: Tree, now: Tree, tolerance: float) -> bool:
    """Print the comparison table; True when nothing is worse beyond its noise and no run failed."""
    clean = True
    print(f"\n  {'bench':17} {'figure':42} {'base':>12} {'now':>12} {'now/base':>9} {'noise':>6}  judgement")
    for runs in all_runs:
        for fig in runs.bench.figures:
            b = runs.values.get(base.label, {}).get(fig.name)
            n = runs.values.get(now.label, {}).get(fig.name)
            if not b or not n:
                print(f"  {runs.bench.name:17} {fig.name:42} {'-':>12} {'-':>12} {'':>9} {'':>6}  not measured")
                clean = False
                continue
            noise, said = judge(fig, b, n, tolerance)
            clean &= said != "WORSE"
            bm, nm = statistics.median(b), statistics.median(n)
            arrow = "higher" if fig.higher_is_better else "lower"
            print(f"  {runs.bench.name:17} {fig.name:42} {bm:12,.3f} {nm:12,.3f} {nm / bm if bm else 0:9.3f} "
                  f"{noise:6.0%}  {said} ({arrow} is better; {len(b)}+{len(n)} runs)")
        for why in runs.failed:
            print(f"  {runs.bench.name:17} failed: {why}")
            clean = False
    return clean


def main(args: argparse.Namespace) -> int:
    """Run every bench from both trees, alternating; print the table."""
    started = time.perf_counter()
    print(f"hx benches against a base, {time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} cores, Python "
          f"{sys.version.split()[0]}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    raw = Path(tempfile.mkdtemp(prefix="hx-against-base-"))
    where = raw / "base-tree"
    added = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), args.base],
                           capture_output=True, text=True, check=False)
    if added.returncode != 0:
        raise SystemExit(f"git worktree add {args.base}: {added.stderr.strip()}")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    base, now = Tree("base", where), Tree("now", REPO)
    print(f"  base {args.base} in {where}; now {REPO} (HEAD {head}, uncommitted changes included)")
    print(f"  raw output of every run: {raw}", flush=True)
    all_runs: list[Runs] = []
    try:
        for bench in BENCHES:
            if args.only and bench.name not in args.only:
                continue
            runs = Runs(bench)
            all_runs.append(runs)
            pair = run_once(bench, base, raw, 1, runs) + run_once(bench, now, raw, 1, runs)
            pairs = args.pairs if pair <= 2 * args.short else 1
            for n in range(2, pairs + 1):
                run_once(bench, base, raw, n, runs)
                run_once(bench, now, raw, n, runs)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], check=False)
    clean = table(all_runs, base, now, args.tolerance)
    print(f"\n  noise: the larger of --tolerance ({args.tolerance:.0%}) and the figure's relative spread over each "
          "tree's runs; 'no worse' = not worse than base by more than the noise")
    loads = [x for runs in all_runs for x in runs.loads]
    cores = os.cpu_count() or 1
    if loads:
        print(f"  load average (1 min) around the runs: {min(loads):.2f} to {max(loads):.2f} on {cores} cores"
              + ("" if max(loads) <= cores else "; above the cores, other processes took CPU from the benches: a "
                 "judgement can be off (an A/A run, --base HEAD, shows how far on this machine)"))
    print(f"  raw output kept in {raw}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if clean else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base", default=DEFAULT_BASE, help=f"the base ref (default {DEFAULT_BASE})")
    p.add_argument("--only", nargs="+", choices=[b.name for b in BENCHES], help="these benches only")
    p.add_argument("--pairs", type=int, default=2, help="(base, now) pairs of a short bench")
    p.add_argument("--short", type=float, default=90.0, help="a bench whose runs take at most this many s is short")
    p.add_argument("--tolerance", type=float, default=0.10, help="the least noise a figure is judged with")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse()))
