#!/usr/bin/env python
"""The evolution claim, pre-registered: the starter harness against the evolved one on held-out test tasks.

Run from the repository root::

    python bench/evolution_efficacy.py                      # bench/specs/evolution_efficacy.yaml (the claim)
    python bench/evolution_efficacy.py --keep runs/evo      # the same, its log kept (--resume RUN goes on)
    python bench/evolution_efficacy.py --suite others       # bench/specs/evolution_efficacy_others.yaml (no claim)
    python bench/evolution_efficacy.py --quick              # dev tasks, one procedure seed: a smoke run

The committed spec (``claim: evolution-efficacy``; test tasks 200-249 of coin and mapreader,
checked against the other claims and ``bench/specs/spent-test-ranges.yaml``) is run by
``python -m hx --data-dir DIR experiment run SPEC --json --registry bench/specs``. Its factor
``harness`` has two levels: ``starter`` and ``evolved``, the harness an ``hx evolve`` run with the
main job's settings ends with (random agent, offline evolver, ensemble, sequential gate, 6 rounds
on 30 dev tasks a game, its own held-out set on the train split: no stage reads a test task),
made once per procedure seed (0, 1, 2). Every arm plays every task twice per seed (pass@2), in
one seeded random order; intervals resample tasks and seeds (crossed bootstrap).

Prints per level pass@2 and the pass rate per attempt (overall and per game), the effect
``evolved - starter`` with its interval, size ``d`` and keep-rule verdict, and the verdict on
``falsified_if`` (the gain's interval must lie above zero).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
from pathlib import Path
from typing import Any

from spec_runner import load, print_conclusion, run_spec, validation_tasks

SUITES = {"main": "evolution_efficacy", "others": "evolution_efficacy_others"}


def derive(spec: dict[str, Any], *, seed: int, quick: bool) -> dict[str, Any]:
    """The committed spec with the given seed; with ``quick``, dev tasks, one procedure seed, a smaller evolution."""
    out = copy.deepcopy(spec)
    out["seed"] = seed
    if quick:
        evolved = out["factors"][0]["scope"]["levels"]["evolved"]
        evolved.update(rounds=3, tasks=10, heldout_tasks=5)
        out["tasks"] = validation_tasks(out, 10, skip=10)  # dev tasks the evolution does not adapt on
        out.pop("claim", None)  # a smoke run judges no claim
        if out.get("procedure_seeds"):
            out["procedure_seeds"], out["replications"] = [seed], 2
        out["title"] += " (quick)"
    return out


def main() -> None:
    """Parse the options, run each suite's spec, print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="main")
    parser.add_argument("--concurrency", type=int, default=2, help="units (and evolution rollouts) at once")
    parser.add_argument("--quick", action="store_true",
                        help="dev tasks 10-19 a game, 3 rounds on dev tasks 0-9, one procedure seed (no test task)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="the data directory to run in and keep (to look at the log, or to --resume)")
    parser.add_argument("--resume", default=None, metavar="RUN", help="go on with RUN in --keep DIR")
    args = parser.parse_args()
    if args.resume and not args.keep:
        parser.error("--resume needs --keep DIR, where the run is")
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    for suite in suites:
        committed = load(SUITES[suite])
        spec = derive(committed, seed=committed.get("seed", 42), quick=args.quick)
        keep = args.keep / suite if args.keep else None
        run = run_spec(spec, concurrency=args.concurrency, keep=keep, resume=args.resume,
                       run_id=None if args.resume else f"claim-{suite}")
        print_conclusion(run, spec["title"])


if __name__ == "__main__":
    main()
