"""Named implementations registered as entry points by the layer that owns them, loaded on first use.

hx's own providers, evolvers, benchmarks and learner algorithms are declared in
``pyproject.toml`` (``[project.entry-points."hx.providers"]`` and so on), exactly as a
third-party package declares its own: a lower layer never names a module of a higher one,
and nothing is imported until a name is asked for (the ``policy`` provider would load JAX).

>>> from hx.entry_points import Registry
>>> algorithms = Registry("hx.algorithms", "learner algorithm")
>>> sorted(algorithms.names())[:2]
['grpo', 'rloo']
>>> algorithms.load("nope")
Traceback (most recent call last):
...
hx.errors.UnknownName: unknown learner algorithm 'nope'; known: grpo, rloo
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from hx.errors import LoadFailed, UnknownName

T = TypeVar("T")


class Registry(Generic[T]):
    """The implementations of one kind: entry points of one group, plus any added in-process."""

    def __init__(self, group: str, kind: str) -> None:
        self.group = group
        self.kind = kind
        self._added: dict[str, T] = {}
        self._loaded: dict[str, T] = {}

    def _points(self) -> dict[str, EntryPoint]:
        # read on each call: an in-process install (a test's plugin) shows up without a restart
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def names(self) -> tuple[str, ...]:
        """Every name known: registered entry points and in-process additions, sorted."""
        return tuple(sorted({*self._points(), *self._added}))

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` under ``name`` for this process (a plugin defined at run time, a test double)."""
        self._added[name] = obj
        return obj

    def load(self, name: str) -> T:
        """The implementation called ``name``, imported on first use; ``UnknownName`` lists the known ones."""
        if name in self._added:
            return self._added[name]
        if name in self._loaded:
            return self._loaded[name]
        point = self._points().get(name)
        if point is None:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or 'none'}")
        try:
            obj: Any = point.load()
        except Exception as exc:  # any import failure of a plugin is reported as its own
            raise LoadFailed(f"{self.kind} {name!r} ({point.value}): cannot be loaded: "
                             f"{type(exc).__name__}: {exc}") from exc
        self._loaded[name] = obj
        return obj  # type: ignore[no-any-return]
