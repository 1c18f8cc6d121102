"""``hx eval`` end to end on a real nats-server with TextWorldExpress coin and the random agent."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hx_cli import error_line, hx, ok

from hx.harnesses import starter_harness
from schemas.evaluation import CriterionJudged, SuiteScored, TaskScored
from schemas.lifecycle import RoundStarted, RunFinished, RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import TRACE, trace_filter, trace_subject

SCORE_LINE = re.compile(r"composite (\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]")


def suite_file(tmp_path: Path, *, tasks: int = 2, criterion: str = "steps_at_most", smoke: bool = False) -> Path:
    """A tiny suite of coin tasks, each with a step criterion and the task's own verdict (and the memory smoke)."""
    lines = ["name: tiny", "attempts: 2", "max_steps: 10", "tasks:"]
    for n in range(tasks):
        lines += [f"  - name: c{n}", f"    task: twx:coin:dev:{n}", "    criteria:",
                  f"      - {{name: {criterion}, params: {{steps: 20}}}}", "      - {name: task_verdict}"]
    if smoke:
        lines += ["  - name: memory", "    smoke: memory", "    criteria:", "      - {name: task_verdict}"]
    path = tmp_path / "tiny.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def records(nats_url: str, run: str | None = None) -> list[Any]:
    """Every trace record (of ``run``, if given)."""
    async def read() -> list[Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            subjects = [trace_filter(run)] if run else []
            return [r async for r in conn.log.read(TRACE.name, subjects=subjects)]
    return asyncio.run(read())


def eval_events(nats_url: str) -> list[Any]:
    """Every eval event and every eval run's bracket on the log."""
    return [r.event for r in records(nats_url) if r.type.startswith("eval.")
            or (isinstance(r.event, RunStarted | RunFinished) and r.event.run_id.startswith("eval-"))]


def test_a_full_eval_plays_the_suite_judges_and_records_every_verdict_and_score(tmp_path: Path, nats_url: str) -> None:
    suite = suite_file(tmp_path, smoke=True)
    result = ok(hx("--nats-url", nats_url, "eval", str(suite), "--run-id", "eval-full", "--json", "--seed", "3"))
    data = json.loads(result.stdout)
    assert data["suite"]["run_id"] == "eval-full" and data["suite"]["mode"] == "full"
    assert [t["suite_task"] for t in data["tasks"]] == ["c0", "c1", "memory"]
    smoke = data["tasks"][2]  # the memory smoke: one attempt-like output, judged by its criteria
    assert (smoke["task"], smoke["attempts"], smoke["passes"], smoke["criteria_passed"]) == ("smoke:memory", 1, 1, 1)
    logged = records(nats_url, "eval-full")
    [started] = [r for r in logged if isinstance(r.event, RunStarted)]
    assert started.subject == trace_subject("eval-full") and started.event.kind == "eval"
    assert started.event.config["suite"] == "tiny" and started.event.config["mode"] == "full"
    verdicts = [r for r in logged if isinstance(r.event, CriterionJudged)]
    assert len(verdicts) == 2 * 2 * 2 + 1  # tasks x attempts x criteria, and the smoke's
    assert {r.subject for r in verdicts} == {trace_subject("eval-full", 0)}
    assert {(v.event.judged_run, v.event.task, v.event.judged_attempt) for v in verdicts} == {
        ("eval-full", f"twx:coin:dev:{n}", a) for n in range(2) for a in range(2)} | {("eval-full", "smoke:memory", 0)}
    tasks = [r for r in logged if isinstance(r.event, TaskScored)]
    assert {r.subject for r in tasks} == {trace_subject("eval-full", 0)} and len(tasks) == 3
    for t in tasks[:2]:  # task_verdict agrees with the attempt's verdict, so each composite is 0 or 1
        mine = [v.event for v in verdicts if v.event.suite_task == t.event.suite_task]
        assert t.event.criteria_checked == 4 and t.event.criteria_passed == sum(v.passed for v in mine)
        assert t.event.attempts == 2 and len(t.event.composites) == 2
    [scored] = [r for r in logged if isinstance(r.event, SuiteScored)]
    assert scored.subject == trace_subject("eval-full") and scored.event.judged_runs == ("eval-full",)
    assert scored.event.composite.low <= scored.event.composite.estimate <= scored.event.composite.high
    assert data["suite"]["composite"]["estimate"] == scored.event.composite.estimate
    assert [(r.event.status, r.event.rounds) for r in logged if isinstance(r.event, RunFinished)] == [("completed", 1)]
    # the same eval run id again: refused, nothing more written
    before = len(records(nats_url))
    assert "already on the log" in error_line(hx("--nats-url", nats_url, "eval", str(suite), "--fast",
                                                 "--run-id", "eval-full"))
    assert len(records(nats_url)) == before


def test_fast_mode_judges_a_logged_run_and_the_score_line_is_for_scripts(tmp_path: Path, nats_url: str) -> None:
    suite = suite_file(tmp_path)
    ok(hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--tasks", "3", "--attempts", "3",
          "--max-steps", "30", "--run-id", "played", "--json"))
    result = ok(hx("--nats-url", nats_url, "eval", str(suite), "--fast", "--runs", "played", "--run-id", "eval-fast"))
    assert "composite" in result.stdout and "catch_up" in result.stdout
    logged = records(nats_url, "eval-fast")
    verdicts = [r.event for r in logged if isinstance(r.event, CriterionJudged)]
    # coin:dev:2 is not a task of the suite: only the suite's two tasks are judged
    assert {(v.judged_run, v.task) for v in verdicts} == {("played", "twx:coin:dev:0"), ("played", "twx:coin:dev:1")}
    assert len(verdicts) == 2 * 3 * 2
    [scored] = [r.event for r in logged if isinstance(r.event, SuiteScored)]
    assert scored.mode == "fast" and scored.judged_runs == ("played",) and scored.attempts == 6
    line = ok(hx("--nats-url", nats_url, "eval", str(suite), "--fast", "--score", "--tasks", "c1")).stdout
    match = SCORE_LINE.fullmatch(line.strip())
    assert match is not None, line
    low, estimate, high = float(match[2]), float(match[1]), float(match[3])
    assert low <= estimate <= high
    scored_runs = {r.event.run_id for r in records(nats_url) if isinstance(r.event, SuiteScored)}
    assert len(scored_runs) == 2  # --score recorded its eval too


def test_against_a_base_eval_prints_both_scores_the_difference_the_verdict_and_the_flips(
        tmp_path: Path, nats_url: str) -> None:
    suite = suite_file(tmp_path, tasks=4)
    for run, steps in (("run-lo", "1"), ("run-hi", "40")):
        ok(hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--tasks", "4", "--attempts", "3",
              "--max-steps", steps, "--run-id", run, "--json"))
    ok(hx("--nats-url", nats_url, "eval", str(suite), "--fast", "--runs", "run-lo", "--run-id", "eval-lo"))
    out = ok(hx("--nats-url", nats_url, "eval", str(suite), "--fast", "--runs", "run-hi", "--run-id", "eval-hi",
                "--against", "eval-lo")).stdout
    assert "base eval-lo: composite 0.150 [0.150, 0.150]" in out  # one step: never won, steps criterion passed
    assert re.search(r"difference -?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]  verdict INCONCLUSIVE", out), out
    assert "flipped: c0: 0/3 -> 2/3; c2: 0/3 -> 2/3" in out
    [scored] = [r.event for r in records(nats_url, "eval-hi") if isinstance(r.event, SuiteScored)]
    assert scored.against == "eval-lo" and scored.verdict == "inconclusive"
    assert scored.flipped == ("c0: 0/3 -> 2/3", "c2: 0/3 -> 2/3")
    assert scored.difference is not None and scored.difference.low < 0 < scored.difference.high


@pytest.mark.parametrize("case", ["unknown criterion", "generated schema", "unknown against", "unknown run",
                                  "unknown task", "runs without fast"])
def test_bad_input_is_one_error_line_and_no_eval_event_is_written(tmp_path: Path, nats_url: str, case: str) -> None:
    suite = suite_file(tmp_path)
    ok(hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--tasks", "1", "--attempts", "1",
          "--max-steps", "5", "--run-id", "played", "--json"))
    args: list[str]
    if case == "unknown criterion":
        args, said = [str(suite_file(tmp_path, criterion="no_such_criterion"))], "unknown criterion 'no_such_criterion'"
    elif case == "generated schema":
        bad = tmp_path / "gen.json"
        bad.write_text(json.dumps({"tasks": [{"name": "g", "task": "twx:coin:dev:0", "weight": "heavy"}]}))
        args, said = [str(suite), "--generated", str(bad)], str(bad)
    elif case == "unknown against":
        args, said = [str(suite), "--fast", "--against", "eval-nothing"], "--against 'eval-nothing'"
    elif case == "unknown run":
        args, said = [str(suite), "--fast", "--runs", "played,ghost"], "run 'ghost'"
    elif case == "unknown task":
        args, said = [str(suite), "--tasks", "c0,c9"], "no task 'c9'"
    else:
        args, said = [str(suite), "--runs", "played"], "--runs names the runs whose attempts --fast judges"
    line = error_line(hx("--nats-url", nats_url, "eval", *args))
    assert said in line, line
    assert eval_events(nats_url) == []


def test_a_full_eval_plays_one_round_per_family_each_with_its_starter_harness(tmp_path: Path, nats_url: str) -> None:
    suite = tmp_path / "mixed.yaml"
    suite.write_text("name: mixed\nattempts: 1\nmax_steps: 4\ntasks:\n"
                     "  - name: guide\n    free: {instruction: 'Write a short guide.'}\n"
                     "    criteria: [{name: min_bytes, params: {n: 1}}]\n"
                     "  - name: coin\n    task: twx:coin:dev:0\n")
    data = json.loads(ok(hx("--nats-url", nats_url, "eval", str(suite), "--run-id", "eval-mixed", "--json")).stdout)
    assert [(t["suite_task"], t["task"], t["attempts"]) for t in data["tasks"]] == [
        ("guide", "free:guide:dev:0", 1), ("coin", "twx:coin:dev:0", 1)]
    logged = records(nats_url, "eval-mixed")
    rounds = {r.event.round: r.event for r in logged if isinstance(r.event, RoundStarted)}
    assert {n: e.task_ids for n, e in rounds.items()} == {0: ("free:guide:dev:0",), 1: ("twx:coin:dev:0",)}
    assert rounds[0].harness_digest == starter_harness("qa").digest
    assert rounds[1].harness_digest == starter_harness("textworld").digest
    assert [r.event.rounds for r in logged if isinstance(r.event, RunFinished)] == [2]
