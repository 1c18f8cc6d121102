"""``hx run`` end to end through click's CliRunner: TextWorldExpress coin with the random agent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from hx_cli import error_line, hx, ok

from hx.environments.results import from_json
from hx.harnesses import starter_harness
from projections.task_history import pass_at_k
from schemas.lifecycle import AttemptFinished, RoundStarted, RunFinished, RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import TRACE, trace_filter, trace_subject


def check_consistent(data: dict[str, Any], tasks: int, attempts: int) -> None:
    """The JSON adds up: per-task pass@k from the passes, games and overall from the tasks."""
    assert len(data["tasks"]) == tasks and data["overall"]["attempts"] == tasks * attempts
    for t in data["tasks"]:
        assert t["attempts"] == attempts == len(t["scores"]) == len(t["steps"])
        assert abs(t["pass@1"] - pass_at_k(attempts, t["passes"], 1)) < 1e-9
        if attempts >= 2:
            assert abs(t["pass@2"] - pass_at_k(attempts, t["passes"], 2)) < 1e-9
        assert all(1 <= s <= 100 for s in t["steps"])
    overall = data["overall"]
    assert overall["passes"] == sum(t["passes"] for t in data["tasks"])
    assert abs(overall["pass@1"] - sum(t["pass@1"] for t in data["tasks"]) / tasks) < 1e-9
    assert abs(overall["mean_steps"] - sum(sum(t["steps"]) for t in data["tasks"]) / (tasks * attempts)) < 1e-9


def test_hx_run_prints_the_table_and_saves_the_results(tmp_path: Path) -> None:
    result = ok(hx("--data-dir", str(tmp_path), "run", "--bench", "twx:coin", "--tasks", "4", "--attempts", "2",
                   "--run-id", "cli-run"))
    out = result.stdout
    for column in ("game", "tasks", "pass@1", "pass@2", "mean score", "mean steps", "infra"):
        assert column in out
    saved = tmp_path / "results" / "cli-run.json"
    assert f"saved {saved}" in out and saved.with_suffix(".md").exists()
    data = json.loads(saved.read_text())
    check_consistent(data, tasks=4, attempts=2)
    [coin] = data["games"]
    assert coin["game"] == "twx:coin" and coin["tasks"] == 4 and coin["infra_failures"] == 0
    row = next(line for line in out.splitlines() if "twx:coin" in line)
    assert f"{coin['pass@1']:.2f}" in row and f"{coin['pass@2']:.2f}" in row and f"{coin['mean_steps']:.1f}" in row
    assert data["harness"] == "starter:textworld" and data["harness_digest"] == starter_harness("textworld").digest
    assert data["source"] == "log" and data["model"] == "random:" and data["role"] == "adaptation"
    assert "attempts" in result.stderr  # the progress bar goes to stderr
    # the same run id again: refused in one line, by its results file, or by the log when written elsewhere
    before = saved.read_text()
    assert "results file" in error_line(hx("--data-dir", str(tmp_path), "run", "--tasks", "1", "--run-id", "cli-run"))
    assert saved.read_text() == before
    assert "run 'cli-run' is already on the log" in error_line(
        hx("--data-dir", str(tmp_path), "run", "--tasks", "1", "--run-id", "cli-run", "--out",
           str(tmp_path / "elsewhere.json")))
    assert not (tmp_path / "elsewhere.json").exists()  # the claimed results file was given back


def test_hx_run_json_matches_the_saved_file_and_the_log(tmp_path: Path, nats_url: str) -> None:
    out = tmp_path / "out" / "r.json"
    result = ok(hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--bench", "twx:coin", "--tasks", "3",
                   "--attempts", "3", "--run-id", "cli-json", "--seed", "7", "--json", "--out", str(out),
                   "--max-steps", "40", "--concurrency", "2"))
    data = json.loads(result.stdout)  # nothing but the JSON on stdout
    assert data == json.loads(out.read_text()) and from_json(result.stdout).run_id == "cli-json"
    check_consistent(data, tasks=3, attempts=3)
    assert data["seed"] == 7 and data["max_steps"] == 40 and data["concurrency"] == 2
    assert all(s <= 40 for t in data["tasks"] for s in t["steps"])

    async def logged() -> list[Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter("cli-json")])]
    records = asyncio.run(logged())
    finished = [r for r in records if isinstance(r.event, AttemptFinished)]
    assert {r.subject for r in finished} == {trace_subject("cli-json", 0, f"twx:coin:dev:{n}", a)
                                             for n in range(3) for a in range(3)}
    assert sum(r.event.passed for r in finished) == data["overall"]["passes"]
    [started] = [r.event for r in records if isinstance(r.event, RunStarted)]
    assert started.config["bench"] == ["twx:coin"] and started.config["split"] == "dev" and started.seed == 7
    [rnd] = [r.event for r in records if isinstance(r.event, RoundStarted)]
    assert rnd.task_ids == ("twx:coin:dev:0", "twx:coin:dev:1", "twx:coin:dev:2") and rnd.attempts_per_task == 3
    assert [r.event.status for r in records if isinstance(r.event, RunFinished)] == ["completed"]


def test_hx_run_takes_a_harness_file_and_the_test_split_is_held_out(tmp_path: Path) -> None:
    harness = starter_harness("textworld").remove("loop_detector")
    path = harness.save(tmp_path / "h.yaml")
    result = ok(hx("--data-dir", str(tmp_path), "run", "--tasks", "2", "--attempts", "1", "--split", "test",
                   "--harness", str(path), "--json", "--run-id", "held"))
    data = json.loads(result.stdout)
    assert data["harness"] == str(path) and data["harness_digest"] == harness.digest
    assert data["role"] == "heldout" and [t["task_id"] for t in data["tasks"]] == ["twx:coin:test:0",
                                                                                   "twx:coin:test:1"]
    assert data["overall"]["pass@2"] is None  # one attempt: no pass@2


def test_hx_run_errors_are_one_line(tmp_path: Path) -> None:
    base = ("--data-dir", str(tmp_path), "run", "--tasks", "1")
    assert "unknown benchmark 'chess'" in error_line(hx(*base, "--bench", "chess"))
    assert "twx has no game 'maze'" in error_line(hx(*base, "--bench", "twx:maze"))
    assert "no single starter harness" in error_line(hx(*base, "--bench", "twx:coin", "--bench", "sciworld"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("processors:\n  - type: no_such_processor\n    hooks: [task_start]\n")
    assert "unknown processor 'no_such_processor'" in error_line(hx(*base, "--harness", str(bad)))
    assert hx(*base, "--attempts", "0").exit_code == 2  # a usage error, as click reports them
