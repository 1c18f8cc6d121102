"""Rule induction (``hx.aegis.induction``): each method on small hand-made attempts, the index agreeing with the
interpreter on real TextWorldExpress attempts, and the same rules whatever the order of the attempts or the process.
(The traces of a real run: ``test_induced_evolver.py``; no game in the code: ``test_induction_generality.py``.)

The hand-made attempts use invented verbs and objects (``press button``, ``pull lever``): the induction must find
its rules in any vocabulary, and no test here needs a game's.
"""

from __future__ import annotations

import itertools
import json
import pickle
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from textworld_express import TextWorldExpressEnv

from hx.aegis.induction import induce
from hx.aegis.induction.index import Corpus, Indexed, head
from hx.aegis.induction.methods import (
    Induced,
    bases,
    fatal,
    precedence,
    qualified,
    repeat,
    rising,
)
from hx.aegis.induction.traces import AttemptTrace, Step, credit
from hx.aegis.settings import InductionSettings
from hx.environments.twx import GAME_OPTIONS
from hx.processors._rule_view import AttemptView, matches
from hx.processors.rule_program import narrow
from schemas.edits import Anchor
from schemas.rules import (
    AnyText,
    Avoid,
    ForbidRepeat,
    LastObservation,
    Pattern,
    Prefer,
    ReadText,
    RequireBefore,
    Rule,
    ShownAfter,
    TaskText,
    sentence,
)

ROOT = Path(__file__).resolve().parent.parent
MENU = ("look", "press button", "pull lever")
"""What every hand-made step offers: three kinds of action, so a rule on one leaves the others."""
_seq = itertools.count(1)


def step(action: str, shows: str = "nothing happens", *, rose: bool = False, fatal: bool = False,
         offered: tuple[str, ...] = MENU) -> Step:
    """One hand-made step, anchored at a position of its own."""
    return Step(action=action, observation=shows, offered=offered, rose=rose, fatal=fatal,
                anchor=Anchor(seq=next(_seq), note=action))


def attempt(task: str, *steps: Step, n: int = 0, instruction: str = "", passed: bool = False) -> AttemptTrace:
    """One hand-made attempt of ``task`` (its ``n``-th), opening on a plain room."""
    return AttemptTrace(task=task, attempt=n, trace_round=0, instruction=instruction, opening="a grey room",
                        passed=passed, steps=list(steps))


def falls(task: str, n: int = 0, instruction: str = "") -> AttemptTrace:
    """An attempt that looks around, then pulls the lever and fails on it."""
    return attempt(task, step("look", "a grey room"), step("pull lever", "the floor gives way", fatal=True), n=n,
                   instruction=instruction)


def opens(task: str, first: str = "look", instruction: str = "") -> AttemptTrace:
    """An attempt whose lever pull raises the score (after ``first``) and wins."""
    shown = {"look": "a grey room", "press button": "a click"}[first]
    return attempt(task, step(first, shown), step("pull lever", "the hatch opens", rose=True), passed=True,
                   instruction=instruction)


def rules(found: list[Induced]) -> list[Rule]:
    """The rules alone."""
    return [f.rule for f in found]


def avoid(**pattern: object) -> Rule:
    """An avoid rule."""
    return Rule(do=Avoid(what=Pattern(**pattern)))  # type: ignore[arg-type]


# --- 1. the methods on hand-made attempts ------------------------------------------------------------


def test_an_action_that_ends_attempts_of_enough_tasks_in_failure_becomes_an_avoid_rule() -> None:
    """Pulling the lever ended three tasks' attempts and never raised the score: avoid it, resting on those three."""
    traces = [falls("a"), falls("b"), falls("c")]
    [found] = fatal(Corpus(traces), InductionSettings())
    assert found.rule == avoid(starts="pull")
    assert (found.support.method, found.support.attempts, found.support.tasks, found.support.steps,
            found.support.against) == ("fatal", 3, 3, 3, 0)
    assert found.tasks == ("a", "b", "c") and found.weight == 3.0
    assert found.anchors == tuple(t.steps[1].anchor for t in traces)  # the failing pulls, where the evidence is


def test_score_raising_uses_forbid_the_plain_avoid_but_a_qualifier_that_separates_them_stands() -> None:
    """Where pulling the lever also won tasks that named the lever, the plain avoid is refused; the avoid of a pull
    whose object the task does not name stands, and the interpreter then holds back only those pulls."""
    failing = [falls(t, instruction="press the button") for t in "abc"]
    winning = [opens(t, instruction="pull the lever") for t in "def"]
    found = fatal(Corpus(failing + winning), InductionSettings())
    assert rules(found) == [avoid(starts="pull", not_named_in=TaskText())]
    assert found[0].support.against == 0 and found[0].tasks == ("a", "b", "c")
    assert rules(fatal(Corpus(failing + winning[:0]), InductionSettings())) == [avoid(starts="pull")]

    for task, kept in (("press the button", ["look", "press button"]), ("pull the lever", list(MENU))):
        view = AttemptView(task)
        view.opening("a grey room")
        assert narrow(rules(found), MENU, view) == kept


def test_attempts_of_one_task_count_once_towards_min_support() -> None:
    """Two failing attempts of one task and one of another rest on two tasks: below min_support, no rule; a third
    task's failure makes it one, resting on three tasks and four attempts."""
    s = InductionSettings(min_support=3)
    assert fatal(Corpus([falls("a", 0), falls("a", 1), falls("b")]), s) == []
    [found] = fatal(Corpus([falls("a", 0), falls("a", 1), falls("b"), falls("c")]), s)
    assert (found.support.attempts, found.support.tasks) == (4, 3)


def wins_by_pressing(task: str) -> AttemptTrace:
    """An attempt that looks (nothing comes of it), then presses the button, which raises the score."""
    return attempt(task, step("look", "a grey room"), step("press button", "a click", rose=True), passed=True)


def test_a_rising_action_becomes_a_preference_only_when_its_lift_reaches_min_lift() -> None:
    """Steps that pressed the button raised the score 3 times in 3, the others 0 in 3: a lift of
    ((3 + 1) / (3 + 2)) / ((0 + 1) / (3 + 2)) = 4. It is preferred under min_lift 3.9, not under 4.1."""
    corpus = Corpus([wins_by_pressing(t) for t in "abc"])
    [found] = rising(corpus, InductionSettings(min_lift=3.9))
    assert found.rule == Rule(do=Prefer(what=Pattern(starts="press")))
    assert (found.support.method, found.support.attempts, found.support.tasks) == ("rising", 3, 3)
    assert rising(corpus, InductionSettings(min_lift=4.1)) == []


NUMBERED = ("look", "press 1", "press 2", "press 3")


def test_order_least_prefers_the_least_numbered_action_when_that_is_the_one_that_rose() -> None:
    """Pressing 3 and 2 did nothing, pressing 1 raised the score: preferring any press does not lift enough, the
    least-numbered press does, and the interpreter then offers only ``press 1``."""
    def tries(task: str) -> AttemptTrace:
        return attempt(task, step("press 3", "a hum", offered=NUMBERED), step("press 2", "a hum", offered=NUMBERED),
                       step("press 1", "a chime", rose=True, offered=NUMBERED), passed=True)

    found = rising(Corpus([tries(t) for t in "abc"]), InductionSettings())
    assert rules(found) == [Rule(do=Prefer(what=Pattern(starts="press"), order="least"))]
    assert found[0].support.method == "order"
    view = AttemptView("")
    view.opening("a grey room")
    assert narrow(rules(found), NUMBERED, view) == ["press 1"]


def test_a_fatal_action_that_rose_only_after_another_kind_requires_that_kind_first() -> None:
    """Pulling the lever failed when nothing was pressed and raised the score after a press: require a press
    before a pull (the plain avoid of every pull is refused: the pulls that rose speak against it)."""
    corpus = Corpus([falls(t) for t in "abc"] + [opens(t, first="press button") for t in "def"])
    [found] = precedence(corpus, InductionSettings())
    assert found.rule == Rule(do=RequireBefore(first=Pattern(starts="press"), then=Pattern(starts="pull")))
    assert (found.support.method, found.support.tasks, found.support.against) == ("precedence", 3, 0)
    assert found.tasks == ("a", "b", "c")
    assert avoid(starts="pull") not in rules(fatal(corpus, InductionSettings()))


def dull(task: str) -> AttemptTrace:
    """A failing attempt that looks twice (the same room both times) and presses twice (a different sound)."""
    return attempt(task, step("look", "a grey room"), step("look", "a grey room"), step("press button", "a click"),
                   step("press button", "a clack"))


def test_an_action_whose_repeats_showed_the_same_and_never_rose_is_not_to_be_repeated() -> None:
    """Looking again showed the same room in three failing tasks: never repeat a look; pressing again showed
    something new, so presses may repeat."""
    [found] = repeat(Corpus([dull(t) for t in "abc"]), InductionSettings())
    assert found.rule == Rule(do=ForbidRepeat(what=Pattern(starts="look")))
    assert (found.support.method, found.support.attempts, found.support.tasks, found.support.steps) == (
        "repeat", 3, 3, 3)


def test_a_repeat_that_once_raised_the_score_is_not_forbidden() -> None:
    """One repeated look raised the score: against 1 of 3 (more than max_against's 10 %), no rule."""
    rose = attempt("d", step("look", "a grey room"), step("look", "a grey room", rose=True), passed=True)
    assert repeat(Corpus([*(dull(t) for t in "abc"), rose]), InductionSettings()) == []


def test_credit_marks_the_step_that_named_what_a_later_rising_step_used() -> None:
    """``pull lever 3`` before a rising ``press lever 3 on panel`` enabled it (another verb, what it names within
    what the riser names); the same verb earlier, a step naming nothing, and a step after the rise did not."""
    trace = attempt("a", step("pull lever 3"), step("press lever 3"), step("look"),
                    step("press lever 3 on panel", "a chime", rose=True), step("pull lever 3"))
    credit(trace)
    assert [s.enabled for s in trace.steps] == [True, False, False, False, False]
    assert [s.useful for s in trace.steps] == [True, False, False, True, False]


# --- 2. the index agrees with the interpreter on real attempts -------------------------------------


def play(env: TextWorldExpressEnv, game: str, seed: int, steps: int) -> AttemptTrace:
    """One TextWorldExpress episode (train split) with a random choice among the offered actions, as a trace."""
    rng = random.Random(seed)
    obs, info = env.reset(seed=seed, gameFold="train")
    trace = AttemptTrace(task=f"{game}:{seed}", attempt=0, trace_round=0, instruction=info["taskDescription"],
                         opening=obs)
    offered, score = tuple(sorted(set(info["validActions"]))), 0.0
    for t in range(steps):
        action = rng.choice(offered)
        obs, _, done, info = env.step(action)
        now = float(info["score"])
        trace.steps.append(Step(action, obs, offered, now > score or bool(info["tasksuccess"]),
                                bool(info["taskfailure"]), Anchor(seq=t + 1, note=action)))
        offered, score = tuple(sorted(set(info["validActions"]))), now
        if done:
            break
    trace.passed = bool(info["tasksuccess"])
    credit(trace)
    return trace


@pytest.fixture(scope="module")
def played() -> list[AttemptTrace]:
    """Two random episodes of every TextWorldExpress game hx ships (40 steps at most)."""
    env = TextWorldExpressEnv(envStepLimit=100)
    try:
        out = []
        for game, options in GAME_OPTIONS.items():
            env.load(game, ",".join(f"{k}={v}" for k, v in options.items()))
            out += [play(env, game, seed, 40) for seed in range(2)]
        return out
    finally:
        env.close()


def texts_of(traces: list[AttemptTrace]) -> tuple[list[AnyText], list[AnyText]]:
    """Every kind of text a pattern may read: the task, the last observation, all read, what each kind of action
    showed (the index's fast path); and what a two-word kind, any action naming a door, and a qualified kind showed
    (which the index reads step by step)."""
    kinds = sorted({head(s.action) for t in traces for s in t.steps})
    fast: list[AnyText] = [TaskText(), LastObservation(), ReadText(),
                           *(ShownAfter(action=Pattern(starts=kind)) for kind in kinds)]
    exact: list[AnyText] = [ShownAfter(action=Pattern(starts="look around")),
                            ShownAfter(action=Pattern(mentions=("door",))),
                            ShownAfter(action=Pattern(starts="look", not_named_in=TaskText()))]
    return fast, exact


def patterns_for(action: str, options: list[AnyText], extra: bool = True) -> Iterator[Pattern]:
    """Patterns whose words an action has (its bases, and with ``extra`` every action and those mentioning its last
    word), each qualified by every text: the patterns whose text conditions decide whether they match it."""
    more = (Pattern(), Pattern(mentions=(action.split()[-1],))) if extra else ()
    for base in (*bases(action), *more):
        yield from qualified(base, options)
        yield Pattern(starts=base.starts, mentions=base.mentions, named_in=options[0], not_named_in=options[-1])


def test_the_index_and_the_interpreter_agree_at_every_step_of_real_attempts(played: list[AttemptTrace]) -> None:
    """For every step of random TextWorldExpress attempts, and the taken action and some offered ones, every
    pattern (each qualifier over each text) matches in the index exactly when it does in the interpreter's view
    advanced to that step."""
    fast, exact = texts_of(played)
    rng = random.Random(0)
    compared = 0
    seen: set[tuple[str, bool]] = set()
    for trace in played:
        indexed = Indexed.of(trace)
        view = AttemptView(trace.instruction)
        view.opening(trace.opening)
        for t, s in enumerate(trace.steps):
            for action in sorted({s.action, *rng.sample(s.offered, min(3, len(s.offered)))}):
                todo = itertools.chain(patterns_for(action, fast),
                                       patterns_for(action, exact, extra=False) if action == s.action else ())
                for pattern in todo:
                    said = matches(pattern, action, view)
                    assert indexed.matches(pattern, action, t) == said, (trace.task, t, action, pattern)
                    compared += 1
                    for text in (pattern.named_in, pattern.not_named_in):
                        if text is not None:
                            seen.add((type(text).__name__, said))
            view.took(s.action, s.observation)
    assert compared > 100_000
    # Every kind of text decided some matches both ways: the agreement is not that of patterns that never match.
    assert seen == {(kind.__name__, said) for kind in (TaskText, LastObservation, ReadText, ShownAfter)
                    for said in (True, False)}


# --- 3. determinism ---------------------------------------------------------------------------------


WHEEL = (*MENU, "turn wheel", "wait")


def turns(task: str, won: bool) -> AttemptTrace:
    """Turning the wheel wins where looking and pressing both showed a wheel before, and fails where neither did;
    the failing attempts press first, the winning ones look first."""
    first, second = (("look", "a wheel on the wall"), ("press button", "a wheel creaks")) if won else (
        ("press button", "a click"), ("look", "a grey room"))
    return attempt(task, *(step(a, shown, offered=WHEEL) for a, shown in (first, second, ("wait", "time passes"))),
                   step("turn wheel", "a door opens" if won else "the floor gives way", rose=won, fatal=not won,
                        offered=WHEEL), passed=won)


def handmade() -> list[AttemptTrace]:
    """Hand-made situations above in one round: an avoidance, preferences and a repeat to forbid; and two
    qualifiers that explain the wheel's failures equally well (what looking showed, what pressing showed), in
    attempts that took those kinds in different orders: the one chosen must not depend on which came first."""
    return [*(falls(t, instruction="press the button") for t in "abc"),
            *(opens(t, instruction="pull the lever") for t in "def"), *(wins_by_pressing(t) for t in "ghi"),
            *(dull(t) for t in "lmn"), falls("a", 1), *(turns(t, won=False) for t in "opq"),
            *(turns(t, won=True) for t in "rst")]


def key(found: Induced) -> tuple[object, ...]:
    """What an induced rule is, whatever the order its attempts came in (its anchors are the first it met)."""
    return found.rule, found.support, found.tasks, found.weight


INDUCE_ELSEWHERE = """
import json, pickle, sys
from hx.aegis.induction import induce
from schemas.rules import sentence
found = induce(pickle.loads(open(sys.argv[1], "rb").read()))
print(json.dumps([[sentence(f.rule, f.support), f.tasks, f.weight, [[a.seq, a.index] for a in f.anchors]]
                  for f in found]))
"""


def said(found: list[Induced]) -> list[list[object]]:
    """Induced rules as ``INDUCE_ELSEWHERE`` prints them."""
    return [[sentence(f.rule, f.support), list(f.tasks), f.weight, [[a.seq, a.index] for a in f.anchors]]
            for f in found]


def test_induce_gives_the_same_rules_in_the_same_order_whatever_the_order_of_the_attempts(
        played: list[AttemptTrace]) -> None:
    """On the same attempts twice, the same rules in the same order, support and anchors included; on the attempts
    shuffled, the same rules with the same support, still in the same order."""
    for traces, shuffles in ((handmade(), 10), (played, 3)):
        first = induce(traces)
        assert first and induce(traces) == first
        others = [traces[i:] + traces[:i] for i in range(1, len(traces))]  # each attempt comes first once
        for seed in range(shuffles):
            others.append(random.Random(seed).sample(traces, len(traces)))
        for other in others:
            assert [key(f) for f in induce(other)] == [key(f) for f in first]
    assert {type(f.rule.do) for f in induce(handmade())} == {Avoid, Prefer, ForbidRepeat}


@pytest.mark.parametrize("hash_seed", ["0", "1", "2", "3"])
def test_induce_gives_the_same_rules_in_another_process(played: list[AttemptTrace], tmp_path: Path,
                                                        hash_seed: str) -> None:
    """A process with another string hash (another set order) induces exactly the same rules from the same
    attempts: a resumed run, or the gate's re-run, proposes what the first process did."""
    for traces in (handmade(), played):
        saved = tmp_path / "traces.pickle"
        saved.write_bytes(pickle.dumps(traces))
        done = subprocess.run([sys.executable, "-c", INDUCE_ELSEWHERE, str(saved)], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed},
                              check=False, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == said(induce(traces))
