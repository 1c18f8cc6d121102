#!/usr/bin/env python
"""What rules can do for the random agent: every rule the induction finds, applied at once, on the validation split.

Run from the repository root::

    python bench/rule_ceiling.py                                  # the four games the catalog cannot lift
    python bench/rule_ceiling.py --games sorting --tasks 30       # one game
    python bench/rule_ceiling.py --support 2 --lift 1.5           # other thresholds
    python bench/rule_ceiling.py --games sciworld:use-thermometer --tasks 10 --heldout-tasks 10

Per game, in a fresh data directory: ``hx run`` plays the starter harness on the first ``--tasks`` dev
tasks (an adaptation round, as an evolution's round 0), the induction reads that round
(``hx.aegis.induction``, the evolver's own code) and every rule it finds that builds is added to the
starter at once (the TextWorld starter for every game, as the rule claim plays). Then both
harnesses play the same ``--heldout-tasks`` train-split tasks (the validation split, never a test
task) and the dev tasks again (what a gate would see), same seeds.
It prints the rules and pass@2 of both harnesses with the paired difference and its 95% interval
(tasks resampled). It measures the rules' reach, not an evolution: the gate ships one candidate at a
time, and only on a pass@k flip, so a gain here that no single rule makes is out of an evolution's reach.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hx.aegis.evidence import Evidence
from hx.aegis.induction import Induced, induce, read_traces
from hx.aegis.settings import InductionSettings
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from hx.harnesses import starter_harness
from schemas.edits import AddRule
from schemas.rules import sentence, support_phrase
from streams.config import NatsSettings
from streams.connection import connect

GAMES = ("cookingworld", "twc", "sorting", "arithmetic")
RESAMPLES = 2000


def play(data: Path, game: str, split: str, tasks: int, run_id: str, harness: Path | None,
         seed: int) -> dict[str, float]:
    """``hx run`` on the first ``tasks`` of ``split``: per task its pass@2."""
    role = "adaptation" if split == "dev" else "heldout"
    bench = game if ":" in game else f"twx:{game}"
    out = subprocess.run([sys.executable, "-m", "hx", "--data-dir", str(data), "run", "--bench", bench,
                          "--split", split, "--tasks", str(tasks), "--attempts", "2", "--role", role, "--seed",
                          str(seed), "--run-id", run_id, "--json", "--concurrency", "2",
                          *(["--harness", str(harness)] if harness else [])],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"hx run {game} {split} failed: {out.stderr.strip().splitlines()[-1:]}")
    return {t["task_id"]: t["pass@2"] for t in json.loads(out.stdout)["tasks"]}


async def learnt(data: Path, run_id: str, settings: InductionSettings) -> tuple[int, list[Induced]]:
    """The rules induction finds in the run's round 0: (attempts read, rules heaviest first)."""
    async with connect(NatsSettings(data_dir=data)) as conn:
        traces = await read_traces(Evidence(conn.log, run_id), [0])
    return len(traces), induce(traces, settings)


def with_rules(harness: HarnessConfig, found: list[Induced]) -> tuple[HarnessConfig, list[Induced]]:
    """The harness with every rule added that builds on what was added before it, and those rules."""
    kept = []
    for item in found:
        try:
            harness = apply(harness, (AddRule(rule=item.rule, support=item.support),))
        except CompositionError:
            continue
        kept.append(item)
    return harness, kept


def interval(base: dict[str, float], ruled: dict[str, float], seed: int) -> tuple[float, float, float]:
    """Mean paired difference (ruled - base) over tasks and its 95% bootstrap interval."""
    diffs = [ruled[t] - base[t] for t in base]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(RESAMPLES))
    return sum(diffs) / len(diffs), means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def mean(values: dict[str, float]) -> float:
    """The mean pass@2 over tasks."""
    return sum(values.values()) / len(values)


def main() -> None:
    """Per game: induce from a starter round, add every rule, compare pass@2 on validation and dev tasks."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--games", default=",".join(GAMES),
                        help="comma-separated TextWorldExpress games, or bench:game (sciworld:use-thermometer)")
    parser.add_argument("--tasks", type=int, default=30, help="dev tasks to learn from (and to replay)")
    parser.add_argument("--heldout-tasks", type=int, default=30, help="train-split (validation) tasks")
    parser.add_argument("--seed", type=int, default=0)
    defaults = InductionSettings()
    parser.add_argument("--support", type=int, default=defaults.min_support)
    parser.add_argument("--lift", type=float, default=defaults.min_lift)
    parser.add_argument("--against", type=float, default=defaults.max_against)
    args = parser.parse_args()
    settings = InductionSettings.of(args.support, args.lift, args.against)
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}; "
          f"support {args.support}, lift {args.lift:g}, against {args.against:g}")
    for game in [g for g in args.games.split(",") if g]:
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="hx-rule-ceiling-") as tmp:
            data = Path(tmp)
            learn = play(data, game, "dev", args.tasks, "learn", None, args.seed)
            attempts, found = asyncio.run(learnt(data, "learn", settings))
            harness, kept = with_rules(starter_harness("textworld"), found)
            path = harness.save(data / "ruled.yaml")
            base = play(data, game, "train", args.heldout_tasks, "base", None, args.seed + 1)
            ruled = play(data, game, "train", args.heldout_tasks, "ruled", path, args.seed + 1)
            again = play(data, game, "dev", args.tasks, "again", path, args.seed + 2)
        print(f"\n== {game}: {len(found)} rule(s) from {attempts} attempts, {len(kept)} build together "
              f"({time.perf_counter() - began:.0f} s)")
        for item in kept:
            print(f"  {sentence(item.rule)} ({support_phrase(item.support)})")
        d, lo, hi = interval(base, ruled, args.seed)
        print(f"validation pass@2: starter {mean(base):.3f}, all rules {mean(ruled):.3f}, "
              f"difference {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        d, lo, hi = interval(learn, again, args.seed)
        print(f"dev (learnt-from) pass@2: starter {mean(learn):.3f}, all rules {mean(again):.3f}, "
              f"difference {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")


if __name__ == "__main__":
    main()
