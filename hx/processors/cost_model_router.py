"""D1 ``cost_model_router``: switch model role once the attempt's spend passes a budget.

Failure addressed: long or looping attempts burn through tokens and money on the
expensive model; once a budget of tokens or dollars is spent, later calls go to a
cheaper role (``ModelConfig.roles``) so the attempt can finish within cost.

Spend is tracked per attempt. At before_model the prompt is estimated from its
characters (``chars_per_token``); at after_model the answer is added, priced by the
model spec that served it (``usd_per_mtok``). When ``AfterModel`` carries the
provider's ``usage`` (a proposed extension), real token counts and cost replace the
estimate. Attach to ``["before_model", "after_model"]``; attached at before_model alone it
counts estimated prompt tokens only (no answers, no dollars).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import msgspec

from hx.harness.processor import NORMAL, Processor
from hx.processors.model_router import DEFAULT_ROLE, with_route
from schemas.hooks import AfterModel, BeforeModel
from schemas.messages import Message, ToolCall, ToolSchema

_encode = msgspec.json.Encoder().encode


class _Spend:
    """What one attempt has spent so far (estimated or reported)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.usd = 0.0
        self.pending_prompt = 0
        """Estimated prompt tokens of the call in flight, replaced by reported usage if any."""


class CostModelRouter(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Route calls to ``role`` once ``budget_tokens`` or ``budget_usd`` (whichever is set) is spent."""

    name: ClassVar[str] = "cost_model_router"
    _singleton_group: ClassVar[str] = "model_router"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D1"

    role: str = "cheap"
    """The role to call once the budget is spent."""
    initial_role: str = DEFAULT_ROLE
    """The role to call before that."""
    budget_tokens: int = 0
    """Token budget of the attempt (prompt plus answer, summed over calls); 0 disables it."""
    budget_usd: float = 0.0
    """Dollar budget of the attempt; 0 disables it."""
    usd_per_mtok: dict[str, float] = {}
    """Price per million tokens by model spec (``anthropic:claude-sonnet-4-6``), for the dollar budget."""
    default_usd_per_mtok: float = 0.0
    """Price of a model spec missing from ``usd_per_mtok``."""
    chars_per_token: float = 4.0
    """Characters per token when estimating."""

    def __post_init__(self) -> None:
        if self.budget_tokens < 0 or self.budget_usd < 0:
            raise ValueError("budgets must be >= 0")
        if self.chars_per_token <= 0:
            raise ValueError("chars_per_token must be > 0")
        if not self.role or not self.initial_role:
            raise ValueError("roles must be non-empty")
        self._spend = _Spend()

    @property
    def spent_tokens(self) -> int:
        """Tokens this attempt has spent so far."""
        return self._spend.tokens

    @property
    def spent_usd(self) -> float:
        """Dollars this attempt has spent so far."""
        return self._spend.usd

    def over_budget(self) -> bool:
        """True once a configured budget is reached."""
        s = self._spend
        return ((self.budget_tokens > 0 and s.tokens >= self.budget_tokens)
                or (self.budget_usd > 0 and s.usd >= self.budget_usd))

    def _estimate(self, chars: int) -> int:
        return int(chars / self.chars_per_token + 0.5)

    def _prompt_tokens(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...]) -> int:
        chars = sum(len(m.content) + sum(len(_encode(c.input)) + len(c.name) for c in m.tool_calls)
                    for m in messages)
        chars += sum(len(_encode(t)) for t in tools)
        return self._estimate(chars)

    def _answer_tokens(self, content: str, calls: tuple[ToolCall, ...]) -> int:
        return self._estimate(len(content) + sum(len(_encode(c.input)) + len(c.name) for c in calls))

    async def process(self, event: BeforeModel | AfterModel) -> AsyncIterator[BeforeModel | AfterModel]:
        """Route at before_model; account the answer at after_model (which passes through)."""
        s = self._spend
        if isinstance(event, BeforeModel):
            routed = with_route(event, self.role if self.over_budget() else self.initial_role)
            s.pending_prompt = self._prompt_tokens(event.messages, event.tools)
            s.tokens += s.pending_prompt
            yield routed
            return
        usage = event.usage
        price = self.usd_per_mtok.get(event.model, self.default_usd_per_mtok)
        if usage.input_tokens or usage.output_tokens:
            s.tokens += usage.input_tokens + usage.output_tokens - s.pending_prompt
            s.usd += usage.cost_usd or (usage.input_tokens + usage.output_tokens) * price / 1e6
        else:
            answer = self._answer_tokens(event.content, event.tool_calls)
            s.tokens += answer
            s.usd += (s.pending_prompt + answer) * price / 1e6
        s.pending_prompt = 0
        yield event
