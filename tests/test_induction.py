"""Rule induction (``hx.aegis.induction``): each method on small hand-made attempts, the index agreeing with the
interpreter on real TextWorldExpress attempts, the traces read back from a real ``hx evolve`` run, determinism, and
no game's words in the code that learns or runs rules.

The hand-made attempts use invented verbs and objects (``press button``, ``pull lever``): the induction must find
its rules in any vocabulary, and no test here needs a game's.
"""

from __future__ import annotations

import itertools
import json
import pickle
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hx_cli import hx, ok
from scienceworld import ScienceWorldEnv
from textworld_express import TextWorldExpressEnv

from hx.aegis.errors import HeldoutAccess
from hx.aegis.evidence import Evidence
from hx.aegis.induction import induce, read_traces
from hx.aegis.induction.index import Corpus, Indexed, head
from hx.aegis.induction.methods import (
    Induced,
    InductionSettings,
    bases,
    fatal,
    precedence,
    qualified,
    repeat,
    rising,
)
from hx.aegis.induction.traces import AttemptTrace, Step, credit
from hx.aegis.ledger import read_records
from hx.environments.twx import GAME_OPTIONS
from hx.processors._rule_view import AttemptView, matches
from hx.processors.rule_program import narrow
from schemas.edits import Anchor
from schemas.envelope import OpenedMessage
from schemas.ledger import HeldoutScored, RoundDigested
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
from schemas.tools import EnvObservation
from streams.channels import attempt_subject
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import TRACE, TraceAddress

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
    before a pull (the plain avoid is refused: the pulls that rose speak against it)."""
    corpus = Corpus([falls(t) for t in "abc"] + [opens(t, first="press button") for t in "def"])
    [found] = precedence(corpus, InductionSettings())
    assert found.rule == Rule(do=RequireBefore(first=Pattern(starts="press"), then=Pattern(starts="pull")))
    assert (found.support.method, found.support.tasks, found.support.against) == ("precedence", 3, 0)
    assert found.tasks == ("a", "b", "c")
    assert fatal(corpus, InductionSettings()) == []


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


# --- 3. the traces of a real run -------------------------------------------------------------------


@dataclass(frozen=True)
class SmallRun:
    """A small real ``hx evolve`` run on its own nats-server."""

    url: str
    run_id: str


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallRun]:
    """One round of the induced evolver on three arithmetic tasks, random agent (the tests only read it)."""
    root = tmp_path_factory.mktemp("induction-run")
    server = NatsProcess(root / "nats")
    server.start(detach=False)
    try:
        ok(hx("--nats-url", server.url, "--data-dir", str(root / "data"), "evolve", "--bench", "twx:arithmetic",
              "--tasks", "3", "--heldout-tasks", "1", "--heldout-split", "train", "--rounds", "1", "--max-steps",
              "15", "--evolver", "induced", "--run-id", "induction-traces"))
        yield SmallRun(server.url, "induction-traces")
    finally:
        server.stop()


def task_description(task: str) -> str:
    """What a real TextWorldExpress environment says the task ``twx:<game>:dev:<n>`` is."""
    _, game, split, n = task.split(":")
    env = TextWorldExpressEnv(envStepLimit=100)
    try:
        env.load(game, ",".join(f"{k}={v}" for k, v in GAME_OPTIONS[game].items()))
        _, info = env.reset(seed=10000 + int(n), gameFold=split)
        return str(info["taskDescription"])
    finally:
        env.close()


@pytest.mark.slow
async def test_read_traces_gives_every_adaptation_attempt_as_the_log_recorded_it(small_run: SmallRun) -> None:
    """Every attempt of the round's adaptation trace, each step's action, observation, offer and verdict as its
    ``env.observation`` event says, its anchor pointing at that event, and the task's text from step 0."""
    async with connect(NatsSettings(url=small_run.url)) as conn:
        records = await read_records(conn, small_run.run_id)
        assert records is not None
        [digested] = [r for r in records if isinstance(r, RoundDigested)]
        rounds = list(digested.trace_rounds)
        evidence = Evidence(conn.log, small_run.run_id)
        traces = await read_traces(evidence, rounds)
        facts = {(f.trace_round, f.task, f.attempt): f for f in await evidence.attempts(rounds)}
        assert sorted(t.key for t in traces) == sorted(facts) and len(traces) == 3 * 2

        descriptions = {task: task_description(task) for task in {t.task for t in traces}}
        for trace in traces:
            fact = facts[trace.key]
            assert trace.instruction == descriptions[trace.task] and trace.opening
            assert trace.passed == fact.passed and [s.action for s in trace.steps] == fact.actions
            assert trace.steps, trace.key
            assert [s.fatal for s in trace.steps] == [False] * (len(trace.steps) - 1) + [fact.env_failure]
            shown: list[EnvObservation] = []
            for s in trace.steps:
                msg = await conn.log.js.get_msg(TRACE.name, seq=s.anchor.seq)
                record = OpenedMessage(attempt_subject(msg.subject or ""), s.anchor.seq, msg.headers,
                                       msg.data or b"").record(s.anchor.index)
                event = record.event
                assert isinstance(event, EnvObservation), record.type
                address = TraceAddress.parse(record.subject)
                assert (address.round, address.task, address.attempt) == trace.key
                assert (event.info["action"], event.observation) == (s.action, s.observation)
                assert s.anchor.note == f"step {event.step}" and event.step == len(shown) + 1
                assert s.fatal == event.failure and s.rose == (event.score > (shown[-1].score if shown else 0.0)
                                                                or event.success)
                if shown:
                    assert s.offered == shown[-1].valid_actions  # what was on offer when the action was chosen
                shown.append(event)


@pytest.mark.slow
async def test_read_traces_refuses_a_heldout_round(small_run: SmallRun) -> None:
    """A held-out trace round, alone or among adaptation rounds, raises ``HeldoutAccess`` and reads nothing."""
    async with connect(NatsSettings(url=small_run.url)) as conn:
        records = await read_records(conn, small_run.run_id)
        assert records is not None
        heldout = [r.trace_round for r in records if isinstance(r, HeldoutScored)]
        [adaptation] = [r.trace_rounds for r in records if isinstance(r, RoundDigested)]
        evidence = Evidence(conn.log, small_run.run_id)
        assert heldout
        for asked in ([heldout[0]], [*adaptation, heldout[-1]]):
            with pytest.raises(HeldoutAccess, match="is a heldout round"):
                await read_traces(evidence, asked)
        assert await read_traces(evidence, []) == []


# --- 5. determinism ---------------------------------------------------------------------------------


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


# --- 6. no game in the code -------------------------------------------------------------------------

GUARDED = (*sorted((ROOT / "hx" / "aegis" / "induction").glob("*.py")),
           ROOT / "hx" / "aegis" / "evolvers" / "induced.py", ROOT / "hx" / "aegis" / "evolvers" / "composite.py",
           ROOT / "hx" / "processors" / "rule_program.py", ROOT / "hx" / "processors" / "_rule_view.py")
"""The code that learns rules and runs them: what it knows of any game is a generality bug."""

ENGLISH = frozenset((
    "a", "about", "above", "after", "all", "also", "an", "and", "are", "as", "at", "be", "been", "by", "can",
    "do", "does", "each", "first", "for", "found", "from", "has", "have", "if", "in", "into", "is", "it", "its",
    "may", "more", "most", "next", "not", "of", "on", "once", "one", "or", "same", "some", "than", "that",
    "the", "their", "them", "then", "there", "this", "to", "two", "until", "up", "was", "what", "when",
    "whether", "which", "will", "with", "without", "your",
    "actions", "check", "completed", "environment", "exactly", "game", "item", "longest", "move", "part",
    "place", "point", "read", "repeat", "require", "says", "search", "state", "task", "turn", "unknown", "use",
))
"""Words some task description has that the guarded code also uses, in their everyday sense (``read``, ``says``,
``repeat``, ``require`` and ``state`` name the rule language's own texts, conditions and effects; ``longest`` and
``unknown`` are halves of ``zip_longest`` and ``forbid_unknown_fields``). Words of a game's own vocabulary
(``box``, ``take``, ``put``, its objects and places) are never here."""

_IDENTIFIER_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def code_words(text: str) -> set[str]:
    """The words of code and prose alike: identifiers split at underscores and capitals, lower-cased."""
    return {w.lower() for w in _IDENTIFIER_PART.findall(text)}


def game_texts() -> tuple[list[str], list[str]]:
    """(the names of every TextWorldExpress game and ScienceWorld task, their task descriptions), read from the
    environments themselves (five seeds of each game, the first variation of each task)."""
    names: list[str] = []
    descriptions: list[str] = []
    twx = TextWorldExpressEnv(envStepLimit=100)
    try:
        for game in twx.getGameNames():
            names.append(game)
            twx.load(game, ",".join(f"{k}={v}" for k, v in GAME_OPTIONS.get(game, {}).items()))
            descriptions += [twx.reset(seed=seed, gameFold="train")[1]["taskDescription"] for seed in range(5)]
    finally:
        twx.close()
    sciworld = ScienceWorldEnv("", envStepLimit=100)
    try:
        for task in sciworld.get_task_names():
            names.append(task)
            sciworld.load(task, 0, "easy", generateGoldPath=False)
            descriptions.append(sciworld.get_task_description())
    finally:
        sciworld.close()
    return names, descriptions


@pytest.mark.slow
def test_the_code_that_learns_and_runs_rules_names_no_game_task_or_game_word() -> None:
    """No game or task name, and no word of any game's task description that is not everyday English, appears in
    the induction, the induced evolver, the composite evolver or the interpreter: code, comments and docstrings."""
    names, descriptions = game_texts()
    assert len(names) == 8 + 30 and len(descriptions) == 8 * 5 + 30
    words = {w for d in descriptions for w in code_words(d) if len(w) > 1 and not w.isdigit()}
    assert {"coin", "kitchen", "box", "thermometer", "focus"} <= words  # the descriptions were read, and in full
    game_words = words - ENGLISH
    found = []
    for path in GUARDED:
        text = path.read_text()
        for name in names:  # hyphenated task names also as identifiers or plain words
            if re.search(r"\b" + re.sub(r"[-_ ]", "[-_ ]?", re.escape(name)) + r"\b", text, re.IGNORECASE):
                found.append(f"{path.relative_to(ROOT)}: {name}")
        found += [f"{path.relative_to(ROOT)}: {w}" for w in sorted(code_words(text) & game_words)]
    assert not found, found
    assert len(GUARDED) == 8
