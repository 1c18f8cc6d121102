#!/usr/bin/env python
"""Does evolution generalise? Held-out pass@2 of the starter harness vs the evolved one, and what a round costs.

Run from the repository root::

    python bench/evolution_efficacy.py                       # both suites, seed 0 (about 4 minutes on 2 cores)
    python bench/evolution_efficacy.py --suite main          # coin + mapreader only (the README's main job)
    python bench/evolution_efficacy.py --seeds 0 1 2         # spread over evolution seeds
    python bench/evolution_efficacy.py --quick               # 10 adaptation / 20 held-out tasks, 3 rounds: a smoke run

Each suite is one ``python -m hx evolve --json`` in a process of its own, on the embedded
nats-server in a fresh temporary data directory, with the defaults of the main job:
``random:`` agent, offline evolver, ensemble strategy, dev tasks for adaptation and the
test split's first ``--heldout-tasks`` tasks held out (never shown to any stage). The
``main`` suite is TextWorldExpress coin and mapreader; ``others`` is cookingworld, sorting
and arithmetic. The baseline is measured in the same run: the held-out split is scored
with the starter harness before round 0 and with the evolved harness(es) after the last
round, on the same tasks and seeds.

Prints per game the held-out pass@2 before and after and the change in points (target for
coin and mapreader: at least +20 with 50 held-out tasks), whether the adaptation pass@k
of the final round equals its peak (the ensemble never ships a regression), and per round
the outcome, variants, adaptation pass@k, rollouts and seconds (the cost of a round).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUITES = {"main": ("twx:coin", "twx:mapreader"), "others": ("twx:cookingworld", "twx:sorting", "twx:arithmetic")}
TARGETS = {"twx:coin": 20.0, "twx:mapreader": 20.0}
"""Held-out pass@2 gain (points) each game must reach; the other games report whatever they reach."""
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Evolved:
    """One ``hx evolve`` run: its report and its wall time."""

    suite: str
    seed: int
    report: dict[str, Any]
    seconds: float


def evolve(suite: str, seed: int, args: argparse.Namespace) -> Evolved:
    """Run the main job on one suite in a fresh data directory; its JSON report."""
    with tempfile.TemporaryDirectory(prefix="hx-efficacy-") as data:
        command = [sys.executable, "-m", "hx", "--data-dir", data, "evolve", "--json", "--seed", str(seed),
                   "--tasks", str(args.tasks), "--heldout-tasks", str(args.heldout_tasks),
                   "--rounds", str(args.rounds), "--concurrency", str(args.concurrency)]
        for bench in SUITES[suite]:
            command += ["--bench", bench]
        began = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k not in ("HX_NATS_URL", "HX_DATA_DIR")})
        seconds = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"hx evolve failed on suite {suite} (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return Evolved(suite, seed, json.loads(done.stdout), seconds)


def heldout(report: dict[str, Any]) -> dict[str, tuple[int, float, float]]:
    """Per game: held-out tasks, pass@2 before round 0 and after the last round."""
    before = {g["game"]: g for g in report["heldout_before"]["games"]}
    after = {g["game"]: g for g in report["heldout_after"]["games"]}
    return {game: (before[game]["tasks"], before[game]["pass_at_2"], after[game]["pass_at_2"]) for game in before}


def print_run(run: Evolved) -> None:
    """One run's held-out table and its per-round cost."""
    report = run.report
    print(f"\n== suite {run.suite}, seed {run.seed}: {report['status']}, {len(report['rounds'])} rounds, "
          f"{run.seconds:.0f} s wall ==")
    print(f"{'game':<18}{'held-out':>9}{'round 0':>9}{'final':>8}{'change':>10}{'target':>9}")
    for game, (tasks, b, a) in sorted(heldout(report).items()):
        target = TARGETS.get(game)
        mark = "" if target is None else (f"+{target:.0f} ok" if 100 * (a - b) >= target else f"+{target:.0f} MISS")
        print(f"{game:<18}{tasks:>9}{b:>9.2f}{a:>8.2f}{100 * (a - b):>+9.0f} {mark:>9}")
    rows = report["rounds"]
    print(f"\n{'round':>5}  {'outcome':<20}{'variants':>8}{'pass@k':>8}{'rollouts':>10}{'seconds':>9}  shipped")
    for r in rows:
        score = "–" if r["pass_at_k"] is None else f"{r['pass_at_k']:.2f}"
        secs = "–" if r["seconds"] is None else f"{r['seconds']:.1f}"
        print(f"{r['round']:>5}  {r['outcome']:<20}{r['variants']:>8}{score:>8}{r['rollouts']:>10,}{secs:>9}  "
              f"{', '.join(r['shipped']) or '–'}")
    scores = [r["pass_at_k"] for r in rows if r["pass_at_k"] is not None]
    if scores:
        print(f"adaptation pass@k: first {scores[0]:.2f}, peak {max(scores):.2f}, final {scores[-1]:.2f} "
              f"({'final == peak' if scores[-1] == max(scores) else 'FINAL BELOW PEAK'})")
    rollouts = [r["rollouts"] for r in rows]
    seconds = [r["seconds"] for r in rows if r["seconds"] is not None]
    if rollouts and seconds:
        print(f"cost per round: median {statistics.median(rollouts):,.0f} rollouts, "
              f"{statistics.median(seconds):.1f} s (total {sum(rollouts):,} rollouts, {sum(seconds):.0f} s in rounds)")


def print_summary(runs: list[Evolved]) -> None:
    """Across seeds: mean change per game and the spread."""
    changes: dict[str, list[float]] = {}
    for run in runs:
        for game, (_, b, a) in heldout(run.report).items():
            changes.setdefault(game, []).append(100 * (a - b))
    print(f"\n== held-out pass@2 change over {len({r.seed for r in runs})} seed(s) ==")
    for game, values in sorted(changes.items()):
        spread = f" (min {min(values):+.0f}, max {max(values):+.0f})" if len(values) > 1 else ""
        print(f"{game:<18}{statistics.mean(values):>+6.1f} pts{spread}")


def main() -> None:
    """Parse the options, run each suite for each seed, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--tasks", type=int, default=30, help="adaptation tasks per game (hx evolve's default)")
    parser.add_argument("--heldout-tasks", type=int, default=50, help="held-out tasks per game (at least 50)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="10 adaptation and 20 held-out tasks, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.heldout_tasks, args.rounds = 10, 20, 3
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}; "
          f"{args.tasks} adaptation and {args.heldout_tasks} held-out tasks a game, up to {args.rounds} rounds")
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    runs = []
    for seed in args.seeds:
        for suite in suites:
            run = evolve(suite, seed, args)
            print_run(run)
            runs.append(run)
    print_summary(runs)


if __name__ == "__main__":
    main()
