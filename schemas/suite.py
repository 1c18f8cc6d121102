"""The eval suite's files as values: a suite (tasks, criteria, weights) and a generated-tasks file.

These are documents a user or an external generator writes, not events; ``hx.eval.suite`` reads
and checks them (criteria built, task ids parsed) and ``schemas.jsonschema`` publishes their JSON
Schemas (``schemas/json/suite.json``, ``generated-tasks.json``).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

SMOKES = ("memory",)
"""The smoke checks a suite task can name."""
FREE_BENCHMARK = "free"
"""The task-id prefix free tasks run under (``free:<suite task name>:dev:0``)."""
SUBMIT_TOOL = "final_answer"
"""The tool every free task offers to submit its answer; a suite's own tool cannot take the name."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""A task's or tool's name: it becomes part of a task id or a tool call."""
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, description="letters, digits, '_', '.' or '-'")]


class CriterionSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A criterion as a suite names it: a registered kind and its parameters."""

    name: str
    params: dict[str, Any] = {}


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tool a free task offers the agent: what the model sees, and the fixed text a call returns."""

    name: Name
    description: str = ""
    input_schema: dict[str, Any] = {}
    """JSON Schema of the tool's input; empty means an object with no required fields."""
    returns: str = "ok"


class FreeTask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A task with no benchmark behind it: an instruction, the tools it may call, and the expected answer."""

    instruction: str
    tools: tuple[ToolSpec, ...] = ()
    answer: str = ""
    """The expected answer (normalised match); empty: any non-empty answer passes the verifier."""
    system_prompt: str = ""


class SuiteTask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One task of a suite: exactly one of ``task``, ``free`` or ``smoke``, its criteria and its weight."""

    name: Name
    description: str = ""
    task: str = ""
    """A benchmark task id, ``benchmark:game:split:seed``."""
    free: FreeTask | None = None
    smoke: str = ""
    """A smoke check of the log itself (``memory``): no agent runs."""
    criteria: tuple[CriterionSpec, ...] = ()
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    out_of_domain: bool = False
    """True for a game or task in no default ``hx evolve`` set: a check that evolution did not overfit."""

    @property
    def task_id(self) -> str:
        """The task id this task's attempts run under (free tasks: ``free:<name>:dev:0``; a smoke: empty)."""
        if self.free is not None:
            return f"{FREE_BENCHMARK}:{self.name}:dev:0"
        return self.task


class Suite(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An eval suite: its tasks, attempts per task, step budget, and the composite's two weights."""

    name: str
    description: str = ""
    attempts: Annotated[int, msgspec.Meta(ge=1)] = 3
    max_steps: Annotated[int, msgspec.Meta(ge=1)] = 50
    success_weight: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.7
    """Weight of the verifier's verdict in an attempt's composite."""
    criteria_weight: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.3
    """Weight of the fraction of criteria passed in an attempt's composite."""
    tasks: tuple[SuiteTask, ...]


class GeneratedTasks(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A generated-tasks file: suite tasks with declarative criteria, made by an external generator."""

    generator: str = ""
    """Who made the file (a name or command), for the record."""
    tasks: tuple[SuiteTask, ...]
