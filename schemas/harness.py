"""The harness as data: the processors (type, hooks, parameters) and the slots a ledger event records.

``hx.harness.config.HarnessConfig`` is built on these values (``spec()`` / ``from_spec()``).
Ledger events carried this value as a plain dict (``HarnessConfig.to_dict``) before it was typed,
and a ledger's digests cover the encoded bytes, so these Structs encode to exactly the bytes that
dict did: fields in name order (the encoder sorted a dict's keys), defaults left out where the
dict left them out (``omit_defaults``), and parameters kept as the JSON they were written as.
"""

from __future__ import annotations

from typing import Literal

from schemas.event import JsonObject, Payload
from schemas.hooks import HookName

# Field order below is alphabetical on purpose: see the module docstring.


class Slots(Payload, frozen=True, kw_only=True, omit_defaults=True):
    """Resources shared by the processors of one run (the paper's S)."""

    plugins: tuple[str, ...] = ()
    """Modules imported before the harness is built, to register processors and tools."""
    sandbox: Literal["subprocess", "none"] = "subprocess"
    """How code-running tools are isolated."""
    tools: tuple[str, ...] = ()
    """Extra tools from the tool registry offered besides the task's own."""
    tracer: Literal["log", "none"] = "log"
    """Where hook events go: the event log, or nowhere (benchmarks of the loop itself)."""
    workspace: str = ""
    """Root directory of per-attempt workspaces; empty means a temporary directory."""


class ProcessorSpec(Payload, frozen=True, kw_only=True, omit_defaults=True):
    """One processor in a harness: the hooks it serves, its parameters, its registered type."""

    hooks: tuple[HookName, ...]
    """In run order."""
    params: JsonObject = {}
    """As the processor reports them (``Processor.params``); its type checks them when it is built."""
    type: str
    """The processor's registry name."""


class HarnessSpec(Payload, frozen=True, kw_only=True):
    """A harness as data: its processors in attach order, and its slots."""

    processors: tuple[ProcessorSpec, ...] = ()
    slots: Slots = Slots()
