"""Inspect AI's JSON eval log, the part of its schema hx writes, as msgspec structs (no inspect_ai at runtime).

The structs mirror ``inspect_ai.log.EvalLog`` (log format version 2, ``inspect_ai/log/_log.py``):
field names, and the order of the top-level fields, which Inspect's header-only reader
relies on (``version`` and ``status`` first, ``samples`` after every header field). Fields
hx has nothing for are left out: Inspect fills their defaults when it reads the file.
``file_name`` names a log as Inspect's own recorder does (``<created>_<task>_<task_id>.json``),
which ``list_eval_logs`` and ``inspect view`` need to list it without opening it.

>>> spec = EvalSpec(created="2026-01-02T03:04:05+00:00", task="heldout", task_id="abc", model="random:",
...                 dataset=EvalDataset(name="heldout"), config={})
>>> file_name(EvalLog(version=LOG_VERSION, status="success", eval=spec))
'2026-01-02T03-04-05-00-00_heldout_abc.json'
>>> encode(EvalLog(version=LOG_VERSION, status="success", eval=spec))[:31]
b'{"version":2,"status":"success"'
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

LOG_VERSION = 2
"""Inspect's eval log format version (``inspect_ai._util.constants.LOG_SCHEMA_VERSION``)."""

EvalStatus = Literal["started", "success", "cancelled", "error"]
StopReason = Literal["stop", "max_tokens", "model_length", "tool_calls", "content_filter", "unknown"]


class _Struct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A part of the log: fields left at their default are not written (Inspect reads the same default)."""


class ToolCall(_Struct, frozen=True, kw_only=True):
    """A tool call of an assistant message (``inspect_ai.tool.ToolCall``)."""

    id: str
    function: str
    arguments: dict[str, Any]
    type: Literal["function"] = "function"


class ChatMessageSystem(_Struct, frozen=True, kw_only=True, tag_field="role", tag="system"):
    """A system message."""

    id: str
    content: str


class ChatMessageUser(_Struct, frozen=True, kw_only=True, tag_field="role", tag="user"):
    """A user message."""

    id: str
    content: str


class ChatMessageAssistant(_Struct, frozen=True, kw_only=True, tag_field="role", tag="assistant"):
    """An assistant message, with the tool calls it made."""

    id: str
    content: str
    tool_calls: tuple[ToolCall, ...] | None = None
    model: str | None = None


class ChatMessageTool(_Struct, frozen=True, kw_only=True, tag_field="role", tag="tool"):
    """A tool's result."""

    id: str
    content: str
    tool_call_id: str | None = None
    function: str | None = None


ChatMessage = ChatMessageSystem | ChatMessageUser | ChatMessageAssistant | ChatMessageTool


class ChatCompletionChoice(_Struct, frozen=True, kw_only=True):
    """One choice of a model output."""

    message: ChatMessageAssistant
    stop_reason: StopReason = "unknown"


class ModelOutput(_Struct, frozen=True, kw_only=True):
    """What the model last produced in a sample."""

    model: str = ""
    choices: tuple[ChatCompletionChoice, ...] = ()
    completion: str = ""


class Score(_Struct, frozen=True, kw_only=True):
    """One scorer's verdict on a sample."""

    value: str | float
    explanation: str | None = None
    metadata: dict[str, Any] | None = None


class EvalSample(_Struct, frozen=True, kw_only=True):
    """One sample: an attempt at a task, its conversation and its scores."""

    id: str
    epoch: int
    input: str
    target: str
    messages: tuple[ChatMessage, ...] = ()
    output: ModelOutput = ModelOutput()
    scores: dict[str, Score] | None = None
    metadata: dict[str, Any] = {}
    started_at: str | None = None
    completed_at: str | None = None
    total_time: float | None = None
    uuid: str | None = None
    error: dict[str, str] | None = None
    """An ``EvalError`` as a mapping, so its empty tracebacks are written (Inspect requires them)."""


class EvalDataset(_Struct, frozen=True, kw_only=True):
    """The tasks an eval ran."""

    name: str | None = None
    samples: int | None = None
    sample_ids: tuple[str, ...] | None = None


class EvalSpec(_Struct, frozen=True, kw_only=True):
    """What was evaluated: task, model, dataset, and the run it belongs to."""

    eval_id: str = ""
    run_id: str = ""
    created: str
    task: str
    task_id: str = ""
    task_display_name: str | None = None
    dataset: EvalDataset
    model: str
    config: dict[str, Any]
    """Inspect's ``EvalConfig`` (required, even empty: hx has no eval options to show)."""
    packages: dict[str, str] = {}
    metadata: dict[str, Any] | None = None


class EvalPlanStep(_Struct, frozen=True, kw_only=True):
    """A solver of the plan (in hx: a harness variant, by digest)."""

    solver: str
    params: dict[str, Any] = {}


class EvalPlan(_Struct, frozen=True, kw_only=True):
    """The plan: which harnesses ran."""

    name: str = "plan"
    steps: tuple[EvalPlanStep, ...] = ()


class EvalMetric(_Struct, frozen=True, kw_only=True):
    """One metric of a scorer."""

    name: str
    value: float


class EvalScore(_Struct, frozen=True, kw_only=True):
    """One scorer's results over the samples."""

    name: str
    scorer: str
    scored_samples: int | None = None
    unscored_samples: int | None = None
    metrics: dict[str, EvalMetric] = {}


class EvalResults(_Struct, frozen=True, kw_only=True):
    """Samples counted and scorers' metrics."""

    total_samples: int = 0
    completed_samples: int = 0
    scores: tuple[EvalScore, ...] = ()


class EvalStats(_Struct, frozen=True, kw_only=True):
    """When the eval started and ended."""

    started_at: str = ""
    completed_at: str = ""


class EvalLog(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An eval log file (the top-level fields in Inspect's order: ``version`` and ``status`` always written)."""

    version: int
    """Always ``LOG_VERSION`` (required here: ``omit_defaults`` would leave a default out, and Inspect needs it)."""
    status: EvalStatus
    eval: EvalSpec
    plan: EvalPlan = EvalPlan()
    results: EvalResults | None = None
    stats: EvalStats = EvalStats()
    error: dict[str, str] | None = None
    """An ``EvalError`` as a mapping (see ``EvalSample.error``)."""
    samples: tuple[EvalSample, ...] | None = None


def error(message: str) -> dict[str, str]:
    """An ``EvalError`` as the log holds it: the message and (hx has none) empty tracebacks."""
    return {"message": message, "traceback": "", "traceback_ansi": ""}


_encoder = msgspec.json.Encoder()


def encode(log: EvalLog) -> bytes:
    """The log file's bytes (JSON, fields in declaration order)."""
    return _encoder.encode(log)


def _clean(component: str) -> str:
    """A file-name component as Inspect cleans it (``clean_filename_component``)."""
    return component.replace("_", "-").replace("/", "-").replace(":", "-").replace("+", "-")


def file_name(log: EvalLog) -> str:
    """The file name Inspect's recorder gives this log: ``<created>_<task>_<task_id>.json``, components cleaned."""
    spec = log.eval
    return f"{_clean(spec.created)}_{_clean(spec.task)}_{_clean(spec.task_id)}.json"
