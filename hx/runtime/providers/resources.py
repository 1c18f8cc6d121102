"""What a command lends the providers it builds: one value per type, taken by the provider that needs it.

The runtime passes a ``ProviderResources`` from the command (or session) to every provider
it builds, the way it passes the log, without knowing what is inside: a provider asks for
the type it uses. ``policy:`` asks for the learner's ``PolicyStore``, so a co-evolution
hands the same store to its trainer and to the providers its rollouts build, and a policy
the trainer files is served without a reload. Two runs share a value only when they are
given the same resources.

>>> class Counter:
...     def __init__(self) -> None:
...         self.n = 0
>>> lent = ProviderResources()
>>> lent.get(Counter) is None
True
>>> lent.setdefault(Counter, Counter) is lent.setdefault(Counter, Counter)
True
>>> mine = Counter()
>>> ProviderResources(mine).get(Counter) is mine
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


class ProviderResources:
    """Values a command lends its providers, keyed by their exact type."""

    def __init__(self, *values: object) -> None:
        self._values: dict[type, object] = {type(v): v for v in values}

    def get(self, kind: type[R]) -> R | None:
        """The value of type ``kind`` (None: none was lent)."""
        value = self._values.get(kind)
        return value if isinstance(value, kind) else None

    def setdefault(self, kind: type[R], make: Callable[[], R]) -> R:
        """The value of type ``kind``; made by ``make`` and kept for the next provider when none was lent."""
        value = self.get(kind)
        if value is None:
            value = make()
            self._values[kind] = value
        return value
