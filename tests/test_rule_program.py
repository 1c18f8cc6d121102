"""The rule language and its interpreter ``rule_program``: matching, narrowing, the hooks, bad programs, a real game.

The language is driven as the interpreter reads it (``AttemptView``, ``matches``, ``holds``,
``narrow``), then through real hook pipelines and the run loop (a scripted model, then the
``random:`` agent in TextWorldExpress coin under ``hx run``), then with programs that must
be refused when the harness is built, in one line from the command.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hx_cli import error_line, ok
from hx_cli import hx as hx_command

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx.harness.config import HarnessConfig
from hx.harness.edits import describe
from hx.harness.errors import CompositionError
from hx.harness.processor import build
from hx.harnesses import starter_harness
from hx.processors import ActionPruner, RuleProgram
from hx.processors._choices import action_of, choices, offer
from hx.processors._rule_view import AttemptView, content, holds, matches, number_in, words
from hx.processors.rule_program import narrow
from hx.processors.testing import check_processor
from hx.runtime.loop import BLOCKED
from hx.runtime.models import ModelConfig
from hx.runtime.pipeline import HookPipeline
from hx.runtime.task import FunctionTool, Task, Tool
from schemas.edits import AddRule
from schemas.event import Event
from schemas.history import resolve_async
from schemas.hooks import AfterTool, BeforeModel, BeforeTool, HookName, HookPayload, HookRecord, TaskStart
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.rules import (
    AnyCondition,
    Avoid,
    Did,
    ForbidRepeat,
    LastObservation,
    NotDid,
    Pattern,
    Prefer,
    ReadText,
    RequireBefore,
    Revisited,
    Rule,
    RuleSupport,
    Says,
    ShownAfter,
    TaskText,
    sentence,
)
from schemas.tools import VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import TRACE, trace_filter, trace_subject


def act(*actions: str) -> ToolSchema:
    """A text game's tool: one enumerated property listing the actions valid now."""
    return ToolSchema(name="act", description="Do one thing.", input_schema={
        "type": "object", "required": ["action"], "properties": {"action": {"type": "string", "enum": list(actions)}}})


def kitchen() -> AttemptView:
    """An attempt that read a task, an opening, a cookbook, then looked around."""
    view = AttemptView("Cook the red potato and eat the meal.")
    view.opening("You are in the kitchen. You see a fridge and a cookbook.")
    view.took("read cookbook", "Recipe: slice the red potato, fry the red potato.")
    view.took("look around", "You are in the kitchen. You see a knife and a stove.")
    return view


def kept(rules: list[Rule], offered: tuple[str, ...], view: AttemptView | None = None) -> list[str]:
    """What ``narrow`` leaves of ``offered`` under the program."""
    return narrow(rules, offered, view or AttemptView())


# --- matching: words, patterns, texts ---------------------------------------------------------


def test_starts_and_mentions_match_whole_words_only() -> None:
    view = AttemptView()
    eat = Pattern(starts="eat")
    assert matches(eat, "eat apple", view) and matches(eat, "Eat  the Apple", view) and matches(eat, "eat", view)
    assert not matches(eat, "eaten apple", view) and not matches(eat, "drop eat", view)
    north = Pattern(starts="move north")
    assert matches(north, "move north", view) and not matches(north, "move northwest", view)
    assert not matches(north, "move south", view)
    key = Pattern(mentions=("key",))
    assert matches(key, "take brass key", view) and not matches(key, "take keyring", view)
    both = Pattern(starts="put", mentions=("apple", "box"))
    assert matches(both, "put apple in box", view) and not matches(both, "put apple in bag", view)
    assert matches(Pattern(), "anything at all", view)  # the empty pattern is every action


def test_words_content_and_numbers() -> None:
    assert words("Open the DOOR to north!") == ("open", "the", "door", "to", "north")
    assert content("put 45 olives in the box", "put") == {"45", "olives", "box"}
    assert content("put 45 olives in the box") == {"put", "45", "olives", "box"}  # no leading words: all
    assert content("take it out of the fridge", "take") == {"fridge"}  # function words name nothing
    assert content("open door", "close") == {"open", "door"}  # starts that do not lead: nothing cut
    assert number_in("put 45 olives in box 3") == 3.0 and number_in("add 0.5 cups") == 0.5
    assert number_in("look around") is None


def test_named_in_reads_each_kind_of_text() -> None:
    view = kitchen()

    def names(text: Any, action: str) -> bool:
        return matches(Pattern(starts="take", named_in=text), action, view)

    # the task: potato and meal, not the knife the attempt saw
    assert names(TaskText(), "take red potato") and not names(TaskText(), "take knife")
    # the last observation: after two actions, what look around showed, not the opening's fridge
    assert names(LastObservation(), "take knife") and not names(LastObservation(), "take fridge")
    # all text read: task, opening and every observation
    assert names(ReadText(), "take fridge") and names(ReadText(), "take knife") and names(ReadText(), "take meal")
    assert not names(ReadText(), "take spoon")
    # what an action of a kind showed: the cookbook names the potato, looking around the knife
    recipe = ShownAfter(action=Pattern(starts="read"))
    assert names(recipe, "take red potato") and not names(recipe, "take knife")
    assert not names(recipe, "take red potato and knife")  # every content word must be in the text


def test_not_named_in_is_its_complement_and_an_action_naming_nothing_is_in_every_text() -> None:
    view = kitchen()
    odd = Pattern(starts="take", not_named_in=TaskText())
    assert matches(odd, "take knife", view) and not matches(odd, "take the red potato", view)
    assert matches(odd, "take red potato and knife", view)  # some word not in the task
    bare = Pattern(starts="inventory", named_in=TaskText())
    assert matches(bare, "inventory", view)  # nothing named after the leading words: named only things in the task
    assert not matches(Pattern(starts="inventory", not_named_in=TaskText()), "inventory", view)


def test_the_last_observation_before_any_action_is_the_opening() -> None:
    view = AttemptView("Find the coin.")
    view.opening("You are in the hall. A door leads north.")
    assert matches(Pattern(starts="open", named_in=LastObservation()), "open door", view)
    view.took("move east", "You are in the yard.")
    assert not matches(Pattern(starts="open", named_in=LastObservation()), "open door", view)


# --- sentences: how a rule reads in `hx ledger`, `hx export` and `hx report` -------------------------


@pytest.mark.parametrize(("rule", "words_of"), [
    (Rule(do=Avoid(what=Pattern(starts="eat", not_named_in=TaskText()))),
     "avoid `eat …` that names something not in the task"),
    (Rule(do=Prefer(what=Pattern(starts="take", named_in=ShownAfter(action=Pattern(starts="read"))))),
     "prefer `take …` that names only things in what `read …` showed"),
    (Rule(do=Prefer(what=Pattern(mentions=("key",)), order="least")),
     "prefer `… key`, the one naming the least number"),
    (Rule(do=RequireBefore(first=Pattern(starts="read", mentions=("cookbook",)), then=Pattern(starts="cook"))),
     "do `cook …` only after `read … cookbook`"),
    (Rule(do=ForbidRepeat(what=Pattern(starts="open")), at="before_tool"), "never repeat `open …` (refusing the call)"),
    (Rule(do=Avoid(what=Pattern(starts="move")), when=(Says(text=LastObservation(), words=("dark",)),)),
     "avoid `move …` when the last observation says 'dark'"),
    (Rule(do=Prefer(what=Pattern(starts="look")), when=(Did(action=Pattern(starts="move"), within=1),)),
     "prefer `look …` when `move …` was just done"),
    (Rule(do=Prefer(what=Pattern(starts="look")), when=(Did(action=Pattern(starts="move"), within=3),
                                                         NotDid(action=Pattern(starts="read")))),
     "prefer `look …` when `move …` was done in the last 3 actions and `read …` was not done yet"),
    (Rule(do=Avoid(what=Pattern(starts="inventory")), when=(Revisited(times=2), Did(action=Pattern(starts="look")))),
     "avoid `inventory …` when the state was visited 2 time(s) before and `look …` was done earlier"),
])
def test_every_kind_reads_as_a_plain_sentence(rule: Rule, words_of: str) -> None:
    assert sentence(rule) == words_of


# --- conditions -------------------------------------------------------------------------------


def test_says_needs_every_word_whole_in_its_text() -> None:
    view = kitchen()
    assert holds(Says(text=LastObservation(), words=("knife", "stove")), view)
    assert not holds(Says(text=LastObservation(), words=("knife", "fridge")), view)
    assert not holds(Says(text=LastObservation(), words=("kni",)), view)
    assert holds(Says(text=TaskText(), words=("meal",)), view)
    assert holds(Says(text=ShownAfter(action=Pattern(starts="read")), words=("fry",)), view)


def test_did_within_and_not_did_read_the_actions_taken() -> None:
    view = AttemptView()
    for action in ("move north", "look around", "look around"):
        view.took(action, "")
    north = Pattern(starts="move")
    assert holds(Did(action=north), view) and holds(Did(action=north, within=3), view)
    assert not holds(Did(action=north, within=2), view)
    assert holds(Did(action=Pattern(starts="look"), within=1), view)
    assert not holds(NotDid(action=north), view) and holds(NotDid(action=Pattern(starts="open")), view)


def test_revisited_counts_the_visits_of_the_current_state_before_this_one() -> None:
    view = AttemptView()
    view.enter("hall")
    assert not holds(Revisited(), view)
    view.enter("yard")
    view.enter("hall")
    assert holds(Revisited(times=1), view) and not holds(Revisited(times=2), view)
    view.enter("hall")
    assert holds(Revisited(times=2), view)


# --- narrow: the two passes -------------------------------------------------------------------


def test_restrictions_apply_before_preferences_whatever_the_program_order() -> None:
    offered = ("take knife", "take apple", "look")
    program = [Rule(do=Prefer(what=Pattern(mentions=("knife",)))), Rule(do=Avoid(what=Pattern(mentions=("knife",))))]
    # preferring first would leave only the knife, which the avoidance could then not take away
    assert kept(program, offered) == ["take apple", "look"]
    assert kept([Rule(do=Prefer(what=Pattern(starts="take"))), program[1]], offered) == ["take apple"]


def test_a_rule_that_would_leave_nothing_is_passed_over() -> None:
    avoid_look = Rule(do=Avoid(what=Pattern(starts="look")))
    avoid_take = Rule(do=Avoid(what=Pattern(starts="take")))
    assert kept([avoid_look], ("look",)) == ["look"]
    # restrictions in program order: the first applies, the second would empty the offer
    assert kept([avoid_look, avoid_take], ("look", "take key")) == ["take key"]
    assert kept([avoid_take, avoid_look], ("look", "take key")) == ["look"]
    assert kept([Rule(do=Prefer(what=Pattern(starts="open")))], ("look", "take key")) == ["look", "take key"]


def test_prefer_keeps_the_order_of_the_offer_and_the_least_or_most_number() -> None:
    offered = ("look", "put 45 olives in box", "put 3 apples in box", "put 12 pears in box", "put lid on box")
    put = Pattern(starts="put")
    assert kept([Rule(do=Prefer(what=put))], offered) == list(offered[1:])
    assert kept([Rule(do=Prefer(what=put, order="least"))], offered) == ["put 3 apples in box"]
    assert kept([Rule(do=Prefer(what=put, order="most"))], offered) == ["put 45 olives in box"]
    assert kept([Rule(do=Prefer(what=Pattern(), order="least"))], ("look", "move 7", "move 2")) == ["move 2"]
    # none of them names a number: the order chooses nothing among them
    assert kept([Rule(do=Prefer(what=put, order="least"))], ("look", "put lid on box")) == ["put lid on box"]


def test_require_before_holds_back_then_until_first_was_taken() -> None:
    rule = Rule(do=RequireBefore(first=Pattern(starts="read"), then=Pattern(starts="cook")))
    offered = ("read cookbook", "cook potato", "look")
    view = AttemptView()
    assert kept([rule], offered, view) == ["read cookbook", "look"]
    view.took("look", "A kitchen.")
    assert kept([rule], offered, view) == ["read cookbook", "look"]
    view.took("read cookbook", "Recipe: cook the potato.")
    assert kept([rule], offered, view) == list(offered)


def test_forbid_repeat_holds_back_only_matching_actions_already_taken() -> None:
    rule = Rule(do=ForbidRepeat(what=Pattern(starts="open")))
    offered = ("open door", "open box", "look")
    view = AttemptView()
    view.took("open door", "Opened.")
    view.took("look", "A room.")
    assert kept([rule], offered, view) == ["open box", "look"]  # look was taken, but is not an `open`


@pytest.mark.parametrize(("condition", "applies"), [
    (Says(text=LastObservation(), words=("stove",)), True),
    (Says(text=LastObservation(), words=("fridge",)), False),
    (Did(action=Pattern(starts="read"), within=2), True),
    (Did(action=Pattern(starts="read"), within=1), False),
    (NotDid(action=Pattern(starts="eat")), True),
    (NotDid(action=Pattern(starts="read")), False),
    (Revisited(times=1), True),
    (Revisited(times=2), False),
], ids=lambda v: v if isinstance(v, bool) else sentence(Rule(do=Avoid(what=Pattern(starts="x")), when=(v,))))
def test_a_condition_gates_its_rule(condition: AnyCondition, applies: bool) -> None:
    view = kitchen()
    view.enter("kitchen")
    view.enter("kitchen")
    offered = ("eat potato", "look")
    rule = Rule(do=Avoid(what=Pattern(starts="eat")), when=(condition,))
    assert kept([rule], offered, view) == (["look"] if applies else list(offered))
    both = Rule(do=Avoid(what=Pattern(starts="eat")), when=(condition, Says(text=TaskText(), words=("meal",))))
    assert kept([both], offered, view) == (["look"] if applies else list(offered))


def test_rules_written_for_before_tool_do_not_narrow_the_offer() -> None:
    rule = Rule(do=Avoid(what=Pattern(starts="eat")), at="before_tool")
    assert kept([rule], ("eat potato", "look")) == ["eat potato", "look"]


# --- the processor in real hook pipelines ---------------------------------------------------


class Pipelines:
    """One attempt's hook pipelines for a harness, as the run loop builds them (fresh instances, contracts checked)."""

    def __init__(self, harness: HarnessConfig) -> None:
        self.events: list[Event] = []
        self.pipes = {hook: HookPipeline(hook, procs, self.events.append)
                      for hook, procs in harness.instantiate().items()}

    async def one(self, hook: HookName, event: HookPayload) -> Any:
        [out] = await self.pipes[hook].run(event, getattr(event, "step", 0))
        assert type(out) is type(event)
        return out

    async def start(self, instruction: str) -> None:
        await self.one("task_start", TaskStart(task=TaskSpec(id="t", instruction=instruction), tools=(act("look"),)))

    async def offer(self, step: int, *actions: str, opening: str = "start") -> tuple[str, ...]:
        event = BeforeModel(step=step, messages=(Message(role="user", content=opening),), tools=(act(*actions),))
        out = await self.one("before_model", event)
        assert choices(offer(out)) == actions  # the whole offer kept
        return choices(out.tools)

    async def call(self, step: int, action: str) -> BeforeTool:
        out: BeforeTool = await self.one("before_tool", BeforeTool(step=step, call=ToolCall(
            id=f"c{step}", name="act", input={"action": action}), offered=("act",)))
        return out

    async def result(self, step: int, action: str, output: str, *, error: bool = False) -> AfterTool:
        call = ToolCall(id=f"c{step}", name="act", input={"action": action})
        out: AfterTool = await self.one("after_tool", AfterTool(step=step, call=call, result=ToolResult(
            call_id=call.id, name="act", output=output, is_error=error)))
        return out


def returned_models(events: list[Event]) -> list[BeforeModel]:
    """The before_model events the pipelines returned (what the model was sent), in order."""
    return [e.event for e in events
            if isinstance(e, HookRecord) and e.stage == "returned" and isinstance(e.event, BeforeModel)]


def program(*rules: Rule) -> HarnessConfig:
    return HarnessConfig().attach(RuleProgram.accepted_hooks(), RuleProgram(rules=rules))


async def test_the_processor_reads_the_attempt_and_narrows_the_offer() -> None:
    room = ("look", "read cookbook", "take knife", "take red potato", "cook red potato")
    harness = program(Rule(do=Avoid(what=Pattern(starts="take", not_named_in=ReadText()))),
                      Rule(do=RequireBefore(first=Pattern(starts="read"), then=Pattern(starts="cook"))),
                      Rule(do=Prefer(what=Pattern(starts="take", named_in=ShownAfter(action=Pattern(starts="read"))))))
    attempt = Pipelines(harness)
    await attempt.start("Cook the meal.")
    # the opening names the knife; nothing was read from the cookbook, so no take is preferred yet
    assert await attempt.offer(1, *room, opening="A kitchen with a knife.") == ("look", "read cookbook", "take knife")
    await attempt.result(1, "read cookbook", "Recipe: the red potato, cooked.")
    assert await attempt.offer(2, *room) == ("take red potato",)  # read: the preference and the cook hold
    await attempt.result(2, "take red potato", "Taken.")
    assert await attempt.offer(3, *room) == ("take red potato",)
    assert [e.offered for e in returned_models(attempt.events)] == [(act(*room),)] * 3


async def test_it_composes_with_an_earlier_narrowing_processor() -> None:
    harness = program(Rule(do=Avoid(what=Pattern(starts="look")))).attach(ActionPruner.accepted_hooks(),
                                                                         ActionPruner())
    attempt = Pipelines(harness)
    await attempt.start("Go.")
    assert await attempt.offer(1, "look", "move north", "move east") == ("move north", "move east")
    await attempt.result(1, "move north", "You can't go that way.")
    # the pruner took move north away first; the rule leaves move east, never nothing
    assert await attempt.offer(2, "look", "move north", "move east") == ("move east",)
    await attempt.result(2, "move east", "You can't go that way.")
    assert await attempt.offer(3, "look", "move north", "move east") == ("look",)


async def test_a_before_tool_rule_refuses_the_call_and_says_why() -> None:
    rule = Rule(do=Avoid(what=Pattern(starts="eat")), at="before_tool")
    attempt = Pipelines(program(rule))
    await attempt.start("Eat well.")
    assert await attempt.offer(1, "eat apple", "look") == ("eat apple", "look")  # not a before_model rule
    refused = await attempt.call(1, "Eat apple")
    assert not refused.approved
    explained = await attempt.result(1, "Eat apple", BLOCKED)
    assert explained.result.output == f"{BLOCKED}: the harness's rule: avoid `eat …` (refusing the call)"
    assert explained.result.is_error
    assert (await attempt.call(2, "look")).approved
    plain = await attempt.result(2, "look", "An orchard.")
    assert plain.result.output == "An orchard."


async def test_a_before_tool_rule_never_refuses_the_only_way_on() -> None:
    """Where every action offered matches the rule, the call goes through: refusing it would leave the model nothing
    to do but be refused again until the step budget ends the attempt."""
    attempt = Pipelines(program(Rule(do=Avoid(what=Pattern(starts="eat")), at="before_tool")))
    await attempt.start("Eat well.")
    await attempt.offer(1, "eat apple", "eat pear")
    assert (await attempt.call(1, "eat apple")).approved
    await attempt.result(1, "eat apple", "Crunchy.")
    await attempt.offer(2, "eat pear", "look")
    assert not (await attempt.call(2, "eat pear")).approved  # look is offered: the rule refuses


async def test_before_tool_restrictions_follow_the_attempt() -> None:
    once = Rule(do=ForbidRepeat(what=Pattern(starts="open")), at="before_tool")
    order = Rule(do=RequireBefore(first=Pattern(starts="unlock"), then=Pattern(starts="open", mentions=("chest",))),
                 at="before_tool")
    attempt = Pipelines(program(once, order))
    await attempt.start("Open things.")
    assert (await attempt.call(1, "open door")).approved
    await attempt.result(1, "open door", "the episode is over", error=True)  # a failed call was not taken either
    assert (await attempt.call(1, "open door")).approved
    await attempt.result(1, "open door", "Opened.")
    assert not (await attempt.call(2, "open door")).approved
    await attempt.result(2, "open door", BLOCKED)  # a refused call was not taken
    assert not (await attempt.call(3, "open chest")).approved
    await attempt.result(3, "open chest", BLOCKED)
    await attempt.call(4, "unlock chest")
    await attempt.result(4, "unlock chest", "Unlocked.")
    assert (await attempt.call(5, "open chest")).approved


async def test_a_repeat_is_refused_however_the_model_spells_it() -> None:
    # before_tool rules run before tool_call_corrector normalises the call: a repeat is the same words
    attempt = Pipelines(program(Rule(do=ForbidRepeat(what=Pattern(starts="open")), at="before_tool")))
    await attempt.start("Open things.")
    await attempt.call(1, "open door")
    await attempt.result(1, "open door", "Opened.")
    assert not (await attempt.call(2, " Open  Door")).approved
    assert (await attempt.call(3, "open doors")).approved


async def test_one_instance_keeps_nothing_from_one_attempt_to_the_next() -> None:
    rule = Rule(do=ForbidRepeat(what=Pattern(starts="take")), at="before_tool")
    proc = RuleProgram(rules=(rule, Rule(do=RequireBefore(first=Pattern(starts="read"), then=Pattern(starts="cook")))))
    call = ToolCall(id="c1", name="act", input={"action": "take key"})

    async def through(event: HookPayload) -> Any:
        [out] = [e async for e in proc.process(event)]  # type: ignore[arg-type]
        return out

    for _ in range(2):  # the same instance, as a reused harness would hold it: task_start resets it
        await through(TaskStart(task=TaskSpec(id="t", instruction="Take the key."), tools=()))
        menu = await through(BeforeModel(step=1, messages=(), tools=(act("read book", "cook egg"),)))
        assert choices(menu.tools) == ("read book",)
        assert (await through(BeforeTool(step=1, call=call))).approved
        await through(AfterTool(step=1, call=call, result=ToolResult(call_id="c1", name="act", output="Taken.")))
        await through(AfterTool(step=1, call=ToolCall(id="c2", name="act", input={"action": "read book"}),
                                result=ToolResult(call_id="c2", name="act", output="A recipe.")))
        assert not (await through(BeforeTool(step=2, call=call))).approved
    # a refusal of the last attempt explains nothing in the next: another processor's block stays its own
    await through(TaskStart(task=TaskSpec(id="t", instruction="Again."), tools=()))
    other = AfterTool(step=1, call=call, result=ToolResult(call_id="c1", name="act", output=BLOCKED))
    assert (await through(other)).result.output == BLOCKED


async def test_the_contract_kit_passes_a_program_at_every_hook() -> None:
    proc = RuleProgram(rules=(Rule(do=Avoid(what=Pattern(starts="take"))),
                              Rule(do=Avoid(what=Pattern(starts="go")), at="before_tool")))
    report = await check_processor(proc)
    assert set(report.hooks) == {"task_start", "before_model", "before_tool", "after_tool"}
    assert report.changed == {"before_model", "before_tool"} and not report.interrupted
    assert build("rule_program", proc.params()) == proc


# --- the run loop: a refused call never reaches the world, and the model reads why -----------------


class Orchard(Task):
    """An orchard whose ``act`` tool records the actions it ran; the answer ``done`` passes."""

    def __init__(self) -> None:
        self.spec = TaskSpec(id="rules:orchard", instruction="Pick an apple, then say done.")
        self.ran: list[str] = []

    def tools(self) -> list[Tool]:
        return [FunctionTool(act("eat apple", "take apple", "look"), self._act)]

    def _act(self, action: str) -> str:
        self.ran.append(action)
        return f"You {action}."

    async def reset(self) -> str:
        return "You are in an orchard."

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="done", passed=final_answer == "done", score=float(final_answer == "done"))


async def test_the_run_loop_blocks_a_refused_call_and_shows_the_model_the_rule(nats_url: str) -> None:
    rule = Rule(do=Avoid(what=Pattern(starts="eat")), at="before_tool")
    script = {"completions": [{"tool_calls": [{"id": "c1", "name": "act", "input": {"action": "eat apple"}}]},
                              {"tool_calls": [{"id": "c2", "name": "act", "input": {"action": "take apple"}}]},
                              {"content": "done"}]}
    models = ModelConfig(main="script:orchard", provider_options={"script:orchard": script})
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = models.agentic(program(rule), log=conn.log)
        for attempt in range(2):  # the second attempt is refused the same way: nothing carried over
            task = Orchard()
            result = await agent.run(task, run_id="orchard", attempt=attempt)
            assert (result.passed, result.steps, task.ran) == (True, 3, ["take apple"])
            subject = trace_subject("orchard", 0, task.spec.id, attempt)
            seen = returned_models([r.event async for r in resolve_async(conn.log.read(subjects=[subject]))])
            tool_said = [m.content for m in seen[1].messages if m.role == "tool"]
            assert tool_said == [f"{BLOCKED}: the harness's rule: {sentence(rule)}"]


# --- bad programs: refused when the harness is built, in one line from the command ------------------

AVOID_EAT: dict[str, Any] = {"do": {"do": "avoid", "what": {"starts": "eat"}}}


@pytest.mark.parametrize(("rule", "message"), [
    ({**AVOID_EAT, "language": 2},
     "rule 2 (avoid `eat …`): rule language 2 is newer than this hx reads (1); upgrade hx to run it"),
    ({"do": {"do": "prefer", "what": {"starts": "eat"}}, "at": "before_tool"},
     "rule 2 (prefer `eat …` (refusing the call)): prefer cannot act at before_tool"),
    ({"do": {"do": "avoid", "what": {}}},
     "rule 2 (avoid `…`): avoid of every action would narrow the offer to nothing"),
    ({"do": {"do": "forbid_repeat", "what": {}}}, "forbid_repeat of every action would narrow the offer to nothing"),
    ({"do": {"do": "prefer", "what": {}}}, "rule 2 (prefer `…`): prefers every action, so it does nothing"),
    ({"do": {"do": "avoid", "what": {"starts": "Eat"}}}, "starts 'Eat' must be lower-case words separated by single"),
    ({"do": {"do": "avoid", "what": {"starts": "eat  now"}}}, "starts 'eat  now' must be lower-case words"),
    ({"do": {"do": "avoid", "what": {"mentions": ["two words"]}}},
     "mentions: 'two words' is not one lower-case word (letters and digits)"),
    ({"do": {"do": "avoid", "what": {"named_in": {"text": "task"}, "not_named_in": {"text": "task"}}}},
     "named_in and not_named_in are the same text, so it matches no action"),
    ({"do": {"do": "avoid", "what": {"named_in": {"text": "after", "action": {"starts": "Read"}}}}},
     "(the action it follows): starts 'Read' must be lower-case words"),
    ({**AVOID_EAT, "when": [{"if": "says", "text": {"text": "last"}, "words": []}]},
     "condition 1: says needs at least one word"),
    ({**AVOID_EAT, "when": [{"if": "revisited"}, {"if": "says", "text": {"text": "last"}, "words": ["Dark"]}]},
     "condition 2: 'Dark' is not one lower-case word"),
    ({**AVOID_EAT, "when": [{"if": "did", "action": {"starts": "go"}, "within": -1}]},
     "condition 1: within must be >= 0 (0: at any time)"),
    ({**AVOID_EAT, "when": [{"if": "not_did", "action": {"mentions": ["A"]}}]}, "condition 1: mentions: 'A' is not"),
    ({**AVOID_EAT, "when": [{"if": "revisited", "times": 0}]}, "condition 1: times must be >= 1"),
    ({"do": {"do": "require_before", "first": {"starts": "cook", "mentions": ["meal"]}, "then": {"starts": "cook"}}},
     "`then` also holds back the `first` actions, so they could never be taken"),
    ({"do": {"do": "require_before", "first": {"starts": "Read"}, "then": {"starts": "cook"}}},
     "rule 2 (do `cook …` only after `Read …`): first: starts 'Read'"),
    ({"do": {"do": "explode", "what": {"starts": "eat"}}}, "Invalid value 'explode' - at `$.rules[1].do.do`"),
    ({**AVOID_EAT, "at": "after_tool"}, "Invalid enum value 'after_tool' - at `$.rules[1].at`"),
    ({"do": {"do": "prefer", "what": {"starts": "put"}, "order": "middle"}}, "Invalid enum value 'middle'"),
], ids=lambda v: "" if isinstance(v, dict) else v.split(":")[-1].strip()[:40])
def test_a_bad_rule_is_refused_at_build_naming_it(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(CompositionError) as caught:
        build("rule_program", {"rules": [AVOID_EAT, rule]})
    assert str(caught.value).startswith("processor 'rule_program': bad parameters: ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def harness_file(tmp_path: Path, *rules: dict[str, Any]) -> Path:
    """A harness file as a user writes one: the starter harness for text games and a rule program."""
    data = yaml.safe_load(starter_harness("textworld").dumps("yaml"))
    data["processors"].append({"type": "rule_program", "hooks": list(RuleProgram.accepted_hooks()),
                               "params": {"rules": list(rules)}})
    path = tmp_path / "harness.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("rule", "message"), [
    ({"do": {"do": "avoid", "what": {}}},
     "processor 'rule_program': bad parameters: rule 1 (avoid `…`): avoid of every action would narrow the "
     "offer to nothing"),
    ({**AVOID_EAT, "language": 2},
     "processor 'rule_program': bad parameters: rule 1 (avoid `eat …`): rule language 2 is newer than this "
     "hx reads (1); upgrade hx to run it"),
], ids=["avoids every action", "newer language"])
def test_hx_run_refuses_a_bad_program_in_one_line_and_writes_nothing(tmp_path: Path, rule: dict[str, Any],
                                                                     message: str) -> None:
    path = harness_file(tmp_path, rule)
    data = tmp_path / "data"
    line = error_line(hx_command("--data-dir", str(data), "run", "--bench", "twx:coin", "--tasks", "1", "--harness",
                         str(path), "--run-id", "bad-rules"))
    assert line == f"error: {path}: {message}"  # the file, the rule and why
    assert not data.exists()  # no results file, no embedded server, no log


# --- docs/rules.md: its examples are what this hx reads, its sentences what it prints -----------------

RULES_DOC = Path(__file__).resolve().parents[1] / "docs" / "rules.md"
BLOCK = re.compile(r"(<!-- rejected -->\n)?```(yaml|text)\n(.*?)```", re.S)


def test_the_rules_doc_shows_what_hx_reads_and_prints() -> None:
    doc = RULES_DOC.read_text()
    blocks = BLOCK.findall(doc)
    texts = [body for _, kind, body in blocks if kind == "text"]
    examples = 0
    for rejected, kind, body in blocks:
        if kind != "yaml":
            continue
        if body.startswith("processors:"):  # a whole harness: it loads, and the doc says what its rules read
            held = HarnessConfig.loads(body, "yaml")
            [proc] = [p for p in held.instantiate()["before_model"] if isinstance(p, RuleProgram)]
            assert all(sentence(r) in " ".join(doc.split()) for r in proc.rules)
            continue
        rules = yaml.safe_load(body)
        if rejected:
            with pytest.raises(CompositionError) as caught:
                build("rule_program", {"rules": rules})
            assert any(line == f"error: harness.yaml: {caught.value}" for t in texts for line in t.splitlines())
            continue
        [rule] = RuleProgram(rules=tuple(msgspec.convert(rules, list[Rule]))).rules
        assert body.splitlines()[0] == f"# {sentence(rule)}"
        examples += 1
    assert examples >= 13  # one for every text, pattern field, condition and effect
    odd = Rule(do=Avoid(what=Pattern(starts="eat", not_named_in=TaskText())))
    assert describe(AddRule(rule=odd, support=RuleSupport(method="fatal", attempts=14, tasks=3))) + "\n" in texts
    refusing = Rule(do=Avoid(what=Pattern(starts="eat")), at="before_tool")
    assert f"{BLOCKED}: the harness's rule: {sentence(refusing)}\n" in texts


# --- end to end: the random agent in TextWorldExpress coin, under `hx run` ---------------------------


async def played(nats_url: str, run_id: str) -> list[Any]:
    """The trace events of a run: each step's whole offer, what the model saw and the calls made."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        return [(r.subject, r.event) async for r in conn.log.read(TRACE.name, subjects=[trace_filter(run_id)])
                if isinstance(r.event, HookRecord) and r.event.stage == "returned"]


def steps_of(records: list[Any]) -> list[tuple[tuple[str, ...], tuple[str, ...], str, bool]]:
    """Per step: the whole offer, the actions the model was offered, the action it called, whether it ran."""
    offers: dict[tuple[str, int], tuple[tuple[str, ...], tuple[str, ...]]] = {}
    out = []
    for subject, record in records:
        event = record.event
        if isinstance(event, BeforeModel):
            offers[subject, record.step] = (choices(offer(event)), choices(event.tools))
        elif isinstance(event, BeforeTool):
            whole, shown = offers[subject, record.step]
            out.append((whole, shown, action_of(event.call) or "", event.approved))
    return out


def test_the_random_agent_never_takes_an_avoided_action_in_coin(tmp_path: Path, nats_url: str) -> None:
    close = Pattern(starts="close")
    rules = (Rule(do=Avoid(what=close)), Rule(do=Avoid(what=Pattern(starts="inventory")), at="before_tool"))
    harness = starter_harness("textworld").attach(RuleProgram.accepted_hooks(), RuleProgram(rules=rules))
    base = ("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--bench", "twx:coin", "--tasks", "4",
            "--attempts", "2", "--max-steps", "30")
    plain = starter_harness("textworld")
    ok(hx_command(*base, "--harness", str(harness.save(tmp_path / "rules.yaml")), "--run-id", "rules"))
    ok(hx_command(*base, "--harness", str(plain.save(tmp_path / "plain.yaml")), "--run-id", "plain"))
    view = AttemptView()
    for run_id, ruled in (("rules", True), ("plain", False)):
        steps = steps_of(asyncio.run(played(nats_url, run_id)))
        assert len(steps) > 100
        choice = [(whole, action) for whole, _, action, ran in steps
                  if any(matches(close, a, view) for a in whole) and not all(matches(close, a, view) for a in whole)]
        assert len(choice) > 20  # the game offered `close` beside other actions often enough to tell
        closed = [action for _, action in choice if matches(close, action, view)]
        inventory = [ran for _, _, action, ran in steps if action == "inventory"]
        if ruled:
            assert closed == []  # never chosen while anything else was offered
            assert all(not any(matches(close, a, view) for a in shown) or all(matches(close, a, view) for a in whole)
                       for whole, shown, _, _ in steps)
            assert inventory and not any(inventory)  # the model was offered it, the harness refused every call
        else:
            assert len(closed) > 5 and inventory and all(inventory)  # without the rules the agent does both
