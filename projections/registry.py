"""The projections hx knows by name (``hx projections list``), and plugins found by entry point or spec.

``projection(name)`` builds a built-in by name, an installed plugin by its entry-point name
(group ``hx.projections``), or any projection class named ``module:Class`` or
``path/to/file.py:Class`` (``projections.plugins``). The built-ins are entry points of the
same group, into this package, imported when first used: ``otel`` loads OpenTelemetry's
SDK, which a command that never exports spans should not pay for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint
from typing import Any

from projections import plugins
from projections.base import Projection
from projections.errors import PluginError
from projections.failures import PROJECTION_FAILURES, raised


class Builtins(Mapping[str, type[Projection[Any]]]):
    """hx's own projections by name, each class imported when first looked up; ``exclude`` leaves some out."""

    def __init__(self, exclude: frozenset[str] = frozenset()) -> None:
        self._exclude = exclude
        self._points: dict[str, EntryPoint] | None = None
        self._loaded: dict[str, type[Projection[Any]]] = {}

    def _known(self) -> dict[str, EntryPoint]:
        if self._points is None:  # hx's own entry points do not change while it runs: read them once
            self._points = {n: ep for n, ep in plugins.builtin_points().items() if n not in self._exclude}
        return self._points

    def __getitem__(self, name: str) -> type[Projection[Any]]:
        cls = self._loaded.get(name)
        if cls is None:
            point = self._known()[name]  # KeyError: not a built-in
            cls = self._loaded[name] = plugins.from_entry_point(point, {})
        return cls

    def __contains__(self, name: object) -> bool:
        return name in self._known()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._known()))

    def __len__(self) -> int:
        return len(self._known())


EXPORTS: frozenset[str] = frozenset({"otel"})
"""Built-in projections that feed something outside hx (``otel``: spans to an OTLP endpoint)."""
PROJECTIONS = Builtins(exclude=EXPORTS)
"""The built-in read models."""
BUILTINS = Builtins()
"""Every built-in projection; a plugin cannot take one of these names."""


def projection_class(name: str) -> type[Projection[Any]]:
    """The class ``name`` names: built-in, entry point or spec; ``KeyError`` lists the known names.

    A spec or entry point that cannot be used raises ``PluginError`` naming it.
    """
    if plugins.is_spec(name):
        return plugins.load(name, BUILTINS)
    cls = BUILTINS[name] if name in BUILTINS else plugins.entry_point(name, BUILTINS)
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
        raise PluginError(f"projection {name!r}: {cls.__qualname__}() cannot be built without "
                          f"arguments: {exc}") from None
    except PROJECTION_FAILURES as exc:  # a plugin's own failure (any exception, or its sys.exit)
        raise PluginError(f"projection {name!r}: building {cls.__qualname__}() failed: {raised(exc)}") from exc


def available() -> tuple[dict[str, type[Projection[Any]]], dict[str, str]]:
    """Every usable projection by name (built-ins, then installed plugins), and the broken entry points."""
    installed, broken = plugins.discovered(BUILTINS)
    return {**installed, **BUILTINS}, broken
