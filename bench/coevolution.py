"""Harness-only, model-only and co-evolution on the same games and the same rollout budget.

Runs ``hx coevolve`` three times on one embedded log, one mode at a time:

1. ``--mode harness`` (the policy frozen at its first version) for ``--rounds`` rounds; the
   attempts it spends (main, gate and retry rollouts) become the budget of the other two;
2. ``--mode model`` (the harness frozen) and 3. ``--mode both``, each with ``--budget`` set
   to that figure and room for more rounds, so all three spend the same rollouts.

Every run starts from the same fresh policy (same kind and seed) and the same starter
harness, and is judged on the same frozen held-out split (the test split, never evolved
or trained on). The untrained policy's held-out pass@2 is each run's "before" figure. It
prints, per game, held-out pass@2: untrained, harness-only, model-only, co-evolution, and
the two differences the issue asks about (model-only minus untrained; co-evolution minus
harness-only), plus each run's rollouts and wall time.

    python bench/coevolution.py                     # coin, mapreader, cookingworld
    python bench/coevolution.py --tasks 10 --heldout-tasks 20 --rounds 3   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GAMES = ("twx:coin", "twx:mapreader", "twx:cookingworld")


def coevolve(data: Path, mode: str, args: argparse.Namespace, *, budget: int,
             rounds: int) -> tuple[dict[str, Any], float]:
    """One ``hx coevolve`` run; its JSON report and wall time."""
    cmd = [sys.executable, "-m", "hx", "--data-dir", str(data), "coevolve", "--mode", mode, "--json",
           "--tasks", str(args.tasks), "--heldout-tasks", str(args.heldout_tasks), "--rounds", str(rounds),
           "--attempts", "2", "--max-steps", str(args.max_steps), "--concurrency", str(args.concurrency),
           "--seed", str(args.seed), "--learner-seed", str(args.seed), "--lr", str(args.lr),
           "--epochs", str(args.epochs), "--window", str(args.window),
           "--run-id", f"bench-{mode}-{int(time.time())}", "--out", str(data / f"{mode}.json")]
    if budget:
        cmd += ["--budget", str(budget)]
    for game in args.games:
        cmd += ["--bench", game]
    began = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    seconds = time.perf_counter() - began
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"hx coevolve --mode {mode} failed ({done.returncode})")
    sys.stderr.write(done.stderr)
    return json.loads(done.stdout), seconds


def heldout(report: dict[str, Any], which: str) -> dict[str, float]:
    """Per game: held-out pass@2 of a report, ``before`` the first round or ``after`` the last."""
    scored = report.get(f"heldout_{which}") or {}
    return {g["game"]: g["pass_at_2"] for g in scored.get("games", []) if g.get("pass_at_2") is not None}


def rollouts(report: dict[str, Any]) -> int:
    """Attempts the run's rounds spent."""
    return sum(row["rollouts"] for row in report["rounds"])


def main() -> None:
    """Run the three modes and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", nargs="+", default=list(GAMES))
    parser.add_argument("--tasks", type=int, default=20, help="adaptation tasks per game")
    parser.add_argument("--heldout-tasks", type=int, default=30, help="held-out tasks per game")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the harness-only run (sets the budget)")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, help="keep the log here (default: a temporary directory)")
    args = parser.parse_args()
    data = args.data_dir or Path(tempfile.mkdtemp(prefix="hx-coevolution-"))
    harness, t_h = coevolve(data, "harness", args, budget=0, rounds=args.rounds)
    budget = rollouts(harness)
    model, t_m = coevolve(data, "model", args, budget=budget, rounds=4 * args.rounds)
    both, t_b = coevolve(data, "both", args, budget=budget, rounds=4 * args.rounds)
    before = heldout(harness, "before")
    after = {name: heldout(r, "after") for name, r in (("harness", harness), ("model", model), ("both", both))}
    print(f"held-out pass@2 ({args.heldout_tasks} test tasks per game, k=2), budget {budget:,} attempts per mode")
    print(f"{'game':22} {'untrained':>9} {'harness':>8} {'model':>8} {'both':>8} {'model-untr':>11} {'both-harn':>10}")
    for game in sorted(before):
        b, h, m, c = before[game], after["harness"].get(game), after["model"].get(game), after["both"].get(game)

        def pts(x: float | None, y: float | None) -> str:
            return "–" if x is None or y is None else f"{100 * (x - y):+.1f}"

        def fmt(x: float | None) -> str:
            return "–" if x is None else f"{x:.2f}"
        print(f"{game:22} {fmt(b):>9} {fmt(h):>8} {fmt(m):>8} {fmt(c):>8} {pts(m, b):>11} {pts(c, h):>10}")
    for name, report, seconds in (("harness", harness, t_h), ("model", model, t_m), ("both", both, t_b)):
        updates = [u for u in report.get("learner", []) if "version" in u]
        print(f"{name:8} rounds {len(report['rounds'])}, rollouts {rollouts(report):,}, learner updates "
              f"{len(updates)}, {seconds:.0f}s")


if __name__ == "__main__":
    main()
