"""nats-py without aiohttp until a ``ws://`` or ``wss://`` NATS URL needs it.

nats-py's transport module runs ``try: import aiohttp`` when it is imported, for its WebSocket
transport only; where aiohttp is installed (``s3fs`` brings it) that import costs about 0.13 s
of every hx command's start-up, though hx talks to NATS over TCP unless a WebSocket URL is
configured. ``defer_aiohttp`` (run by ``import hx``) has Python import nats' transport, when
something first imports nats, with aiohttp hidden, and then puts a stand-in in aiohttp's place
in that module: the stand-in imports the real aiohttp the first time the WebSocket transport
uses it. So ``hx --nats-url ws://HOST:PORT ...`` works as before, and only such a command
pays for aiohttp. Where aiohttp is not installed nothing changes: nats-py itself says that a
WebSocket URL needs it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TRANSPORT = "nats.aio.transport"
DEFERRED = ("aiohttp", "multidict")
"""What nats' transport imports for its WebSocket transport only (``multidict`` for the headers)."""


class _OnFirstUse:
    """Stands in nats' transport for a module: imports it on first attribute access, then takes its place."""

    def __init__(self, transport: ModuleType, name: str) -> None:
        self._transport = transport
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)  # a third-party module by name: no hx layer is hidden
        setattr(self._transport, self._name, module)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<{self._name}, imported when nats first uses a WebSocket>"


class _WithoutAiohttp(importlib.abc.Loader):
    """Runs nats' transport module with aiohttp hidden, then leaves stand-ins in its place."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """The module the wrapped loader makes (None: Python's default)."""
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Execute the transport module with ``import aiohttp`` failing, then put the stand-ins in."""
        hidden = "aiohttp" not in sys.modules
        if hidden:
            sys.modules["aiohttp"] = None  # type: ignore[assignment]  # None makes ``import aiohttp`` fail
        try:
            self._loader.exec_module(module)
        finally:
            if hidden and sys.modules.get("aiohttp", ...) is None:
                del sys.modules["aiohttp"]
        if hidden:
            for name in DEFERRED:
                setattr(module, name, _OnFirstUse(module, name))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)  # get_source, get_filename, ...: the real loader's


class _TransportFinder(importlib.abc.MetaPathFinder):
    """Finds nats' transport module as Python would, and hands it to ``_WithoutAiohttp``."""

    done = False
    """Set once the transport is found: a module is imported once. The finder stays in ``sys.meta_path``
    (inert) rather than being removed from a list another thread's import may be walking."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        """The transport's own spec with its loader wrapped; None for every other module."""
        if fullname != TRANSPORT or self.done:
            return None
        self.done = True
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None and "aiohttp" not in sys.modules:
            spec.loader = _WithoutAiohttp(spec.loader)
        return spec


def defer_aiohttp() -> bool:
    """Have nats' transport imported without aiohttp, aiohttp left for its first WebSocket use; True if set up.

    Nothing is done when nats' transport or aiohttp is already imported (nothing left to save),
    or when aiohttp is not installed (nats-py does without it).
    """
    if TRANSPORT in sys.modules or "aiohttp" in sys.modules:
        return False
    if any(isinstance(finder, _TransportFinder) and not finder.done for finder in sys.meta_path):
        return True
    if importlib.util.find_spec("aiohttp") is None:
        return False
    sys.meta_path.insert(0, _TransportFinder())
    return True
