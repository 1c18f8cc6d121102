"""``hx trace RUN TASK``: one attempt of a real ``hx run`` as a transcript, checked against the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hx_cli import error_line, hx, ok
from model_server import model_server
from subscribe_kit import records, toy_run

from schemas.hooks import ProcessorTriggered
from schemas.lifecycle import AttemptFinished
from schemas.model import ModelResponse
from schemas.tools import ToolReturned
from streams.topology import trace_filter, trace_subject

RUN, TASK = "traced", "toy:walk:dev:100"


@pytest.fixture
def traced(nats_url: str, tmp_path: Path) -> str:
    """A real run whose model always looks: the loop detector steps in at the fourth step."""
    with model_server("play") as server:
        toy_run(nats_url, tmp_path, RUN, "--model", f"openai:m@http://{server.url}/v1", tasks=2, attempts=2,
                max_steps=5)
    return nats_url


def test_an_attempt_reads_as_its_log_says(traced: str) -> None:
    nats_url = traced
    subject = trace_subject(RUN, 0, TASK, 1)
    log = records(nats_url, [subject])
    out = ok(hx("--nats-url", nats_url, "trace", RUN, TASK, "--attempt", "1")).stdout
    lines = out.splitlines()
    assert lines[0] == f"run {RUN} · round 0 · task {TASK} · attempt 1 (of 0, 1)"
    assert "model openai:m@http://127.0.0.1" in lines[1] and f"{len(log)} events" in lines[1]  # its subject only
    [finished] = [r.event for r in log if isinstance(r.event, AttemptFinished)]
    steps = [line for line in lines if line.startswith("step ")]
    assert steps == [f"step {n}" for n in range(1, finished.steps + 1)]
    assert out.count("  model       act({\"action\": \"look\"})  [stand-in, tool_calls, 10 in / 5 out tokens]") == \
        len([r for r in log if isinstance(r.event, ModelResponse)]) == finished.steps
    outputs = [r.event.result.output for r in log if isinstance(r.event, ToolReturned)]
    assert [line.split(" -> ", 1)[1] for line in lines if line.startswith("  tool ")] == outputs
    assert "  observation user: You are in room 0 of" in out  # the first observation, from the resolved conversation
    triggers = [r.event for r in log if isinstance(r.event, ProcessorTriggered)]
    shown = [line for line in lines if line.startswith("  processor ")]
    assert len(shown) == len(triggers) and any(t.processor == "loop_detector" for t in triggers)
    step4 = out.split("step 4\n", 1)[1].split("\n\n", 1)[0]
    assert "loop_detector changed messages at before_model" in step4
    assert "observation user: You are repeating yourself" in step4  # what the processor added, as the model saw it
    assert lines[-1] == f"  outcome     {'passed' if finished.passed else 'failed'} after {finished.steps} steps, " \
                        f"score {finished.score:g}, {finished.status}: {finished.reason}"
    assert finished.status == "budget_exhausted" and finished.reason  # the model only ever looks

    data = json.loads(ok(hx("--nats-url", nats_url, "trace", RUN, TASK, "--attempt", "1", "--json")).stdout)
    assert (data["run"], data["round"], data["task"], data["attempt"]) == (RUN, 0, TASK, 1)
    assert [s["number"] for s in data["steps"]] == list(range(1, finished.steps + 1))
    assert [t["result"]["output"] for s in data["steps"] for t in s["tools"]] == outputs
    assert data["events"] == len(log) < len(records(nats_url, [trace_filter(RUN)]))

    first = ok(hx("--nats-url", nats_url, "trace", RUN, TASK)).stdout  # defaults: the latest round, attempt 0
    assert first.startswith(f"run {RUN} · round 0 · task {TASK} · attempt 0 (of 0, 1)")


def test_what_does_not_exist_is_named_with_what_does(traced: str) -> None:
    nats_url = traced
    before = len(records(nats_url))
    assert error_line(hx("--nats-url", nats_url, "trace", "nope", TASK)) == \
        f"error: no run 'nope' on the log; runs: {RUN}"
    assert error_line(hx("--nats-url", nats_url, "trace", RUN, "toy:walk:dev:999")) == \
        f"error: run '{RUN}' has no task 'toy:walk:dev:999'; its tasks: toy:walk:dev:100, toy:walk:dev:101"
    assert error_line(hx("--nats-url", nats_url, "trace", RUN, TASK, "--round", "4")) == \
        f"error: task '{TASK}' of run '{RUN}' has no attempt in round 4; rounds with attempts: 0"
    assert error_line(hx("--nats-url", nats_url, "trace", RUN, TASK, "--attempt", "2")) == \
        f"error: task '{TASK}' of run '{RUN}' has no attempt 2 in round 0; attempts: 0, 1"
    assert hx("--nats-url", nats_url, "trace", "bad/run", TASK).exit_code == 2  # an invalid run id: a usage error
    assert len(records(nats_url)) == before  # reading wrote nothing
