#!/usr/bin/env python
"""What one step of an attempt costs the harness, at step 50 and at step 200: flat, or growing with the history?

Run from the repository root::

    python bench/step_cost.py                  # this tree and the base commit 272f197, 5 trial pairs
    python bench/step_cost.py --quick          # 3 trial pairs, fewer episodes
    python bench/step_cost.py --base ''        # this tree only
    python bench/step_cost.py --base REF       # against another commit

It starts its own nats-server in a temporary directory. Each measurement runs in a worker
subprocess (``--worker``) that plays the same scripted work: a ``script:`` model that calls
the ``act`` tool at every step (a fixed, deterministic list of completions), a tool that
answers with a short observation, four processors of the library that meet the
conversation at step_start, before_model and step_end (``history_window`` with a window
wider than the episode, ``step_model_router``, ``loop_detector``, ``sft_trajectories``),
and the full trace written to the log by the ``LogWriter``. An episode is timed from the
attempt's start to its ``AttemptFinished`` (``Agent.run``); µs/step is that time over the
steps taken, median over the episodes of a trial and then over trials.

Episodes of 50 and of 200 steps give the ratio 200/50 (goal: <= 1.2, a flat step cost).
With a base commit, the same worker runs on a ``git worktree add --detach`` of it, as a
subprocess with PYTHONPATH set to that worktree; base and this tree alternate, trial by
trial, so drift hits both, and the script prints hx-now/hx-base µs/step at 200 steps
(goal: <= 1/3). The worker imports only APIs present in both trees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hx import FunctionTool, HarnessConfig, ModelConfig, Task
from hx.processors.history_window import HistoryWindow
from hx.processors.loop_detector import LoopDetector
from hx.processors.sft_trajectories import SftTrajectories
from hx.processors.step_model_router import StepModelRouter
from schemas.messages import TaskSpec, ToolSchema
from schemas.tools import VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess

ROOT = Path(__file__).resolve().parent.parent
BASE = "272f197"
LENGTHS = (50, 200)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- the worker: the measured code path, with APIs present in both trees ----------------------------------------


def _completions(steps: int) -> list[dict[str, Any]]:
    """One tool call per step, each different (the loop detector sees no loop)."""
    moves = ("north", "east", "south", "west")
    return [{"content": "", "stop_reason": "tool_use", "usage": {"input_tokens": 40 * i, "output_tokens": 12},
             "tool_calls": [{"id": f"call_{i}", "name": "act",
                             "input": {"action": f"go {moves[i % 4]}", "times": 1 + i % 3}}]}
            for i in range(1, steps + 1)]


ACT = ToolSchema(name="act", description="Send one command to the text world.", input_schema={
    "type": "object", "required": ["action"], "properties": {
        "action": {"type": "string", "enum": [f"go {m}" for m in ("north", "east", "south", "west")]},
        "times": {"type": "integer"}}})


class Walk(Task):
    """A room-to-room walk: every move answers with a short room description."""

    system_prompt = "You explore a house. Call act with one command per step."

    def __init__(self, task_id: str) -> None:
        self.spec = TaskSpec(id=task_id, instruction="Visit every room, then stop.", benchmark="bench",
                             meta={"rooms": 12})
        self._n = 0
        self._tools = [FunctionTool(ACT, self._act)]

    def _act(self, action: str, times: int = 1) -> str:
        self._n += 1
        return (f"[{self._n}] You {action} ({times}x). You are in room {self._n % 12}: a dusty room with a "
                f"table, two chairs and a door to the {action.split()[-1]}. Nothing happens.")

    def tools(self) -> list[FunctionTool]:
        return self._tools

    async def reset(self) -> str:
        return self.spec.instruction

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="none", passed=False)  # sft_trajectories writes passed attempts only


async def _worker(url: str, steps: int, episodes: int, tag: str, out: Path) -> list[tuple[float, float]]:
    """Run ``episodes`` attempts of ``steps`` steps on ``url``; µs per step of each, wall clock and CPU."""
    harness = (HarnessConfig()
               .attach("step_start", HistoryWindow(keep_last=4 * steps))
               .attach(StepModelRouter.accepted_hooks(), StepModelRouter(schedule=((1, "main"),)))
               .attach(LoopDetector.accepted_hooks(), LoopDetector())
               .attach(SftTrajectories.accepted_hooks(), SftTrajectories(path=str(out / f"sft-{tag}.jsonl"))))
    models = ModelConfig(main="script:walk", provider_options={"script:walk": {"completions": _completions(steps)}})
    per_step: list[tuple[float, float]] = []
    async with connect(NatsSettings(url=url)) as conn:
        agent = models.agentic(harness, log=conn.log)
        for episode in range(episodes + 1):  # the first warms imports and caches, and is not counted
            began, cpu = time.perf_counter(), time.process_time()
            result = await agent.run(Walk(f"walk:{steps}:{episode}"), run_id=f"{tag}-{steps}-{episode}",
                                     max_steps=steps)
            took, cpu = time.perf_counter() - began, time.process_time() - cpu
            if result.steps != steps:
                raise SystemExit(f"episode took {result.steps} steps, not {steps}: {result.status} {result.reason}")
            if episode:
                per_step.append((took / steps * 1e6, cpu / steps * 1e6))
    return per_step


# --- the driver --------------------------------------------------------------------------------------------------


def run_worker(tree: Path, url: str, steps: int, episodes: int, tag: str, out: Path) -> list[list[float]]:
    """One worker subprocess with ``tree`` first on PYTHONPATH: its (wall, CPU) µs/step figures."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", url, "--steps", str(steps),
                           "--episodes", str(episodes), "--tag", tag, "--out", str(out)],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"worker in {tree} failed:\n{done.stderr[-2000:]}")
    figures: list[list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def add_worktree(ref: str, where: Path) -> Path:
    """A detached worktree of ``ref`` in ``where``."""
    path = where / f"base-{ref}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), ref], check=True)
    return path


def main(args: argparse.Namespace) -> int:
    trees = {"hx-now": ROOT}
    tmp = Path(tempfile.mkdtemp(prefix="hx-step-cost-"))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    print(f"hx step cost, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"  cores {os.cpu_count()}, {platform.python_implementation()} {platform.python_version()}, "
          f"load average {load()}")
    print(f"  this tree {commit or '?'}{' (plus uncommitted changes)' if _dirty() else ''}; base {args.base or '-'}; "
          f"{args.trials} trials x {args.episodes} episodes of {' and '.join(map(str, LENGTHS))} steps")
    if args.base:
        trees["hx-base"] = add_worktree(args.base, tmp)
    server = NatsProcess(tmp / "nats" / "store")
    server.start(detach=False)
    # (tree, steps) -> per trial, the medians over its episodes of (wall, CPU) µs/step
    results: dict[tuple[str, int], list[tuple[float, float]]] = {(t, n): [] for t in trees for n in LENGTHS}
    try:
        for trial in range(args.trials):
            order = list(trees) if trial % 2 == 0 else list(reversed(trees))
            for label in order:
                for steps in LENGTHS:
                    episodes = max(1, args.episodes * LENGTHS[-1] // steps)  # the same steps at each length
                    figures = run_worker(trees[label], server.url, steps, episodes, f"t{trial}-{label}", tmp)
                    results[(label, steps)].append((statistics.median(f[0] for f in figures),
                                                    statistics.median(f[1] for f in figures)))
            line = "  ".join(f"{label} {n}: {results[(label, n)][-1][1]:6.1f} ({results[(label, n)][-1][0]:6.1f})"
                             for label in trees for n in LENGTHS)
            print(f"  trial {trial + 1}  CPU (wall) µs/step  {line}  load {load()}", flush=True)
    finally:
        server.stop()
        if "hx-base" in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["hx-base"])],
                           check=False)
    print("medians over trials, µs/step of hx's own CPU (of the wall clock):")
    med = {key: tuple(statistics.median(t[i] for t in v) for i in (0, 1)) for key, v in results.items()}
    for label in trees:
        (short_wall, short), (long_wall, long) = med[(label, LENGTHS[0])], med[(label, LENGTHS[-1])]
        print(f"  {label:8} at {LENGTHS[0]} steps {short:6.1f} ({short_wall:6.1f}), at {LENGTHS[-1]} steps "
              f"{long:6.1f} ({long_wall:6.1f}); ratio {LENGTHS[-1]}/{LENGTHS[0]} {long / short:.2f} "
              f"({long_wall / short_wall:.2f}) (goal <= 1.2)")
    if "hx-base" in trees:
        now, base = results[("hx-now", LENGTHS[-1])], results[("hx-base", LENGTHS[-1])]
        pairs = [a[1] / b[1] for a, b in zip(now, base, strict=True)]
        (now_wall, now_cpu), (base_wall, base_cpu) = med[("hx-now", LENGTHS[-1])], med[("hx-base", LENGTHS[-1])]
        print(f"  hx-now/hx-base at {LENGTHS[-1]} steps: {now_cpu / base_cpu:.2f} ({now_wall / base_wall:.2f}) "
              "(goal <= 0.33); CPU ratio per trial " + ", ".join(f"{p:.2f}" for p in pairs))
    print(f"  load average at the end {load()}")
    return 0


def _dirty() -> bool:
    return bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=False).stdout.strip())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help="commit to compare with ('' for none; default %(default)s)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=3, help="episodes of the longest length per trial")
    parser.add_argument("--quick", action="store_true", help="3 trials, 1 episode of the longest length")
    parser.add_argument("--worker", metavar="NATS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=LENGTHS[-1], help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="w", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=".", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(_worker(args.worker, args.steps, args.episodes, args.tag, Path(args.out)))))
        sys.exit(0)
    if args.quick:
        args.trials, args.episodes = min(args.trials, 3), 1
    sys.exit(main(args))
