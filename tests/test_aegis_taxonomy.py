"""The failure taxonomy on its own: every category from realistic attempt facts, the order that decides between
them, the thresholds, and how refusals and invalid actions are read off the trace."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from hx.aegis.evidence import REFUSAL, AttemptFacts, _fold
from hx.aegis.taxonomy import (
    INVALID_SHARE,
    LOOP_PERIODS,
    LOOP_REPEATS,
    LOOP_TAIL,
    STAGNANT_MIN,
    STAGNANT_SHARE,
    categorise,
    features,
)
from schemas.edits import Anchor
from schemas.envelope import Record
from schemas.event import Event
from schemas.hooks import ProcessorTriggered
from schemas.landscape import FAILURE_CATEGORIES
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import ToolCall
from schemas.tools import EnvObservation, ToolInvoked

TASK = "twx:coin:dev:7"
OPENING = "You are in the kitchen. There is a door to the east."


def walk(actions: Sequence[str], observations: Sequence[str], **fields: object) -> AttemptFacts:
    """Facts of an attempt that took ``actions`` and saw ``observations`` (after the opening), one each."""
    assert len(actions) == len(observations)
    defaults: dict[str, object] = {"status": "budget_exhausted", "steps": len(actions),
                                   "scores": [0.0] * (len(actions) + 1)}
    defaults.update(fields)
    return AttemptFacts(TASK, 0, 0, actions=list(actions), observations=[OPENING, *observations],
                        **defaults)  # type: ignore[arg-type]


def explore(n: int, **fields: object) -> AttemptFacts:
    """An attempt of ``n`` different actions, each seeing something new."""
    return walk([f"examine object {i}" for i in range(n)], [f"You see object {i}, nothing special." for i in range(n)],
                **fields)


def cycle(prefix: int, period: int, repeats: int, **fields: object) -> AttemptFacts:
    """``prefix`` fresh steps, then a cycle of ``period`` (action, observation) pairs repeated ``repeats`` times."""
    acts = [f"examine object {i}" for i in range(prefix)]
    obs = [f"You see object {i}." for i in range(prefix)]
    for _ in range(repeats):
        acts += [f"go {d}" for d in ("east", "west", "north")[:period]]
        obs += [f"You are in room {d}." for d in ("east", "west", "north")[:period]]
    return walk(acts, obs, **fields)


def shuttle(n: int, **fields: object) -> AttemptFacts:
    """``n`` different actions that leave the agent bouncing between two rooms (stale, but no cycle)."""
    rooms = ("You are in the hall.", "You are in the study.")
    return walk([f"try thing {i}" for i in range(n)], [rooms[i % 2] for i in range(n)], **fields)


REALISTIC: dict[str, Callable[[], AttemptFacts]] = {
    "infrastructure": lambda: AttemptFacts(TASK, 0, 0, status="infra_failure",
                                           reason="provider error: connection reset"),
    "interrupted": lambda: cycle(2, 1, 8, status="interrupted",
                                 interrupts=[("loop_detector", "loop_detector: go east repeated 6 times")]),
    "premature_answer": lambda: explore(3, status="completed", env_done=False, scores=[0.0, 0.0, 0.5, 0.5]),
    "env_failure": lambda: explore(4, status="completed", env_done=True, env_failure=True),
    "loop": lambda: cycle(6, 2, LOOP_REPEATS + 2),
    "invalid_action": lambda: explore(12, refused=3, invalid=1),
    "stagnation": lambda: shuttle(20),
    "no_progress": lambda: explore(30),
    "partial_progress": lambda: explore(30, scores=[0.0] * 10 + [0.25] * 21),
}


def test_the_examples_cover_the_whole_taxonomy() -> None:
    """Every category of the taxonomy has a realistic example below (and nothing else does)."""
    assert tuple(REALISTIC) == FAILURE_CATEGORIES


@pytest.mark.parametrize("category", FAILURE_CATEGORIES)
def test_each_category_is_reachable_from_a_realistic_attempt(category: str) -> None:
    """A failed attempt showing the category's signature is put in that category."""
    assert categorise(REALISTIC[category]()) == category


@pytest.mark.parametrize("category", FAILURE_CATEGORIES)
def test_a_passed_attempt_has_no_category_whatever_its_trace(category: str) -> None:
    """The taxonomy only classifies failures: a pass is None even with a failure's trace features."""
    fact = dataclasses.replace(REALISTIC[category](), passed=True)
    assert categorise(fact) is None


def test_the_first_matching_category_wins_in_taxonomy_order() -> None:
    """Take an attempt showing every signal and strip one at a time: the categories come out in taxonomy order."""
    rooms = ("You are in the hall.", "You are in the study.")
    acts = [*(f"try thing {i}" for i in range(14)), *["go east", "go west"] * LOOP_REPEATS]
    stuck = walk(acts, [rooms[i % 2] for i in range(len(acts))], refused=6)  # stale, refused, looping at the end
    assert features(stuck)["loop"] and features(stuck)["longest_stale"] >= STAGNANT_MIN
    chain: list[tuple[str, AttemptFacts]] = []
    fact = dataclasses.replace(stuck, status="infra_failure", interrupts=[("budget", "budget: token limit")],
                               env_done=True, env_failure=True)
    for category, change in (
        ("infrastructure", {}),
        ("interrupted", {"status": "interrupted"}),
        ("premature_answer", {"status": "completed", "interrupts": [], "env_done": False, "env_failure": False}),
        ("env_failure", {"env_done": True, "env_failure": True}),
        ("loop", {"status": "budget_exhausted", "env_done": False, "env_failure": False}),
    ):
        fact = dataclasses.replace(fact, **change)
        chain.append((category, fact))
    unlooped = shuttle(len(acts), refused=6)  # the same staleness and refusals, no cycle
    chain += [("invalid_action", unlooped), ("stagnation", dataclasses.replace(unlooped, refused=0)),
              ("no_progress", explore(len(acts))),
              ("partial_progress", explore(len(acts), scores=[0.0] * len(acts) + [0.5]))]
    assert tuple(c for c, _ in chain) == FAILURE_CATEGORIES
    assert [categorise(f) for _, f in chain] == [c for c, _ in chain]


def test_an_interrupt_counts_whatever_status_the_attempt_ended_with() -> None:
    """A processor's interrupt makes the attempt ``interrupted`` even when its status says it just ran out."""
    fact = explore(5, status="budget_exhausted", interrupts=[("budget", "budget: tool call limit of 5 reached")])
    assert categorise(fact) == "interrupted"
    assert categorise(explore(5, status="interrupted")) == "interrupted"


def test_stopping_after_winning_the_environment_is_not_premature() -> None:
    """Only an attempt that stopped while the episode was still running is a premature answer."""
    assert categorise(explore(3, status="completed", env_done=False)) == "premature_answer"
    assert categorise(explore(3, status="completed", env_done=True)) == "no_progress"
    assert categorise(explore(3, status="budget_exhausted", env_done=False)) == "no_progress"


@pytest.mark.parametrize("period", LOOP_PERIODS)
def test_a_loop_needs_enough_repeats_of_a_short_cycle(period: int) -> None:
    """A cycle of period <= 3 is a loop at ``LOOP_REPEATS`` repeats, not one repeat fewer."""
    assert categorise(cycle(4, period, LOOP_REPEATS)) == "loop"
    assert categorise(cycle(4, period, LOOP_REPEATS - 1)) != "loop"


def test_a_longer_cycle_or_an_old_loop_is_not_a_loop() -> None:
    """Cycles longer than the longest period, and loops that ended before the last ``LOOP_TAIL`` steps, do not count."""
    acts = [f"go {d}" for d in ("east", "south", "west", "north")] * 4
    obs = [f"You are in room {d}." for d in ("east", "south", "west", "north")] * 4
    assert max(LOOP_PERIODS) < 4
    assert features(walk(acts, obs))["loop"] == 0.0
    old = cycle(0, 1, LOOP_REPEATS + 2)
    fresh_tail = [f"examine object {i}" for i in range(LOOP_TAIL)]
    escaped = walk([*old.actions, *fresh_tail], [*old.observations[1:], *(f"New thing {i}." for i in range(LOOP_TAIL))])
    assert features(old)["loop"] == 1.0
    assert features(escaped)["loop"] == 0.0


def test_a_loop_is_a_repeated_action_with_the_same_result_not_the_same_action() -> None:
    """Repeating an action whose observation keeps changing (a counter ticking) is progress, not a loop."""
    fact = walk(["wait"] * 9, [f"The clock shows {i} o'clock." for i in range(9)])
    assert features(fact)["loop"] == 0.0
    assert categorise(fact) == "no_progress"


def test_the_invalid_share_threshold_adds_refusals_and_invalid_actions() -> None:
    """Refused plus invalid actions at ``INVALID_SHARE`` of the steps make ``invalid_action``; just below do not."""
    n = 20
    at = round(INVALID_SHARE * n)
    assert at / n >= INVALID_SHARE > (at - 1) / n
    assert categorise(explore(n, refused=at - 2, invalid=2)) == "invalid_action"
    assert categorise(explore(n, refused=at - 3, invalid=2)) == "no_progress"


def test_stagnation_needs_a_share_of_the_steps_and_at_least_a_minimum() -> None:
    """A stale run must reach ``STAGNANT_MIN`` steps in a short attempt and ``STAGNANT_SHARE`` of a long one."""
    short = shuttle(STAGNANT_MIN + 1)  # the first two rooms are new: STAGNANT_MIN - 1 stale steps
    assert features(short)["longest_stale"] == STAGNANT_MIN - 1
    assert categorise(short) == "no_progress"
    assert categorise(shuttle(STAGNANT_MIN + 2)) == "stagnation"
    long_steps = 100
    need = STAGNANT_SHARE * long_steps
    assert need > STAGNANT_MIN
    for stale, expected in ((int(need) - 1, "no_progress"), (int(need), "stagnation")):
        fresh = long_steps - stale - 1  # new sights, then the hall (new once), then the hall again and again
        fact = walk([f"poke {i}" for i in range(long_steps)],
                    [*(f"Odd thing {i}." for i in range(fresh)), *["You are in the hall."] * (stale + 1)])
        assert features(fact)["longest_stale"] == stale
        assert categorise(fact) == expected


def test_the_features_report_what_the_category_was_read_from() -> None:
    """The features of a small attempt, worked out by hand."""
    fact = walk(["open door", "go east", "go east", "take coin"],
                ["The door is locked.", "You can't go that way.", "You can't go that way.", "You see no coin."],
                steps=4, refused=3, invalid=1, scores=[0.0, 0.0, 0.1, 0.1, 0.3])
    got = features(fact)
    assert got["steps"] == 4.0
    assert got["refused_share"] == 0.75 and got["invalid_share"] == 0.25
    assert got["repeat_share"] == 0.25  # ("go east", "You can't go that way.") twice: 3 distinct of 4
    assert got["longest_stale"] == 1.0
    assert got["progress"] == pytest.approx(0.3)
    assert got["loop"] == 0.0


def test_features_of_an_attempt_that_never_acted() -> None:
    """An attempt that ended before its first action has zero shares (no division by zero)."""
    got = features(AttemptFacts(TASK, 0, 0, status="infra_failure"))
    assert got == {"steps": 0.0, "refused_share": 0.0, "invalid_share": 0.0, "repeat_share": 0.0,
                   "longest_stale": 0.0, "progress": 0.0, "loop": 0.0}


# --- refusals and invalid actions, as the evidence reader counts them -------------------------


@pytest.mark.parametrize("text", [
    "You can't go that way.",
    "You cannot take the table: it is fixed in place.",
    "Nothing happens.",
    "The door is already open.",
    "You don't see any such thing.",
    "I don't understand that sentence.",
    "There is no such object here.",
    "You are unable to reach the shelf.",
    "YOU SEE NO KEY HERE.",
    "That is not possible right now.",
])
def test_refusal_phrasings_are_recognised(text: str) -> None:
    """Generic English refusals of an environment, in any case."""
    assert REFUSAL.search(text)


@pytest.mark.parametrize("text", [
    "You open the door. The hall lies to the east.",
    "You pick up the cannonball.",
    "You see nothing special about the lamp.",
    "The scanner beeps twice.",
    "Taken. Your score has just gone up by one point.",
    "A canned soup sits on the shelf.",
])
def test_ordinary_observations_are_not_refusals(text: str) -> None:
    """Words that merely contain a refusal's letters (cannonball, nothing special) are not refusals."""
    assert not REFUSAL.search(text)


def record(seq: int, event: Event) -> Record:
    """``event`` as the log would hand it over at sequence ``seq``."""
    return Record(seq=seq, index=0, subject=f"hx.trace.run.0.{TASK}.0", type=type(event).TYPE,
                  version=type(event).VERSION, time_ns=0, event=event)


def folded(events: Sequence[Event]) -> AttemptFacts:
    """The facts of one attempt whose trace holds ``events`` in this order."""
    fact = AttemptFacts(TASK, 0, 0)
    for seq, event in enumerate(events, 1):
        _fold(fact, record(seq, event))
    return fact


def act(step: int, action: str) -> ToolInvoked:
    """The agent acting through the ``act`` tool."""
    return ToolInvoked(step=step, call=ToolCall(id=f"c{step}", name="act", input={"command": action}))


def test_refusals_and_invalid_actions_are_counted_and_anchored_from_the_trace() -> None:
    """The opening never counts as a refusal; later refusals and invalid actions do, anchored at their first place."""
    fact = folded([
        AttemptStarted(run_id="run", round=0, task_id=TASK, attempt=0, harness_digest="sha256:h"),
        EnvObservation(step=0, observation="You can't see the exit from here. You are in a dark cellar."),
        act(1, "go north"),
        EnvObservation(step=1, observation="You can't go that way."),
        act(2, "xyzzy"),
        EnvObservation(step=2, observation="I don't understand that.", info={"invalid": True}),
        act(3, "go east"),
        EnvObservation(step=3, observation="You are in the hall.", score=0.5),
        act(4, "go north"),
        EnvObservation(step=4, observation="You can't go that way."),
        AttemptFinished(run_id="run", round=0, task_id=TASK, attempt=0, passed=False, steps=4,
                        status="budget_exhausted"),
    ])
    assert (fact.refused, fact.invalid) == (3, 1)
    assert fact.harness_digest == "sha256:h" and fact.status == "budget_exhausted" and fact.steps == 4
    assert fact.actions == ["go north", "xyzzy", "go east", "go north"]
    assert len(fact.observations) == 5 and fact.observations[1] == fact.observations[4]  # the same refusal text
    assert fact.scores == [0.0, 0.0, 0.0, 0.5, 0.0]
    assert fact.anchors["refused"] == Anchor(seq=4, note="step 1: You can't go that way.")
    assert fact.anchors["invalid"].seq == 6
    assert fact.anchors["finished"].seq == 11
    assert categorise(fact) == "invalid_action"


def test_observations_are_compared_after_normalising_case_and_spacing() -> None:
    """Two renderings of one observation that differ in case and whitespace count as the same (staleness, loops)."""
    fact = folded([EnvObservation(step=0, observation="You are in the hall."), act(1, "look"),
                   EnvObservation(step=1, observation="you are in   the HALL.\n")])
    assert fact.observations[0] == fact.observations[1]
    assert features(fact)["longest_stale"] == 1.0


def test_processor_triggers_and_interrupts_are_kept_apart() -> None:
    """An interrupting processor is recorded with its reason and anchored; other triggers are counted per group."""
    fact = folded([
        ProcessorTriggered(processor="history_window", group="history_window", hook="step_start", step=1,
                           action="changed", fields=("messages",)),
        ProcessorTriggered(processor="history_window", group="history_window", hook="step_start", step=2,
                           action="changed", fields=("messages",)),
        ProcessorTriggered(processor="budget", group="budget", hook="before_model", step=3, action="interrupted",
                           reason="budget: model call limit of 2 reached (2 used)"),
        AttemptFinished(run_id="run", round=0, task_id=TASK, attempt=0, passed=False, steps=2, status="interrupted",
                        reason="budget: model call limit of 2 reached (2 used)"),
    ])
    assert fact.triggers == {"history_window": 2}
    assert fact.interrupts == [("budget", "budget: model call limit of 2 reached (2 used)")]
    assert fact.anchors["interrupt"].seq == 3 and fact.anchors["interrupt"].note.startswith("budget at before_model")
    assert categorise(fact) == "interrupted"


def test_a_multi_argument_tool_call_is_one_action_named_by_its_arguments() -> None:
    """A call with several inputs becomes one canonical action text, the same for the same inputs in any order."""
    one = ToolInvoked(step=1, call=ToolCall(id="a", name="search", input={"query": "coin", "limit": 3}))
    two = ToolInvoked(step=2, call=ToolCall(id="b", name="search", input={"limit": 3, "query": "coin"}))
    fact = folded([one, two])
    assert fact.actions[0] == fact.actions[1]
    assert "search" in fact.actions[0] and "coin" in fact.actions[0]
