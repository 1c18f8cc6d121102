"""The suite file: one value from YAML, TOML or JSON, checked when loaded (errors name file, task and field), its
digest, its published JSON Schemas, generated-tasks files, and the default suite hx ships."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest
import tomli_w
import yaml

from hx.cli.evolve import DEFAULT_BENCHES
from hx.environments.registry import TaskId
from hx.eval.criteria import CRITERIA, judge
from hx.eval.errors import EvalError, SuiteInvalid, UnknownCriterion
from hx.eval.suite import (
    CriterionSpec,
    Suite,
    SuiteTask,
    checks_of,
    default_suite,
    load_generated,
    load_suite,
    suite_digest,
    with_tasks,
)
from hx.eval.suite_schema import DOCUMENTS, render_schemas, write_schemas
from projections.attempt_outputs import AttemptOutput
from schemas.jsonschema import DOCUMENT_SCHEMAS, JSON_DIR

ROOT = Path(__file__).resolve().parents[1]

SUITE: dict[str, Any] = {
    "name": "mini",
    "attempts": 2,
    "tasks": [
        {"name": "coin", "task": "twx:coin:dev:3",
         "criteria": [{"name": "task_verdict"}, {"name": "steps_at_most", "params": {"steps": 10}}]},
        {"name": "ask", "weight": 2.0, "out_of_domain": True,
         "free": {"instruction": "Capital of France?", "answer": "Paris",
                  "tools": [{"name": "atlas", "returns": "Paris is the capital of France."}]},
         "criteria": [{"name": "min_bytes", "params": {"n": 3}}]},
        {"name": "memory", "smoke": "memory"},
    ],
}


def write(path: Path, data: Any) -> Path:
    """``data`` in the format the suffix names."""
    if path.suffix == ".json":
        path.write_text(json.dumps(data))
    elif path.suffix == ".toml":
        path.write_text(tomli_w.dumps(data))
    else:
        path.write_text(yaml.safe_dump(data))
    return path


def changed(**task_fields: Any) -> dict[str, Any]:
    """The mini suite with the first task's fields replaced (None removes a field)."""
    first = {**SUITE["tasks"][0], **task_fields}
    return {**SUITE, "tasks": [{k: v for k, v in first.items() if v is not None}, *SUITE["tasks"][1:]]}


# --- loading -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".toml", ".json"])
def test_one_suite_from_every_format(tmp_path: Path, suffix: str) -> None:
    suite = load_suite(write(tmp_path / f"mini{suffix}", SUITE))
    assert suite == msgspec.convert(SUITE, Suite)
    assert suite_digest(suite) == suite_digest(load_suite(write(tmp_path / "again.json", SUITE)))
    coin, ask, memory = suite.tasks
    assert (suite.attempts, suite.max_steps, suite.success_weight, suite.criteria_weight) == (2, 50, 0.7, 0.3)
    assert (coin.task_id, ask.task_id, memory.task_id) == ("twx:coin:dev:3", "free:ask:dev:0", "")
    assert ask.free is not None and (ask.free.answer, ask.free.tools[0].returns) == ("Paris",
                                                                                    "Paris is the capital of France.")
    assert (ask.weight, ask.out_of_domain, coin.weight, coin.out_of_domain) == (2.0, True, 1.0, False)


def test_the_digest_names_the_content(tmp_path: Path) -> None:
    base = suite_digest(load_suite(write(tmp_path / "a.yaml", SUITE)))
    assert base.startswith("sha256:") and len(base) == 7 + 64
    assert suite_digest(load_suite(write(tmp_path / "b.yaml", {**SUITE, "attempts": 3}))) != base
    assert suite_digest(load_suite(write(tmp_path / "c.yaml", changed(task="twx:coin:dev:4")))) != base
    # the same value written with its defaults spelt out is the same suite
    spelt = {**SUITE, "max_steps": 50, "success_weight": 0.7, "description": ""}
    assert suite_digest(load_suite(write(tmp_path / "d.json", spelt))) == base


def test_checks_of_builds_each_criterion_in_order(tmp_path: Path) -> None:
    coin = load_suite(write(tmp_path / "s.yaml", SUITE)).tasks[0]
    (verdict_spec, verdict), (steps_spec, steps) = checks_of(coin)
    assert (verdict_spec, steps_spec) == (CriterionSpec(name="task_verdict"),
                                          CriterionSpec(name="steps_at_most", params={"steps": 10}))
    out = AttemptOutput("r", 0, "twx:coin:dev:3", 0, passed=True, steps=12)
    assert judge(verdict, out)[0] and judge(steps, out) == (False, "12 steps (need <= 10)")
    assert checks_of(SuiteTask(name="bare", smoke="memory")) == []


BAD: list[tuple[str, dict[str, Any], type[EvalError], str]] = [
    ("two kinds", changed(smoke="memory"), SuiteInvalid,
     "task 'coin': give exactly one of task, free or smoke (given: task, smoke)"),
    ("no kind", changed(task=None), SuiteInvalid, "task 'coin': give exactly one of task, free or smoke (given: none)"),
    ("bad id", changed(task="twx:coin:dev"), SuiteInvalid,
     "task 'coin': task: task id 'twx:coin:dev' must look like 'benchmark:game:split:seed'"),
    ("bad split", changed(task="twx:coin:val:0"), SuiteInvalid, "task 'coin': task: task id 'twx:coin:val:0': split"),
    ("unknown benchmark", changed(task="nope:coin:dev:0"), SuiteInvalid,
     "task 'coin': task: unknown benchmark 'nope' in 'nope:coin:dev:0'; known: "),
    ("free as an id", changed(task="free:coin:dev:0"), SuiteInvalid,
     "task 'coin': task: 'free:coin:dev:0': free tasks are given with 'free:', not as a task id"),
    ("unknown smoke", changed(task=None, smoke="disk"), SuiteInvalid,
     "task 'coin': smoke: 'disk' is not one of memory"),
    ("zero weight", changed(weight=0), SuiteInvalid, "task 'coin': Expected `float` > 0.0 - at `$.tasks[0].weight`"),
    ("unknown field", changed(wieght=2), SuiteInvalid,
     "task 'coin': Object contains unknown field `wieght` - at `$.tasks[0]`"),
    ("wrong type", changed(criteria="task_verdict"), SuiteInvalid,
     "task 'coin': Expected `array`, got `str` - at `$.tasks[0].criteria`"),
    ("bad name", changed(name="coin flip"), SuiteInvalid, "task 'coin flip': Expected `str` matching regex"),
    ("unknown criterion", changed(criteria=[{"name": "task_verdict"}, {"name": "steps_at_mots"}]), UnknownCriterion,
     "task 'coin': criterion 2: unknown criterion 'steps_at_mots'; known: "),
    ("bad parameter", changed(criteria=[{"name": "steps_at_most", "params": {"steps": "ten"}}]), EvalError,
     "task 'coin': criterion 1: criterion 'steps_at_most': Expected `int`, got `str` - at `$.steps`"),
    ("missing parameter", changed(criteria=[{"name": "min_bytes"}]), EvalError,
     "task 'coin': criterion 1: criterion 'min_bytes': Object missing required field `n`"),
    ("twice", {**SUITE, "tasks": [*SUITE["tasks"], {"name": "coin", "task": "twx:coin:dev:4"}]}, SuiteInvalid,
     "task 'coin': name is used twice"),
    ("no tasks", {**SUITE, "tasks": []}, SuiteInvalid, "tasks: the suite has no tasks"),
    ("no attempts", {**SUITE, "attempts": 0}, SuiteInvalid, "Expected `int` >= 1 - at `$.attempts`"),
    ("weights", {**SUITE, "success_weight": 0.5}, SuiteInvalid, "success_weight + criteria_weight must be 1, got 0.8"),
    ("no name", {k: v for k, v in SUITE.items() if k != "name"}, SuiteInvalid,
     "Object missing required field `name`"),
    ("empty instruction", changed(task=None, free={"instruction": "  "}), SuiteInvalid,
     "task 'coin': free.instruction is empty"),
    ("reserved tool", changed(task=None, free={"instruction": "x", "tools": [{"name": "final_answer"}]}),
     SuiteInvalid, "task 'coin': free.tools: 'final_answer' is offered by every free task"),
    ("tool twice", changed(task=None, free={"instruction": "x", "tools": [{"name": "a"}, {"name": "a"}]}),
     SuiteInvalid, "task 'coin': free.tools: tool 'a' is given twice"),
]


@pytest.mark.parametrize(("data", "error", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_suite_is_one_line_naming_file_task_and_field(tmp_path: Path, data: dict[str, Any],
                                                            error: type[EvalError], message: str) -> None:
    path = write(tmp_path / "bad.yaml", data)
    with pytest.raises(error) as caught:
        load_suite(path)
    text = str(caught.value)
    assert text.startswith(f"suite {path}: ") and message in text and "\n" not in text, text


@pytest.mark.parametrize(("name", "content", "message"), [
    ("s.txt", "name: x", "unknown suffix '.txt'; use .yaml, .yml, .toml or .json"),
    ("s.yaml", "name: [x", "not valid yaml: "),
    ("s.json", "{", "not valid json: "),
    ("s.toml", "name = ", "not valid toml: "),
    ("s.yaml", "- a list", "expected a mapping at the top, got list"),
    ("s.yaml", "", "expected a mapping at the top, got NoneType"),
])
def test_a_file_that_is_no_suite(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SuiteInvalid, match=r"^suite ") as caught:
        load_suite(path)
    assert str(caught.value).startswith(f"suite {path}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SuiteInvalid, match=r"^cannot read suite .*gone\.yaml: No such file or directory$"):
        load_suite(tmp_path / "gone.yaml")


# --- generated tasks -------------------------------------------------------------------------


GENERATED = {"generator": "test", "tasks": [
    {"name": "gen-1", "free": {"instruction": "Say hello."}, "criteria": [{"name": "answer_matches",
                                                                          "params": {"pattern": "hello"}}]},
    {"name": "gen-2", "task": "twx:coin:dev:9"},
]}


def test_generated_tasks_load_and_join_a_suite(tmp_path: Path) -> None:
    tasks = load_generated(write(tmp_path / "generated_tasks.json", GENERATED))
    assert [t.name for t in tasks] == ["gen-1", "gen-2"] and tasks[0].task_id == "free:gen-1:dev:0"
    suite = with_tasks(load_suite(write(tmp_path / "s.yaml", SUITE)), tasks)
    assert [t.name for t in suite.tasks] == ["coin", "ask", "memory", "gen-1", "gen-2"]
    with pytest.raises(SuiteInvalid, match=r"^generated tasks: task 'coin': the suite already has a task of that"):
        with_tasks(suite, (SuiteTask(name="coin", smoke="memory"),))


@pytest.mark.parametrize(("data", "message"), [
    ({"tasks": [{"name": "gen-1", "free": {"instruction": "x"}, "criteria": [{"name": "vibes"}]}]},
     "task 'gen-1': criterion 1: unknown criterion 'vibes'"),
    ({"tasks": [{"name": "gen-1", "free": {"instruction": "x", "answer": 4}}]},
     "task 'gen-1': Expected `str`, got `int` - at `$.tasks[0].free.answer`"),
    ({"tasks": [{"name": "gen-1", "task": "twx:coin:dev:0"}, {"name": "gen-1", "task": "twx:coin:dev:1"}]},
     "task 'gen-1': name is used twice"),
    ({"tasks": []}, "tasks: the file has no tasks"),
    ({"generator": "x"}, "Object missing required field `tasks`"),
    ({"tasks": [{"name": "gen-1", "smoke": "memory"}], "extra": 1}, "Object contains unknown field `extra`"),
])
def test_a_bad_generated_file_names_file_and_task(tmp_path: Path, data: dict[str, Any], message: str) -> None:
    path = write(tmp_path / "generated_tasks.json", data)
    with pytest.raises(EvalError) as caught:
        load_generated(path)
    assert str(caught.value).startswith(f"generated tasks {path}: ") and message in str(caught.value), caught.value


def test_a_generated_file_is_json(tmp_path: Path) -> None:
    with pytest.raises(SuiteInvalid, match=r"a generated-tasks file is JSON \(\.json\), got '\.yaml'"):
        load_generated(write(tmp_path / "generated.yaml", GENERATED))


# --- the published schemas -------------------------------------------------------------------


def test_the_published_schemas_are_the_structs() -> None:
    assert set(DOCUMENTS) == DOCUMENT_SCHEMAS
    rendered = render_schemas()
    for fname, text in rendered.items():
        assert (JSON_DIR / fname).read_text() == text, f"{fname} is out of date: run `python -m hx.eval.suite_schema`"


def test_write_schemas_writes_them(tmp_path: Path) -> None:
    assert sorted(p.name for p in write_schemas(tmp_path)) == sorted(DOCUMENT_SCHEMAS)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == render_schemas()


def test_the_schemas_hold_the_constraints_the_loader_checks() -> None:
    suite = json.loads((JSON_DIR / "suite.json").read_text())
    defs = suite["$defs"]
    assert suite["$ref"] == "#/$defs/Suite" and defs["Suite"]["required"] == ["name", "tasks"]
    assert defs["Suite"]["properties"]["attempts"]["minimum"] == 1
    assert defs["SuiteTask"]["properties"]["weight"]["exclusiveMinimum"] == 0
    assert defs["SuiteTask"]["properties"]["name"]["pattern"] == defs["ToolSpec"]["properties"]["name"]["pattern"]
    assert all(d["additionalProperties"] is False for d in defs.values())
    generated = json.loads((JSON_DIR / "generated-tasks.json").read_text())
    assert generated["$defs"]["SuiteTask"] == defs["SuiteTask"]


# --- the default suite ------------------------------------------------------------------------


def test_the_default_suite_ships_with_the_package() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["hx"]
    assert any(fnmatch.fnmatch("eval/default_suite.yaml", p) for p in patterns)
    assert default_suite() == load_suite(ROOT / "hx" / "eval" / "default_suite.yaml")


def test_the_default_suite_spans_every_family_with_an_out_of_domain_task_each() -> None:
    suite = default_suite()
    family = {"twx": "textworld", "sciworld": "scienceworld"}
    seen: dict[str, list[SuiteTask]] = {}
    for task in suite.tasks:
        if task.task:
            seen.setdefault(family[TaskId.parse(task.task).benchmark], []).append(task)
        elif task.free is not None:
            seen.setdefault("qa", []).append(task)  # no GAIA data ships with hx: question answering is free tasks
        else:
            seen.setdefault("smoke", []).append(task)
    assert set(seen) == {"textworld", "scienceworld", "qa", "smoke"}
    def evolved(task: SuiteTask) -> bool:  # in a default hx evolve set (BENCH or BENCH:GAME); free tasks never are
        tid = TaskId.parse(task.task) if task.task else None
        return tid is not None and bool({tid.benchmark, f"{tid.benchmark}:{tid.game}"} & set(DEFAULT_BENCHES))

    for name in ("textworld", "scienceworld", "qa"):
        outside = [t for t in seen[name] if t.out_of_domain]
        assert outside, f"no out-of-domain {name} task"
        assert not [t.name for t in outside if evolved(t)]
        assert not [t.name for t in seen[name] if not t.out_of_domain and not evolved(t)]
    assert [t for t in seen["textworld"] if evolved(t)]  # and one the default evolution trains on
    assert [t.smoke for t in seen["smoke"]] == ["memory"]


def test_every_criterion_hx_ships_is_used_by_the_default_suite() -> None:
    used = {spec.name for task in default_suite().tasks for spec in task.criteria}
    assert not set(CRITERIA) - used, f"criteria no default suite task uses: {sorted(set(CRITERIA) - used)}"


def test_the_document_criteria_judge_a_task_whose_output_is_a_document() -> None:
    for task in default_suite().tasks:
        for spec in task.criteria:
            if CRITERIA[spec.name].document:
                assert task.free is not None and "Markdown" in task.free.instruction, (task.name, spec.name)


def test_the_examples_in_docs_eval_load(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "eval.md").read_text()
    suite_yaml = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    suite = load_suite(write(tmp_path / "mine.yaml", yaml.safe_load(suite_yaml)))
    assert [t.task_id for t in suite.tasks] == ["twx:coin:dev:3", "free:capital:dev:0", ""]
    generated = text.split("```json\n", 1)[1].split("```", 1)[0]
    (tmp_path / "tasks.json").write_text(generated)
    assert [t.name for t in load_generated(tmp_path / "tasks.json")] == ["gen-greeting"]
