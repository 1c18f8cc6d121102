"""What a processor may use of the attempt it runs in: calls to other model roles, logged like the main model's.

Processors see hook events only. A processor that must consult another model (a judge,
an evaluator) calls it through ``current_services()``, which the run loop sets for the
length of an attempt: the call goes through the attempt's router, so the role's model,
fallback chain, retries and sampling parameters come from the ``ModelConfig``, and its
``ModelRequest`` / ``ModelResponse`` events land on the attempt's log in order (a
replay can feed them back). The slots are there too, for processors that need them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from hx.harness.config import Slots
from hx.runtime.providers.base import CallContext, Completion
from hx.runtime.router import ModelRouter
from schemas.event import Event
from schemas.lifecycle import AttemptStarted
from schemas.messages import Message, ToolSchema


class AttemptServices:
    """Model calls for any configured role, and the slots, of the running attempt."""

    def __init__(self, router: ModelRouter, context: Callable[[], CallContext], emit: Callable[[Event], None],
                 slots: Slots, started: AttemptStarted | None = None) -> None:
        self._router = router
        self._context = context
        self._emit = emit
        self.slots = slots
        self.started = started
        """The attempt's ``attempt.started``: run, round, task, attempt, harness digest, main model (as shown)."""

    def request(self, role: str = "main") -> tuple[str, dict[str, Any]]:
        """The model spec (as shown) a role's first call goes to, and the role's sampling parameters."""
        return self._router.public(self._router.models.chain(role)[0]), dict(self._router.models.params_for(role))

    async def complete(self, role: str, messages: tuple[Message, ...],
                       tools: tuple[ToolSchema, ...] = ()) -> Completion:
        """Call the model of ``role`` (``judge``, ``evaluator`` ...) at the current step; raises ``ProviderError``."""
        ctx = msgspec.structs.replace(self._context(), role=role)
        _, completion = await self._router.complete(role, messages, tools, ctx, self._emit)
        return completion


_CURRENT: contextvars.ContextVar[AttemptServices | None] = contextvars.ContextVar("hx_attempt_services",
                                                                                   default=None)


def current_services() -> AttemptServices | None:
    """The services of the attempt running in this context (None outside a run)."""
    return _CURRENT.get()


@contextlib.contextmanager
def attempt_services(services: AttemptServices) -> Iterator[AttemptServices]:
    """Make ``services`` current for the code inside the block."""
    token = _CURRENT.set(services)
    try:
        yield services
    finally:
        _CURRENT.reset(token)
