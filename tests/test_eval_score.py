"""Eval scoring: the composite per attempt, task and suite with intervals, judging, comparing, the scoreboard."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from hx.eval.errors import EvalError
from hx.eval.runner import Planned, judge_all, plan, task_id_of
from hx.eval.score import NO_CRITERIA, AttemptScore, TaskOutcomes, Weights, compare, solved, suite_scores, task_scored
from projections.attempt_outputs import AttemptOutput
from projections.base import Projection
from projections.eval_scores import EvalScores
from projections.testing import ProjectionKit, fold_all
from schemas.envelope import Record
from schemas.evaluation import Bounds, CriterionJudged, SuiteScored, TaskScored
from schemas.lifecycle import AttemptFinished
from schemas.suite import CriterionSpec, Suite, SuiteTask
from streams.log import EventLog
from streams.topology import trace_subject

W = Weights()


def outcomes(name: str, passed: list[bool], criteria: list[int] | None = None, checked: int = 0,
             weight: float = 1.0) -> TaskOutcomes:
    """A task's attempts: each passed or not, with ``criteria[i]`` of ``checked`` criteria passed."""
    crit = criteria or [0] * len(passed)
    return TaskOutcomes(name, f"twx:coin:dev:{len(name)}", weight,
                        tuple(AttemptScore(p, checked, c) for p, c in zip(passed, crit, strict=True)))


def test_an_attempts_composite_is_seventy_thirty_and_without_criteria_its_verdict() -> None:
    assert AttemptScore(True, 4, 2).composite(W) == 0.85
    assert AttemptScore(False, 4, 4).composite(W) == 0.3
    assert AttemptScore(True).composite(W) == 1.0 and AttemptScore(False).composite(W) == 0.0
    assert AttemptScore(True, 2, 0).composite(Weights(0.5, 0.5)) == 0.5


def test_a_task_scores_wilson_pass_rates_and_a_bootstrapped_composite() -> None:
    t = task_scored("eval-x", outcomes("coin", [True, False, True, True], [2, 1, 0, 2], checked=2), W)
    assert (t.attempts, t.passes, t.criteria_checked, t.criteria_passed) == (4, 3, 8, 5)
    assert t.composites == (1.0, 0.15, 0.7, 1.0)
    assert t.composite.estimate == pytest.approx(sum(t.composites) / 4)
    assert t.composite.low < t.composite.estimate < t.composite.high and "bootstrap" in t.composite.method
    assert t.success.method == "wilson" and t.success.estimate == 0.75 and t.success.low < 0.75 < t.success.high
    assert t.criteria.estimate == 5 / 8 and t.criteria.method == "wilson"
    bare = task_scored("eval-x", outcomes("bare", [True, False]), W)
    assert bare.criteria == NO_CRITERIA and bare.composites == (1.0, 0.0)


def test_the_suites_composite_is_weighted_by_task_and_its_pass_rates_pooled() -> None:
    light = task_scored("e", outcomes("light", [False, False, False]), W)
    heavy = task_scored("e", outcomes("heavy", [True, True, True], weight=3.0), W)
    s = suite_scores([light, heavy])
    assert s.composite.estimate == pytest.approx(0.75) and s.tasks == 2 and s.attempts == 6
    assert s.success.estimate == 0.5 and s.success.method == "wilson" and s.criteria == NO_CRITERIA
    assert s.composite.low < 0.75 < s.composite.high  # which tasks were drawn counts
    assert suite_scores([light, heavy], seed=4) == suite_scores([light, heavy], seed=4)


def test_comparing_two_evals_keeps_a_clear_gain_and_names_the_flipped_tasks() -> None:
    names = [f"t{i}" for i in range(8)]
    base = {n: task_scored("a", outcomes(n, [False, False, True]), W) for n in names}
    better = {n: task_scored("b", outcomes(n, [True, True, i % 2 == 0]), W) for i, n in enumerate(names)}
    better["only-here"] = task_scored("b", outcomes("only-here", [False]), W)
    c = compare(base, better)
    assert c.verdict == "keep" and c.common == 8 and c.difference.low > 0
    assert set(c.flipped) == {f"{n}: 1/3 -> {3 if i % 2 == 0 else 2}/3" for i, n in enumerate(names)}
    assert compare(better, base).verdict == "discard"
    assert compare(base, base).verdict == "inconclusive" and compare(base, base).flipped == ()
    assert not solved(base["t0"]) and solved(better["t0"])


def _suite() -> Suite:
    return Suite(name="s", tasks=(
        SuiteTask(name="short", task="twx:coin:dev:0",
                  criteria=(CriterionSpec(name="steps_at_most", params={"steps": 5}),
                            CriterionSpec(name="min_bytes", params={"n": 3}))),
        SuiteTask(name="same-task", task="twx:coin:dev:0"),
        SuiteTask(name="unplayed", task="twx:coin:dev:9"),
    ))


def test_judging_checks_each_criterion_of_the_suite_task_an_attempt_played() -> None:
    planned = plan(_suite())
    assert [p.task for p in planned] == ["twx:coin:dev:0", "twx:coin:dev:0", "twx:coin:dev:9"]
    # a criterion that raises fails with its error as the detail; the suite goes on
    broken = Planned(planned[0].suite_task, planned[0].task,
                     (*planned[0].checks, (CriterionSpec(name="boom"), lambda out: (1 / 0 > 0, ""))))
    outs = [AttemptOutput("r", 0, "twx:coin:dev:0", 1, finished=True, passed=True, steps=3, answer="done"),
            AttemptOutput("r", 0, "twx:coin:dev:0", 0, finished=True, passed=False, steps=9),
            AttemptOutput("r", 0, "twx:other:dev:0", 0, finished=True, passed=True)]
    verdicts, tasks = judge_all("eval-j", [broken, planned[1], planned[2]], outs)
    assert [(v.judged_attempt, v.criterion, v.passed) for v in verdicts] == [
        (0, "steps_at_most", False), (0, "min_bytes", False), (0, "boom", False),
        (1, "steps_at_most", True), (1, "min_bytes", True), (1, "boom", False)]
    assert verdicts[2].detail.startswith("criterion raised ZeroDivisionError")
    assert all(v.run_id == "eval-j" and v.judged_run == "r" and v.suite_task == "short" for v in verdicts)
    assert [(t.suite_task, [a.passed for a in t.attempts], [a.criteria_passed for a in t.attempts]) for t in tasks] == [
        ("short", [False, True], [0, 2]), ("same-task", [False, True], [0, 0])]  # 'unplayed' had no attempt
    assert task_id_of(SuiteTask(name="mem", smoke="memory")) == "smoke:memory"


def test_an_unknown_suite_task_in_tasks_is_an_error_naming_it() -> None:
    with pytest.raises(EvalError, match="suite 's' has no task 'nope'"):
        plan(_suite(), ["short", "nope"])
    assert [p.name for p in plan(_suite(), ["unplayed"])] == ["unplayed"]


def _b(x: float) -> Bounds:
    return Bounds(estimate=x, low=x, high=x, method="wilson")


def _task(run: str, name: str, passes: int) -> TaskScored:
    return TaskScored(run_id=run, suite_task=name, task="twx:coin:dev:0", attempts=2, passes=passes,
                      success=_b(passes / 2), criteria=_b(0), composite=_b(passes / 2),
                      composites=(float(passes > 0), float(passes > 1)))


def _suite_scored(run: str) -> SuiteScored:
    return SuiteScored(run_id=run, suite="s", suite_digest="d", tasks=1, attempts=2, success=_b(0.5),
                       criteria=_b(0), composite=_b(0.5))


class TestEvalScoresKit(ProjectionKit):
    """The scoreboard passes the projection kit: live, resumed, rebuilt and as-of states agree."""

    def make_projection(self) -> Projection[Any]:
        return EvalScores()

    async def append_events(self, log: EventLog) -> AsyncIterator[object]:
        for n, run in enumerate(("eval-a", "eval-b")):
            await log.append(trace_subject(run, 0), CriterionJudged(
                run_id=run, suite_task="coin", criterion="task_verdict", passed=True, judged_run="r", judged_round=0,
                task="twx:coin:dev:0", judged_attempt=0))
            await log.append(trace_subject(run, 0), _task(run, "coin", n))
            yield run
            await log.append(trace_subject(run, 0, "twx:coin:dev:0", 0), AttemptFinished(
                run_id=run, round=0, task_id="twx:coin:dev:0", attempt=0, passed=True))
            await log.append(trace_subject(run), _suite_scored(run))
            yield n


def test_the_scoreboard_keeps_each_evals_latest_task_and_suite_scores() -> None:
    events = [(trace_subject("eval-a", 0), _task("eval-a", "coin", 0)),
              (trace_subject("eval-a", 0), _task("eval-a", "coin", 2)),
              (trace_subject("eval-a", 0), _task("eval-a", "maze", 1)),
              (trace_subject("eval-a"), _suite_scored("eval-a"))]
    records = [Record(seq=i + 1, index=0, subject=s, type=type(e).TYPE, version=1, time_ns=0, event=e)
               for i, (s, e) in enumerate(events)]
    state = fold_all(EvalScores(), records)
    assert list(state) == ["eval-a"] and state["eval-a"].tasks["coin"].passes == 2
    assert sorted(state["eval-a"].tasks) == ["coin", "maze"] and state["eval-a"].suite == _suite_scored("eval-a")
    assert EvalScores.subjects == ("hx.trace.*.*._._",)  # never an attempt's subject
    assert EvalScores.reads == {TaskScored.TYPE, SuiteScored.TYPE}
