"""``openai:``: any OpenAI-compatible chat-completions server (vLLM, Ollama, llama.cpp, OpenAI).

The spec is ``openai:MODEL`` with the server's base URL from ``options["base_url"]``,
``HX_OPENAI_BASE_URL`` or ``http://127.0.0.1:8000/v1``; ``openai:MODEL@http://host:port/v1``
names the server in the spec itself. The key (``options["api_key"]``, ``HX_OPENAI_API_KEY``
or ``OPENAI_API_KEY``) goes in a Bearer header and never into an error message. A query in
the base URL (``...@https://host/v1?api-version=2&api_key=KEY``) is sent with every request;
its secret values, like a password in the URL, are masked wherever the spec is shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx2

from hx.runtime.errors import ModelSpecError, ProviderError
from hx.runtime.providers.base import CallContext, Completion, Provider, check_url, option_or_env
from hx.runtime.providers.http_errors import classify_status
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema, TopLogprob, Usage
from streams.redaction import mask_url, register_url, scrub

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_TIMEOUT_S = 600.0
_SPEC_URL = re.compile(r"@https?://")
_MAX_BODY_IN_ERROR = 500

def split_spec(model: str) -> tuple[str, str | None]:
    """``MODEL@http://host/v1`` -> (``MODEL``, the URL); a plain model name has no URL.

    The URL starts at the first ``@`` followed by ``http://`` or ``https://``, so a URL that
    carries credentials (``MODEL@http://user:password@host/v1``) stays whole.
    """
    match = _SPEC_URL.search(model)
    if match and match.start() > 0:
        return model[:match.start()], model[match.start() + 1:]
    return model, None


def base_url(model: str, options: Mapping[str, Any]) -> str:
    """The server's base URL for a spec's model part and options (spec, option, environment, default)."""
    _, url = split_spec(model)
    return (url or option_or_env(options, "base_url", "HX_OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def shown_spec(model: str) -> str:
    """An ``openai:`` spec as errors show it: credentials masked, whether its server part is a URL or not."""
    name, url = split_spec(model)
    if url is not None:
        return f"openai:{name}@{mask_url(url)}"
    head, at, rest = name.partition("@")
    return f"openai:{head}{at}{mask_url(rest) if at else ''}"


def split_query(url: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A base URL without its query (and fragment), and the query's parameters, sent with every request.

    The request path goes after the base URL's path, so a query left in it would end up
    before the path (``/v1?key=K/chat/completions``).
    """
    parts = urlsplit(url)
    query = tuple(parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit(parts._replace(query="", fragment="")).rstrip("/"), query


def wire_messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """hx messages in the chat-completions format (tool calls with JSON-string arguments)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
            continue
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.role == "assistant" and m.tool_calls:
            msg["content"] = m.content or None
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.input, ensure_ascii=False)}}
                for c in m.tool_calls
            ]
        if m.name:
            msg["name"] = m.name
        out.append(msg)
    return out


def wire_tools(tools: tuple[ToolSchema, ...]) -> list[dict[str, Any]]:
    """Tool schemas as chat-completions function tools."""
    return [
        {"type": "function", "function": {
            "name": t.name, "description": t.description,
            "parameters": t.input_schema or {"type": "object", "properties": {}},
        }}
        for t in tools
    ]


def _arguments(raw: Any) -> dict[str, Any]:
    """Decode a tool call's arguments; malformed JSON is kept as ``{"_raw": ...}``, never a crash."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    text = raw if isinstance(raw, str) else json.dumps(raw)
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": text}


def _logprobs(choice: Mapping[str, Any]) -> tuple[TokenLogprob, ...]:
    content = (choice.get("logprobs") or {}).get("content") or ()
    return tuple(
        TokenLogprob(
            token=str(item.get("token", "")), logprob=float(item.get("logprob", 0.0)),
            top=tuple(TopLogprob(token=str(t.get("token", "")), logprob=float(t.get("logprob", 0.0)))
                      for t in item.get("top_logprobs") or ()),
        )
        for item in content
    )


def parse_completion(body: Mapping[str, Any]) -> Completion:
    """The first choice of a chat-completions response as a ``Completion`` (``ValueError`` when none)."""
    choices = body.get("choices") or ()
    if not choices:
        raise ValueError("no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    calls = tuple(
        ToolCall(id=str(c.get("id") or f"call_{i}"), name=str((c.get("function") or {}).get("name", "")),
                 input=_arguments((c.get("function") or {}).get("arguments")))
        for i, c in enumerate(message.get("tool_calls") or ())
    )
    usage = body.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Completion(
        content=message.get("content") or "",
        tool_calls=calls,
        stop_reason=choice.get("finish_reason") or "",
        usage=Usage(input_tokens=int(usage.get("prompt_tokens") or 0),
                    output_tokens=int(usage.get("completion_tokens") or 0),
                    cache_read_tokens=int(cached)),
        logprobs=_logprobs(choice),
        model_version=str(body.get("model") or ""),
    )


def _error_message(response: httpx2.Response) -> str:
    """The server's own explanation: ``error.message`` (OpenAI, vLLM), ``error`` (Ollama) or the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:_MAX_BODY_IN_ERROR]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:_MAX_BODY_IN_ERROR]
        if isinstance(err, str):
            return err[:_MAX_BODY_IN_ERROR]
    return json.dumps(body)[:_MAX_BODY_IN_ERROR]


class OpenAIProvider(Provider):
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint."""

    scheme = "openai"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.model_name = split_spec(model)[0]
        """The model name sent to the server."""
        url = base_url(model, self.options)
        register_url(url)
        self.base_url, self._query = split_query(url)
        """The server's base URL (ending in ``/v1`` for most servers); credentials in it are registered secrets."""
        self._key = self.secret("api_key", "HX_OPENAI_API_KEY", "OPENAI_API_KEY")
        self._timeout = float(self.options.get("timeout", DEFAULT_TIMEOUT_S))
        self._http: httpx2.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.model_name!r}, base_url={mask_url(self.base_url)!r})"

    @classmethod
    def check(cls, model: str, options: Mapping[str, Any]) -> None:
        """A model name, and a well-formed http(s) base URL (its credentials registered as secrets)."""
        name, url = split_spec(model)
        where = f"model {shown_spec(model)!r}"
        if not name:
            raise ModelSpecError(f"{where}: no model name (openai:MODEL or openai:MODEL@http://host:port/v1)")
        if url is None and "://" in name:
            raise ModelSpecError(f"{where}: the server URL after '@' must start with http:// or https://")
        if url is None and "@" in name:
            raise ModelSpecError(f"{where}: {mask_url(name.partition('@')[2])!r} after '@' is not a server URL "
                                 f"(openai:MODEL@http://host:port/v1)")
        url = base_url(model, options)
        register_url(url)
        check_url(url, where)

    def _client(self) -> httpx2.AsyncClient:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
            # HTTP(S)_PROXY and NO_PROXY apply unless options say trust_env=False
            self._http = httpx2.AsyncClient(base_url=self.base_url, headers=headers, params=self._query,
                                            timeout=self._timeout, trust_env=bool(self.options.get("trust_env", True)))
        return self._http

    def request_body(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                     params: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON body of one chat-completions request."""
        body: dict[str, Any] = {"model": self.model_name, "messages": wire_messages(messages)}
        if tools:
            body["tools"] = wire_tools(tools)
        for name in ("temperature", "top_p", "max_tokens", "seed"):
            if params.get(name) is not None:
                body[name] = params[name]
        stop = params.get("stop", params.get("stop_sequences"))
        if stop:
            body["stop"] = [stop] if isinstance(stop, str) else list(stop)
        wanted = params.get("logprobs")
        if wanted is not None and wanted is not False:
            body["logprobs"] = True
            top = params.get("top_logprobs", 0) if wanted is True else wanted
            body["top_logprobs"] = int(top)
        return body

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """POST ``/chat/completions`` and map the first choice, or raise a classified ``ProviderError``."""
        where = f"{self.scheme}:{self.model_name} at {mask_url(self.base_url)}"
        secrets = (self._key,) if self._key else ()
        try:
            response = await self._client().post("/chat/completions",
                                                 json=self.request_body(messages, tools, params))
        except httpx2.TimeoutException as exc:
            raise ProviderError("connection", scrub(f"{where}: timed out ({type(exc).__name__})",
                                                     secrets)) from None
        except httpx2.TransportError as exc:
            raise ProviderError("connection", scrub(f"{where}: {type(exc).__name__}: {exc}", secrets)) from None
        if response.status_code >= 400:
            raise classify_status(response.status_code, _error_message(response), response.headers, secrets, where)
        try:
            body = response.json()
        except ValueError:
            raise ProviderError("other", scrub(f"{where}: response is not JSON: "
                                                f"{response.text[:_MAX_BODY_IN_ERROR]}", secrets)) from None
        if not isinstance(body, dict):
            raise ProviderError("other", scrub(f"{where}: unexpected response {str(body)[:_MAX_BODY_IN_ERROR]}",
                                                secrets))
        try:
            return parse_completion(body)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ProviderError("other", scrub(f"{where}: malformed response ({exc}): "
                                                f"{json.dumps(body)[:_MAX_BODY_IN_ERROR]}", secrets)) from None

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
