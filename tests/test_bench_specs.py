"""The benches' experiment specs (bench/specs) load and validate; the ``coevolve`` procedure level plays its product.

The coevolve run is a real ``hx experiment run`` on the toy world: a model-only co-evolution
(the scorer policy, two rounds) whose product, the harness and the policy its learner ended
with, is what the level's units are played with.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import toyworld  # noqa: F401 - registers the toy benchmark with the in-process command
import yaml
from hx_cli import error_line, hx, ok
from learner_kit import learn_records, model_turns

from hx.aegis.evolvers import EVOLVERS
from hx.environments.sciworld import VARIATIONS
from hx.environments.twx import GAME_OPTIONS
from hx.experiment.analysis import conclude
from hx.experiment.claims import check_claim
from hx.experiment.design import design_cells, units
from hx.experiment.falsify import parse
from hx.experiment.procedure import procedure_run_id
from hx.experiment.spec import load_spec, parse_spec
from projections.attempt_outputs import AttemptOutput
from projections.ledger_reader import read_run_ledger
from schemas.learn import PolicyInitialised, PolicyUpdated
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog

SPECS = sorted(p for p in (Path(__file__).resolve().parent.parent / "bench" / "specs").glob("*.yaml")
               if p.name != "spent-test-ranges.yaml")


def test_the_benches_have_specs() -> None:
    assert {p.name for p in SPECS} >= {"evolution_efficacy.yaml", "coevolution.yaml", "rule_induction.yaml"}


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


def bench_module(name: str) -> Any:
    """A bench script loaded as a module (bench/ on the path while it loads, for its sibling imports)."""
    folder = SPECS[0].parent.parent
    sys.path.insert(0, str(folder))
    try:
        loaded = importlib.util.spec_from_file_location(f"bench_{name}", folder / f"{name}.py")
        assert loaded is not None and loaded.loader is not None
        module = importlib.util.module_from_spec(loaded)
        sys.modules[loaded.name] = module  # a dataclass resolves its annotations through its module
        loaded.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


@pytest.mark.parametrize("bench", ["evolution_efficacy", "coevolution"])
def test_a_quick_run_never_plays_the_test_range_its_committed_spec_is_judged_on(bench: str) -> None:
    module = bench_module(bench)
    folder = SPECS[0].parent.parent
    committed = yaml.safe_load((folder / "specs" / f"{bench}.yaml").read_text())
    quick = module.derive(committed, seed=0, quick=True)
    assert quick["tasks"] and all(task.split(":")[2] == "dev" for task in quick["tasks"])
    adapted = max(o.get("tasks", 0) for o in quick["factors"][0]["scope"]["levels"].values() if o)
    assert "claim" not in quick and len(quick.get("procedure_seeds", [])) <= 1
    assert min(int(task.split(":")[3]) for task in quick["tasks"]) >= adapted  # not the procedures' own dev tasks
    parse_spec(quick, where=f"{bench} --quick")  # a spec hx experiment run accepts


# --- the rule-induction claim (issue 39): bench/specs/rule_induction.yaml and evolution_efficacy.py --suite rules ---

RULES = SPECS[0].parent / "rule_induction.yaml"


def game(task: str) -> str:
    return ":".join(task.split(":")[:2])


def test_the_rule_claim_plays_every_shipped_game_and_three_large_sciworld_tasks_on_unspent_test_tasks() -> None:
    spec = load_spec(RULES)
    games = list(dict.fromkeys(game(t) for t in spec.tasks))
    assert [g for g in games if g.startswith("twx:")] == [f"twx:{g}" for g in GAME_OPTIONS]
    science = [g.split(":")[1] for g in games if g.startswith("sciworld:")]
    assert len(science) == 3 and all(VARIATIONS[task][2] >= 50 for task in science)  # test variations
    assert all(t.split(":")[2] == "test" for t in spec.tasks)
    check_claim(spec, RULES, RULES.parent)  # no other claim's tasks, no spent range
    assert spec.claim == "rule-induction" and spec.expected_wall_s > 0
    [factor] = spec.factors
    assert factor.levels == ("starter", "catalog", "both")
    levels = factor.scope.levels
    assert levels["starter"] is None
    assert (levels["catalog"]["evolver"], levels["both"]["evolver"]) == ("offline", "offline+induced")
    assert {"offline", "offline+induced"} <= set(EVOLVERS.names())
    same = [{k: v for k, v in levels[arm].items() if k != "evolver"} for arm in ("catalog", "both")]
    assert same[0] == same[1] and same[0]["benches"] == games  # one budget, one stop rule, every game
    induction = ("induce_support", "induce_lift", "induce_against")
    # the second version's budget (one sitting): the first's stop rule and candidates, a third of its dev tasks
    assert {k: v for k, v in same[0].items() if k not in ("benches", *induction)} == {
        "rounds": 5, "tasks": 10, "patience": 3, "candidates": 3, "attempts": 2, "heldout_tasks": 5,
        "heldout_split": "train", "strategy": "ensemble"}
    # the thresholds the validation grid chose (bench/induction_thresholds.py), pinned before any arm ran
    assert [same[0][k] for k in induction] == [2, 1.5, 0.1]
    assert spec.procedure_seeds == (0, 1, 2) and spec.replications == 6 and spec.per_game
    assert {tuple(p) for p in spec.comparisons} == {("both", "starter"), ("catalog", "starter"), ("both", "catalog")}
    assert (RULES.parent / spec.controlled_variables["harness"]).is_file()


def test_the_rule_claims_quick_run_keeps_two_games_and_plays_dev_tasks_its_evolutions_do_not_adapt_on() -> None:
    module = bench_module("evolution_efficacy")
    committed = yaml.safe_load(RULES.read_text())
    quick = module.derive(committed, seed=0, quick=True, size=module.QUICK["rules"])
    kept = ["twx:cookingworld", "sciworld:use-thermometer"]
    assert list(dict.fromkeys(game(t) for t in quick["tasks"])) == kept
    assert all(t.split(":")[2] == "dev" and int(t.split(":")[3]) >= 5 for t in quick["tasks"])
    for arm in ("catalog", "both"):
        options = quick["factors"][0]["scope"]["levels"][arm]
        assert options["benches"] == kept and (options["rounds"], options["tasks"]) == (2, 5)
    assert "claim" not in quick and quick["procedure_seeds"] == [0]
    assert Path(quick["controlled_variables"]["harness"]).is_absolute()  # the run reads a copy of the spec elsewhere
    parse_spec(quick, where="rules --quick")


def test_games_keeps_those_games_of_a_suite_and_a_game_it_lacks_is_an_argument_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    module = bench_module("evolution_efficacy")
    _, [(suite, spec)] = module.arguments(["--suite", "others", "--games", "twx:sorting"])
    assert suite == "others" and {game(t) for t in spec["tasks"]} == {"twx:sorting"}
    assert spec["factors"][0]["scope"]["levels"]["evolved"]["benches"] == ["twx:sorting"]
    _, [(_, quick)] = module.arguments(["--suite", "rules", "--quick", "--games", "twx:sorting,twx:coin"])
    assert list(dict.fromkeys(game(t) for t in quick["tasks"])) == ["twx:coin", "twx:sorting"]
    for argv, said in [
        (["--suite", "rules", "--games", "twx:nope"], "error: --games: twx:nope is not a game of suite rules (its "
                                                      "games: twx:cookingworld, twx:twc,"),
        (["--suite", "main", "--quick", "--games", "twx:coin,twx:cookingworld"],
         "error: --games: twx:cookingworld is not a game of suite main (its games: twx:coin, twx:mapreader)"),
        (["--suite", "rules", "--games", "twx:coin"], "error: --games: suite rules is the pre-registered claim "
                                                      "'rule-induction', judged once on all its games"),
        (["--suite", "rules", "--quick", "--games", "coin"], "error: argument --games: 'coin' is not a "
                                                             "comma-separated list of bench:game names"),
    ]:
        with pytest.raises(SystemExit) as stopped:
            module.arguments(argv)
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and len(err.splitlines()) == 1 and err.startswith(said), err


def _bounds(estimate: float, low: float, high: float) -> dict[str, float]:
    return {"estimate": estimate, "low": low, "high": high}


def test_the_rule_figures_judge_the_bar_the_goal_losses_and_the_catalog_games(capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    figures = bench_module("rule_figures")
    gains = {"twx:cookingworld": (0.2, 0.05, 0.35), "twx:sorting": (0.2, -0.02, 0.4),  # interval holds 0
             "twx:arithmetic": (0.1, 0.02, 0.2),  # below the bar
             "twx:twc": (0.15, 0.01, 0.3), "sciworld:use-thermometer": (0.3, 0.1, 0.5),
             "twx:coin": (0.0, -0.1, 0.1), "twx:mapreader": (0.0, -0.1, 0.1)}
    over_catalog = {**{g: (0.0, -0.1, 0.1) for g in gains}, "twx:coin": (-0.2, -0.3, -0.1)}
    concluded = {
        "levels": [{"variable": f"pass_at_k {g}", "level": arm, "mean": _bounds(0.5, 0.4, 0.6)}
                   for g in gains for arm in ("starter", "catalog", "both")],
        "effects": [*({"variable": f"pass_at_k {g}", "level": "both", "reference": "starter",
                       "difference": _bounds(*d)} for g, d in gains.items()),
                    *({"variable": f"pass_at_k {g}", "level": "both", "reference": "catalog",
                       "difference": _bounds(*d)} for g, d in over_catalog.items())]}
    judged = figures.game_figures(concluded, list(gains))
    assert [f.game for f in judged if f.meets_bar] == ["twx:cookingworld", "twx:twc", "sciworld:use-thermometer"]
    figures.print_games(judged)
    shown = capsys.readouterr().out
    assert "goal: 3 of 5 named games meet the bar (needs 3): MET" in shown
    assert "nulls (bar missed): twx:sorting, twx:arithmetic" in shown
    assert "no game loses: NO, twx:coin: both - catalog below 0" in shown
    assert "twx:coin: both - catalog -0.200 [-0.300, -0.100]: LOST against the catalog arm" in shown
    assert "twx:mapreader: both - catalog  0.000 [-0.100,  0.100]: kept" in shown


@pytest.mark.slow
def test_the_rule_figures_read_each_evolution_the_experiment_made_from_its_ledger(nats_url: str,
                                                                                tmp_path: Path) -> None:
    figures = bench_module("rule_figures")
    tiny = {"benches": ["twx:coin"], "rounds": 1, "tasks": 4, "heldout_tasks": 2, "candidates": 1, "attempts": 2}
    data = {"title": "arms on coin", "hypothesis": "both evolvers lift coin",
            "falsified_if": 'diff_low(pass_at_k, "both", "catalog") <= 0',
            "factors": [{"name": "arm", "levels": ["starter", "catalog", "both"],
                         "scope": {"kind": "procedure", "target": "evolve",
                                   "levels": {"starter": None, "catalog": {**tiny, "evolver": "offline"},
                                              "both": {**tiny, "evolver": "offline+induced"}}}}],
            "tasks": ["twx:coin:dev:40"], "replications": 2, "procedure_seeds": [0],
            "response_variables": ["pass_at_k"], "controlled_variables": {"model": "random:", "max_steps": 40},
            "seed": 1}
    ok(run(nats_url, tmp_path, data, "--run-id", "exp-rf", "--json"))
    runs = figures.read_runs(NatsSettings(url=nats_url), data, "exp-rf")
    assert [(r.arm, r.run_id) for r in runs] == [("catalog", "exp-rf-arm-catalog-s0"), ("both", "exp-rf-arm-both-s0")]

    async def ledgers() -> list[Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return [await read_run_ledger(conn.log, r.run_id) for r in runs]
    for r, ledger in zip(runs, asyncio.run(ledgers()), strict=True):
        [decided] = [one.decided for one in ledger.ordered()]
        assert r.rounds == 1 and dict(r.outcomes) == {decided.outcome: 1}
        assert r.attempts == decided.metrics.rollouts > 0
        assert r.wall_s == (ledger.finished.at_ns - ledger.opened.at_ns) / 1e9 > 0
        [rnd] = ledger.ordered()
        assert rnd.landscape is not None and rnd.proposed  # the round proposed: the landscape to its first candidate
        assert r.propose_s == (rnd.proposed[0].at_ns - rnd.landscape.at_ns) / 1e9 and 0 < r.propose_s < r.wall_s
        assert r.heldout == (ledger.heldout[0].pass_at_2, ledger.heldout[-1].pass_at_2) and None not in r.heldout
        judged = [c for c in ledger.candidates.values() if c.gate is not None]
        assert sum(r.verdicts.values()) == len(judged) > 0
        assert r.arm == "both" or {kind for kind, _ in r.verdicts} == {"processor"}  # the catalog edits no rule
        assert {why for _, why in r.verdicts} == {c.gate.first_failure or c.gate.outcome for c in judged}
