"""What the arm-comparing benches share: run an experiment spec with ``hx experiment run`` and print its conclusion.

Each run is ``python -m hx --data-dir TMP experiment run SPEC --json`` in a process of its
own, on the embedded nats-server of a fresh temporary data directory (or ``keep``, to look at
the log afterwards). The spec is written next to the log as given, so a bench can derive a
smaller one (``--quick``) or another seed in code from the committed file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "bench" / "specs"


@dataclass
class Concluded:
    """One experiment run: its spec, its conclusion (``ExperimentConcluded`` as JSON) and its wall time."""

    spec: dict[str, Any]
    conclusion: dict[str, Any]
    seconds: float


def load(name: str) -> dict[str, Any]:
    """A committed bench spec (``bench/specs/<name>.yaml``) as plain data."""
    data: dict[str, Any] = yaml.safe_load((SPECS / f"{name}.yaml").read_text())
    return data


def first_tasks(spec: dict[str, Any], per_game: int) -> list[str]:
    """The spec's first ``per_game`` tasks of each game, in the spec's order."""
    kept: dict[str, int] = {}
    out = []
    for task in spec["tasks"]:
        game = ":".join(task.split(":")[:2])
        if kept.get(game, 0) < per_game:
            kept[game] = kept.get(game, 0) + 1
            out.append(task)
    return out


def validation_tasks(spec: dict[str, Any], per_game: int, skip: int) -> list[str]:
    """A smoke run's tasks: ``per_game`` dev-split tasks of each of the spec's games, after the first ``skip``.

    A ``--quick`` run must not spend the test range the committed spec is to be judged on once; and
    the first ``skip`` dev tasks are the ones its procedures adapt on, so they are not played either.
    """
    out = []
    for task in first_tasks(spec, per_game):
        bench, game, _, seed = task.split(":")
        out.append(f"{bench}:{game}:dev:{skip + int(seed)}")
    return out


def run_spec(spec: dict[str, Any], *, concurrency: int, keep: Path | None = None) -> Concluded:
    """Run ``spec`` in a fresh data directory (or ``keep``); its conclusion. A failure exits with hx's error."""
    with tempfile.TemporaryDirectory(prefix="hx-bench-spec-") as tmp:
        data = keep or Path(tmp)
        data.mkdir(parents=True, exist_ok=True)
        path = data / "spec.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        command = [sys.executable, "-m", "hx", "--data-dir", str(data), "experiment", "run", str(path), "--json",
                   "--concurrency", str(concurrency)]
        env = {k: v for k, v in os.environ.items() if k not in ("HX_NATS_URL", "HX_DATA_DIR")}
        began = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**env, "PYTHONHASHSEED": "0"})
        seconds = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"hx experiment run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return Concluded(spec, json.loads(done.stdout), seconds)


def _bounds(b: dict[str, Any]) -> str:
    return f"{b['estimate']:7.3f} [{b['low']:.3f}, {b['high']:.3f}]"


def print_conclusion(run: Concluded, title: str) -> None:
    """Per level the mean of each response variable with its 95% interval, each effect with its interval,
    size and keep-rule verdict, and the falsification verdict."""
    c = run.conclusion
    variables = run.spec["response_variables"]
    print(f"\n== {title}: {c['units']} units, {run.seconds:.0f} s wall (run {c['run_id']}) ==")
    print(f"{'level':<12}" + "".join(f"{v:>28}" for v in variables))
    means = {(s["level"], s["variable"]): s["mean"] for s in c["levels"]}
    for level in dict.fromkeys(s["level"] for s in c["levels"]):
        print(f"{level:<12}" + "".join(f"{_bounds(means[(level, v)]):>28}" if (level, v) in means else f"{'-':>28}"
                                       for v in variables))
    print(f"\n{'effect':<24}{'variable':<10}{'difference [95%]':>28}{'d':>7}  verdict")
    for e in c["effects"]:
        print(f"{e['level'] + ' - ' + e['reference']:<24}{e['variable']:<10}{_bounds(e['difference']):>28}"
              f"{e['effect_size']['estimate']:>7.2f}  {e['verdict']}")
    print(f"falsified_if: {c['falsified']} ({c['detail']})")


def print_across(runs: Iterable[Concluded]) -> None:
    """With several seeds: each effect on ``passed`` per seed, and its mean over seeds."""
    rows: dict[str, list[float]] = {}
    verdicts: dict[str, list[str]] = {}
    for run in runs:
        for e in run.conclusion["effects"]:
            if e["variable"] == "passed":
                name = f"{e['level']} - {e['reference']}"
                rows.setdefault(name, []).append(e["difference"]["estimate"])
                verdicts.setdefault(name, []).append(e["verdict"])
    print("\n== passed: effect per seed ==")
    for name, values in rows.items():
        shown = ", ".join(f"{v:+.3f} ({d})" for v, d in zip(values, verdicts[name], strict=True))
        print(f"{name:<24} mean {sum(values) / len(values):+.3f}: {shown}")


def run_seeds(committed: dict[str, Any], seeds: Sequence[int] | None, concurrency: int,
              derive: Callable[[dict[str, Any], int], dict[str, Any]]) -> list[Concluded]:
    """Run the committed spec once per seed (its own seed when none are given) as ``derive`` adapts it, print each
    conclusion, and the spread across seeds when there are several."""
    runs: list[Concluded] = []
    for seed in seeds or [committed.get("seed", 42)]:
        spec = derive(committed, seed)
        run = run_spec(spec, concurrency=concurrency)
        print_conclusion(run, f"{spec['title']}, seed {seed}")
        runs.append(run)
    if len(runs) > 1:
        print_across(runs)
    return runs
