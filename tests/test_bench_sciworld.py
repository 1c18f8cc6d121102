"""ScienceWorld adapter: the action filter, ids and variations, real gold-path episodes, a wrong focus."""

from __future__ import annotations

import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import HarnessConfig, ModelConfig
from hx.environments.errors import BenchmarkError
from hx.environments.registry import TaskId, benchmark
from hx.environments.sciworld import ALWAYS, VARIATIONS, SciWorldBenchmark, SciWorldTask, filter_actions
from hx.environments.testing import check_adapter, check_gold_path, play
from schemas.messages import ToolCall
from schemas.tools import EnvObservation, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_subject

LOOK = ("This room is called the kitchen. In it, you see: \n\tthe agent\n\ta substance called air\n"
        "\ta counter. On the counter is: a bowl (containing a red apple, a banana)\n\ta stove, which is turned off.\n"
        "\ta metal pot (containing a substance called water)\nYou also see:\n\tA door to the hallway (that is open)")
INVENTORY = "In your inventory, you see:\n\ta thermometer, currently reading a temperature of 10 degrees celsius\n"
BOIL = "Your task is to boil water. First, focus on the substance. Then, take actions that will cause it to boil."
VALID = ["reset task", "look around", "inventory", "task", "wait", "wait1", "go to hallway", "teleport to hallway",
         "pick up metal pot", "pick up banana", "pick up sewer", "focus on water", "focus on banana", "focus on agent",
         "focus on kitchen", "focus on door to hallway", "focus on thermometer in inventory",
         "move banana to stove", "move water to stove", "pour metal pot in stove", "eat orange juice",
         "activate stove", "look at stove", "look at counter", "open door to hallway"]


@pytest.fixture(scope="module")
def bench() -> SciWorldBenchmark:
    return SciWorldBenchmark(gold_path=True)


def act(i: int, action: str) -> ToolCall:
    return ToolCall(id=f"c{i}", name="act", input={"action": action})


# --- the action filter (no JVM) -----------------------------------------------------------------


def test_filter_offers_visible_relevant_actions_in_a_fixed_order() -> None:
    offered = filter_actions(VALID, LOOK, INVENTORY, BOIL)
    assert offered[:len(ALWAYS)] == list(ALWAYS) and "reset task" not in offered
    rest = offered[len(ALWAYS):]
    assert rest == sorted(rest) and len(set(offered)) == len(offered)
    assert "pick up sewer" not in rest and "eat orange juice" not in rest  # not in sight
    assert {"go to hallway", "teleport to hallway", "pick up metal pot", "move water to stove"} <= set(rest)
    # focus only on what the task names, never on the agent, a room or a door
    assert [a for a in rest if a.startswith("focus")] == ["focus on water"]
    assert filter_actions(reversed(VALID), LOOK, INVENTORY, BOIL) == offered


def test_filter_keeps_any_visible_focus_when_the_task_names_a_class_of_things() -> None:
    find = "Your task is to find a(n) animal. First, focus on the thing. Then, move it to the red box in the kitchen."
    focus = [a for a in filter_actions(VALID, LOOK, INVENTORY, find) if a.startswith("focus")]
    assert focus == ["focus on banana", "focus on thermometer in inventory", "focus on water"]


def test_filter_ranks_then_cuts_to_the_limit() -> None:
    offered = filter_actions(VALID, LOOK, INVENTORY, BOIL, limit=9)
    assert len(offered) == 9 and offered[:len(ALWAYS)] == list(ALWAYS)
    # going somewhere first, then one-object actions about the task (water), then other one-object actions
    assert offered[len(ALWAYS):] == ["activate stove", "focus on water", "go to hallway", "teleport to hallway"]
    assert filter_actions(VALID, LOOK, INVENTORY, BOIL, limit=3) == list(ALWAYS)


# --- ids and options ----------------------------------------------------------------------------


def test_task_ids_index_the_split_variations(bench: SciWorldBenchmark) -> None:
    assert len(bench.games()) == 30 and bench.games() == tuple(VARIATIONS) and "boil" in bench.games()
    assert [str(t) for t in bench.task_ids("boil", "test", limit=2)] == ["sciworld:boil:test:0",
                                                                        "sciworld:boil:test:1"]
    assert len(bench.task_ids("boil", "dev")) == 7 and len(bench.task_ids("find-animal", "train")) == 150
    task = bench.make_task(TaskId.parse("sciworld:boil:test:3"))
    assert isinstance(task, SciWorldTask) and task.variation == 14 + 7 + 3
    assert task.spec.meta == {"task": "boil", "variation": 24, "simplifications": "easy", "step_limit": 100}
    assert isinstance(benchmark("sciworld"), SciWorldBenchmark) and benchmark("sciworld").family == "scienceworld"
    with pytest.raises(BenchmarkError, match="boil has 9 test variations"):
        bench.make_task(TaskId.parse("sciworld:boil:test:9"))
    with pytest.raises(BenchmarkError, match="no task 'boiling'"):
        bench.task_ids("boiling", "dev")
    with pytest.raises(BenchmarkError, match="unknown simplifications teleport; known: easy, teleportAction"):
        SciWorldBenchmark(simplifications="teleport")


# --- real episodes ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_task_keeps_the_adapter_promises(bench: SciWorldBenchmark) -> None:
    await check_adapter(bench, "sciworld:find-non-living-thing:test:2",
                        between="sciworld:lifespan-shortest-lived:dev:1")


@pytest.mark.parametrize("task_id", ["sciworld:lifespan-longest-lived:dev:0", "sciworld:use-thermometer:dev:0",
                                     "sciworld:find-animal:dev:0"])
async def test_gold_paths_are_detected_as_success(bench: SciWorldBenchmark, task_id: str) -> None:
    played = await check_gold_path(bench, task_id)
    last = [e for e in played.events if isinstance(e, EnvObservation)][-1]
    assert (last.done, last.success, last.failure, last.score, last.info["raw_score"]) == (True, True, False, 1.0, 100)
    assert played.verdict.verifier == "sciworld:completion" and played.verdict.reward == 1.0
    assert all(len(s.data["valid_actions"]) <= 60 for s in played.steps)


async def test_focusing_on_the_wrong_thing_fails_the_task(bench: SciWorldBenchmark) -> None:
    task = bench.make_task(TaskId.parse("sciworld:lifespan-longest-lived:dev:0"))
    await task.reset()
    gold = task.gold_actions()
    await task.close()
    walk = [a for a in gold if not a.startswith(("focus", "wait"))]
    played = await play(bench.make_task(TaskId.parse("sciworld:lifespan-longest-lived:dev:0")),
                        [act(i, a) for i, a in enumerate([*walk, "focus on ant"])])  # ants live shortest
    assert "focus on ant" in played.steps[-2].data["valid_actions"]  # offered: the task names a class (animal)
    last = played.steps[-1]
    assert (last.data["done"], last.data["success"], last.data["failure"], last.data["score"]) == (True, False, True,
                                                                                                  -1.0)
    assert played.verdict == VerifierScore(verifier="sciworld:completion", passed=False, score=-1.0, reward=-1.0,
                                           detail=f"score=-100 failure=True moves={len(played.steps)}")


async def test_gold_path_through_the_run_loop_passes(nats_url: str, bench: SciWorldBenchmark) -> None:
    task_id = "sciworld:find-non-living-thing:test:2"
    probe = bench.make_task(TaskId.parse(task_id))
    await probe.reset()
    gold = probe.gold_actions()
    await probe.close()
    completions = [{"tool_calls": [{"id": f"c{i}", "name": "act", "input": {"action": a}}]} for i, a in enumerate(gold)]
    config = ModelConfig(main="script:sw", provider_options={"script:sw": {"completions": completions}})
    task = bench.make_task(TaskId.parse(task_id))
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await config.agentic(HarnessConfig(), log=conn.log).run(task, run_id="sw-gold", max_steps=50)
        events = [r.event async for r in conn.log.read(subjects=[trace_subject("sw-gold", 0, task_id, 0)])]
    assert (result.status, result.passed, result.score, result.steps) == ("completed", True, 1.0, len(gold))
    observed = [e for e in events if isinstance(e, EnvObservation)]
    assert len(observed) == len(gold) + 1 and observed[-1].success and not observed[-2].success
    assert task.spec.instruction.startswith("Your task is to find a(n) non-living thing")
