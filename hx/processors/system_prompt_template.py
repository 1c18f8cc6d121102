"""D2 ``system_prompt_template``: frame the task in the system prompt from a template.

Failure addressed: missing or wrong task framing. A task family's default system
prompt often says nothing about the task at hand (the instruction, the benchmark, the
tools to act with), so the model guesses at its goal and its action format. The
template is rendered with ``string.Template`` (``$name`` placeholders, so braces in
JSON examples are safe) from the task's fields:

``$system_prompt`` (the prompt before this processor), ``$instruction``, ``$task_id``,
``$benchmark``, ``$split``, ``$seed``, ``$tool_names`` (comma-separated), ``$tools``
(one ``- name: description`` line each) and ``$meta_<key>`` for scalar ``task.meta``
entries. An unknown placeholder becomes empty (``missing="empty"``) or stays as written
(``missing="keep"``); ``$$`` is a literal ``$``, and a ``$`` that starts no placeholder
(``$5``, a lone ``$``) is kept as written.
"""

from __future__ import annotations

import string
from collections.abc import AsyncIterator
from typing import ClassVar, Literal

import msgspec

from hx.harness.processor import NORMAL, Processor
from schemas.hooks import TaskStart

DEFAULT_TEMPLATE = """$system_prompt

Your task: $instruction
Tools you can use: $tool_names. Call one tool per step; when the task is done, answer without calling a tool."""


class _Missing(dict[str, str]):
    """Template variables that render an unknown placeholder as empty."""

    def __missing__(self, key: str) -> str:
        return ""


class SystemPromptTemplate(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Render ``template`` with the task's fields and put it in the system prompt."""

    name: ClassVar[str] = "system_prompt_template"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D2"

    template: str = DEFAULT_TEMPLATE
    """The template, with ``$name`` placeholders."""
    mode: Literal["replace", "prepend", "append"] = "replace"
    """Whether the rendering replaces the system prompt, or goes before or after it."""
    missing: Literal["empty", "keep"] = "empty"
    """What an unknown placeholder renders as."""

    def __post_init__(self) -> None:
        self._template = string.Template(self.template)

    def variables(self, event: TaskStart) -> dict[str, str]:
        """The placeholder values for one task."""
        task = event.task
        values = {
            "system_prompt": event.system_prompt, "instruction": task.instruction, "task_id": task.id,
            "benchmark": task.benchmark, "split": task.split, "seed": str(task.seed),
            "tool_names": ", ".join(t.name for t in event.tools),
            "tools": "\n".join(f"- {t.name}: {t.description}" if t.description else f"- {t.name}" for t in event.tools),
        }
        for key, value in task.meta.items():
            if isinstance(value, str | int | float | bool) and key.isidentifier():
                values[f"meta_{key}"] = str(value)
        return values

    def render(self, event: TaskStart) -> str:
        """The rendered template, stripped of surrounding blank lines."""
        values = self.variables(event)
        if self.missing == "keep":
            text = self._template.safe_substitute(values)
        else:
            # Template.safe_substitute keeps unknown names; a mapping with __missing__ empties them.
            text = self._template.safe_substitute(_Missing(values))
        return text.strip()

    async def process(self, event: TaskStart) -> AsyncIterator[TaskStart]:
        """Put the rendered template into the system prompt."""
        text = self.render(event)
        if self.mode == "prepend":
            text = f"{text}\n\n{event.system_prompt}".strip()
        elif self.mode == "append":
            text = f"{event.system_prompt}\n\n{text}".strip()
        yield event if text == event.system_prompt else msgspec.structs.replace(event, system_prompt=text)
