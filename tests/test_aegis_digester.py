"""The Digester on its own: clusters, continuity across rounds, one digest per task (category, implicated
processors, evidence, features), actionability; and the digests of a real toy-world round read off the log."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest
from toyworld import ToyWorld

from hx.aegis.digester import (
    MAX_ANCHORS,
    actionability,
    continuity,
    digest_round,
    digest_task,
    with_prose,
)
from hx.aegis.evidence import AttemptFacts, Evidence
from hx.aegis.taxonomy import categorise, features
from hx.aegis.trials import Trials
from hx.environments.rollout import RolloutSettings, RoundLabel
from hx.environments.splits import Splits
from hx.gate.rule import cluster_of
from hx.harnesses import starter_harness
from hx.runtime.models import ModelConfig
from schemas.edits import Anchor
from schemas.landscape import FAILURE_CATEGORIES
from streams.config import NatsSettings
from streams.connection import connect

ROOMS = "toyworld:rooms:dev:3"
BELL = "toyworld:bell:dev:1"


def attempt(task: str = ROOMS, n: int = 0, *, passed: bool = False, status: str = "budget_exhausted",
            actions: int = 6, **fields: object) -> AttemptFacts:
    """One attempt's facts: ``actions`` different actions, each seeing something new."""
    return AttemptFacts(task, n, 0, passed=passed, status=status, steps=actions,
                        actions=[f"act {i}" for i in range(actions)],
                        observations=[f"obs {i}" for i in range(actions + 1)],
                        scores=[0.0] * (actions + 1), **fields)  # type: ignore[arg-type]


def interrupted(task: str = ROOMS, n: int = 0, group: str = "loop_detector", seq: int = 50) -> AttemptFacts:
    """An attempt a processor ended, with its anchor."""
    return attempt(task, n, status="interrupted", interrupts=[(group, f"{group}: enough")],
                   anchors={"interrupt": Anchor(seq=seq, note=f"{group} at before_model")})


def lost(task: str = BELL, n: int = 0) -> AttemptFacts:
    """An attempt that lost the game."""
    return attempt(task, n, status="completed", env_done=True, env_failure=True)


@pytest.mark.parametrize(("task", "cluster"), [
    ("toyworld:rooms:dev:3", "toyworld:rooms"),
    ("twx:coin:test:117", "twx:coin"),
    ("gaia:2023_level1:validation:c61d22de", "gaia:2023_level1"),
    ("bench:alpha", "bench:alpha"),
    ("loner", "loner"),
])
def test_a_task_is_routed_by_benchmark_and_game(task: str, cluster: str) -> None:
    """The cluster is the first two parts of the task id (all of a shorter one)."""
    assert cluster_of(task) == cluster


@pytest.mark.parametrize(("history", "solved", "expected"), [
    ((), True, "solved"),
    ((), False, "new"),
    ((True,), True, "solved"),
    ((False,), False, "persistent_failure"),
    ((True,), False, "newly_failing"),
    ((False,), True, "recovered"),
    ((False, True), False, "newly_failing"),  # two changes, but too short a record to call it flaky
    ((True, False, True), False, "flaky"),
    ((False, True, False), True, "flaky"),
    ((False, False, True), False, "flaky"),
    ((True, True, True), False, "newly_failing"),
    ((False, False, False), True, "recovered"),
    ((True, False, True, True, True), False, "newly_failing"),  # only the last three rounds count
    ((False, False, False, True, False), False, "flaky"),
])
def test_continuity_follows_the_task_across_rounds(history: tuple[bool, ...], solved: bool, expected: str) -> None:
    """New, solved, persistent, newly failing, recovered, flaky: from the pass@k history and this round."""
    assert continuity(history, solved) == expected


def test_a_failing_task_takes_its_attempts_most_frequent_category() -> None:
    """Of its failing attempts' categories the most frequent wins, whatever order the attempts came in."""
    facts = [interrupted(n=0), attempt(n=1), attempt(n=2)]
    assert [categorise(f) for f in facts] == ["interrupted", "no_progress", "no_progress"]
    assert digest_task(ROOMS, facts, "v0", ()).category == "no_progress"
    assert digest_task(ROOMS, facts[::-1], "v0", ()).category == "no_progress"


def test_a_tie_between_categories_goes_to_the_earlier_one_in_the_taxonomy() -> None:
    """One interrupted and one no-progress attempt: ``interrupted`` comes first in the taxonomy."""
    assert FAILURE_CATEGORIES.index("interrupted") < FAILURE_CATEGORIES.index("no_progress")
    for facts in ([interrupted(n=0), attempt(n=1)], [attempt(n=0), interrupted(n=1)]):
        assert digest_task(ROOMS, facts, "v0", ()).category == "interrupted"


def test_a_task_solved_once_is_solved_and_carries_no_failure() -> None:
    """pass@k: one passing attempt solves the task; it then has no category and no evidence."""
    d = digest_task(ROOMS, [interrupted(n=0), attempt(n=1, passed=True, status="completed")], "v1", (False,))
    assert (d.solved, d.attempts, d.passes) == (True, 2, 1)
    assert d.category == "" and d.evidence == ()
    assert d.implicated == ("loop_detector",)  # the processor still acted on it
    assert (d.variant, d.cluster, d.continuity) == ("v1", "toyworld:rooms", "recovered")


def test_interrupting_processors_are_implicated_first_then_the_busiest() -> None:
    """Implicated groups: those that ended an attempt, then the others by how often they triggered, each once."""
    busy = attempt(n=1, triggers=Counter({"history_window": 7, "observation_trim": 2}))
    also = attempt(n=2, triggers=Counter({"observation_trim": 6, "loop_detector": 1}))
    d = digest_task(ROOMS, [busy, interrupted(n=0, group="budget"), also], "v0", ())
    assert d.implicated == ("budget", "observation_trim", "history_window", "loop_detector")


def test_evidence_anchors_interrupts_first_and_at_most_three() -> None:
    """Anchors come in the order interrupt, refused, invalid, finished, only from failing attempts, at most three."""
    def anchored(n: int, **anchors: Anchor) -> AttemptFacts:
        return attempt(n=n, anchors=anchors)

    facts = [
        anchored(0, finished=Anchor(seq=10), refused=Anchor(seq=4)),
        anchored(1, invalid=Anchor(seq=22), refused=Anchor(seq=21)),
        interrupted(n=2, seq=35),
    ]
    d = digest_task(ROOMS, facts, "v0", ())
    assert len(d.evidence) == MAX_ANCHORS == 3
    assert [a.seq for a in d.evidence] == [35, 4, 21]
    fewer = digest_task(ROOMS, facts[:1], "v0", ())
    assert [a.seq for a in fewer.evidence] == [4, 10]


def test_the_features_are_the_means_over_the_attempts() -> None:
    """Each trace feature of the digest is the mean over the task's attempts, passed ones included."""
    facts = [attempt(n=0, actions=4, refused=2), attempt(n=1, actions=8, passed=True, status="completed")]
    d = digest_task(ROOMS, facts, "v0", ())
    assert d.features["steps"] == 6.0
    assert d.features["refused_share"] == 0.25
    assert set(d.features) == set(features(facts[0]))


def test_a_round_is_one_digest_per_task_in_task_order() -> None:
    """Attempts of many tasks, in any order, make one digest per task, sorted by id, each with its attempts."""
    facts = [lost(BELL, 1), attempt("toyworld:rooms:dev:1", 0, passed=True, status="completed"), lost(BELL, 0),
             attempt(ROOMS, 1), interrupted(ROOMS, 0)]
    digests = digest_round(facts, {ROOMS: "v1"}, {})
    assert [d.task for d in digests] == sorted({f.task for f in facts})
    by = {d.task: d for d in digests}
    assert (by[BELL].attempts, by[BELL].category, by[BELL].variant) == (2, "env_failure", "v0")
    assert by[ROOMS].variant == "v1" and by[ROOMS].category == "interrupted"
    assert by["toyworld:rooms:dev:1"].solved


def test_a_rounds_digests_tell_regressions_from_solved_and_unsolved_tasks() -> None:
    """Against the tasks' histories: newly failing (a regression), recovered, still solved, still failing, new."""
    history = {"b:g:dev:1": [True, True], "b:g:dev:2": [False, False], "b:g:dev:3": [True], "b:g:dev:4": [False]}
    facts = [attempt("b:g:dev:1"), attempt("b:g:dev:2"), attempt("b:g:dev:3", passed=True, status="completed"),
             attempt("b:g:dev:4", passed=True, status="completed"), attempt("b:g:dev:5")]
    got = {d.task: (d.solved, d.continuity) for d in digest_round(facts, {}, history)}
    assert got == {"b:g:dev:1": (False, "newly_failing"), "b:g:dev:2": (False, "persistent_failure"),
                   "b:g:dev:3": (True, "solved"), "b:g:dev:4": (True, "recovered"), "b:g:dev:5": (False, "new")}


def test_actionability_is_the_share_of_tasks_failing_for_a_harness_reason() -> None:
    """Solved tasks and infrastructure failures are not actionable; every other failure is."""
    facts = [attempt("b:g:dev:1", passed=True, status="completed"),
             AttemptFacts("b:g:dev:2", 0, 0, status="infra_failure", reason="provider down"),
             attempt("b:g:dev:3"), lost("b:g:dev:4")]
    digests = digest_round(facts, {}, {})
    assert [d.category for d in digests] == ["", "infrastructure", "no_progress", "env_failure"]
    assert actionability(digests) == 0.5
    assert actionability(()) == 0.0
    assert actionability(digests[:2]) == 0.0


def test_prose_fills_in_summaries_and_leaves_the_rest_alone() -> None:
    """An LLM's summaries land on the tasks it wrote about; every deterministic field stays as it was."""
    digests = digest_round([attempt("b:g:dev:1"), attempt("b:g:dev:2")], {}, {})
    out = with_prose(digests, {"b:g:dev:2": "It searched the wrong room.", "b:g:dev:1": ""})
    assert out[0] == digests[0]
    assert out[1].summary == "It searched the wrong room."
    assert out[1] == msgspec.structs.replace(digests[1], summary="It searched the wrong room.")


async def test_the_digests_of_a_real_round_agree_with_its_attempts(nats_url: str) -> None:
    """A toy-world round on the log, read back through Evidence: one digest per task, consistent with the outcomes."""
    bench = ToyWorld()
    tasks = [str(t) for g in bench.games() for t in bench.task_ids(g, "dev", limit=5)]
    async with connect(NatsSettings(url=nats_url)) as conn:
        trials = Trials(conn.log, "digest-run", [bench], ModelConfig(),
                        RolloutSettings(attempts=2, max_steps=30, seed=3), Splits.of(tasks), next_round=0)
        _, outcome = await trials.run(starter_harness("textworld"), tasks, role="adaptation",
                                      label=RoundLabel(purpose="main", variant="v0"))
        facts = await Evidence(conn.log, "digest-run").attempts([0])
    digests = digest_round(facts, {}, {})
    passes = Counter(r.task_id for r in outcome.results if r.passed)
    assert [d.task for d in digests] == sorted(tasks)
    for d in digests:
        assert d.attempts == 2 and d.passes == passes[d.task] and d.cluster == cluster_of(d.task)
        assert bool(d.category) is not d.solved
        assert d.category in ("", *FAILURE_CATEGORIES)
        assert d.solved or d.evidence  # a failure always points at the log
    for f in facts:
        result = next(r for r in outcome.results if (r.task_id, r.attempt) == (f.task, f.attempt))
        assert (f.passed, f.status, f.steps) == (result.passed, result.status, result.steps)
        assert len(f.observations) == len(f.actions) + 1  # the opening, then one per action
        if f.task.startswith("toyworld:bell") and not f.passed and f.status == "completed":
            assert categorise(f) == "env_failure"  # the only way to lose the bell game early: ring it
    assert 0.0 < actionability(digests) <= 1.0

