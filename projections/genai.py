"""OpenTelemetry GenAI semantic-convention names: one place for span names and ``gen_ai.*`` attributes.

Two writers build GenAI spans: the ``otel_spans`` processor live from hook events, and the
``otel`` projection from the log. Both take their span names and attribute keys from here,
so a trace looks the same whichever way it was made. Only names and numbers go into
attributes: never message contents, tool inputs or outputs, nor a model URL (it may carry
credentials; ``split_spec`` drops it).

>>> split_spec("openai:qwen3@http://user:pw@10.0.0.5:8000/v1")
('openai', 'qwen3')
>>> chat_span_name("claude-sonnet-4-6"), tool_span_name("act")
('chat claude-sonnet-4-6', 'execute_tool act')
"""

from __future__ import annotations

Attributes = dict[str, str | int | float | bool | tuple[str, ...]]
"""Span attributes as these helpers build them (OpenTelemetry attribute values)."""

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
AGENT_NAME = "gen_ai.agent.name"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
_REQUEST_PARAMS = {"temperature": "gen_ai.request.temperature", "max_tokens": "gen_ai.request.max_tokens",
                   "top_p": "gen_ai.request.top_p", "seed": "gen_ai.request.seed"}
"""Sampling parameters of a model request that have a GenAI attribute (numbers only)."""


def split_spec(spec: str) -> tuple[str, str]:
    """(provider, model) of a model spec: ``openai:qwen3@http://...`` -> (``openai``, ``qwen3``)."""
    scheme, sep, rest = spec.partition(":")
    if not sep:
        return "", spec.split("@", 1)[0]
    return scheme, rest.split("@", 1)[0] or scheme


def response_model(model_version: str, spec: str) -> str:
    """The model that answered, by name: the provider's own id, else the model the request named.

    A provider that reports its own spec (``random:``, ``script:demo``) gives the name in it,
    never a dangling spec.

    >>> response_model("", "openai:qwen3@http://10.0.0.5/v1"), response_model("random:", "random:")
    ('qwen3', 'random')
    """
    provider, requested = split_spec(spec)
    if not model_version:
        return requested
    if provider and model_version.startswith(provider + ":"):
        return split_spec(model_version)[1]
    return model_version


def agent_span_name(agent: str) -> str:
    """The root span of an attempt: ``invoke_agent {agent}``."""
    return f"invoke_agent {agent}"


def chat_span_name(model: str) -> str:
    """A model call: ``chat {model}`` (plain ``chat`` while the model is unknown)."""
    return f"chat {model}" if model else "chat"


def tool_span_name(tool: str) -> str:
    """A tool call: ``execute_tool {tool}``."""
    return f"execute_tool {tool}"


def agent_attributes(agent: str, task_id: str, benchmark: str = "") -> Attributes:
    """Attributes of an ``invoke_agent`` span at its start."""
    attributes: Attributes = {OPERATION: "invoke_agent", AGENT_NAME: agent, "hx.task.id": task_id}
    if benchmark:
        attributes["hx.task.benchmark"] = benchmark
    return attributes


def verdict_attributes(passed: bool, score: float, steps: int, status: str) -> Attributes:
    """hx's verdict on an attempt, set on its ``invoke_agent`` span at the end."""
    return {"hx.passed": passed, "hx.score": score, "hx.steps": steps, "hx.status": status}


def chat_attributes(step: int, spec: str = "") -> Attributes:
    """Attributes of a ``chat`` span at its start; ``spec`` is the requested model spec when known."""
    attributes: Attributes = {OPERATION: "chat", "hx.step": step}
    if spec:
        provider, model = split_spec(spec)
        attributes[REQUEST_MODEL] = model
        if provider:
            attributes[PROVIDER] = provider
    return attributes


def request_parameter_attributes(params: dict[str, object]) -> Attributes:
    """The GenAI attributes of a request's numeric sampling parameters (anything else is left out)."""
    return {key: value for name, key in _REQUEST_PARAMS.items()
            if isinstance(value := params.get(name), int | float) and not isinstance(value, bool)}


def response_attributes(model: str, stop_reason: str, tool_calls: int, input_tokens: int,
                        output_tokens: int) -> Attributes:
    """Attributes of a ``chat`` span at the response: model (a name, not a spec), finish reason, tool calls, usage."""
    attributes: Attributes = {RESPONSE_MODEL: model, "hx.tool_calls": tool_calls,
                              INPUT_TOKENS: input_tokens, OUTPUT_TOKENS: output_tokens}
    if stop_reason:
        attributes[FINISH_REASONS] = (stop_reason,)
    return attributes


def tool_attributes(name: str, call_id: str, step: int) -> Attributes:
    """Attributes of an ``execute_tool`` span."""
    return {OPERATION: "execute_tool", TOOL_NAME: name, TOOL_CALL_ID: call_id, TOOL_TYPE: "function",
            "hx.step": step}


def attempt_attributes(run: str, round: int, task: str, attempt: int) -> Attributes:
    """Where an attempt lies in hx: run, round, task and attempt number."""
    return {"hx.run.id": run, "hx.round": round, "hx.task.id": task, "hx.attempt": attempt}
