#!/usr/bin/env python
"""The evolution claims, pre-registered: the starter harness against evolved ones on held-out test tasks.

Run from the repository root::

    python bench/evolution_efficacy.py                      # bench/specs/evolution_efficacy.yaml (the claim)
    python bench/evolution_efficacy.py --keep runs/evo      # the same, its log kept (--resume RUN goes on)
    python bench/evolution_efficacy.py --suite others       # bench/specs/evolution_efficacy_others.yaml (no claim)
    python bench/evolution_efficacy.py --suite rules        # bench/specs/rule_induction.yaml (the rule claim)
    python bench/evolution_efficacy.py --quick              # dev tasks, one procedure seed: a smoke run
    python bench/evolution_efficacy.py --suite rules --quick --games twx:sorting,twx:coin   # a smoke run of two games

The committed spec (``claim: evolution-efficacy``; test tasks 200-249 of coin and mapreader,
checked against the other claims and ``bench/specs/spent-test-ranges.yaml``) is run by
``python -m hx --data-dir DIR experiment run SPEC --json --registry bench/specs``. Its factor
``harness`` has two levels: ``starter`` and ``evolved``, the harness an ``hx evolve`` run with the
main job's settings ends with (random agent, offline evolver, ensemble, sequential gate, 6 rounds
on 30 dev tasks a game, its own held-out set on the train split: no stage reads a test task),
made once per procedure seed (0, 1, 2). Every arm plays every task twice per seed (pass@2), in
one seeded random order; intervals resample tasks and seeds (crossed bootstrap).

``--suite rules`` runs ``bench/specs/rule_induction.yaml`` (``claim: rule-induction``, issue 39): the
eight TextWorldExpress games and three ScienceWorld tasks, factor ``arm`` with ``starter``, ``catalog``
(the offline evolver) and ``both`` (``offline+induced``), and prints besides the figures below the
claim's own (``rule_figures.py``): per game pass@2 of each arm, the gains against the +15-point bar, losses,
coin and mapreader against the catalog arm, ``no_candidate`` rounds and induction's share of the wall time.

``--games LIST`` (comma-separated ``bench:game``) keeps only those games of the suite: its tasks and its
evolutions' benches. A claim is judged once on all its games, so on a claim suite it needs ``--quick``.

Prints per level pass@2 and the pass rate per attempt (overall and per game), each effect with its
interval, size ``d`` and keep-rule verdict, and the verdict on ``falsified_if``.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rule_figures import game_figures, games_of, print_games, print_runs, read_runs
from spec_runner import SPECS, load, print_conclusion, run_spec, validation_tasks

from streams.config import NatsSettings

SUITES = {"main": "evolution_efficacy", "others": "evolution_efficacy_others", "rules": "rule_induction"}


@dataclass(frozen=True)
class Quick:
    """A smoke run's size: the evolutions' rounds, dev tasks and held-out tasks a game, dev tasks played a game."""

    rounds: int = 3
    tasks: int = 10
    heldout: int = 5
    played: int = 10
    games: tuple[str, ...] = ()
    """The games it keeps when ``--games`` names none (empty: all the suite's)."""


QUICK = {"rules": Quick(rounds=2, tasks=5, heldout=3, played=5,
                        games=("twx:cookingworld", "sciworld:use-thermometer"))}
"""Per suite, when not the default: ``rules`` has eleven games and ScienceWorld's slow steps, so its smoke run
keeps two (a TextWorldExpress game the issue names, and the ScienceWorld task with the shortest random episodes)."""


def restricted(spec: dict[str, Any], games: Sequence[str]) -> dict[str, Any]:
    """The spec with only ``games``' tasks and evolution benches; ValueError names a game the spec does not have."""
    have = games_of(spec)
    for game in games:
        if game not in have:
            raise ValueError(f"{game} is not a game of this suite (its games: {', '.join(have)})")
    out = copy.deepcopy(spec)
    out["tasks"] = [t for t in spec["tasks"] if ":".join(t.split(":")[:2]) in games]
    for factor in out["factors"]:
        for options in factor["scope"]["levels"].values():
            if isinstance(options, dict) and "benches" in options:
                options["benches"] = [b for b in options["benches"] if b in games]
    out["title"] += f" (games: {', '.join(g for g in have if g in games)})"
    return out


def anchored(spec: dict[str, Any]) -> dict[str, Any]:
    """A controlled harness path made absolute: the spec names it relative to bench/specs, the run reads a copy."""
    controlled = spec.get("controlled_variables") or {}
    harness = controlled.get("harness")
    if harness and not Path(harness).is_absolute():
        controlled["harness"] = str((SPECS / harness).resolve())
    return spec


def derive(spec: dict[str, Any], *, seed: int, quick: bool, games: Sequence[str] = (),
           size: Quick = Quick()) -> dict[str, Any]:
    """The committed spec with the given seed (and only ``games``, when named); with ``quick``, dev tasks, one
    procedure seed, a smaller evolution (``size``)."""
    out = anchored(copy.deepcopy(spec))
    out["seed"] = seed
    if games or (quick and size.games):
        out = restricted(out, games or size.games)
    if quick:
        for factor in out["factors"]:
            for options in factor["scope"]["levels"].values():
                if isinstance(options, dict) and "rounds" in options:  # an evolution's options, not another's product
                    options.update(rounds=size.rounds, tasks=size.tasks, heldout_tasks=size.heldout)
        # dev tasks the evolutions do not adapt on (they adapt on the first ``tasks``)
        out["tasks"] = validation_tasks(out, size.played, skip=size.tasks)
        out.pop("claim", None)  # a smoke run judges no claim
        if out.get("procedure_seeds"):
            out["procedure_seeds"], out["replications"] = [seed], 2
        out["title"] += " (quick)"
    return out


class Parser(argparse.ArgumentParser):
    """Bad arguments are one line, ``error: ...``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Say what is wrong in one line and exit."""
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


def game_list(value: str) -> tuple[str, ...]:
    """``--games``: comma-separated ``bench:game`` names."""
    games = tuple(dict.fromkeys(g.strip() for g in value.split(",") if g.strip()))
    bad = next((g for g in games if len(g.split(":")) != 2 or not all(g.split(":"))), None)
    if not games or bad is not None:
        raise argparse.ArgumentTypeError(f"{bad or value!r} is not a comma-separated list of bench:game names "
                                         "(e.g. twx:cookingworld,sciworld:use-thermometer)")
    return games


def chosen(parser: Parser, args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """The suites to run with their derived specs; an argument error for a game no chosen suite has, or for
    ``--games`` on a claim without ``--quick``."""
    names = list(SUITES) if args.suite == "all" else [args.suite]
    committed = {name: load(SUITES[name]) for name in names}
    games: tuple[str, ...] = args.games or ()
    for game in games:
        if not any(game in games_of(spec) for spec in committed.values()):
            held = ", ".join(dict.fromkeys(g for spec in committed.values() for g in games_of(spec)))
            parser.error(f"--games: {game} is not a game of suite {args.suite} (its games: {held})")
    out = []
    for name, spec in committed.items():
        mine = tuple(g for g in games if g in games_of(spec))
        if games and not mine:
            continue  # --suite all: a suite with none of the named games is not run
        if mine and spec.get("claim") and not args.quick:
            parser.error(f"--games: suite {name} is the pre-registered claim {spec['claim']!r}, judged once on all "
                         "its games; name games only with --quick (dev tasks)")
        out.append((name, derive(spec, seed=spec.get("seed", 42), quick=args.quick, games=mine,
                                 size=QUICK.get(name, Quick()))))
    return out


def arguments(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[tuple[str, dict[str, Any]]]]:
    """The options, and the suites they choose with their derived specs (an argument error exits 2, one line)."""
    parser = Parser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="main")
    parser.add_argument("--games", type=game_list, default=None, metavar="LIST",
                        help="only these games of the suite, comma-separated bench:game (twx:cookingworld,twx:coin)")
    parser.add_argument("--concurrency", type=int, default=2, help="units (and evolution rollouts) at once")
    parser.add_argument("--quick", action="store_true",
                        help="dev tasks 10-19 a game, 3 rounds on dev tasks 0-9, one procedure seed (no test task); "
                             "rules: two games, dev tasks 5-9, 2 rounds on dev tasks 0-4")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="the data directory to run in and keep (to look at the log, or to --resume)")
    parser.add_argument("--resume", default=None, metavar="RUN", help="go on with RUN in --keep DIR")
    args = parser.parse_args(argv)
    if args.resume and not args.keep:
        parser.error("--resume needs --keep DIR, where the run is")
    return args, chosen(parser, args)


def main() -> None:
    """Parse the options, run each suite's spec, print the figures."""
    args, suites = arguments()
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    for suite, spec in suites:
        with tempfile.TemporaryDirectory(prefix="hx-bench-spec-") as tmp:
            data = args.keep / suite if args.keep else Path(tmp)  # kept until the ledgers are read
            run = run_spec(spec, concurrency=args.concurrency, keep=data, resume=args.resume,
                           run_id=None if args.resume else f"claim-{suite}")
            print_conclusion(run, spec["title"])
            if suite == "rules":
                print_games(game_figures(run.conclusion, games_of(spec)))
                print_runs(read_runs(NatsSettings(data_dir=data), spec, run.conclusion["run_id"]))


if __name__ == "__main__":
    main()
