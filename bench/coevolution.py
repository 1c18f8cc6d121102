#!/usr/bin/env python
"""The co-evolution claim, pre-registered: harness x policy (2 x 2) and two crossed arms, as one experiment.

Run from the repository root::

    python bench/coevolution.py --keep runs/co              # bench/specs/coevolution.yaml, kept in runs/co
    python bench/coevolution.py --keep runs/co --resume claim-coevolution   # go on after a stop
    python bench/coevolution.py --quick                     # dev tasks, one procedure seed: a smoke run

The committed spec (``claim: coevolution``; test tasks 250-299 of coin and mapreader, checked
against the other claims and ``bench/specs/spent-test-ranges.yaml``) is run by ``python -m hx
--data-dir DIR experiment run SPEC --json --registry bench/specs``. Its factor ``arm`` has six
levels: ``untrained`` (the fresh scorer policy under the starter harness), three ``coevolve``
runs per procedure seed (``harness``, ``model``, ``both``: the same options, budget, stop rule and
starting policy; only the mode differs), and two levels that play one run's harness with
another's policy (``both_harness_untrained``, ``harness_both_policy``). Every arm plays every
task twice per procedure seed (pass@2); intervals resample tasks and seeds (crossed bootstrap).
The run outlasts one sitting: ``--keep DIR`` keeps its log, ``--resume RUN`` goes on from what it
kept (finished co-evolutions are read back, an unfinished one resumes, finished units are skipped).

Prints per level pass@2 and steps (overall and per game), every effect the spec names with its
interval, size ``d`` and keep-rule verdict, the harness x policy interaction, and the verdict on
``falsified_if``. ``coevolution_modes.py`` is the earlier form of this bench, kept for
``coevolution_rescore.py``; its figures are superseded by this claim's.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
from pathlib import Path
from typing import Any

from spec_runner import load, print_conclusion, run_spec, validation_tasks


def derive(spec: dict[str, Any], *, seed: int, quick: bool) -> dict[str, Any]:
    """The committed spec with the given seed; with ``quick``, dev tasks, one procedure seed, fewer rollouts."""
    out = copy.deepcopy(spec)
    out["seed"] = seed
    if quick:
        out["tasks"] = validation_tasks(out, 5, skip=5)  # dev tasks the co-evolutions do not adapt on
        out["controlled_variables"].update(rollout_budget=60, max_steps=30)
        for options in out["factors"][0]["scope"]["levels"].values():
            if options is not None and "mode" in options:  # a run's options, not a level playing another's product
                options.update(tasks=5, heldout_tasks=2)
        out.pop("claim", None)  # a smoke run judges no claim
        if out.get("procedure_seeds"):
            out["procedure_seeds"], out["replications"] = [seed], 2
        out["title"] += " (quick)"
    return out


def main() -> None:
    """Parse the options, run the spec, print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--concurrency", type=int, default=2, help="units (and co-evolution rollouts) at once")
    parser.add_argument("--quick", action="store_true",
                        help="dev tasks 5-9 a game (no test task), one procedure seed, 60-attempt budget, 30 steps")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="the data directory to run in and keep (to look at the log, or to --resume)")
    parser.add_argument("--resume", default=None, metavar="RUN", help="go on with RUN in --keep DIR")
    args = parser.parse_args()
    if args.resume and not args.keep:
        parser.error("--resume needs --keep DIR, where the run is")
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    committed = load("coevolution")
    spec = derive(committed, seed=committed.get("seed", 42), quick=args.quick)
    run = run_spec(spec, concurrency=args.concurrency, keep=args.keep, resume=args.resume,
                   run_id=None if args.resume else "claim-coevolution")
    print_conclusion(run, spec["title"])


if __name__ == "__main__":
    main()
