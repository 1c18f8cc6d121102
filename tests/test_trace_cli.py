"""``hx trace RUN TASK``: one attempt of a real ``hx run`` as a transcript, checked against the log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hx_cli import error_line, hx, ok
from model_server import model_server
from subscribe_kit import records, toy_run
from test_replay import STAGED, staged_run
from toybench import RANDOM, Corridor, ToyBench

from hx.environments.registry import TaskId
from hx.environments.rollout import Rollout, RolloutSettings
from hx.harnesses import starter_harness
from hx.runtime.task import Task
from schemas.event import Event
from schemas.hooks import ProcessorTriggered
from schemas.lifecycle import AttemptFinished
from schemas.model import ModelResponse
from schemas.tools import EnvObservation, ToolReturned
from streams.config import NatsSettings
from streams.connection import connect
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
    assert lines[0] == f"run {RUN} · trace round 0 · task {TASK} · attempt 1 (of 0, 1)"
    assert lines.pop(1) == "trace round 0: main rollouts"  # what the trace round was, from its round.started
    assert "model openai:m@http://127.0.0.1" in lines[1] and f"{len(log)} events" in lines[1]  # its subject only
    [finished] = [r.event for r in log if isinstance(r.event, AttemptFinished)]
    steps = [line.split("  (at ")[0] for line in lines if line.startswith("step ")]
    assert steps == [f"step {n}" for n in range(1, finished.steps + 1)]
    # each step says when it began in the attempt, in order
    offsets = [line.split("  (at ")[1] for line in lines if line.startswith("step ")]
    assert len(offsets) == finished.steps and all(o.endswith(" ms)") or o.endswith(" s)") for o in offsets)
    # each model call with how long it took, as the log says
    took = [f"{r.took_ns / 1e6:.0f} ms" if r.took_ns >= 1e6 else f"{r.took_ns / 1e6:.1f} ms"
            for r in log if isinstance(r.event, ModelResponse)]
    assert [line for line in lines if line.startswith("  model ")] == [
        f"  model       act({{\"action\": \"look\"}})  [stand-in, tool_calls, 10 in / 5 out tokens, {t}]"
        for t in took]
    assert len(took) == finished.steps
    outputs = [r.event.result.output for r in log if isinstance(r.event, ToolReturned)]
    assert [line.split(" -> ", 1)[1].rsplit("  (", 1)[0] for line in lines if line.startswith("  tool ")] == outputs
    assert "  observation user: You are in room 0 of" in out  # the first observation, from the resolved conversation
    triggers = [r.event for r in log if isinstance(r.event, ProcessorTriggered)]
    shown = [line for line in lines if line.startswith("  processor ")]
    assert len(shown) == len(triggers) and any(t.processor == "loop_detector" for t in triggers)
    step4 = out.split("step 4  (at ", 1)[1].split("\n", 1)[1].split("\n\n", 1)[0]
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
    assert first.startswith(f"run {RUN} · trace round 0 · task {TASK} · attempt 0 (of 0, 1)")


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


class Narrated(Corridor):
    """A corridor whose environment also reports each action's outcome, in other words at every second action."""

    def __init__(self, tid: TaskId, bench: ToyBench) -> None:
        super().__init__(tid, bench)
        self.events: list[Event] = []

    def act(self, action: str) -> str:
        output = super().act(action)
        said = output if self.actions % 2 else f"{output} ({self.actions} actions so far)"
        self.events.append(EnvObservation(step=self.actions, observation=said, done=self.won))
        return output

    def drain_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out


class NarratedBench(ToyBench):
    def make_task(self, task_id: TaskId) -> Task:
        return Narrated(task_id, self)


def test_each_step_reads_in_causal_order_without_repeating_the_tool_result(nats_url: str) -> None:
    async def go() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            rollout = Rollout([NarratedBench()], RANDOM, starter_harness("textworld"), log=conn.log,
                              harness_source="starter:textworld", settings=RolloutSettings(attempts=1, max_steps=8))
            await rollout.rollout("narrated", [TASK])
    asyncio.run(go())
    log = records(nats_url, [trace_subject("narrated", 0, TASK, 0)])
    said = {e.step: e.observation for r in log if isinstance(e := r.event, EnvObservation)}
    returned = {e.step: e.result.output for r in log if isinstance(e := r.event, ToolReturned)}
    assert len(said) >= 2 and said.keys() == returned.keys()
    out = ok(hx("--nats-url", nats_url, "trace", "narrated", TASK, "--full")).stdout
    blocks = {int(b.split("\n", 1)[0].split()[0]): b.split("\n\n")[0].split("\n")[1:] for b in out.split("\nstep ")[1:]}
    assert blocks.keys() == said.keys()
    for number, lines in blocks.items():
        labels = [line[2:14].strip() for line in lines if line.startswith("  ")]
        order = ["observation", "model", "tool", "environment", "processor"]
        assert labels == sorted(labels, key=order.index), (number, labels)  # seen, chosen, returned, triggered
        assert "model" in labels and labels.count("tool") == 1
        environment = [line[14:] for line in lines if line.startswith("  environment ")]
        # the environment's observation is shown only when it says something the tool result does not
        assert environment == ([] if said[number] == returned[number] else [said[number]]), number
    assert any(said[n] != returned[n] for n in said) and any(said[n] == returned[n] for n in said)


def test_trace_rounds_are_named_and_stage_picks_an_evolution_round(nats_url: str) -> None:
    staged_run(nats_url)
    task = "toy:walk:dev:100"
    gate = ok(hx("--nats-url", nats_url, "trace", STAGED, task, "--round", "5")).stdout.splitlines()
    assert gate[:2] == [f"run {STAGED} · trace round 5 (of 0, 1, 2, 3, 4, 5) · task {task} · attempt 0",
                        "trace round 5: gate rollouts of candidate C-R1-03 on v0, evolution round 1"]
    stage0 = ok(hx("--nats-url", nats_url, "trace", STAGED, task, "--stage", "0")).stdout.splitlines()
    assert stage0[1] == "trace round 0: main rollouts on v0, evolution round 0"
    assert error_line(hx("--nats-url", nats_url, "trace", STAGED, task, "--stage", "1")) == \
        f"error: task '{task}' was attempted in several main rollouts of evolution round 1, one per variant: " \
        "pass --round with one of trace rounds 3 (v0), 4 (v1)"
    assert error_line(hx("--nats-url", nats_url, "trace", STAGED, task, "--stage", "2")) == \
        f"error: run '{STAGED}' has no main rollouts of evolution round 2; its evolution rounds: 0, 1"
    both = hx("--nats-url", nats_url, "trace", STAGED, task, "--stage", "0", "--round", "0")
    assert both.exit_code == 2 and "exclude each other" in both.output
