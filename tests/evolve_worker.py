"""Run an evolution on the toy world in a process of its own, for the kill-and-resume tests.

    python tests/evolve_worker.py <nats_url> <run_id> [--resume] [--pause-at ROUND:STAGE] [--risk-threshold R]
                                  [--data-dir DIR]

Prints one JSON line when the run ends: the live variants and their digests, each
round's decision (outcome and ships), and the held-out figures. With ``--pause-at`` the
process stops for good when round ROUND reaches STAGE (printing ``{"paused": ...}``), so a
test can SIGKILL it at a moment it knows: a process may die at any point, and this is one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from toyworld import ToyWorld

from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.job import EvolveJob, EvolveRequest, TaskChoice
from hx.aegis.session import Parts, new_job, run_evolution
from hx.aegis.settings import EvolveSettings, Progress
from hx.environments.rollout import RolloutSettings
from hx.harnesses import starter_harness
from streams.config import NatsSettings
from streams.connection import connect
from streams.signing import LedgerKey

SPECS = ["toyworld:rooms", "toyworld:bell"]


def job(run_id: str, bench: ToyWorld, rounds: int = 4, risk: float = 0.7) -> EvolveJob:
    """The test job: both toy games, small and fast."""
    request = EvolveRequest(TaskChoice(tuple(SPECS), adaptation=16, heldout=10), model="random:",
                            rollout=RolloutSettings(attempts=2, concurrency=4, max_steps=30, seed=3),
                            loop=EvolveSettings(rounds=rounds, patience=rounds, strategy="ensemble",
                                                risk_threshold=risk))
    return new_job(run_id, [bench], request, harness=starter_harness("textworld"),
                   harness_source="starter:textworld")


async def main(url: str, run_id: str, resume: bool, pause: str | None, risk: float, data_dir: str | None) -> None:
    bench = ToyWorld()
    stop_round, _, stop_stage = (pause or "").partition(":")

    def stage(t: int, what: str) -> None:
        if pause and t == int(stop_round) and what == stop_stage:
            print(json.dumps({"paused": [t, what]}), flush=True)
            time.sleep(3600)  # frozen here until the test kills the process

    async with connect(NatsSettings(url=url)) as conn:
        report = await run_evolution(conn, [bench], job(run_id, bench, risk=risk),
                                     Parts(OfflineEvolver(), Progress(stage=stage),
                                           key=LedgerKey.of(data_dir) if data_dir else None), resume=resume)
    print(json.dumps({"variants": report.variants, "routing": report.routing,
                      "rounds": [[r.round, r.outcome, list(r.shipped)] for r in report.rounds],
                      "rollouts": [r.rollouts for r in report.rounds],
                      "heldout": [[g, b.pass_at_2 if b else None, a.pass_at_2 if a else None]
                                  for g, b, a in report.games()]}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("run_id")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--pause-at")
    parser.add_argument("--risk-threshold", type=float, default=0.7)
    parser.add_argument("--data-dir")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.run_id, args.resume, args.pause_at, args.risk_threshold, args.data_dir))
