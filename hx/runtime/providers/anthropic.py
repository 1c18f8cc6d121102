"""``anthropic:``: Claude through the official SDK's Messages API.

System messages become the separate ``system`` prompt; assistant tool calls become
``tool_use`` blocks and tool messages ``tool_result`` blocks, consecutive ones merged into
one user turn. The SDK does not retry (the role's policy in hx does), and its errors are
translated into ``ProviderError`` kinds with the API key removed from every message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import anthropic
from anthropic.types import (
    AssistantMessageParam,
    MessageParam,
    TextBlockParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    UserMessageParam,
)
from anthropic.types import Message as ApiMessage

from hx.runtime.errors import ModelSpecError, ProviderError
from hx.runtime.providers.base import CallContext, Completion, Provider, check_url, option_or_env
from hx.runtime.providers.http_errors import classify_status, retry_after
from schemas.messages import Message, ToolCall, ToolSchema, Usage
from streams.redaction import mask_url, register, register_url, scrub

DEFAULT_MAX_TOKENS = 1024
DEFAULT_TIMEOUT_S = 600.0

_Block = TextBlockParam | ToolUseBlockParam | ToolResultBlockParam


def split_system(messages: tuple[Message, ...]) -> tuple[str, tuple[Message, ...]]:
    """The system prompt (every system message, joined) and the remaining conversation."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    return system, tuple(m for m in messages if m.role != "system")


def _blocks(m: Message) -> list[_Block]:
    if m.role == "tool":
        result = ToolResultBlockParam(type="tool_result", tool_use_id=m.tool_call_id or "")
        if m.content:
            result["content"] = m.content
        return [result]
    blocks: list[_Block] = [TextBlockParam(type="text", text=m.content)] if m.content else []
    if m.role == "assistant":
        blocks.extend(ToolUseBlockParam(type="tool_use", id=c.id, name=c.name, input=dict(c.input))
                      for c in m.tool_calls)
    return blocks


def wire_messages(messages: tuple[Message, ...]) -> list[MessageParam]:
    """Non-system messages as Messages-API turns: same-role neighbours (tool results) merged into one turn."""
    turns: list[tuple[Literal["user", "assistant"], list[_Block]]] = []
    for m in messages:
        if m.role == "system":
            continue
        role: Literal["user", "assistant"] = "assistant" if m.role == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            continue  # the API rejects empty text blocks
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    return [AssistantMessageParam(role="assistant", content=blocks) if role == "assistant"
            else UserMessageParam(role="user", content=blocks) for role, blocks in turns]


def wire_tools(tools: tuple[ToolSchema, ...]) -> list[ToolParam]:
    """Tool schemas as Messages-API tools."""
    out: list[ToolParam] = []
    for t in tools:
        tool = ToolParam(name=t.name, input_schema=t.input_schema or {"type": "object", "properties": {}})
        if t.description:
            tool["description"] = t.description
        out.append(tool)
    return out


def parse_message(message: ApiMessage) -> Completion:
    """A Messages-API response as a ``Completion``: text, tool calls, stop reason, usage, model."""
    text: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            text.append(block.text)
        elif block.type == "tool_use":
            calls.append(ToolCall(id=block.id, name=block.name, input=dict(block.input)))
    usage = message.usage
    return Completion(
        content="".join(text), tool_calls=tuple(calls), stop_reason=message.stop_reason or "",
        usage=Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                    cache_read_tokens=usage.cache_read_input_tokens or 0),
        model_version=message.model,
    )


class AnthropicProvider(Provider):
    """Claude models through ``anthropic.AsyncAnthropic``."""

    scheme = "anthropic"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._key = self.secret("api_key", "ANTHROPIC_API_KEY")
        self.base_url: str | None = self.setting("base_url", "ANTHROPIC_BASE_URL") or None
        """The API's base URL (None: the SDK's default)."""
        self._timeout = float(self.options.get("timeout", DEFAULT_TIMEOUT_S))
        self._sdk: anthropic.AsyncAnthropic | None = None

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, base_url={mask_url(self.base_url or '')!r})"

    @classmethod
    def check(cls, model: str, options: Mapping[str, Any]) -> None:
        """A model name, an API key (option or ``ANTHROPIC_API_KEY``) and, if given, a well-formed base URL."""
        where = f"model 'anthropic:{model}'"
        if not model:
            raise ModelSpecError(f"{where}: no model name, e.g. anthropic:claude-sonnet-4-6")
        key = option_or_env(options, "api_key", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
        if not key:
            raise ModelSpecError(f"{where}: no API key: set ANTHROPIC_API_KEY (or the model's api_key option)")
        register(key)
        url = option_or_env(options, "base_url", "ANTHROPIC_BASE_URL")
        if url:
            register_url(url)
            check_url(url, where)

    def _client(self) -> anthropic.AsyncAnthropic:
        if self._sdk is None:
            # max_retries=0: retries and fallbacks are the role policy's decision, and they go on the log.
            self._sdk = anthropic.AsyncAnthropic(api_key=self._key or None, base_url=self.base_url,
                                                 max_retries=0, timeout=self._timeout)
        return self._sdk

    def request(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                params: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for one call (``seed`` has no Anthropic equivalent)."""
        system, rest = split_system(messages)
        kwargs: dict[str, Any] = {
            "model": self.model, "messages": wire_messages(rest),
            "max_tokens": int(params["max_tokens"] if params.get("max_tokens") is not None else DEFAULT_MAX_TOKENS),
        }
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = wire_tools(tools)
        stop = params.get("stop", params.get("stop_sequences"))
        if stop:
            kwargs["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        # This SDK's signature has no sampling keywords; the API still reads them from the body.
        sampling = {k: params[k] for k in ("temperature", "top_p", "top_k") if params.get(k) is not None}
        if sampling:
            kwargs["extra_body"] = sampling
        return kwargs

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """Call ``messages.create`` once, or raise a classified ``ProviderError``."""
        try:
            response = await self._client().messages.create(**self.request(messages, tools, params))
        except anthropic.AnthropicError as exc:
            # ``from None``: the SDK error holds the request, headers (and key) included.
            raise self._translate(exc) from None
        except TypeError as exc:  # the SDK's "Could not resolve authentication method"
            if "authentication" not in str(exc):
                raise
            raise ProviderError("authentication", f"{self.spec}: no API key: set ANTHROPIC_API_KEY "
                                                  f"or the model's api_key option") from None
        return parse_message(response)

    def _translate(self, exc: anthropic.AnthropicError) -> ProviderError:
        secrets = (self._key,) if self._key else ()
        where = f"{self.spec} at {mask_url(self.base_url or 'api.anthropic.com')}"
        if isinstance(exc, anthropic.APIStatusError):
            kind = exc.type or "error"
            err = classify_status(exc.status_code, f"{kind}: {exc.api_message or exc.message}",
                                  exc.response.headers, secrets, where)
            if err.kind == "other" and kind in ("overloaded_error", "api_error"):
                return ProviderError("server", str(err), retry_after=retry_after(exc.response.headers))
            return err
        if isinstance(exc, anthropic.APITimeoutError):
            return ProviderError("connection", scrub(f"{where}: timed out", secrets))
        if isinstance(exc, anthropic.APIConnectionError):
            cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
            return ProviderError("connection", scrub(f"{where}: {exc.message}{cause}", secrets))
        if isinstance(exc, anthropic.CredentialsError):
            return ProviderError("authentication", scrub(f"{where}: {exc}", secrets))
        return ProviderError("other", scrub(f"{where}: {type(exc).__name__}: {exc}", secrets))

    async def aclose(self) -> None:
        """Close the SDK's HTTP client."""
        if self._sdk is not None:
            await self._sdk.close()
            self._sdk = None
