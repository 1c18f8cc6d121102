"""Model calls: the request, the response (with log-probabilities) and failed attempts."""

from __future__ import annotations

from typing import Literal

from schemas.event import Event, JsonObject
from schemas.messages import History, Message, TokenLogprob, ToolCall, ToolSchema, Usage

ModelErrorKind = Literal["rate_limit", "authentication", "context_length", "connection", "server", "other"]


class ModelRequest(Event, frozen=True, kw_only=True):
    """What was sent to a model for one role at one step."""

    TYPE = "model.request"
    STARTS = "model"
    VERSION = 2
    READS = (1,)
    """Version 1 had no ``history``."""

    role: str
    """The model role (``main``, ``judge``, ...)."""
    model: str
    """Provider-qualified model name, for example ``anthropic:claude-sonnet-4-6``."""
    step: int
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSchema, ...] = ()
    params: JsonObject = {}
    """Sampling parameters (temperature, max tokens, seed) as the role's provider takes them: each provider has its
    own options."""
    try_index: int = 0
    """Which try this is within the role's retry and fallback chain."""
    history: History | None = None
    """On the log, ``messages`` as a delta (``messages`` is then empty); see ``schemas.history``."""


class ModelResponse(Event, frozen=True, kw_only=True):
    """What a model answered, with what the learner needs to train on it."""

    TYPE = "model.response"
    ENDS = "model"

    role: str
    model: str
    model_version: str = ""
    """The exact model id the provider reported (snapshot, checkpoint digest)."""
    step: int
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str = ""
    usage: Usage = Usage()
    logprobs: tuple[TokenLogprob, ...] = ()
    """Per-token (or per-choice) log-probabilities of what was chosen, when available."""
    try_index: int = 0


class ModelError(Event, frozen=True, kw_only=True):
    """A model call failed; ``kind`` drives retry and fallback."""

    TYPE = "model.error"
    ENDS = "model"

    role: str
    model: str
    step: int
    kind: ModelErrorKind
    message: str
    """The provider's message with any secret removed."""
    try_index: int = 0
    next_action: Literal["retry", "fallback", "raise"] = "raise"
