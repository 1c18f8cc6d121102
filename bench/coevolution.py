#!/usr/bin/env python
"""Untrained vs harness-only vs model-only vs co-evolution on one rollout budget, as an experiment.

Run from the repository root::

    python bench/coevolution.py                  # bench/specs/coevolution.yaml
    python bench/coevolution.py --seeds 0 1 2    # the spec once per seed, and the effects per seed
    python bench/coevolution.py --quick          # dev tasks 5-9 a game, a 60-attempt budget: a smoke run

The committed spec is run by ``python -m hx --data-dir TMP experiment run SPEC --json`` (a
fresh data directory and embedded nats-server per run). Its factor ``procedure`` has four
levels: ``untrained`` (no procedure: the fresh scorer policy, ``policy:scorer``, under the
starter harness) and three ``coevolve`` levels, each an ``hx coevolve`` run in its mode:
``harness`` (the policy frozen at its first version, AEGIS edits the harness), ``model`` (the
harness frozen, the learner trains; barren tasks rest) and ``both``. All three start from the
same fresh policy and starter harness and spend the same rollout budget (the spec's
controlled ``rollout_budget``: main, gate and retry attempts; a run stops when it is spent),
adapting on dev tasks and measuring their own held-out set on the train split. Each level's
product, the harness and the policy its learner ended with (``policy:<version>`` from the
log's object store), then plays the first 50 test tasks of coin, mapreader and cookingworld
twice, in one seeded random order with the same sampling seeds in every arm. ``--seeds`` sets
the spec's seed (run order, sampling, the evolutions' rollouts; the learner's init seed stays
0, so ``untrained`` is every run's first policy); ``--quick`` derives a smaller spec in code.

Prints per level the mean of ``passed`` (pass rate per attempt, Wilson 95% interval) and
``steps`` (two-stage bootstrap), each level's effect against ``untrained`` paired over tasks
with its bootstrap interval, size ``d`` and keep-rule verdict, and the verdict on the spec's
``falsified_if`` (falsified when the data exclude co-evolution beating harness-only, or
model-only beating the untrained policy). ``coevolution_modes.py`` is the earlier form of this
bench (three ``hx coevolve`` reports, held-out pass@2), kept for ``coevolution_rescore.py``.

A ``--quick`` run took 4 min 38 s on 2 shared cores (measured 2026-11-28: 120 units after three co-evolutions
of about 60 attempts each). The full spec (1,200 units after three 1,200-attempt co-evolutions) was not timed
for this docstring.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
from typing import Any

from spec_runner import load, run_seeds, validation_tasks


def derive(spec: dict[str, Any], *, seed: int, quick: bool) -> dict[str, Any]:
    """The committed spec with the given seed; with ``quick``, fewer tasks, steps and rollouts for every arm."""
    out = copy.deepcopy(spec)
    out["seed"] = seed
    if quick:
        out["tasks"] = validation_tasks(out, 5, skip=5)  # dev tasks the co-evolutions do not adapt on
        out["controlled_variables"].update(rollout_budget=60, max_steps=30)
        for options in out["factors"][0]["scope"]["levels"].values():
            if options is not None:
                options.update(tasks=5, heldout_tasks=2)
        out["title"] += " (quick)"
    return out


def main() -> None:
    """Parse the options, run the spec for each seed, print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="the spec's seed (default: its own)")
    parser.add_argument("--concurrency", type=int, default=2, help="units (and co-evolution rollouts) at once")
    parser.add_argument("--quick", action="store_true",
                        help="dev tasks 5-9 a game (no test task), 60-attempt budget, 30 steps")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    run_seeds(load("coevolution"), args.seeds, args.concurrency,
              lambda spec, seed: derive(spec, seed=seed, quick=args.quick))


if __name__ == "__main__":
    main()
