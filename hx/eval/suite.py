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
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from hx.environments.errors import BenchmarkError
from hx.environments.registry import TaskId, benchmarks
from hx.eval.criteria import Check, build
from hx.eval.errors import SuiteInvalid
from schemas.documents import read_document
from schemas.suite import (
    FREE_BENCHMARK,
    NAME_PATTERN,
    SMOKES,
    SUBMIT_TOOL,
    CriterionSpec,
    GeneratedTasks,
    Suite,
    SuiteTask,
)

_NAME = re.compile(NAME_PATTERN)


# --- reading ---------------------------------------------------------------------------------


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
    suite: Suite = _convert(read_document(p, "suite", SuiteInvalid), Suite, where)
    return validate(suite, where)


def load_generated(path: str | Path) -> tuple[SuiteTask, ...]:
    """The tasks of a generated-tasks JSON file (``schemas/json/generated-tasks.json``), validated like a suite's."""
    p = Path(path)
    where = f"generated tasks {p}"
    if p.suffix.lower() != ".json":
        raise SuiteInvalid(f"{where}: a generated-tasks file is JSON (.json), got {p.suffix!r}")
    generated: GeneratedTasks = _convert(read_document(p, "generated tasks", SuiteInvalid), GeneratedTasks, where)
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
