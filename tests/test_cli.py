"""The ``hx`` command line against a real nats-server (and once through the embedded one)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from click.testing import Result
from hx_cli import hx, ok

from hx.cli import log as log_cli
from hx.cli._demo_round import synthetic_round
from streams.processes import free_port, pid_alive
from streams.server import EmbeddedServer

RUN_ID = "cli-test"
EVENTS = 400
ATTEMPTS = 2
DIGEST = re.compile(r"\b[0-9a-f]{64}\b")


def assert_one_error_line(result: Result) -> str:
    """Exit 1 with exactly one ``error:`` line on stderr and no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def demo_url(nats_url: str) -> str:
    """A nats-server holding one demo round of known size."""
    result = ok(hx("--nats-url", nats_url, "demo", "--run-id", RUN_ID, "--events", str(EVENTS),
                   "--attempts", str(ATTEMPTS)))
    assert f"appended {expected_events():,} events" in result.stdout
    return nats_url


def expected_events() -> int:
    """How many events the demo fixture appends."""
    return len(synthetic_round(RUN_ID, events=EVENTS, attempts=ATTEMPTS, seed=0).entries)


def expected_summaries() -> int:
    """How many of them are attempts' summary events (on their channels): what the trace store folds."""
    return sum(1 for e in synthetic_round(RUN_ID, events=EVENTS, attempts=ATTEMPTS, seed=0).entries
               if type(e.event).CHANNEL)


def test_demo_through_the_embedded_server(tmp_path: Path) -> None:
    result = ok(hx("--data-dir", str(tmp_path), "demo", "--events", "300"))
    out = result.stdout
    for header in ("task", "attempts", "passes", "pass@1", "pass@2", "mean steps"):
        assert header in out
    assert "demo:coin:dev:000" in out
    assert re.search(r"trace_store digest\s+[0-9a-f]{64}", out)
    assert re.search(r"task_history digest\s+[0-9a-f]{64}", out)
    assert re.search(r"HX_TRACE at seq \d+", out)
    record = EmbeddedServer(tmp_path).record()
    assert record is None or not pid_alive(record.pid), "the embedded server outlived the command"


def test_demo_rerun_with_a_run_id_is_deduplicated(demo_url: str) -> None:
    first = ok(hx("--nats-url", demo_url, "log", "dump"))
    again = ok(hx("--nats-url", demo_url, "demo", "--run-id", RUN_ID, "--events", str(EVENTS)))
    assert "deduplicated" in again.stdout
    assert ok(hx("--nats-url", demo_url, "log", "dump")).stdout == first.stdout


def test_demo_bodies_are_deterministic() -> None:
    a = synthetic_round("r", events=500, attempts=3, seed=7)
    b = synthetic_round("r", events=500, attempts=3, seed=7)
    assert [(e.subject, e.key, e.event) for e in a.entries] == [(e.subject, e.key, e.event) for e in b.entries]
    assert len({e.key for e in a.entries}) == len(a.entries)


def test_log_dump_writes_one_json_line_per_event(demo_url: str) -> None:
    lines = ok(hx("--nats-url", demo_url, "log", "dump")).stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == expected_events()
    assert set(rows[0]) == {"seq", "index", "subject", "type", "version", "time", "event"}
    assert rows[0]["type"] == "run.started" and rows[0]["event"]["run_id"] == RUN_ID
    assert rows[0]["time"].endswith("+00:00")
    assert [(r["seq"], r["index"]) for r in rows] == sorted((r["seq"], r["index"]) for r in rows)

    finished = ok(hx("--nats-url", demo_url, "log", "dump", "--type", "attempt.finished",
                     "--type", "round.finished")).stdout.splitlines()
    types = [json.loads(line)["type"] for line in finished]
    assert set(types) == {"attempt.finished", "round.finished"}
    assert len(types) == sum(r["type"] in {"attempt.finished", "round.finished"} for r in rows)

    one = ok(hx("--nats-url", demo_url, "log", "dump", "--subject", f"hx.trace.{RUN_ID}.0.*.0",
                "--from", "2")).stdout.splitlines()
    assert one and all(json.loads(line)["subject"].endswith(".0") for line in one)


def test_log_dump_writes_conversations_in_full_unless_asked_for_them_as_stored(demo_url: str) -> None:
    dump = ("--nats-url", demo_url, "log", "dump", "--type", "model.request")
    requests = [json.loads(line)["event"] for line in ok(hx(*dump)).stdout.splitlines()]
    stored = [json.loads(line)["event"] for line in ok(hx(*dump, "--as-stored")).stdout.splitlines()]
    assert len(requests) == len(stored) > 10
    assert all(r["messages"] and r["history"] is None for r in requests)
    assert all(not s["messages"] and s["history"]["ordinal"] >= 0 for s in stored)
    # A later request rebuilds from spans of the one before it: the stored form is far smaller.
    assert sum(len(json.dumps(s)) for s in stored) * 2 < sum(len(json.dumps(r)) for r in requests)
    assert requests[0]["messages"][0]["role"] == "system"


def test_log_dump_rejects_an_unknown_type(demo_url: str) -> None:
    result = hx("--nats-url", demo_url, "log", "dump", "--type", "nope")
    assert result.exit_code == 2 and "unknown event type" in result.stderr


def test_log_tail_prints_the_last_events(demo_url: str) -> None:
    lines = ok(hx("--nats-url", demo_url, "log", "tail", "-n", "5")).stdout.splitlines()
    assert len(lines) == 5
    assert "run.finished" in lines[-1] and f"run_id='{RUN_ID}'" in lines[-1]
    dumped = ok(hx("--nats-url", demo_url, "log", "dump")).stdout.splitlines()
    tail_json = ok(hx("--nats-url", demo_url, "log", "tail", "-n", "3", "--json")).stdout.splitlines()
    assert tail_json == dumped[-3:]
    started = [line for line in dumped if '"type":"attempt.started"' in line]
    assert 3 < len(started) < 20
    every = ok(hx("--nats-url", demo_url, "log", "tail", "--type", "attempt.started")).stdout.splitlines()
    assert len(every) == len(started) and all(" attempt.started " in line for line in every)
    some = ok(hx("--nats-url", demo_url, "log", "tail", "-n", "3", "--type", "attempt.started")).stdout
    assert some.splitlines() == every[-3:]


def stop(proc: subprocess.Popen[str], sig: signal.Signals, expected: int) -> None:
    """Signal a follower and check its exit code, with the escape hatch a user has too.

    The first signal cancels the command. Python 3.11's ``asyncio.wait_for`` (inside nats-py's
    ``next_msg``) can swallow a cancellation that races a message (rarely: about 1 in 50 here),
    leaving a follower that no cancel ends; a second SIGTERM then exits at once with 143.
    """
    proc.send_signal(sig)
    try:
        assert proc.wait(timeout=5) == expected
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143


def test_log_tail_follow_prints_new_events_until_interrupted(demo_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hx", "--nats-url", demo_url, "log", "tail", "-n", "1", "--json", "-f"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # the tail is printed: the follow starts after it
        assert first["type"] == "run.finished"
        ok(hx("--nats-url", demo_url, "demo", "--run-id", "second", "--events", "50", "--attempts", "1"))
        new = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert [r["type"] for r in new] == ["run.started", "round.started", "attempt.started"]
        assert {r["event"]["run_id"] for r in new} == {"second"}
        stop(proc, signal.SIGINT, 130)
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_projections_run_follow_checkpoints_on_sigterm(demo_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hx", "--nats-url", demo_url, "projections", "run", "task_history"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        assert "following the log" in proc.stderr.readline()
        stop(proc, signal.SIGTERM, 143)
        assert "task_history: position" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    status = ok(hx("--nats-url", demo_url, "projections", "status", "task_history")).stdout
    assert "up to date" in status


def test_projections_list(nats_url: str) -> None:
    out = ok(hx("--nats-url", nats_url, "projections", "list")).stdout
    assert "trace_store" in out and "task_history" in out and "attempt.finished" in out


def test_projections_rebuild_then_status_agree(demo_url: str) -> None:
    rebuilt = ok(hx("--nats-url", demo_url, "projections", "rebuild", "trace_store")).stdout
    assert f"{expected_summaries()} events applied" in rebuilt and "events/s" in rebuilt
    digests = DIGEST.findall(rebuilt)
    assert len(digests) == 1
    status = ok(hx("--nats-url", demo_url, "projections", "status", "trace_store")).stdout
    assert DIGEST.findall(status) == digests
    assert "up to date" in status
    resumed = ok(hx("--nats-url", demo_url, "projections", "run", "trace_store", "--once")).stdout
    assert "resumed from" in resumed and DIGEST.findall(resumed) == digests

    never = ok(hx("--nats-url", demo_url, "projections", "status")).stdout
    blocks = dict(re.findall(r"^(\w+) \(v\d+, (HX_\w+)", never, flags=re.M))
    assert blocks == {"attempt_outputs": "HX_TRACE", "edit_ledger": "HX_LEDGER", "eval_scores": "HX_TRACE",
                      "task_history": "HX_TRACE", "trace_store": "HX_TRACE"}
    # The demo rebuilt task_history too; it wrote no ledger and no eval, and nothing read attempt outputs.
    assert never.count("never run") == 3
    assert all("never run" in never.split(name)[1].split("\n\n")[0] for name in ("attempt_outputs", "eval_scores"))
    assert len(DIGEST.findall(never)) == 2


def test_an_error_is_one_line_and_a_traceback_only_with_debug(nats_url: str) -> None:
    line = assert_one_error_line(hx("--nats-url", nats_url, "projections", "rebuild", "nope"))
    assert "unknown projection 'nope'" in line and "trace_store" in line
    debug = hx("--debug", "--nats-url", nats_url, "projections", "rebuild", "nope")
    assert debug.exit_code == 1
    assert "Traceback" in debug.stderr and debug.stderr.strip().splitlines()[-1].startswith("error: ")


def test_a_closed_port_is_an_error_without_the_password() -> None:
    url = f"nats://user:secret@127.0.0.1:{free_port()}"
    result = hx("--nats-url", url, "log", "dump")
    line = assert_one_error_line(result)
    assert "cannot connect" in line
    assert "secret" not in result.output
    debug = hx("--debug", "--nats-url", url, "projections", "status")
    assert debug.exit_code == 1 and "Traceback" in debug.stderr


def test_server_refuses_when_a_url_is_configured(nats_url: str) -> None:
    line = assert_one_error_line(hx("server", env={"HX_NATS_URL": nats_url}))
    assert "HX_NATS_URL" in line


def test_ctrl_c_exits_130_quietly(monkeypatch: pytest.MonkeyPatch, nats_url: str) -> None:
    def interrupted(coro: object) -> None:
        coro.close()  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(log_cli, "run", interrupted)
    result = hx("--nats-url", nats_url, "log", "dump")
    assert result.exit_code == 130 and result.stderr == ""


def test_quarantined_messages_are_counted_with_json_logs(demo_url: str) -> None:
    async def publish_junk() -> None:
        nc = await nats.connect(demo_url)
        try:
            await nc.jetstream().publish("hx.trace.junk._._._", b"\x00junk", headers={"Hx-Type": "no.such.type"})
        finally:
            await nc.close()

    asyncio.run(publish_junk())
    result = ok(hx("--json-logs", "--nats-url", demo_url, "log", "dump"))
    assert len(result.stdout.splitlines()) == expected_events()
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert any(entry["event"] == "message quarantined" and entry["level"] == "warning" for entry in logged)
    assert "1 undecodable message(s)" in result.stderr


def test_help_lists_the_command_groups() -> None:
    out = ok(hx("--help")).stdout
    for name in ("server", "log", "projections", "demo"):
        assert re.search(rf"^\s+{name}\b", out, re.MULTILINE)
