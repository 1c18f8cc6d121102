"""``hx replay`` and ``hx fork`` on real rounds (the toy benchmark, TextWorldExpress coin) on a real nats-server."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import secrets
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from audit_kit import evolved_run
from hx_cli import error_line, hx, ok
from ledger_run import LedgerRun
from model_server import RecordedReplies, serving
from model_server import _answer as play
from toybench import RANDOM, ToyBench

from hx.aegis.ledger import Ledger
from hx.environments.registry import Benchmark, TaskId, register_benchmark
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.environments.splits import round_roles
from hx.environments.twx import TextWorldExpressBenchmark
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.replay.compare import compare_attempt
from hx.replay.replayer import harness_on_ledger
from hx.runtime.models import ModelConfig
from hx.runtime.task import Task, Tool
from hx.runtime.tracer import LogWriter
from projections.ledger import RunLedger
from schemas.edits import Reparam
from schemas.envelope import EncodedEvent, Record, encoded
from schemas.event import Event
from schemas.history import resolve
from schemas.hooks import HookRecord, StepStart, TaskStart
from schemas.lifecycle import AttemptFinished, RoundStarted, RunStarted
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema, Usage
from schemas.model import ModelError, ModelResponse
from schemas.tools import ToolReturned, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import TRACE, TraceAddress, trace_filter, trace_subject

RUN = "toy-replay"
TASKS = ["toy:walk:dev:100", "toy:walk:dev:101", "toy:walk:dev:102", "toy:easy:dev:100", "toy:crashy:dev:100"]
STARTER = starter_harness("textworld")
IDENTICAL = re.compile(r"^identical: (\d+) attempts, (\d+) events$", re.M)


def toy_round(nats_url: str, run_id: str = RUN, *, harness: HarnessConfig = STARTER, source: str = "starter:textworld",
              max_steps: int = 12) -> None:
    """One real round of the toy benchmark under the random agent, written by the rollout code as `hx run` does."""
    async def go() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            rollout = Rollout([ToyBench()], RANDOM, harness, log=conn.log, harness_source=source,
                              settings=RolloutSettings(attempts=2, max_steps=max_steps))
            await rollout.rollout(run_id, TASKS)
    asyncio.run(go())


async def _trace(nats_url: str, subjects: list[str]) -> tuple[int, list[Record]]:
    async with connect(NatsSettings(url=nats_url)) as conn:
        return await conn.log.last_seq(), [r async for r in conn.log.read(TRACE.name, subjects=subjects)]


def trace(nats_url: str, *subjects: str) -> tuple[int, list[Record]]:
    """The trace stream's last sequence and the records of some subjects."""
    return asyncio.run(_trace(nats_url, list(subjects)))


def replay(nats_url: str, *args: str) -> Any:
    return hx("--nats-url", nats_url, "replay", *args)


def test_a_round_replays_identically_and_the_log_is_untouched(nats_url: str) -> None:
    toy_round(nats_url)
    before, records = trace(nats_url, trace_filter(RUN))
    for env in ("log", "live"):
        out = ok(replay(nats_url, RUN, "--round", "0", "--env", env)).stdout
        found = IDENTICAL.search(out)
        assert found is not None, out
        attempts = sum(1 for r in records if isinstance(r.event, AttemptFinished))
        events = sum(1 for r in records if TraceAddress.parse(r.subject).attempt is not None)
        assert (int(found[1]), int(found[2])) == (attempts, events) and attempts == 10
    # one task, one attempt: the crashed attempt replays with its recorded failure
    out = ok(replay(nats_url, RUN, "--round", "0", "--task", "toy:crashy:dev:100", "--attempt", "1")).stdout
    assert "identical: 1 attempts" in out
    assert "identical: 5 attempts" in ok(replay(nats_url, RUN, "--round", "0", "--attempt", "1")).stdout
    after, again = trace(nats_url, trace_filter(RUN))
    assert after == before and [(r.seq, r.index, r.event) for r in again] == [(r.seq, r.index, r.event)
                                                                             for r in records]


def edited_starter(tmp_path: Path, name: str, processor: str, **params: Any) -> Path:
    """The starter harness with some parameters of one processor changed, as a file."""
    data = STARTER.to_dict()
    for proc in data["processors"]:
        if proc["type"] == processor:
            proc["params"].update(params)
    path = tmp_path / f"{name}.yaml"
    path.write_text(HarnessConfig.from_dict(data).dumps("yaml"))
    return path


def divergence(result: Any) -> tuple[int, int, str, int, str, str]:
    """Exit 3 and a divergence report: (seq, index, subject, step, event type, field path)."""
    assert result.exit_code == 3, result.output
    out = result.stdout
    where = re.search(r"first divergence at seq (\d+) index (\d+) on (\S+) \(event #\d+, step (\d+)\)", out)
    event, field = re.search(r"event: +(.+)$", out, re.M), re.search(r"field: +(.+)$", out, re.M)
    assert where is not None and event is not None and field is not None, out
    return int(where[1]), int(where[2]), where[3], int(where[4]), event[1], field[1]


def test_a_changed_harness_is_named_at_its_first_diverging_event_and_field(nats_url: str, tmp_path: Path) -> None:
    toy_round(nats_url)
    # a prompt edit: the first event whose body differs is task_start as the pipeline returned it
    prompt = edited_starter(tmp_path, "prompt", "system_prompt_template", template="$system_prompt Hurry.")
    seq, index, subject, step, event, field = divergence(replay(nats_url, RUN, "--round", "0", "--harness",
                                                                str(prompt)))
    assert (event, field, step) == ("hook task_start (returned)", "event.system_prompt", 0)
    _, records = trace(nats_url, subject)
    logged = next(r for r in records if (r.seq, r.index) == (seq, index))  # the position names the logged event
    assert isinstance(logged.event, HookRecord) and logged.event.stage == "returned"
    assert isinstance(logged.event.event, TaskStart) and "Hurry" not in logged.event.event.system_prompt
    # a narrower history window: the window acts where it did not, an event the log does not have
    narrow = edited_starter(tmp_path, "narrow", "history_window", keep_last=3)
    result = replay(nats_url, RUN, "--round", "0", "--harness", str(narrow))
    seq, index, subject, step, event, field = divergence(result)
    assert (event, field) == ("processor.triggered", "(an event the log does not have)")
    assert '"processor":"history_window"' in result.stdout and step >= 2
    _, records = trace(nats_url, subject)
    logged = next(r for r in resolve(records) if (r.seq, r.index) == (seq, index))
    assert isinstance(logged.event, HookRecord) and isinstance(logged.event.event, StepStart)
    assert len(logged.event.event.messages) > 3  # the logged step the window would have cut


def test_a_divergence_names_the_tool_call_field(nats_url: str) -> None:
    toy_round(nats_url)
    subject = trace_subject(RUN, 0, TASKS[0], 0)
    _, records = trace(nats_url, subject)
    resolved = list(resolve(records))
    events = [r.event for r in resolved]
    i = next(i for i, e in enumerate(events) if isinstance(e, ModelResponse) and e.tool_calls)
    response = events[i]
    assert isinstance(response, ModelResponse)
    other = "look" if response.tool_calls[0].input["action"] != "look" else "move east"
    events[i] = msgspec.structs.replace(response, tool_calls=(ToolCall(id=response.tool_calls[0].id, name="act",
                                                                       input={"action": other}),))
    found = compare_attempt(subject, resolved, events)
    assert found is not None
    assert (found.seq, found.index, found.event_type) == (resolved[i].seq, resolved[i].index, "model.response")
    assert (found.path, found.logged, found.replayed) == ("tool_calls[0].input.action",
                                                          response.tool_calls[0].input["action"], other)
    assert compare_attempt(subject, resolved, events[:-1]) is not None  # a missing last event is a divergence
    assert compare_attempt(subject, resolved, [r.event for r in resolved]) is None


def test_bad_input_is_one_line(nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toy_round(nats_url)
    assert error_line(replay(nats_url, "nope", "--round", "0")) == "error: run 'nope' is not on the log"
    assert "has no round 7; its rounds: 0" in error_line(replay(nats_url, RUN, "--round", "7"))
    assert "has no attempt of task 'toy:walk:dev:999'" in error_line(
        replay(nats_url, RUN, "--round", "0", "--task", "toy:walk:dev:999"))
    assert error_line(replay(nats_url, RUN, "--round", "0", "--task", TASKS[0], "--attempt", "5")) == \
        f"error: round 0 of run '{RUN}' has no attempt of task '{TASKS[0]}' numbered 5; its attempts of task " \
        f"'{TASKS[0]}': 0, 1"
    assert error_line(replay(nats_url, RUN, "--round", "0", "--attempt", "7")) == \
        f"error: round 0 of run '{RUN}' has no attempt numbered 7; its attempts: 0, 1"  # the numbers, not the tasks
    # --stage takes evolution rounds: a plain run has none, and says which trace rounds it has
    assert error_line(replay(nats_url, RUN, "--stage", "0")) == \
        f"error: run '{RUN}' has no main rollouts of evolution round 0; it has no evolution rounds (use --round " \
        "for its trace rounds: 0)"
    # a plain run whose harness file is gone still replays: its run.started holds the whole harness
    gone = tmp_path / "gone.yaml"
    gone.write_text(STARTER.dumps("yaml"))
    toy_round(nats_url, "toy-gone", source=str(gone))
    gone.unlink()
    assert "identical: 10 attempts" in ok(replay(nats_url, "toy-gone", "--round", "0")).stdout
    # a log written before hx recorded the whole harness, whose file is gone: the harness is nowhere
    older = Rollout.run_config
    monkeypatch.setattr(Rollout, "run_config", lambda self, extra=None: {
        k: v for k, v in older(self, extra).items() if k != "harness_config"})
    gone.write_text(STARTER.dumps("yaml"))
    toy_round(nats_url, "toy-older", source=str(gone))
    gone.unlink()
    line = error_line(replay(nats_url, "toy-older", "--round", "0"))
    assert "which" not in line and "cannot be read" in line and "--harness" in line
    fork = ("--nats-url", nats_url, "fork", RUN, "--task", TASKS[0], "--attempt", "0")
    assert "--step must be 0 to" in error_line(hx(*fork, "--step", "99"))
    assert error_line(hx("--nats-url", nats_url, "fork", "nope", "--task", TASKS[0], "--attempt", "0", "--step",
                         "1")) == "error: run 'nope' is not on the log"
    assert "ran attempt 9" in error_line(hx(*fork[:-1], "9", "--step", "1"))
    assert "unknown model provider" in error_line(hx(*fork, "--step", "1", "--model", "nosuch:x"))
    # a task its benchmark cannot build again: the fork says so before it writes anything
    async def broken() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            await Rollout([ToyBench()], RANDOM, STARTER, log=conn.log, harness_source="starter:textworld",
                          settings=RolloutSettings(attempts=1)).rollout("toy-broken", ["toy:broken:dev:100"])
    asyncio.run(broken())
    before = trace(nats_url, trace_filter("toy-broken"))[0]
    assert "could not build task 'toy:broken:dev:100'" in error_line(hx(
        "--nats-url", nats_url, "fork", "toy-broken", "--task", "toy:broken:dev:100", "--attempt", "0", "--step", "0"))
    assert trace(nats_url, trace_filter("toy-broken"))[0] == before
    assert "identical: 1 attempts" in ok(replay(nats_url, "toy-broken", "--round", "0")).stdout  # its failure too
    # a message of a schema version this hx does not read: named, not replayed against a partial log
    toy_round(nats_url, "toy-newer")
    asyncio.run(publish(nats_url, trace_subject("toy-newer", 0, TASKS[0], 0), b"\x80",
                        {"Hx-Type": "tool.returned", "Hx-Schema-Version": "9"}))
    line = error_line(replay(nats_url, "toy-newer", "--round", "0"))
    assert "round 0 of run 'toy-newer' holds messages this hx cannot decode (e.g. seq" in line
    assert "schema version '9'" in line


async def publish(nats_url: str, subject: str, body: bytes, headers: dict[str, str]) -> None:
    """Append one raw message to the trace, as a writer of another hx version would."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        await conn.js.publish(subject, body, headers=headers)


def test_a_candidate_round_replays_under_the_harness_its_ledger_builds(nats_url: str) -> None:
    evo = LedgerRun(run_id="toy-evo")
    cand = evo.proposed(0, "C-R0-01", (Reparam(group="history_window", params={"keep_last": 4}),))
    built = harness_on_ledger(RunLedger.of(evo.records), cand.digest)
    assert built is not None and built[0].digest == cand.digest and "candidate C-R0-01" in built[1]
    assert harness_on_ledger(RunLedger.of(evo.records), "sha256:nothing") is None

    async def write() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            ledger = Ledger(conn, "toy-evo")
            try:
                await ledger.start(evo.records[0])  # type: ignore[arg-type]
                await ledger.append(*evo.records[1:])
            finally:
                await ledger.close()
            rollout = Rollout([ToyBench()], RANDOM, built[0], log=conn.log, harness_source="v0",
                              settings=RolloutSettings(attempts=1, max_steps=12))
            await rollout.start("toy-evo", kind="evolve")
            await rollout.run_round("toy-evo", 0, TASKS[:3], label=RoundLabel(purpose="gate", candidate="C-R0-01"))
    asyncio.run(write())
    result = ok(replay(nats_url, "toy-evo", "--round", "0"))
    assert "identical: 3 attempts" in result.stdout and "candidate C-R0-01" in result.stderr


STAGED = "toy-stages"
SAME_EDIT = (Reparam(group="history_window", params={"keep_last": 4}),)


def staged_run(nats_url: str) -> None:
    """An evolution run's trace rounds, labelled as the loop labels them, whose numbers are not its evolution rounds.

    Trace rounds: 0 main v0 (evolution round 0), 1 gate of C-R0-02, 2 held-out, 3 main v0 and 4 main v1
    (evolution round 1), 5 gate of C-R1-03. C-R0-02, C-R1-03 and variant v1 all build the same harness.
    """
    evo = LedgerRun(run_id=STAGED)
    first = evo.proposed(0, "C-R0-02", SAME_EDIT)
    evo.forked(0, "C-R0-02", "v1", ("c",))
    second = evo.proposed(1, "C-R1-03", SAME_EDIT)
    assert first.digest == second.digest
    edited = harness_on_ledger(RunLedger.of(evo.records), first.digest)
    assert edited is not None
    rounds = [(STARTER, RoundLabel(purpose="main", variant="v0", stage_round=0)),
              (edited[0], RoundLabel(purpose="gate", variant="v0", candidate="C-R0-02", stage_round=0)),
              (STARTER, RoundLabel(purpose="heldout", variant="v0", stage_round=0)),
              (STARTER, RoundLabel(purpose="main", variant="v0", stage_round=1)),
              (edited[0], RoundLabel(purpose="main", variant="v1", stage_round=1)),
              (edited[0], RoundLabel(purpose="gate", variant="v0", candidate="C-R1-03", stage_round=1))]

    async def write() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            ledger = Ledger(conn, STAGED)
            try:
                await ledger.start(evo.records[0])  # type: ignore[arg-type]
                await ledger.append(*evo.records[1:])
            finally:
                await ledger.close()
            for number, (harness, label) in enumerate(rounds):
                rollout = Rollout([ToyBench()], RANDOM, harness, log=conn.log, harness_source="v0",
                                  settings=RolloutSettings(attempts=1, max_steps=6))
                if number == 0:
                    await rollout.start(STAGED, kind="evolve")
                await rollout.run_round(STAGED, number, TASKS[:2], label=label)
    asyncio.run(write())


def test_trace_rounds_are_named_and_evolution_rounds_are_reached_with_stage(nats_url: str) -> None:
    staged_run(nats_url)
    before = trace(nats_url, trace_filter(STAGED))[0]
    # a gate round says what it was, and its harness is its own candidate's (not the first ledger entry building it)
    gate = ok(replay(nats_url, STAGED, "--round", "5"))
    assert "identical: 2 attempts" in gate.stdout
    assert f"replayed run {STAGED}, trace round 5: gate rollouts of candidate C-R1-03 on v0, evolution round 1; " \
           "harness from the ledger (candidate C-R1-03 of round 1 on variant v0, initial)" in gate.stderr
    v1 = ok(replay(nats_url, STAGED, "--round", "4")).stderr
    assert "trace round 4: main rollouts on v1, evolution round 1; harness from the ledger (variant v1, forked" in v1
    assert "trace round 2: held-out evaluation on v0, evolution round 0;" in ok(
        replay(nats_url, STAGED, "--round", "2")).stderr
    # --stage N: the main rollouts of evolution round N, every variant's
    stage1 = ok(replay(nats_url, STAGED, "--stage", "1"))
    assert len(IDENTICAL.findall(stage1.stdout)) == 2
    headers = [line for line in stage1.stderr.splitlines() if line.startswith("replayed ")]
    assert [h.split(";")[0] for h in headers] == [
        f"replayed run {STAGED}, trace round 3: main rollouts on v0, evolution round 1",
        f"replayed run {STAGED}, trace round 4: main rollouts on v1, evolution round 1"]
    stage0 = ok(replay(nats_url, STAGED, "--stage", "0", "--attempt", "0"))
    assert [attempts for attempts, _ in IDENTICAL.findall(stage0.stdout)] == ["2"]  # one variant in round 0
    assert "trace round 0: main rollouts on v0, evolution round 0;" in stage0.stderr
    assert error_line(replay(nats_url, STAGED, "--stage", "7")) == \
        f"error: run '{STAGED}' has no main rollouts of evolution round 7; its evolution rounds: 0, 1"
    assert error_line(replay(nats_url, "nope", "--stage", "0")) == "error: run 'nope' is not on the log"
    both = replay(nats_url, STAGED, "--round", "0", "--stage", "0")
    assert both.exit_code == 2 and "--round (a trace round) and --stage (an evolution round) exclude" in both.output
    neither = replay(nats_url, STAGED)
    assert neither.exit_code == 2 and "pass --round N (a trace round) or --stage N" in neither.output
    assert trace(nats_url, trace_filter(STAGED))[0] == before


def test_a_fork_shares_the_steps_before_it_and_records_its_provenance(nats_url: str) -> None:
    toy_round(nats_url, max_steps=20)
    _, records = trace(nats_url, trace_filter(RUN))
    long = sorted((e.steps, e.task_id, e.attempt) for r in records if isinstance(e := r.event, AttemptFinished)
                  and e.status == "completed")[-1]
    steps, task, attempt = long
    assert steps >= 4
    step = 2
    args = ("--nats-url", nats_url, "fork", RUN, "--task", task, "--attempt", str(attempt), "--step", str(step))
    out = ok(hx(*args, "--seed", "11", "--fork-id", "toy-fork")).stdout
    assert f"fork toy-fork: round 0, task {task}, attempt {attempt}, steps 1-{step} from the log" in out
    assert f"original: passed (completed, {steps} steps)" in out
    departs = re.search(r"departs from the original at event #\d+ \(step (\d+)\): model\.response tool_calls", out)
    assert departs is not None and int(departs[1]) > step, out
    # the fork is on the log with its provenance, and its events up to the step are the original's
    _, fork_records = trace(nats_url, trace_subject("toy-fork"), trace_filter("toy-fork", 0, task, attempt))
    started = fork_records[0].event
    assert isinstance(started, RunStarted) and started.kind == "fork"
    expected = {"source_run": RUN, "source_round": 0, "task": task, "attempt": attempt, "step": step,
                "model": "random:", "harness_digest": STARTER.digest, "seed": 11}
    assert {k: started.config["fork"][k] for k in expected} == expected
    fork_steps = {getattr(r.event, "step", 0) for r in fork_records[1:]}
    assert max(fork_steps) >= step
    # the same model and seed from the step on: the fork is the original again
    same = ok(hx(*args, "--fork-id", "toy-fork-same")).stdout
    assert "the fork's events equal the original's to the end" in same
    assert IDENTICAL.search(ok(replay(nats_url, "toy-fork", "--round", "0")).stdout)
    assert "already on the log" in error_line(hx(*args, "--fork-id", "toy-fork"))


@pytest.mark.slow
def test_a_textworld_coin_round_replays_identically_in_both_environments(nats_url: str) -> None:
    async def go() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            bench = TextWorldExpressBenchmark()
            try:
                rollout = Rollout([bench], RANDOM, STARTER, log=conn.log, harness_source="starter:textworld",
                                  settings=RolloutSettings(attempts=1, max_steps=30, concurrency=2))
                await rollout.rollout("coin-replay", ["twx:coin:dev:0", "twx:coin:dev:1"])
            finally:
                bench.close()
    asyncio.run(go())
    for env in ("log", "live"):
        assert "identical: 2 attempts" in ok(replay(nats_url, "coin-replay", "--round", "0", "--env", env)).stdout


ROLL = ToolSchema(name="roll", description="Roll a die.", input_schema={
    "type": "object", "properties": {"sides": {"type": "integer", "enum": [6, 20]}}, "required": ["sides"]})


class Dice(Task):
    """Three rolls of a real die (the OS's entropy), then the game is over and won."""

    def __init__(self, tid: TaskId) -> None:
        self.spec = TaskSpec(id=str(tid), instruction="Roll three times.", benchmark="dice", split=tid.split,
                             seed=tid.seed)
        self.rolls: list[int] = []

    def tools(self) -> list[Tool]:
        return [DieTool(self)]

    async def reset(self) -> str:
        return "Roll."

    @property
    def done(self) -> bool:
        return len(self.rolls) >= 3

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="dice", passed=len(self.rolls) == 3, score=1.0)


class DieTool(Tool):
    schema = ROLL
    nondeterministic = True  # the OS's entropy: a replay must feed what was rolled

    def __init__(self, task: Dice) -> None:
        self.task = task

    async def call(self, call: ToolCall) -> ToolResult:
        value = 1 + secrets.randbelow(int(call.input["sides"]))
        self.task.rolls.append(value)
        return ToolResult(call_id=call.id, name=call.name, output=str(value))


class DiceBench(Benchmark):
    name: ClassVar[str] = "dice"

    def games(self) -> tuple[str, ...]:
        return ("three",)

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        return self.first_ids(game, split, 4, limit)

    def make_task(self, task_id: TaskId) -> Task:
        return Dice(task_id)


register_benchmark("dice", DiceBench)


def test_nondeterministic_tool_results_are_fed_from_the_log(nats_url: str) -> None:
    async def go() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            rollout = Rollout([DiceBench()], RANDOM, HarnessConfig.from_dict({"processors": []}), log=conn.log,
                              harness_source="inline", settings=RolloutSettings(attempts=2, max_steps=5))
            await rollout.rollout("dice", [str(t) for t in DiceBench().task_ids("three", "dev")])
    asyncio.run(go())
    _, records = trace(nats_url, trace_filter("dice"))
    rolled = [r.event for r in records if isinstance(r.event, ToolReturned)]
    assert len(rolled) == 24 and all(e.nondeterministic for e in rolled)
    with tempfile.TemporaryDirectory() as tmp:
        harness = Path(tmp) / "empty.yaml"
        harness.write_text(HarnessConfig.from_dict({"processors": []}).dumps("yaml"))
        for env in ("log", "live"):  # the real dice roll again in a live replay: their results come from the log
            out = ok(replay(nats_url, "dice", "--round", "0", "--env", env, "--harness", str(harness))).stdout
            assert "identical: 8 attempts" in out


def test_failed_model_tries_are_left_out_of_the_comparison(nats_url: str) -> None:
    calls = itertools.count()

    class Flaky(RecordedReplies):
        def do_POST(self) -> None:  # every third call fails: the router retries it
            request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            if next(calls) % 3 == 2:
                self.reply(503, b'{"error": {"message": "overloaded"}}')
            else:
                self.reply(200, json.dumps(play(request)).encode())

    with serving(Flaky) as url:
        async def go() -> None:
            async with connect(NatsSettings(url=nats_url)) as conn:
                models = ModelConfig(main=f"openai:stand-in@{url}/v1", backoff_s=0.001)
                rollout = Rollout([ToyBench()], models, STARTER, log=conn.log, harness_source="starter:textworld",
                                  settings=RolloutSettings(attempts=1, max_steps=4))
                await rollout.rollout("flaky", TASKS[:2])
        asyncio.run(go())
    _, records = trace(nats_url, trace_filter("flaky"))
    assert sum(isinstance(r.event, ModelError) for r in records) >= 2
    assert "identical: 2 attempts" in ok(replay(nats_url, "flaky", "--round", "0")).stdout


class BeforeUsage(LogWriter):
    """Writes ``attempt.finished`` as hx did before it held ``usage`` (its body has no such field)."""

    async def write_encoded(self, subject: str, events: Sequence[Event], bodies: Sequence[EncodedEvent],
                            key: str) -> None:
        """The frame, each ``AttemptFinished`` encoded again without its usage total."""
        bodies = [encoded(msgspec.structs.replace(e, usage=Usage()), b[3]) if isinstance(e, AttemptFinished) else b
                  for e, b in zip(events, bodies, strict=True)]
        await super().write_encoded(subject, events, bodies, key)


def test_an_attempt_logged_before_its_usage_total_replays_identically(nats_url: str) -> None:
    class Play(RecordedReplies):
        def do_POST(self) -> None:  # every answer reports tokens used
            request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            self.reply(200, json.dumps(play(request)).encode())

    with serving(Play) as url:
        async def go() -> None:
            async with connect(NatsSettings(url=nats_url)) as conn:
                models = ModelConfig(main=f"openai:stand-in@{url}/v1")
                rollout = Rollout([ToyBench()], models, STARTER, log=conn.log, harness_source="starter:textworld",
                                  settings=RolloutSettings(attempts=1, max_steps=4), writer=BeforeUsage(conn.log))
                await rollout.rollout("old-usage", TASKS[:2])
        asyncio.run(go())
    _, records = trace(nats_url, trace_filter("old-usage"))
    finished = [r.event for r in records if isinstance(r.event, AttemptFinished)]
    responses = [r.event for r in records if isinstance(r.event, ModelResponse)]
    assert len(finished) == 2 and all(f.usage == Usage() for f in finished)
    assert responses and all(r.usage.input_tokens == 10 for r in responses)
    assert "identical: 2 attempts" in ok(replay(nats_url, "old-usage", "--round", "0")).stdout


@pytest.mark.slow
def test_every_round_of_an_evolution_run_replays_identically(tmp_path: Path) -> None:
    with evolved_run(tmp_path) as run:
        async def rounds() -> dict[int, RoundStarted]:
            async with connect(NatsSettings(url=run.url)) as conn:
                return await round_roles(conn.log, run.run_id)
        found = asyncio.run(rounds())
        assert {ev.purpose for ev in found.values()} >= {"main", "gate", "heldout"}
        before = trace(run.url, trace_filter(run.run_id))[0]
        audited = ok(run.hx("audit", "verify", run.run_id)).stdout
        for number, started in sorted(found.items()):
            result = run.hx("replay", run.run_id, "--round", str(number))
            assert IDENTICAL.search(ok(result).stdout), (number, started.purpose, result.output)
            assert "from the ledger" in result.stderr
            assert f"trace round {number}: " in result.stderr  # what the round was, from its round.started
            if started.candidate:  # a gate round's harness is its own candidate's, or (a sequential wave's base
                # round, the same seeds under the variant's harness) its variant's
                assert (f"from the ledger (candidate {started.candidate} of" in result.stderr
                        or f"from the ledger (variant {started.variant}" in result.stderr), result.stderr
        mains = sorted(n for n, ev in found.items() if ev.purpose == "main" and ev.stage_round == 0)
        stage = ok(run.hx("replay", run.run_id, "--stage", "0"))
        assert len(IDENTICAL.findall(stage.stdout)) == len(mains) >= 1
        assert [f"trace round {n}: main rollouts" in stage.stderr for n in mains] == [True] * len(mains)
        assert trace(run.url, trace_filter(run.run_id))[0] == before
        assert ok(run.hx("audit", "verify", run.run_id)).stdout == audited  # the audit of the original: unchanged
