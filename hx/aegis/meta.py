"""Meta-agent calls: every model call an AEGIS stage makes goes through the router and onto the log.

An LLM digester, evolver or critic calls its model through ``MetaAgent.complete``: the
role's model, fallback chain and retries come from a ``ModelConfig`` like any agent's,
and each call's ``model.request`` / ``model.response`` (or ``model.error``) events land on
the trace under ``hx.trace.<run>.<evolution round>.aegis:<stage>.<n>``, so an audit or a
replay sees exactly what the stage asked and was told.
"""

from __future__ import annotations

from hx.aegis.errors import PipelineError
from hx.runtime.models import ModelConfig
from hx.runtime.providers.base import CallContext, Completion
from hx.runtime.router import ModelRouter
from hx.runtime.tracer import AttemptTracer, LogWriter
from schemas.messages import Message, ToolSchema
from streams.log import EventLog
from streams.topology import trace_subject

META_ROLE = "main"
META_STAGES = ("digester", "planner", "evolver", "revise", "critic")
"""The stages that may call the meta-model: a round's token figures read these subjects (``hx.aegis.tokens``)."""


class MetaAgent:
    """The model behind the LLM stages of one run, every call on the log."""

    def __init__(self, models: ModelConfig, log: EventLog, run_id: str) -> None:
        self.models = models
        self.log = log
        self.run_id = run_id
        self._router = ModelRouter(models, log=log)
        self._calls: dict[tuple[int, str], int] = {}

    async def complete(self, stage: str, round: int, messages: tuple[Message, ...],
                       tools: tuple[ToolSchema, ...] = (), params: dict[str, object] | None = None) -> Completion:
        """One call for ``stage`` in evolution round ``round``; raises ``ProviderError`` when the chain fails."""
        if stage not in META_STAGES:
            raise PipelineError(f"meta-model stage {stage!r} is not one of {', '.join(META_STAGES)}")
        n = self._calls.get((round, stage), 0)
        self._calls[(round, stage)] = n + 1
        subject = trace_subject(self.run_id, round, f"aegis:{stage}", n)
        tracer = AttemptTracer(LogWriter(self.log), subject)
        ctx = CallContext(run_id=self.run_id, round=round, task_id=f"aegis:{stage}", attempt=n, step=1)
        try:
            _, completion = await self._router.complete(META_ROLE, messages, tools, ctx, tracer.emit, params)
        finally:
            await tracer.drain()
        return completion

    async def aclose(self) -> None:
        """Close the providers."""
        await self._router.aclose()
