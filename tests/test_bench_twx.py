"""TextWorldExpress adapter: real episodes of all eight games, the act tool, events, the JVM pool and crashes."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import HarnessConfig, ModelConfig, Task
from hx.environments.errors import BenchmarkError, EnvironmentCrashed
from hx.environments.registry import TaskId, benchmark
from hx.environments.testing import check_adapter, check_gold_path, play
from hx.environments.twx import GAME_OPTIONS, TextWorldExpressBenchmark, TwxTask
from hx.runtime.task import Tool
from schemas.envelope import encode_body
from schemas.lifecycle import AttemptFinished
from schemas.messages import ToolCall
from schemas.tools import EnvObservation, ToolInvoked, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_subject

GAMES = tuple(GAME_OPTIONS)


@pytest.fixture(scope="module")
def bench() -> TextWorldExpressBenchmark:
    return TextWorldExpressBenchmark()


def act(i: int, action: str) -> ToolCall:
    return ToolCall(id=f"c{i}", name="act", input={"action": action})


async def gold_of(bench: TextWorldExpressBenchmark, task_id: str) -> tuple[str, ...]:
    probe = bench.make_task(TaskId.parse(task_id))
    try:
        await probe.reset()
        return probe.gold_actions()
    finally:
        await probe.close()


# --- every game, through the adapter kit ----------------------------------------------------


@pytest.mark.parametrize("game", GAMES)
async def test_every_game_keeps_the_adapter_promises(bench: TextWorldExpressBenchmark, game: str) -> None:
    other = "twx:coin:train:0" if game != "coin" else "twx:sorting:train:0"
    await check_adapter(bench, f"twx:{game}:dev:5", between=other)


@pytest.mark.parametrize("split", ["train", "test"])
async def test_gold_paths_succeed_on_other_splits(bench: TextWorldExpressBenchmark, split: str) -> None:
    for game in GAMES:
        played = await check_gold_path(bench, f"twx:{game}:{split}:11")
        last = [e for e in played.events if isinstance(e, EnvObservation)][-1]
        assert (last.done, last.success, last.failure) == (True, True, False)
        assert played.verdict == VerifierScore(verifier="twx:tasksuccess", passed=True, score=1.0, reward=1.0,
                                               detail=f"tasksuccess=True taskfailure=False moves={last.step}")


# --- ids, options -----------------------------------------------------------------------------


def test_task_ids_index_the_split_seeds(bench: TextWorldExpressBenchmark) -> None:
    assert bench.games() == ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays",
                             "peckingorder")
    assert [str(t) for t in bench.task_ids("coin", "dev", limit=3)] == ["twx:coin:dev:0", "twx:coin:dev:1",
                                                                       "twx:coin:dev:2"]
    assert len(bench.task_ids("mapreader", "test")) == 1000
    task = bench.make_task(TaskId.parse("twx:coin:dev:17"))
    assert isinstance(task, TwxTask) and task.env_seed == 10017 and task.spec.seed == 17
    assert task.spec.meta["params"] == "numLocations=11,numDistractorItems=0,includeDoors=1,limitInventorySize=1"
    assert isinstance(benchmark("twx"), TextWorldExpressBenchmark) and benchmark("twx").family == "textworld"
    with pytest.raises(BenchmarkError, match="no game 'zork'"):
        bench.task_ids("zork", "dev")
    with pytest.raises(BenchmarkError, match="seed must be 0-999"):
        bench.make_task(TaskId.parse("twx:coin:dev:1000"))
    with pytest.raises(BenchmarkError, match="unknown options numRooms; known: numLocations"):
        TextWorldExpressBenchmark(options={"coin": {"numRooms": 3}})


async def test_game_options_reach_the_game() -> None:
    plain = TextWorldExpressBenchmark()
    doorless = TextWorldExpressBenchmark(options={"coin": {"includeDoors": 0, "numLocations": 4}})
    assert doorless.params("coin") == "numLocations=4,numDistractorItems=0,includeDoors=0,limitInventorySize=1"
    with_doors = await play(plain.make_task(TaskId.parse("twx:coin:dev:2")), calls=())
    without = await play(doorless.make_task(TaskId.parse("twx:coin:dev:2")), calls=())
    assert any("door" in a for a in with_doors.tools[0].input_schema["properties"]["action"]["enum"])
    assert not any("door" in a for a in without.tools[0].input_schema["properties"]["action"]["enum"])
    too_big = TextWorldExpressBenchmark(options={"coin": {"numLocations": 40}})
    with pytest.raises(BenchmarkError, match="twx:coin:dev:0: Number of locations must be less than or equal to 11"):
        await play(too_big.make_task(TaskId.parse("twx:coin:dev:0")), calls=())
    discarded = plain.pool.discarded
    cramped = TextWorldExpressBenchmark(options={"mapreader": {"numLocations": 2}})  # too few rooms for 4 apart
    with pytest.raises(BenchmarkError, match=r"twx:mapreader:dev:1: .*No locations could be found that distance"):
        await play(cramped.make_task(TaskId.parse("twx:mapreader:dev:1")), calls=())
    assert plain.pool.discarded == discarded  # the game refused, the JVM is fine and goes back to the pool


# --- the act tool and the events --------------------------------------------------------------


async def test_act_tool_follows_the_game_and_events_record_it(bench: TextWorldExpressBenchmark) -> None:
    task = bench.make_task(TaskId.parse("twx:arithmetic:dev:0"))
    try:
        first = await task.reset()
        [tool] = task.tools()
        enum0 = tool.schema.input_schema["properties"]["action"]["enum"]
        assert tool.schema.name == "act" and enum0 == sorted(enum0) and enum0 == list(task.valid_actions)
        assert task.spec.instruction in first and "Valid actions: " + ", ".join(enum0) in first
        [start] = task.drain_events()
        assert isinstance(start, EnvObservation) and start.step == 0 and start.valid_actions == tuple(enum0)
        assert start.info["action"] == "" and "look" in start.info and "inventory" in start.info

        gold = task.gold_actions()
        result = await tool.call(act(1, "take math problem"))
        assert not result.is_error and result.data["invalid"] is False
        assert result.data["valid_actions"] == tool.schema.input_schema["properties"]["action"]["enum"] != enum0
        assert task.tool_schemas() == (tool.schema,)
        assert "Valid actions: " in result.output

        nonsense = await tool.call(act(2, "dance wildly"))
        assert not nonsense.is_error and nonsense.data["invalid"] is True
        assert "not sure what you mean" in nonsense.output

        wrong = next(a for a in task.valid_actions if a.startswith("take ") and a != gold[3] and "math" not in a)
        await tool.call(act(3, wrong))
        ended = await tool.call(act(4, "put " + wrong.removeprefix("take ") + " in box"))
        assert ended.data | {"valid_actions": []} == {"valid_actions": [], "invalid": False, "score": -1.0,
                                                       "done": True, "success": False, "failure": True}
        assert task.done and "The episode is over (failure)" in ended.output
        late = await tool.call(act(5, "look around"))
        assert late.is_error and late.output == "the episode is over"
        drained = task.drain_events()
        events = [e for e in drained if isinstance(e, EnvObservation)]
        assert [e.step for e in events] == [1, 2, 3, 4] and events == drained  # every event an observation
        assert [e.info["action"] for e in events] == ["take math problem", "dance wildly", wrong, ended_action(wrong)]
        assert (events[-1].done, events[-1].success, events[-1].failure) == (True, False, True)
        verdict = await task.verify("")
        assert (verdict.passed, verdict.score, verdict.reward) == (False, -1.0, -1.0)
        assert encode_body(events[-1])  # the events go on the log as they are
    finally:
        await task.close()


def ended_action(wrong: str) -> str:
    return "put " + wrong.removeprefix("take ") + " in box"


async def test_the_games_step_limit_ends_the_episode() -> None:
    short = TextWorldExpressBenchmark(step_limit=3)
    played = await play(short.make_task(TaskId.parse("twx:coin:dev:0")), [act(i, "look around") for i in range(10)])
    assert len(played.steps) == 4 and played.done
    assert not played.verdict.passed and "moves=4" in played.verdict.detail
    assert "the game's step limit" in played.steps[-1].output


# --- through the run loop on a real nats-server -----------------------------------------------


async def run_script(nats_url: str, task: Task, actions: list[str], run_id: str,
                     model: str = "script:twx") -> tuple[Any, list[Any]]:
    completions = [{"tool_calls": [{"id": f"c{i}", "name": "act", "input": {"action": a}}], "stop_reason": "tool_use"}
                   for i, a in enumerate(actions)]
    config = ModelConfig(main=model, provider_options={model: {"completions": completions}})
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await config.agentic(HarnessConfig(), log=conn.log).run(task, run_id=run_id, max_steps=200)
        events = [r.event async for r in conn.log.read(subjects=[trace_subject(run_id, 0, task.spec.id, 0)])]
    return result, events


@pytest.mark.parametrize("task_id", ["twx:coin:test:4", "twx:cookingworld:dev:9", "twx:simonsays:train:2"])
async def test_gold_path_through_the_run_loop_passes(nats_url: str, bench: TextWorldExpressBenchmark,
                                                     task_id: str) -> None:
    gold = list(await gold_of(bench, task_id))
    result, events = await run_script(nats_url, bench.make_task(TaskId.parse(task_id)), gold, "twx-gold")
    assert (result.status, result.passed, result.score) == ("completed", True, 1.0)
    observed = [e for e in events if isinstance(e, EnvObservation)]
    assert [e.step for e in observed] == list(range(result.steps + 1))
    assert observed[-1].success and observed[-1].done and not any(e.success for e in observed[:-1])
    [verdict] = [e for e in events if isinstance(e, VerifierScore)]
    assert verdict.verifier == "twx:tasksuccess" and verdict.passed


async def test_random_agent_picks_from_the_actions_valid_at_each_step(nats_url: str,
                                                                      bench: TextWorldExpressBenchmark) -> None:
    task = bench.make_task(TaskId.parse("twx:coin:dev:1"))
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await ModelConfig(main="random:").agentic(HarnessConfig(), log=conn.log).run(
            task, run_id="twx-random", max_steps=12)
        events = [r.event async for r in conn.log.read(subjects=[trace_subject("twx-random", 0, task.spec.id, 0)])]
    assert result.status in ("completed", "budget_exhausted")
    assert result.steps == 12 or task.done
    valid: tuple[str, ...] = ()
    chosen = 0
    for event in events:
        if isinstance(event, EnvObservation):
            valid = event.valid_actions
        elif isinstance(event, ToolInvoked):  # the loop offered the enum of the moment, so the pick is valid
            assert event.call.input["action"] in valid
            chosen += 1
    assert chosen == result.steps


# --- the JVM pool: reuse, crashes, close --------------------------------------------------------


async def test_a_killed_jvm_is_an_infrastructure_failure_and_the_next_task_gets_a_new_one(
        nats_url: str, bench: TextWorldExpressBenchmark) -> None:
    pool = bench.pool
    started, discarded = pool.started, pool.discarded

    # directly: the JVM dies between two actions
    task = bench.make_task(TaskId.parse("twx:coin:dev:3"))
    await task.reset()
    await task.tools()[0].call(act(1, "look around"))
    pid = task.jvm_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EnvironmentCrashed, match=rf"twx:coin:dev:3: the twx JVM \(pid {pid}\) failed"):
        await task.tools()[0].call(act(2, "look around"))
    await task.close()
    assert pool.discarded == discarded + 1 and task.jvm_pid is None

    # through the run loop: the attempt is recorded as an infrastructure failure, with the reason
    class KilledAfterReset(Task):
        def __init__(self, inner: TwxTask) -> None:
            self.inner, self.spec, self.system_prompt = inner, inner.spec, inner.system_prompt
            self.killed: int | None = None

        def tools(self) -> list[Tool]:
            return list(self.inner.tools())

        async def reset(self) -> str:
            first = await self.inner.reset()
            self.spec = self.inner.spec
            self.killed = self.inner.jvm_pid
            assert self.killed is not None
            os.kill(self.killed, signal.SIGKILL)
            return first

        def drain_events(self) -> list[Any]:
            return self.inner.drain_events()

        async def verify(self, final_answer: str) -> VerifierScore:
            return await self.inner.verify(final_answer)

        async def close(self) -> None:
            await self.inner.close()

    crashing = KilledAfterReset(bench.make_task(TaskId.parse("twx:coin:dev:4")))
    result, events = await run_script(nats_url, crashing, ["look around", "inventory"], "twx-crash")
    assert result.status == "infra_failure" and not result.passed
    assert result.reason.startswith(f"EnvironmentCrashed: twx:coin:dev:4: the twx JVM (pid {crashing.killed}) failed")
    [finished] = [e for e in events if isinstance(e, AttemptFinished)]
    assert (finished.status, finished.reason) == ("infra_failure", result.reason)  # on the log, with the reason
    assert pool.discarded == discarded + 2

    # the next task starts a fresh JVM and plays to success
    gold = list(await gold_of(bench, "twx:coin:dev:4"))
    result, _ = await run_script(nats_url, bench.make_task(TaskId.parse("twx:coin:dev:4")), gold, "twx-after")
    assert result.status == "completed" and result.passed
    assert pool.started >= started + 1


async def test_a_hung_jvm_times_out_and_is_stopped_not_reused(nats_url: str,
                                                              bench: TextWorldExpressBenchmark) -> None:
    task = bench.make_task(TaskId.parse("twx:sorting:dev:1"))
    discarded = bench.pool.discarded
    [real] = task.tools()
    frozen_pid: list[int] = []

    class Frozen(Tool):  # freezes the JVM just before the first action, so the call never returns
        schema = real.schema

        async def call(self, call: ToolCall) -> Any:
            pid = task.jvm_pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            os.waitpid(pid, os.WUNTRACED)  # returns once the JVM (our child) has stopped
            frozen_pid.append(pid)
            return await real.call(call)

    frozen = Frozen()
    task.tools = lambda: [frozen]  # type: ignore[method-assign]
    try:
        result, _ = await run_script_timed(nats_url, task, ["look around"], "twx-hung", timeout_s=1.0)
        assert (result.status, result.reason) == ("infra_failure", "attempt timed out after 1s")
        assert bench.pool.discarded == discarded + 1 and task.jvm_pid is None  # stopped, not given back
    finally:
        if frozen_pid and bench.pool.discarded == discarded:  # the test failed: never leave a frozen JVM behind
            os.kill(frozen_pid[0], signal.SIGCONT)


async def run_script_timed(nats_url: str, task: Task, actions: list[str], run_id: str,
                           timeout_s: float) -> tuple[Any, list[Any]]:
    completions = [{"tool_calls": [{"id": f"c{i}", "name": "act", "input": {"action": a}}]}
                   for i, a in enumerate(actions)]
    config = ModelConfig(main="script:hung", provider_options={"script:hung": {"completions": completions}})
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await config.agentic(HarnessConfig(), log=conn.log).run(task, run_id=run_id, max_steps=5,
                                                                         timeout_s=timeout_s)
    return result, []


async def test_pool_reuses_jvms_and_close_stops_them() -> None:
    bench = TextWorldExpressBenchmark()
    pool = bench.pool
    bench.close()  # start from an empty pool
    first = bench.make_task(TaskId.parse("twx:sorting:dev:0"))
    await first.reset()
    pid = first.jvm_pid
    assert pid is not None
    await first.close()
    second = bench.make_task(TaskId.parse("twx:peckingorder:dev:0"))
    await second.reset()
    assert second.jvm_pid == pid  # the worker's JVM is reused, the game reloaded
    busy = pool.in_use
    bench.close()  # a busy JVM is stopped when its task gives it back
    os.kill(pid, 0)  # still running
    assert pool.idle == 0
    await second.close()
    assert pool.in_use == busy - 1 and pool.idle == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped
