#!/usr/bin/env python
"""How big ``hx export --trajectories`` is against the run's own events, now and at a base commit.

Makes an evolution run with long attempts (``hx evolve`` on the embedded defaults in a temp
data dir: coin only, a 100-step cap, the random agent) unless given one, then prints:

- the run's raw event bytes: the bodies of its ``HX_TRACE`` messages, inflated (what the
  log holds before compression), in all and for the main rollouts ``--trajectories`` writes;
- the trajectories this tree's ``hx export --trajectories`` writes (bytes, time) and the ratio
  to the raw bytes (goal: at most 2);
- the same export made by the hx of ``--base REF`` (a ``git worktree add --detach`` of it,
  run with its own tree on ``PYTHONPATH``), for comparison.

::

    python bench/export_size.py                       # make a run (~1 min), export it here and at 272f197
    python bench/export_size.py --tasks 12            # a bigger run
    python bench/export_size.py --data-dir D --run R  # an existing run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import nats.errors
from evolve_runs import header, load
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from hx.environments.splits import round_roles
from schemas.envelope import HX_ENCODING, inflate
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.topology import TRACE, TraceAddress, trace_filter

ROOT = Path(__file__).resolve().parent.parent
BASE = "272f197"
"""The last commit before trajectories were written once per attempt (every event carried its conversation)."""


async def raw_bytes(conn: Connection, run_id: str) -> tuple[Counter[int], int]:
    """The run's trace bodies, inflated: bytes per trace round, and the message count."""
    sub = await conn.js.pull_subscribe(trace_filter(run_id), stream=TRACE.name, config=ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, mem_storage=True, inactive_threshold=60.0))
    per_round: Counter[int] = Counter()
    count = 0
    try:
        while True:
            try:
                msgs = await sub.fetch(512, timeout=2.0)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for msg in msgs:
                encoding = (msg.headers or {}).get(HX_ENCODING)
                body = inflate(encoding, msg.data) if encoding else msg.data
                per_round[TraceAddress.parse(msg.subject).round or 0] += len(body)
                count += 1
            if msgs[-1].metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return per_round, count


async def measure_raw(data_dir: Path, run_id: str) -> tuple[int, int, int]:
    """(all the run's raw trace bytes, those of its main rollouts, trace messages)."""
    async with connect(NatsSettings(data_dir=data_dir)) as conn:
        per_round, count = await raw_bytes(conn, run_id)
        roles = await round_roles(conn.log, run_id)
    main = sum(n for r, n in per_round.items() if r in roles and roles[r].purpose == "main")
    return sum(per_round.values()), main, count


def hx(tree: Path, *args: str) -> float:
    """Run ``python -m hx ARGS`` with ``tree`` first on ``PYTHONPATH``; its wall time (raise if it fails)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hx", *args], cwd=tree, env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"hx {' '.join(args[:4])} ... ({tree}) exited {done.returncode}:\n{done.stderr[-2000:]}")
    return time.perf_counter() - began


def trajectory_bytes(out: Path) -> tuple[int, int, int]:
    """(bytes, files, largest file) of the ``R<n>/trajectories/`` files of an export."""
    sizes = [p.stat().st_size for p in out.glob("R*/trajectories/*.jsonl")]
    return sum(sizes), len(sizes), max(sizes, default=0)


def export(tree: Path, data_dir: Path, run_id: str, out: Path) -> tuple[int, int, int, float]:
    """``hx export RUN OUT --trajectories`` by the hx in ``tree``: trajectory bytes, files, largest, seconds."""
    took = hx(tree, "--data-dir", str(data_dir), "export", run_id, str(out), "--trajectories")
    return (*trajectory_bytes(out), took)


def base_tree(ref: str, where: Path) -> Path:
    """A detached worktree of ``ref`` at ``where`` (removed by ``drop_tree``)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)
    return where


def drop_tree(where: Path) -> None:
    """Remove a worktree ``base_tree`` made."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False,
                   capture_output=True)


def mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB"


def main(args: argparse.Namespace) -> int:
    header("hx export --trajectories: size against the run's own events")
    tmp = Path(tempfile.mkdtemp(prefix="hx-export-size-"))
    try:
        if args.data_dir:
            data_dir, run_id = Path(args.data_dir).resolve(), args.run
        else:
            data_dir, run_id = tmp / "data", "bench-export-size"
            job = ["--bench", "twx:coin", "--tasks", str(args.tasks), "--heldout-tasks", "2", "--rounds",
                   str(args.rounds), "--max-steps", str(args.max_steps), "--seed", "0"]
            print(f"  making the run: hx evolve {' '.join(job)} ...", flush=True)
            took = hx(ROOT, "--data-dir", str(data_dir), "evolve", "--run-id", run_id,
                      "--out", str(tmp / "report.json"), *job)
            stored = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
            print(f"  hx evolve took {took:.1f} s; data dir {mb(stored)}")
        raw, main_raw, messages = asyncio.run(measure_raw(data_dir, run_id))
        print(f"\nrun {run_id}: {messages:,} trace messages, raw (inflated) bodies {mb(raw)}, of which the main "
              f"rollouts' {mb(main_raw)}")
        size, files, largest, took = export(ROOT, data_dir, run_id, tmp / "export")
        print(f"\n  this tree:  trajectories {mb(size)} in {files} files (largest {mb(largest)}), export {took:.1f} s")
        print(f"    / raw bytes of the run:           {size / raw:.2f}  (goal <= 2)")
        print(f"    / raw bytes of the main rollouts: {size / main_raw:.2f}")
        if args.base:
            tree = base_tree(args.base, tmp / "base")
            try:
                # An older hx may not read a log this tree wrote (summary channels): the base exports a run it made
                # itself with the same job and seed (the same attempts), or the given data dir.
                b_data, b_raw = data_dir, raw
                if not args.data_dir:
                    b_data = tmp / "data-base"
                    hx(tree, "--data-dir", str(b_data), "evolve", "--run-id", run_id, "--out",
                       str(tmp / "report-base.json"), *job)
                    b_raw, _, b_messages = asyncio.run(measure_raw(b_data, run_id))
                    print(f"  the base's own run: {b_messages:,} trace messages, raw bodies {mb(b_raw)}")
                b_size, b_files, b_largest, b_took = export(tree, b_data, run_id, tmp / "export-base")
            finally:
                drop_tree(tree)
            print(f"  at {args.base}: trajectories {mb(b_size)} in {b_files} files (largest {mb(b_largest)}), "
                  f"export {b_took:.1f} s")
            print(f"    / raw bytes of its run: {b_size / b_raw:.2f}; this tree writes {size / b_size:.3f} of it")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n  load average at the end {load()}")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    p.add_argument("--data-dir", help="an existing data dir (with --run) instead of making a run")
    p.add_argument("--run", help="the evolution run to export in --data-dir")
    p.add_argument("--tasks", type=int, default=6, help="adaptation tasks of the run made (coin's dev split)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the run made")
    p.add_argument("--max-steps", type=int, default=100, help="the step cap of the run made's attempts")
    p.add_argument("--base", default=BASE, help="the commit to compare with ('' to skip)")
    args = p.parse_args(argv)
    if args.data_dir and not args.run:
        p.error("--data-dir needs --run")
    return args


if __name__ == "__main__":
    sys.exit(main(parse()))
