"""The log's vocabulary: every hx event as a frozen msgspec Struct.

Importing this package registers every event type.
"""

from schemas import (
    evaluation,  # noqa: F401 - registers the eval suite's event types
    experiment,  # noqa: F401 - registers the experiment runner's event types
    learn,  # noqa: F401 - registers the learner's event types
    ledger,  # noqa: F401 - registers the edit ledger's event types
    panel,  # noqa: F401 - registers the experiment panel's event type
)
from schemas.envelope import (
    FRAME_TYPE,
    HX_COUNT,
    HX_SCHEMA_VERSION,
    HX_TIME,
    HX_TYPE,
    MSG_ID,
    Record,
    decode_body,
    decode_frame,
    encode_body,
    encode_frame,
    headers_for,
)
from schemas.errors import DecodeError, HxError, SchemaError
from schemas.event import Event, Payload, event_type, event_types
from schemas.hooks import (
    HOOK_EVENT_TYPES,
    HOOK_NAMES,
    HOOK_OF,
    AfterModel,
    AfterTool,
    AnyHook,
    BeforeModel,
    BeforeTool,
    HookName,
    HookPayload,
    HookRecord,
    ProcessorTriggered,
    StepEnd,
    StepStart,
    TaskEnd,
    TaskStart,
)
from schemas.integrity import StreamLossAccepted
from schemas.lifecycle import (
    SCORED_STATUSES,
    AttemptFinished,
    AttemptStarted,
    AttemptStatus,
    RoundFinished,
    RoundStarted,
    RunFinished,
    RunStarted,
)
from schemas.messages import Message, TaskSpec, TokenLogprob, ToolCall, ToolResult, ToolSchema, TopLogprob, Usage
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned, VerifierScore

__all__ = [
    "FRAME_TYPE", "HOOK_EVENT_TYPES", "HOOK_NAMES", "HOOK_OF", "HX_COUNT", "HX_SCHEMA_VERSION", "HX_TIME",
    "HX_TYPE", "MSG_ID", "SCORED_STATUSES", "AfterModel", "AfterTool", "AnyHook", "AttemptFinished", "AttemptStarted",
    "AttemptStatus", "BeforeModel", "BeforeTool", "DecodeError", "EnvObservation", "Event", "HookName",
    "HookPayload", "HookRecord", "HxError", "Message", "ModelError", "ModelRequest", "ModelResponse",
    "Payload", "ProcessorTriggered", "Record", "RoundFinished", "RoundStarted", "RunFinished",
    "RunStarted", "SchemaError", "StepEnd", "StepStart", "StreamLossAccepted", "TaskEnd", "TaskSpec", "TaskStart",
    "TokenLogprob", "ToolCall", "ToolInvoked", "ToolResult", "ToolReturned", "ToolSchema",
    "TopLogprob", "Usage", "VerifierScore", "decode_body", "decode_frame", "encode_body",
    "encode_frame", "event_type", "event_types", "headers_for",
]
