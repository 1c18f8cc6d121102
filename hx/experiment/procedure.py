"""A procedure level's product: an ``hx evolve`` or ``hx coevolve`` run with the level's options, made before play.

Every procedure level with options runs its own evolution (hx.aegis's service, the one
``hx evolve`` drives) under the run id ``<experiment run>-<factor>-<level>``, with the
experiment's controlled model, step cap and seed, so the arms differ in the budget alone.
The product is the harness the evolution ends with: its root variant's current version, and for
each task cluster the run routes to another variant (it forked), that variant's (``Product.routes``); a
level ``{"artifact_of": L}`` plays level L's product. A resumed experiment reads a finished
evolution's product from its ledger, resumes an unfinished one, and starts a missing one.

A ``coevolve`` level is an ``hx coevolve`` run (its ``mode``, rounds and rollout ``budget``):
its task agent is the trainable policy, fresh (``policy:<kind>``, seeded by ``learner_seed``)
at the start, and its product is the harness it ends with *and* the policy its learner ended
with (read from HX_LEARN: the last one the rollouts used), played as ``policy:<version>``
from the log's object store. A controlled ``rollout_budget`` is every coevolve level's budget,
so the arms spend the same rollouts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hx.aegis.errors import InductionSettingsInvalid
from hx.aegis.evolvers import make_evolver
from hx.aegis.job import EvolveRequest, TaskChoice
from hx.aegis.session import Parts, new_job, recorded_job, run_evolution
from hx.aegis.settings import EvolveSettings, InductionSettings
from hx.environments.registry import Benchmark
from hx.environments.rollout import RolloutSettings
from hx.experiment.errors import ExperimentError
from hx.experiment.levels import Product
from hx.experiment.spec import artifact_of, mixed_of
from hx.gate.rule import cluster_of
from hx.harness.config import HarnessConfig
from hx.runtime.models import ModelConfig
from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from schemas.errors import HxError
from schemas.experiment import ExperimentSpec, Factor
from schemas.identities import PolicyVersion, fresh_policy_spec, policy_spec
from schemas.learn import PolicyGated, PolicyInitialised, PolicyUpdated
from streams.connection import Connection
from streams.log import EventLog
from streams.signing import LedgerKey
from streams.topology import LEARN, subject_token

# The level options an evolve procedure takes (its budget), and their defaults: small, and a validation
# split (train) as the held-out set, so the procedure never looks at the test tasks.
EVOLVE_OPTIONS: dict[str, Any] = {
    "rounds": 2, "patience": 2, "candidates": 2, "tasks": 3, "heldout_tasks": 3, "heldout_split": "train",
    "attempts": 1, "evolver": "offline", "strategy": "ensemble",
    "induce_support": InductionSettings().min_support, "induce_lift": InductionSettings().min_lift,
    "induce_against": InductionSettings().max_against,
}


# What a coevolve level adds to them (``hx coevolve``'s options): the mode, the rollout budget (0: the rounds
# decide), the policy gate, the learner's start, resting barren tasks, and the policy the learner trains.
COEVOLVE_OPTIONS: dict[str, Any] = {
    "mode": "both", "budget": 0, "policy_gate": False, "learn_after_stall": False, "rest_barren": 0,
    "kind": "scorer", "learner_seed": 0, "window": 4, "lr": 3e-4, "epochs": 1, "clip_eps_high": None,
    "step_weight": 1.0,
}
COEVOLVE_MODES = ("harness", "model", "both")
PROCEDURES = ("evolve", "coevolve")


def procedure_run_id(run_id: str, factor: str, level: str) -> str:
    """The run id of a level's procedure run."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{run_id}-{factor}-{level}")[:120]


def _coevolve_options(options: Mapping[str, Any], budget: int | None, where: str) -> dict[str, Any]:
    """A coevolve level's options with its defaults; the controlled budget (if any) is every level's."""
    if budget is not None and "budget" in options:
        raise ExperimentError(f"{where}: sets budget, but controlled_variables.rollout_budget is every coevolve "
                              "level's budget (the arms spend the same rollouts)")
    o = {**EVOLVE_OPTIONS, **COEVOLVE_OPTIONS, **options}
    if budget is not None:
        o["budget"] = budget
    if o["mode"] not in COEVOLVE_MODES:
        raise ExperimentError(f"{where}: mode {o['mode']!r} is not one of {', '.join(COEVOLVE_MODES)}")
    if o["learn_after_stall"] and o["mode"] != "both":
        raise ExperimentError(f"{where}: learn_after_stall applies to mode both, not mode {o['mode']}")
    if o["mode"] == "model":  # as hx coevolve --mode model: a frozen harness, and patience must not end the run
        o["evolver"], o["patience"] = "frozen", o["rounds"]
    return o


def controlled_budget(spec: ExperimentSpec) -> int | None:
    """``controlled_variables.rollout_budget``: every coevolve level's rollout budget (None: each level's own)."""
    value = spec.controlled_variables.get("rollout_budget")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExperimentError(f"controlled_variables.rollout_budget: a number of attempts (0 or more), not {value!r}")
    return value


def _request(options: Mapping[str, Any], benches: Sequence[str], model: str, max_steps: int, seed: int,
             concurrency: int, where: str, procedure: str = "evolve", budget: int | None = None) -> EvolveRequest:
    known = {**EVOLVE_OPTIONS, **(COEVOLVE_OPTIONS if procedure == "coevolve" else {})}
    unknown = sorted(set(options) - set(known) - {"benches"})
    if unknown:
        raise ExperimentError(f"{where}: unknown {procedure} option(s) {', '.join(unknown)} "
                              f"(known: benches, {', '.join(known)})")
    o = {**EVOLVE_OPTIONS, **options}
    coevolve = None
    if procedure == "coevolve":
        o = _coevolve_options(options, budget, where)
        model = fresh_policy_spec(str(o["kind"]))
        coevolve = _coevolve_settings(o, where)
    try:
        return EvolveRequest(
            tasks=TaskChoice(benches=tuple(o.get("benches") or benches), adaptation=int(o["tasks"]),
                             heldout=int(o["heldout_tasks"]), heldout_split=str(o["heldout_split"])),
            loop=EvolveSettings(rounds=int(o["rounds"]), patience=int(o["patience"]),
                                candidates=int(o["candidates"]), strategy=o["strategy"],
                                induction=InductionSettings.of(int(o["induce_support"]), float(o["induce_lift"]),
                                                               float(o["induce_against"]))),
            rollout=RolloutSettings(attempts=int(o["attempts"]), concurrency=concurrency, max_steps=max_steps,
                                    seed=seed),
            model=model, evolver=str(o["evolver"]), coevolve=coevolve)
    except (TypeError, ValueError, InductionSettingsInvalid) as exc:
        raise ExperimentError(f"{where}: {exc}") from exc


def _coevolve_settings(o: Mapping[str, Any], where: str) -> Any:
    """The ``CoevolveSettings`` of a coevolve level (imported here: the learner brings JAX)."""
    from hx.aegis.coevolution import CoevolveSettings
    from hx.learner.grpo import GRPOConfig
    from hx.learner.trainer import LearnerSettings

    try:
        seed = int(o["learner_seed"])
        high = o["clip_eps_high"]
        algorithm = GRPOConfig(seed=seed, learning_rate=float(o["lr"]), epochs=int(o["epochs"]),
                               clip_eps_high=None if high is None else float(high))
        learner = LearnerSettings(kind=str(o["kind"]), init_seed=seed, window=int(o["window"]),
                                  step_weight=float(o["step_weight"]), algorithm=algorithm)
        return CoevolveSettings(mode=o["mode"], budget=int(o["budget"]), learner=learner,
                                policy_gate=bool(o["policy_gate"]), learn_after_stall=bool(o["learn_after_stall"]),
                                rest_barren=int(o["rest_barren"]))
    except (TypeError, ValueError, HxError) as exc:
        raise ExperimentError(f"{where}: {exc}") from exc


async def final_policy(log: EventLog, run_id: str) -> PolicyVersion | None:
    """The policy a co-evolution's rollouts used last: its learner's first one, then each new one adopted."""
    version: PolicyVersion | None = None
    subject = f"{LEARN.subjects[0].rstrip('>')}{subject_token(run_id)}.*"
    async for record in log.read(LEARN.name, subjects=[subject]):
        event = record.event
        if (isinstance(event, PolicyInitialised) and version is None) or isinstance(event, PolicyUpdated):
            version = event.version
        elif isinstance(event, PolicyGated):  # gated: the candidate only when adopted, else its parent plays on
            version = event.candidate if event.adopted else event.parent
    return version


def _product(ledger: RunLedger, games: Sequence[str], models: ModelConfig) -> Product:
    """The run's final harnesses: the root variant's, and each given cluster's where another variant serves it."""
    def harness(variant: str) -> HarnessConfig:
        return HarnessConfig.from_spec(ledger.variants[variant].current.harness,
                                       where=f"the harness variant {variant!r} of run {ledger.run_id!r} ended with")
    routes = {cluster: harness(v) for cluster in games if (v := ledger.route(cluster)) != ledger.root}
    return Product(harness(ledger.root), models, routes)


def _procedure_levels(spec: ExperimentSpec) -> Iterator[tuple[Factor, str, Mapping[str, Any], str]]:
    """Each procedure level that runs a procedure: its factor, name, options and where it is (for errors).

    Raises ExperimentError for a procedure this runner cannot make and for options that are not a mapping.
    """
    for factor in spec.factors:
        scope = factor.scope
        if scope.kind != "procedure":
            continue
        if scope.target not in PROCEDURES:
            raise ExperimentError(f"factor {factor.name!r}: the {scope.target} procedure is not runnable by "
                                  f"hx experiment run; use {' or '.join(PROCEDURES)}")
        for level in factor.levels:
            options = scope.levels[level]
            if options is None or artifact_of(options) is not None or mixed_of(options) is not None:
                continue
            where = f"factor {factor.name!r} level {level!r}"
            if not isinstance(options, Mapping):
                raise ExperimentError(f"{where}: a {scope.target} level's value is its options (a mapping) or null")
            yield factor, level, options, where


def check_procedures(spec: ExperimentSpec) -> None:
    """Raise ExperimentError for a procedure level this runner cannot make, before anything is written."""
    budget = controlled_budget(spec)
    for factor, _, options, where in _procedure_levels(spec):
        _request(options, ("-",), "random:", 1, spec.seed, 1, where, factor.scope.target, budget)


def seeds_of(spec: ExperimentSpec) -> tuple[int, ...]:
    """The seeds procedure levels are made with: ``procedure_seeds``, or the spec's seed alone."""
    return spec.procedure_seeds or (spec.seed,)


async def make_products(conn: Connection, spec: ExperimentSpec, benches: Mapping[str, Benchmark], *, run_id: str,
                        base: HarnessConfig, model: str, max_steps: int,
                        concurrency: int, key: LedgerKey | None = None) -> dict[tuple[str, str, int], Product]:
    """Every procedure level's product per procedure seed (index), made (or read back from the log) in the spec's
    level order, seed by seed, their ledgers signed with ``key``; then the levels that play another level's product,
    or mix two."""
    products: dict[tuple[str, str, int], Product] = {}
    games = sorted({cluster_of(task) for task in spec.tasks})  # the clusters a forked product routes
    seeds = seeds_of(spec)
    for index, seed in enumerate(seeds):
        for factor, level, options, where in _procedure_levels(spec):
            target = factor.scope.target
            if len(seeds) > 1:
                where = f"{where} (procedure seed {seed})"
                if target == "coevolve" and "learner_seed" not in options:
                    options = {**options, "learner_seed": seed}
            request = _request(options, games, model, max_steps, seed, concurrency, where, target,
                               controlled_budget(spec))
            evolution_id = procedure_run_id(run_id, factor.name, level) + (f"-s{seed}" if spec.procedure_seeds
                                                                           else "")
            products[(factor.name, level, index)] = await _made(conn, benches, request, evolution_id, base, model,
                                                                target, where, games, key)
    for factor in spec.factors:
        if factor.scope.kind != "procedure":
            continue
        for level in factor.levels:
            value = factor.scope.levels[level]
            source, mixed = artifact_of(value), mixed_of(value)
            for index in range(len(seeds)):
                if source is not None:
                    products[(factor.name, level, index)] = products[(factor.name, source, index)]
                elif mixed is not None:
                    harness_of, policy_of = mixed
                    models = (products[(factor.name, policy_of, index)].models if policy_of
                              else ModelConfig(main=model))
                    made = products[(factor.name, harness_of, index)] if harness_of else Product(base, models)
                    products[(factor.name, level, index)] = Product(made.harness, models, made.routes)
    return products


async def _made(conn: Connection, benches: Mapping[str, Benchmark], request: EvolveRequest, evolution_id: str,
                base: HarnessConfig, model: str, target: str, where: str, games: Sequence[str],
                key: LedgerKey | None) -> Product:
    """One procedure run's product: made, resumed, or read back from its finished ledger."""
    ledger = await read_run_ledger(conn.log, evolution_id)
    if ledger is None or ledger.finished is None:  # made once; a resume goes on from the log
        job = (recorded_job(ledger.opened.settings) if ledger is not None and ledger.opened is not None
               else new_job(evolution_id, list(benches.values()), request, harness=base,
                            harness_source="experiment controlled harness"))
        evolver = make_evolver(job.evolver, meta=None, store=None)
        try:
            await run_evolution(conn, list(benches.values()), job, Parts(evolver, key=key),
                                resume=ledger is not None)
        finally:
            await evolver.aclose()
        ledger = await read_run_ledger(conn.log, evolution_id)
    if ledger is None:
        raise ExperimentError(f"{where}: evolution {evolution_id} left no ledger")
    models = ModelConfig(main=model)
    if target == "coevolve":
        version = await final_policy(conn.log, evolution_id)
        if version is None:
            raise ExperimentError(f"{where}: co-evolution {evolution_id} left no learner record")
        models = ModelConfig(main=policy_spec(version))
    return _product(ledger, games, models)
