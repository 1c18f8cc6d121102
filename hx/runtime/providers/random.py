"""``random:``: the weakest agent and the benchmark baseline, choosing uniformly among enumerated inputs.

Of the tools offered, those whose ``input_schema`` has properties with an ``enum`` are
playable; ``random:TOOL`` restricts play to one tool. Each call picks a playable tool and
a value for each enumerated property, uniformly, seeded from (seed, task, attempt, step,
role) and never from the run id, so a task and seed replay the same episode in any run.
The log-probability of every choice is returned, so a learner has behaviour log-probs.
With nothing playable the model stops: no content, no tool calls.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from typing import Any

import msgspec

from hx.runtime.providers.base import CallContext, Completion, Provider
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema

Choices = tuple[tuple[str, tuple[Any, ...]], ...]
"""A tool's enumerated properties: (name, the values it allows), in schema order."""
Playable = tuple[tuple[str, Choices], ...]
"""The tools a call may choose from, each with its enumerated properties."""

_MAX_CACHED_TOOLSETS = 256


def playable(tools: tuple[ToolSchema, ...], only: str = "") -> Playable:
    """The tools with at least one enumerated property (only the one named ``only`` when given)."""
    out: list[tuple[str, Choices]] = []
    for tool in tools:
        if only and tool.name != only:
            continue
        properties = tool.input_schema.get("properties")
        if not isinstance(properties, dict):
            continue
        choices = tuple((name, tuple(prop["enum"])) for name, prop in properties.items()
                        if isinstance(prop, dict) and isinstance(prop.get("enum"), list) and prop["enum"])
        if choices:
            out.append((tool.name, choices))
    return tuple(out)


def seed_for(ctx: CallContext) -> int:
    """A stable integer seed from (seed, task, attempt, step, role); the run id plays no part."""
    text = f"{ctx.seed}\x1f{ctx.task_id}\x1f{ctx.attempt}\x1f{ctx.step}\x1f{ctx.role}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _token(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class RandomProvider(Provider):
    """Calls one playable tool with uniformly chosen enumerated inputs."""

    scheme = "random"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._last: tuple[tuple[ToolSchema, ...], Playable] | None = None
        self._by_digest: dict[bytes, Playable] = {}

    def _playable(self, tools: tuple[ToolSchema, ...]) -> Playable:
        # The run loop offers the same tools tuple call after call: an identity check is the fast
        # path (holding the tuple keeps its id from being reused); else a digest of the schemas.
        last = self._last
        if last is not None and last[0] is tools:
            return last[1]
        digest = hashlib.sha256(msgspec.json.encode(tools)).digest()
        found = self._by_digest.get(digest)
        if found is None:
            if len(self._by_digest) >= _MAX_CACHED_TOOLSETS:
                self._by_digest.clear()
            found = self._by_digest[digest] = playable(tools, self.model)
        self._last = (tools, found)
        return found

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """One uniformly random call of a playable tool, or a stop when there is none."""
        options = self._playable(tools)
        if not options:
            return Completion(stop_reason="end_turn", model_version=self.spec)
        rng = random.Random(seed_for(ctx))
        logprobs: list[TokenLogprob] = []
        name, choices = options[rng.randrange(len(options))] if len(options) > 1 else options[0]
        if len(options) > 1:
            logprobs.append(TokenLogprob(token=name, logprob=-math.log(len(options))))
        arguments: dict[str, Any] = {}
        for prop, values in choices:
            value = values[rng.randrange(len(values))]
            arguments[prop] = value
            logprobs.append(TokenLogprob(token=_token(value), logprob=-math.log(len(values))))
        call = ToolCall(id=f"call_{ctx.step}_0", name=name, input=arguments)
        return Completion(tool_calls=(call,), stop_reason="tool_use", logprobs=tuple(logprobs),
                          model_version=self.spec)
