#!/usr/bin/env python
"""What a replay costs next to the live round it replays: replay time / live time, same machine, one run.

Run from the repository root::

    python bench/replay.py                      # twx:coin, 10 tasks x 2 attempts; latency round 4 x 1, 0.2 s a call
    python bench/replay.py --tasks 20 --latency 0.5

It starts its own nats-server in a temporary directory and, in one process:

1. runs a round of TextWorldExpress coin with the ``random:`` agent (the live time is
   mostly the games), then replays it with ``hx.replay.replayer.replay_round``, the
   environment fed from the log (``--env log``, the default of ``hx replay``) and with the
   real games run again (``--env live``). Target: log replay / live <= 0.3.
2. runs a smaller round against a loopback OpenAI-compatible server that answers every
   call after a fixed delay (a model's latency; it picks a valid action at random, seeded
   by the request), then replays it: the replay feeds the responses from the log, so it
   pays no latency.

Live time is the rollout's wall time (attempts, the log writes, the round's report folded
back from the log); replay time is ``replay_round``'s wall time (reading the round,
re-running every attempt, comparing every event body). Both replays must be identical.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import hx.environments  # noqa: F401 - benchmark adapters register themselves on import
from hx.environments.registry import benchmark
from hx.environments.rollout import Rollout, RolloutSettings
from hx.harnesses import starter_harness
from hx.replay.replayer import Env, ReplayReport, replay_round
from hx.runtime.models import ModelConfig
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.server import NatsProcess


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """A tool call of ``act`` with one of its enumerated actions, chosen by a seed drawn from the request."""
    rng = random.Random(hashlib.sha256(json.dumps(request, sort_keys=True).encode()).digest())
    for tool in request.get("tools") or ():
        function = tool.get("function") or {}
        action = ((function.get("parameters") or {}).get("properties") or {}).get("action") or {}
        if function.get("name") == "act" and action.get("enum"):
            choice = action["enum"][rng.randrange(len(action["enum"]))]
            call = {"id": "call_0", "type": "function",
                    "function": {"name": "act", "arguments": json.dumps({"action": choice})}}
            return {"model": "slow-stand-in", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [call]}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10}}
    return {"model": "slow-stand-in", "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": "done"}}]}


@contextmanager
def slow_model(latency_s: float) -> Iterator[str]:
    """A loopback chat-completions server answering after ``latency_s``; yields its base URL."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            time.sleep(latency_s)
            body = json.dumps(_answer(request)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def live_round(conn: Connection, run_id: str, model: str, tasks: int, attempts: int, max_steps: int,
                     concurrency: int) -> tuple[float, int, int]:
    """Run one round live; (wall seconds, attempts, steps)."""
    bench = benchmark("twx")
    try:
        ids = bench.task_ids("coin", "dev", limit=tasks)
        rollout = Rollout([bench], ModelConfig(main=model), starter_harness("textworld"), log=conn.log,
                          harness_source="starter:textworld",
                          settings=RolloutSettings(attempts=attempts, max_steps=max_steps, concurrency=concurrency))
        began = time.perf_counter()
        outcome = await rollout.rollout(run_id, ids)
        return time.perf_counter() - began, len(outcome.results), outcome.report.steps
    finally:
        bench.close()


async def timed_replay(conn: Connection, run_id: str, env: Env) -> tuple[float, ReplayReport]:
    """Replay round 0 of a run; (wall seconds, report)."""
    began = time.perf_counter()
    report = await replay_round(conn, run_id, 0, env=env)
    return time.perf_counter() - began, report


def line(label: str, live: float, replayed: float, report: ReplayReport) -> str:
    """One result line."""
    verdict = "identical" if report.identical else f"DIVERGED ({report.divergence and report.divergence.path})"
    return (f"{label:<40} live {live:7.2f} s   replay {replayed:6.2f} s   ratio {replayed / live:5.3f}   "
            f"{report.attempts} attempts, {report.events:,} events, {verdict}")


async def main(args: argparse.Namespace) -> None:
    """Run both rounds and their replays; print the figures."""
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    tmp = Path(tempfile.mkdtemp(prefix="hx-bench-replay-"))
    server = NatsProcess(tmp / "nats" / "store")
    server.start(detach=False)
    try:
        async with connect(NatsSettings(url=server.url)) as conn:
            live, attempts, steps = await live_round(conn, "bench-random", "random:", args.tasks, 2, 100, 4)
            print(f"random: round: {attempts} attempts, {steps:,} steps of twx:coin")
            for env in ("log", "live"):
                took, report = await timed_replay(conn, "bench-random", env)
                print(line(f"random:, replay --env {env}", live, took, report))
            with slow_model(args.latency) as url:
                model = f"openai:slow-stand-in@{url}"
                live, attempts, steps = await live_round(conn, "bench-latency", model, args.latency_tasks, 1,
                                                         args.latency_steps, 4)
            print(f"model with {args.latency:g} s latency: {attempts} attempts, {steps:,} steps "
                  f"({steps * args.latency:.1f} s of model calls in all, 4 at a time)")
            took, report = await timed_replay(conn, "bench-latency", "log")
            print(line(f"{args.latency:g} s/call model, replay --env log", live, took, report))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=10, help="coin tasks of the random: round (2 attempts each)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the stand-in model takes per call")
    parser.add_argument("--latency-tasks", type=int, default=4, help="coin tasks of the latency round (1 attempt)")
    parser.add_argument("--latency-steps", type=int, default=25, help="step cap of the latency round")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
