#!/usr/bin/env python
"""The induced evolver's thresholds, chosen on the validation split: a grid of ``hx evolve`` runs, never a test task.

Run from the repository root::

    python bench/induction_thresholds.py                  # the grid below, 2 seeds, all TextWorldExpress games
    python bench/induction_thresholds.py --quick          # 2 games, 1 seed, 2 settings: a smoke run

Each setting of (``--induce-support``, ``--induce-lift``) runs ``hx evolve --evolver offline+induced
--heldout-split train`` (adaptation on dev tasks, held-out tasks from the train split: the validation
split) once per seed, each in a fresh data directory, with one ``--evolver offline`` run per seed as
the baseline. It prints, per setting, the held-out pass@2 gain over the round-0 score per game and
pooled (mean over seeds), and the gain over the catalog-only runs, then the setting with the largest
pooled gain: the defaults of ``InductionSettings`` are the setting this picked.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from itertools import product
from statistics import mean

GAMES = ("coin", "mapreader", "cookingworld", "twc", "sorting", "arithmetic", "simonsays", "peckingorder")
SUPPORTS = (2, 3, 5)
LIFTS = (1.5, 2.0, 3.0)


def evolve(options: list[str], seed: int) -> tuple[dict[str, tuple[float, float]], float]:
    """One ``hx evolve`` run in a fresh data directory: per game (round-0, final) held-out pass@2, and wall s."""
    with tempfile.TemporaryDirectory(prefix="hx-thresholds-") as data:
        began = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "hx", "--data-dir", data, "evolve", "--heldout-split", "train",
                              "--seed", str(seed), "--json", *options], capture_output=True, text=True, check=False)
        wall = time.perf_counter() - began
    if out.returncode != 0:
        raise SystemExit(f"hx evolve {' '.join(options)} failed: {out.stderr.strip().splitlines()[-1:]}")
    report = json.loads(out.stdout)
    before = {g["game"]: g["pass_at_2"] for g in report["heldout_before"]["games"]}
    after = {g["game"]: g["pass_at_2"] for g in report["heldout_after"]["games"]}
    return {g: (before[g], after[g]) for g in before}, wall


def main() -> None:
    """Run the grid, print the gains per setting and the one with the largest pooled gain."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--games", default=",".join(GAMES), help="comma-separated TextWorldExpress games")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=20, help="adaptation tasks per game")
    parser.add_argument("--heldout-tasks", type=int, default=20, help="validation (train split) tasks per game")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="2 games, 1 seed, 2 settings, 8 tasks, 3 rounds")
    parser.add_argument("--settings", default=None, metavar="S:L,...",
                        help="only these (support:lift) settings of the grid, e.g. 3:2,5:3 (to go on after a cut run)")
    args = parser.parse_args()
    games = [g for g in args.games.split(",") if g]
    unknown = sorted(set(games) - set(GAMES))
    if unknown:
        parser.error(f"--games: unknown game(s) {', '.join(unknown)}; games: {', '.join(GAMES)}")
    grid = list(product(SUPPORTS, LIFTS))
    if args.settings:
        try:
            chosen = [(int(s), float(lift)) for s, lift in (x.split(":") for x in args.settings.split(",") if x)]
        except ValueError:
            parser.error(f"--settings: {args.settings!r} is not a list of support:lift pairs such as 3:2,5:3")
        outside = [f"{s}:{lift:g}" for s, lift in chosen if (s, lift) not in grid]
        if outside:
            parser.error(f"--settings: {', '.join(outside)} not in the grid (supports {SUPPORTS}, lifts {LIFTS})")
        grid = chosen
    seeds, tasks, heldout, rounds = args.seeds, args.tasks, args.heldout_tasks, args.rounds
    if args.quick:
        games, grid, seeds, tasks, heldout, rounds = ["mapreader", "sorting"], [(3, 2.0), (5, 3.0)], 1, 8, 8, 3
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    common = [a for g in games for a in ("--bench", f"twx:{g}")] + [
        "--tasks", str(tasks), "--heldout-tasks", str(heldout), "--rounds", str(rounds), "--concurrency", "2"]
    catalog = [evolve([*common, "--evolver", "offline"], s) for s in range(seeds)]
    print(f"catalog only: {mean(w for _, w in catalog):.0f} s a run")
    rows = []
    for support, lift in grid:
        runs = [evolve([*common, "--evolver", "offline+induced", "--induce-support", str(support),
                        "--induce-lift", str(lift)], s) for s in range(seeds)]
        gain = {g: mean(r[g][1] - r[g][0] for r, _ in runs) for g in runs[0][0]}
        over = {g: mean(r[g][1] - c[g][1] for (r, _), (c, _) in zip(runs, catalog, strict=True)) for g in gain}
        rows.append((mean(gain.values()), support, lift, gain, over, mean(w for _, w in runs)))
        print(f"support {support} lift {lift:g}: pooled gain {rows[-1][0]:+.3f}, over catalog "
              f"{mean(over.values()):+.3f}, {rows[-1][5]:.0f} s a run; per game "
              + ", ".join(f"{g.split(':')[-1]} {v:+.2f}" for g, v in gain.items()))
    best = max(rows, key=lambda r: (r[0], -r[1], -r[2]))
    print(f"chosen on the validation split: --induce-support {best[1]} --induce-lift {best[2]:g} "
          f"(pooled held-out gain {best[0]:+.3f})")


if __name__ == "__main__":
    main()
