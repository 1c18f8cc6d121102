"""Play the final (harness, policy) pairs of kept ``bench/coevolution.py`` runs on more held-out tasks.

``bench/coevolution.py`` judges each mode on 50 held-out tasks per game: a pass@2 figure then
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

    python bench/coevolution.py --seeds 0 1 2 --data-dir runs/         # keep the logs
    python bench/coevolution_rescore.py runs/ --seeds 0 1 2 --tasks 200 --games twx:coin twx:mapreader
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from coevolution import Comparison, hx, print_means, print_table, routed_variant, same_harness

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


def rescore(data: Path, seed: int, args: argparse.Namespace) -> tuple[Comparison, dict[str, bool]]:
    """One seed's four pairs per game, played on ``--tasks`` held-out tasks; and whether the harnesses match."""
    reports = {m: json.loads((data / f"{m}.json").read_text()) for m in MODES}
    games = [g for g in args.games if g in {s["game"] for s in reports["harness"]["heldout_after"]["games"]}]
    with tempfile.TemporaryDirectory(prefix="hx-rescore-") as scratch:
        configs = {m: final_configs(data, reports[m], games, Path(scratch)) for m in ("harness", "both")}
        first = reports["harness"]["policy"]  # the harness-only run never trains: its policy is the first one
        table: Comparison = {}
        for game in games:
            pairs = ((first, None), (first, configs["harness"][game]), (reports["model"]["policy"], None),
                     (reports["both"]["policy"], configs["both"][game]))
            # a run that never edited the game's harness repeats a pair: it is played once
            played: dict[tuple[str, Path | None], float] = {}
            for pair in pairs:
                if pair not in played:
                    played[pair] = play(data, game, *pair, seed, args)
            table[game] = tuple(played[pair] for pair in pairs)
    return table, same_harness(reports["harness"], reports["both"], games)


def main() -> None:
    """Rescore every seed's kept runs and print the comparisons."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir", type=Path, help="the --data-dir bench/coevolution.py kept its logs in")
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--games", nargs="+", default=["twx:coin", "twx:mapreader", "twx:cookingworld"])
    parser.add_argument("--tasks", type=int, default=200, help="held-out tasks per game")
    parser.add_argument("--split", choices=("test", "train"), default="test", help="the runs' held-out split")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=1, help="seeds rescored at once")
    args = parser.parse_args()
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
