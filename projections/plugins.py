"""Projection plugins: projections from outside hx, found by entry point or named ``module:Class``.

A plugin is a ``projections.base.Projection`` subclass (a name, a version, the event
types it reads, a state type, ``initial`` and ``fold``) that builds with no arguments.
It is found one of three ways:

- an entry point in the group ``hx.projections`` of any installed distribution
  (``[project.entry-points."hx.projections"] tool_usage = "mypkg.usage:ToolUsage"``);
  ``hx projections list`` shows these next to the built-in ones (hx's own entry points,
  the ones into the ``projections`` package);
- ``module:Class`` on the command line, the module importable from ``sys.path``;
- ``path/to/file.py:Class``, a module loaded from its file.

A spec that cannot be loaded (no such module or file, no such class, not a
``Projection``, no name, a name taken by a built-in or not usable as a checkpoint key,
a read event type nobody declared) is a ``PluginError`` naming the spec and what is wrong.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from projections.base import Projection
from projections.errors import PluginError
from projections.failures import PROJECTION_FAILURES, raised
from schemas.event import event_types

GROUP = "hx.projections"
"""The entry-point group projection plugins register under."""
_KEY = re.compile(r"[A-Za-z0-9_\-]+")
"""A projection name is its KV key (and part of its snapshots' object names): no dots, slashes or spaces."""


def is_spec(name: str) -> bool:
    """Whether ``name`` names a class (``module:Class`` or ``file.py:Class``) rather than a registered projection."""
    return ":" in name


def _module(spec: str, target: str) -> Any:
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise PluginError(f"projection {spec!r}: no file {target!r}")
        name = f"hx_projection_plugin_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise PluginError(f"projection {spec!r}: {target!r} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # msgspec and dataclasses resolve the module's annotations through sys.modules
        try:
            loader_spec.loader.exec_module(module)
        except PROJECTION_FAILURES as exc:  # any error in a plugin's import (its sys.exit too) is its own
            sys.modules.pop(name, None)
            raise PluginError(f"projection {spec!r}: importing {target!r} failed: {raised(exc)}") from exc
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name is not None and target.startswith(exc.name):
            raise PluginError(f"projection {spec!r}: no module named {target!r}") from None
        raise PluginError(f"projection {spec!r}: importing {target!r} failed: {exc}") from exc
    except PROJECTION_FAILURES as exc:  # any error in a plugin's import (its sys.exit too) is its own
        raise PluginError(f"projection {spec!r}: importing {target!r} failed: {raised(exc)}") from exc


def check(spec: str, obj: Any, reserved: Mapping[str, type[Projection[Any]]]) -> type[Projection[Any]]:
    """``obj`` if it is a usable projection class, else ``PluginError`` saying why (``spec`` names it)."""
    if not (isinstance(obj, type) and issubclass(obj, Projection)):
        what = f"{type(obj).__name__} value" if not isinstance(obj, type) else f"class {obj.__qualname__}"
        raise PluginError(f"projection {spec!r}: {what} is not a projections.base.Projection subclass")
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise PluginError(f"projection {spec!r}: {obj.__qualname__} sets no name")
    if not _KEY.fullmatch(name):
        raise PluginError(f"projection {spec!r}: name {name!r} must be letters, digits, '_' and '-' only "
                          "(it keys the projection's checkpoint)")
    taken = reserved.get(name)
    if taken is not None and taken is not obj:
        raise PluginError(f"projection {spec!r}: name {name!r} is taken by the built-in "
                          f"{taken.__module__}.{taken.__qualname__}")
    if not hasattr(obj, "state_type"):
        raise PluginError(f"projection {spec!r}: {obj.__qualname__} sets no state_type (checkpoints decode it)")
    if obj.initial is Projection.initial or obj.fold is Projection.fold:
        raise PluginError(f"projection {spec!r}: {obj.__qualname__} must define initial() and fold()")
    unknown = sorted(set(obj.reads) - set(event_types()))
    if unknown:
        raise PluginError(f"projection {spec!r}: reads unknown event type(s) {', '.join(map(repr, unknown))}")
    return obj


def load(spec: str, reserved: Mapping[str, type[Projection[Any]]], label: str | None = None) -> type[Projection[Any]]:
    """The projection class ``spec`` names (``module:Class`` or ``file.py:Class``), checked; errors say ``label``."""
    label = label or spec
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise PluginError(f"projection {label!r}: expected module:Class or path/to/file.py:Class")
    module = _module(label, target)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"projection {label!r}: module {target!r} has no {attr!r}") from None
    return check(label, obj, reserved)


BUILTIN_PREFIX = "projections."
"""A built-in projection is an entry point of this group into this package; any other is a plugin."""


def is_builtin(ep: EntryPoint) -> bool:
    """Whether ``ep`` is one of hx's own projections (its value names a module of ``projections``)."""
    return ep.value.startswith(BUILTIN_PREFIX)


def builtin_points() -> dict[str, EntryPoint]:
    """hx's own projections' entry points by name (nothing imported)."""
    return {ep.name: ep for ep in entry_points(group=GROUP) if is_builtin(ep)}


def _entry_points() -> list[EntryPoint]:
    """The plugins' entry points, by name."""
    return sorted((ep for ep in entry_points(group=GROUP) if not is_builtin(ep)), key=lambda ep: ep.name)


def discovered(reserved: Mapping[str, type[Projection[Any]]]) -> tuple[dict[str, type[Projection[Any]]],
                                                                        dict[str, str]]:
    """The installed plugins by name, and the entry points that failed to load with why."""
    found: dict[str, type[Projection[Any]]] = {}
    broken: dict[str, str] = {}
    for ep in _entry_points():
        try:
            cls = from_entry_point(ep, reserved)
        except PluginError as exc:
            broken[ep.name] = str(exc)
            continue
        found[cls.name] = cls
    return found, broken


def from_entry_point(ep: EntryPoint, reserved: Mapping[str, type[Projection[Any]]]) -> type[Projection[Any]]:
    """The projection class ``ep`` names, checked (its name must be the entry point's); ``PluginError`` says why not."""
    cls = load(ep.value, reserved, label=f"{ep.name} (entry point {ep.value})")
    if cls.name != ep.name:
        raise PluginError(f"projection {ep.name!r} (entry point {ep.value}): the class's name is {cls.name!r}; "
                          "the entry point and the class must agree")
    return cls


def entry_point(name: str, reserved: Mapping[str, type[Projection[Any]]]) -> type[Projection[Any]] | None:
    """The installed plugin registered under ``name`` (None: no entry point has that name)."""
    for ep in _entry_points():
        if ep.name == name:
            return from_entry_point(ep, reserved)
    return None
