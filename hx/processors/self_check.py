"""D6 ``self_check``: make the agent verify its answer once before the attempt ends.

Failure addressed: premature finishing. Agents often stop on a first draft: a wrong
unit, a skipped requirement, an answer contradicted by a tool result they never looked
back at. When the model first answers without calling a tool (which would end the
attempt), this processor keeps the draft as the response's content and adds a call of
a harness-answered ``self_check`` tool; its result is a short checklist asking the
model to verify the draft against the task and either repeat the final answer or fix
it. The next answer without tool calls ends the attempt as usual (after
``max_checks`` checks the answer stands).

With ``offer=True`` the ``self_check`` tool is also offered to the model at task_start,
so providers that require every
call to name an offered tool accept the history, and the model may ask for the
checklist on its own.

Attach with ``attach(SelfCheck.accepted_hooks(), SelfCheck())``. Each check costs one step: with a
tight step budget, set ``last_step`` below ``max_steps`` so a check never takes the final step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import POST, Processor
from hx.processors.virtual_tool import VirtualCalls
from schemas.hooks import AfterModel, AfterTool, BeforeTool, TaskStart
from schemas.messages import ToolSchema

DEFAULT_CHECKLIST = (
    "Does it answer exactly what the task asks, in the requested form?",
    "Are all values, names, units and formats right?",
    "Is it consistent with every tool result you received?",
)


class SelfCheck(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Turn the first final answer into a verification step."""

    name: ClassVar[str] = "self_check"
    _order: ClassVar[int] = POST  # see the answer after every other after_model processor
    dimension: ClassVar[str] = "D6"
    addresses: ClassVar[tuple[str, ...]] = ("premature_answer",)

    max_checks: int = 1
    """How many final answers are turned into checks per attempt."""
    checklist: tuple[str, ...] = DEFAULT_CHECKLIST
    """The questions the model is asked about its draft."""
    tool: str = "self_check"
    """Name of the harness-answered tool call."""
    last_step: int = 0
    """The last step at which a check may start (0: any); keep it below the run's ``max_steps``."""
    offer: bool = False
    """Offer the tool to the model at task_start."""

    def __post_init__(self) -> None:
        schema = ToolSchema(name=self.tool, description="Get a checklist to verify your draft answer before you "
                            "finish. It has no side effects.",
                            input_schema={"type": "object", "properties": {"draft": {"type": "string"}}})
        self._calls = VirtualCalls(self.tool, schema=schema, default_answer=self.prompt())
        self._checks = 0

    def prompt(self) -> str:
        """The text the model reads as the self_check result."""
        items = "\n".join(f"- {q}" for q in self.checklist)
        return ("Before you finish, check your draft answer against the task.\n"
                f"{items}\n"
                "If the draft is right and complete, reply with the final answer again and call no tools. "
                "If not, correct it (use tools if needed) and then give the final answer.")

    async def process(self, event: TaskStart | AfterModel | BeforeTool | AfterTool) -> AsyncIterator[
            TaskStart | AfterModel | BeforeTool | AfterTool]:
        """Add the check to a first final answer; answer it without running a tool."""
        if isinstance(event, TaskStart):
            yield self._calls.offer(event) if self.offer else event
        elif isinstance(event, BeforeTool):
            yield self._calls.withhold(event)
        elif isinstance(event, AfterTool):
            yield self._calls.answer(event)
        elif (not event.tool_calls and event.content.strip() and self._checks < self.max_checks
              and (self.last_step <= 0 or event.step <= self.last_step)):
            self._checks += 1
            yield self._calls.add(event, self.prompt(), {"draft": event.content})
        else:
            yield event
