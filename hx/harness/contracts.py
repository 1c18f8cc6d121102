"""The hook contracts: which fields a processor may change at each of the eight hooks.

The run loop compares every event a processor yields with the event it received and
raises ``ContractViolation`` naming processor, hook and field for any change outside
the hook's whitelist. There is no warn-only mode: a corrupted event never propagates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from hx.harness.errors import ContractViolation
from schemas.hooks import BeforeModel, HookName, HookPayload
from schemas.messages import Message


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the fields that differ between two values (structs and tuples recursed)."""
    if before is after or before == after:
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
    return [prefix or "<event>"]


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


def _before_model(before: HookPayload, after: HookPayload, changed: list[str]) -> list[str]:
    """Only the last user message's content may change, or exactly one user message be appended; and the route."""
    assert isinstance(before, BeforeModel) and isinstance(after, BeforeModel)
    bad = [p for p in changed if not _within(p, ("messages", "route"))]
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


CONTRACTS: dict[HookName, Rule] = {
    "task_start": _whitelist("system_prompt", "tools"),
    "step_start": _whitelist("messages"),
    "before_model": _before_model,
    "after_model": _whitelist("content", "tool_calls"),
    "before_tool": _whitelist("call.input", "approved"),
    "after_tool": _whitelist("result.output", "result.is_error", "result.data"),
    "step_end": _whitelist(),
    "task_end": _whitelist(),
}
"""Per hook: a function returning the changed paths the hook does not permit."""

PERMITTED: dict[HookName, str] = {
    "task_start": "system prompt and the tools offered",
    "step_start": "structural history edits (messages)",
    "before_model": "content of the last user message, or one appended user message; the model route",
    "after_model": "response content and tool calls",
    "before_tool": "tool input and approval flag",
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
