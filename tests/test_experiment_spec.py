"""Experiment specs: both shapes load from YAML, TOML and JSON; a spec changing two things is rejected."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import yaml
from hx_cli import error_line, hx

from hx.experiment.errors import FalsifyUnparsed, SpecRejected
from hx.experiment.falsify import evaluate, parse
from hx.experiment.spec import cells, load_spec, parse_spec, spec_digest, spec_schema
from schemas.evaluation import Bounds
from schemas.jsonschema import JSON_DIR

SEED: dict[str, Any] = {
    "title": "Prior knowledge pass",
    "hypothesis": "Injecting a KB doc raises pass rate",
    "falsified_if": 'diff_high(passed, "on", "off") <= 0',
    "factor": {"name": "prior_knowledge_pass", "levels": ["off", "on"]},
    "tasks": ["twx:coin:dev:0"],
    "replications": 3,
    "response_variables": ["passed", "steps"],
    "controlled_variables": {"model": "random", "max_steps": 10},
    "mutable_scope": {"type": "env", "var": "HX_PRIOR_KNOWLEDGE", "levels": {"off": "", "on": "1"}},
}


def spec(**changes: Any) -> dict[str, Any]:
    """The native shape of SEED with changes applied."""
    data = copy.deepcopy(SEED)
    factor, scope = data.pop("factor"), data.pop("mutable_scope")
    data["factors"] = [{**factor, "scope": {"kind": scope["type"], "target": scope["var"],
                                            "levels": scope["levels"]}}]
    data.update(changes)
    return data


def scoped(kind: str, target: str, levels: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A one-factor spec whose scope is (kind, target, levels)."""
    data = spec(**changes)
    data["factors"][0]["scope"] = {"kind": kind, "target": target, "levels": levels}
    data["factors"][0]["levels"] = list(levels)
    return data


def rejected(data: dict[str, Any]) -> str:
    with pytest.raises(SpecRejected) as caught:
        parse_spec(data, where="exp.yaml")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("exp.yaml: ")
    return message


def test_the_seed_shape_normalises_to_factors() -> None:
    loaded = parse_spec(SEED, where="seed.json")
    assert loaded == parse_spec(spec(), where="native.json")
    (factor,) = loaded.factors
    assert (factor.name, factor.levels) == ("prior_knowledge_pass", ("off", "on"))
    assert (factor.scope.kind, factor.scope.target) == ("env", "HX_PRIOR_KNOWLEDGE")
    assert loaded.design == "crd" and loaded.seed == 42


@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".json"])
def test_every_format_loads_the_same_spec(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"exp{suffix}"
    dumps: dict[str, Callable[[dict[str, Any]], str]] = {
        ".yaml": yaml.safe_dump, ".toml": tomli_w.dumps, ".json": json.dumps}
    path.write_text(dumps[suffix](SEED))
    assert spec_digest(load_spec(path)) == spec_digest(parse_spec(SEED))


def test_a_file_that_does_not_parse_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("title: [unclosed\n")
    with pytest.raises(SpecRejected, match=r"broken\.yaml: not valid yaml"):
        load_spec(path)
    with pytest.raises(SpecRejected, match="unknown suffix"):
        load_spec(tmp_path / "exp.txt")


def test_a_wrong_type_names_the_field() -> None:
    assert "$.replications" in rejected(spec(replications="three"))
    assert "kind" in rejected(scoped("knob", "x", {"off": 0, "on": 1}))


@pytest.mark.parametrize(("data", "fragment"), [
    (scoped("processor_param", "loop_guard.window", {"off": {"window": 3, "limit": 2}, "on": {"window": 5}}),
     "sets 2 parameters"),
    (scoped("procedure", "evolve", {"a": {"budget": 2}, "b": {"rounds": 2}}), "differ in keys"),
    (scoped("processor_param", "loop_guard.max_steps", {"off": 5, "on": 9}), "controlled variable(s) max_steps"),
    (scoped("model", "main", {"a": "random", "b": "openai:gpt-4o"}), "controlled variable(s) model"),
    (spec(controlled_variables={"env": {"HX_PRIOR_KNOWLEDGE": "1"}}), "controlled variable(s) HX_PRIOR_KNOWLEDGE"),
    (scoped("env", "X", {"only": "1"}), "at least 2"),
    (spec(replications=0), "replications: is 0"),
    (spec(response_variables=["passed", "wiggum_r1"]), "unknown wiggum_r1"),
    (spec(falsified_if="mean(on) - mean(off) < 0.5 across all replications"), "falsified_if: does not parse"),
    (spec(falsified_if='__import__("os").system("true")'), "unknown function"),
    (spec(falsified_if='mean(passed, "on") < off'), "unknown name 'off'"),
    (spec(falsified_if='mean(passed, "on").real < 1'), "not allowed"),
    (spec(falsified_if='mean(score, "on") < 1'), "score, not a response variable"),
    (spec(falsified_if='mean(passed, "maybe") < 1'), "'maybe'"),
    (spec(falsified_if='mean(passed, "on")'), "must be a comparison"),
    (scoped("procedure", "evolve", {"off": None, "on": {"artifact_of": "gone"}}), "unknown level 'gone'"),
    (scoped("procedure", "evolve", {"off": None, "on": {"artifact_of": "on"}}), "names the level itself"),
    (scoped("procedure", "evolve", {"off": None, "on": {"artifact_of": "off"}}), "runs no procedure"),
    (scoped("env", "X", {"off": "", "on": {"artifact_of": "off"}}), "needs a procedure scope"),
    (scoped("procedure", "grow", {"off": None, "on": {"budget": 1}}), "evolve or coevolve"),
    (scoped("processor_param", "window", {"off": 1, "on": 2}), "<processor>.<parameter>"),
])
def test_unsound_specs_are_rejected_with_the_reason(data: dict[str, Any], fragment: str) -> None:
    assert fragment in rejected(data)


def test_scope_levels_must_match_the_factors() -> None:
    data = spec()
    data["factors"][0]["scope"]["levels"] = {"off": "", "yes": "1"}
    message = rejected(data)
    assert "factors[0].scope.levels" in message and "'yes'" in message and "'on'" in message


def test_two_mutable_scopes_are_rejected_unless_a_declared_factorial() -> None:
    two = spec()
    two["factors"].append({"name": "guard", "levels": ["off", "on"],
                           "scope": {"kind": "processor", "target": "loop_guard",
                                     "levels": {"off": False, "on": True}}})
    assert "2 factors change 2 things; declare design: factorial" in rejected(two)
    seed_and_native = dict(SEED, factors=two["factors"])
    assert "not both" in rejected(seed_and_native)
    by_factor = 'diff_high(passed, "prior_knowledge_pass=on", "prior_knowledge_pass=off") <= 0'
    factorial = parse_spec(dict(two, design="factorial", falsified_if=by_factor))
    assert [",".join(f"{k}={v}" for k, v in c.items()) for c in cells(factorial)][:2] == [
        "prior_knowledge_pass=off,guard=off", "prior_knowledge_pass=off,guard=on"]
    same_scope = copy.deepcopy(two)
    same_scope["factors"][1]["scope"] = same_scope["factors"][0]["scope"]
    assert "same scope" in rejected(dict(same_scope, design="factorial", falsified_if=by_factor))
    by_cell = 'diff(passed, "prior_knowledge_pass=on,guard=on", "prior_knowledge_pass=off,guard=off") > 0'
    assert "compare two levels of one factor" in rejected(dict(two, design="factorial", falsified_if=by_cell))
    across = 'diff(passed, "prior_knowledge_pass=on", "guard=off") > 0'
    assert "compare two levels of one factor" in rejected(dict(two, design="factorial", falsified_if=across))
    assert "more than one factor" in rejected(dict(two, design="factorial", falsified_if='mean(passed, "on") < 1'))


def test_a_procedure_spec_with_an_artifact_level_is_accepted() -> None:
    loaded = parse_spec(scoped("procedure", "evolve", {"base": None, "evolved": {"budget": 2},
                                                       "replayed": {"artifact_of": "evolved"}},
                               falsified_if='diff_high(passed, "evolved", "base") <= 0'))
    assert loaded.factors[0].levels == ("base", "evolved", "replayed")


class _Results:
    def level_mean(self, variable: str, level: str) -> Bounds | None:
        means = {"off": Bounds(estimate=0.2, low=0.1, high=0.4, confidence=0.95, method="wilson"),
                 "on": Bounds(estimate=0.6, low=0.4, high=0.8, confidence=0.95, method="wilson")}
        return means.get(level)

    def effect(self, variable: str, level: str, reference: str) -> tuple[Bounds, Bounds] | None:
        if (level, reference) != ("on", "off"):
            return None
        diff = Bounds(estimate=0.4, low=0.1, high=0.7, confidence=0.95, method="paired bootstrap")
        return diff, Bounds(estimate=1.2, low=0.3, high=2.0, confidence=0.95, method="bootstrap")


@pytest.mark.parametrize(("source", "expected"), [
    ('diff_high(passed, "on", "off") <= 0', False),
    ('diff_low(passed, "on", "off") > 0 and effect(passed, "on", "off") >= 1', True),
    ('diff_high(passed, "off", "on") < 0', True),  # the reverse pair: -(low of on-off)
    ('not mean(passed, "on") - mean(passed, "off") >= 0.5', True),
    ('high("passed", "off") < low(passed, "on") or 1 / 0 > 1', None),
    ('mean(passed, "missing") > 0', None),
])
def test_falsified_if_evaluates_against_the_results(source: str, expected: bool | None) -> None:
    verdict, detail = evaluate(parse(source), _Results())
    assert verdict is expected
    assert detail.startswith(source)


def test_the_detail_fills_in_the_values() -> None:
    _, detail = evaluate(parse('diff_high(passed, "on", "off") <= 0'), _Results())
    assert detail.endswith("0.7 <= 0 is False")


def test_parse_never_evaluates_python() -> None:
    for source in ('(lambda: 1)() > 0', '[1][0] > 0', 'mean(passed, "on") if 1 else 0', 'x.y > 0',
                   'mean(passed, level="on") > 0', '"a" < "b"'):
        with pytest.raises(FalsifyUnparsed):
            parse(source)


def test_published_schema_is_the_struct() -> None:
    published = json.loads((JSON_DIR / "experiment-spec.json").read_text())
    assert published == spec_schema()
    assert published["title"] == "experiment-spec"



def test_the_cli_rejects_a_spec_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    path.write_text(json.dumps(spec(replications=0)))
    line = error_line(hx("experiment", "run", str(path)))
    assert line == f"error: {path}: replications: is 0; at least 1"
