"""The D1-D4 processor library: each processor at work inside a real run, its edge cases, its contracts.

Real runs drive a tiny deterministic text game (three rooms, a key, a locked door) with
the ``script:`` provider against the test's own nats-server, and read the processor's
effect back from the log: ``ProcessorTriggered`` events, hook records, and what the
model was sent (``ModelRequest``).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import pytest

from hx.harness.config import HarnessConfig
from hx.harness.errors import ContractViolation
from hx.harness.processor import Processor, registered
from hx.processors import (
    CostModelRouter,
    HistoryWindow,
    ObservationTrim,
    StepModelRouter,
    SystemPromptTemplate,
    TaskNotes,
    ToolCallCorrector,
    ToolFilter,
    ToolWhitelist,
    VisitedStates,
)
from hx.processors.history_window import window
from hx.processors.model_router import current_route
from hx.processors.testing import KitFailure, check_processor, scenario
from hx.processors.tool_call_corrector import closest_enum, coerce
from hx.processors.visited_states import action_text
from hx.runtime.loop import BLOCKED, AttemptResult
from hx.runtime.models import ModelConfig
from hx.runtime.task import FunctionTool, Task, Tool
from schemas.event import Event
from schemas.history import resolve_async
from schemas.hooks import (
    HOOK_EVENT_TYPES,
    AfterModel,
    AfterTool,
    BeforeModel,
    BeforeTool,
    HookRecord,
    ProcessorTriggered,
    StepStart,
    TaskStart,
)
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.model import ModelRequest
from schemas.tools import ToolInvoked, ToolReturned, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_filter

E = TypeVar("E", bound=Event)

# --- a tiny deterministic text game ------------------------------------------------------

ACTIONS = ["go north", "go south", "go east", "go west", "take key", "open door", "look"]
ACT = ToolSchema(name="act", description="Send one command to the game.",
                 input_schema={"type": "object", "required": ["command"],
                               "properties": {"command": {"type": "string", "enum": ACTIONS}}})
SHELL = ToolSchema(name="shell", description="Run a shell command.",
                   input_schema={"type": "object", "properties": {"cmd": {"type": "string"}}})
MANUAL = ToolSchema(name="read_manual", description="Read the game's manual.",
                    input_schema={"type": "object", "properties": {}})
EXITS = {"kitchen": {"north": "hall"}, "hall": {"south": "kitchen", "east": "study"}, "study": {"west": "hall"}}
ROOMS = {"kitchen": "You are in the kitchen. A passage leads north.",
         "hall": "You are in the hall. A locked door is set in the west wall. Passages lead south and east.",
         "study": "You are in the study. A passage leads west."}
SECRET = "Remember: the door code is 4711."
MANUAL_TEXT = "\n".join([*(f"Chapter {i}: nothing of interest here." for i in range(60)), SECRET,
                         *(f"Appendix {i}: more filler text." for i in range(60))])
SYSTEM = "You play a text game."


class RoomsTask(Task):
    """Kitchen -> hall -> study (key) -> hall -> open the door."""

    system_prompt = SYSTEM

    def __init__(self) -> None:
        self.spec = TaskSpec(id="rooms:key:0", instruction="Find the key and open the door.", benchmark="rooms",
                             split="dev", meta={"difficulty": "easy"})
        self.room = "kitchen"
        self.has_key = False
        self.won = False
        self.moves = 0

    def tools(self) -> Sequence[Tool]:
        return [FunctionTool(ACT, self.act), FunctionTool(SHELL, lambda cmd: f"ran {cmd}"),
                FunctionTool(MANUAL, lambda: MANUAL_TEXT)]

    def observe(self) -> str:
        key = "\nYou see a brass key on the desk." if self.room == "study" and not self.has_key else ""
        return f"{ROOMS[self.room]}{key}\nMoves: {self.moves}"

    def act(self, command: str) -> str:
        if command not in ACTIONS:
            raise ValueError(f"invalid action {command!r}")
        self.moves += 1
        verb, _, arg = command.partition(" ")
        if verb == "go":
            if arg not in EXITS[self.room]:
                return f"You cannot go {arg}.\nMoves: {self.moves}"
            self.room = EXITS[self.room][arg]
        elif command == "take key" and self.room == "study" and not self.has_key:
            self.has_key = True
            return f"You take the brass key.\nMoves: {self.moves}"
        elif command == "open door" and self.room == "hall":
            if not self.has_key:
                return f"The door is locked.\nMoves: {self.moves}"
            self.won = True
            return "The door swings open. You are free!"
        return self.observe()

    async def reset(self) -> str:
        return self.observe()

    @property
    def done(self) -> bool:
        return self.won

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="rooms", passed=self.won, score=1.0 if self.won else 0.0)


def call(i: int, command: str = "", *, name: str = "act", **given: Any) -> dict[str, Any]:
    """One scripted completion calling one tool."""
    args = given or ({"command": command} if name == "act" else {"cmd": command} if name == "shell" else {})
    return {"content": "", "tool_calls": [{"id": f"c{i}", "name": name, "input": args}]}


def answer(text: str = "Done.") -> dict[str, Any]:
    return {"content": text, "tool_calls": []}


WIN = ["go north", "go east", "take key", "go west", "open door"]


@dataclass
class Run:
    """An attempt's result and every event it put on the log."""

    result: AttemptResult
    events: list[Event]
    task: RoomsTask

    def of(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]

    def triggers(self, processor: str) -> list[ProcessorTriggered]:
        return [e for e in self.of(ProcessorTriggered) if e.processor == processor]

    def requests(self) -> list[ModelRequest]:
        return self.of(ModelRequest)

    def returned(self, hook: str) -> list[Any]:
        return [r.event for r in self.of(HookRecord) if r.stage == "returned"
                and isinstance(r.event, HOOK_EVENT_TYPES[hook])]


async def run_attempt(nats_url: str, harness: HarnessConfig, script: list[dict[str, Any]] | None = None, *,
                      models: ModelConfig | None = None, max_steps: int = 12, run_id: str = "d1d4") -> Run:
    """Run one attempt of the rooms game and read back its events (``run_id`` tells runs on one server apart)."""
    task = RoomsTask()
    models = models or ModelConfig(main="script:x", provider_options={"script:x": {"completions": script or []}})
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = models.agentic(harness, log=conn.log)
        result = await agent.run(task, run_id=run_id, max_steps=max_steps)
        events = [r.event async for r in resolve_async(conn.log.read(subjects=[trace_filter(run_id)]))]
    return Run(result, events, task)


async def drive(proc: Processor, *events: Any) -> list[Any]:
    """Every event ``proc`` yields for ``events`` in order (one instance, as within one attempt)."""
    out: list[Any] = []
    for event in events:
        out += [item async for item in proc.process(event)]
    return out


def orphans(messages: Sequence[Message]) -> list[str]:
    """Tool results whose call is not in an earlier assistant message of the same request."""
    called: set[str] = set()
    bad = []
    for m in messages:
        called |= {c.id for c in m.tool_calls}
        if m.role == "tool" and m.tool_call_id not in called:
            bad.append(m.tool_call_id or "")
    return bad


def msg(role: Any, content: str = "", calls: Sequence[str] = (), answers: str | None = None) -> Message:
    return Message(role=role, content=content, tool_calls=tuple(ToolCall(id=c, name="act", input={}) for c in calls),
                   tool_call_id=answers)


# --- the rooms game and the baseline --------------------------------------------------------


async def test_the_game_is_won_on_the_gold_path_without_processors(nats_url: str) -> None:
    run = await run_attempt(nats_url, HarnessConfig(), [call(i, c) for i, c in enumerate(WIN)])
    assert run.result.passed and run.result.steps == 5
    assert not run.of(ProcessorTriggered)


# --- D1 model selection ------------------------------------------------------------------------


ROUTE_MODELS = ModelConfig(main="script:big", roles={"strong": "script:big", "cheap": "script:small"},
                           provider_options={"script:big": {"completions": [call(0, "go north"), call(1, "go east")]},
                                             "script:small": {"completions": [call(2, "take key"),
                                                                              call(3, "go west"),
                                                                              call(4, "open door")]}})


async def test_step_model_router_routes_later_steps_to_another_role(nats_url: str) -> None:
    harness = HarnessConfig().attach("before_model", StepModelRouter(schedule=((1, "main"), (3, "cheap"))))
    run = await run_attempt(nats_url, harness, models=ROUTE_MODELS)
    assert run.result.passed
    assert [(r.step, r.role, r.model) for r in run.requests()] == [
        (1, "main", "script:big"), (2, "main", "script:big"), (3, "cheap", "script:small"),
        (4, "cheap", "script:small"), (5, "cheap", "script:small")]
    assert [(t.step, t.action, t.fields) for t in run.triggers("step_model_router")] == [
        (s, "changed", ("route",)) for s in (3, 4, 5)]
    assert [e.model for e in run.returned("after_model")][-1] == "script:small"


async def test_cost_model_router_switches_role_once_the_budget_is_spent(nats_url: str) -> None:
    # the first call alone spends more than 300 estimated tokens (prompt + tool schemas): step 3 on goes cheap
    router = CostModelRouter(budget_tokens=300, role="cheap")
    harness = HarnessConfig().attach(["before_model", "after_model"], router)
    run = await run_attempt(nats_url, harness, models=ROUTE_MODELS)
    assert run.result.passed
    roles = [r.role for r in run.requests()]
    assert roles[:2] == ["main", "main"] and set(roles[2:]) == {"cheap"}
    assert {t.hook for t in run.triggers("cost_model_router")} == {"before_model"}


def test_step_model_router_schedule() -> None:
    router = StepModelRouter(schedule=((2, "cheap"), (5, "strong")))
    assert [router.role_at(s) for s in (1, 2, 4, 5, 9)] == ["main", "cheap", "cheap", "strong", "strong"]
    with pytest.raises(ValueError, match="increasing"):
        StepModelRouter(schedule=((3, "a"), (2, "b")))
    with pytest.raises(ValueError, match="non-empty"):
        StepModelRouter(schedule=((1, ""),))


async def test_model_routers_pass_through_when_the_decision_is_main() -> None:
    event = BeforeModel(step=4, messages=(Message(role="user", content="hi"),))
    assert await drive(StepModelRouter(), event) == [event]
    assert await drive(CostModelRouter(budget_tokens=10**9), event) == [event]


async def test_model_router_sets_the_route() -> None:
    event = BeforeModel(step=3, messages=(Message(role="user", content="hi"),))
    router = StepModelRouter(schedule=((1, "main"), (3, "strong")))
    (out,) = await drive(router, event)
    assert current_route(out) == "strong"


async def test_cost_model_router_accounts_tokens_and_dollars() -> None:
    router = CostModelRouter(budget_usd=0.01, usd_per_mtok={"script:big": 10_000.0}, role="cheap")
    prompt = BeforeModel(step=1, messages=(Message(role="user", content="x" * 400),))
    await drive(router, prompt)
    assert router.spent_tokens == 100 and router.spent_usd == 0.0
    await drive(router, AfterModel(step=1, content="y" * 40, model="script:big"))
    assert router.spent_tokens == 110
    assert router.spent_usd == pytest.approx(110 * 10_000 / 1e6)
    assert router.over_budget()
    unpriced = CostModelRouter(budget_usd=0.01)
    await drive(unpriced, prompt, AfterModel(step=1, content="y" * 40, model="script:other"))
    assert unpriced.spent_usd == 0.0 and not unpriced.over_budget()
    with pytest.raises(ValueError):
        CostModelRouter(chars_per_token=0)


# --- D2 context assembly ---------------------------------------------------------------------


async def test_system_prompt_template_frames_the_task(nats_url: str) -> None:
    template = ("$system_prompt\nTask ($benchmark/$split): $instruction\nTools: $tool_names\n"
                "Level: $meta_difficulty$unknown\nReply as JSON: {\"done\": true}")
    harness = HarnessConfig().attach("task_start", SystemPromptTemplate(template=template))
    run = await run_attempt(nats_url, harness, [answer()])
    expected = (f"{SYSTEM}\nTask (rooms/dev): Find the key and open the door.\n"
                "Tools: act, shell, read_manual\nLevel: easy\nReply as JSON: {\"done\": true}")
    system = run.requests()[0].messages[0]
    assert system.role == "system" and system.content == expected
    (trig,) = run.triggers("system_prompt_template")
    assert (trig.hook, trig.action, trig.fields) == ("task_start", "changed", ("system_prompt",))
    assert run.returned("task_start")[0].system_prompt == expected


async def test_system_prompt_template_modes_and_missing_keys() -> None:
    event = TaskStart(task=TaskSpec(id="t", instruction="Do it."), system_prompt="Base.",
                      tools=(ACT, ToolSchema(name="bare")))
    (kept,) = await drive(SystemPromptTemplate(template="$instruction $nope ${also} $", missing="keep"), event)
    assert kept.system_prompt == "Do it. $nope ${also} $"
    (emptied,) = await drive(SystemPromptTemplate(template="$instruction [$nope]"), event)
    assert emptied.system_prompt == "Do it. []"
    (pre,) = await drive(SystemPromptTemplate(template="Task: $instruction", mode="prepend"), event)
    assert pre.system_prompt == "Task: Do it.\n\nBase."
    (post,) = await drive(SystemPromptTemplate(template="$tools", mode="append"), event)
    assert post.system_prompt == "Base.\n\n- act: Send one command to the game.\n- bare"
    (price,) = await drive(SystemPromptTemplate(template="Costs $5 or $$6 for $task_id."), event)
    assert price.system_prompt == "Costs $5 or $6 for t."
    (same,) = await drive(SystemPromptTemplate(template="$system_prompt"), event)
    assert same is event
    (default,) = await drive(SystemPromptTemplate(), event)
    assert default.system_prompt.startswith("Base.\n\nYour task: Do it.") and "act, bare" in default.system_prompt
    (broken,) = await drive(SystemPromptTemplate(template="$instruction ${broken"), event)
    assert broken.system_prompt == "Do it. ${broken"


async def test_history_window_keeps_the_window_without_orphaned_tool_results(nats_url: str) -> None:
    walk = ["go north", "go south"] * 4
    harness = HarnessConfig().attach("step_start", HistoryWindow(keep_last=4))
    run = await run_attempt(nats_url, harness, [call(i, c) for i, c in enumerate(walk)], max_steps=8)
    requests = run.requests()
    assert len(requests) == 8
    for req in requests:
        assert not orphans(req.messages)
        assert req.messages[0].role == "system" and req.messages[1].content == "You are in the kitchen. " \
            "A passage leads north.\nMoves: 0"
    last = requests[-1].messages
    assert len(last) == 2 + 1 + 4  # head, note, window
    assert last[2].role == "user" and "earlier messages were removed" in last[2].content
    assert [m.role for m in last[3:]] == ["assistant", "tool", "assistant", "tool"]
    trigs = run.triggers("history_window")
    assert trigs and {(t.hook, t.action, t.fields) for t in trigs} == {("step_start", "changed", ("messages",))}
    assert trigs[0].step == 4  # steps 1-3 fit: 2 + 2 * (step - 1) messages after the head
    # the full history is what the step started with; the window is what the hook returned
    emitted = [r.event for r in run.of(HookRecord) if r.stage == "emitted" and isinstance(r.event, StepStart)]
    assert len(emitted[-1].messages) > len(run.returned("step_start")[-1].messages)


def test_history_window_cut_points() -> None:
    sys_, first = msg("system", "s"), msg("user", "obs")
    # a split answer: two assistant messages, then the results of both
    split = (msg("assistant", calls=["a"]), msg("assistant", calls=["b"]),
             msg("tool", "ra", answers="a"), msg("tool", "rb", answers="b"))
    tail = (msg("assistant", calls=["c"]), msg("tool", "rc", answers="c"))
    messages = (sys_, first, *split, *tail)
    head, kept, dropped = window(messages, 3)
    assert head == (sys_, first) and kept == tail and dropped == 4
    head, kept, dropped = window(messages, 5)  # cutting inside the split exchange would orphan a result
    assert kept == tail and dropped == 4
    # the newest exchange alone is longer than the window: it is kept whole
    big = (msg("assistant", calls=["x", "y", "z"]), *(msg("tool", answers=i) for i in "xyz"))
    head, kept, dropped = window((first, msg("assistant", "hi"), *big), 2)
    assert kept == big and dropped == 1
    # nothing to drop; no user message; nothing at all
    assert window((sys_, first, *tail), 5)[2] == 0
    assert window((sys_, msg("assistant", "a"), msg("assistant", "b")), 1) == ((sys_,), (msg("assistant", "b"),), 1)
    assert window((), 3) == ((), (), 0)
    with pytest.raises(ValueError):
        HistoryWindow(keep_last=0)


async def test_history_window_note_can_be_turned_off() -> None:
    messages = (msg("user", "obs"), *(msg("assistant", str(i)) for i in range(5)))
    (out,) = await drive(HistoryWindow(keep_last=2, note=""), StepStart(step=3, messages=messages))
    assert out.messages == (messages[0], *messages[-2:])


async def test_observation_trim_cuts_a_verbose_observation(nats_url: str) -> None:
    harness = HarnessConfig().attach("after_tool", ObservationTrim(max_chars=300, tools=("read_*",)))
    run = await run_attempt(nats_url, harness, [call(0, name="read_manual"), call(1, "go north"), answer()])
    (raw,) = [e.result for e in run.of(ToolReturned) if e.result.name == "read_manual"]
    assert raw.output == MANUAL_TEXT  # the tool's own result is on the log untouched
    seen = next(m for m in run.requests()[1].messages if m.role == "tool").content
    assert len(seen) == 300 and seen.startswith("Chapter 0") and seen.endswith("Appendix 59: more filler text.")
    marker = re.search(r"\n\[\.\.\. (\d+) characters omitted \.\.\.\]\n", seen)
    assert marker is not None and int(marker[1]) == len(MANUAL_TEXT) - (300 - len(marker[0]))
    returned = run.returned("after_tool")
    assert returned[0].result.data == {"trimmed_chars": len(MANUAL_TEXT) - 300}
    assert returned[1].result.output.startswith("You are in the hall")  # act results are not trimmed
    (trig,) = run.triggers("observation_trim")
    assert trig.hook == "after_tool" and set(trig.fields) == {"result.output", "result.data"}


def test_observation_trim_lengths() -> None:
    text = "".join(str(i % 10) for i in range(1000))
    for max_chars in (40, 41, 99, 100, 500, 999):
        out = ObservationTrim(max_chars=max_chars).trim(text)
        assert len(out) == max_chars
        marker = out[out.index("\n[... "):out.index(" ...]\n") + 6]
        omitted = int(marker.split()[1])
        assert omitted == len(text) - (max_chars - len(marker))
    assert ObservationTrim(max_chars=1000).trim(text) == text
    assert ObservationTrim(max_chars=5).trim(text) == text[:5]  # smaller than the marker: a plain cut
    head_only = ObservationTrim(max_chars=100, head_share=1.0).trim(text)
    assert head_only.startswith(text[:10]) and head_only.endswith(" ...]\n")
    assert ObservationTrim(max_chars=100, marker="~").trim(text) == text[:69] + "~" + text[-30:]
    with pytest.raises(ValueError):
        ObservationTrim(head_share=1.5)


# --- D3 memory -------------------------------------------------------------------------------


async def test_visited_states_warns_when_the_agent_walks_in_circles(nats_url: str) -> None:
    harness = HarnessConfig().attach(["after_tool", "before_model"], VisitedStates(ignore=(r"Moves: \d+",)))
    walk = ["go north", "go south", "go north", "go south"]
    run = await run_attempt(nats_url, harness, [*(call(i, c) for i, c in enumerate(walk)), answer("stuck")])
    requests = run.requests()
    assert requests[0].messages[-1].role == "user" and "back in a state" not in requests[0].messages[-1].content
    assert requests[1].messages[-1].role == "tool"  # the hall is new
    note = requests[2].messages[-1]  # back in the kitchen
    assert note.role == "user" and "earlier visits: 1" in note.content and "from here: go north." in note.content
    assert "earlier visits: 1" in requests[3].messages[-1].content  # the hall again
    assert "earlier visits: 2" in requests[4].messages[-1].content and "go north" in requests[4].messages[-1].content
    trigs = run.triggers("visited_states")
    assert [(t.step, t.hook, t.action) for t in trigs] == [(s, "before_model", "changed") for s in (3, 4, 5)]
    assert all(t.fields == ("messages",) for t in trigs)
    # the note goes to the model only: the history the next step starts from has none
    assert not any("back in a state" in m.content for m in run.returned("step_start")[-1].messages)


async def test_visited_states_edge_cases() -> None:
    proc = VisitedStates(min_visits=3, mode="edit")
    first = BeforeModel(step=1, messages=(Message(role="user", content="Room  A"),))
    kitchen = ToolResult(call_id="1", name="act", output="room a")
    again = AfterTool(step=1, call=ToolCall(id="1", name="act", input={"command": "look"}), result=kitchen)
    out = await drive(proc, first, again)
    assert out == [first, again] and proc.visits("ROOM A") == 2  # case and spacing do not make a new state
    failed = AfterTool(step=2, call=ToolCall(id="2", name="act", input={"command": "fly"}),
                       result=ToolResult(call_id="2", name="act", output="room a", is_error=True))
    await drive(proc, failed)
    assert proc.visits("room a") == 2  # an error is not a state
    await drive(proc, again)
    last_user = BeforeModel(step=3, messages=(Message(role="user", content="obs"),))
    (edited,) = await drive(proc, last_user)
    assert len(edited.messages) == 1 and edited.messages[0].content.startswith("obs\n\nNote:")
    assert "earlier visits: 2" in edited.messages[0].content and "look" in edited.messages[0].content
    with pytest.raises(ValueError):
        VisitedStates(min_visits=1)
    with pytest.raises(ValueError, match="ignore"):
        VisitedStates(ignore=("(",))
    assert action_text(ToolCall(id="x", name="act", input={"command": "go"})) == "go"
    assert action_text(ToolCall(id="x", name="move", input={"dx": 1})) == 'move({"dx": 1})'


async def test_task_notes_bring_back_a_fact_the_window_and_the_trim_removed(nats_url: str) -> None:
    harness = (HarnessConfig()
               .attach("step_start", HistoryWindow(keep_last=2, note=""))
               .attach("after_tool", ObservationTrim(max_chars=200))
               .attach(["after_tool", "before_model"], TaskNotes(patterns=(r"(?i)\bcode\b",))))
    script = [call(0, name="read_manual"), call(1, "go north"), call(2, "go east"), answer()]
    run = await run_attempt(nats_url, harness, script)
    requests = run.requests()
    # step 2: the manual's result is visible but trimmed; the code line survives only in the note
    tool_text = next(m for m in requests[1].messages if m.role == "tool").content
    assert "4711" not in tool_text
    assert requests[1].messages[-1] == Message(role="user", content=f"Notes from earlier in this task:\n- {SECRET}")
    # step 4: the manual has left the window altogether; the note is still there
    assert all(m.name != "read_manual" for m in requests[3].messages)
    assert SECRET in requests[3].messages[-1].content
    trigs = run.triggers("task_notes")
    assert [(t.step, t.hook, t.action) for t in trigs] == [(s, "before_model", "changed") for s in (2, 3, 4)]
    # task_notes (PRE) runs before observation_trim at after_tool: it read the full output
    names = [t.processor for t in run.of(ProcessorTriggered) if t.hook == "after_tool"]
    assert names == ["observation_trim"]


async def test_task_notes_edge_cases() -> None:
    proc = TaskNotes(patterns=(r"key",), max_notes=2, max_line_chars=10, tools=("act",))
    result = ToolResult(call_id="1", name="act", output="a key here\nnothing\n  key two  \nkey three is long")
    await drive(proc, AfterTool(step=1, call=ToolCall(id="1", name="act", input={}), result=result))
    assert proc.notes == ("key two", "key three ")
    other = ToolResult(call_id="2", name="shell", output="key from shell")
    await drive(proc, AfterTool(step=1, call=ToolCall(id="2", name="shell", input={}), result=other))
    assert proc.notes == ("key two", "key three ")
    visible = BeforeModel(step=2, messages=(Message(role="user", content="key two\nkey three is long"),))
    assert await drive(proc, visible) == [visible]  # both still in view: nothing to add
    shown = TaskNotes(patterns=(r"key",), only_hidden=False, header="N:")
    await drive(shown, AfterTool(step=1, call=ToolCall(id="1", name="act", input={}), result=result))
    (out,) = await drive(shown, visible)
    assert out.messages[-1].content == "N:\n- a key here\n- key two\n- key three is long"
    with pytest.raises(ValueError, match="patterns"):
        TaskNotes(patterns=("[",))


# --- D4 tool ecosystem ---------------------------------------------------------------------------


async def test_tool_filter_offers_only_the_tools_the_task_needs(nats_url: str) -> None:
    harness = HarnessConfig().attach("task_start", ToolFilter(deny=("shell",)))
    run = await run_attempt(nats_url, harness, [answer()])
    assert [t.name for t in run.requests()[0].tools] == ["act", "read_manual"]
    (trig,) = run.triggers("tool_filter")
    assert (trig.hook, trig.action, trig.fields) == ("task_start", "changed", ("tools",))


async def test_tool_filter_globs() -> None:
    event = TaskStart(task=TaskSpec(id="t", instruction="i"), tools=(ACT, SHELL, MANUAL))
    (out,) = await drive(ToolFilter(allow=("read_*", "act"), deny=("act",)), event)
    assert [t.name for t in out.tools] == ["read_manual"]
    assert await drive(ToolFilter(), event) == [event]


async def test_tool_whitelist_refuses_and_explains(nats_url: str) -> None:
    guard = ToolWhitelist(allow=("act", "read_manual"))
    harness = HarnessConfig().attach(["before_tool", "after_tool"], guard)
    run = await run_attempt(nats_url, harness, [call(0, "rm -rf /", name="shell"), call(1, "go north"), answer()])
    assert [e.call.name for e in run.of(ToolInvoked)] == ["act"]  # the shell never ran
    tool_msg = next(m for m in run.requests()[1].messages if m.role == "tool")
    assert tool_msg.content.startswith("Tool 'shell' is not available") and "act, read_manual" in tool_msg.content
    trigs = [(t.hook, t.action, t.fields) for t in run.triggers("tool_whitelist")]
    assert trigs == [("before_tool", "changed", ("approved",)), ("after_tool", "changed", ("result.output",))]


async def test_tool_whitelist_intercept_mode(nats_url: str) -> None:
    harness = HarnessConfig().attach("before_tool", ToolWhitelist(deny=("shell",), mode="intercept"))
    run = await run_attempt(nats_url, harness, [call(0, "ls", name="shell"), answer()])
    assert not run.of(ToolInvoked)
    assert [m.content for m in run.requests()[1].messages if m.role == "tool"] == [BLOCKED]
    (trig,) = run.triggers("tool_whitelist")
    assert (trig.hook, trig.action, trig.outputs) == ("before_tool", "intercepted", 0)


async def test_tool_whitelist_leaves_allowed_and_already_refused_calls_alone() -> None:
    guard = ToolWhitelist(allow=("act",))
    ok = BeforeTool(step=1, call=ToolCall(id="1", name="act", input={}))
    refused = BeforeTool(step=1, call=ToolCall(id="2", name="shell", input={}), approved=False)
    assert await drive(guard, ok, refused) == [ok, refused]
    # an error of a call it did not block is not rewritten
    failed = AfterTool(step=1, call=ok.call, result=ToolResult(call_id="1", name="act", output="x", is_error=True))
    assert await drive(guard, failed) == [failed]


async def test_tool_call_corrector_turns_a_failing_run_into_a_win(nats_url: str) -> None:
    sloppy = [call(0, " Go North"), call(1, "go  EAST"), call(2, "tak key"), call(3, "go west\n"),
              call(4, name="act", Command="Open Door")]
    baseline = await run_attempt(nats_url, HarnessConfig(), sloppy)
    assert not baseline.result.passed
    assert all(e.result.is_error for e in baseline.of(ToolReturned))
    harness = HarnessConfig().attach(["task_start", "before_model", "before_tool"], ToolCallCorrector())
    run = await run_attempt(nats_url, harness, sloppy, run_id="corrected")
    assert run.result.passed
    assert [e.call.input for e in run.of(ToolInvoked)] == [{"command": c} for c in WIN]
    trigs = run.triggers("tool_call_corrector")
    assert [(t.hook, t.fields) for t in trigs] == [("before_tool", ("call.input",))] * 5  # task_start passes


def test_tool_call_corrector_rules() -> None:
    enum = ["go north", "take key", "open door"]
    assert closest_enum("GO   north ", enum, 0.75) == "go north"
    assert closest_enum("opn dor", enum, 0.75) == "open door"
    assert closest_enum("dance", enum, 0.75) is None
    assert coerce(" 42 ", "integer") == 42 and coerce("4.5", "number") == 4.5 and coerce("7", "number") == 7
    assert coerce("TRUE", "boolean") is True and coerce("x", "integer") is coerce("yes", "boolean")  # no parse
    schema = {"type": "object", "properties": {
        "direction": {"type": "string", "enum": ["north", "south"]}, "steps": {"type": "integer"},
        "run": {"type": "boolean"}, "note": {"type": "string"}, "max_depth": {"type": "number"}}}
    proc = ToolCallCorrector()
    proc.learn(TaskStart(task=TaskSpec(id="t", instruction="i"), tools=(ToolSchema(name="move", input_schema=schema),)))
    fixed = proc.correct("move", {"Direction": "Nort", "steps": "3", "run": "false", "note": "  hi ",
                                  "max-depth": "2.5", "extra": 1})
    assert fixed == {"direction": "north", "steps": 3, "run": False, "note": "hi", "max_depth": 2.5, "extra": 1}
    # a key already given is not overwritten by a near-miss duplicate
    assert proc.correct("move", {"direction": "south", "Direction": "north"}) == {
        "direction": "south", "Direction": "north"}
    assert proc.correct("unknown", {"a": " b "}) == {"a": "b"}
    assert ToolCallCorrector(strip=False, coerce_types=False, fix_keys=False).correct("x", {"a": " b "}) == {"a": " b "}
    with pytest.raises(ValueError):
        ToolCallCorrector(enum_cutoff=0.0)


def act_with(*actions: str) -> ToolSchema:
    """The ``act`` tool of a text game whose valid actions now are ``actions``."""
    return ToolSchema(name="act", input_schema={"type": "object", "properties": {
        "command": {"type": "string", "enum": list(actions)}}})


async def test_tool_call_corrector_corrects_against_the_actions_valid_now() -> None:
    proc = ToolCallCorrector()
    start = TaskStart(task=TaskSpec(id="t", instruction="i"), tools=(act_with("go north", "take red key"),))
    later = BeforeModel(step=2, tools=(act_with("go south", "take blue key"),))
    sloppy = BeforeTool(step=2, call=ToolCall(id="1", name="act", input={"command": "tak blue key"}))
    assert proc.correct("act", {"command": "tak blue key"}) == {"command": "tak blue key"}  # nothing learnt yet
    out = await drive(proc, start, later, sloppy)
    assert out[:2] == [start, later]  # learning passes both through
    # Against task_start's enum this would become "take red key" (similarity 0.75), an action no longer valid.
    assert out[2].call.input == {"command": "take blue key"}


async def test_tool_call_corrector_leaves_other_tools_and_good_calls_alone() -> None:
    proc = ToolCallCorrector(tools=("act",))
    start = TaskStart(task=TaskSpec(id="t", instruction="i"), tools=(ACT, SHELL))
    good = BeforeTool(step=1, call=ToolCall(id="1", name="act", input={"command": "look"}))
    other = BeforeTool(step=1, call=ToolCall(id="2", name="shell", input={"cmd": "  ls "}))
    assert await drive(proc, start, good, other) == [start, good, other]


# --- the library as a whole: registry, serialisation, the contract kit ---------------------------


LIBRARY: list[tuple[Processor, set[str]]] = [
    (StepModelRouter(), set()),
    (CostModelRouter(budget_tokens=10**9), set()),
    (SystemPromptTemplate(), {"task_start"}),
    (HistoryWindow(keep_last=4), {"step_start"}),
    (ObservationTrim(max_chars=500), {"after_tool"}),
    (VisitedStates(ignore=(r"Moves: \d+",)), {"before_model"}),
    (TaskNotes(), {"before_model"}),
    (ToolFilter(allow=("act",)), {"task_start"}),
    (ToolWhitelist(allow=("act",)), {"before_tool", "after_tool"}),
    (ToolWhitelist(deny=("shell",), mode="intercept"), {"before_tool"}),
    (ToolCallCorrector(), {"before_tool"}),
]


@pytest.mark.parametrize(("proc", "changes"), LIBRARY, ids=lambda p: type(p).__name__ if isinstance(p, Processor)
                         else None)
async def test_contract_kit_passes_every_processor(proc: Processor, changes: set[str]) -> None:
    report = await check_processor(proc)
    assert set(report.hooks) == set(type(proc).accepted_hooks())
    assert report.changed == changes  # the kit exercised the transforming path, within the contracts
    assert not report.interrupted


async def test_contract_kit_sees_a_routing_decision() -> None:
    report = await check_processor(StepModelRouter(schedule=((1, "main"), (2, "cheap"))))
    assert report.changed == {"before_model"} and not report.interrupted


class _Renamer(Processor, kw_only=True, dict=True):
    """Changes the task id at task_start, which no contract permits."""

    name = "test_d1d4_renamer"
    dimension = "D2"

    async def process(self, event: TaskStart) -> AsyncIterator[TaskStart]:
        yield msgspec.structs.replace(event, task=msgspec.structs.replace(event.task, id="other"))


class _Mutator(Processor, kw_only=True, dict=True):
    """Mutates the tool input in place."""

    name = "test_d1d4_mutator"
    dimension = "D4"

    async def process(self, event: BeforeTool) -> AsyncIterator[BeforeTool]:
        event.call.input["hacked"] = True
        yield event


class _Nameless(Processor, kw_only=True, dict=True):
    """Declares no dimension."""

    name = "test_d1d4_nameless"

    async def process(self, event: StepStart) -> AsyncIterator[StepStart]:
        yield event


async def test_contract_kit_catches_bad_processors() -> None:
    with pytest.raises(ContractViolation, match="task"):
        await check_processor(_Renamer())
    with pytest.raises(KitFailure, match="mutated"):
        await check_processor(_Mutator())
    with pytest.raises(KitFailure, match="dimension"):
        await check_processor(_Nameless())
    assert len(scenario()) > 20


def test_library_registry_and_serialisation() -> None:
    names = {"step_model_router", "cost_model_router", "system_prompt_template", "history_window",
             "observation_trim", "visited_states", "task_notes", "tool_filter", "tool_whitelist",
             "tool_call_corrector"}
    reg = registered()
    assert names <= set(reg)
    dims = {n: reg[n].dimension for n in names}
    assert {d for d in dims.values()} == {"D1", "D2", "D3", "D4"}
    assert StepModelRouter.group() == CostModelRouter.group() == "model_router"
    harness = (HarnessConfig()
               .attach("task_start", SystemPromptTemplate(mode="append"))
               .attach("task_start", ToolFilter(deny=("shell",)))
               .attach(["task_start", "before_tool"], ToolCallCorrector(enum_cutoff=0.8))
               .attach("step_start", HistoryWindow(keep_last=6))
               .attach(["before_model", "after_model"], CostModelRouter(budget_usd=0.5, usd_per_mtok={"a:b": 3.0}))
               .attach("after_tool", ObservationTrim(max_chars=1000))
               .attach(["after_tool", "before_model"], VisitedStates(ignore=(r"Moves: \d+",)))
               .attach(["after_tool", "before_model"], TaskNotes())
               .attach(["before_tool", "after_tool"], ToolWhitelist(allow=("act",))))
    for fmt in ("json", "yaml", "toml"):
        again = HarnessConfig.loads(harness.dumps(fmt), fmt)
        assert again == harness and again.digest == harness.digest
    swapped = harness.replace("model_router", StepModelRouter(schedule=((1, "main"), (10, "strong"))))
    assert [type(p).type_name() for p in swapped.at("before_model")] == [
        "task_notes", "step_model_router", "visited_states"]  # PRE first, then attach order
    assert HarnessConfig.loads(swapped.dumps("toml"), "toml").digest == swapped.digest
