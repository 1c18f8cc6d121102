"""``script:``: plays a fixed list of completions in order, one per main-model call.

For tests, tutorials and reproductions of a known trajectory: the completions come
from the model spec's options (``ModelConfig.provider_options``), each a mapping with
``content`` and ``tool_calls``. When the script runs out, the model stops (an empty
answer with no tool calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from hx.runtime.errors import ModelSpecError
from hx.runtime.providers.base import CallContext, Completion, Provider
from schemas.messages import Message, ToolSchema


def _completions(model: str, options: Mapping[str, Any]) -> list[Completion]:
    try:
        return msgspec.convert(options.get("completions", []), list[Completion])
    except msgspec.ValidationError as exc:
        raise ModelSpecError(f"script:{model}: bad completions: {exc}") from None


class ScriptProvider(Provider):
    """Answers the n-th call of an attempt with the n-th scripted completion."""

    scheme = "script"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.script = _completions(model, self.options)
        self._calls: dict[tuple[str, int, str, int], int] = {}

    @classmethod
    def check(cls, model: str, options: Mapping[str, Any]) -> None:
        """The scripted completions must be well formed."""
        _completions(model, options)

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """The next scripted completion of this attempt."""
        key = (ctx.run_id, ctx.round, ctx.task_id, ctx.attempt)
        n = self._calls.get(key, 0)
        self._calls[key] = n + 1
        if n < len(self.script):
            return msgspec.structs.replace(self.script[n], model_version=self.script[n].model_version or self.spec)
        return Completion(stop_reason="end_turn", model_version=self.spec)
