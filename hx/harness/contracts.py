"""The hook contracts: which fields a processor may change at each of the eight hooks.

The run loop compares every event a processor yields with the event it received and
raises ``ContractViolation`` naming processor, hook and field for any change outside
the hook's whitelist. There is no warn-only mode: a corrupted event never propagates.

Two changes are checked by value, not only by path. At before_model the tools may only
be narrowed: tools dropped (never all), or an enumerated property left with a non-empty
subset of its values in their order, and the whole original offer kept in
``offered``, so every later processor and the log still see what the step offered. At
before_tool the call's tool name may only change to another name the step offered.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec

from hx.harness.errors import ContractViolation, InPlaceEdit
from schemas.errors import FrozenValueError
from schemas.event import Payload
from schemas.hooks import BeforeModel, BeforeTool, HookName, HookPayload
from schemas.messages import Message


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the fields that differ between two values (structs and tuples recursed).

    Identity first, field by field: an event a processor rebuilt with ``msgspec.structs.replace``
    shares its unchanged fields (the conversation, the tools) with its input, so the cost is that
    of what changed, never a whole-event ``==`` over the history.
    """
    if before is after:
        return []
    if isinstance(before, msgspec.Struct) and type(before) is type(after):
        out: list[str] = []
        for field in before.__struct_fields__:
            path = f"{prefix}.{field}" if prefix else field
            out += changed_paths(getattr(before, field), getattr(after, field), path)
        return out
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        out = []
        for i, (a, b) in enumerate(zip(before, after, strict=True)):
            out += changed_paths(a, b, f"{prefix}[{i}]")
        return out
    return [] if before == after else [prefix or "<event>"]


def locate(value: Any, target: object, prefix: str = "") -> str | None:
    """The dotted path at which ``target`` (by identity) sits inside ``value``, or None: names a refused edit."""
    if value is target:
        return prefix or "<event>"
    items: Any = ()
    if isinstance(value, msgspec.Struct):
        items = ((f"{prefix}.{f}" if prefix else f, getattr(value, f)) for f in value.__struct_fields__)
    elif isinstance(value, (tuple, list)):
        items = ((f"{prefix}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"{prefix}[{k!r}]", v) for k, v in value.items())
    for path, item in items:
        found = locate(item, target, path)
        if found is not None:
            return found
    return None


def refused_edit(processor: str, hook: HookName, event: HookPayload, exc: Exception) -> InPlaceEdit | None:
    """The ``InPlaceEdit`` ``exc`` stands for if it is a refused in-place change of ``event``, else None."""
    if isinstance(exc, FrozenValueError):
        return InPlaceEdit(processor, hook, locate(event, exc.value) or "<event>", str(exc))
    # msgspec's own refusal of setattr on a frozen Struct names only the type: "immutable type: 'ToolCall'".
    named = _IMMUTABLE.fullmatch(str(exc)) if isinstance(exc, AttributeError) else None
    if named is not None and named[1] in _payload_types(Payload):
        field = "<event>" if named[1] == type(event).__name__ else f"<{named[1]}>"
        return InPlaceEdit(processor, hook, field, f"hook payloads are immutable: setting a field of a {named[1]} "
                                                   "refused; build a new value with msgspec.structs.replace")
    return None


_IMMUTABLE = re.compile(r"immutable type: '(\w+)'")


def _payload_types(base: type) -> set[str]:
    """The names of ``base`` and of every class under it: the value types a hook payload is built of."""
    names = {base.__name__}
    subs: list[type] = base.__subclasses__()
    for sub in subs:
        names |= _payload_types(sub)
    return names


def _within(path: str, allowed: tuple[str, ...]) -> bool:
    return any(path == a or path.startswith(a + ".") or path.startswith(a + "[") for a in allowed)


Rule = Callable[[HookPayload, HookPayload, list[str]], list[str]]
"""A hook's contract: given both events and the paths that changed, the changes it does not permit."""


def _whitelist(*allowed: str) -> Rule:
    def check(before: HookPayload, after: HookPayload, changed: list[str]) -> list[str]:
        return [p for p in changed if not _within(p, allowed)]
    return check


def _last_user(messages: tuple[Message, ...]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    return None


def _subsequence(part: list[Any], whole: list[Any]) -> bool:
    """True when ``part`` is ``whole`` with some items left out, the rest in the same order."""
    rest = iter(whole)
    return all(any(item == other for other in rest) for item in part)


def _narrowed_schema(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True when ``new`` is ``old`` with, at most, fewer values (never none) in its properties' enums."""
    if old == new:
        return True
    if old.keys() != new.keys() or any(old[k] != new[k] for k in old if k != "properties"):
        return False
    props, kept = old.get("properties"), new.get("properties")
    if not isinstance(props, dict) or not isinstance(kept, dict) or props.keys() != kept.keys():
        return False
    for key, prop in props.items():
        now = kept[key]
        if prop == now:
            continue
        if not (isinstance(prop, dict) and isinstance(now, dict) and prop.keys() == now.keys()):
            return False
        enum, values = prop.get("enum"), now.get("enum")
        if not isinstance(enum, list) or not isinstance(values, list) or not values:
            return False
        if any(prop[k] != now[k] for k in prop if k != "enum") or not _subsequence(values, enum):
            return False
    return True


def _narrowing(before: BeforeModel, after: BeforeModel) -> list[str]:
    """The violations of "``after.tools`` narrows the offer, and the offer is kept in ``offered``"."""
    if after.tools == before.tools and after.offered == before.offered:
        return []
    offer = before.offered or before.tools
    if (after.offered or after.tools) != offer:  # the offer was not kept: blame the field that lost it
        return ["offered" if after.offered != before.offered else "tools"]
    if offer and not after.tools:
        return ["tools"]
    names = [t.name for t in offer]
    j = 0
    for i, tool in enumerate(after.tools):
        while j < len(offer) and names[j] != tool.name:
            j += 1
        if j == len(offer):
            return [f"tools[{i}]"]  # added, renamed or moved
        original = offer[j]
        j += 1
        if tool.description != original.description:
            return [f"tools[{i}].description"]
        if not _narrowed_schema(original.input_schema, tool.input_schema):
            return [f"tools[{i}].input_schema"]
    return []


def _before_model(before: HookPayload, after: HookPayload, changed: list[str]) -> list[str]:
    """The last user message's content, or one appended user message; the route; a narrowing of the tools."""
    assert isinstance(before, BeforeModel) and isinstance(after, BeforeModel)
    bad = [p for p in changed if not _within(p, ("messages", "route", "tools", "offered"))]
    bad += _narrowing(before, after)
    old, new = before.messages, after.messages
    if len(new) == len(old) + 1 and new[:-1] == old:
        if new[-1].role != "user":
            bad.append(f"messages[{len(old)}].role")
        return bad
    if len(new) != len(old):
        return [*bad, "messages"]
    last = _last_user(old)
    for path in changed:  # same length: the message paths are per message, messages[i]...
        if not _within(path, ("messages",)):
            continue
        if last is None or path != f"messages[{last}].content":
            bad.append(path)
    return bad


_before_tool_fields = _whitelist("call.input", "call.name", "approved")


def _before_tool(before: HookPayload, after: HookPayload, changed: list[str]) -> list[str]:
    """The call's input and approval; its tool name, only to another tool offered at this step."""
    assert isinstance(before, BeforeTool) and isinstance(after, BeforeTool)
    bad = _before_tool_fields(before, after, changed)
    if after.call.name != before.call.name and after.call.name not in before.offered:
        bad.append("call.name")
    return bad


CONTRACTS: dict[HookName, Rule] = {
    "task_start": _whitelist("system_prompt", "tools"),
    "step_start": _whitelist("messages"),
    "before_model": _before_model,
    "after_model": _whitelist("content", "tool_calls"),
    "before_tool": _before_tool,
    "after_tool": _whitelist("result.output", "result.is_error", "result.data"),
    "step_end": _whitelist(),
    "task_end": _whitelist(),
}
"""Per hook: a function returning the changed paths the hook does not permit."""

PERMITTED: dict[HookName, str] = {
    "task_start": "system prompt and the tools offered",
    "step_start": "structural history edits (messages)",
    "before_model": ("content of the last user message, or one appended user message; the model route; "
                     "narrowing the tools (drop tools, keep a non-empty subset of an enum's values in order) "
                     "with the original offer kept in `offered`"),
    "after_model": "response content and tool calls",
    "before_tool": "tool input and approval flag; the tool name, only to a name in `offered`",
    "after_tool": "tool result",
    "step_end": "nothing (read-only)",
    "task_end": "nothing (read-only)",
}


def check_contract(processor: str, hook: HookName, before: HookPayload, after: HookPayload) -> list[str]:
    """Raise ``ContractViolation`` if ``after`` changes what ``hook`` forbids; return the changed paths."""
    if type(after) is not type(before):
        raise ContractViolation(processor, hook, "<event type>",
                                f"yielded {type(after).__name__}, expected {type(before).__name__}")
    changed = changed_paths(before, after)
    bad = CONTRACTS[hook](before, after, changed)
    if bad:
        raise ContractViolation(processor, hook, bad[0], f"permitted: {PERMITTED[hook]}")
    return changed
