"""The processor contract kit: drive a processor through every hook it claims and check the contracts.

Like ``eventsourcing``'s persistence test cases, this ships with the port: any
processor (ours, a plugin's, one AEGIS writes) can be checked the same way, from a
test or from the gate's smoke test. It needs no test framework.

>>> from hx.processors.observation_trim import ObservationTrim
>>> report = check_processor_sync(ObservationTrim(max_chars=100))
>>> report.hooks, "after_tool" in report.changed
(('after_tool',), True)

For each hook the processor's ``process`` accepts, the kit feeds the representative
events of a small text-game attempt (``scenario()``; pass your own to exercise more)
in run order to one fresh instance rebuilt from the processor's parameters, as the
run loop does per attempt. It checks that the processor

- is registered, declares a dimension D1..D9 and only failure categories of the
  taxonomy in ``addresses``, and rebuilds equal from its parameters;
- yields only events of the hook's type, within the hook's contract
  (``hx.harness.contracts.check_contract``);
- never tries to change the event it was given in place (hook payloads are immutable,
  so the attempt raises; the kit names the path it tried);
- raises nothing but ``Interrupt``.

Failures raise ``KitFailure`` (an ``AssertionError``) naming processor, hook and event;
a contract breach raises the run loop's own ``ContractViolation``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from hx.harness.contracts import check_contract, refused_edit
from hx.harness.errors import ContractViolation, Interrupt
from hx.harness.processor import Processor, build, registered
from schemas.hooks import (
    HOOK_EVENT_TYPES,
    AfterModel,
    AfterTool,
    BeforeModel,
    BeforeTool,
    HookName,
    HookPayload,
    StepEnd,
    StepStart,
    TaskEnd,
    TaskStart,
)
from schemas.landscape import FAILURE_CATEGORIES
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema

DIMENSIONS = tuple(f"D{i}" for i in range(1, 10))

ACT = ToolSchema(
    name="act", description="Send one command to the text world.",
    input_schema={"type": "object", "required": ["command"], "properties": {
        "command": {"type": "string", "enum": ["go north", "go south", "look", "take key", "open door"]},
        "times": {"type": "integer"}}})
SHELL = ToolSchema(name="shell", description="Run a shell command.",
                   input_schema={"type": "object", "properties": {"cmd": {"type": "string"}}})

KITCHEN = "You are in the kitchen. A door leads north.\nMoves: 3"
HALL = "You are in the hall. You see a brass key on the floor. The code 4711 is scratched into the wall."
LOCKED = "You can't open the door: it is locked."
NOTE = "You read the note:\n- the brass key\n- the door to the north\n1. then look around"
LONG = "\n".join(f"line {i}: " + "lorem ipsum " * 8 for i in range(400))


class KitFailure(AssertionError):
    """A processor broke a rule the kit checks."""


@dataclass
class KitReport:
    """What the kit saw a processor do."""

    processor: str
    hooks: tuple[HookName, ...]
    calls: int = 0
    changed: set[HookName] = field(default_factory=set)
    """Hooks at which the processor changed, split or intercepted at least one event."""
    interrupted: set[HookName] = field(default_factory=set)
    outcomes: list[tuple[HookName, int, str]] = field(default_factory=list)
    """Per call: hook, index of the event in the scenario, outcome (pass, changed, split, intercepted, interrupted)."""


def _call(i: int, command: str, name: str = "act", **extra: object) -> ToolCall:
    key = "cmd" if name == "shell" else "command"
    return ToolCall(id=f"call-{i}", name=name, input={key: command, **extra})


def _exchange(i: int, command: str, output: str) -> tuple[Message, ...]:
    call = _call(i, command)
    return (Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content=output, tool_call_id=call.id, name=call.name))


def scenario() -> list[HookPayload]:
    """Representative events of a short text-game attempt, in run order (every hook, several shapes)."""
    task = TaskSpec(id="kit:rooms:0", instruction="Find the key and open the door.", benchmark="kit",
                    split="dev", meta={"difficulty": "easy"})
    tools = (ACT, SHELL)
    start = (Message(role="system", content="You are a text-game agent."), Message(role="user", content=KITCHEN))
    long_history = start + tuple(m for i in range(12) for m in _exchange(
        100 + i, "go north" if i % 2 else "go south", HALL if i % 2 else KITCHEN))
    split_calls = (Message(role="assistant", tool_calls=(_call(200, "look"), _call(201, "take key"))),
                   Message(role="tool", content=HALL, tool_call_id="call-200", name="act"),
                   Message(role="tool", content="Taken. The key's tag reads: code 4711.",
                           tool_call_id="call-201", name="act"))
    step2 = start + _exchange(1, "go north", HALL)
    step3 = step2 + _exchange(2, "go south", KITCHEN)
    narrow = ToolSchema(name=ACT.name, description=ACT.description, input_schema={**ACT.input_schema, "properties": {
        **ACT.input_schema["properties"], "command": {"type": "string", "enum": ["go north", "look", "take key"]}}})
    return [
        TaskStart(task=task, system_prompt="You are a text-game agent.", tools=tools),
        TaskStart(task=task, tools=()),
        StepStart(step=1, messages=start),
        BeforeModel(step=1, messages=start, tools=tools),
        AfterModel(step=1, content="I will go north.", tool_calls=(_call(1, " Go North "),), model="script:kit"),
        BeforeTool(step=1, call=_call(1, " Go North ")),
        BeforeTool(step=1, call=ToolCall(id="call-9", name="act", input={"Command": "tak key", "times": "2"})),
        BeforeTool(step=1, call=_call(10, "ls -la", name="shell")),
        BeforeTool(step=1, call=_call(11, "look"), approved=False),
        AfterTool(step=1, call=_call(1, "go north"),
                  result=ToolResult(call_id="call-1", name="act", output=HALL)),
        AfterTool(step=1, call=_call(5, "look"), result=ToolResult(call_id="call-5", name="act", output=NOTE)),
        AfterTool(step=1, call=_call(10, "ls", name="shell"),
                  result=ToolResult(call_id="call-10", name="shell", output="blocked", is_error=True)),
        AfterTool(step=1, call=_call(12, "look"), result=ToolResult(call_id="call-12", name="act", output=LONG)),
        AfterTool(step=1, call=_call(4, "open door"), result=ToolResult(call_id="call-4", name="act", output=LOCKED)),
        StepEnd(step=1, messages=step2),
        StepStart(step=2, messages=step2),
        BeforeModel(step=2, messages=step2, tools=tools),
        AfterModel(step=2, tool_calls=(_call(2, "go south"),), model="script:kit"),
        BeforeTool(step=2, call=_call(2, "go south")),
        BeforeTool(step=2, call=ToolCall(id="call-3", name="Act", input={"command": "go south"}),
                   offered=("act", "shell")),  # a near-miss tool name, correctable to an offered one
        AfterTool(step=2, call=_call(2, "go south"),
                  result=ToolResult(call_id="call-2", name="act", output=KITCHEN.replace("3", "5"))),
        StepEnd(step=2, messages=step3),
        StepStart(step=3, messages=long_history),
        StepStart(step=3, messages=start + split_calls + _exchange(3, "look", KITCHEN)),
        BeforeModel(step=3, messages=step3, tools=tools),
        BeforeModel(step=3, messages=long_history, tools=tools),
        BeforeModel(step=3, messages=start + _exchange(3, "look", KITCHEN), tools=tools),  # after a trim
        BeforeModel(step=3, messages=(*step3, Message(role="user", content="Hint: try the door.")), tools=tools),
        BeforeModel(step=3, messages=step3, tools=(narrow, SHELL), offered=tools),  # narrowed by an earlier processor
        AfterModel(step=3, content="Done: the door is open.", model="script:kit"),
        StepEnd(step=3, messages=step3, done=True),
        TaskEnd(task_id="kit:rooms:0", passed=True, score=1.0, steps=3),
    ]


def _hook_of(event: HookPayload) -> HookName:
    for name, cls in HOOK_EVENT_TYPES.items():
        if type(event) is cls:
            return name  # type: ignore[return-value]
    raise KitFailure(f"{type(event).__name__} is not a hook event")


def check_metadata(processor: Processor) -> None:
    """The processor is registered under its name, declares a dimension and rebuilds equal from its parameters."""
    cls = type(processor)
    name = cls.type_name()
    if registered().get(name) is not cls:
        raise KitFailure(f"processor {name!r} is not registered under its name")
    if cls.dimension not in DIMENSIONS:
        raise KitFailure(f"processor {name!r} declares dimension {cls.dimension!r}, not one of D1..D9")
    unknown = [c for c in cls.addresses if c not in FAILURE_CATEGORIES]
    if unknown:
        raise KitFailure(f"processor {name!r} addresses {unknown!r}, not in the taxonomy {FAILURE_CATEGORIES!r}")
    if not cls.accepted_hooks():
        raise KitFailure(f"processor {name!r} accepts no hook")
    rebuilt = build(name, processor.params())
    if rebuilt != processor:
        raise KitFailure(f"processor {name!r} does not rebuild equal from its parameters {processor.params()!r}")


async def check_processor(processor: Processor, events: Sequence[HookPayload] | None = None) -> KitReport:
    """Drive ``processor`` (a fresh copy) through ``events`` at the hooks it accepts; raise on any breach."""
    check_metadata(processor)
    cls = type(processor)
    name = cls.type_name()
    hooks = cls.accepted_hooks()
    fresh = build(name, processor.params())
    report = KitReport(processor=name, hooks=hooks)
    for index, event in enumerate(scenario() if events is None else events):
        hook = _hook_of(event)
        if hook not in hooks:
            continue
        produced: list[HookPayload] = []
        report.calls += 1
        try:
            async for item in fresh.process(event):
                produced.append(item)
        except Interrupt:
            report.interrupted.add(hook)
            report.outcomes.append((hook, index, "interrupted"))
            continue
        except ContractViolation:
            raise
        except Exception as exc:  # the kit reports any crash as the processor's failure, chained
            tried = refused_edit(name, hook, event, exc)
            if tried is not None:
                raise KitFailure(f"processor {name!r} at {hook!r} (event {index}) mutated its input in place "
                                 f"({tried.field}): {exc}") from exc
            raise KitFailure(f"processor {name!r} at {hook!r} (event {index}) raised "
                             f"{type(exc).__name__}: {exc}") from exc
        changed = False
        for item in produced:
            if check_contract(name, hook, event, item):
                changed = True
        outcome = ("intercepted" if not produced else "split" if len(produced) > 1
                   else "changed" if changed else "pass")
        if outcome != "pass":
            report.changed.add(hook)
        report.outcomes.append((hook, index, outcome))
    return report


def check_processor_sync(processor: Processor, events: Sequence[HookPayload] | None = None) -> KitReport:
    """``check_processor`` from synchronous code (not from inside a running event loop)."""
    return asyncio.run(check_processor(processor, events))
