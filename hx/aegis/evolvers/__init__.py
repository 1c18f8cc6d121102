"""The evolvers AEGIS can run, by name: the ``hx.evolvers`` entry points, imported on first use.

hx ships ``offline`` (no network), ``llm`` (a meta-model) and ``frozen`` (none), declared in
``pyproject.toml`` as any package declares its own. An evolver is one module: an ``Evolver``
subclass (its ``build`` takes what the command has) and one entry-point line.

>>> make_evolver("offline", meta=None, store=None).name
'offline'
>>> make_evolver("x", meta=None, store=None)
Traceback (most recent call last):
...
hx.aegis.errors.EvolverError: unknown evolver 'x'; known: frozen, induced, llm, offline, offline+induced
"""

from __future__ import annotations

from hx.aegis.errors import EvolverError
from hx.aegis.evolvers.base import Evolver
from hx.aegis.meta import MetaAgent
from hx.entry_points import Registry
from hx.errors import LoadFailed, UnknownName
from hx.runtime.code import CodeStore

EVOLVERS: Registry[type[Evolver]] = Registry("hx.evolvers", "evolver")
"""Evolver classes by name (``EVOLVERS.names()`` is the ``--evolver`` choice list; ``EVOLVERS.add`` for a test's)."""


def make_evolver(name: str, *, meta: MetaAgent | None, store: CodeStore | None) -> Evolver:
    """The evolver called ``name``; ``EvolverError`` for an unknown name or ``llm`` without a meta-model."""
    try:
        cls = EVOLVERS.load(name)
    except (UnknownName, LoadFailed) as exc:
        raise EvolverError(str(exc)) from None
    if not (isinstance(cls, type) and issubclass(cls, Evolver)):
        raise EvolverError(f"evolver {name!r}: {cls!r} is not an Evolver subclass")
    return cls.build(meta=meta, store=store)
