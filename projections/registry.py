"""The projections hx knows by name (``hx projections list``)."""

from __future__ import annotations

from typing import Any

from projections.base import Projection
from projections.harness_state import HarnessState
from projections.task_history import TaskHistory
from projections.trace_store import TraceStore

PROJECTIONS: dict[str, type[Projection[Any]]] = {
    TraceStore.name: TraceStore,
    TaskHistory.name: TaskHistory,
    HarnessState.name: HarnessState,
}


def projection(name: str) -> Projection[Any]:
    """A fresh instance of the named projection; ``KeyError`` lists the known names."""
    try:
        return PROJECTIONS[name]()
    except KeyError:
        raise KeyError(f"unknown projection {name!r}; known: {', '.join(sorted(PROJECTIONS))}") from None
