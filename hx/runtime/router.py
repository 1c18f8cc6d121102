"""The call policy of one role: retries with backoff, fallback along the chain, every try logged."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from hx.runtime.errors import ContextTooLong, ProviderError
from hx.runtime.providers.base import CallContext, Completion, Provider, make_provider
from hx.runtime.providers.resources import ProviderResources
from schemas.event import Event
from schemas.messages import Message, ToolSchema
from schemas.model import ModelError, ModelRequest, ModelResponse
from streams.log import EventLog
from streams.redaction import scrub

RETRYABLE = frozenset({"rate_limit", "connection", "server"})


class RoleChains(Protocol):
    """What the router needs of a model configuration."""

    @property
    def retries(self) -> int: ...
    @property
    def backoff_s(self) -> float: ...

    def chain(self, role: str) -> list[str]: ...
    def params_for(self, role: str) -> dict[str, Any]: ...
    def options_for(self, spec: str) -> dict[str, Any]: ...


class ModelRouter:
    """Calls the model of a role, retrying and falling back by error kind; emits an event per try."""

    def __init__(self, models: RoleChains, *, log: EventLog | None = None,
                 resources: ProviderResources | None = None, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.models = models
        self.log = log
        self.resources = resources if resources is not None else ProviderResources()
        """Lent to every provider this router builds."""
        self._providers: dict[str, Provider] = {}
        self._public: dict[str, str] = {}
        self._sleep = sleep

    def public(self, spec: str) -> str:
        """A spec as events show it: credentials in its URL masked."""
        shown = self._public.get(spec)
        if shown is None:
            shown = self._public[spec] = scrub(spec)
        return shown

    def provider(self, spec: str) -> Provider:
        """The (cached) provider of a model spec."""
        prov = self._providers.get(spec)
        if prov is None:
            prov = self._providers[spec] = make_provider(spec, log=self.log, options=self.models.options_for(spec),
                                                          resources=self.resources)
        return prov

    async def complete(self, role: str, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       ctx: CallContext, emit: Callable[[Event], None],
                       extra_params: Mapping[str, Any] | None = None) -> tuple[str, Completion]:
        """Answer one request through the role's chain; return the model spec used (as shown) and its completion."""
        params = {**self.models.params_for(role), **(extra_params or {})}
        try_index = 0
        last: ProviderError | None = None
        chain = self.models.chain(role)
        for position, spec in enumerate(chain):
            shown = self.public(spec)
            for retry in range(self.models.retries + 1):
                emit(ModelRequest(role=role, model=shown, step=ctx.step, messages=messages, tools=tools,
                                  params=params, try_index=try_index))
                try:
                    completion = await self.provider(spec).complete(messages, tools, params, ctx)
                except ProviderError as exc:
                    last = exc
                    retryable = exc.kind in RETRYABLE and retry < self.models.retries
                    fatal = isinstance(exc, ContextTooLong) or exc.kind == "context_length"
                    action: Literal["retry", "fallback", "raise"] = "raise" if fatal else "retry" if retryable else (
                        "fallback" if position + 1 < len(chain) else "raise")
                    emit(ModelError(role=role, model=shown, step=ctx.step, kind=exc.kind, message=str(exc),
                                    try_index=try_index, next_action=action))
                    try_index += 1
                    if action == "raise":
                        raise
                    if action == "retry":
                        delay = exc.retry_after if exc.retry_after is not None else self.models.backoff_s * 2**retry
                        await self._sleep(delay)
                        continue
                    break  # fall back to the next model of the chain
                emit(ModelResponse(role=role, model=shown, model_version=completion.model_version, step=ctx.step,
                                   content=completion.content, tool_calls=completion.tool_calls,
                                   stop_reason=completion.stop_reason, usage=completion.usage,
                                   logprobs=completion.logprobs, try_index=try_index))
                return shown, completion
        assert last is not None
        raise last

    async def aclose(self) -> None:
        """Close every provider opened."""
        for prov in self._providers.values():
            await prov.aclose()
        self._providers.clear()
