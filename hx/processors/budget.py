"""D7 ``budget``: end an attempt that spends more model calls, tool calls, tokens or money than allowed.

Failure addressed: runaway attempts. An agent that does not converge keeps calling the
model with an ever longer context, so cost grows quadratically while success does not;
the run loop's ``max_steps`` bounds steps only. This processor keeps a running account
and raises ``Interrupt`` (status ``interrupted``) before a model call or tool call
that would go over a limit; an answer already received is never thrown away.

Tokens and cost: when the after_model event carries the provider's usage (its
read-only ``usage`` field) the reported counts and cost are used. A call
that reports no usage (a provider that does not count) is estimated from the
characters sent and received (``chars_per_token``), counting its whole prompt, as
providers bill it. The token limit is checked against the prompt about to be sent, so
the call that would cross it is not made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import msgspec

from hx.harness.errors import Interrupt
from hx.harness.processor import FINAL, Processor
from schemas.hooks import AfterModel, BeforeModel, BeforeTool

_encode = msgspec.json.Encoder().encode


class Budget(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Interrupt an attempt at its model-call, tool-call, token or cost limit (0 means no limit)."""

    name: ClassVar[str] = "budget"
    _order: ClassVar[int] = FINAL  # count the prompt and the approvals as every other processor, POST too, leaves them
    dimension: ClassVar[str] = "D7"
    limits: ClassVar[tuple[str, ...]] = ("max_model_calls", "max_tool_calls", "max_tokens", "max_cost_usd")

    max_model_calls: int = 0
    max_tool_calls: int = 0
    """Approved tool calls (refused ones cost nothing)."""
    max_tokens: int = 0
    """Prompt plus completion tokens over the attempt (estimated unless usage is visible)."""
    max_cost_usd: float = 0.0
    """Counted from the usage providers report on after_model."""
    chars_per_token: float = 4.0
    """Characters per token for the estimate."""

    def __post_init__(self) -> None:
        if min(self.max_model_calls, self.max_tool_calls, self.max_tokens) < 0 or self.max_cost_usd < 0:
            raise ValueError("budget limits must be >= 0 (0: no limit)")
        if self.chars_per_token <= 0:
            raise ValueError("chars_per_token must be positive")
        self._calls = 0
        self._tools = 0
        self._tokens = 0.0
        self._cost = 0.0
        self._prompt = 0.0

    @property
    def spent(self) -> dict[str, float]:
        """What the attempt has used so far."""
        return {"model_calls": self._calls, "tool_calls": self._tools, "tokens": round(self._tokens),
                "cost_usd": self._cost}

    def _estimate(self, value: Any) -> float:
        return len(_encode(value)) / self.chars_per_token

    def _over(self, what: str, used: float, limit: float) -> Interrupt:
        return Interrupt(f"budget: {what} limit of {limit:g} reached ({used:g} used)")

    async def process(self, event: BeforeModel | AfterModel | BeforeTool) -> AsyncIterator[
            BeforeModel | AfterModel | BeforeTool]:
        """Check a limit before spending; account after."""
        if isinstance(event, BeforeModel):
            if self.max_model_calls and self._calls >= self.max_model_calls:
                raise self._over("model call", self._calls, self.max_model_calls)
            self._prompt = self._estimate(event.messages) + (self._estimate(event.tools) if event.tools else 0.0)
            if self.max_tokens and self._tokens + self._prompt > self.max_tokens:
                raise self._over("token", round(self._tokens + self._prompt), self.max_tokens)
            if self.max_cost_usd and self._cost >= self.max_cost_usd:
                raise self._over("cost (USD)", self._cost, self.max_cost_usd)
        elif isinstance(event, AfterModel):
            self._calls += 1
            usage = event.usage
            if usage.input_tokens or usage.output_tokens:
                self._tokens += usage.input_tokens + usage.output_tokens
                self._cost += usage.cost_usd
            else:
                self._tokens += self._prompt + len(event.content) / self.chars_per_token + (
                    self._estimate(event.tool_calls) if event.tool_calls else 0.0)
        elif event.approved:
            if self.max_tool_calls and self._tools >= self.max_tool_calls:
                raise self._over("tool call", self._tools, self.max_tool_calls)
            self._tools += 1
        yield event
