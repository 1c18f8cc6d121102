"""Processor libraries imported when a processor is first looked up by name, not when ``hx`` is imported.

The package that owns a library adds its importer here (``hx`` adds ``hx.processors``'s), so
the harness layer finds the library's short names (``history_window``, ...) without naming a
higher layer, and a command that never resolves a harness (``hx --help``, ``hx trace``) never
imports the library. This module imports nothing, so adding an importer costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

_PENDING: list[Callable[[], object]] = []
"""Importers not run yet, in the order they were added."""


def add_library(load: Callable[[], object]) -> None:
    """Have ``load`` import a processor library (its processors register on import) at the first lookup."""
    _PENDING.append(load)


def load_libraries() -> None:
    """Run every importer not run yet (the registry calls this before it answers from what is registered)."""
    while _PENDING:
        load = _PENDING.pop(0)
        try:
            load()
        except BaseException:
            _PENDING.insert(0, load)  # not imported: the next lookup fails again, never silently without it
            raise
