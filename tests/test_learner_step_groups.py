"""Step-level groups (``hx.learner.step_groups``): which turns share a state, their returns and advantages,
and how they join the episode advantages, checked against plain arithmetic on hand-built trajectories."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from hx.learner.errors import PolicyError
from hx.learner.step_groups import anchor, step_advantages, step_returns, turn_advantages
from hx.learner.trainer import LearnerSettings
from projections.trajectories import Trajectory, Turn
from schemas.messages import Message, ToolCall, ToolSchema

ACT = ToolSchema(name="act", input_schema={"type": "object", "properties": {
    "action": {"type": "string", "enum": ["look", "move east", "take coin"]}}})


def turn(seen: str, step: int = 0, *, said: Sequence[str] = (), tools: tuple[ToolSchema, ...] = (ACT,),
         role: str = "main") -> Turn:
    """A turn whose model saw ``seen`` last, after the earlier observations ``said``."""
    messages = [Message(role="system", content="play")]
    for i, text in enumerate([*said, seen]):
        if i:
            messages.append(Message(role="assistant", tool_calls=(ToolCall(id=f"c{i}", name="act",
                                                                              input={"action": "look"}),)))
        messages.append(Message(role="user" if i == 0 else "tool", content=text))
    done = Message(role="assistant", tool_calls=(ToolCall(id="x", name="act", input={"action": "look"}),))
    return Turn(step=step, role=role, model="m", model_version="v", messages=tuple(messages), tools=tools,
                params={}, completion=done, logprobs=(-1.0,), on_policy=True)


def played(states: Sequence[str], reward: float, attempt: int = 0) -> Trajectory:
    """A trajectory through ``states`` (one turn each) that earned ``reward``."""
    turns = tuple(turn(s, i, said=states[:i]) for i, s in enumerate(states))
    return Trajectory(run_id="r", round=0, task_id="t", attempt=attempt, harness_digest="h", model="m",
                      model_version="v", reward=reward, passed=reward > 0, status="completed", turns=turns)


def normalised(values: Sequence[float]) -> list[float]:
    """(x - mean) / population std: the reference the learner's groups must match."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + 1e-6) for v in values]


def test_a_state_is_the_role_the_latest_observation_and_the_tools_not_the_way_there() -> None:
    here = anchor(turn("room A", said=["start"]))
    assert anchor(turn("room A", said=["start", "room B", "room C"])) == here  # the path there does not count
    assert anchor(turn("room B", said=["start"])) != here
    other = ToolSchema(name="act", input_schema={"type": "object", "properties": {
        "action": {"type": "string", "enum": ["look", "move west"]}}})
    assert anchor(turn("room A", said=["start"], tools=(other,))) != here  # other choices: another state
    assert anchor(turn("room A", said=["start"], role="critic")) != here


def test_a_turns_return_is_the_reward_discounted_by_the_turns_still_to_go() -> None:
    assert step_returns(played(["a", "b", "c"], 1.0), 0.5) == [0.25, 0.5, 1.0]
    assert step_returns(played(["a", "b"], 0.0), 0.5) == [0.0, 0.0]


def test_turns_in_a_shared_state_are_ranked_by_return_and_unshared_turns_get_nothing() -> None:
    fast, slow, lost = played(["start", "b"], 1.0), played(["start", "c", "d"], 1.0, 1), played(["start", "e"], 0.0, 2)
    got = step_advantages({"t": [fast, slow, lost]}, 0.9)["t"]
    first = normalised([0.9, 0.81, 0.0])
    assert got == [[pytest.approx(first[0]), 0.0], [pytest.approx(first[1]), 0.0, 0.0], [pytest.approx(first[2]), 0.0]]
    assert got[0][0] > got[1][0] > 0 > got[2][0]


def test_a_state_revisited_within_one_trajectory_compares_its_visits() -> None:
    # A loop back to the start: the later visit is nearer the reward than the first.
    (got,) = step_advantages({"t": [played(["start", "b", "start"], 1.0)]}, 0.5)["t"]
    assert got == [pytest.approx(v) for v in (normalised([0.25, 1.0])[0], 0.0, normalised([0.25, 1.0])[1])]


def test_step_groups_never_span_two_tasks() -> None:
    got = step_advantages({"t1": [played(["start", "b"], 1.0)], "t2": [played(["start"], 0.0)]}, 0.9)
    assert got == {"t1": [[0.0, 0.0]], "t2": [[0.0]]}


def test_turn_advantages_add_the_weighted_step_advantage_to_the_episodes() -> None:
    won, lost = played(["start", "b"], 1.0), played(["start", "c", "d"], 0.0, 1)
    episode = normalised([1.0, 0.0])
    step = normalised([0.9, 0.0])
    got = turn_advantages({"t": [won, lost]}, 0.5, 0.9)["t"]
    assert got == [[pytest.approx(episode[0] + 0.5 * step[0]), pytest.approx(episode[0])],
                   [pytest.approx(episode[1] + 0.5 * step[1]), pytest.approx(episode[1]), pytest.approx(episode[1])]]
    assert turn_advantages({"t": [won, lost]})["t"] == [[pytest.approx(episode[0])] * 2,
                                                         [pytest.approx(episode[1])] * 3]


def test_a_task_all_passed_is_kept_only_when_its_shared_states_tell_actions_apart() -> None:
    same = {"t": [played(["start", "b"], 1.0), played(["start", "c", "d"], 1.0, 1)]}
    assert turn_advantages(same, 0.0) == {}  # plain GRPO: no spread, no group
    kept = turn_advantages(same, 1.0, 0.9)["t"]
    assert kept[0][0] > 0 > kept[1][0] and kept[0][1] == kept[1][1] == kept[1][2] == 0.0
    apart = {"t": [played(["a"], 1.0), played(["b"], 1.0, 1)]}  # all passed, no state shared
    assert turn_advantages(apart, 1.0) == {}


@pytest.mark.parametrize(("field", "value"), [("step_weight", -0.1), ("step_weight", math.nan),
                                              ("step_discount", 0.0), ("step_discount", 1.5)])
def test_learner_settings_refuse_a_bad_step_weight_or_discount_by_name(field: str, value: float) -> None:
    with pytest.raises(PolicyError, match=field):
        LearnerSettings(**{field: value})  # type: ignore[arg-type]
