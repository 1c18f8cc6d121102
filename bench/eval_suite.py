#!/usr/bin/env python
"""The eval suite's two figures: ``--fast`` over 10,000 logged attempts, and the full default suite, random agent.

Run from the repository root::

    python bench/eval_suite.py                      # both figures (~1-3 min on two cores)
    python bench/eval_suite.py --attempts 2000      # a smaller log
    python bench/eval_suite.py --skip-full          # the fast figure only

It starts its own embedded nats-server in a temporary directory and writes nothing else.

1. Fast mode. It logs ``--attempts`` finished attempts (default 10,000) of the default suite's
   benchmark and free task ids, spread over runs of 1,000, each attempt as the runtime writes one
   (``attempt.started``, the main model's response, a tool call carrying an answer, its result,
   an environment observation, ``attempt.finished``: the events ``attempt_outputs`` folds),
   with ``append_batch``. A first ``--fast`` eval catches ``attempt_outputs`` up from nothing:
   that catch-up is printed apart. A second ``--fast`` eval then runs over the up-to-date
   projection: its wall (resume from the checkpoint, judge every criterion, score, append every
   verdict and score) per 1,000 attempts is the figure (goal < 1 s).
2. Full mode. The default suite played with the random agent (each family's starter harness,
   the suite's attempts and step cap, concurrency 4), judged and recorded: its wall (goal < 5 min).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import hx.environments  # noqa: F401 - registers the benchmark adapters
from hx.eval.runner import SMOKE_PREFIX, EvalOutcome, EvalRunner, PlaySettings, new_eval_id, plan
from hx.eval.suite import default_suite
from schemas.event import Event
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import ToolCall, ToolResult
from schemas.model import ModelResponse
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.outgoing import Entry
from streams.topology import trace_subject

PER_RUN = 1_000


def attempt(run: str, task: str, n: int) -> list[Event]:
    """One finished attempt's events, as ``attempt_outputs`` reads them (every third passes)."""
    passed, steps = n % 3 == 0, 3 + n % 17
    answer = f"answer {n} " * (1 + n % 40)
    return [AttemptStarted(run_id=run, round=0, task_id=task, attempt=n, model="random:", seed=n),
            ModelResponse(role="main", model="random:", step=1, content=answer),
            ToolInvoked(step=1, call=ToolCall(id=f"c{n}", name="final_answer", input={"answer": answer})),
            ToolReturned(step=1, result=ToolResult(call_id=f"c{n}", name="final_answer", output="ok")),
            EnvObservation(step=1, observation="done", done=True, success=passed),
            AttemptFinished(run_id=run, round=0, task_id=task, attempt=n, passed=passed, score=float(passed),
                            steps=steps)]


async def write_log(log: EventLog, tasks: list[str], attempts: int) -> float:
    """Append ``attempts`` attempts round-robin over ``tasks``; the seconds it took."""
    began = time.perf_counter()
    for first in range(0, attempts, PER_RUN):
        run = f"bench-{first // PER_RUN}"
        entries: list[Entry] = []
        for i in range(first, min(first + PER_RUN, attempts)):
            task, n = tasks[i % len(tasks)], i // len(tasks)
            subject = trace_subject(run, 0, task, n)
            entries += [Entry(subject, e, f"{run}/{task}/{n}/{k}") for k, e in enumerate(attempt(run, task, n))]
        await log.append_batch(entries)
    return time.perf_counter() - began


def line(what: str, outcome: EvalOutcome, wall: float) -> str:
    """One figure's line: wall, the runner's own timings, the composite."""
    parts = ", ".join(f"{k} {v:.3f}s" for k, v in outcome.timings.items())
    s = outcome.suite
    return (f"{what}: {wall:.3f}s wall ({parts}); {s.attempts:,} attempts, {outcome.verdicts:,} verdicts, "
            f"composite {s.composite.estimate:.3f} [{s.composite.low:.3f}, {s.composite.high:.3f}]")


async def main(args: argparse.Namespace) -> None:
    """Both figures, printed."""
    suite = default_suite()
    planned = plan(suite)
    tasks = sorted({p.task for p in planned if not p.task.startswith(SMOKE_PREFIX)})
    with tempfile.TemporaryDirectory(prefix="hx-eval-bench-") as tmp:
        async with connect(NatsSettings(data_dir=Path(tmp))) as conn:
            log = conn.log
            if args.attempts:
                wrote = await write_log(log, tasks, args.attempts)
                print(f"log: {args.attempts:,} attempts of {len(tasks)} task ids in {wrote:.1f}s")
                fast_only = [p for p in planned if not p.task.startswith(SMOKE_PREFIX)]
                runner = EvalRunner(conn, suite, fast_only)
                began = time.perf_counter()
                first = await runner.fast(new_eval_id())
                print(line("fast, projection caught up from nothing", first, time.perf_counter() - began))
                began = time.perf_counter()
                second = await runner.fast(new_eval_id())
                wall = time.perf_counter() - began
                print(line("fast, projection up to date", second, wall))
                print(f"fast: {wall / (second.suite.attempts / 1000):.3f}s per 1,000 attempts (goal < 1 s)")
            if not args.skip_full:
                runner = EvalRunner(conn, suite, planned)
                began = time.perf_counter()
                full = await runner.full(new_eval_id(), PlaySettings(concurrency=args.concurrency))
                wall = time.perf_counter() - began
                print(line(f"full default suite ({len(planned)} tasks), random agent", full, wall))
                print(f"full: {wall / 60:.2f} min (goal < 5 min)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--attempts", type=int, default=10_000, help="logged attempts for the fast figure (0: none)")
    parser.add_argument("--skip-full", action="store_true", help="no full-suite figure")
    parser.add_argument("--concurrency", type=int, default=4, help="attempts in flight in the full mode")
    asyncio.run(main(parser.parse_args()))
