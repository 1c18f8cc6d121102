"""D6 ``llm_judge``: a second model reviews the final answer before the attempt ends.

Failure addressed: confident wrong answers. The acting model is a poor judge of its
own output; the verifier only speaks after the attempt, when nothing can be fixed. When
the model answers without calling a tool, this processor shows the task, the last few
steps and the answer to a judge model and asks for ``VERDICT: PASS`` or
``VERDICT: FAIL`` with reasons. A rejected answer stays as the response's content and
gains a harness-answered ``judge_feedback`` call whose result is the judge's critique,
so the agent gets another step to fix it; after ``max_rejections`` the answer stands.
An accepted answer passes unchanged. The verifier's verdict is never touched (task_end
is read-only): the judge shapes the trajectory, not the score.

The judge is named by this processor's ``model`` parameter (a model spec, with
``provider_options`` and ``fallback`` as in ``ModelConfig``) and called through a
``ModelRouter``, so retries and fallback apply. Limits: processors cannot write to the
log, so the judge's request and response are kept only in memory (``judge_events``);
the judge's critique does reach the log, as the ``judge_feedback`` result in the
after_tool hook record. A judge that fails or answers without a verdict accepts the
answer (``fail_open``), so a broken judge cannot block every attempt.

Attach with ``attach(LlmJudge.accepted_hooks(), LlmJudge(model="anthropic:claude-haiku-4-5"))``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from hx.harness.errors import Interrupt
from hx.harness.processor import POST, Processor
from hx.processors.virtual_tool import VirtualCalls
from hx.runtime.errors import ProviderError
from hx.runtime.models import ModelConfig
from hx.runtime.providers.base import CallContext
from hx.runtime.router import ModelRouter
from hx.runtime.services import current_services
from schemas.event import Event
from schemas.hooks import AfterModel, AfterTool, BeforeModel, BeforeTool, TaskEnd
from schemas.messages import Message

DEFAULT_RUBRIC = (
    "You review an AI agent's final answer to a task. Judge only whether the answer is correct, complete "
    "and in the form the task asks for, using the task and the agent's recent steps as evidence. Reply "
    "with 'VERDICT: PASS' or 'VERDICT: FAIL' on the first line, then at most five short lines of reasons; "
    "for FAIL, say precisely what is wrong or missing."
)
_VERDICT = re.compile(r"VERDICT\s*:\s*\**\s*(PASS|FAIL)\b", re.IGNORECASE)

JudgeHook = BeforeModel | AfterModel | BeforeTool | AfterTool | TaskEnd


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} more characters]"


def transcript(messages: tuple[Message, ...], last: int, limit: int = 600) -> tuple[str, str]:
    """(the task's first user message, the last ``last`` messages after it as text)."""
    first = next((i for i, m in enumerate(messages) if m.role == "user"), None)
    task = messages[first].content if first is not None else ""
    rest = messages[first + 1:] if first is not None else messages
    lines = []
    for m in rest[-last:] if last > 0 else ():
        text = _clip(m.content, limit)
        if m.role == "assistant" and m.tool_calls:
            calls = "; ".join(f"{c.name}({_clip(json.dumps(c.input, sort_keys=True), 200)})" for c in m.tool_calls)
            text = f"{text} [calls: {calls}]".strip()
        who = f"tool {m.name}" if m.role == "tool" and m.name else m.role
        lines.append(f"{who}: {text}")
    return task, "\n".join(lines)


def parse_verdict(text: str) -> bool | None:
    """True for PASS, False for FAIL, None when the judge gave no verdict."""
    match = _VERDICT.search(text)
    if match is None:
        return None
    return match.group(1).upper() == "PASS"


class LlmJudge(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Ask a judge model about each final answer; send a rejected one back with the critique."""

    name: ClassVar[str] = "llm_judge"
    _order: ClassVar[int] = POST
    dimension: ClassVar[str] = "D6"
    addresses: ClassVar[tuple[str, ...]] = ("premature_answer",)
    limits: ClassVar[tuple[str, ...]] = ("max_rejections",)
    calls_model: ClassVar[bool] = True
    standalone: ClassVar[bool] = False  # its defaults need configuring first

    model: str = ""
    """The judge's model spec, e.g. ``anthropic:claude-haiku-4-5``; empty uses the attempt's ``role``."""
    role: str = "judge"
    """With no ``model``: the ModelConfig role called through the attempt, so its calls are on the log."""
    fallback: tuple[str, ...] = ()
    """Models tried in order when the judge's model fails."""
    provider_options: dict[str, dict[str, Any]] = {}
    """Per model spec, provider options (base URL, scripted completions); never secrets."""
    sampling: dict[str, Any] = {}
    """Sampling parameters of the judge's calls (temperature, max_tokens)."""
    retries: int = 1
    rubric: str = DEFAULT_RUBRIC
    """The judge's system prompt."""
    context_messages: int = 6
    """How many recent messages the judge sees besides the task."""
    max_rejections: int = 2
    """After this many rejections in an attempt the answer stands."""
    no_verdict: Literal["accept", "reject"] = "accept"
    """What an answer without a parseable verdict counts as."""
    fail_open: bool = True
    """Accept the answer when the judge cannot be called; otherwise end the attempt as an infra failure."""
    tool: str = "judge_feedback"

    def __post_init__(self) -> None:
        self._calls = VirtualCalls(self.tool)
        self._messages: tuple[Message, ...] = ()
        self._rejections = 0
        self._router: ModelRouter | None = None
        self.judge_events: list[Event] = []
        """The judge's requests, responses and errors in this attempt (in memory only)."""

    def _models(self) -> ModelRouter:
        if self._router is None:
            config = ModelConfig(judge=self.model, fallback={"judge": list(self.fallback)},
                                 params={"judge": dict(self.sampling)}, retries=self.retries,
                                 provider_options={k: dict(v) for k, v in self.provider_options.items()})
            self._router = ModelRouter(config)
        return self._router

    def request(self, answer: str) -> tuple[Message, ...]:
        """The messages sent to the judge about ``answer``."""
        task, steps = transcript(self._messages, self.context_messages)
        body = f"## Task\n{task}\n\n"
        if steps:
            body += f"## The agent's recent steps\n{steps}\n\n"
        body += f"## The agent's final answer\n{answer}\n\nGive your verdict."
        return (Message(role="system", content=self.rubric), Message(role="user", content=body))

    async def judge(self, answer: str, step: int) -> tuple[bool, str]:
        """(accepted, critique) for ``answer``."""
        try:
            services = current_services()
            if not self.model and services is not None:
                completion = await services.complete(self.role, self.request(answer))
            elif not self.model:
                raise ProviderError("other", "llm_judge has no model and runs outside an attempt")
            else:
                ctx = CallContext(run_id="llm_judge", round=0, task_id="", attempt=0, step=step, role="judge")
                _, completion = await self._models().complete("judge", self.request(answer), (), ctx,
                                                              self.judge_events.append)
        except ProviderError as exc:
            if self.fail_open:
                return True, ""
            raise Interrupt(f"llm_judge: the judge model failed: {exc}", status="infra_failure") from exc
        verdict = parse_verdict(completion.content)
        if verdict is None:
            verdict = self.no_verdict == "accept"
        return verdict, completion.content.strip()

    async def process(self, event: JudgeHook) -> AsyncIterator[JudgeHook]:
        """Remember the conversation; judge final answers; answer the feedback calls; close at the end."""
        if isinstance(event, BeforeModel):
            self._messages = event.messages
            yield event
        elif isinstance(event, BeforeTool):
            yield self._calls.withhold(event)
        elif isinstance(event, AfterTool):
            yield self._calls.answer(event)
        elif isinstance(event, TaskEnd):
            if self._router is not None:
                await self._router.aclose()
                self._router = None
            yield event
        elif event.tool_calls or not event.content.strip() or self._rejections >= self.max_rejections:
            yield event
        else:
            accepted, critique = await self.judge(event.content, event.step)
            if accepted:
                yield event
                return
            self._rejections += 1
            feedback = ("A reviewer checked your final answer and rejected it:\n"
                        f"{critique or '(no reasons given)'}\n"
                        "Fix these problems, then give your final answer again without calling tools.")
            yield self._calls.add(event, feedback, {"answer": event.content})
