"""GAIA-style QA: the normalised exact-match scorer, the JSONL adapter and its layouts, answers through the loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import HarnessConfig, ModelConfig
from hx.cli.run import select_tasks
from hx.environments.errors import BenchmarkError
from hx.environments.gaia import ENV_VAR, GaiaBenchmark, GaiaTask, extract_answer, read_questions
from hx.environments.gaia_scorer import as_number, gaia_match, normalise
from hx.environments.registry import TaskId, benchmark
from hx.environments.testing import check_adapter, play
from schemas.messages import ToolCall
from schemas.tools import EnvObservation, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_subject

FIXTURES = Path(__file__).parent / "fixtures" / "gaia"


# --- the scorer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "reference", "expected"), [
    # numbers: $ % and , dropped from the answer, compared as floats
    ("6", "6", True), ("6.0", "6", True), (" 6 ", "6", True), ("$1,250", "1250", True), ("1,250", "1250", True),
    ("12%", "12", True), ("0.5", ".5", True), ("-3", "-3", True), ("7", "6", False), ("six", "6", False),
    ("1250 dollars", "1250", False), ("", "0", False),
    # lists: split on , or ; element by element; numbers as numbers, strings without spaces, case folded
    ("2, 3, 5", "2, 3, 5", True), ("2,3,5", "2, 3, 5", True), ("2; 3; 5", "2, 3, 5", True),
    ("$2, 3.0, 5", "2, 3, 5", True), ("3, 2, 5", "2, 3, 5", False), ("2, 3", "2, 3, 5", False),
    ("2, 3, 5, 7", "2, 3, 5", False), ("Red;GREEN; blue", "red; green; blue", True),
    ("red; green; blue.", "red; green; blue", False),  # punctuation counts inside list elements
    ("New York, Paris", "new york, paris", True), ("a, b", "a; b", True),
    # strings: spaces and punctuation removed, case folded
    ("Jane Austen", "Jane Austen", True), ("jane austen.", "Jane Austen", True), ("JaneAusten", "Jane Austen", True),
    ("St. Louis", "St Louis", True), ("Austen", "Jane Austen", False), ("Au", "au", True), ("Ag", "Au", False),
    ("the Mercury", "Mercury", False), (None, "London", False), (None, "None", True),
])
def test_gaia_exact_match(answer: str | None, reference: str, expected: bool) -> None:
    assert gaia_match(answer, reference) is expected


def test_scorer_helpers() -> None:
    assert as_number("$1,000.50") == 1000.5 and as_number("ten") == float("inf")
    assert normalise(" Hello, World! ") == "helloworld"
    assert normalise(" Hello, World! ", punctuation=False) == "hello,world!"


@pytest.mark.parametrize(("content", "answer"), [
    ("The symbol is Au.\nFINAL ANSWER: Au", "Au"), ("final answer: 6", "6"), ("Mercury", "Mercury"),
    ("FINAL ANSWER: 1\nwait, no. FINAL ANSWER:  2 ", "2"), ("", ""),
])
def test_extract_answer(content: str, answer: str) -> None:
    assert extract_answer(content) == answer


# --- the files --------------------------------------------------------------------------------


def test_fixture_questions_and_levels() -> None:
    bench = GaiaBenchmark(FIXTURES)
    assert bench.games() == ("all", "level1", "level2", "level3")
    assert len(bench.task_ids("all", "dev")) == 10
    assert [len(bench.task_ids(f"level{n}", "dev")) for n in (1, 2, 3)] == [5, 3, 2]
    assert [str(t) for t in bench.task_ids("level3", "dev")] == ["gaia:level3:dev:0", "gaia:level3:dev:1"]
    assert bench.task_ids("all", "dev", limit=3) == bench.task_ids("all", "dev")[:3]
    task = bench.make_task(TaskId.parse("gaia:level2:dev:0"))
    assert isinstance(task, GaiaTask) and task.question.gaia_id == "hx-0004"
    attachment = Path(task.spec.meta["file"])
    assert attachment == (FIXTURES / "prices.jsonl").resolve() and attachment.is_file()
    assert task.spec.instruction.endswith(f"Attached file: {task.spec.meta['file']}")
    assert isinstance(benchmark("gaia"), GaiaBenchmark) and benchmark("gaia").family == "qa"


def test_a_bare_gaia_spec_runs_each_question_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(FIXTURES))
    benches, ids = select_tasks(["gaia"], "dev", 50)
    (bench,) = benches
    questions = [bench.make_task(t).question.gaia_id for t in ids]  # type: ignore[attr-defined]
    assert len(ids) == len(set(questions)) == 10  # not again under "all"
    assert {t.game for t in ids} == {"level1", "level2", "level3"}
    _, every = select_tasks(["gaia:all"], "dev", 50)
    assert len(every) == 10


def test_layouts_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [json.loads(line) for line in (FIXTURES / "dev.jsonl").read_text().splitlines()]
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:4]) + "\n\n")
    assert len(GaiaBenchmark(tmp_path).task_ids("all", "dev")) == 4  # GAIA's own layout; blank lines skipped
    with pytest.raises(BenchmarkError, match=r"no test questions; looked for .*test\.jsonl"):
        GaiaBenchmark(tmp_path).task_ids("all", "test")
    single = GaiaBenchmark(FIXTURES / "dev.jsonl")
    assert len(single.task_ids("level1", "dev")) == 5
    with pytest.raises(BenchmarkError, match="is one file, the dev split; no test split"):
        single.task_ids("all", "test")
    monkeypatch.setenv(ENV_VAR, str(FIXTURES))
    assert len(GaiaBenchmark().task_ids("all", "test")) == 2
    monkeypatch.delenv(ENV_VAR)
    with pytest.raises(BenchmarkError, match=f"no questions configured; set {ENV_VAR}"):
        GaiaBenchmark().task_ids("all", "dev")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"question": "lower case"}) + "\n")
    with pytest.raises(BenchmarkError, match=r"broken.jsonl:2: not a GAIA question"):
        read_questions(broken)
    with pytest.raises(BenchmarkError, match="level2 of dev has 3 questions"):
        GaiaBenchmark(FIXTURES).make_task(TaskId.parse("gaia:level2:dev:3"))
    with pytest.raises(BenchmarkError, match="no level 'level4'"):
        GaiaBenchmark(FIXTURES).task_ids("level4", "dev")


# --- tasks ----------------------------------------------------------------------------------


async def test_every_fixture_question_keeps_the_adapter_promises() -> None:
    bench = GaiaBenchmark(FIXTURES)
    for tid in bench.task_ids("all", "dev"):
        await check_adapter(bench, str(tid), between="gaia:level3:dev:1")


async def test_answers_by_tool_by_content_and_withheld_references() -> None:
    bench = GaiaBenchmark(FIXTURES)
    tool = await play(bench.make_task(TaskId.parse("gaia:all:dev:3")),
                      [ToolCall(id="a", name="final_answer", input={"answer": "$1,250"})])
    assert tool.done and tool.verdict == VerifierScore(verifier="gaia:exact_match", passed=True, score=1.0,
                                                       reward=1.0, detail="answer='$1,250'")
    assert [e.step for e in tool.events if isinstance(e, EnvObservation)] == [0, 1]
    number = await play(bench.make_task(TaskId.parse("gaia:all:dev:3")),
                        [ToolCall(id="a", name="final_answer", input={"answer": 1250}), ToolCall(
                            id="b", name="final_answer", input={"answer": "0"})])
    assert number.verdict.passed and len(number.steps) == 1  # the episode ended with the first answer
    content = await play(bench.make_task(TaskId.parse("gaia:level1:dev:1")), (),
                         final_answer="Gold is element 79.\nFINAL ANSWER: au")
    assert content.verdict.passed and not content.done
    wrong = await play(bench.make_task(TaskId.parse("gaia:level1:dev:1")), (), final_answer="FINAL ANSWER: Ag")
    assert not wrong.verdict.passed and wrong.verdict.score == 0.0
    bad = await play(bench.make_task(TaskId.parse("gaia:all:dev:0")), [ToolCall(id="a", name="final_answer",
                                                                                 input={})])
    assert bad.steps[0].is_error and not bad.done
    withheld = await play(bench.make_task(TaskId.parse("gaia:all:test:0")), (), final_answer="8")
    assert not withheld.verdict.passed and withheld.verdict.detail == "no reference answer in the file; answer='8'"


async def run_script(nats_url: str, task_id: str, completions: list[dict[str, Any]], run_id: str) -> Any:
    config = ModelConfig(main="script:qa", provider_options={"script:qa": {"completions": completions}})
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await config.agentic(HarnessConfig(), log=conn.log).run(
            GaiaBenchmark(FIXTURES).make_task(TaskId.parse(task_id)), run_id=run_id, max_steps=5)
        events = [r.event async for r in conn.log.read(subjects=[trace_subject(run_id, 0, task_id, 0)])]
    return result, events


async def test_answers_through_the_run_loop(nats_url: str) -> None:
    by_content, events = await run_script(nats_url, "gaia:level3:dev:0", [
        {"content": "She wrote it in 1813.\nFINAL ANSWER: Jane Austen", "stop_reason": "end_turn"}], "qa-content")
    assert (by_content.status, by_content.passed, by_content.steps) == ("completed", True, 1)
    [verdict] = [e for e in events if isinstance(e, VerifierScore)]
    assert verdict.detail == "answer='Jane Austen'"
    by_tool, _ = await run_script(nats_url, "gaia:level2:dev:2", [
        {"tool_calls": [{"id": "c1", "name": "final_answer", "input": {"answer": "Red; Green; Blue"}}]}], "qa-tool")
    assert (by_tool.status, by_tool.passed, by_tool.steps) == ("completed", True, 1)
    wrong, _ = await run_script(nats_url, "gaia:all:dev:9", [{"content": "FINAL ANSWER: Paris"}], "qa-wrong")
    assert (wrong.status, wrong.passed, wrong.score) == ("completed", False, 0.0)
