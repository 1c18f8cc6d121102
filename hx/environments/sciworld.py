"""ScienceWorld: 30 elementary-science tasks, each with train, dev and test variations.

Task ids are ``sciworld:<task>:<split>:<n>``: the n-th variation of the task's split (the
splits are consecutive ranges of variations), so ``sciworld:boil:test:3`` is boil's variation
24. Simplifications default to ``easy`` (all of them); pass ``simplifications=""`` for none.

ScienceWorld's own valid-action list has hundreds to thousands of entries per step, most of
them about objects the agent cannot see or combinations nobody would try, and it includes
``focus on X`` actions that end the episode at -100 when X is wrong. ``filter_actions`` offers
a short, deterministic list instead (see its docstring); the agent may still type any action.

>>> [str(t) for t in SciWorldBenchmark().task_ids("boil", "test", limit=2)]
['sciworld:boil:test:0', 'sciworld:boil:test:1']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import msgspec
import scienceworld.scienceworld
from scienceworld import ScienceWorldEnv

from hx.environments.envpool import EnvPool, TextGameTask, own_process_group, shared_pool
from hx.environments.errors import BenchmarkError
from hx.environments.registry import SPLITS, Benchmark, TaskId
from schemas.messages import TaskSpec
from schemas.tools import VerifierScore

VARIATIONS: dict[str, tuple[int, int, int]] = {
    "boil": (14, 7, 9), "change-the-state-of-matter-of": (14, 7, 9), "chemistry-mix": (16, 8, 8),
    "chemistry-mix-paint-secondary-color": (18, 9, 9), "chemistry-mix-paint-tertiary-color": (18, 9, 9),
    "find-animal": (150, 75, 75), "find-living-thing": (150, 75, 75), "find-non-living-thing": (150, 75, 75),
    "find-plant": (150, 75, 75), "freeze": (14, 7, 9), "grow-fruit": (62, 31, 33), "grow-plant": (62, 31, 33),
    "identify-life-stages-1": (6, 3, 5), "identify-life-stages-2": (4, 2, 4),
    "inclined-plane-determine-angle": (84, 42, 42), "inclined-plane-friction-named-surfaces": (692, 346, 348),
    "inclined-plane-friction-unnamed-surfaces": (80, 40, 42), "lifespan-longest-lived": (62, 31, 32),
    "lifespan-longest-lived-then-shortest-lived": (62, 31, 32), "lifespan-shortest-lived": (62, 31, 32),
    "measure-melting-point-known-substance": (218, 109, 109),
    "measure-melting-point-unknown-substance": (150, 75, 75), "melt": (14, 7, 9),
    "mendelian-genetics-known-plant": (60, 30, 30), "mendelian-genetics-unknown-plant": (240, 120, 120),
    "power-component": (10, 5, 5), "power-component-renewable-vs-nonrenewable-energy": (10, 5, 5),
    "test-conductivity": (450, 225, 225), "test-conductivity-of-unknown-substances": (300, 150, 150),
    "use-thermometer": (270, 135, 135),
}
"""Variations per split (train, dev, test) of each task, as ScienceWorld 1.2.3 assigns them."""

SIMPLIFICATIONS = ("teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors", "noElectricalAction")

SYSTEM_PROMPT = ("You are an agent in ScienceWorld, a text simulation for science experiments. Each step, call "
                 "the `act` tool with one action; the valid ones are listed, but any action the game understands "
                 "is accepted. Focusing on the wrong object ends the episode as a failure.")

# --- the action filter ----------------------------------------------------------------------

ALWAYS = ("look around", "inventory", "task", "wait1", "wait")
_WORD = re.compile(r"[a-z0-9]+")
_TEMPLATE_WORDS = frozenset(_WORD.findall(
    "activate close deactivate dunk in eat flush focus on go to inventory look around at mix move open pick up "
    "pour put down read reset task teleport use wait wait1 connect disconnect"))
_STOP = frozenset(_WORD.findall(
    "a an the of to in on is it its and or then first your task you be that with will for are this which if as at "
    "by from can some when done found located location around focus after next has have into use move find n "
    "description"))
_GENERIC = frozenset({"thing", "things", "animal", "animals", "plant", "plants", "living"})
_FIXTURES = frozenset({"agent", "air", "inventory", "art studio", "bathroom", "bedroom", "foundry", "greenhouse",
                       "hallway", "kitchen", "living room", "outside", "workshop"})
"""Never worth a focus: the agent, the air, the inventory and the rooms (and doors)."""
_NAVIGATION = ("go to ", "teleport to ")
_ONE_OBJECT = ("open ", "close ", "pick up ", "focus on ", "activate ", "deactivate ", "read ", "mix ", "put down ",
               "eat ", "flush ")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def filter_actions(valid: Iterable[str], look: str, inventory: str, task: str, limit: int = 60) -> list[str]:
    """ScienceWorld's valid actions cut to at most ``limit``, deterministic for the same inputs.

    1. ``look around``, ``inventory``, ``task``, ``wait1`` and ``wait`` are always offered first;
       ``reset task`` never is.
    2. An action is kept only if every word of its objects appears in the room description,
       the inventory or the task description (ScienceWorld lists objects out of sight).
    3. ``focus on X`` is kept only if X shares a content word with the task description, or
       the task names a class of things (a thing, an animal, a plant, a living thing); never
       on the agent, the air, the inventory, a room or a door.
    4. The rest are ranked: going somewhere; one-object actions about the task; other
       one-object actions; two-object actions (move, pour, use ...) about the task; the others;
       ties alphabetically. The first ``limit`` are offered, sorted alphabetically.
    """
    seen = _words(look) | _words(inventory) | _words(task)
    described = _words(task)
    goal = described - _STOP
    generic = bool(described & _GENERIC)
    kept: set[str] = set()
    for action in valid:
        if action in ALWAYS or action.startswith("reset"):
            continue
        objects = _words(action) - _TEMPLATE_WORDS
        if not objects <= seen:
            continue
        if action.startswith("focus on "):
            target = action.removeprefix("focus on ")
            if target in _FIXTURES or "door" in _words(target) or not (generic or objects & goal):
                continue
        kept.add(action)

    def rank(action: str) -> tuple[int, int, str]:
        relevant = len((_words(action) - _TEMPLATE_WORDS) & goal)
        if action.startswith(_NAVIGATION):
            tier = 0
        elif action.startswith(_ONE_OBJECT):
            tier = 1 if relevant else 2
        else:
            tier = 3 if relevant else 4
        return tier, -relevant, action

    chosen = sorted(kept, key=rank)[:max(0, limit - len(ALWAYS))]
    return [*ALWAYS, *sorted(chosen)]


# --- the task -------------------------------------------------------------------------------


own_process_group(scienceworld.scienceworld)


def _start_env() -> ScienceWorldEnv:
    return ScienceWorldEnv("", envStepLimit=100)


class SciWorldTask(TextGameTask[ScienceWorldEnv]):
    """One ScienceWorld episode."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, pool: EnvPool[ScienceWorldEnv], task_id: TaskId, *, simplifications: str, step_limit: int,
                 max_actions: int, gold_path: bool) -> None:
        super().__init__(pool)
        self.task_id = task_id
        self.variation = _first_variation(task_id.game, task_id.split) + task_id.seed
        self.simplifications = simplifications
        self.step_limit = step_limit
        self.max_actions = max_actions
        self.gold_path = gold_path
        self._gold: tuple[str, ...] = ()
        self._listed: frozenset[str] = frozenset()
        self._description = ""
        self.spec = TaskSpec(id=str(task_id), instruction="", benchmark="sciworld", split=task_id.split,
                             seed=task_id.seed, meta={"task": task_id.game, "variation": self.variation,
                                                      "simplifications": simplifications, "step_limit": step_limit})

    def solution(self) -> tuple[str, ...]:
        """ScienceWorld's gold action sequence (after ``reset``, when the benchmark generates gold paths)."""
        return self._gold

    def gold_actions(self) -> tuple[str, ...]:
        """ScienceWorld's own solution, after ``reset`` (only when the benchmark has ``gold_path=True``)."""
        return self._gold

    def _start(self, env: ScienceWorldEnv) -> tuple[str, dict[str, Any]]:
        try:
            env.load(self.task_id.game, self.variation, self.simplifications, generateGoldPath=self.gold_path)
        except ValueError as exc:  # unknown task or simplification, as the library checks them
            raise BenchmarkError(f"{self.spec.id}: {exc}") from None
        env.envStepLimit = self.step_limit
        obs, info = env.reset()
        if self.gold_path:
            self._gold = tuple(env.get_gold_action_sequence())
        self._description = env.get_task_description()
        self.spec = msgspec.structs.replace(self.spec, instruction=self._description)
        state = self._state(env, obs, info, done=False)
        return f"{self._description}\n\n{obs}\n\nValid actions: {', '.join(state['valid_actions'])}", state

    def _step(self, env: ScienceWorldEnv, action: str) -> tuple[str, dict[str, Any]]:
        listed = action in self._listed
        obs, _reward, done, info = env.step(action)
        state = self._state(env, obs, info, done=done)
        state["info"]["listed"] = listed
        return obs, state

    def _state(self, env: ScienceWorldEnv, obs: str, info: Mapping[str, Any], *, done: bool) -> dict[str, Any]:
        raw = int(info["score"])
        completed = bool(env.server.getCompleted())
        self._listed = frozenset(info["valid"])
        offered = filter_actions(self._listed, info["look"], info["inv"], self._description, self.max_actions)
        return {"observation": obs, "valid_actions": offered, "score": raw / 100, "success": raw >= 100,
                "failure": raw < 0 or (completed and raw < 100), "done": bool(done),
                "info": {"raw_score": raw, "look": info["look"], "inventory": info["inv"],
                         "env_valid": len(self._listed)}}

    async def verify(self, final_answer: str) -> VerifierScore:
        """Success is a score of 100 (the task's goals all met); the score over 100 is the reward."""
        return VerifierScore(verifier="sciworld:completion", passed=self.success, score=self.score,
                             reward=self.score, detail=f"score={round(self.score * 100)} failure={self.failure} "
                                                       f"moves={self.moves}")


def _first_variation(task: str, split: str) -> int:
    counts = VARIATIONS[task]
    return sum(counts[:SPLITS.index(split)])


class SciWorldBenchmark(Benchmark):
    """The 30 ScienceWorld tasks; one JVM per concurrent attempt, pooled per worker."""

    name: ClassVar[str] = "sciworld"
    family: ClassVar[str] = "scienceworld"

    def __init__(self, *, simplifications: str = "easy", step_limit: int = 100, max_actions: int = 60,
                 gold_path: bool = False) -> None:
        unknown = [s for s in simplifications.split(",") if s and s not in (*SIMPLIFICATIONS, "easy")]
        if unknown:
            raise BenchmarkError(f"sciworld: unknown simplifications {', '.join(unknown)}; "
                                 f"known: easy, {', '.join(SIMPLIFICATIONS)}")
        self.simplifications = simplifications
        self.step_limit = step_limit
        self.max_actions = max_actions
        self.gold_path = gold_path
        """Have ScienceWorld compute its solution at load (slower: up to seconds per task)."""
        self.pool = shared_pool("sciworld", _start_env)

    def games(self) -> tuple[str, ...]:
        """The 30 task names."""
        return tuple(VARIATIONS)

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        """The first ``limit`` variations of the task's split."""
        return self.first_ids(game, split, self._count(game, split), limit)

    def make_task(self, task_id: TaskId) -> SciWorldTask:
        """A fresh episode (the JVM is checked out at ``reset``)."""
        self.check_own(task_id)
        count = self._count(task_id.game, task_id.split)
        if not 0 <= task_id.seed < count:
            raise BenchmarkError(f"task {str(task_id)!r}: {task_id.game} has {count} {task_id.split} variations "
                                 f"(0-{count - 1})")
        return SciWorldTask(self.pool, task_id, simplifications=self.simplifications, step_limit=self.step_limit,
                            max_actions=self.max_actions, gold_path=self.gold_path)

    def close(self) -> None:
        """Stop the worker's ScienceWorld JVMs (those in use when their tasks end)."""
        self.pool.close()

    def _count(self, game: str, split: str) -> int:
        counts = VARIATIONS.get(game)
        if counts is None:
            raise BenchmarkError(f"sciworld has no task {game!r}; tasks: {', '.join(VARIATIONS)}")
        if split not in SPLITS:
            raise BenchmarkError(f"sciworld: split {split!r} is not one of {', '.join(SPLITS)}")
        return counts[SPLITS.index(split)]

