"""The eval suite as a value: named tasks, each with its criteria and weight, read from YAML, TOML or JSON.

A suite task is exactly one of: a benchmark task id (``task: twx:coin:dev:0``), a free task (an
instruction and the tools it may call, run as ``free:<name>:dev:0`` by ``hx.eval.free``), or the
memory smoke (``smoke: memory``, ``hx.eval.smoke``: the log and projections checked directly, no
agent). Every criterion is built when the suite is loaded, so a wrong criterion name or parameter
is an error naming the file and task before anything runs. ``load_generated`` reads the tasks of a
generated-tasks file (``hx eval --generated FILE``), the same task shape in a JSON document.

>>> suite = default_suite()
>>> suite.name
'default'
>>> suite_digest(suite).startswith("sha256:")
True
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from hx.environments.errors import BenchmarkError
from hx.environments.registry import TaskId, benchmarks
from hx.eval.criteria import Check, build
from hx.eval.errors import SuiteInvalid

SMOKES = ("memory",)
"""The smoke checks a suite task can name."""
FREE_BENCHMARK = "free"
"""The task-id prefix free tasks run under (``free:<suite task name>:dev:0``)."""
SUBMIT_TOOL = "final_answer"
"""The tool every free task offers to submit its answer; a suite's own tool cannot take the name."""
_FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""A task's or tool's name: it becomes part of a task id or a tool call."""
_NAME = re.compile(NAME_PATTERN)
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


# --- reading ---------------------------------------------------------------------------------


def _parse(path: Path, what: str) -> Any:
    """The file's data, by its suffix; unreadable or malformed files name the path."""
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SuiteInvalid(f"{what} {path}: unknown suffix {path.suffix!r}; use .yaml, .yml, .toml or .json")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise SuiteInvalid(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SuiteInvalid(f"{what} {path}: not UTF-8 text") from None
    try:
        if fmt == "yaml":
            return yaml.safe_load(text)
        if fmt == "toml":
            return tomllib.loads(text)
        return json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SuiteInvalid(f"{what} {path}: not valid {fmt}: {first}") from None


def _convert(data: Any, cls: type[Any], where: str) -> Any:
    """``data`` as ``cls``; a mismatch names the task (by name when it has one) and the field."""
    if not isinstance(data, dict):
        raise SuiteInvalid(f"{where}: expected a mapping at the top, got {type(data).__name__}")
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        message = str(exc)
        found = re.search(r"\$\.tasks\[(\d+)\]", message)
        if found is not None:
            index = int(found.group(1))
            tasks = data.get("tasks")
            raw = tasks[index] if isinstance(tasks, list) and index < len(tasks) else None
            label = raw.get("name") if isinstance(raw, dict) else None
            task = f"task {label!r}" if isinstance(label, str) and label else f"task #{index + 1}"
            raise SuiteInvalid(f"{where}: {task}: {message}") from None
        raise SuiteInvalid(f"{where}: {message}") from None


def _check_task(task: SuiteTask, where: str) -> None:
    """Validate one task: its name, its one kind, its id, its tools, its weight and its criteria."""
    if not _NAME.match(task.name):
        raise SuiteInvalid(f"{where}: task {task.name!r}: name must be letters, digits, '_', '.' or '-' "
                           "(it becomes part of a task id)")
    at = f"{where}: task {task.name!r}"
    kinds = [k for k, given in (("task", bool(task.task)), ("free", task.free is not None),
                                ("smoke", bool(task.smoke))) if given]
    if len(kinds) != 1:
        said = ", ".join(kinds) if kinds else "none"
        raise SuiteInvalid(f"{at}: give exactly one of task, free or smoke (given: {said})")
    if task.task:
        try:
            tid = TaskId.parse(task.task)
        except BenchmarkError as exc:
            raise SuiteInvalid(f"{at}: task: {exc}") from None
        if tid.benchmark == FREE_BENCHMARK:
            raise SuiteInvalid(f"{at}: task: {task.task!r}: free tasks are given with 'free:', not as a task id")
        known = benchmarks()
        if tid.benchmark not in known:
            raise SuiteInvalid(f"{at}: task: unknown benchmark {tid.benchmark!r} in {task.task!r}; "
                               f"known: {', '.join(known)}")
    if task.smoke and task.smoke not in SMOKES:
        raise SuiteInvalid(f"{at}: smoke: {task.smoke!r} is not one of {', '.join(SMOKES)}")
    if task.free is not None:
        if not task.free.instruction.strip():
            raise SuiteInvalid(f"{at}: free.instruction is empty")
        names = [tool.name for tool in task.free.tools]
        for tool in names:
            if not _NAME.match(tool):
                raise SuiteInvalid(f"{at}: free.tools: tool name {tool!r} must be letters, digits, '_', '.' or '-'")
        if SUBMIT_TOOL in names:
            raise SuiteInvalid(f"{at}: free.tools: {SUBMIT_TOOL!r} is offered by every free task; name the tool "
                               "otherwise")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SuiteInvalid(f"{at}: free.tools: tool {dupes[0]!r} is given twice")
    if not (math.isfinite(task.weight) and task.weight > 0):
        raise SuiteInvalid(f"{at}: weight must be a number > 0, got {task.weight}")
    for i, spec in enumerate(task.criteria, start=1):
        build(spec.name, spec.params, where=f"{at}: criterion {i}")


def _check_tasks(tasks: tuple[SuiteTask, ...], where: str) -> None:
    """Validate every task and that their names are unique."""
    seen: set[str] = set()
    for task in tasks:
        _check_task(task, where)
        if task.name in seen:
            raise SuiteInvalid(f"{where}: task {task.name!r}: name is used twice")
        seen.add(task.name)


def validate(suite: Suite, where: str) -> Suite:
    """The suite, checked: at least one task, sane attempts/steps/weights, every task and criterion valid."""
    if not suite.name.strip():
        raise SuiteInvalid(f"{where}: name is empty")
    if not suite.tasks:
        raise SuiteInvalid(f"{where}: tasks: the suite has no tasks")
    if suite.attempts < 1:
        raise SuiteInvalid(f"{where}: attempts must be >= 1, got {suite.attempts}")
    if suite.max_steps < 1:
        raise SuiteInvalid(f"{where}: max_steps must be >= 1, got {suite.max_steps}")
    for field in ("success_weight", "criteria_weight"):
        value = getattr(suite, field)
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise SuiteInvalid(f"{where}: {field} must be between 0 and 1, got {value}")
    total = suite.success_weight + suite.criteria_weight
    if not math.isclose(total, 1.0, abs_tol=1e-9):
        raise SuiteInvalid(f"{where}: success_weight + criteria_weight must be 1, got {total:g}")
    _check_tasks(suite.tasks, where)
    return suite


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file (.yaml/.yml, .toml or .json); any error names the file, task and field."""
    p = Path(path)
    where = f"suite {p}"
    suite: Suite = _convert(_parse(p, "suite"), Suite, where)
    return validate(suite, where)


def load_generated(path: str | Path) -> tuple[SuiteTask, ...]:
    """The tasks of a generated-tasks JSON file (``schemas/json/generated-tasks.json``), validated like a suite's."""
    p = Path(path)
    where = f"generated tasks {p}"
    if p.suffix.lower() != ".json":
        raise SuiteInvalid(f"{where}: a generated-tasks file is JSON (.json), got {p.suffix!r}")
    generated: GeneratedTasks = _convert(_parse(p, "generated tasks"), GeneratedTasks, where)
    if not generated.tasks:
        raise SuiteInvalid(f"{where}: tasks: the file has no tasks")
    _check_tasks(generated.tasks, where)
    return generated.tasks


def with_tasks(suite: Suite, extra: tuple[SuiteTask, ...], where: str = "generated tasks") -> Suite:
    """The suite with ``extra`` tasks appended; a name already in the suite is an error naming it."""
    names = {task.name for task in suite.tasks}
    for task in extra:
        if task.name in names:
            raise SuiteInvalid(f"{where}: task {task.name!r}: the suite already has a task of that name")
    return msgspec.structs.replace(suite, tasks=suite.tasks + extra)


def default_suite() -> Suite:
    """The suite hx ships (``hx/eval/default_suite.yaml``)."""
    source = resources.files("hx.eval").joinpath("default_suite.yaml")
    with resources.as_file(source) as path:
        return load_suite(path)


def suite_digest(suite: Suite) -> str:
    """Content digest of the suite (``sha256:`` + hex of its canonical JSON): names the suite a score is of."""
    return "sha256:" + hashlib.sha256(msgspec.json.encode(suite, order="sorted")).hexdigest()


def checks_of(task: SuiteTask) -> list[tuple[CriterionSpec, Check]]:
    """Each of the task's criteria with its check (a loaded suite's criteria are known to build)."""
    return [(spec, build(spec.name, spec.params, where=f"suite task {task.name!r}: criterion {i}"))
            for i, spec in enumerate(task.criteria, start=1)]
