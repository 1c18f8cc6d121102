"""D1 ``step_model_router``: choose the model role by step number.

Failure addressed: one model for the whole episode is either too weak for the long
tail of a hard task (the agent stalls after many steps) or too expensive for the easy
opening moves. A step schedule lets a harness open with a cheap model and escalate to
a stronger one once the attempt runs long (or the reverse).

Attach at before_model. It also accepts after_model (passing it through) so that it
can replace ``cost_model_router`` in their shared singleton group ``model_router``,
which occupies both hooks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.processor import NORMAL, Processor
from hx.processors.model_router import DEFAULT_ROLE, with_route
from schemas.hooks import AfterModel, BeforeModel


class StepModelRouter(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Route each model call to the role the schedule names for its step.

    >>> StepModelRouter(schedule=((1, "cheap"), (5, "main"))).role_at(7)
    'main'
    """

    name: ClassVar[str] = "step_model_router"
    _singleton_group: ClassVar[str] = "model_router"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D1"

    schedule: tuple[tuple[int, str], ...] = ((1, DEFAULT_ROLE),)
    """``(first_step, role)`` pairs: from ``first_step`` on, calls go to ``role`` (until the next pair)."""

    def __post_init__(self) -> None:
        steps = [s for s, _ in self.schedule]
        if steps != sorted(steps) or len(set(steps)) != len(steps):
            raise ValueError(f"schedule steps must be strictly increasing, got {steps}")
        if any(not role for _, role in self.schedule):
            raise ValueError("schedule roles must be non-empty")

    def role_at(self, step: int) -> str:
        """The role serving ``step`` (``main`` before the first scheduled step)."""
        role = DEFAULT_ROLE
        for first, name in self.schedule:
            if step >= first:
                role = name
        return role

    async def process(self, event: BeforeModel | AfterModel) -> AsyncIterator[BeforeModel | AfterModel]:
        """Set the route to the scheduled role at before_model; pass after_model through."""
        yield with_route(event, self.role_at(event.step)) if isinstance(event, BeforeModel) else event
