"""One hook's processor chain: run each processor, check its contract, record what it did.

The chain is a plain loop (as in structlog): each processor consumes every event the
previous one yielded. A processor's outcome is read off what it yielded: the same
event (pass-through), a changed one (transform), several (split), none (intercept);
an ``Interrupt`` it raises ends the attempt. Each processor gets the event itself, not a
copy: hook payloads are immutable all the way down (frozen Structs, tuples, and the
``schemas.frozen`` dicts and lists), so a step costs the same at step 200 as at step 5, and
a processor that tries to change its input in place fails loudly, as a ``ContractViolation``
naming what it tried, before anything it yielded goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from hx.harness.contracts import check_contract, refused_edit
from hx.harness.errors import ContractViolation, Interrupt
from hx.harness.processor import Processor
from hx.runtime.errors import ProcessorFailed
from schemas.event import Event
from schemas.hooks import HookName, HookPayload, HookRecord, ProcessorTriggered

Action = Literal["changed", "split", "intercepted", "interrupted"]


class HookPipeline:
    """The processors of one hook, in execution order."""

    def __init__(self, hook: HookName, processors: Sequence[Processor], emit: Callable[[Event], None],
                 observe: Callable[[Processor, list[HookPayload]], None] | None = None) -> None:
        self.hook = hook
        self.processors = tuple(processors)
        self.emit = emit
        self.observe = observe
        """Called with each processor and what it yielded, in chain order (a reader that asks which one did what)."""

    def _trigger(self, proc: Processor, step: int, action: Action, fields: Sequence[str] = (),
                 outputs: int = 1, reason: str = "") -> None:
        self.emit(ProcessorTriggered(processor=type(proc).type_name(), group=type(proc).group(), hook=self.hook,
                                     step=step, action=action, fields=tuple(dict.fromkeys(fields)),
                                     outputs=outputs, reason=reason))

    async def run(self, event: HookPayload, step: int) -> list[Any]:
        """Pass ``event`` through the chain; log it as emitted and each result as returned."""
        self.emit(HookRecord(stage="emitted", step=step, event=event))  # type: ignore[arg-type]
        events: list[HookPayload] = [event]
        for proc in self.processors:
            out: list[HookPayload] = []
            for ev in events:
                out.extend(await self._call(proc, ev, step))
            events = out
            if self.observe is not None:
                self.observe(proc, events)
            if not events:
                break
        for i, ev in enumerate(events):
            self.emit(HookRecord(stage="returned", step=step, index=i, event=ev))  # type: ignore[arg-type]
        return events

    async def _call(self, proc: Processor, event: HookPayload, step: int) -> list[HookPayload]:
        name = type(proc).type_name()
        produced: list[HookPayload] = []
        try:
            async for item in proc.process(event):
                produced.append(item)
        except Interrupt as exc:
            self._trigger(proc, step, "interrupted", outputs=len(produced), reason=exc.reason)
            raise
        except ContractViolation as exc:
            self._trigger(proc, step, "interrupted", outputs=len(produced), reason=str(exc))
            raise
        except Exception as exc:
            tried = refused_edit(name, self.hook, event, exc)
            if tried is not None:
                self._trigger(proc, step, "interrupted", outputs=len(produced), reason=str(tried))
                raise tried from exc
            reason = f"processor {name!r} raised {type(exc).__name__}: {exc}"
            self._trigger(proc, step, "interrupted", outputs=len(produced), reason=reason)
            raise ProcessorFailed(reason) from exc
        fields: list[str] = []
        try:
            for i, item in enumerate(produced):
                # An equal event passed through: carry the original on, so later hooks and the tracer's
                # conversation deltas meet the same message objects (an identity test, not ==).
                changed = [] if item is event else check_contract(name, self.hook, event, item)
                if not changed:
                    produced[i] = event
                fields += changed
        except ContractViolation as exc:
            self._trigger(proc, step, "interrupted", outputs=len(produced), reason=str(exc))
            raise
        if not produced:
            self._trigger(proc, step, "intercepted", outputs=0)
        elif len(produced) > 1:
            self._trigger(proc, step, "split", fields, outputs=len(produced))
        elif fields:
            self._trigger(proc, step, "changed", fields)
        return produced
