"""Run one projection runner in a process of its own, for the crash tests.

    python tests/projection_worker.py rebuild <nats_url> <projection> [--checkpoint-every N]
                                      [--pause-after-checkpoints K]
    python tests/projection_worker.py resume  <nats_url> <projection> [...]

``rebuild`` forgets the checkpoint and folds the whole log; ``resume`` restores the last
checkpoint (``load``) and catches up. Both print one JSON line when done:
``{"resumed_from", "digest", "position", "applied", "checkpoints"}``. With
``--pause-after-checkpoints K`` the runner stops for good right after its K-th
checkpoint (printing ``{"paused": [seq, index]}``), so a test can SIGKILL it at a moment
it knows to be mid-fold: a process may die at any point, and this is one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

import structlog

from projections.registry import projection
from projections.runner import Checkpoint, ProjectionRunner
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog


class WorkerRunner(ProjectionRunner[Any]):
    """A runner that counts its checkpoints and may pause forever after the K-th."""

    def __init__(self, log: EventLog, name: str, *, checkpoint_every: int, pause_after: int | None) -> None:
        super().__init__(log, projection(name), checkpoint_every=checkpoint_every)
        self.pause_after = pause_after
        self.checkpoints = 0

    async def checkpoint(self) -> Checkpoint:
        cp = await super().checkpoint()
        self.checkpoints += 1
        if self.pause_after is not None and self.checkpoints >= self.pause_after:
            print(json.dumps({"paused": [cp.seq, cp.index]}), flush=True)
            await asyncio.Event().wait()  # until the test kills this process
        return cp


async def main(args: argparse.Namespace) -> None:
    async with connect(NatsSettings(url=args.url)) as conn:
        runner = WorkerRunner(conn.log, args.projection, checkpoint_every=args.checkpoint_every,
                              pause_after=args.pause_after_checkpoints)
        if args.mode == "rebuild":
            await runner.rebuild()
        else:
            await runner.load()
            await runner.catch_up()
        print(json.dumps({
            "resumed_from": list(runner.resumed_from) if runner.resumed_from is not None else None,
            "digest": runner.digest,
            "position": list(runner.position),
            "applied": runner.applied,
            "checkpoints": runner.checkpoints,
        }), flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("rebuild", "resume"))
    parser.add_argument("url")
    parser.add_argument("projection")
    parser.add_argument("--checkpoint-every", type=int, default=2000)
    parser.add_argument("--pause-after-checkpoints", type=int, default=None)
    return parser.parse_args(argv)


if __name__ == "__main__":
    # Log lines go to stderr: stdout carries only the JSON report.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(main(parse(sys.argv[1:])))
