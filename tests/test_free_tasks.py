"""Free tasks: a suite's instruction-and-tools tasks as a benchmark (``free:<name>:dev:0``), kept to the adapter
kit's promises, judged by normalised match or by any answer, and played through the real run loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hx_cli
import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import ModelConfig
from hx.environments.errors import BenchmarkError
from hx.environments.registry import BENCHMARKS, TaskId, benchmark
from hx.environments.testing import check_adapter, play
from hx.eval.criteria import judge
from hx.eval.free import ANY_ANSWER, FreeBenchmark, free_benchmark, register_free
from hx.eval.suite import CriterionSpec, FreeTask, Suite, SuiteTask, ToolSpec, checks_of, default_suite
from hx.harnesses import starter_harness
from projections.attempt_outputs import AttemptOutputs, output_key
from projections.runner import ProjectionRunner
from schemas.messages import ToolCall
from schemas.tools import EnvObservation
from streams.config import NatsSettings
from streams.connection import connect

LOOKUP = ToolSpec(name="lookup", description="Look a topic up.", returns="Paris is the capital of France.",
                  input_schema={"type": "object", "properties": {"topic": {"type": "string", "enum": ["france"]}},
                                "required": ["topic"]})
SUITE = Suite(name="free-test", tasks=(
    SuiteTask(name="capital", free=FreeTask(instruction="What is the capital of France?", answer="Paris",
                                            tools=(LOOKUP,), system_prompt="Be brief.")),
    SuiteTask(name="essay", free=FreeTask(instruction="Write anything.")),
    SuiteTask(name="coin", task="twx:coin:dev:0"),
    SuiteTask(name="memory", smoke="memory"),
))


def submit(answer: Any, i: int = 0) -> ToolCall:
    return ToolCall(id=f"s{i}", name="final_answer", input={"answer": answer})


def test_one_game_per_free_task_played_as_dev_0() -> None:
    bench = free_benchmark(SUITE)
    assert isinstance(bench, FreeBenchmark) and (bench.name, bench.family) == ("free", "qa")
    assert bench.games() == ("capital", "essay")
    assert [str(t) for t in bench.task_ids("capital", "dev")] == ["free:capital:dev:0"]
    assert bench.task_ids("capital", "dev", limit=0) == []
    with pytest.raises(BenchmarkError, match="free task 'capital' has only the dev split, not 'test'"):
        bench.task_ids("capital", "test")
    with pytest.raises(BenchmarkError, match="no free task 'coin' in this suite; free tasks: capital, essay"):
        bench.make_task(TaskId.parse("free:coin:dev:0"))
    with pytest.raises(BenchmarkError, match=r"'free:capital:dev:1': a free task is played only as free:capital:dev:0"):
        bench.make_task(TaskId.parse("free:capital:dev:1"))
    with pytest.raises(BenchmarkError, match="is not a free task"):
        bench.make_task(TaskId.parse("twx:capital:dev:0"))
    assert starter_harness(bench.family)  # the qa starter harness applies


async def test_free_tasks_keep_the_adapter_promises() -> None:
    bench = free_benchmark(SUITE)
    await check_adapter(bench, "free:capital:dev:0")
    await check_adapter(bench, "free:essay:dev:0")
    for suite_task in default_suite().tasks:
        if suite_task.free is not None:
            await check_adapter(free_benchmark(default_suite()), suite_task.task_id)


async def test_the_task_offers_its_canned_tools_and_final_answer() -> None:
    task = free_benchmark(SUITE).make_task(TaskId.parse("free:capital:dev:0"))
    first = await task.reset()
    assert first == "What is the capital of France?" == task.spec.instruction and task.system_prompt == "Be brief."
    assert (task.spec.benchmark, task.spec.meta) == ("free", {"free_task": "capital"})
    lookup, final = task.tools()
    assert (lookup.schema.name, lookup.schema.description, final.schema.name) == ("lookup", "Look a topic up.",
                                                                                  "final_answer")
    assert lookup.schema.input_schema == LOOKUP.input_schema
    for given in ({"topic": "france"}, {"anything": [1, 2]}, {}):  # whatever the input: the fixed text
        result = await lookup.call(ToolCall(id="l", name="lookup", input=given))
        assert (result.output, result.is_error) == ("Paris is the capital of France.", False)
    assert task.solution() == ("Paris",)
    bare = free_benchmark(SUITE).make_task(TaskId.parse("free:essay:dev:0"))
    assert [t.schema.name for t in bare.tools()] == ["final_answer"] and bare.system_prompt  # qa's default prompt
    assert bare.solution() == () and bare.gold_answer() == ANY_ANSWER
    no_schema = FreeBenchmark({"t": FreeTask(instruction="x", tools=(ToolSpec(name="ping"),))}).make_task(
        TaskId.parse("free:t:dev:0"))
    assert no_schema.tools()[0].schema.input_schema == {"type": "object", "properties": {}}


@pytest.mark.parametrize(("calls", "content", "passed", "detail"), [
    ([submit("  paris ")], "", True, "answer='  paris '"),  # normalised: case and spaces
    ([submit("Paris."), submit("Rome", 1)], "", True, "answer='Paris.'"),  # the episode ended with the first
    ([submit("Lyon")], "FINAL ANSWER: Paris", False, "answer='Lyon'"),  # the submitted answer wins
    ([], "It is Paris.\nFINAL ANSWER: Paris", True, "answer='Paris'"),  # else the last message's final answer
    ([], "", False, "answer=''"),
    ([ToolCall(id="x", name="final_answer", input={})], "", False, "answer=''"),  # an error result, no answer
])
async def test_an_expected_answer_is_matched_normalised(calls: list[ToolCall], content: str, passed: bool,
                                                         detail: str) -> None:
    played = await play(free_benchmark(SUITE).make_task(TaskId.parse("free:capital:dev:0")), calls, content)
    assert (played.verdict.passed, played.verdict.detail, played.verdict.verifier) == (passed, detail,
                                                                                       "free:exact_match")
    assert played.verdict.score == float(passed) == played.verdict.reward
    assert played.done == bool(calls and "answer" in calls[0].input)


@pytest.mark.parametrize(("calls", "content", "passed"), [
    ([submit("anything at all")], "", True), ([], "some words", True), ([submit(" ")], "", False), ([], "  ", False),
    ([submit(0)], "", True),
])
async def test_with_no_expected_answer_any_answer_passes(calls: list[ToolCall], content: str, passed: bool) -> None:
    played = await play(free_benchmark(SUITE).make_task(TaskId.parse("free:essay:dev:0")), calls, content)
    assert (played.verdict.passed, played.verdict.verifier) == (passed, "free:answered")


async def test_a_long_answer_is_cut_in_the_detail() -> None:
    played = await play(free_benchmark(SUITE).make_task(TaskId.parse("free:essay:dev:0")), [submit("x" * 5000)])
    assert played.verdict.passed and len(played.verdict.detail) < 250 and played.verdict.detail.endswith("...'")
    assert [e.observation[:17] for e in played.events if isinstance(e, EnvObservation)] == [
        "Write anything.", "answer submitted:"]


async def test_a_free_task_through_the_run_loop_is_judged_by_its_criteria(nats_url: str) -> None:
    suite = Suite(name="loop", tasks=(SuiteTask(name="capital", free=SUITE.tasks[0].free, criteria=(
        CriterionSpec(name="task_verdict"), CriterionSpec(name="tool_used", params={"name": "lookup"}),
        CriterionSpec(name="tools_known", params={"known": ["lookup", "final_answer"]}),
        CriterionSpec(name="answer_matches", params={"pattern": "^Paris$"}))),))
    bench = free_benchmark(suite)
    completions = [{"tool_calls": [{"id": "c1", "name": "lookup", "input": {"topic": "france"}}]},
                   {"tool_calls": [{"id": "c2", "name": "final_answer", "input": {"answer": "Paris"}}]}]
    config = ModelConfig(main="script:m", provider_options={"script:m": {"completions": completions}})
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await config.agentic(starter_harness("qa"), log=conn.log).run(
            bench.make_task(TaskId.parse("free:capital:dev:0")), run_id="free-loop", max_steps=5)
        outputs = await ProjectionRunner(conn.log, AttemptOutputs()).rebuild()
    assert (result.status, result.passed, result.steps) == ("completed", True, 2)
    out = outputs[output_key("free-loop", 0, "free:capital:dev:0", 0)]
    assert (out.submitted, out.tool_calls) == ("Paris", {"lookup": 1, "final_answer": 1})
    verdicts = [judge(check, out) for _, check in checks_of(suite.tasks[0])]
    assert all(passed for passed, _ in verdicts), verdicts


def test_a_registered_free_benchmark_runs_under_hx_run(tmp_path: Path, nats_url: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BENCHMARKS, "_added", dict(BENCHMARKS._added))  # this test's registration ends with it
    registered = register_free(SUITE)
    assert benchmark("free") is registered
    out = tmp_path / "results.json"
    hx_cli.ok(hx_cli.hx("--nats-url", nats_url, "--data-dir", str(tmp_path / "data"), "run", "--bench", "free:capital",
          "--model", "random:", "--attempts", "2", "--max-steps", "4", "--run-id", "free-random", "--out", str(out)))
    results = json.loads(out.read_text())
    assert (results["harness"], results["model"]) == ("starter:qa", "random:")  # the family's starter harness
    [task] = results["tasks"]
    # the random agent plays the enumerated lookup tool to the step cap and never answers
    assert (task["task_id"], task["passes"], task["steps"], task["infra_failures"]) == ("free:capital:dev:0", 0,
                                                                                        [4, 4], 0)
