"""Play the final (harness, policy) pairs of kept ``bench/coevolution_modes.py`` runs on more held-out tasks.

``bench/coevolution_modes.py`` judges each mode on 50 held-out tasks per game: a pass@2 figure then
has a standard error of about 7 points, and one seed's difference of two figures about 10,
twice the +5 the co-evolution bar asks. This script measures the same runs more closely,
with no new evolution or training: for each seed kept under ``DATA_DIR/seed-N`` (the logs and
the three JSON reports the bench wrote there), per game, it plays

- untrained: the run's first policy under the starter harness;
- harness-only: that policy under the harness the harness-only run ended with for the game;
- model-only: the model-only run's last policy under the starter harness;
- co-evolution: the co-evolution run's last policy under the harness it ended with,

each on the first ``--tasks`` tasks of the held-out split (the bench's 50 are among them),
``k = 2``, with ``hx run --seed SEED`` for all four, so the pairs share their draws. An
evolved harness is rebuilt from the run's ledger (``hx state`` names the variant's last
candidate, ``hx export`` writes its applied config) and checked against the variant's digest
before it is played.

The first two pairs have no learner, and such runs reproduce exactly on machines of this kind.
``--known FILE`` (``coevolution_known_test.json`` holds the documented test figures) takes their
figures from the file instead of playing them, for a seed whose kept harness-only run spent
exactly the file's budget, the check that it is the same run; any other is refused. A game the
file has no figures for is played.

    python bench/coevolution_modes.py --seeds 0 1 2 --data-dir runs/         # keep the logs
    python bench/coevolution_rescore.py runs/ --seeds 0 1 2 --tasks 200 --games twx:coin twx:mapreader
    python bench/coevolution_rescore.py runs/ --seeds 3 --known bench/coevolution_known_test.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from coevolution_modes import Comparison, hx, print_means, print_table, rollouts, routed_variant, same_harness

from hx.harness.config import HarnessConfig

MODES = ("harness", "model", "both")


def final_configs(data: Path, report: dict[str, Any], games: list[str], scratch: Path) -> dict[str, Path | None]:
    """Per game, the config file of the harness the run ended with (None: the starter harness, never edited)."""
    run = report["run_id"]
    last = max(row["round"] for row in report["rounds"])
    state = json.loads(hx(data, "state", run, "--as-of", f"r{last}", "--json"))["harness"]
    variants = report["variants"]
    exported = scratch / run
    out: dict[str, Path | None] = {}
    for game in games:
        name = routed_variant(report, game)
        candidates = state[name]["candidates"]
        if not candidates:
            out[game] = None
            continue
        if not exported.exists():
            hx(data, "export", run, str(exported))
        found = sorted(exported.glob(f"R*/applied/{candidates[-1]}/config.yaml"))
        if len(found) != 1:
            raise SystemExit(f"{run}: no single applied config of {candidates[-1]} in its export ({len(found)} found)")
        digest = HarnessConfig.load(found[0]).digest
        if digest != variants[name]:
            raise SystemExit(f"{run}: {found[0]} builds {digest[:19]}, not variant {name}'s {variants[name][:19]}")
        out[game] = found[0]
    return out


def play(data: Path, game: str, policy: str, config: Path | None, seed: int, args: argparse.Namespace) -> float:
    """Held-out pass@2 of ``policy`` under ``config`` (None: the starter harness) on the first ``--tasks`` tasks."""
    cmd = ["run", "--bench", game, "--split", args.split, "--tasks", str(args.tasks), "--attempts", "2",
           "--max-steps", str(args.max_steps), "--concurrency", str(args.concurrency), "--seed", str(seed),
           "--model", f"policy:{policy}", "--role", "heldout", "--json",
           "--run-id", f"rescore-s{seed}-{game.replace(':', '-')}-{policy[:12]}-{time.time_ns()}"]
    if config is not None:
        cmd += ["--harness", str(config)]
    games = json.loads(hx(data, *cmd))["games"]
    return float(next(g["pass@2"] for g in games if g["game"] == game))


def known_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--known`` file's seeds, once its settings are checked against this rescore's."""
    if args.known is None:
        return {}
    try:
        known = json.loads(args.known.read_text())
        settings = {"split": known["split"], "tasks": known["tasks"], "max_steps": known["max_steps"]}
        seeds: dict[str, Any] = known["seeds"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--known {args.known}: not a known-figures file ({type(exc).__name__}: {exc})") from exc
    ours = {"split": args.split, "tasks": args.tasks, "max_steps": args.max_steps}
    if settings != ours:
        raise SystemExit(f"--known {args.known}: its figures are of {settings}, this rescore plays {ours}")
    return seeds


Played = dict[tuple[str, Path | None], float]
"""Held-out pass@2 of (policy, harness config) pairs of one game."""


def known_pairs(seed: int, harness: dict[str, Any], games: list[str], args: argparse.Namespace,
                first: str, configs: dict[str, Path | None]) -> dict[str, Played]:
    """Per game, the untrained and harness-only figures ``--known`` has for this seed, once its kept run is theirs."""
    known = args.known_seeds.get(str(seed))
    if known is None:
        return {}
    spent = rollouts(harness)
    if spent != known["budget"]:
        raise SystemExit(f"seed {seed}: the kept harness-only run spent {spent:,} attempts, --known {args.known} "
                         f"has {known['budget']:,}: not the same run, so its figures must be played")
    # a harness never edited is the starter one: its pair is the untrained one, and so is its figure
    return {g: {(first, configs[g]): float(known[g]["harness"]), (first, None): float(known[g]["untrained"])}
            for g in games if g in known}


def rescore(data: Path, seed: int, args: argparse.Namespace) -> tuple[Comparison, dict[str, bool]]:
    """One seed's four pairs per game, played on ``--tasks`` held-out tasks; and whether the harnesses match."""
    reports = {m: json.loads((data / f"{m}.json").read_text()) for m in MODES}
    games = [g for g in args.games if g in {s["game"] for s in reports["harness"]["heldout_after"]["games"]}]
    with tempfile.TemporaryDirectory(prefix="hx-rescore-") as scratch:
        configs = {m: final_configs(data, reports[m], games, Path(scratch)) for m in ("harness", "both")}
        first = reports["harness"]["policy"]  # the harness-only run never trains: its policy is the first one
        known = known_pairs(seed, reports["harness"], games, args, first, configs["harness"])
        table: Comparison = {}
        for game in games:
            pairs = ((first, None), (first, configs["harness"][game]), (reports["model"]["policy"], None),
                     (reports["both"]["policy"], configs["both"][game]))
            # a run that never edited the game's harness repeats a pair: it is played once
            played: Played = dict(known.get(game, {}))
            for pair in pairs:
                if pair not in played:
                    played[pair] = play(data, game, *pair, seed, args)
            table[game] = tuple(played[pair] for pair in pairs)
    return table, same_harness(reports["harness"], reports["both"], games)


def main() -> None:
    """Rescore every seed's kept runs and print the comparisons."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir", type=Path, help="the --data-dir bench/coevolution_modes.py kept its logs in")
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--games", nargs="+", default=["twx:coin", "twx:mapreader", "twx:cookingworld"])
    parser.add_argument("--tasks", type=int, default=200, help="held-out tasks per game")
    parser.add_argument("--split", choices=("test", "train"), default="test", help="the runs' held-out split")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=1, help="seeds rescored at once")
    parser.add_argument("--known", type=Path, help="untrained and harness-only figures of runs that reproduce "
                        "(bench/coevolution_known_test.json): not played again")
    args = parser.parse_args()
    args.known_seeds = known_figures(args)
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {s: pool.submit(rescore, args.data_dir / f"seed-{s}", s, args) for s in args.seeds}
        results = {s: f.result() for s, f in futures.items()}
    held = f"{args.tasks} {args.split} tasks per game, k=2"
    for seed, (table, same) in results.items():
        print_table(f"seed {seed}: held-out pass@2 ({held}), the runs' final pairs", table, same=same)
        print()
    if len(results) > 1:
        print_means(held, results)
    print(f"{time.perf_counter() - began:.0f}s in all")


if __name__ == "__main__":
    main()
