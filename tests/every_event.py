"""A projection that folds every event of the trace: per subject, how many events of each type.

The crash and quarantine tests need a fold that reads the whole log (the trace store reads
only the attempts' summary channels); the worker process loads it as
``tests/every_event.py:EveryEvent``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from projections.base import Projection
from schemas.envelope import Record

SPEC = f"{Path(__file__)}:EveryEvent"
"""How ``projections.registry.projection`` (and the worker) names this projection."""


class EveryEvent(Projection[dict[str, dict[str, int]]]):
    """Subject -> event type -> count, over every event of the stream."""

    name: ClassVar[str] = "every_event"
    state_type = dict[str, dict[str, int]]

    def initial(self) -> dict[str, dict[str, int]]:
        """Nothing counted."""
        return {}

    def fold(self, state: dict[str, dict[str, int]], record: Record) -> dict[str, dict[str, int]]:
        """Count the record under its subject and type."""
        counts = state.setdefault(record.subject, {})
        counts[record.type] = counts.get(record.type, 0) + 1
        return state
