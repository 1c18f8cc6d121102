"""Harness-only, model-only and co-evolution as three kept ``hx coevolve`` runs (coevolution_rescore.py's input).

Runs ``hx coevolve`` three times on one embedded log, one mode at a time:

1. ``--mode harness`` (the policy frozen at its first version) for ``--rounds`` rounds; the
   attempts it spends (main, gate and retry rollouts) become the budget of the other two;
2. ``--mode model`` (the harness frozen) and 3. ``--mode both``, each with ``--budget`` set
   to that figure and room for more rounds, so all three spend the same rollouts. These two
   rest barren tasks (``--rest-barren 2``: a task that failed every attempt of its last two
   played rounds sits out two rounds), so their budget buys more learner passes.

Every run starts from the same fresh policy (same kind and seed) and the same starter
harness, and is judged on the same frozen held-out split (the test split, never evolved
or trained on). The untrained policy's held-out pass@2 is each run's "before" figure. It
prints, per game, held-out pass@2: untrained, harness-only, model-only, co-evolution, and
the two differences the issue asks about (model-only minus untrained; co-evolution minus
harness-only), plus each run's rollouts and wall time.

    python bench/coevolution_modes.py                     # coin, mapreader, cookingworld
    python bench/coevolution_modes.py --seeds 0 1 2 3 4 --jobs 3   # mean over seeds
    python bench/coevolution_modes.py --tasks 10 --heldout-tasks 20 --rounds 3   # quicker
    python bench/coevolution_modes.py --seeds 0 1 --heldout-split train          # a validation split, not test
    python bench/coevolution_modes.py --learn-after-stall  # the co-evolution learner waits for a stalled harness search
    python bench/coevolution_modes.py --rest-barren 0      # every task plays every round (the runs before 2026-11-26)
    python bench/coevolution_modes.py --seeds 0 1 --data-dir runs/ --reuse   # go on with a bench that was cut off

Held-out pass@2 is measured on 50 tasks per game by default (``hx evolve``'s held-out size):
its standard error is then about 7 points, so a difference of two figures of one seed is
mostly noise (``--heldout-tasks 200`` halves it, at the cost of 2,400 more attempts a run
for the three games). With several ``--seeds`` each seed is a comparison of
its own (its own log, budget and untrained figures; the rollouts, the learner and the evolver
seeded by it, on the same tasks), ``--jobs`` of them at once, and the table of each is
followed by the mean over seeds with its standard error: the harness search lands on other
edits with another seed, and that spread is far larger than the measurement's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hx.environments.results import markdown_path

GAMES = ("twx:coin", "twx:mapreader", "twx:cookingworld")


def hx(data: Path, *args: str) -> str:
    """Run ``hx`` on the log in ``data``; its standard output (a failure stops the seed with hx's error)."""
    done = subprocess.run([sys.executable, "-m", "hx", "--data-dir", str(data), *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"hx {' '.join(args[:3])} on {data} failed ({done.returncode})")
    return done.stdout


def coevolve(data: Path, mode: str, args: argparse.Namespace, *, seed: int, budget: int,
             rounds: int) -> tuple[dict[str, Any], float]:
    """One ``hx coevolve`` run; its JSON report and wall time (0 for a kept report reused with ``--reuse``)."""
    kept = data / f"{mode}.json"
    if args.reuse and kept.exists():
        try:
            report = json.loads(kept.read_text())
        except ValueError:  # claimed empty by a run that was cut off before it wrote its report
            report = {}
        if report.get("status") not in (None, "unfinished"):
            return report, 0.0
        for stale in (kept, markdown_path(kept)):  # a run cut off midway runs afresh, not half-reported
            stale.unlink(missing_ok=True)
    cmd = ["coevolve", "--mode", mode, "--json",
           "--tasks", str(args.tasks), "--heldout-tasks", str(args.heldout_tasks),
           "--heldout-split", args.heldout_split, "--rounds", str(rounds),
           "--attempts", "2", "--max-steps", str(args.max_steps), "--concurrency", str(args.concurrency),
           "--seed", str(seed), "--learner-seed", str(seed), "--lr", str(args.lr),
           "--epochs", str(args.epochs), "--window", str(args.window), "--step-weight", str(args.step_weight),
           "--clip-eps-high", str(args.clip_eps_high),
           "--run-id", f"bench-{mode}-s{seed}-{int(time.time())}", "--out", str(data / f"{mode}.json")]
    if budget:
        cmd += ["--budget", str(budget)]
    if mode == "both" and args.learn_after_stall:
        cmd += ["--learn-after-stall"]
    if mode in ("model", "both") and args.rest_barren:
        cmd += ["--rest-barren", str(args.rest_barren)]
    for game in args.games:
        cmd += ["--bench", game]
    began = time.perf_counter()
    report = json.loads(hx(data, *cmd))
    return report, time.perf_counter() - began


def heldout(report: dict[str, Any], which: str) -> dict[str, float]:
    """Per game: held-out pass@2 of a report, ``before`` the first round or ``after`` the last."""
    scored = report.get(f"heldout_{which}") or {}
    return {g["game"]: g["pass_at_2"] for g in scored.get("games", []) if g.get("pass_at_2") is not None}


def rollouts(report: dict[str, Any]) -> int:
    """Attempts the run spent: its rounds' and the policy gate's."""
    gates = sum(u["rollouts"] for u in report.get("learner", []) if "adopted" in u)
    return int(sum(row["rollouts"] for row in report["rounds"]) + gates)


Comparison = dict[str, tuple[float | None, ...]]
"""Per game: held-out pass@2 untrained, harness-only, model-only, co-evolution."""


def routed_variant(report: dict[str, Any], game: str) -> str:
    """The variant a run ended with for ``game``: its routed one, else the one a cluster not run yet gets (a report
    written before reports named it: the first variant; empty if the run has none)."""
    return str((report.get("routing") or {}).get(game) or report.get("unserved")
               or min(report.get("variants") or {}, default=""))


def final_harness(report: dict[str, Any], game: str) -> str:
    """The digest of the harness a run ended with for ``game``."""
    return str((report.get("variants") or {}).get(routed_variant(report, game), ""))


def same_harness(harness: dict[str, Any], both: dict[str, Any], games: list[str]) -> dict[str, bool]:
    """Per game, whether co-evolution ended on harness-only's final harness (then only the policy differs)."""
    return {g: bool(final_harness(harness, g)) and final_harness(harness, g) == final_harness(both, g) for g in games}


def compare(data: Path, seed: int, args: argparse.Namespace) -> tuple[Comparison, list[str], dict[str, bool]]:
    """One seed's three runs on one log: per game the four figures, a line per run, and whether the harnesses match."""
    harness, t_h = coevolve(data, "harness", args, seed=seed, budget=0, rounds=args.rounds)
    budget = rollouts(harness)
    # room for rounds: the budget (or patience) ends these runs, and resting barren tasks makes a round cheaper
    model, t_m = coevolve(data, "model", args, seed=seed, budget=budget, rounds=16 * args.rounds)
    both, t_b = coevolve(data, "both", args, seed=seed, budget=budget, rounds=16 * args.rounds)
    before = heldout(harness, "before")
    after = [heldout(r, "after") for r in (harness, model, both)]
    table = {game: (before[game], *(a.get(game) for a in after)) for game in sorted(before)}
    lines = [f"budget {budget:,} attempts per mode"]
    for name, report, seconds in (("harness", harness, t_h), ("model", model, t_m), ("both", both, t_b)):
        updates = [u for u in report.get("learner", []) if "version" in u]
        gates = [u for u in report.get("learner", []) if "adopted" in u]
        adopted, spent = sum(g["adopted"] for g in gates), sum(g["rollouts"] for g in gates)
        gated = f" ({adopted} adopted by the policy gate, {spent:,} gate attempts)" if gates else ""
        lines.append(f"{name:8} rounds {len(report['rounds'])}, rollouts {rollouts(report):,}, learner updates "
                     f"{len(updates)}{gated}, {seconds:.0f}s")
    return table, lines, same_harness(harness, both, sorted(table))


def pts(x: float | None, y: float | None) -> str:
    """The difference in points of pass@2."""
    return "–" if x is None or y is None else f"{100 * (x - y):+.1f}"


def fmt(x: float | None) -> str:
    """A pass@2 figure, to the half point 200 tasks resolve (two decimals would round 0.775 to 0.78)."""
    return "–" if x is None else f"{x:.3f}"


def print_table(title: str, table: Comparison, spread: dict[str, tuple[str, str]] | None = None,
                same: dict[str, bool] | None = None) -> None:
    """Per game the four figures and the two differences the issue asks about (with their spread over seeds)."""
    print(title)
    print(f"{'game':22} {'untrained':>9} {'harness':>8} {'model':>8} {'both':>8} {'model-untr':>11} {'both-harn':>10}"
          + ("  same final harness" if same else ""))
    for game, (b, h, m, c) in table.items():
        extra = f"   ± {spread[game][0]} / ± {spread[game][1]}" if spread else ""
        extra += f"  {'yes' if same[game] else 'no':>18}" if same else ""
        print(f"{game:22} {fmt(b):>9} {fmt(h):>8} {fmt(m):>8} {fmt(c):>8} {pts(m, b):>11} {pts(c, h):>10}{extra}")


def split_by_harness(results: list[tuple[Comparison, dict[str, bool]]]) -> dict[str, tuple[str, str]]:
    """Per game, the mean co-evolution − harness-only over the seeds that ended on the same harness, and the others."""

    def mean_of(diffs: list[float]) -> str:
        return f"{100 * sum(diffs) / len(diffs):+.1f} over {len(diffs)}" if diffs else "–"

    out = {}
    for game in results[0][0]:
        rows = [(t[game][1], t[game][3], same[game]) for t, same in results]
        diffs = [(c - h, s) for h, c, s in rows if h is not None and c is not None]
        out[game] = (mean_of([d for d, s in diffs if s]), mean_of([d for d, s in diffs if not s]))
    return out


def mean(tables: list[Comparison]) -> Comparison:
    """Per game and column, the mean over seeds (None where a seed has no figure)."""
    out: Comparison = {}
    for game in tables[0]:
        cols = list(zip(*(t[game] for t in tables), strict=True))
        out[game] = tuple(None if any(x is None for x in col) else sum(col) / len(col)
                          for col in cols)
    return out


def standard_errors(tables: list[Comparison]) -> dict[str, tuple[str, str]]:
    """Per game, the standard error over seeds of the two differences, in points."""

    def se(diffs: list[float]) -> str:
        n = len(diffs)
        if n < 2:
            return "–"
        mu = sum(diffs) / n
        return f"{100 * (sum((d - mu) ** 2 for d in diffs) / (n - 1) / n) ** 0.5:.1f}"

    out = {}
    for game in tables[0]:
        rows = [[x for x in t[game] if x is not None] for t in tables]
        if any(len(row) != 4 for row in rows):  # a seed without a figure
            out[game] = ("–", "–")
            continue
        out[game] = (se([m - b for b, _, m, _ in rows]), se([c - h for _, h, _, c in rows]))
    return out


def print_means(held: str, results: dict[int, tuple[Comparison, dict[str, bool]]]) -> None:
    """The mean over seeds with its standard errors, and co-evolution − harness-only split by final harness."""
    tables = [t for t, _ in results.values()]
    print_table(f"mean over seeds {', '.join(map(str, results))}: held-out pass@2 ({held}); "
                "± the standard error over seeds of model-untr / both-harn, in points",
                mean(tables), standard_errors(tables))
    # On a shared final harness the difference is the co-evolved policy's; elsewhere the search's path too.
    print("co-evolution − harness-only, in points, over the seeds that ended on the same harness / the others:")
    for game, (shared, other) in split_by_harness(list(results.values())).items():
        print(f"{game:22} {shared:>14} / {other}")


def main() -> None:
    """Run the three modes per seed and print the comparisons."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", nargs="+", default=list(GAMES))
    parser.add_argument("--tasks", type=int, default=20, help="adaptation tasks per game")
    parser.add_argument("--heldout-tasks", type=int, default=50, help="held-out tasks per game")
    parser.add_argument("--heldout-split", choices=("test", "train"), default="test",
                        help="train: judge on a validation split, to try a setting without the test tasks")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the harness-only run (sets the budget)")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--step-weight", type=float, default=1.0, help="the learner's step-level advantage weight")
    parser.add_argument("--clip-eps-high", type=float, default=1.0,
                        help="the learner's upper clip range (0.2: the symmetric clip of the runs before 2026-11-27)")
    parser.add_argument("--learn-after-stall", action="store_true",
                        help="co-evolution's learner starts after the first round that ships no edit")
    parser.add_argument("--rest-barren", type=int, default=2, metavar="R",
                        help="model-only and co-evolution: a task whose last R played rounds failed every attempt "
                             "sits out R rounds (chosen on the validation split; 0: every task plays every round)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once (each on a log of its own)")
    parser.add_argument("--data-dir", type=Path, help="keep the logs here (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true",
                        help="a mode whose finished report is kept in the seed's directory is not run again "
                             "(a bench cut off midway goes on where it stopped)")
    args = parser.parse_args()
    data = args.data_dir or Path(tempfile.mkdtemp(prefix="hx-coevolution-"))
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {seed: pool.submit(compare, data / f"seed-{seed}", seed, args) for seed in args.seeds}
        results, failed = {}, {}
        for seed, future in futures.items():
            try:
                results[seed] = future.result()
            except SystemExit as exc:  # one seed's failed run: the other seeds' figures still count
                failed[seed] = str(exc)
    held = f"{args.heldout_tasks} {args.heldout_split} tasks per game, k=2"
    for seed, (table, lines, same) in results.items():
        print_table(f"seed {seed}: held-out pass@2 ({held}), {lines[0]}", table, same=same)
        print("\n".join(lines[1:]), end="\n\n")
    if len(results) > 1:
        print_means(held, {seed: (t, s) for seed, (t, _, s) in results.items()})
    for seed, why in failed.items():
        print(f"seed {seed}: no figures: {why} (resume it with hx coevolve --resume RUN on its log)")
    print(f"{time.perf_counter() - began:.0f}s in all")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
