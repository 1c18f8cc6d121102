#!/usr/bin/env python
"""How long an ``hx`` command takes to start: median of N runs each, now and at a base commit.

Run from the repository root::

    python bench/startup.py                  # 10 runs each, against a worktree of 272f197 (before issue 36)
    python bench/startup.py --base HEAD~3    # against another commit
    python bench/startup.py --no-base        # this tree only
    python bench/startup.py --runs 20

It makes a small run first (``hx --data-dir D run --bench twx:coin --tasks 1 --attempts 1``,
the random agent, the embedded nats-server under a temporary data directory; needs Java for
the game), then times, as fresh processes (``python -m hx``, ``PYTHONPATH`` set to the tree):

- ``python -c pass``: the interpreter alone, the floor;
- ``hx --help``;
- ``hx --data-dir D trace RUN TASK``: the run's one attempt as a transcript (it starts the
  embedded server, reads the attempt's subject, stops the server);
- ``hx --data-dir D projections status``.

With a base (``--base REF``, default 272f197) it checks REF out with ``git worktree add
--detach`` into a temporary directory and times the same commands with ``PYTHONPATH`` set to
it, on the same data directory, alternating with this tree run by run so that the machine's
load hits both alike; the worktree is removed at the end. Each command runs once before the
timed runs (bytecode compiled, server binary in the page cache). It prints, per command, the
median wall time and the median CPU time of the process and its children (user + system;
it moves less than wall time when other processes share the cores), and the ratio now/base.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = "272f197"
"""The last commit before issue 36 (every command imported every other; nats imported aiohttp)."""
RUN, TASK = "startup", "twx:coin:dev:0"


@dataclass
class Timings:
    """The wall and CPU seconds of one command's runs from one tree."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HX_")}
    env["PYTHONPATH"] = str(tree)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: Sequence[str], tree: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv`` with ``tree`` on PYTHONPATH; it must succeed."""
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=_env(tree), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {tree} (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return wall, _children_cpu() - cpu


def commands(data_dir: Path) -> dict[str, list[str]]:
    """The timed commands by label."""
    hx = [sys.executable, "-m", "hx"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "hx --help": [*hx, "--help"],
        "hx trace RUN TASK": [*hx, "--data-dir", str(data_dir), "trace", RUN, TASK],
        "hx projections status": [*hx, "--data-dir", str(data_dir), "projections", "status"],
    }


def make_run(data_dir: Path, tree: Path) -> None:
    """One attempt of twx:coin with the random agent, on the embedded server under ``data_dir``."""
    timed([sys.executable, "-m", "hx", "--data-dir", str(data_dir), "run", "--bench", "twx:coin", "--tasks", "1",
           "--attempts", "1", "--max-steps", "10", "--run-id", RUN, "--json",
           "--out", str(data_dir.parent / "results.json")], tree)


@contextmanager
def worktree(ref: str, where: Path) -> Iterator[Path]:
    """A detached worktree of ``ref`` at ``where``, removed afterwards."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), ref], check=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False)


def measure(trees: dict[str, Path], data_dir: Path, runs: int) -> dict[str, dict[str, Timings]]:
    """Timings by command label and tree label; the trees alternate run by run."""
    cmds = commands(data_dir)
    out = {label: {name: Timings() for name in trees} for label in cmds}
    for tree in trees.values():  # warm up: bytecode written, the server binary and the store cached
        for argv in cmds.values():
            timed(argv, tree)
    for _ in range(runs):
        for name, tree in trees.items():
            for label, argv in cmds.items():
                wall, cpu = timed(argv, tree)
                out[label][name].wall.append(wall)
                out[label][name].cpu.append(cpu)
    return out


def report(results: dict[str, dict[str, Timings]], runs: int) -> None:
    """Print each command's medians per tree, and the ratios now/base when there is a base."""
    med = statistics.median
    for label, by_tree in results.items():
        now = by_tree["now"]
        line = f"{label:<24} now  {med(now.wall):.3f} s (cpu {med(now.cpu):.3f} s)"
        base = by_tree.get("base")
        if base is not None:
            line += (f"   base {med(base.wall):.3f} s (cpu {med(base.cpu):.3f} s)"
                     f"   now/base {med(now.wall) / med(base.wall):.2f} (cpu {med(now.cpu) / med(base.cpu):.2f})")
        print(line)
    print(f"(medians of {runs} runs; wall = elapsed, cpu = user + system of the process and its children)")


def main() -> None:
    """Parse the options, make the run, time the commands and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per command and tree (default 10)")
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"commit to compare with (default {DEFAULT_BASE})")
    parser.add_argument("--no-base", action="store_true", help="time this tree only")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, Python {platform.python_version()}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="hx-startup-") as tmp:
        data_dir = Path(tmp) / "data"
        started = time.perf_counter()
        make_run(data_dir, ROOT)
        print(f"made run {RUN} ({TASK}, one attempt) in {time.perf_counter() - started:.1f} s")
        trees = {"now": ROOT}
        if args.no_base:
            results = measure(trees, data_dir, args.runs)
        else:
            with worktree(args.base, Path(tmp) / "base") as base:
                trees["base"] = base
                print(f"base: {args.base} in a worktree ({base})")
                results = measure(trees, data_dir, args.runs)
        report(results, args.runs)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
