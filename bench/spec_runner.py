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


def run_spec(spec: dict[str, Any], *, concurrency: int, keep: Path | None = None, resume: str | None = None,
             run_id: str | None = None) -> Concluded:
    """Run ``spec`` in a fresh data directory (or ``keep``, where ``resume`` goes on with an earlier run); its
    conclusion. A claim spec is checked against the committed specs (``--registry bench/specs``). The run's
    progress goes to ``experiment.err`` in the data directory. A failure exits with hx's error."""
    with tempfile.TemporaryDirectory(prefix="hx-bench-spec-") as tmp:
        data = keep or Path(tmp)
        data.mkdir(parents=True, exist_ok=True)
        path = data / "spec.yaml"
        if resume is None or not path.exists():  # a resumed run's spec is the one it started with, as written
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
        command = [sys.executable, "-m", "hx", "--data-dir", str(data), "experiment", "run", str(path), "--json",
                   "--concurrency", str(concurrency), "--registry", str(SPECS),
                   *(["--resume", resume] if resume else ["--run-id", run_id] if run_id else [])]
        env = {k: v for k, v in os.environ.items() if k not in ("HX_NATS_URL", "HX_DATA_DIR")}
        began = time.perf_counter()
        with (data / "experiment.err").open("a") as err:
            done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                                  env={**env, "PYTHONHASHSEED": "0"})
        seconds = time.perf_counter() - began
        if done.returncode != 0:
            tail = (data / "experiment.err").read_text()[-4000:]
            sys.exit(f"hx experiment run failed (exit {done.returncode}):\n{tail}")
    return Concluded(spec, json.loads(done.stdout), seconds)


def _bounds(b: dict[str, Any]) -> str:
    return f"{b['estimate']:7.3f} [{b['low']:.3f}, {b['high']:.3f}]"


def print_conclusion(run: Concluded, title: str) -> None:
    """Per level the mean of each response variable (and per game, when the spec asks) with its 95% interval, each
    effect with its interval, size and keep-rule verdict, each interaction, and the falsification verdict."""
    c = run.conclusion
    variables = list(dict.fromkeys(s["variable"] for s in c["levels"]))
    print(f"\n== {title}: {c['units']} units, {run.seconds:.0f} s wall (run {c['run_id']}) ==")
    means = {(s["level"], s["variable"]): s["mean"] for s in c["levels"]}
    width = max(len(s["level"]) for s in c["levels"]) + 2
    column = max([28, *(len(v) + 2 for v in variables)])
    for variable in variables:
        print(f"{'level':<{width}}{variable:>{column}}")
        for level in dict.fromkeys(s["level"] for s in c["levels"]):
            if (level, variable) in means:
                print(f"{level:<{width}}{_bounds(means[(level, variable)]):>{column}}")
    named = max([26, *(len(e["variable"]) + 2 for e in c["effects"])])  # a per-game variable names its game
    print(f"\n{'effect':<44}{'variable':<{named}}{'difference [95%]':>28}{'d':>7}  verdict")
    for e in c["effects"]:
        print(f"{e['level'] + ' - ' + e['reference']:<44}{e['variable']:<{named}}{_bounds(e['difference']):>28}"
              f"{e['effect_size']['estimate']:>7.2f}  {e['verdict']}")
    for i in c.get("interactions", []):
        print(f"interaction {i['factors'][1]:<32}{i['variable']:<{named}}{_bounds(i['contrast']):>28}")
    print(f"falsified_if: {c['falsified']} ({c['detail']})")
