"""The model-provider port: what the run loop asks of any model, and how failures are classified.

A provider is named by a spec ``scheme:model`` (``anthropic:claude-sonnet-4-6``,
``openai:qwen3@http://127.0.0.1:8000/v1``, ``replay:``, ``random:``). It turns messages
and tool schemas into a ``Completion``; a failure is a ``ProviderError`` whose ``kind``
drives the role's retry and fallback policy.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import msgspec

from schemas.errors import HxError
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema, Usage
from schemas.model import ModelErrorKind
from streams.log import EventLog


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """What a model answered."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str = ""
    usage: Usage = Usage()
    logprobs: tuple[TokenLogprob, ...] = ()
    model_version: str = ""
    """The exact model the provider reports having used."""


class CallContext(msgspec.Struct, frozen=True, kw_only=True):
    """Where in a run a model call happens: what ``replay:`` looks up and ``random:`` seeds from."""

    run_id: str
    round: int
    task_id: str
    attempt: int
    step: int
    role: str = "main"
    seed: int = 0


class ProviderError(HxError):
    """A model call failed; ``kind`` says whether to retry, fall back or raise."""

    def __init__(self, kind: ModelErrorKind, message: str, *, retry_after: float | None = None) -> None:
        self.kind: ModelErrorKind = kind
        self.retry_after = retry_after
        super().__init__(redact(message))


class ContextTooLong(ProviderError):
    """The request does not fit the model's context window: no retry or fallback can help."""

    def __init__(self, message: str) -> None:
        super().__init__("context_length", message)


_SECRET_ENV = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "HX_OPENAI_API_KEY", "HX_NATS_PASSWORD", "HX_NATS_TOKEN")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Remove API keys (given, or found in the usual environment variables) from a message."""
    for secret in (*secrets, *(os.environ.get(name, "") for name in _SECRET_ENV)):
        if secret and len(secret) >= 8:
            text = text.replace(secret, "***")
    return text


class Provider(ABC):
    """A model behind a spec; subclasses set ``scheme`` and implement ``complete``."""

    scheme: ClassVar[str]

    def __init__(self, model: str, *, log: EventLog | None = None, options: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.log = log
        self.options = dict(options or {})

    @property
    def spec(self) -> str:
        """The provider-qualified model name."""
        return f"{self.scheme}:{self.model}"

    def setting(self, name: str, *env: str) -> str:
        """Option ``name``, else the first of the environment variables ``env`` that is set, else ``""``."""
        value = self.options.get(name)
        if value:
            return str(value)
        return next((v for v in (os.environ.get(e) for e in env) if v), "")

    @abstractmethod
    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """Answer one request, or raise ``ProviderError``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most providers hold nothing
        """Release connections."""


ProviderFactory = Callable[..., Provider]
_PROVIDERS: dict[str, type[Provider]] = {}
BUILTIN_PROVIDERS: dict[str, str] = {
    "anthropic": "hx.runtime.providers.anthropic",
    "openai": "hx.runtime.providers.openai",
    "replay": "hx.runtime.providers.replay",
    "random": "hx.runtime.providers.random",
    "script": "hx.runtime.providers.script",
}
"""Scheme to module for the providers hx ships; a module registers its class when imported."""


def register_provider(cls: type[Provider]) -> type[Provider]:
    """Make a provider class available under its scheme."""
    _PROVIDERS[cls.scheme] = cls
    return cls


def make_provider(spec: str, *, log: EventLog | None = None, options: Mapping[str, Any] | None = None) -> Provider:
    """Build the provider a spec names; unknown schemes are a clear error."""
    scheme, sep, model = spec.partition(":")
    if not sep:
        raise ProviderError("other", f"model spec {spec!r} needs a scheme, e.g. 'anthropic:claude-sonnet-4-6'")
    cls = _PROVIDERS.get(scheme)
    if cls is None and scheme in BUILTIN_PROVIDERS:
        importlib.import_module(BUILTIN_PROVIDERS[scheme])  # registers the class on import
        cls = _PROVIDERS.get(scheme)
    if cls is None:
        raise ProviderError("other", f"unknown model provider {scheme!r} in {spec!r}; known: "
                                     f"{', '.join(sorted({*_PROVIDERS, *BUILTIN_PROVIDERS}))}")
    return cls(model, log=log, options=options)
