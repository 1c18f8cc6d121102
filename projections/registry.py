"""The projections hx knows by name (``hx projections list``), and plugins found by entry point or spec.

``projection(name)`` builds a built-in by name, an installed plugin by its entry-point name
(group ``hx.projections``), or any projection class named ``module:Class`` or
``path/to/file.py:Class`` (``projections.plugins``).
"""

from __future__ import annotations

from typing import Any

from projections import plugins
from projections.base import Projection
from projections.failures import PROJECTION_FAILURES, raised
from projections.ledger_reader import EditLedger
from projections.otel_spans import OtelSpans
from projections.task_history import TaskHistory
from projections.trace_store import TraceStore

PROJECTIONS: dict[str, type[Projection[Any]]] = {
    TraceStore.name: TraceStore,
    TaskHistory.name: TaskHistory,
    EditLedger.name: EditLedger,
}
"""The built-in read models."""
EXPORTS: dict[str, type[Projection[Any]]] = {
    OtelSpans.name: OtelSpans,
}
"""Built-in projections that feed something outside hx (``otel``: spans to an OTLP endpoint)."""
BUILTINS: dict[str, type[Projection[Any]]] = {**PROJECTIONS, **EXPORTS}
"""Every built-in projection; a plugin cannot take one of these names."""


def projection_class(name: str) -> type[Projection[Any]]:
    """The class ``name`` names: built-in, entry point or spec; ``KeyError`` lists the known names.

    A spec or entry point that cannot be used raises ``plugins.PluginError`` naming it.
    """
    if plugins.is_spec(name):
        return plugins.load(name, BUILTINS)
    cls = BUILTINS.get(name) or plugins.entry_point(name, BUILTINS)
    if cls is None:
        installed, _ = plugins.discovered(BUILTINS)
        known = ", ".join(sorted({*BUILTINS, *installed}))
        raise KeyError(f"unknown projection {name!r}; known: {known} (or name a class: module:Class)")
    return cls


def projection(name: str) -> Projection[Any]:
    """A fresh instance of the named projection (see ``projection_class``)."""
    cls = projection_class(name)
    try:
        return cls()
    except TypeError as exc:
        raise plugins.PluginError(f"projection {name!r}: {cls.__qualname__}() cannot be built without "
                                  f"arguments: {exc}") from None
    except PROJECTION_FAILURES as exc:  # a plugin's own failure (any exception, or its sys.exit)
        raise plugins.PluginError(f"projection {name!r}: building {cls.__qualname__}() failed: {raised(exc)}") from exc


def available() -> tuple[dict[str, type[Projection[Any]]], dict[str, str]]:
    """Every usable projection by name (built-ins, then installed plugins), and the broken entry points."""
    installed, broken = plugins.discovered(BUILTINS)
    return {**installed, **BUILTINS}, broken
