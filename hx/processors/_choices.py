"""Helpers for processors that narrow the enumerated choices a step offers.

A text game's ``act`` tool enumerates the actions valid now; an agent choosing among
them (the ``random:`` one most of all) does better when the harness offers fewer, better
ones. The before_model contract lets a processor narrow ``tools`` (keep a non-empty
subset of an enum's values, in order) as long as the whole offer stays in ``offered``;
``narrowed`` does exactly that. The "state" a game is in is read from the offer itself:
the set of actions valid now changes with the location and the inventory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable

import msgspec

from hx.processors._hookutil import compile_patterns
from hx.processors._hookutil import state_key as digest
from schemas.hooks import AfterTool, BeforeModel
from schemas.messages import ToolCall, ToolResult, ToolSchema

DEFAULT_REFUSALS: tuple[str, ...] = (
    r"\bcan[’']?t\b", r"\bcannot\b", r"\bcan not\b", r"\balready\b", r"\bnothing happens\b",
    r"\bnot possible\b", r"\bdon[’']?t see\b", r"\bdo not see\b", r"\bno such\b", r"\bnot able\b",
    r"\bunable\b", r"\bdon[’']?t understand\b", r"\bdo not understand\b", r"\byou see no\b",
)
"""Case-insensitive regular expressions for the ways English text games say an action did nothing."""

DEFAULT_STOPWORDS: tuple[str, ...] = (
    "the", "and", "for", "from", "with", "into", "onto", "are", "was", "were", "been", "being", "its", "this",
    "that", "these", "those", "you", "your", "yours", "then", "them", "they", "there", "their", "some", "any",
    "all", "each", "not", "does", "can", "will", "would", "should", "must", "have", "has", "had", "get", "got",
    "out", "off", "over", "under", "please", "also", "after", "before", "when", "where", "what", "which", "who",
    "how", "make", "sure", "need", "want", "try", "find", "take", "put", "task", "search", "environment", "once",
    "locate", "located", "bring", "use", "done", "complete", "finish", "goal", "game", "first", "next", "now",
    "here", "thing", "things", "something", "item", "items", "object", "objects", "inside", "around", "about",
)
"""Generic English function words and task-phrasing words that say nothing about the objects of a task."""

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def enumerated(tool: ToolSchema) -> tuple[str, ...]:
    """The names of ``tool``'s input properties that enumerate their values."""
    props = tool.input_schema.get("properties")
    if not isinstance(props, dict):
        return ()
    return tuple(k for k, p in props.items() if isinstance(p, dict) and isinstance(p.get("enum"), list) and p["enum"])


def offer(event: BeforeModel) -> tuple[ToolSchema, ...]:
    """The whole offer of the step, before any processor narrowed it."""
    return event.offered or event.tools


def _targets(tool: ToolSchema, name: str, prop: str) -> tuple[str, ...]:
    props = enumerated(tool)
    if name and tool.name != name:
        return ()
    if prop:
        return (prop,) if prop in props else ()
    return props if len(props) == 1 else ()


def choices(tools: tuple[ToolSchema, ...], name: str = "", prop: str = "") -> tuple[str, ...]:
    """The string values enumerated by tool ``name``'s property ``prop`` (default: every tool's lone enum)."""
    out: dict[str, None] = {}
    for tool in tools:
        for key in _targets(tool, name, prop):
            out.update((v, None) for v in tool.input_schema["properties"][key]["enum"] if isinstance(v, str))
    return tuple(out)


def _narrow_tool(tool: ToolSchema, keys: tuple[str, ...], keep: Callable[[str], bool]) -> ToolSchema | None:
    props = dict(tool.input_schema["properties"])
    for key in keys:
        values = props[key]["enum"]
        kept = [v for v in values if not isinstance(v, str) or keep(v)]
        if not kept:
            return None
        if len(kept) < len(values):
            props[key] = {**props[key], "enum": kept}
    return msgspec.structs.replace(tool, input_schema={**tool.input_schema, "properties": props})


def narrowed(event: BeforeModel, keep: Callable[[str], bool], name: str = "", prop: str = "") -> BeforeModel:
    """``event`` offering only the choices ``keep`` accepts (in order), the whole offer kept in ``offered``.

    A tool left with nothing to choose is dropped; when nothing would remain at all, or
    everything would, the event is returned unchanged.
    """
    tools: list[ToolSchema] = []
    for tool in event.tools:
        keys = _targets(tool, name, prop)
        kept = _narrow_tool(tool, keys, keep) if keys else tool
        if kept is not None:
            tools.append(kept)
    if not any(_targets(t, name, prop) for t in tools) or tuple(tools) == event.tools:
        return event
    return msgspec.structs.replace(event, tools=tuple(tools), offered=offer(event))


def state_key(values: Iterable[str]) -> str:
    """The state a game is in: a short stable digest of the full choice list, in any order."""
    return digest("\x1f".join(sorted(values)))


def action_of(call: ToolCall) -> str | None:
    """The value a call chose: its lone string argument, else ``None``."""
    strings = [v for v in call.input.values() if isinstance(v, str)]
    return strings[0] if len(strings) == 1 else None


def content_words(text: str, stopwords: Collection[str], min_len: int) -> frozenset[str]:
    """The lower-case words of ``text`` at least ``min_len`` long that are not stopwords."""
    return frozenset(w for w in _WORD.findall(text.lower()) if len(w) >= min_len and w not in stopwords)


def compile_refusals(patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """Compile case-insensitive refusal patterns (raised as ``ValueError`` naming the bad one, at build time)."""
    return compile_patterns(patterns, "refusals", re.IGNORECASE)


def refused(result: ToolResult, patterns: Iterable[re.Pattern[str]]) -> bool:
    """True when a result says the action did nothing: an error, or an observation matching a refusal pattern."""
    return result.is_error or any(p.search(result.output) for p in patterns)


class OfferState:
    """Where an attempt stands: the state of the last before_model and the actions it offered (private state)."""

    def __init__(self) -> None:
        self.state = ""
        """The state key of the last before_model's whole offer (empty before the first)."""
        self.actions: frozenset[str] = frozenset()
        self.tried: dict[str, set[str]] = {}
        """Per state, the offered actions taken there (``took``)."""

    def enter(self, event: BeforeModel) -> str:
        """Read the state from the step's whole offer; return it."""
        full = choices(offer(event))
        self.actions = frozenset(full)
        self.state = state_key(full) if full else ""
        return self.state

    def action(self, event: AfterTool) -> str | None:
        """The action an after_tool event reports, when it is one of the choices offered in the current state."""
        action = action_of(event.call)
        return action if self.state and action in self.actions else None

    def took(self, event: AfterTool) -> str | None:
        """Like ``action``, and remember the action as tried in the current state."""
        action = self.action(event)
        if action is not None:
            self.tried.setdefault(self.state, set()).add(action)
        return action

    def tried_in(self, state: str) -> set[str]:
        """The offered actions taken in ``state`` so far."""
        return self.tried.get(state, set())

