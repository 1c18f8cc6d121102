"""The model-provider port: what the run loop asks of any model, and how failures are classified.

A provider is named by a spec ``scheme:model`` (``anthropic:claude-sonnet-4-6``,
``openai:qwen3@http://127.0.0.1:8000/v1``, ``replay:``, ``random:``). It turns messages
and tool schemas into a ``Completion``; a failure is a ``ProviderError`` whose ``kind``
drives the role's retry and fallback policy.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import msgspec

from hx.entry_points import Registry
from hx.errors import LoadFailed, UnknownName
from hx.runtime.errors import ModelSpecError
from hx.runtime.providers.resources import ProviderResources
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema, Usage
from streams.log import EventLog
from streams.redaction import mask_url, register, scrub


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


def option_or_env(options: Mapping[str, Any], name: str, *env: str) -> str:
    """Option ``name``, else the first of the environment variables ``env`` that is set, else ``""``."""
    value = options.get(name)
    if value:
        return str(value)
    return next((v for v in (os.environ.get(e) for e in env) if v), "")


class Provider(ABC):
    """A model behind a spec; subclasses set ``scheme`` and implement ``complete``."""

    scheme: ClassVar[str]

    def __init__(self, model: str, *, log: EventLog | None = None, options: Mapping[str, Any] | None = None,
                 resources: ProviderResources | None = None) -> None:
        self.model = model
        self.log = log
        self.options = dict(options or {})
        self.resources = resources if resources is not None else ProviderResources()
        """What the command lends its providers (a provider takes the kind it needs, e.g. a policy store)."""

    @property
    def spec(self) -> str:
        """The provider-qualified model name."""
        return f"{self.scheme}:{self.model}"

    def setting(self, name: str, *env: str) -> str:
        """Option ``name``, else the first of the environment variables ``env`` that is set, else ``""``."""
        return option_or_env(self.options, name, *env)

    def secret(self, name: str, *env: str) -> str:
        """Like ``setting``, for a credential: the value is registered so that no output ever shows it."""
        value = self.setting(name, *env)
        register(value)
        return value

    @abstractmethod
    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """Answer one request, or raise ``ProviderError``."""

    @classmethod  # noqa: B027 - optional: most providers need nothing checked
    def check(cls, model: str, options: Mapping[str, Any]) -> None:
        """Raise ``ModelSpecError`` when ``model`` and ``options`` cannot work; no network, no model call."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most providers hold nothing
        """Release connections."""


ProviderFactory = Callable[..., Provider]
PROVIDERS: Registry[type[Provider]] = Registry("hx.providers", "model provider")
"""Provider classes by scheme: the ``hx.providers`` entry points (hx's own and any package's), loaded on first use."""


def register_provider(cls: type[Provider]) -> type[Provider]:
    """Make a provider class available under its scheme in this process (a test's or a plugin's own provider)."""
    PROVIDERS.add(cls.scheme, cls)
    return cls


def provider_class(spec: str) -> tuple[type[Provider], str]:
    """The provider class a spec names and the model part; ``ModelSpecError`` when there is none."""
    scheme, sep, model = spec.partition(":")
    if not sep:
        raise ModelSpecError(f"model spec {scrub(spec)!r} needs a scheme, e.g. 'anthropic:claude-sonnet-4-6'")
    try:
        cls = PROVIDERS.load(scheme)
    except UnknownName:
        raise ModelSpecError(f"unknown model provider {scheme!r} in {scrub(spec)!r}; known: "
                             f"{', '.join(PROVIDERS.names())}") from None
    except LoadFailed as exc:
        raise ModelSpecError(str(exc)) from None
    if not (isinstance(cls, type) and issubclass(cls, Provider)) or cls.scheme != scheme:
        raise ModelSpecError(f"model provider {scheme!r}: {cls!r} is not a Provider subclass with scheme {scheme!r}")
    return cls, model


def check_spec(spec: str, options: Mapping[str, Any] | None = None) -> None:
    """Check a model spec without calling the model (provider known, URL well formed, key present)."""
    cls, model = provider_class(spec)
    cls.check(model, dict(options or {}))


def check_url(url: str, where: str) -> None:
    """Raise ``ModelSpecError`` unless ``url`` is an absolute http(s) URL with a host (and a valid port)."""
    if any(c.isspace() for c in url):
        raise ModelSpecError(f"{where}: {mask_url(url)!r} is not a URL: it holds a space")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check: ValueError when it is not a number in range
    except ValueError as exc:
        raise ModelSpecError(f"{where}: malformed URL {mask_url(url)!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelSpecError(f"{where}: {mask_url(url)!r} is not an http:// or https:// URL with a host")


def make_provider(spec: str, *, log: EventLog | None = None, options: Mapping[str, Any] | None = None,
                  resources: ProviderResources | None = None) -> Provider:
    """Build the provider a spec names, lending it ``resources``; unknown schemes are a clear error."""
    cls, model = provider_class(spec)
    return cls(model, log=log, options=options, resources=resources)
