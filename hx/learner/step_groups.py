"""Step-level groups: credit for single turns, from states that recur across a task's trajectories.

A GRPO group compares whole trajectories, so every turn of an attempt shares its
trajectory's advantage: over 40-60 turns and a reward at the end, a turn that only wastes
a step is credited like the turn that solved the task. Trajectories of one task often pass
through the same state (the opening observation, a room entered again), and there the
actions taken can be compared directly. This is the anchor-state grouping of GiGPO
(Feng et al., 2025): turns of one task group whose model saw the same state form a step
group; each turn's return is the trajectory's reward discounted by the turns still to go,
and its step advantage is that return normalised within the step group, like an episode's
reward within its task group, by the same rule (the learner algorithm's ``advantages``;
GRPO's standardisation by default). A turn in a state seen once, or in a step group whose
returns are all equal, gets no step advantage.

A state is what the model was shown to decide on, not the game's internals: the role of
the call, the latest non-assistant message and the tools offered (with their enumerated
choices). Nothing here knows a game.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import msgspec

from hx.processors.training_bridge import has_spread, standardised
from projections.trajectories import Trajectory, Turn

_TOOLS = msgspec.json.Encoder(order="deterministic")

GroupAdvantages = Callable[[Mapping[str, Sequence[float]]], Mapping[str, Sequence[float]]]
"""Groups' rewards to one advantage per reward (zeros for a group without spread): an algorithm's rule."""


def standardised_groups(rewards: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """Every group's rewards standardised (GRPO's rule, ``eps`` 1e-6)."""
    return {key: standardised(values) for key, values in rewards.items()}


def anchor(turn: Turn) -> str:
    """The state a turn decided in: a digest of its role, its latest non-assistant message and its tools."""
    latest = next((m for m in reversed(turn.messages) if m.role != "assistant"), None)
    digest = hashlib.blake2b(digest_size=16)
    shown = latest.content if latest is not None else ""
    for part in (turn.role.encode(), shown.encode(), _TOOLS.encode(turn.tools)):
        digest.update(len(part).to_bytes(8, "little"))  # length-prefixed: no two splits of the bytes collide
        digest.update(part)
    return digest.hexdigest()


def step_returns(traj: Trajectory, discount: float) -> list[float]:
    """Each turn's return: the trajectory's reward discounted by the turns after it."""
    n = len(traj.turns)
    return [traj.reward * discount ** (n - 1 - i) for i in range(n)]


def step_advantages(groups: Mapping[str, Sequence[Trajectory]], discount: float,
                    advantages: GroupAdvantages = standardised_groups) -> dict[str, list[list[float]]]:
    """Per task, per trajectory, per turn: the turn's step advantage (0 where its step group has no spread)."""
    out: dict[str, list[list[float]]] = {}
    for task, trajs in groups.items():
        returns: dict[str, list[float]] = {}
        where: list[list[tuple[str, int]]] = []
        for traj in trajs:
            places = []
            for turn, ret in zip(traj.turns, step_returns(traj, discount), strict=True):
                key = anchor(turn)
                values = returns.setdefault(key, [])
                places.append((key, len(values)))
                values.append(ret)
            where.append(places)
        normalised = advantages(returns)
        out[task] = [[normalised[key][i] for key, i in places] for places in where]
    return out


def turn_advantages(groups: Mapping[str, Sequence[Trajectory]], step_weight: float = 0.0, discount: float = 0.95,
                    advantages: GroupAdvantages = standardised_groups) -> dict[str, list[list[float]]]:
    """Per task with any spread, per trajectory, per turn: episode advantage + ``step_weight`` x step advantage.

    A task whose rewards are all equal has no episode advantage (zeros); it is kept when its
    step groups tell actions apart (all passed, some sooner), and dropped otherwise.
    """
    rewards = {task: [t.reward for t in trajs] for task, trajs in groups.items()}
    episode = advantages(rewards)
    steps = step_advantages(groups, discount, advantages) if step_weight > 0 else {}
    out: dict[str, list[list[float]]] = {}
    for task, trajs in groups.items():
        per_turn = steps.get(task) or [[0.0] * len(t.turns) for t in trajs]
        if not has_spread(rewards[task]) and not any(any(turns) for turns in per_turn):
            continue  # no signal in the episode nor in its steps: the learner drops the group
        out[task] = [[a + step_weight * s for s in turns] for a, turns in zip(episode[task], per_turn, strict=True)]
    return out
