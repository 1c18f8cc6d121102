"""The benches' experiment specs (bench/specs) load and validate; the ``coevolve`` procedure level plays its product.

The coevolve run is a real ``hx experiment run`` on the toy world: a model-only co-evolution
(the scorer policy, two rounds) whose product, the harness and the policy its learner ended
with, is what the level's units are played with.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import toyworld  # noqa: F401 - registers the toy benchmark with the in-process command
import yaml
from hx_cli import error_line, hx, ok
from learner_kit import learn_records, model_turns

from hx.experiment.analysis import conclude
from hx.experiment.design import design_cells, units
from hx.experiment.falsify import parse
from hx.experiment.procedure import procedure_run_id
from hx.experiment.spec import load_spec, parse_spec
from projections.attempt_outputs import AttemptOutput
from schemas.learn import PolicyInitialised, PolicyUpdated
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog

SPECS = sorted(p for p in (Path(__file__).resolve().parent.parent / "bench" / "specs").glob("*.yaml")
               if p.name != "spent-test-ranges.yaml")


def test_the_benches_have_specs() -> None:
    assert {p.name for p in SPECS} >= {"evolution_efficacy.yaml", "coevolution.yaml"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_bench_spec_loads_validates_and_its_falsified_if_parses(path: Path) -> None:
    spec = load_spec(path)
    expression = parse(spec.falsified_if)
    assert expression.variables <= set(spec.response_variables)
    [factor] = spec.factors
    assert factor.scope.kind == "procedure" and factor.levels[0] in factor.scope.levels
    assert factor.scope.levels[factor.levels[0]] is None  # the reference arm runs no procedure


def test_the_coevolution_claim_compares_what_it_names_and_is_decided() -> None:
    spec = load_spec(SPECS[0].parent / "coevolution.yaml")
    spec = msgspec.structs.replace(spec, tasks=spec.tasks[:20])
    rate = {"untrained": 4, "harness": 8, "model": 12, "both": 16, "both_harness_untrained": 8,
            "harness_both_policy": 12}  # tasks passed (of 20) in each arm
    outputs = {u: AttemptOutput(run="r", round=u.cell.index, task=u.task, attempt=u.replication, finished=True,
                                passed=spec.tasks.index(u.task) < rate[u.cell.name], steps=10)
               for u in units(spec)}
    concluded = conclude(spec, design_cells(spec), outputs, run_id="r", spec_digest="d")
    effects = {(e.level, e.reference): e.difference for e in concluded.effects if e.variable == "pass_at_k"}
    # each level against the reference, and every comparison the spec names
    assert set(effects) == {*((level, "untrained") for level in rate if level != "untrained"),
                            ("both", "harness"), ("both", "both_harness_untrained"),
                            ("harness_both_policy", "harness"), ("both_harness_untrained", "harness")}
    assert effects[("both", "harness")].estimate == pytest.approx(8 / 20)
    [interaction] = [i for i in concluded.interactions if i.variable == "pass_at_k"]
    assert interaction.contrast.estimate == pytest.approx((16 - 12 - 8 + 4) / 20)
    assert concluded.falsified == "not_falsified", concluded.detail


def co_spec(levels: dict[str, Any], **controlled: Any) -> dict[str, Any]:
    return {
        "title": "model-only co-evolution on rooms",
        "hypothesis": "two rounds of training change how the scorer policy plays rooms",
        "falsified_if": 'diff_high(passed, "trained", "untrained") <= 0',
        "factors": [{"name": "policy", "levels": list(levels),
                     "scope": {"kind": "procedure", "target": "coevolve", "levels": levels}}],
        "tasks": ["toyworld:rooms:test:0", "toyworld:rooms:test:1"],
        "replications": 2,
        "response_variables": ["passed", "steps"],
        "controlled_variables": {"model": "policy:scorer", "max_steps": 20, **controlled},
        "seed": 3,
    }


def run(url: str, tmp_path: Path, data: dict[str, Any], *args: str) -> Any:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return hx("--nats-url", url, "--data-dir", str(tmp_path / "data"), "experiment", "run", str(path), *args)


def on_log(url: str, run_id: str) -> tuple[list[Any], list[Any]]:
    """The co-evolution's learner records and the experiment's main-model turns."""
    async def main() -> tuple[list[Any], list[Any]]:
        async with connect(NatsSettings(url=url)) as conn:
            log: EventLog = conn.log
            learned = await learn_records(log, procedure_run_id(run_id, "policy", "trained"))
            return learned, await model_turns(log, run_id)
    return asyncio.run(main())


@pytest.mark.slow
def test_a_coevolve_level_plays_the_policy_its_learner_ended_with(nats_url: str, tmp_path: Path) -> None:
    levels = {"untrained": None, "trained": {"mode": "model", "rounds": 2, "tasks": 3, "heldout_tasks": 1,
                                             "attempts": 2}}
    result = ok(run(nats_url, tmp_path, co_spec(levels, rollout_budget=40), "--run-id", "exp-co", "--json"))
    concluded = json.loads(result.stdout)
    assert concluded["units"] == 8
    learned, turns = on_log(nats_url, "exp-co")
    [init] = [r for r in learned if isinstance(r, PolicyInitialised)]
    trained = [r for r in learned if isinstance(r, PolicyUpdated)]
    assert trained and trained[-1].version != init.version  # the learner moved the policy
    # round = the cell's index: 0 untrained (the controlled fresh policy), 1 the co-evolution's product
    served = {cell: {t.response.model_version for t in turns if t.round == cell} for cell in (0, 1)}
    assert served == {0: {init.version}, 1: {trained[-1].version}}


def test_a_controlled_rollout_budget_is_every_coevolve_levels_budget(nats_url: str, tmp_path: Path) -> None:
    levels = {"untrained": None, "trained": {"mode": "model", "budget": 10}}
    said = error_line(run(nats_url, tmp_path, co_spec(levels, rollout_budget=40), "--run-id", "exp-b"))
    assert "level 'trained': sets budget, but controlled_variables.rollout_budget" in said
    levels = {"untrained": None, "trained": {"mode": "sideways"}}
    assert "mode 'sideways' is not one of harness, model, both" in error_line(
        run(nats_url, tmp_path, co_spec(levels), "--run-id", "exp-m"))
    levels = {"untrained": None, "trained": {"mode": "model", "temperature": 1}}
    said = error_line(run(nats_url, tmp_path, co_spec(levels), "--run-id", "exp-u"))
    assert "unknown coevolve option(s) temperature" in said


@pytest.mark.parametrize("bench", ["evolution_efficacy", "coevolution"])
def test_a_quick_run_never_plays_the_test_range_its_committed_spec_is_judged_on(bench: str) -> None:
    import importlib.util
    import sys

    folder = SPECS[0].parent.parent
    sys.path.insert(0, str(folder))
    try:
        loaded = importlib.util.spec_from_file_location(f"bench_{bench}", folder / f"{bench}.py")
        assert loaded is not None and loaded.loader is not None
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    committed = yaml.safe_load((folder / "specs" / f"{bench}.yaml").read_text())
    quick = module.derive(committed, seed=0, quick=True)
    assert quick["tasks"] and all(task.split(":")[2] == "dev" for task in quick["tasks"])
    adapted = max(o.get("tasks", 0) for o in quick["factors"][0]["scope"]["levels"].values() if o)
    assert "claim" not in quick and len(quick.get("procedure_seeds", [])) <= 1
    assert min(int(task.split(":")[3]) for task in quick["tasks"]) >= adapted  # not the procedures' own dev tasks
    parse_spec(quick, where=f"{bench} --quick")  # a spec hx experiment run accepts
