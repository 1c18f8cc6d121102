"""Errors of the runtime layer: model providers, processor code, the run loop."""

from __future__ import annotations

from hx.harness.errors import Interrupt
from schemas.errors import HxError
from schemas.model import ModelErrorKind
from streams.redaction import scrub


class AttemptExists(HxError):
    """The attempt's subject already holds events: rerunning it would be deduplicated away."""


class CodeError(HxError):
    """Processor source that cannot be stored, read back or named."""


class ProviderError(HxError):
    """A model call failed; ``kind`` says whether to retry, fall back or raise."""

    def __init__(self, kind: ModelErrorKind, message: str, *, retry_after: float | None = None) -> None:
        self.kind: ModelErrorKind = kind
        self.retry_after = retry_after
        super().__init__(scrub(message))


class ContextTooLong(ProviderError):
    """The request does not fit the model's context window: no retry or fallback can help."""

    def __init__(self, message: str) -> None:
        super().__init__("context_length", message)


class ModelSpecError(ProviderError):
    """A model spec cannot work: unknown provider, malformed URL, missing key. Found before a run starts."""

    def __init__(self, message: str) -> None:
        super().__init__("other", message)


class ProcessorFailed(Interrupt):
    """A processor raised something other than ``Interrupt``: the attempt ends, blamed on it."""
