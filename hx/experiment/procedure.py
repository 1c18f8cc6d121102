"""A procedure level's product: an ``hx evolve`` run with the level's options as its budget, made before play.

Every procedure level with options runs its own evolution (hx.aegis's service, the one
``hx evolve`` drives) under the run id ``<experiment run>-<factor>-<level>``, with the
experiment's controlled model, step cap and seed, so the arms differ in the budget alone.
The product is the harness the evolution ends with (its root variant's current version); a
level ``{"artifact_of": L}`` plays level L's product. A resumed experiment reads a finished
evolution's product from its ledger, resumes an unfinished one, and starts a missing one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hx.aegis.evolvers import make_evolver
from hx.aegis.job import EvolveRequest, TaskChoice
from hx.aegis.session import Parts, new_job, recorded_job, run_evolution
from hx.aegis.settings import EvolveSettings
from hx.environments.registry import Benchmark
from hx.environments.rollout import RolloutSettings
from hx.experiment.errors import ExperimentError
from hx.experiment.spec import artifact_of
from hx.harness.config import HarnessConfig
from hx.runtime.models import ModelConfig
from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from schemas.experiment import ExperimentSpec
from streams.connection import Connection

# The level options an evolve procedure takes (its budget), and their defaults: small, and a validation
# split (train) as the held-out set, so the procedure never looks at the test tasks.
EVOLVE_OPTIONS: dict[str, Any] = {
    "rounds": 2, "patience": 2, "candidates": 2, "tasks": 3, "heldout_tasks": 3, "heldout_split": "train",
    "attempts": 1, "evolver": "offline", "strategy": "ensemble",
}


def procedure_run_id(run_id: str, factor: str, level: str) -> str:
    """The run id of a level's procedure run."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{run_id}-{factor}-{level}")[:120]


def _request(options: Mapping[str, Any], benches: Sequence[str], model: str, max_steps: int, seed: int,
             concurrency: int, where: str) -> EvolveRequest:
    unknown = sorted(set(options) - set(EVOLVE_OPTIONS) - {"benches"})
    if unknown:
        raise ExperimentError(f"{where}: unknown evolve option(s) {', '.join(unknown)} "
                              f"(known: benches, {', '.join(EVOLVE_OPTIONS)})")
    o = {**EVOLVE_OPTIONS, **options}
    try:
        return EvolveRequest(
            tasks=TaskChoice(benches=tuple(o.get("benches") or benches), adaptation=int(o["tasks"]),
                             heldout=int(o["heldout_tasks"]), heldout_split=str(o["heldout_split"])),
            loop=EvolveSettings(rounds=int(o["rounds"]), patience=int(o["patience"]),
                                candidates=int(o["candidates"]), strategy=o["strategy"]),
            rollout=RolloutSettings(attempts=int(o["attempts"]), concurrency=concurrency, max_steps=max_steps,
                                    seed=seed),
            model=model, evolver=str(o["evolver"]))
    except (TypeError, ValueError) as exc:
        raise ExperimentError(f"{where}: {exc}") from exc


def _product(ledger: RunLedger) -> HarnessConfig:
    version = ledger.variants[ledger.root].current
    return HarnessConfig.from_spec(version.harness, where=f"the harness run {ledger.run_id!r} ended with")


def check_procedures(spec: ExperimentSpec) -> None:
    """Raise ExperimentError for a procedure level this runner cannot make, before anything is written."""
    for factor in spec.factors:
        scope = factor.scope
        if scope.kind != "procedure":
            continue
        if scope.target != "evolve":
            raise ExperimentError(f"factor {factor.name!r}: the {scope.target} procedure is not runnable by "
                                  "hx experiment run yet; use evolve")
        for level in factor.levels:
            options = scope.levels[level]
            if options is None or artifact_of(options) is not None:
                continue
            where = f"factor {factor.name!r} level {level!r}"
            if not isinstance(options, Mapping):
                raise ExperimentError(f"{where}: an evolve level's value is its options (a mapping) or null")
            _request(options, ("-",), "random:", 1, spec.seed, 1, where)


async def make_products(conn: Connection, spec: ExperimentSpec, benches: Mapping[str, Benchmark], *, run_id: str,
                        base: HarnessConfig, model: str, max_steps: int,
                        concurrency: int) -> dict[tuple[str, str], tuple[HarnessConfig, ModelConfig]]:
    """Every procedure level's product, made (or read back from the log) in the spec's level order."""
    products: dict[tuple[str, str], tuple[HarnessConfig, ModelConfig]] = {}
    games = sorted({":".join(task.split(":")[:2]) for task in spec.tasks})
    for factor in spec.factors:
        scope = factor.scope
        if scope.kind != "procedure":
            continue
        if scope.target != "evolve":
            raise ExperimentError(f"factor {factor.name!r}: the {scope.target} procedure is not runnable by "
                                  "hx experiment run yet; use evolve")
        for level in factor.levels:
            options = scope.levels[level]
            if options is None or artifact_of(options) is not None:
                continue
            where = f"factor {factor.name!r} level {level!r}"
            if not isinstance(options, Mapping):
                raise ExperimentError(f"{where}: an evolve level's value is its options (a mapping) or null")
            request = _request(options, games, model, max_steps, spec.seed, concurrency, where)
            evolution_id = procedure_run_id(run_id, factor.name, level)
            ledger = await read_run_ledger(conn.log, evolution_id)
            if ledger is None or ledger.finished is None:
                job = (recorded_job(ledger.opened.settings) if ledger is not None and ledger.opened is not None
                       else new_job(evolution_id, list(benches.values()), request, harness=base,
                                    harness_source="experiment controlled harness"))
                evolver = make_evolver(job.evolver, meta=None, store=None)
                try:
                    await run_evolution(conn, list(benches.values()), job, Parts(evolver),
                                        resume=ledger is not None)
                finally:
                    await evolver.aclose()
                ledger = await read_run_ledger(conn.log, evolution_id)
            if ledger is None:
                raise ExperimentError(f"{where}: evolution {evolution_id} left no ledger")
            products[(factor.name, level)] = (_product(ledger), ModelConfig(main=model))
        for level in factor.levels:
            source = artifact_of(scope.levels[level])
            if source is not None:
                products[(factor.name, level)] = products[(factor.name, source)]
    return products
