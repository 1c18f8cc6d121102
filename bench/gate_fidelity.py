#!/usr/bin/env python
"""Does the gate keep its promise? Shipped harnesses re-run on their base's solved tasks with many fresh seeds.

Run from the repository root::

    python bench/gate_fidelity.py                       # both gates, seeds 0 1 2 (see --help for the sizes)
    python bench/gate_fidelity.py --quick               # one seed a gate, 2 rounds on 4 tasks a game, 8 seeds a side
    python bench/gate_fidelity.py --gates retry --seeds 0 1

For each gate (``hx evolve --gate-seesaw retry|sequential``) and seed it runs ``python -m hx
evolve`` in a fresh temporary data directory (embedded nats-server): random agent, offline
evolver, ``twx:coin`` and ``twx:mapreader``, ``--tasks`` dev tasks a game to adapt on, held out
on the first ``--heldout-tasks`` tasks of the *train* split (never test). Its wall time is the
main job's. Then, on the same log under run id ``<run>-fidelity``, through hx's own rollout code
(``Rollout.run_round`` with a ``RoundLabel`` whose ``first_attempt`` is ``FIRST``, numbers no
evolution round uses), for every ship and fork on the ledger (a fork: the tasks of the clusters it
takes over) and every candidate the seesaw rejected, the base harness (the variant's before it)
and the new one play the base's solved tasks of that round ``N`` times each, on the same seeds.

Per (ship, task) pair: both pass rates, the difference with a one-sided 95 % upper bound
(Newcombe's hybrid score interval), and regressed = a fall of at least ``--drop`` whose bound is
below zero (``fidelity_counts``). Prints per gate the shipped regression rate (regressed pairs
over pairs, Wilson 95 %), the rate of seesaw rejects with no pair regressed ("would have been
fine"), the held-out pass@2 before and after with the paired gain (bootstrap over tasks, pooled
over seeds), the main job's wall time, then the ratios sequential/retry.

``--quick`` took about 2 minutes on 2 shared cores (2026-11-28); ``--seeds 0 1 --rounds 3 --tasks 6
--heldout-tasks 10`` (46 seeds a side) about 23 minutes, most of it the re-runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evolve_runs import header
from fidelity_counts import (
    ALPHA,
    DROP,
    POWER,
    PairVerdict,
    choose_seeds,
    fine_rate,
    judge,
    shipped_regression_rate,
    smallest_drop,
)

import hx.environments  # noqa: F401 - benchmark adapters register themselves on import
from hx.aegis.session import recorded_job
from hx.cli.run import select_tasks
from hx.environments.registry import Benchmark
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel, round_outcomes
from hx.environments.splits import Splits, round_roles
from hx.gate.sequential import Tries
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.intervals import Interval, paired_difference, task_mean
from hx.runtime.models import ModelConfig
from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from schemas.ledger import HeldoutScored, VariantForked
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog

ROOT = Path(__file__).resolve().parent.parent
GATES = ("retry", "sequential")
FIRST = 50_000
"""First attempt number of the re-runs: far from the main rollouts' ``0 .. k-1`` and the gates' fresh seeds."""


@dataclass(frozen=True)
class Change:
    """A harness change to re-run: a ship, a fork or a rejected candidate, its base, and the tasks to play."""

    kind: str
    """``ship``, ``fork`` or ``rejected``."""
    round: int
    variant: str
    name: str
    """The candidates it carried, joined."""
    base: HarnessConfig
    after: HarnessConfig
    tasks: tuple[str, ...]
    """The base's solved tasks that round (a fork: of the clusters it takes over)."""
    rates: tuple[float, ...]
    """Their pass rates in the base's main rollout that round."""


@dataclass
class Played:
    """One evolution run and what its re-runs found."""

    gate: str
    seed: int
    wall_s: float
    pairs: dict[str, list[PairVerdict]] = field(default_factory=dict)
    """Change (``kind round variant name``) -> its pairs."""
    rejected: list[list[PairVerdict]] = field(default_factory=list)
    heldout: tuple[dict[str, list[float]], dict[str, list[float]]] = ({}, {})
    """Per held-out task, solved in its attempts (pass@k as 0/1): before the first round, after the last."""
    base_rates: list[float] = field(default_factory=list)
    """The main rollouts' pass rates of the solved tasks re-run (what the seeds are sized on)."""
    seeds: int = 0


def changes_of(ledger: RunLedger) -> list[Change]:
    """Every ship and fork on the ledger, and every candidate the seesaw rejected, with base harness and tasks."""
    out: list[Change] = []
    for record in ledger.shipments:
        base = ledger.variants[record.on].before(record.position)
        digested = ledger.rounds[record.round].digested
        if base is None or digested is None:
            continue
        clusters = set(record.event.clusters) if isinstance(record.event, VariantForked) else None
        solved = [d for d in digested.digests if d.variant == record.on and d.solved
                  and (clusters is None or d.cluster in clusters)]
        made = next(v for v in ledger.variants[record.variant].versions if v.position == record.position)
        out.append(Change(record.kind, record.round, record.on, "+".join(record.candidates),
                          HarnessConfig.from_spec(base.harness), HarnessConfig.from_spec(made.harness),
                          tuple(d.task for d in solved), tuple(d.passes / d.attempts for d in solved)))
    for cand in ledger.candidates.values():
        gate = cand.gate
        if gate is None or gate.outcome != "reject" or gate.first_failure != "seesaw":
            continue
        base = ledger.variants[gate.variant].before(cand.gate_position)
        digested = ledger.rounds[gate.round].digested
        if base is None or digested is None:
            continue
        base_config = HarnessConfig.from_spec(base.harness)
        solved = [d for d in digested.digests if d.variant == gate.variant and d.solved]
        out.append(Change("rejected", gate.round, gate.variant, cand.id, base_config,
                          apply(base_config, cand.proposal.operations), tuple(d.task for d in solved),
                          tuple(d.passes / d.attempts for d in solved)))
    return out


async def _heldout(log: EventLog, run_id: str, scored: HeldoutScored) -> dict[str, list[float]]:
    """Per held-out task of one evaluation, 1.0 when any of its attempts passed (its trace rounds, from the log)."""
    roles = await round_roles(log, run_id)
    solved: dict[str, list[float]] = {}
    trace_round = scored.trace_round
    while len(solved) < scored.tasks and trace_round in roles and roles[trace_round].purpose == "heldout":
        for o in await round_outcomes(log, run_id, trace_round):
            solved[o.task_id] = [max(solved.get(o.task_id, [0.0])[0], float(o.passed))]
        trace_round += 1
    return solved


class Rerun:
    """Plays harnesses on tasks ``N`` times each under the bench's own run id, each (harness, task) once."""

    def __init__(self, log: EventLog, run_id: str, benches: Sequence[Benchmark], models: ModelConfig,
                 settings: RolloutSettings, splits: Splits) -> None:
        self.log, self.run_id, self.benches, self.models = log, run_id, benches, models
        self.settings, self.splits = settings, splits
        self.next_round = 0
        self.seen: dict[tuple[str, str], Tries] = {}
        self.first: Rollout | None = None
        """The rollout that claimed the run (it also closes it)."""

    async def play(self, harness: HarnessConfig, tasks: Sequence[str], label: RoundLabel) -> dict[str, Tries]:
        """Each task's attempts under ``harness`` (played once per harness digest and task, then remembered)."""
        todo = [t for t in tasks if (harness.digest, t) not in self.seen]
        if todo:
            rollout = Rollout(self.benches, self.models, harness, log=self.log, settings=self.settings,
                              splits=self.splits, harness_source="gate_fidelity")
            if self.first is None:
                self.first = rollout
                await rollout.start(self.run_id, kind="gate_fidelity")
            played = await rollout.run_round(self.run_id, self.next_round, todo, role="adaptation", label=label)
            self.next_round += 1
            for r in played.results:
                old = self.seen.get((harness.digest, r.task_id), Tries(0, 0))
                self.seen[harness.digest, r.task_id] = old + Tries(1, int(r.passed))
        return {t: self.seen[harness.digest, t] for t in tasks}


async def rerun(data_dir: Path, run_id: str, played: Played, *, seeds: int | None, drop: float,
                concurrency: int) -> None:
    """Re-run every change of ``run_id`` (its base and new harness on the base's solved tasks) into ``played``."""
    async with connect(NatsSettings(data_dir=data_dir)) as conn:
        ledger = await read_run_ledger(conn.log, run_id)
        if ledger is None or ledger.opened is None:
            raise SystemExit(f"run {run_id} left no ledger in {data_dir}")
        job = recorded_job(ledger.opened.settings)
        before = next((h for h in ledger.heldout if h.round < 0), None)
        if before is not None and ledger.heldout[-1] is not before:
            played.heldout = (await _heldout(conn.log, run_id, before),
                              await _heldout(conn.log, run_id, ledger.heldout[-1]))
        changes = changes_of(ledger)
        played.base_rates = [p for c in changes for p in c.rates]
        played.seeds = seeds or choose_seeds(played.base_rates, drop)
        benches, _ = select_tasks(list(job.benches), "dev", 1)
        try:
            settings = RolloutSettings(attempts=played.seeds, concurrency=concurrency,
                                       max_steps=job.rollout.max_steps, seed=job.rollout.seed)
            bench = Rerun(conn.log, f"{run_id}-fidelity", benches, ModelConfig(main=job.model), settings,
                          Splits.of(job.adaptation, job.heldout))
            for c in changes:
                if not c.tasks:
                    continue
                label = RoundLabel(purpose="fidelity", variant=c.variant, candidate=c.name, stage_round=c.round,
                                   first_attempt=FIRST)
                base, after = await bench.play(c.base, c.tasks, label), await bench.play(c.after, c.tasks, label)
                verdicts = [judge(base[t], after[t], drop=drop) for t in c.tasks]
                if c.kind == "rejected":
                    played.rejected.append(verdicts)
                else:
                    played.pairs[f"{c.kind} r{c.round} {c.variant} {c.name}"] = verdicts
            if bench.first is not None:
                await bench.first.finish(bench.run_id, rounds=bench.next_round)
        finally:
            for b in benches:
                b.close()


def evolve(gate: str, seed: int, options: list[str], *, seeds: int | None, drop: float, concurrency: int) -> Played:
    """One ``hx evolve`` run with ``gate`` in a fresh data directory, timed, then its changes re-run."""
    with tempfile.TemporaryDirectory(prefix="hx-bench-fidelity-") as tmp:
        data, run_id = Path(tmp) / "data", f"fidelity-{gate}-{seed}"
        command = [sys.executable, "-m", "hx", "--data-dir", str(data), "evolve", "--run-id", run_id,
                   "--gate-seesaw", gate, "--seed", str(seed), "--heldout-split", "train",
                   "--out", str(Path(tmp) / "report.json"), *options]
        env = {k: v for k, v in os.environ.items() if k not in ("HX_NATS_URL", "HX_DATA_DIR")}
        began = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - began
        if done.returncode != 0:
            raise SystemExit(f"hx evolve ({gate}, seed {seed}) exited {done.returncode}:\n{done.stderr[-3000:]}")
        played = Played(gate, seed, wall)
        report = json.loads((Path(tmp) / "report.json").read_text())
        began = time.perf_counter()
        asyncio.run(rerun(data, run_id, played, seeds=seeds, drop=drop, concurrency=concurrency))
        pairs = sum(len(v) for v in played.pairs.values())
        print(f"  {gate:<10} seed {seed}: hx evolve {wall:6.1f} s ({len(report['rounds'])} rounds), "
              f"{len(played.pairs)} ship(s) with {pairs} pair(s), {len(played.rejected)} seesaw reject(s), "
              f"{played.seeds} seeds a side re-run in {time.perf_counter() - began:.0f} s", flush=True)
        return played


def _heldout_gain(runs: Sequence[Played]) -> tuple[Interval, Interval, Interval] | None:
    """Held-out pass@k before, after (bootstrap over tasks) and the paired gain, pooled over the runs' seeds."""
    before = {f"{r.seed}/{t}": v for r in runs for t, v in r.heldout[0].items()}
    after = {f"{r.seed}/{t}": v for r in runs for t, v in r.heldout[1].items()}
    if not before or not after:
        return None
    return task_mean(before), task_mean(after), paired_difference(before, after)


def report(runs: Sequence[Played], *, drop: float) -> None:
    """Print per gate the rates, held-out gain and wall time, then the ratios between gates."""
    rates = [p for r in runs for p in r.base_rates]
    used = sorted({r.seeds for r in runs})
    print(f"\nper pair: regressed = a fall of at least {drop:.2f} whose one-sided {1 - ALPHA:.0%} upper bound "
          f"(Newcombe hybrid score) is below 0; seeds a side {', '.join(map(str, used))}")
    if rates:
        print(f"  sizing (normal approximation, one-sided alpha {ALPHA}): {choose_seeds(rates, drop)} seeds a side "
              f"give >= {POWER:.0%} power for a fall of {drop:.2f} from the main rollouts' base rates "
              f"{min(rates):.2f}-{max(rates):.2f}")
        for n in used:
            worst = [smallest_drop(p, n) for p in rates]
            counted = [smallest_drop(p, n, counted=drop) for p in rates]
            shown = "none below the base rate" if None in worst else f"{max(d for d in worst if d):.2f}"
            shown2 = "not reached" if None in counted else f"{max(d for d in counted if d):.2f}"
            print(f"  at {n} a side: smallest fall the test sees with {POWER:.0%} power {shown} (worst base rate); "
                  f"with the size rule too (fall >= {drop:.2f}), {shown2}")
    walls: dict[str, float] = {}
    gains: dict[str, float] = {}
    for gate in dict.fromkeys(r.gate for r in runs):
        mine = [r for r in runs if r.gate == gate]
        verdicts = [v for r in mine for vs in r.pairs.values() for v in vs]
        print(f"\n== gate {gate}: {len(mine)} run(s), {sum(len(r.pairs) for r in mine)} ship(s)/fork(s) ==")
        for r in mine:
            for name, vs in r.pairs.items():
                bad = [f"{v.base.passes}/{v.base.attempts} -> {v.after.passes}/{v.after.attempts}"
                       for v in vs if v.regressed]
                print(f"  seed {r.seed} {name}: {len(vs)} solved task(s), {len(bad)} regressed"
                      + (f" ({'; '.join(bad)})" if bad else ""))
        print(f"  shipped regression rate: {shipped_regression_rate(verdicts)} (goal <= 0.05)")
        print(f"  seesaw rejects that would have been fine: {fine_rate([v for r in mine for v in r.rejected])}")
        held = _heldout_gain(mine)
        if held is not None:
            gains[gate] = held[2].estimate
            print(f"  held-out pass@2 (train split): before {held[0]}, after {held[1]}, gain {held[2]}")
        walls[gate] = statistics.mean(r.wall_s for r in mine)
        print(f"  main job wall: mean {walls[gate]:.1f} s ({', '.join(f'{r.wall_s:.1f}' for r in mine)})")
    if {"retry", "sequential"} <= walls.keys():
        print(f"\nsequential/retry wall time: {walls['sequential'] / walls['retry']:.2f} (goal <= 1.5)")
        if {"retry", "sequential"} <= gains.keys():
            print(f"held-out gain sequential - retry: {gains['sequential'] - gains['retry']:+.3f} (goal >= 0 "
                  "within noise)")


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the options, play the runs (gates alternating per seed), print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--gates", nargs="+", choices=GATES, default=list(GATES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="hx evolve --seed of each run")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=10, help="dev tasks a game to adapt on")
    parser.add_argument("--heldout-tasks", type=int, default=20, help="held-out tasks a game (train split)")
    parser.add_argument("--per-side", type=int, default=None,
                        help="fresh seeds a side per pair  [default: sized for the power, at least 20]")
    parser.add_argument("--drop", type=float, default=DROP, help="the smallest fall that counts as a regression")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="seed 0, 2 rounds on 4 tasks a game, 8 seeds a side")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.rounds, args.tasks, args.heldout_tasks = [0], 2, 4, 4
        args.per_side = args.per_side or 8
    options = ["--rounds", str(args.rounds), "--tasks", str(args.tasks), "--heldout-tasks", str(args.heldout_tasks)]
    header("gate fidelity: shipped harnesses re-run on their base's solved tasks")
    print(f"  hx evolve (random agent, offline evolver, twx:coin + twx:mapreader, held out on train) "
          f"{' '.join(options)}; gates {', '.join(args.gates)}; seeds {', '.join(map(str, args.seeds))}", flush=True)
    runs: list[Played] = []
    for i, seed in enumerate(args.seeds):
        order = args.gates if i % 2 == 0 else args.gates[::-1]  # alternate, so drift in the load hits both
        runs += [evolve(g, seed, options, seeds=args.per_side, drop=args.drop, concurrency=args.concurrency)
                 for g in order]
    report(sorted(runs, key=lambda r: (GATES.index(r.gate), r.seed)), drop=args.drop)


if __name__ == "__main__":
    main()
