"""``replay:``: answers with the model responses already on the log, for replays and audits.

A call at (run, round, task, attempt, step, role) gets the response recorded at the same
coordinates: the last one for that step and role, which is the successful one when a
retry or fallback happened. All responses of an attempt are read once, on first use,
from its trace subject. ``options["source_run"]`` and ``options["source_round"]`` replay
another run's (or round's) responses.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from hx.runtime.errors import ProviderError
from hx.runtime.providers.base import CallContext, Completion, Provider
from schemas.messages import Message, ToolSchema
from schemas.model import ModelResponse
from streams.log import EventLog
from streams.topology import trace_subject

AttemptKey = tuple[str, int, str, int]
"""(run, round, task, attempt) of the recorded attempt."""
Responses = dict[tuple[int, str], ModelResponse]
"""The response replayed for each (step, role) of an attempt."""

DEFAULT_CACHED_ATTEMPTS = 1024


class ReplayProvider(Provider):
    """Plays back the recorded ``model.response`` events of the same coordinates."""

    scheme = "replay"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if self.log is None:
            raise ProviderError("other", "replay: needs the event log to read recorded responses from; "
                                         "build it with make_provider('replay:', log=...)")
        self._events: EventLog = self.log
        self.source_run: str | None = self.options.get("source_run")
        """The run whose responses are replayed (None: the calling run)."""
        source_round = self.options.get("source_round")
        self.source_round: int | None = None if source_round is None else int(source_round)
        """The round whose responses are replayed (None: the calling round)."""
        self._max_cached = int(self.options.get("cached_attempts", DEFAULT_CACHED_ATTEMPTS))
        self._cache: OrderedDict[AttemptKey, Responses] = OrderedDict()
        self._loading: dict[AttemptKey, asyncio.Lock] = {}
        self.reads = 0
        """How many times the log was read (one per attempt while it stays cached)."""

    def source(self, ctx: CallContext) -> AttemptKey:
        """The recorded attempt a call replays."""
        run = ctx.run_id if self.source_run is None else self.source_run
        rnd = ctx.round if self.source_round is None else self.source_round
        return (run, rnd, ctx.task_id, ctx.attempt)

    async def responses(self, key: AttemptKey) -> Responses:
        """The responses of one recorded attempt, read from the log on first use."""
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        lock = self._loading.setdefault(key, asyncio.Lock())
        async with lock:  # concurrent first calls for one attempt share one read
            try:
                cached = self._cache.get(key)
                if cached is None:
                    cached = await self._read(key)
                    self._cache[key] = cached
                    while len(self._cache) > self._max_cached:
                        self._cache.popitem(last=False)
            finally:
                self._loading.pop(key, None)
        return cached

    async def _read(self, key: AttemptKey) -> Responses:
        self.reads += 1
        subject = trace_subject(*key)
        found: Responses = {}
        async for record in self._events.read(subjects=[subject], types=[ModelResponse.TYPE]):
            event = record.event
            if isinstance(event, ModelResponse):
                found[(event.step, event.role)] = event  # log order: a later try replaces an earlier one
        return found

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """The recorded response at the call's coordinates, or ``ProviderError`` naming them."""
        key = self.source(ctx)
        recorded = (await self.responses(key)).get((ctx.step, ctx.role))
        if recorded is None:
            run, rnd, task, attempt = key
            raise ProviderError("other", f"no recorded response for run {run!r} round {rnd} task {task!r} "
                                         f"attempt {attempt} step {ctx.step} role {ctx.role!r} "
                                         f"(subject {trace_subject(*key)})")
        return Completion(content=recorded.content, tool_calls=recorded.tool_calls,
                          stop_reason=recorded.stop_reason, usage=recorded.usage, logprobs=recorded.logprobs,
                          model_version=recorded.model_version)
