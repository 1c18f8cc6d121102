"""The eight hook events processors see, and the log record of each hook pass.

Processors receive and yield these Structs (changing them with
``msgspec.structs.replace``); the run loop logs each as emitted and as returned by the
pipeline inside a ``HookRecord``, so a hook payload never carries log bookkeeping.
"""

from __future__ import annotations

from typing import Literal

from schemas.event import Event, Payload
from schemas.messages import History, Message, TaskSpec, ToolCall, ToolResult, ToolSchema, Usage

HookName = Literal[
    "task_start", "step_start", "before_model", "after_model",
    "before_tool", "after_tool", "step_end", "task_end",
]
HOOK_NAMES: tuple[HookName, ...] = (
    "task_start", "step_start", "before_model", "after_model",
    "before_tool", "after_tool", "step_end", "task_end",
)


class HookPayload(Payload, frozen=True, kw_only=True, tag_field="hook"):
    """Base of the eight hook events; the tag is the hook's name."""


class TaskStart(HookPayload, frozen=True, kw_only=True, tag="task_start"):
    """The attempt begins; processors may change the system prompt."""

    task: TaskSpec
    system_prompt: str = ""
    tools: tuple[ToolSchema, ...] = ()


class StepStart(HookPayload, frozen=True, kw_only=True, tag="step_start"):
    """A step begins; processors may edit the history structurally (trim, summarise)."""

    step: int
    messages: tuple[Message, ...] = ()


class BeforeModel(HookPayload, frozen=True, kw_only=True, tag="before_model"):
    """The model is about to be called; processors may change the last user message, the route, and narrow the tools."""

    step: int
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSchema, ...] = ()
    route: str = ""
    """The model role to call (a ``ModelConfig`` role: ``judge``, or a name under ``roles``); empty is ``main``."""
    offered: tuple[ToolSchema, ...] = ()
    """The tools the step offered before any processor narrowed them; empty means ``tools`` is the whole offer
    (nothing narrowed)."""


class AfterModel(HookPayload, frozen=True, kw_only=True, tag="after_model"):
    """The model answered; processors may change its content and tool calls."""

    step: int
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str = ""
    model: str = ""
    usage: Usage = Usage()
    """Token counts and cost the provider reported for this call (read-only)."""


class BeforeTool(HookPayload, frozen=True, kw_only=True, tag="before_tool"):
    """A tool is about to run; processors may change its input, correct its tool name, or withdraw approval."""

    step: int
    call: ToolCall
    approved: bool = True
    offered: tuple[str, ...] = ()
    """The names of the tools offered to the model at this step (set by the run loop, read-only)."""


class AfterTool(HookPayload, frozen=True, kw_only=True, tag="after_tool"):
    """A tool returned; processors may change the result."""

    step: int
    call: ToolCall
    result: ToolResult


class StepEnd(HookPayload, frozen=True, kw_only=True, tag="step_end"):
    """A step ended; read-only."""

    step: int
    messages: tuple[Message, ...] = ()
    done: bool = False


class TaskEnd(HookPayload, frozen=True, kw_only=True, tag="task_end"):
    """The attempt ended with the verifier's result; read-only."""

    task_id: str
    passed: bool
    score: float = 0.0
    steps: int = 0
    status: str = "completed"


AnyHook = TaskStart | StepStart | BeforeModel | AfterModel | BeforeTool | AfterTool | StepEnd | TaskEnd

HOOK_EVENT_TYPES: dict[str, type[HookPayload]] = {
    "task_start": TaskStart, "step_start": StepStart, "before_model": BeforeModel,
    "after_model": AfterModel, "before_tool": BeforeTool, "after_tool": AfterTool,
    "step_end": StepEnd, "task_end": TaskEnd,
}
HOOK_OF: dict[type[HookPayload], HookName] = {HOOK_EVENT_TYPES[name]: name for name in HOOK_NAMES}
"""The hook of each hook payload type."""


class HookRecord(Event, frozen=True, kw_only=True):
    """A hook event as the run loop emitted it or as one processor chain returned it."""

    TYPE = "hook"
    VERSION = 3
    READS = (1, 2)
    """Version 1 had no ``history``; versions 1 and 2 lack ``BeforeModel.offered`` and ``BeforeTool.offered``
    (both default to empty)."""

    stage: Literal["emitted", "returned"]
    step: int
    """The step the hook fired in (0 for task_start and task_end)."""
    index: int = 0
    """Position among the events a split returned (0 when not split)."""
    event: AnyHook
    history: History | None = None
    """On the log, the conversation of a step_start, before_model or step_end event, whose ``messages``
    are then empty; ``schemas.history.resolve`` puts them back (see there)."""


class ProcessorTriggered(Event, frozen=True, kw_only=True):
    """A processor changed, split, intercepted or interrupted a hook event."""

    TYPE = "processor.triggered"

    processor: str
    """The processor's registered type name."""
    group: str
    """Its singleton group."""
    hook: HookName
    step: int
    action: Literal["changed", "split", "intercepted", "interrupted"]
    fields: tuple[str, ...] = ()
    """Dotted paths of the fields it changed."""
    outputs: int = 1
    """How many events it yielded."""
    reason: str = ""
