"""Model providers: Anthropic and OpenAI-compatible against a local server playing recorded responses,
``replay:`` against a real nats-server, and the seeded ``random:`` baseline."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
from model_server import RecordedReplies, serving

from hx.runtime.providers import (
    CallContext,
    Completion,
    ContextTooLong,
    Provider,
    ProviderError,
    make_provider,
)
from hx.runtime.providers.anthropic import AnthropicProvider
from hx.runtime.providers.openai import OpenAIProvider
from hx.runtime.providers.random import RandomProvider
from hx.runtime.providers.replay import ReplayProvider
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema, TopLogprob, Usage
from schemas.model import ModelRequest, ModelResponse
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.topology import trace_subject

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
KEY = "sk-ant-TEST-SECRET-123456"
CTX = CallContext(run_id="run-1", round=1, task_id="twx:coin:dev:3", attempt=0, step=2)

ACT = ToolSchema(name="act", description="Do one action in the game.", input_schema={
    "type": "object",
    "properties": {"verb": {"type": "string", "enum": ["open", "take", "go", "look"]},
                   "object": {"type": "string", "enum": ["fridge", "coin", "north"]},
                   "note": {"type": "string"}},
    "required": ["verb", "object"],
})
LOOK = ToolSchema(name="look", description="Describe the room.", input_schema={"type": "object", "properties": {}})
CONVERSATION = (
    Message(role="system", content="You are a text-game agent."),
    Message(role="user", content="Find the coin."),
    Message(role="assistant", content="Let me look around.", tool_calls=(
        ToolCall(id="toolu_1", name="look", input={}),
        ToolCall(id="toolu_2", name="act", input={"verb": "open", "object": "fridge"}),
    )),
    Message(role="tool", content="You are in the kitchen.", tool_call_id="toolu_1", name="look"),
    Message(role="tool", content="The fridge is open.", tool_call_id="toolu_2", name="act"),
    Message(role="user", content="Keep going."),
)


# --- a local server playing recorded responses -----------------------------------------------

@dataclass
class Received:
    """One request the fake server got."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class RecordedAPI:
    """A loopback HTTP server that answers each request with the next recorded fixture."""

    url: str = ""
    requests: list[Received] = field(default_factory=list)
    queue: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def play(self, *names: str) -> None:
        """Answer the next requests with these fixtures (``anthropic/text``), in order."""
        with self.lock:
            self.queue.extend(json.loads((FIXTURES / f"{n}.json").read_text()) for n in names)

    def next(self, received: Received) -> dict[str, Any]:
        with self.lock:
            self.requests.append(received)
            if not self.queue:
                return {"status": 500, "headers": {"content-type": "application/json"},
                        "body": {"error": {"message": "test server: no recorded response left"}}}
            return self.queue.pop(0)


def sent_key(req: Received) -> str:
    """The key a request carried: ``x-api-key``, or a Bearer token (what this SDK version sends)."""
    bearer = req.headers.get("authorization", "")
    assert ("x-api-key" in req.headers) != bool(bearer), "exactly one credential header"
    return req.headers.get("x-api-key") or bearer.removeprefix("Bearer ")


def _handler(api: RecordedAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(RecordedReplies):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorded = api.next(Received("POST", self.path, headers, json.loads(raw or b"null")))
            # A fixture may echo the caller's key (servers do, in auth errors): it must not leak further.
            key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
            self.reply(recorded["status"], json.dumps(recorded["body"]).replace("${API_KEY}", key).encode(),
                       recorded["headers"])

    return Handler


@pytest.fixture
def api() -> Iterator[RecordedAPI]:
    recorded = RecordedAPI()
    with serving(_handler(recorded)) as url:
        recorded.url = url
        yield recorded


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = int(server.server_address[1])
    server.server_close()
    return port


@pytest.fixture(autouse=True)
def no_ambient_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY",
                 "HX_OPENAI_API_KEY", "HX_OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


async def failure(provider: Provider, params: dict[str, Any] | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await provider.complete(CONVERSATION, (ACT,), params or {}, CTX)
    assert KEY not in str(info.value)
    assert KEY not in repr(info.value)
    return info.value


def no_key_in(completion: Completion) -> None:
    assert KEY.encode() not in msgspec.json.encode(completion)


# --- anthropic: ----------------------------------------------------------------------------

@pytest.fixture
async def claude(api: RecordedAPI) -> AsyncIterator[Provider]:
    provider = make_provider("anthropic:claude-sonnet-4-6", options={"api_key": KEY, "base_url": api.url})
    yield provider
    await provider.aclose()


async def test_anthropic_request_mapping(api: RecordedAPI, claude: Provider) -> None:
    api.play("anthropic/text")
    await claude.complete(CONVERSATION, (ACT, LOOK), {"temperature": 0.2, "top_p": 0.9, "seed": 7,
                                                      "stop": ["\nObservation:"]}, CTX)
    (req,) = api.requests
    assert (req.method, req.path) == ("POST", "/v1/messages")
    assert sent_key(req) == KEY
    assert "anthropic-version" in req.headers
    body = req.body
    assert body["model"] == "claude-sonnet-4-6"
    assert body["system"] == "You are a text-game agent."
    assert body["max_tokens"] == 1024
    assert (body["temperature"], body["top_p"]) == (0.2, 0.9)
    assert "seed" not in body
    assert body["stop_sequences"] == ["\nObservation:"]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Find the coin."}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look around."},
            {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}},
            {"type": "tool_use", "id": "toolu_2", "name": "act", "input": {"verb": "open", "object": "fridge"}},
        ]},
        {"role": "user", "content": [  # both results (and the user's next words) in one user turn
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "You are in the kitchen."},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "The fridge is open."},
            {"type": "text", "text": "Keep going."},
        ]},
    ]
    assert body["tools"] == [
        {"name": "act", "description": "Do one action in the game.", "input_schema": ACT.input_schema},
        {"name": "look", "description": "Describe the room.", "input_schema": LOOK.input_schema},
    ]


async def test_anthropic_max_tokens_and_no_tools(api: RecordedAPI, claude: Provider) -> None:
    api.play("anthropic/text")
    await claude.complete((Message(role="user", content="hi"),), (), {"max_tokens": 64}, CTX)
    body = api.requests[0].body
    assert body["max_tokens"] == 64
    assert "tools" not in body and "system" not in body and "temperature" not in body


async def test_anthropic_text_response(api: RecordedAPI, claude: Provider) -> None:
    api.play("anthropic/text")
    completion = await claude.complete(CONVERSATION, (ACT,), {}, CTX)
    assert completion == Completion(
        content="The coin is in the kitchen, inside the fridge.", stop_reason="end_turn",
        usage=Usage(input_tokens=412, output_tokens=14), model_version="claude-sonnet-4-6")
    no_key_in(completion)


async def test_anthropic_tool_use_response(api: RecordedAPI, claude: Provider) -> None:
    api.play("anthropic/tool_use")
    completion = await claude.complete(CONVERSATION, (ACT,), {}, CTX)
    assert completion.content == "I'll open the fridge to look for the coin."
    assert completion.tool_calls == (
        ToolCall(id="toolu_01A09q90qw90lq917835lq9", name="act", input={"verb": "open", "object": "fridge"}),)
    assert completion.stop_reason == "tool_use"
    assert completion.usage == Usage(input_tokens=980, output_tokens=71, cache_read_tokens=2048)
    no_key_in(completion)


@pytest.mark.parametrize(("fixture", "kind", "retry_after"), [
    ("anthropic/rate_limit", "rate_limit", 17.0),
    ("anthropic/unauthorized", "authentication", None),
    ("anthropic/permission", "authentication", None),
    ("anthropic/prompt_too_long", "context_length", None),
    ("anthropic/overloaded", "server", None),
    ("anthropic/server_error", "server", None),
    ("anthropic/bad_request", "other", None),
])
async def test_anthropic_errors_are_classified(api: RecordedAPI, claude: Provider, fixture: str, kind: str,
                                               retry_after: float | None) -> None:
    api.play(fixture)
    error = await failure(claude)
    assert error.kind == kind
    assert error.retry_after == retry_after
    assert len(api.requests) == 1  # the SDK does not retry: the role policy does
    if kind == "context_length":
        assert isinstance(error, ContextTooLong)
        assert "prompt is too long" in str(error)


async def test_anthropic_key_echoed_by_the_server_is_redacted(api: RecordedAPI, claude: Provider) -> None:
    api.play("anthropic/unauthorized")
    error = await failure(claude)
    assert "invalid x-api-key: ***" in str(error)
    assert error.__cause__ is None and error.__suppress_context__  # the SDK error (request headers) never shows


async def test_anthropic_connection_error(closed_port: int) -> None:
    provider = AnthropicProvider("claude-sonnet-4-6", options={"api_key": KEY,
                                                                "base_url": f"http://127.0.0.1:{closed_port}"})
    try:
        error = await failure(provider)
    finally:
        await provider.aclose()
    assert error.kind == "connection"


async def test_anthropic_key_and_url_from_environment(api: RecordedAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    provider = make_provider("anthropic:claude-haiku-4-5")
    api.play("anthropic/text", "anthropic/unauthorized")
    try:
        assert (await provider.complete(CONVERSATION, (), {}, CTX)).content
        error = await failure(provider)
    finally:
        await provider.aclose()
    assert sent_key(api.requests[0]) == KEY
    assert error.kind == "authentication"


# --- openai: -------------------------------------------------------------------------------

@pytest.fixture
async def gpt(api: RecordedAPI) -> AsyncIterator[Provider]:
    provider = make_provider("openai:Qwen/Qwen2.5-7B-Instruct", options={"api_key": KEY, "base_url": f"{api.url}/v1"})
    yield provider
    await provider.aclose()


async def test_openai_request_mapping(api: RecordedAPI, gpt: Provider) -> None:
    api.play("openai/text_logprobs")
    await gpt.complete(CONVERSATION, (ACT,), {"temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "seed": 11,
                                              "stop": "\n\n", "logprobs": 2}, CTX)
    (req,) = api.requests
    assert (req.method, req.path) == ("POST", "/v1/chat/completions")
    assert req.headers["authorization"] == f"Bearer {KEY}"
    body = req.body
    assert body["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert body["messages"] == [
        {"role": "system", "content": "You are a text-game agent."},
        {"role": "user", "content": "Find the coin."},
        {"role": "assistant", "content": "Let me look around.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "look", "arguments": "{}"}},
            {"id": "toolu_2", "type": "function",
             "function": {"name": "act", "arguments": '{"verb": "open", "object": "fridge"}'}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "You are in the kitchen."},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "The fridge is open."},
        {"role": "user", "content": "Keep going."},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "act", "description": "Do one action in the game.", "parameters": ACT.input_schema}}]
    assert {k: body[k] for k in ("temperature", "top_p", "max_tokens", "seed", "stop")} == {
        "temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "seed": 11, "stop": ["\n\n"]}
    assert (body["logprobs"], body["top_logprobs"]) == (True, 2)


async def test_openai_plain_request_has_no_optional_fields(api: RecordedAPI, gpt: Provider) -> None:
    api.play("openai/text_logprobs")
    await gpt.complete((Message(role="user", content="hi"),), (), {}, CTX)
    assert set(api.requests[0].body) == {"model", "messages"}


async def test_openai_text_and_logprobs(api: RecordedAPI, gpt: Provider) -> None:
    api.play("openai/text_logprobs")
    completion = await gpt.complete(CONVERSATION, (), {"logprobs": True, "top_logprobs": 2}, CTX)
    assert completion.content == "go north"
    assert completion.tool_calls == ()
    assert completion.stop_reason == "stop"
    assert completion.usage == Usage(input_tokens=57, output_tokens=2, cache_read_tokens=32)
    assert completion.model_version == "Qwen/Qwen2.5-7B-Instruct"
    assert completion.logprobs == (
        TokenLogprob(token="go", logprob=-0.0123, top=(TopLogprob(token="go", logprob=-0.0123),
                                                       TopLogprob(token="open", logprob=-4.52))),
        TokenLogprob(token=" north", logprob=-0.693, top=(TopLogprob(token=" north", logprob=-0.693),
                                                          TopLogprob(token=" south", logprob=-0.71))),
    )
    no_key_in(completion)


async def test_openai_tool_calls(api: RecordedAPI, gpt: Provider) -> None:
    api.play("openai/tool_calls")
    completion = await gpt.complete(CONVERSATION, (ACT, LOOK), {}, CTX)
    assert completion.content == ""
    assert completion.tool_calls == (
        ToolCall(id="call_a1b2c3d4e5", name="act", input={"verb": "open", "object": "fridge"}),
        ToolCall(id="call_f6g7h8i9j0", name="look", input={}),
    )
    assert completion.stop_reason == "tool_calls"
    assert completion.model_version == "gpt-4o-2024-08-06"
    assert completion.logprobs == ()


async def test_openai_malformed_arguments_are_kept_raw(api: RecordedAPI, gpt: Provider) -> None:
    api.play("openai/malformed_args")
    completion = await gpt.complete(CONVERSATION, (ACT,), {}, CTX)
    assert completion.tool_calls == (
        ToolCall(id="Qm9vN0RmXkP", name="act", input={"_raw": '{"verb": "open", "object": "fri'}),)
    assert completion.usage == Usage(input_tokens=140, output_tokens=19)


@pytest.mark.parametrize(("fixture", "kind", "retry_after"), [
    ("openai/rate_limit", "rate_limit", 2.5),
    ("openai/unauthorized", "authentication", None),
    ("openai/forbidden", "authentication", None),
    ("openai/context_length", "context_length", None),
    ("openai/server_error", "server", 1.0),
    ("openai/ollama_not_found", "other", None),
])
async def test_openai_errors_are_classified(api: RecordedAPI, gpt: Provider, fixture: str, kind: str,
                                            retry_after: float | None) -> None:
    api.play(fixture)
    error = await failure(gpt)
    assert error.kind == kind
    assert error.retry_after == retry_after
    if kind == "context_length":
        assert isinstance(error, ContextTooLong)
        assert "maximum context length is 4096" in str(error)
    if fixture == "openai/unauthorized":
        assert "Incorrect API key provided: ***" in str(error)
    if fixture == "openai/ollama_not_found":
        assert 'model "qwen3:8b" not found' in str(error)


async def test_openai_connection_error(closed_port: int) -> None:
    provider = make_provider(f"openai:qwen3@http://127.0.0.1:{closed_port}/v1", options={"api_key": KEY})
    try:
        error = await failure(provider)
    finally:
        await provider.aclose()
    assert error.kind == "connection"
    assert f"127.0.0.1:{closed_port}" in str(error)


async def test_openai_url_in_spec_and_environment(api: RecordedAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    in_spec = make_provider(f"openai:qwen3:8b@{api.url}/v1")
    assert isinstance(in_spec, OpenAIProvider)
    assert (in_spec.model_name, in_spec.base_url, in_spec.spec) == ("qwen3:8b", f"{api.url}/v1",
                                                                    f"openai:qwen3:8b@{api.url}/v1")
    monkeypatch.setenv("HX_OPENAI_BASE_URL", f"{api.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    from_env = make_provider("openai:qwen3:8b")
    assert isinstance(from_env, OpenAIProvider)
    assert from_env.base_url == f"{api.url}/v1"
    monkeypatch.delenv("HX_OPENAI_BASE_URL")
    assert OpenAIProvider("m").base_url == "http://127.0.0.1:8000/v1"
    api.play("openai/tool_calls", "openai/tool_calls")
    try:
        await in_spec.complete(CONVERSATION, (), {}, CTX)
        await from_env.complete(CONVERSATION, (), {}, CTX)
    finally:
        await in_spec.aclose()
        await from_env.aclose()
    assert [r.body["model"] for r in api.requests] == ["qwen3:8b", "qwen3:8b"]
    assert "authorization" not in api.requests[0].headers  # no key configured then
    assert api.requests[1].headers["authorization"] == f"Bearer {KEY}"


# --- replay: -------------------------------------------------------------------------------

def response(step: int, content: str, *, role: str = "main", try_index: int = 0) -> ModelResponse:
    return ModelResponse(
        role=role, model="anthropic:claude-sonnet-4-6", model_version="claude-sonnet-4-6", step=step,
        content=content, tool_calls=(ToolCall(id=f"toolu_{step}", name="act", input={"verb": "go", "n": step}),),
        stop_reason="tool_use", usage=Usage(input_tokens=100 + step, output_tokens=step, cache_read_tokens=1),
        logprobs=(TokenLogprob(token="go", logprob=-0.5, top=(TopLogprob(token="go", logprob=-0.5),)),),
        try_index=try_index,
    )


def ctx(step: int, *, run: str = "run-A", attempt: int = 0, role: str = "main") -> CallContext:
    return CallContext(run_id=run, round=1, task_id="twx:coin:dev:3", attempt=attempt, step=step, role=role)


def as_completion(r: ModelResponse) -> Completion:
    return Completion(content=r.content, tool_calls=r.tool_calls, stop_reason=r.stop_reason, usage=r.usage,
                      logprobs=r.logprobs, model_version=r.model_version)


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


@pytest.fixture
async def recorded(conn: Connection) -> dict[str, ModelResponse]:
    """Responses of run-A attempt 0: steps 0-2, step 1 answered twice (a fallback), a judge at step 2."""
    subject = trace_subject("run-A", 1, "twx:coin:dev:3", 0)
    events = {
        "s0": response(0, "first step"),
        "s1-try0": response(1, "the primary's answer"),
        "s1-try1": response(1, "the fallback's answer", try_index=1),
        "s2": response(2, "third step"),
        "judge2": response(2, "PASS", role="judge"),
    }
    for name, event in events.items():
        await conn.log.append(subject, ModelRequest(role=event.role, model=event.model, step=event.step,
                                                    try_index=event.try_index))
        await conn.log.append(subject, event)
        assert name
    # Another attempt and another run, which a replay of run-A attempt 0 must not see.
    await conn.log.append(trace_subject("run-A", 1, "twx:coin:dev:3", 1), response(0, "attempt 1"))
    await conn.log.append(trace_subject("run-Z", 1, "twx:coin:dev:3", 0), response(3, "run Z"))
    return events


async def test_replay_returns_the_recorded_responses(conn: Connection, recorded: dict[str, ModelResponse]) -> None:
    provider = make_provider("replay:", log=conn.log)
    assert isinstance(provider, ReplayProvider)
    assert await provider.complete((), (), {}, ctx(0)) == as_completion(recorded["s0"])
    assert await provider.complete((), (), {}, ctx(1)) == as_completion(recorded["s1-try1"])  # the last, successful
    assert await provider.complete((), (), {}, ctx(2)) == as_completion(recorded["s2"])
    assert await provider.complete((), (), {}, ctx(2, role="judge")) == as_completion(recorded["judge2"])
    assert provider.reads == 1
    assert (await provider.complete((), (), {}, ctx(0, attempt=1))).content == "attempt 1"
    assert provider.reads == 2


async def test_replay_reads_an_attempt_once_under_concurrency(conn: Connection,
                                                              recorded: dict[str, ModelResponse]) -> None:
    provider = ReplayProvider("", log=conn.log)
    got = await asyncio.gather(*(provider.complete((), (), {}, ctx(step % 3)) for step in range(9)))
    assert [c.content for c in got[:3]] == ["first step", "the fallback's answer", "third step"]
    assert provider.reads == 1


async def test_replay_from_another_run(conn: Connection, recorded: dict[str, ModelResponse]) -> None:
    provider = make_provider("replay:", log=conn.log, options={"source_run": "run-A", "source_round": 1})
    got = await provider.complete((), (), {}, CallContext(run_id="run-B", round=4, task_id="twx:coin:dev:3",
                                                          attempt=0, step=2))
    assert got == as_completion(recorded["s2"])


async def test_replay_missing_response_names_its_coordinates(conn: Connection,
                                                             recorded: dict[str, ModelResponse]) -> None:
    provider = make_provider("replay:", log=conn.log)
    with pytest.raises(ProviderError) as info:
        await provider.complete((), (), {}, ctx(7))
    message = str(info.value)
    assert info.value.kind == "other"
    for part in ("no recorded response", "run 'run-A'", "round 1", "task 'twx:coin:dev:3'", "attempt 0",
                 "step 7", "role 'main'"):
        assert part in message
    with pytest.raises(ProviderError, match=r"run 'run-Q'.*attempt 5 step 0"):
        await provider.complete((), (), {}, ctx(0, run="run-Q", attempt=5))


def test_replay_needs_the_log() -> None:
    with pytest.raises(ProviderError, match="replay: needs the event log"):
        make_provider("replay:")


# --- random: -------------------------------------------------------------------------------

TWO_VALUES = ToolSchema(name="pick", input_schema={"type": "object", "properties": {
    "side": {"enum": ["left", "right"]}}})
FOUR = ToolSchema(name="act", input_schema={"type": "object", "properties": {
    "verb": {"type": "string", "enum": ["open", "take", "go", "look"]}}})


def rctx(step: int = 0, *, seed: int = 0, run: str = "run-1", task: str = "t1") -> CallContext:
    return CallContext(run_id=run, round=1, task_id=task, attempt=0, step=step, seed=seed)


async def test_random_is_deterministic_and_independent_of_the_run() -> None:
    provider = make_provider("random:")
    a = await provider.complete((), (ACT,), {}, rctx(3, seed=5))
    b = await RandomProvider("").complete((), (ACT,), {}, rctx(3, seed=5, run="another-run"))
    assert a == b
    assert a.tool_calls[0].id == "call_3_0"
    assert a.stop_reason == "tool_use"


async def test_random_differs_across_steps_and_seeds() -> None:
    provider = RandomProvider("")
    by_step = {json.dumps((await provider.complete((), (ACT,), {}, rctx(s))).tool_calls[0].input) for s in range(40)}
    by_seed = {json.dumps((await provider.complete((), (ACT,), {}, rctx(0, seed=s))).tool_calls[0].input)
               for s in range(40)}
    assert len(by_step) > 4 and len(by_seed) > 4


async def test_random_is_uniform_and_chooses_only_enumerated_values() -> None:
    provider = RandomProvider("")
    counts: Counter[str] = Counter()
    for step in range(3000):
        completion = await provider.complete((), (FOUR,), {}, rctx(step))
        (call,) = completion.tool_calls
        assert call.name == "act"
        counts[call.input["verb"]] += 1
    assert set(counts) == {"open", "take", "go", "look"}
    for value, n in counts.items():
        assert 0.20 * 3000 < n < 0.30 * 3000, (value, n)


async def test_random_inputs_cover_every_enum_property_and_nothing_else() -> None:
    completion = await RandomProvider("").complete((), (ACT,), {}, rctx())
    (call,) = completion.tool_calls
    assert set(call.input) == {"verb", "object"}  # "note" enumerates nothing
    assert call.input["verb"] in ACT.input_schema["properties"]["verb"]["enum"]
    assert call.input["object"] in ACT.input_schema["properties"]["object"]["enum"]


async def test_random_logprobs_are_minus_log_of_the_choices() -> None:
    completion = await RandomProvider("").complete((), (ACT,), {}, rctx())
    (call,) = completion.tool_calls
    assert [lp.token for lp in completion.logprobs] == [call.input["verb"], call.input["object"]]
    assert [lp.logprob for lp in completion.logprobs] == pytest.approx([-math.log(4), -math.log(3)])
    # Two playable tools: choosing the tool is a choice too.
    two = await RandomProvider("").complete((), (ACT, TWO_VALUES), {}, rctx(1))
    assert two.logprobs[0].token == two.tool_calls[0].name
    assert two.logprobs[0].logprob == pytest.approx(-math.log(2))
    total = sum(lp.logprob for lp in two.logprobs)
    expected = -math.log(2) + (-math.log(4) - math.log(3) if two.tool_calls[0].name == "act" else -math.log(2))
    assert total == pytest.approx(expected)


async def test_random_chooses_among_tools_and_honours_a_named_tool() -> None:
    names = {(await RandomProvider("").complete((), (ACT, LOOK, TWO_VALUES), {}, rctx(s))).tool_calls[0].name
             for s in range(60)}
    assert names == {"act", "pick"}  # look enumerates nothing
    only = make_provider("random:pick")
    for s in range(30):
        completion = await only.complete((), (ACT, LOOK, TWO_VALUES), {}, rctx(s))
        assert completion.tool_calls[0].name == "pick"
        assert completion.logprobs == (TokenLogprob(token=completion.tool_calls[0].input["side"],
                                                    logprob=-math.log(2)),)


async def test_random_stops_without_enumerable_tools() -> None:
    for tools in ((), (LOOK,), (ToolSchema(name="say", input_schema={"properties": {"text": {"type": "string"}}}),)):
        completion = await RandomProvider("").complete((), tools, {}, rctx())
        assert (completion.content, completion.tool_calls, completion.logprobs) == ("", (), ())
    named_elsewhere = await make_provider("random:missing").complete((), (ACT,), {}, rctx())
    assert named_elsewhere.tool_calls == ()


async def test_random_caches_by_schema_content_not_identity() -> None:
    provider = RandomProvider("")
    first = await provider.complete((), (FOUR,), {}, rctx(5))
    same = (ToolSchema(name="act", input_schema=msgspec.json.decode(msgspec.json.encode(FOUR.input_schema))),)
    assert await provider.complete((), same, {}, rctx(5)) == first
    changed = (ToolSchema(name="act", input_schema={"properties": {"verb": {"enum": ["jump"]}}}),)
    assert (await provider.complete((), changed, {}, rctx(5))).tool_calls[0].input == {"verb": "jump"}


def test_unknown_scheme_lists_the_registered_ones() -> None:
    with pytest.raises(ProviderError, match="anthropic, fork, openai, policy, random, replay"):
        make_provider("nope:model")
