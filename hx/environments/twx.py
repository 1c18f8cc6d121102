"""TextWorldExpress: eight procedurally generated text games, each with train, dev and test seeds.

Task ids are ``twx:<game>:<split>:<n>``: the n-th seed (0-999) of the game's split, so
``twx:coin:dev:17`` plays TextWorldExpress seed 10017 with the dev object set. Game options
(``numLocations``, ``includeDoors`` ...) default to the library's own defaults, listed in
``GAME_OPTIONS``, and can be overridden per game.

>>> bench = TextWorldExpressBenchmark(options={"coin": {"numLocations": 5}})
>>> [str(t) for t in bench.task_ids("coin", "dev", limit=2)]
['twx:coin:dev:0', 'twx:coin:dev:1']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec
import textworld_express.textworld_express
from textworld_express import TextWorldExpressEnv

from hx.environments.envpool import EnvPool, TextGameTask, own_process_group, shared_pool
from hx.environments.errors import BenchmarkError
from hx.environments.registry import SPLITS, Benchmark, TaskId
from schemas.messages import TaskSpec
from schemas.tools import VerifierScore

GAME_OPTIONS: dict[str, dict[str, int]] = {
    "cookingworld": {"numLocations": 11, "numIngredients": 3, "numDistractorItems": 10, "includeDoors": 1,
                     "limitInventorySize": 1},
    "twc": {"numLocations": 3, "numItemsToPutAway": 4, "includeDoors": 0, "limitInventorySize": 0},
    "coin": {"numLocations": 11, "numDistractorItems": 0, "includeDoors": 1, "limitInventorySize": 1},
    "mapreader": {"numLocations": 15, "maxDistanceApart": 4, "maxDistractorItemsPerLocation": 3, "includeDoors": 0,
                  "limitInventorySize": 0},
    "arithmetic": {},
    "sorting": {},
    "simonsays": {"gameLength": 5, "numDistractors": 3, "memorization": 0, "verbose": 0},
    "peckingorder": {},
}
"""Each game's options and their defaults (those of TextWorldExpress 1.1.0)."""

SEEDS_PER_SPLIT = 1000
_FIRST_SEED = {"train": 0, "dev": 10000, "test": 20000}
"""TextWorldExpress's seed ranges: ``getValidSeedsTrain/Dev/Test`` are these plus 0..999."""

SYSTEM_PROMPT = ("You are playing a text game. Each step, call the `act` tool with one of the valid actions, "
                 "copied verbatim. The game ends by itself when the task is done or failed.")


own_process_group(textworld_express.textworld_express)


def _start_env() -> TextWorldExpressEnv:
    return TextWorldExpressEnv(envStepLimit=100)


class TwxTask(TextGameTask[TextWorldExpressEnv]):
    """One TextWorldExpress episode."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, pool: EnvPool[TextWorldExpressEnv], task_id: TaskId, params: str, step_limit: int,
                 gold_path: bool) -> None:
        super().__init__(pool)
        self.task_id = task_id
        self.params = params
        self.step_limit = step_limit
        self.gold_path = gold_path
        self.env_seed = _FIRST_SEED[task_id.split] + task_id.seed
        self._gold: tuple[str, ...] = ()
        self.spec = TaskSpec(id=str(task_id), instruction="", benchmark="twx", split=task_id.split,
                             seed=task_id.seed, meta={"game": task_id.game, "env_seed": self.env_seed,
                                                      "params": params, "step_limit": step_limit})

    def solution(self) -> tuple[str, ...]:
        """The gold action sequence (after ``reset``, when the benchmark generates gold paths)."""
        return self._gold

    def gold_actions(self) -> tuple[str, ...]:
        """The game's own solution after ``reset`` (a random walk in coin and twc: it varies between resets)."""
        return self._gold

    def _start(self, env: TextWorldExpressEnv) -> tuple[str, dict[str, Any]]:
        env.envStepLimit = self.step_limit
        try:
            env.load(self.task_id.game, self.params)
        except ValueError as exc:  # the game's own check of its options
            raise BenchmarkError(f"{self.spec.id}: {exc}") from None
        obs, info = env.reset(seed=self.env_seed, gameFold=self.task_id.split, generateGoldPath=self.gold_path)
        if self.gold_path:
            self._gold = tuple(env.getGoldActionSequence())
        state = _state(obs, info)
        task = info["taskDescription"]
        self.spec = msgspec.structs.replace(self.spec, instruction=task)
        message = f"{task}\n\n{obs}\n\nValid actions: {', '.join(state['valid_actions'])}"
        return message, state

    def _step(self, env: TextWorldExpressEnv, action: str) -> tuple[str, dict[str, Any]]:
        obs, _reward, done, info = env.step(action)
        return obs, _state(obs, info, done=done)

    async def verify(self, final_answer: str) -> VerifierScore:
        """The game's success flag is the verdict; its score (0-1) is the reward."""
        return VerifierScore(verifier="twx:tasksuccess", passed=self.success, score=self.score, reward=self.score,
                             detail=f"tasksuccess={self.success} taskfailure={self.failure} moves={self.moves}")


def _state(obs: str, info: Mapping[str, Any], *, done: bool = False) -> dict[str, Any]:
    # The valid-action list comes in no stable order: sort it so an episode replays identically.
    return {"observation": obs, "valid_actions": sorted(set(info["validActions"])), "score": float(info["score"]),
            "success": bool(info["tasksuccess"]), "failure": bool(info["taskfailure"]), "done": bool(done),
            "info": {"look": info["look"], "inventory": info["inventory"]}}


class TextWorldExpressBenchmark(Benchmark):
    """The eight TextWorldExpress games; one JVM per concurrent attempt, pooled per worker."""

    name: ClassVar[str] = "twx"
    family: ClassVar[str] = "textworld"

    def __init__(self, options: Mapping[str, Mapping[str, int]] | None = None, *, step_limit: int = 100,
                 gold_path: bool = True) -> None:
        self.options = {game: dict(defaults) for game, defaults in GAME_OPTIONS.items()}
        for game, values in (options or {}).items():
            known = self.options.get(game)
            if known is None:
                raise BenchmarkError(f"twx has no game {game!r}; games: {', '.join(GAME_OPTIONS)}")
            unknown = sorted(set(values) - set(known))
            if unknown:
                raise BenchmarkError(f"twx {game}: unknown options {', '.join(unknown)}; "
                                     f"known: {', '.join(known) or 'none'}")
            known.update({k: int(v) for k, v in values.items()})
        self.step_limit = step_limit
        self.gold_path = gold_path
        self.pool = shared_pool("twx", _start_env)

    def games(self) -> tuple[str, ...]:
        """The eight games."""
        return tuple(GAME_OPTIONS)

    def params(self, game: str) -> str:
        """The game's option string as TextWorldExpress's ``load`` takes it."""
        return ",".join(f"{k}={v}" for k, v in self.options[self._game(game)].items())

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        """The first ``limit`` of the split's 1,000 seeds."""
        self._game(game)
        if split not in SPLITS:
            raise BenchmarkError(f"twx: split {split!r} is not one of {', '.join(SPLITS)}")
        return self.first_ids(game, split, SEEDS_PER_SPLIT, limit)

    def make_task(self, task_id: TaskId) -> TwxTask:
        """A fresh episode (the JVM is checked out at ``reset``)."""
        self.check_own(task_id)
        if not 0 <= task_id.seed < SEEDS_PER_SPLIT:
            raise BenchmarkError(f"task {str(task_id)!r}: seed must be 0-{SEEDS_PER_SPLIT - 1}")
        return TwxTask(self.pool, task_id, self.params(task_id.game), self.step_limit, self.gold_path)

    def close(self) -> None:
        """Stop the worker's TextWorldExpress JVMs (those in use when their tasks end)."""
        self.pool.close()

    def _game(self, game: str) -> str:
        if game not in GAME_OPTIONS:
            raise BenchmarkError(f"twx has no game {game!r}; games: {', '.join(GAME_OPTIONS)}")
        return game

