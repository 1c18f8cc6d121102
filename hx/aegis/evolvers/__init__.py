"""The evolvers AEGIS can run, by name: ``offline`` (no network), ``llm`` (a meta-model), ``frozen`` (none).

>>> make_evolver("offline", meta=None, store=None).name
'offline'
>>> make_evolver("x", meta=None, store=None)
Traceback (most recent call last):
...
hx.aegis.evolvers.base.EvolverError: unknown evolver 'x'; known: frozen, llm, offline
"""

from __future__ import annotations

from hx.aegis.evolvers.base import Evolver, EvolverError, FrozenEvolver
from hx.aegis.evolvers.llm import LlmEvolver
from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.meta import MetaAgent
from hx.runtime.code import CodeStore

EVOLVERS: tuple[str, ...] = ("offline", "llm", "frozen")
"""The evolver names ``make_evolver`` knows."""


def make_evolver(name: str, *, meta: MetaAgent | None, store: CodeStore | None) -> Evolver:
    """The evolver called ``name``; ``EvolverError`` for an unknown name or ``llm`` without a meta-model."""
    if name == "offline":
        return OfflineEvolver()
    if name == "frozen":
        return FrozenEvolver()
    if name == "llm":
        if meta is None:
            raise EvolverError("the llm evolver needs --meta-model")
        return LlmEvolver(meta, store)
    raise EvolverError(f"unknown evolver {name!r}; known: {', '.join(sorted(EVOLVERS))}")
