"""The benchmark port and registry: task ids, splits, and fresh tasks for the run loop.

A task id names benchmark, game (or task), split and seed: ``twx:coin:dev:17``,
``sciworld:boil:test:3``, ``gaia:validation:0``-style ids are the adapter's to define
as long as they start with the benchmark name. A ``Benchmark`` lists task ids of a split
and builds a fresh ``Task`` (a new episode, no state shared with another attempt) for
one id; environments that are expensive to start (JVMs) are pooled per worker.

The benchmarks are the ``hx.benchmarks`` entry points (hx's own are declared in
``pyproject.toml``), imported when first named: listing them loads no adapter, so no
game engine, and ``register_benchmark`` adds one for this process (a test's, a plugin's).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from hx.entry_points import Registry
from hx.environments.errors import BenchmarkError
from hx.errors import LoadFailed, UnknownName
from hx.runtime.task import Task

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True, order=True)
class TaskId:
    """A parsed task id: ``<benchmark>:<game>:<split>:<seed>``."""

    benchmark: str
    game: str
    split: str
    seed: int

    def __str__(self) -> str:
        return f"{self.benchmark}:{self.game}:{self.split}:{self.seed}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """Parse ``benchmark:game:split:seed``; errors name the id and what is wrong."""
        parts = text.split(":")
        if len(parts) != 4:
            raise BenchmarkError(f"task id {text!r} must look like 'benchmark:game:split:seed', e.g. 'twx:coin:dev:17'")
        bench, game, split, seed = parts
        if split not in SPLITS:
            raise BenchmarkError(f"task id {text!r}: split {split!r} is not one of {', '.join(SPLITS)}")
        try:
            return cls(bench, game, split, int(seed))
        except ValueError:
            raise BenchmarkError(f"task id {text!r}: seed {seed!r} is not an integer") from None


class Benchmark(ABC):
    """One benchmark family: its games, the task ids of a split, and fresh tasks."""

    name: ClassVar[str]
    """The task-id prefix, e.g. ``twx``."""
    family: ClassVar[str] = ""
    """Which starter harness suits it (``hx/harnesses/<family>.yaml``)."""

    @abstractmethod
    def games(self) -> tuple[str, ...]:
        """The games or tasks this benchmark offers."""

    def default_games(self) -> tuple[str, ...]:
        """The games a bare benchmark name runs: every game, unless some game gathers others."""
        return self.games()

    @abstractmethod
    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        """The first ``limit`` task ids of a game's split, in the benchmark's own order."""

    @abstractmethod
    def make_task(self, task_id: TaskId) -> Task:
        """A task for one attempt: a fresh episode, nothing shared with another attempt."""

    def close(self) -> None:  # noqa: B027 - optional: only pooled environments need it
        """Release pooled environments."""

    def first_ids(self, game: str, split: str, count: int, limit: int | None) -> list[TaskId]:
        """Ids of seeds ``0 .. count - 1`` of a game's split, the first ``limit`` of them."""
        n = count if limit is None else max(0, min(limit, count))
        return [TaskId(self.name, game, split, seed) for seed in range(n)]

    def check_own(self, task_id: TaskId) -> None:
        """Raise ``BenchmarkError`` unless ``task_id`` names this benchmark."""
        if task_id.benchmark != self.name:
            raise BenchmarkError(f"task {str(task_id)!r} is not a {self.name} task")


BENCHMARKS: Registry[Callable[[], Benchmark]] = Registry("hx.benchmarks", "benchmark")
"""Benchmark factories (usually the class) by task-id prefix."""


def register_benchmark(name: str, factory: Callable[[], Benchmark]) -> None:
    """Make a benchmark available under its task-id prefix in this process."""
    BENCHMARKS.add(name, factory)


def benchmark(name: str) -> Benchmark:
    """Build the named benchmark; unknown names list the known ones."""
    try:
        factory = BENCHMARKS.load(name)
    except UnknownName:
        raise BenchmarkError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS.names()) or 'none'}") from None
    except LoadFailed as exc:
        raise BenchmarkError(str(exc)) from None
    return factory()


def benchmarks() -> tuple[str, ...]:
    """Names of the registered benchmarks."""
    return BENCHMARKS.names()
