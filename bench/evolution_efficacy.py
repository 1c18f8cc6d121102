#!/usr/bin/env python
"""Does evolution generalise? The starter harness against the evolved one on held-out tasks, as an experiment.

Run from the repository root::

    python bench/evolution_efficacy.py                 # the main suite: bench/specs/evolution_efficacy.yaml
    python bench/evolution_efficacy.py --suite all     # also bench/specs/evolution_efficacy_others.yaml
    python bench/evolution_efficacy.py --seeds 0 1 2   # the spec once per seed, and the effect per seed
    python bench/evolution_efficacy.py --quick         # 10 dev tasks a game (10-19), 3 rounds on dev 0-9: a smoke run

Each suite is its committed spec run by ``python -m hx --data-dir TMP experiment run SPEC
--json`` (a fresh data directory and embedded nats-server per run). The spec's factor
``harness`` has two levels: ``starter`` (no procedure: the controlled starter harness) and
``evolved`` (an ``hx evolve`` run with the main job's budget: random agent, offline evolver,
ensemble strategy, 6 rounds on 30 dev tasks a game, 2 attempts; its own held-out set on
the train split, so no stage reads a test task), whose final harness is played. Both arms
then play the first 50 test tasks of each game twice (replications 2), in one seeded random
order, with the same agent seeds. ``--seeds`` sets the spec's seed (run order, agents,
evolution); ``--quick`` derives a smaller spec in code (dev tasks 10-19 of each game, never the test range;
the evolution 3 rounds on 10 dev tasks).

Prints per level the mean of ``passed`` (the pass rate per attempt, Wilson 95% interval) and
``steps`` (two-stage bootstrap over tasks, then attempts), the effect ``evolved - starter``
paired over tasks with its bootstrap interval, standardised size ``d`` and the keep rule's
verdict (keep: the interval is above 0), and the verdict on the spec's ``falsified_if``
(``diff_high(passed, "evolved", "starter") <= 0``: falsified when the data exclude any gain).
The figures are per attempt, not pass@2: a task passed in one of its two attempts counts half.

A ``--quick`` run of the main suite took 68 s on 2 shared cores (load 3.6; measured 2026-11-28: 80 units
after a 3-round evolution). The full spec (400 units after a 6-round evolution on 60 dev tasks a game) was
not timed for this docstring; expect several times that.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
from typing import Any

from spec_runner import load, run_seeds, validation_tasks

SUITES = {"main": "evolution_efficacy", "others": "evolution_efficacy_others"}


def derive(spec: dict[str, Any], *, seed: int, quick: bool) -> dict[str, Any]:
    """The committed spec with the given seed; with ``quick``, fewer test tasks and a smaller evolution."""
    out = copy.deepcopy(spec)
    out["seed"] = seed
    if quick:
        evolved = out["factors"][0]["scope"]["levels"]["evolved"]
        evolved.update(rounds=3, tasks=10, heldout_tasks=5)
        out["tasks"] = validation_tasks(out, 10, skip=10)  # dev tasks the evolution does not adapt on
        out["title"] += " (quick)"
    return out


def main() -> None:
    """Parse the options, run each suite's spec for each seed, print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="main")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="the spec's seed (default: its own)")
    parser.add_argument("--concurrency", type=int, default=2, help="units (and evolution rollouts) at once")
    parser.add_argument("--quick", action="store_true",
                        help="dev tasks 10-19 a game, 3 rounds on dev tasks 0-9 (no test task)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    for suite in suites:
        run_seeds(load(SUITES[suite]), args.seeds, args.concurrency,
                  lambda spec, seed: derive(spec, seed=seed, quick=args.quick))


if __name__ == "__main__":
    main()
