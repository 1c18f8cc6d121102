"""The run loop: drive one attempt through the eight hooks, with every event on the log.

task_start, then steps (step_start, before_model, the model call, after_model, and
per tool call before_tool, the tool, after_tool, then step_end) until the model stops
calling tools, the episode ends, a processor interrupts, or the step budget runs out;
then the verifier and task_end. Given the config, the task, the seed and the same model
responses and tool results, the loop emits the same event bodies in the same order:
nothing in a body comes from the clock, a random id or dict order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec

from hx.harness.config import HarnessConfig
from hx.harness.errors import ContractViolation, Interrupt
from hx.runtime.errors import AttemptExists, ProviderError
from hx.runtime.pipeline import HookPipeline
from hx.runtime.providers.base import CallContext
from hx.runtime.providers.resources import ProviderResources
from hx.runtime.router import ModelRouter, RoleChains
from hx.runtime.services import AttemptServices, attempt_services
from hx.runtime.task import Task, Tool
from hx.runtime.tracer import AttemptTracer, LogWriter, NullWriter, TraceWriter
from schemas.hooks import (
    AfterModel,
    AfterTool,
    BeforeModel,
    BeforeTool,
    HookName,
    StepEnd,
    StepStart,
    TaskEnd,
    TaskStart,
)
from schemas.lifecycle import SCORED_STATUSES, AttemptFinished, AttemptStarted, AttemptStatus
from schemas.messages import Message, ToolCall, ToolResult, ToolSchema, Usage, refrozen
from schemas.tools import ToolInvoked, ToolReturned, VerifierScore
from streams.connection import connect
from streams.log import EventLog
from streams.topology import check_run_id, trace_subject

BLOCKED = "tool call blocked by the harness"


class AttemptResult(msgspec.Struct, frozen=True, kw_only=True):
    """How one attempt ended."""

    task_id: str
    attempt: int
    passed: bool
    score: float
    steps: int
    status: AttemptStatus
    reason: str = ""
    events: int = 0
    """Events the attempt put on the log."""
    final_answer: str = ""
    usage: Usage = Usage()
    """The tokens of the attempt's model calls (``AttemptFinished.usage``)."""


class RunLoop:
    """Executes attempts of one harness bound to one model configuration."""

    def __init__(self, models: RoleChains, harness: HarnessConfig, *, log: EventLog | None = None,
                 writer: TraceWriter | None = None, resources: ProviderResources | None = None) -> None:
        self.models = models
        self.harness = harness
        self.log = log
        self.writer = writer
        self.resources = resources if resources is not None else ProviderResources()
        """Lent to the providers of every attempt: the attempts of one loop share what they load."""

    @contextlib.asynccontextmanager
    async def _log(self) -> AsyncIterator[EventLog | None]:
        if self.log is not None or self.harness.slots.tracer == "none":
            yield self.log
            return
        async with connect() as conn:  # no log given: the configured (or embedded) NATS
            yield conn.log

    async def run(self, task: Task, *, run_id: str, round: int = 0, attempt: int = 0, seed: int = 0,
                  max_steps: int = 50, timeout_s: float | None = None) -> AttemptResult:
        """Run one attempt; infrastructure failures (a timeout included) are recorded, never dropped.

        Raises ``AttemptExists`` when (run, round, task, attempt) already has events on the
        log: the deterministic message ids would make the server drop the new attempt.
        """
        check_run_id(run_id)  # before any connection: a huge id would surface as a protocol error
        async with self._log() as log:
            subject = trace_subject(run_id, round, task.spec.id, attempt)
            trace_log = log if self.harness.slots.tracer != "none" else None
            if self.writer is None and trace_log is not None and await trace_log.last_subject_seq(subject) > 0:
                raise AttemptExists(f"attempt {attempt} of task {task.spec.id!r} in run {run_id!r} round {round} "
                                    "is already on the log; use another run id or attempt number")
            writer = self.writer or (LogWriter(trace_log) if trace_log is not None else NullWriter())
            router = ModelRouter(self.models, log=log, resources=self.resources)
            tracer = AttemptTracer(writer, subject)
            try:
                state = _Attempt(self.harness, router, tracer, task, run_id, round, attempt, seed, max_steps,
                                 timeout_s)
                with attempt_services(AttemptServices(router, state.call_context, tracer.emit, self.harness.slots,
                                                      state.started)):
                    return await state.run()
            finally:
                await router.aclose()


class _Attempt:
    """The state of one attempt while it runs."""

    def __init__(self, harness: HarnessConfig, router: ModelRouter, tracer: AttemptTracer, task: Task,
                 run_id: str, round: int, attempt: int, seed: int, max_steps: int,
                 timeout_s: float | None = None) -> None:
        self.router = router
        self.tracer = tracer
        self.task = task
        self.ctx = CallContext(run_id=run_id, round=round, task_id=task.spec.id, attempt=attempt, step=0, seed=seed)
        self.max_steps = max_steps
        self.timeout_s = timeout_s
        self.harness = harness
        procs = harness.instantiate()  # fresh processor instances: no state leaks between attempts
        self.pipes: dict[HookName, HookPipeline] = {h: HookPipeline(h, ps, tracer.emit) for h, ps in procs.items()}
        self.tools: dict[str, Tool] = {}
        self.steps = 0
        self.answered = False
        """True once the model stopped calling tools (so a last-step answer is not a spent budget)."""
        self.final_answer = ""
        self.started = AttemptStarted(run_id=run_id, round=round, task_id=task.spec.id, attempt=attempt,
                                      harness_digest=harness.digest, seed=seed,
                                      model=router.public(router.models.chain("main")[0]))

    def call_context(self) -> CallContext:
        """Where in the run the attempt is now (for model calls processors make)."""
        return msgspec.structs.replace(self.ctx, step=self.steps)

    def _drain_env(self) -> None:
        for event in self.task.drain_events():
            self.tracer.emit(event)

    async def run(self) -> AttemptResult:
        """Drive the attempt from task_start to task_end."""
        ctx = self.ctx
        self.tracer.emit(self.started)
        status: AttemptStatus = "completed"
        reason = ""
        score = VerifierScore(verifier="none", passed=False)
        try:
            deadline = asyncio.timeout(self.timeout_s)
            try:
                async with deadline:
                    await self._episode()
            except TimeoutError:
                if not deadline.expired():
                    raise  # a tool's own timeout, not the attempt's
                raise Interrupt(f"attempt timed out after {self.timeout_s:g}s", status="infra_failure") from None
            if self.steps >= self.max_steps and not self.answered and not self.task.done:
                status, reason = "budget_exhausted", f"step budget of {self.max_steps} reached"
            score = await self.task.verify(self.final_answer)
            self.tracer.emit(score)
        except Interrupt as exc:
            status, reason = ("infra_failure" if exc.status == "infra_failure" else "interrupted"), exc.reason
        except ContractViolation as exc:
            status, reason = "interrupted", str(exc)
        except ProviderError as exc:
            status, reason = "infra_failure", f"model call failed: {exc}"
        except Exception as exc:  # noqa: BLE001 - an environment crash (or any HxError) is an infrastructure failure
            status, reason = "infra_failure", f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):
                await self.task.close()
        passed = score.passed and status in SCORED_STATUSES
        end = TaskEnd(task_id=ctx.task_id, passed=passed, score=score.score, steps=self.steps, status=status)
        try:
            await self.pipes["task_end"].run(end, 0)
        except (Interrupt, ContractViolation) as exc:  # no warn-only mode, even for read-only observers
            why = exc.reason if isinstance(exc, Interrupt) else str(exc)
            if status in SCORED_STATUSES:
                status, reason = "interrupted", why
            else:
                reason = f"{reason}; then at task_end: {why}"
            passed = False
        self.tracer.emit(AttemptFinished(run_id=ctx.run_id, round=ctx.round, task_id=ctx.task_id,
                                         attempt=ctx.attempt, passed=passed, score=score.score,
                                         steps=self.steps, status=status, reason=reason, usage=self.tracer.usage))
        await self.tracer.flush()
        return AttemptResult(task_id=ctx.task_id, attempt=ctx.attempt, passed=passed, score=score.score,
                             steps=self.steps, status=status, reason=reason, events=self.tracer.count,
                             final_answer=self.final_answer, usage=self.tracer.usage)

    async def _episode(self) -> None:
        task = self.task
        self.tools = {t.schema.name: t for t in task.tools()}
        first = await task.reset()
        self._drain_env()
        at_start = {name: tool.schema for name, tool in self.tools.items()}
        # refrozen: a replay's task and tools come from the log, decoded as plain values (schemas.frozen)
        start = TaskStart(task=refrozen(task.spec), system_prompt=task.system_prompt,
                          tools=tuple(refrozen(t) for t in at_start.values()))
        started = await self.pipes["task_start"].run(start, 0)
        if not started:
            raise Interrupt("task_start was intercepted: the attempt did not start")
        ts = started[-1]
        offered = {schema.name for schema in ts.tools}
        self.tools = {name: tool for name, tool in self.tools.items() if name in offered}  # filtered at task_start
        history: tuple[Message, ...] = ((Message(role="system", content=ts.system_prompt),) if ts.system_prompt
                                        else ()) + (Message(role="user", content=first),)
        while self.steps < self.max_steps and not task.done:
            self.steps += 1
            step = self.steps
            history, stop = await self._step(step, history, self._offered(ts.tools, at_start))
            await self.tracer.flush()
            if stop:
                break

    def _offered(self, offered: tuple[ToolSchema, ...], at_start: dict[str, ToolSchema]) -> tuple[ToolSchema, ...]:
        """The tools of this step: as task_start offered them, except where the task's own schema moved on.

        A text game's ``act`` tool enumerates the actions valid now, so its schema changes
        every step; a schema the task did not change keeps any edit task_start made to it.
        """
        out = []
        for schema in offered:
            tool = self.tools.get(schema.name)
            current = tool.schema if tool is not None else schema
            out.append(refrozen(current) if current != at_start.get(schema.name, current) else schema)
        # Unchanged: the same tuple, step after step, so consumers can cache by identity (the random provider).
        return offered if all(a is b for a, b in zip(out, offered, strict=True)) else tuple(out)

    async def _step(self, step: int, history: tuple[Message, ...],
                    tools: tuple[ToolSchema, ...]) -> tuple[tuple[Message, ...], bool]:
        ctx = msgspec.structs.replace(self.ctx, step=step)
        started = await self.pipes["step_start"].run(StepStart(step=step, messages=history), step)
        stop = False
        if started:
            history = started[-1].messages
            prepared = await self.pipes["before_model"].run(BeforeModel(step=step, messages=history,
                                                                        tools=tools), step)
            if prepared:
                request = prepared[-1]
                role = request.route or "main"
                ctx = msgspec.structs.replace(ctx, role=role)
                spec, completion = await self.router.complete(role, request.messages, request.tools, ctx,
                                                              self.tracer.emit)
                answered = await self.pipes["after_model"].run(AfterModel(
                    step=step, content=completion.content, tool_calls=tuple(refrozen(c) for c in completion.tool_calls),
                    stop_reason=completion.stop_reason, model=spec, usage=completion.usage), step)
                calls: tuple[ToolCall, ...] = ()
                offered = tuple(t.name for t in request.tools)
                for resp in answered:
                    history += (Message(role="assistant", content=resp.content, tool_calls=resp.tool_calls),)
                    calls += resp.tool_calls
                    if resp.content:
                        self.final_answer = resp.content
                if not calls:
                    stop = self.answered = True  # the model stopped calling tools: it has answered
                for call in calls:
                    history += await self._tool(step, call, offered)
        ended = StepEnd(step=step, messages=history, done=stop or self.task.done)
        await self.pipes["step_end"].run(ended, step)
        return history, stop

    async def _tool(self, step: int, call: ToolCall, offered: tuple[str, ...]) -> tuple[Message, ...]:
        """Run one tool call through before_tool, the tool and after_tool; return the tool messages.

        ``offered`` names the tools the model was offered at this step; the tool run is the
        one the before_tool pipeline leaves named (a processor may correct the name to one of them).
        """
        out: tuple[Message, ...] = ()
        approved = await self.pipes["before_tool"].run(BeforeTool(step=step, call=call, offered=offered), step)
        if not approved:
            return (Message(role="tool", content=BLOCKED, tool_call_id=call.id, name=call.name),)
        for req in approved:
            if not req.approved:
                result = ToolResult(call_id=req.call.id, name=req.call.name, output=BLOCKED, is_error=True)
            else:
                result = refrozen(await self._execute(step, req.call))  # a replay's result is read from the log
            returned = await self.pipes["after_tool"].run(AfterTool(step=step, call=req.call, result=result), step)
            for res in returned:
                out += (Message(role="tool", content=res.result.output, tool_call_id=res.call.id,
                                name=res.call.name),)
        if not out:
            out = (Message(role="tool", content=BLOCKED, tool_call_id=call.id, name=call.name),)
        return out

    async def _execute(self, step: int, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        self.tracer.emit(ToolInvoked(step=step, call=call))
        if tool is None:
            result = ToolResult(call_id=call.id, name=call.name, is_error=True,
                                output=f"unknown tool {call.name!r}; available: {', '.join(sorted(self.tools))}")
        else:
            result = await tool.call(call)
        self.tracer.emit(ToolReturned(step=step, result=result,
                                      nondeterministic=bool(tool is not None and tool.nondeterministic)))
        self._drain_env()
        return result
