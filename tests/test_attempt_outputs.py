"""The attempt_outputs projection over real attempts on a real nats-server, checked against the log and the runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from toybench import RANDOM, ToyBench, ids

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import HarnessConfig, ModelConfig
from hx.environments.gaia import GaiaBenchmark
from hx.environments.registry import TaskId
from hx.environments.rollout import Rollout, RolloutSettings
from hx.environments.twx import TextWorldExpressBenchmark
from hx.eval.criteria import build, judge
from hx.harnesses import starter_harness
from hx.processors.llm_judge import LlmJudge
from hx.runtime.loop import AttemptResult
from hx.runtime.task import Task
from projections.attempt_outputs import AttemptOutput, AttemptOutputs, output_key
from projections.base import Projection
from projections.runner import ProjectionRunner
from projections.testing import ProjectionKit
from schemas.envelope import Record
from schemas.lifecycle import AttemptStarted
from schemas.model import ModelResponse
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import TRACE, TraceAddress, trace_filter

GAIA = Path(__file__).parent / "fixtures" / "gaia"


def call(i: int, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": f"c{i}", "name": name, "input": arguments}


async def play(nats_url: str, task: Task, completions: list[dict[str, Any]], run_id: str, max_steps: int = 20,
               harness: HarnessConfig | None = None, judge: list[dict[str, Any]] | None = None,
               ) -> tuple[AttemptResult, list[Record], dict[str, AttemptOutput]]:
    """One scripted attempt: its result, its records on the log, and the projection rebuilt from the log."""
    options = {"script:m": {"completions": completions}, "script:j": {"completions": judge or []}}
    config = ModelConfig(main="script:m", judge="script:j", provider_options=options)
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await config.agentic(harness or HarnessConfig(), log=conn.log).run(task, run_id=run_id,
                                                                                    max_steps=max_steps)
        records = [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter(run_id)])]
        outputs = await ProjectionRunner(conn.log, AttemptOutputs()).rebuild()
    return result, records, outputs


def longest_run(calls: list[ToolInvoked]) -> int:
    """The longest run of identical calls, counted from the log the plain way."""
    best = run = 0
    last: tuple[str, Any] | None = None
    for event in calls:
        now = (event.call.name, dict(event.call.input))
        run = run + 1 if now == last else 1
        best, last = max(best, run), now
    return best


def events_of(records: list[Record], kind: type[Any]) -> list[Any]:
    return [r.event for r in records if isinstance(r.event, kind)]


async def test_a_text_game_attempt_counts_invalid_actions_tool_errors_repeats_and_the_answer(nats_url: str) -> None:
    task = TextWorldExpressBenchmark().make_task(TaskId.parse("twx:coin:dev:0"))
    script: list[dict[str, Any]] = [
        {"tool_calls": [call(1, "act", action="look around")]},
        {"tool_calls": [call(2, "act", action="look around")]},
        {"content": "Looking again.", "tool_calls": [call(3, "act", action="look around")]},
        {"tool_calls": [call(4, "act", action="fly to the moon")]},  # not among the valid actions
        {"tool_calls": [call(5, "dig", where="here")]},  # a tool the task does not have
        {"tool_calls": [call(6, "act", action="look around"), call(7, "act", action="inventory")]},
        {"content": "I give up: no coin in sight.", "stop_reason": "end_turn"},
    ]
    result, records, outputs = await play(nats_url, task, script, "outputs-twx")
    out = outputs[output_key("outputs-twx", 0, "twx:coin:dev:0", 0)]
    assert list(outputs) == [out.key]

    observations = events_of(records, EnvObservation)
    invoked = events_of(records, ToolInvoked)
    returned = events_of(records, ToolReturned)
    [started] = events_of(records, AttemptStarted)
    # what the run itself said
    assert (out.finished, out.status, out.passed, out.score, out.steps) == (
        True, result.status, result.passed, result.score, result.steps)
    assert (out.status, out.steps, out.passed) == ("completed", 7, False)
    assert out.answer == result.final_answer == "I give up: no coin in sight." == out.text and out.submitted == ""
    # what the log says, counted here the plain way
    assert out.invalid_actions == sum(bool(o.info["invalid"]) for o in observations) == 1
    assert out.tool_errors == sum(r.result.is_error for r in returned) == 1
    assert out.actions == len(invoked) == 7
    assert out.tool_calls == {"act": 6, "dig": 1}
    assert out.longest_repeat == longest_run(invoked) == 3
    assert (out.model, out.harness_digest) == (started.model, started.harness_digest) == ("script:m",
                                                                                          HarnessConfig().digest)
    assert not out.env_done and not out.env_success and not out.answer_cut
    # the criteria judge it as it went
    checks: list[tuple[str, dict[str, Any]]] = [("no_invalid_actions", {"at_most": 2}), ("no_loop", {}),
                                                ("tools_known", {"known": ["act"]})]
    verdicts = {name: judge(build(name, params, where="t"), out)[0] for name, params in checks}
    assert verdicts == {"no_invalid_actions": True, "no_loop": False, "tools_known": False}
    assert judge(build("no_invalid_actions", {}, where="t"), out) == (
        False, "1 invalid actions + 1 tool errors = 2 of 7 actions (need <= 0)")


async def test_a_qa_attempt_submits_its_answer_through_the_final_answer_tool(nats_url: str) -> None:
    bench = GaiaBenchmark(GAIA)
    number = [{"content": "Adding the prices.", "tool_calls": [call(1, "final_answer", answer=1250)]}]
    result, records, outputs = await play(nats_url, bench.make_task(TaskId.parse("gaia:all:dev:3")), number, "qa-n")
    out = outputs[output_key("qa-n", 0, "gaia:all:dev:3", 0)]
    assert (out.passed, out.status, out.steps, out.score) == (True, "completed", result.steps, 1.0) and result.passed
    assert (out.submitted, out.answer, out.text) == ("1250", "Adding the prices.", "1250")
    assert out.env_done and out.tool_calls == {"final_answer": 1} and out.invalid_actions == out.tool_errors == 0
    assert judge(build("answer_matches", {"pattern": r"^\d+$"}, where="t"), out) == (
        True, r"/^\d+$/ matched '1250' at character 0")

    refused = [{"tool_calls": [call(1, "final_answer")]},  # no answer: the tool says so
               {"tool_calls": [call(2, "final_answer", answer="Blue")]},
               {"tool_calls": [call(3, "final_answer", answer="Red; Green; Blue")]}]
    result, records, outputs = await play(nats_url, bench.make_task(TaskId.parse("gaia:level2:dev:2")), refused,
                                          "qa-s")
    out = outputs[output_key("qa-s", 0, "gaia:level2:dev:2", 0)]
    [submitted] = [o.info["answer"] for o in events_of(records, EnvObservation) if "answer" in o.info]
    assert out.submitted == submitted == "Blue" and out.answer == ""  # the episode ended with the first answer
    assert (out.passed, out.steps, out.tool_errors, out.actions) == (result.passed, 2, 1, 2) and not out.passed
    assert len(outputs) == 2  # both runs' attempts, each under its own key


async def test_the_answer_is_the_main_models_not_a_judges_a_processor_called(nats_url: str) -> None:
    harness = HarnessConfig().attach(LlmJudge.accepted_hooks(), LlmJudge())  # calls the judge role, on the log
    task = GaiaBenchmark(GAIA).make_task(TaskId.parse("gaia:level1:dev:1"))
    result, records, outputs = await play(nats_url, task, [{"content": "Gold is Au.\nFINAL ANSWER: Au"}], "judged",
                                          harness=harness, judge=[{"content": "VERDICT: PASS\nRight element."}])
    out = outputs[output_key("judged", 0, "gaia:level1:dev:1", 0)]
    roles = [(e.role, e.content) for e in events_of(records, ModelResponse)]
    assert roles == [("main", "Gold is Au.\nFINAL ANSWER: Au"), ("judge", "VERDICT: PASS\nRight element.")]
    assert out.answer == out.text == result.final_answer == "Gold is Au.\nFINAL ANSWER: Au" and out.passed


async def test_random_attempts_of_a_rollout_agree_with_the_rounds_results_and_the_log(nats_url: str) -> None:
    tasks = ["twx:coin:dev:1", "twx:coin:dev:2"]
    async with connect(NatsSettings(url=nats_url)) as conn:
        bench = TextWorldExpressBenchmark()
        try:
            played = await Rollout(bench, RANDOM, starter_harness("textworld"), log=conn.log, harness_source="s",
                                   settings=RolloutSettings(attempts=2, concurrency=2, max_steps=12)).rollout(
                "outputs-random", tasks)
        finally:
            bench.close()
        records = [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter("outputs-random")])]
        outputs = await ProjectionRunner(conn.log, AttemptOutputs()).rebuild()
    assert len(played.results) == 4 and len(outputs) == 4
    for r in played.results:
        out = outputs[output_key("outputs-random", 0, r.task_id, r.attempt)]
        mine = [rec for rec in records if (TraceAddress.parse(rec.subject).task,
                                           TraceAddress.parse(rec.subject).attempt) == (r.task_id, r.attempt)]
        invoked = events_of(mine, ToolInvoked)
        observations = events_of(mine, EnvObservation)
        assert mine and (out.passed, out.steps, out.status, out.score) == (r.passed, r.steps, r.status, r.score)
        assert out.actions == len(invoked) == out.tool_calls["act"] and set(out.tool_calls) == {"act"}
        assert out.invalid_actions == sum(bool(o.info["invalid"]) for o in observations) == 0  # random picks valid
        assert out.longest_repeat == longest_run(invoked)
        assert out.env_success == any(o.success for o in observations) == r.passed
        assert out.model == "random:" and out.finished


class TestAttemptOutputsKit(ProjectionKit):
    """Live, resumed and rebuilt folds of real attempts agree."""

    def make_projection(self) -> Projection[Any]:
        return AttemptOutputs()

    async def append_events(self, log: EventLog) -> AsyncIterator[object]:
        loop = RANDOM.agentic(starter_harness("textworld"), log=log)
        bench = ToyBench()
        for n, task_id in enumerate(ids("walk", 3)):
            await loop.run(bench.make_task(TaskId.parse(task_id)), run_id="kit", attempt=n, seed=n, max_steps=6)
            yield n
