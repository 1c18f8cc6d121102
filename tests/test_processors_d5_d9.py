"""The D5-D9 processor library, each processor working inside a real run against a real nats-server.

Every run uses the ``script:`` provider for the model, a small task written here, and a
fresh nats-server; effects are read off the ``AttemptResult`` and the events on the log.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from hx.harness.config import HarnessConfig
from hx.harness.contracts import check_contract
from hx.harness.processor import Processor
from hx.processors import sandbox
from hx.processors.attempt_workspace import AttemptWorkspace, current_workspace
from hx.processors.budget import Budget
from hx.processors.llm_judge import LlmJudge, parse_verdict
from hx.processors.loop_detector import LoopDetector, repeats
from hx.processors.otel_spans import OtelSpanEmitter
from hx.processors.risky_tool_approval import RiskyToolApproval
from hx.processors.rl_records import RlRecords, read_rl_records
from hx.processors.sandbox import PythonSandboxTool, SandboxLimits, run_python, unshare_prefix
from hx.processors.self_check import SelfCheck
from hx.processors.sft_trajectories import SftTrajectories
from hx.processors.structlog_events import StructlogEvents
from hx.processors.subprocess_sandbox import SubprocessSandbox, code_violations
from hx.processors.testing import check_processor
from hx.processors.training_bridge import RLRecord, attempt_to_rl_records, group_advantages
from hx.runtime.loop import BLOCKED, AttemptResult
from hx.runtime.models import ModelConfig
from hx.runtime.task import FunctionTool, Task, Tool
from projections.otel_spans import OtelSpans, SpanExportRunner
from schemas.envelope import Record
from schemas.event import Event
from schemas.history import resolve_async
from schemas.hooks import AfterModel, AfterTool, BeforeTool, HookRecord, ProcessorTriggered, TaskStart
from schemas.lifecycle import AttemptFinished
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.model import ModelRequest, ModelResponse
from schemas.tools import ToolInvoked, ToolReturned, VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.redaction import register
from streams.topology import trace_filter

E = TypeVar("E", bound=Event)

# --- a small task, the model script and the run --------------------------------------------------------------


class DemoTask(Task):
    """One question, a few tools, and an exact-match verifier (``expected`` None: always passes)."""

    def __init__(self, tools: Sequence[Tool] = (), *, task_id: str = "demo:1", instruction: str = "Solve it.",
                 expected: str | None = None) -> None:
        self.spec = TaskSpec(id=task_id, instruction=instruction, benchmark="demo")
        self._tools = list(tools)
        self.expected = expected

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def reset(self) -> str:
        return self.spec.instruction

    async def verify(self, final_answer: str) -> VerifierScore:
        passed = self.expected is None or final_answer.strip() == self.expected
        return VerifierScore(verifier="demo", passed=passed, score=1.0 if passed else 0.0,
                             reward=1.0 if passed else -1.0)

    async def close(self) -> None:
        for tool in self._tools:
            if isinstance(tool, PythonSandboxTool):
                tool.close()


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    """A scripted completion that calls one tool."""
    return {"tool_calls": [{"id": call_id, "name": name, "input": arguments}]}


def answer(text: str, **extra: Any) -> dict[str, Any]:
    """A scripted final answer."""
    return {"content": text, "stop_reason": "end_turn", **extra}


def echo_tool(name: str = "look", output: str = "You see a wall.", log: list[dict[str, Any]] | None = None) -> Tool:
    """A tool that returns the same text every time (and records its inputs)."""
    def fn(**kwargs: Any) -> str:
        if log is not None:
            log.append(kwargs)
        return output
    return FunctionTool(ToolSchema(name=name, input_schema={"type": "object"}), fn)


def add_tool() -> Tool:
    return FunctionTool(ToolSchema(name="add", input_schema={"type": "object"}), lambda a, b: a + b)


_RUN_IDS = itertools.count()


async def run(nats_url: str, harness: HarnessConfig, task: Task, completions: Sequence[dict[str, Any]], *,
              attempts: int = 1, max_steps: int = 20,
              run_id: str | None = None) -> tuple[list[AttemptResult], list[Record]]:
    """Run ``attempts`` attempts of ``task`` with the scripted model; return the results and that run's events."""
    run_id = run_id or f"t{next(_RUN_IDS)}"  # a fresh run per call: the loop refuses to rerun a logged attempt
    models = ModelConfig(main="script:demo", provider_options={"script:demo": {"completions": list(completions)}})
    results = []
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = models.agentic(harness, log=conn.log)
        for attempt in range(attempts):
            results.append(await agent.run(task, run_id=run_id, attempt=attempt, max_steps=max_steps))
        records = [r async for r in resolve_async(conn.log.read(subjects=[trace_filter(run=run_id)]))]
    return results, records


def events(records: list[Record], cls: type[E], attempt: int | None = None) -> list[E]:
    """The events of one type on the log (of one attempt, by subject, when given)."""
    return [r.event for r in records if isinstance(r.event, cls)
            and (attempt is None or r.subject.endswith(f".{attempt}"))]


def triggers(records: list[Record], processor: str) -> list[ProcessorTriggered]:
    return [t for t in events(records, ProcessorTriggered) if t.processor == processor]


def returned(records: list[Record], cls: type[Any]) -> list[Any]:
    """The hook events of one type as the pipeline returned them."""
    return [h.event for h in events(records, HookRecord) if h.stage == "returned" and isinstance(h.event, cls)]


def tool_returned(records: list[Record], call_id: str) -> ToolResult:
    return next(e.result for e in events(records, ToolReturned) if e.result.call_id == call_id)


# --- every processor passes the contract kit -------------------------------------------------------------------


def kit_processors(tmp: Path) -> list[Processor]:
    judge = {"script:judge": {"completions": [{"content": "VERDICT: FAIL\nwrong door"}]}}
    return [
        AttemptWorkspace(root=str(tmp / "ws"), files={"data/in.txt": "x"}),
        SubprocessSandbox(tools=("act",), code_field="command"),
        SelfCheck(),
        LlmJudge(model="script:judge", provider_options=judge),
        LoopDetector(warn_after=2, interrupt_after=0),
        Budget(max_model_calls=2),
        RiskyToolApproval(),
        OtelSpanEmitter(),
        StructlogEvents(include_text=True),
        RlRecords(path=str(tmp / "rl.jsonl")),
        SftTrajectories(path=str(tmp / "sft.jsonl")),
    ]


@pytest.mark.parametrize("index", range(11))
async def test_each_processor_passes_the_contract_kit(index: int, tmp_path: Path) -> None:
    processor = kit_processors(tmp_path)[index]
    report = await check_processor(processor)
    assert report.calls > 0
    assert type(processor).dimension in ("D5", "D6", "D7", "D8", "D9")
    assert type(processor).__doc__ and type(processor).__module__.startswith("hx.processors.")


# --- D5: the sandbox tool, the per-attempt workspace and the sandbox policy -------------------------------------

# 5 s: a busy machine can take seconds to start the sandbox's interpreter; the spin test waits it out.
LIMITS = SandboxLimits(timeout_s=5, memory_mb=256)


def connect_code(port: int) -> str:
    """Sandbox code that tries to reach a server listening on the host's loopback."""
    return ("import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('CONNECTED')\n"
            "except OSError as exc:\n    print('BLOCKED', type(exc).__name__, exc)\n")


@pytest.fixture
async def listener() -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 that any unsandboxed process could connect to; yields its port."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_sandbox_limits_time_memory_and_network_inside_a_run(nats_url: str, tmp_path: Path,
                                                                   listener: int) -> None:
    ws = tmp_path / "ws"  # tmp_path also holds the test's nats-server store
    harness = HarnessConfig().attach(["task_start", "task_end"], AttemptWorkspace(root=str(ws)))
    task = DemoTask([PythonSandboxTool(limits=LIMITS)])
    script = [
        call("spin", "run_python", code="while True:\n    pass\n"),
        call("hog", "run_python", code="block = bytearray(2 * 1024 ** 3)\nprint('allocated')"),
        call("net", "run_python", code=connect_code(listener)),
        call("ok", "run_python", code="import os\nopen('out.txt', 'w').write('hi')\nprint(sorted(os.listdir('.')))"),
        answer("done"),
    ]
    [result], records = await run(nats_url, harness, task, script)
    assert result.status == "completed" and result.passed
    spin = tool_returned(records, "spin")
    assert spin.is_error and spin.data["timed_out"] and "time limit" in spin.output
    hog = tool_returned(records, "hog")
    assert hog.is_error and hog.data["memory_exceeded"] and "allocated" not in hog.output
    net = tool_returned(records, "net")
    assert net.output.startswith("BLOCKED") and "CONNECTED" not in net.output
    assert net.data["network"] == ("unshare" if unshare_prefix() else "guard")
    assert ("Network is unreachable" if unshare_prefix() else "network access is disabled") in net.output
    ok = tool_returned(records, "ok")
    assert not ok.is_error and ok.output == "['out.txt']"
    assert list(ws.iterdir()) == []  # the workspace was removed at task_end


async def test_the_cpu_time_limit_counts_as_the_time_limit(tmp_path: Path) -> None:
    # On an idle machine RLIMIT_CPU and the wall clock race for a busy loop; make the CPU limit
    # win every time by lowering the child's own soft limit to one second.
    spin = ("import resource\n"
            "resource.setrlimit(resource.RLIMIT_CPU, (1, resource.getrlimit(resource.RLIMIT_CPU)[1]))\n"
            "while True:\n    pass\n")
    run_ = await run_python(spin, tmp_path, LIMITS)
    assert run_.timed_out and run_.exit_code == -signal.SIGXCPU and not run_.memory_exceeded
    assert "time limit of 5 s exceeded" in sandbox.render(run_, LIMITS)


async def test_socket_guard_blocks_network_without_namespaces(tmp_path: Path, listener: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = await run_python(connect_code(listener), tmp_path, SandboxLimits(timeout_s=5, network="allow"))
    assert allowed.stdout.strip() == "CONNECTED"  # the server is reachable when nothing blocks it
    run_ = await run_python(connect_code(listener), tmp_path, SandboxLimits(timeout_s=5, network="guard"))
    assert run_.network == "guard" and run_.stdout.startswith("BLOCKED PermissionError")
    monkeypatch.setattr(sandbox, "unshare_prefix", lambda: None)  # a host where namespaces are not permitted
    fallback = await run_python(connect_code(listener), tmp_path, SandboxLimits(timeout_s=5))
    assert fallback.network == "guard" and fallback.stdout.startswith("BLOCKED PermissionError")
    dns = await run_python("import socket\nsocket.getaddrinfo('localhost', 80)", tmp_path,
                           SandboxLimits(timeout_s=5, network="guard"))
    assert dns.exit_code == 1 and "network access is disabled" in dns.stderr
    local = await run_python("import socket\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1))", tmp_path,
                             SandboxLimits(timeout_s=5, network="guard"))
    assert local.stdout.strip() == "b'x'"  # Unix sockets (asyncio's self-pipe) still work


async def test_sandbox_environment_carries_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-secret-value")
    run_ = await run_python("import os\nprint(os.environ.get('ANTHROPIC_API_KEY'), os.getcwd())", tmp_path,
                            SandboxLimits(timeout_s=5))
    assert run_.stdout.split() == ["None", str(tmp_path)]


async def test_workspaces_are_isolated_between_attempts(nats_url: str, tmp_path: Path) -> None:
    peek = ("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\n"
            "print(open('secret.txt').read() if os.path.exists('secret.txt') else 'no secret')\n"
            "open('secret.txt', 'w').write('attempt wrote this')\n")
    ws = tmp_path / "ws"
    harness = HarnessConfig().attach(["task_start", "task_end"],
                                     AttemptWorkspace(root=str(ws), files={"notes/readme.txt": "fixture"}))
    task = DemoTask([PythonSandboxTool(limits=LIMITS)])
    results, records = await run(nats_url, harness, task, [call("p", "run_python", code=peek), answer("ok")],
                                 attempts=2)
    assert [r.status for r in results] == ["completed", "completed"]
    outputs = [e.result.output.splitlines() for e in events(records, ToolReturned)]
    assert len(outputs) == 2
    first, second = outputs
    assert first[1:] == second[1:] == ["['notes']", "no secret"]  # attempt 2 saw neither attempt 1's file
    assert first[0] != second[0]
    assert all(Path(o[0]).parent == ws and not Path(o[0]).exists() for o in outputs)
    assert current_workspace() is None  # task_end cleared the attempt's workspace


async def test_a_failed_attempt_keeps_its_workspace_when_asked(nats_url: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    harness = HarnessConfig().attach(["task_start", "task_end"], AttemptWorkspace(root=str(ws), keep_failed=True))
    task = DemoTask([PythonSandboxTool(limits=LIMITS)], expected="right")
    [result], _ = await run(nats_url, harness, task, [
        call("w", "run_python", code="open('trace.log', 'w').write('evidence')"), answer("wrong")])
    assert not result.passed
    [kept] = list(ws.iterdir())
    assert (kept / "trace.log").read_text() == "evidence"


async def test_sandbox_tool_without_the_processor_uses_a_private_workspace() -> None:
    tool = PythonSandboxTool(limits=LIMITS)
    result = await tool.call(ToolCall(id="1", name="run_python", input={"code": "import os; print(os.getcwd())"}))
    where = Path(result.output)
    assert where.is_dir() and where.name.startswith("hx-sandbox-")
    tool.close()
    assert not where.exists()


def test_code_policy_finds_escape_hatches() -> None:
    forbidden = SubprocessSandbox().forbidden_modules
    calls = SubprocessSandbox().forbidden_calls
    assert code_violations("import subprocess", forbidden, calls) == ["imports subprocess"]
    assert code_violations("from urllib.request import urlopen", forbidden, calls) == ["imports urllib.request"]
    assert code_violations("import os\nos.system('ls')", forbidden, calls) == ["calls os.system()"]
    assert code_violations("__import__('ctypes')", forbidden, calls) == ["imports ctypes"]
    assert code_violations("import os, json\nprint(os.listdir('.'))", forbidden, calls) == []
    assert code_violations("this is not python (", forbidden, calls) == []


async def test_subprocess_sandbox_refuses_and_clamps_inside_a_run(nats_url: str) -> None:
    harness = HarnessConfig().attach(SubprocessSandbox.accepted_hooks(), SubprocessSandbox(max_timeout_s=5.0,
                                                                                max_code_chars=200))
    task = DemoTask([PythonSandboxTool(limits=LIMITS)])
    [result], records = await run(nats_url, harness, task, [
        call("sub", "run_python", code="import subprocess\nsubprocess.run(['id'])"),
        call("big", "run_python", code="x = 1\n" * 100),
        call("slow", "run_python", code="print('fine')", timeout_s=60),
        answer("done"),
    ])
    assert result.status == "completed"
    invoked = {e.call.id: e.call for e in events(records, ToolInvoked)}
    assert set(invoked) == {"slow"}  # refused calls never reached the tool
    assert invoked["slow"].input["timeout_s"] == 5.0
    tool_messages = {m.tool_call_id: m.content for m in events(records, ModelRequest)[-1].messages if m.role == "tool"}
    assert tool_messages["sub"] == f"{BLOCKED}: the sandbox policy forbids code that imports subprocess"
    assert "at most 200 characters" in tool_messages["big"]
    assert tool_messages["slow"] == "fine"
    fired = {(t.hook, t.fields) for t in triggers(records, "subprocess_sandbox")}
    assert ("before_tool", ("approved",)) in fired and ("before_tool", ("call.input",)) in fired
    assert ("after_tool", ("result.output",)) in fired


# --- D6: self-check and judge ----------------------------------------------------------------------------------


async def test_self_check_makes_the_agent_verify_before_finishing(nats_url: str) -> None:
    harness = HarnessConfig().attach(SelfCheck.accepted_hooks(), SelfCheck())
    task = DemoTask([add_tool()], expected="42")
    script = [answer("41"), answer("42")]
    [result], records = await run(nats_url, harness, task, script)
    assert (result.passed, result.steps, result.final_answer) == (True, 2, "42")
    assert {(t.hook, t.action) for t in triggers(records, "self_check")} == {
        ("after_model", "changed"), ("before_tool", "changed"), ("after_tool", "changed")}
    assert events(records, ToolInvoked) == []  # the check is answered by the processor, not executed
    second = events(records, ModelRequest)[1].messages
    assert second[-2].role == "assistant" and second[-2].content == "41"
    assert second[-2].tool_calls[0].name == "self_check"
    assert second[-1].role == "tool" and "check your draft answer" in second[-1].content
    [baseline], _ = await run(nats_url, HarnessConfig(), task, script)
    assert not baseline.passed and baseline.final_answer == "41"  # without the check the draft stands


async def test_self_check_can_offer_its_tool(nats_url: str) -> None:
    harness = HarnessConfig().attach(SelfCheck.accepted_hooks(), SelfCheck(offer=True))
    task = DemoTask([add_tool()], expected="42")
    [result], records = await run(nats_url, harness, task, [
        call("mine", "self_check", draft="42"), answer("42"), answer("42")])
    assert (result.passed, result.steps) == (True, 3)
    assert [t.name for t in events(records, ModelRequest)[0].tools] == ["add", "self_check"]
    answered = [e for e in returned(records, AfterTool) if e.call.name == "self_check"]
    assert [e.call.id for e in answered] == ["mine", "hx-self_check-2-0"]
    assert all("check your draft answer" in e.result.output and not e.result.is_error for e in answered)
    assert events(records, ToolInvoked) == []


def judge_options(*verdicts: str) -> dict[str, dict[str, Any]]:
    return {"script:judge": {"completions": [{"content": v} for v in verdicts]}}


async def test_llm_judge_sends_a_rejected_answer_back(nats_url: str) -> None:
    judge = LlmJudge(model="script:judge", provider_options=judge_options(
        "VERDICT: FAIL\nThe task asks for Celsius.", "VERDICT: PASS\nCorrect."))
    harness = HarnessConfig().attach(LlmJudge.accepted_hooks(), judge)
    task = DemoTask(instruction="Body temperature in Celsius?", expected="37 C")
    [result], records = await run(nats_url, harness, task, [answer("98.6 F"), answer("37 C")])
    assert (result.passed, result.steps) == (True, 2)
    feedback = [e for e in returned(records, AfterTool) if e.call.name == "judge_feedback"]
    assert len(feedback) == 1 and "The task asks for Celsius." in feedback[0].result.output
    assert not feedback[0].result.is_error
    assert "The task asks for Celsius." in events(records, ModelRequest)[1].messages[-1].content


async def test_llm_judge_lets_the_answer_stand_after_max_rejections(nats_url: str) -> None:
    judge = LlmJudge(model="script:judge", max_rejections=1,
                     provider_options=judge_options("VERDICT: FAIL\nno", "VERDICT: FAIL\nstill no"))
    harness = HarnessConfig().attach(LlmJudge.accepted_hooks(), judge)
    [result], records = await run(nats_url, harness, DemoTask(), [answer("a"), answer("b"), answer("c")])
    assert (result.steps, result.final_answer) == (2, "b")
    assert len([e for e in returned(records, AfterTool) if e.call.name == "judge_feedback"]) == 1


async def test_a_broken_judge_fails_open_or_stops_the_attempt(nats_url: str) -> None:
    open_ = HarnessConfig().attach(LlmJudge.accepted_hooks(), LlmJudge(model="nowhere:judge"))
    [result], _ = await run(nats_url, open_, DemoTask(), [answer("a")])
    assert (result.status, result.steps) == ("completed", 1)
    closed = HarnessConfig().attach(LlmJudge.accepted_hooks(), LlmJudge(model="nowhere:judge", fail_open=False))
    [result], records = await run(nats_url, closed, DemoTask(), [answer("a")])
    assert result.status == "infra_failure" and "the judge model failed" in result.reason
    assert events(records, AttemptFinished)[-1].status == "infra_failure"


def test_verdict_parsing() -> None:
    assert parse_verdict("VERDICT: PASS\nfine") is True
    assert parse_verdict("Reasons...\n**Verdict:** fail") is False
    assert parse_verdict("looks good") is None


# --- D7: loops, budgets, risky calls ----------------------------------------------------------------------------


async def test_loop_detector_warns_then_interrupts(nats_url: str) -> None:
    harness = HarnessConfig().attach(LoopDetector.accepted_hooks(), LoopDetector(warn_after=3, interrupt_after=5))
    script = [call(f"c{i}", "look", direction="north") for i in range(10)]
    [result], records = await run(nats_url, harness, DemoTask([echo_tool()]), script)
    assert result.status == "interrupted" and result.steps == 6
    assert "loop_detector" in result.reason and "look" in result.reason
    requests = events(records, ModelRequest)
    warned = [r.step for r in requests if "repeating yourself" in r.messages[-1].content]
    assert warned == [4]  # after the third identical exchange, once
    assert requests[3].messages[-1].role == "user"
    [fin] = events(records, AttemptFinished)
    assert (fin.status, fin.reason) == ("interrupted", result.reason)
    assert [t.action for t in triggers(records, "loop_detector")] == ["changed", "interrupted"]


async def test_loop_detector_sees_cycles_and_ignores_progress(nats_url: str) -> None:
    assert repeats(["a", "b", "a", "b", "a", "b"], 3) == (3, 2)
    assert repeats(["a", "b", "c"], 3) == (1, 1)
    harness = HarnessConfig().attach(LoopDetector.accepted_hooks(), LoopDetector(warn_after=3, interrupt_after=3))
    counter = iter(range(100))
    tool = FunctionTool(ToolSchema(name="look"), lambda **_: f"tick {next(counter)}")  # the world changes
    [result], _ = await run(nats_url, harness, DemoTask([tool]),
                            [call(f"c{i}", "look") for i in range(5)] + [answer("done")])
    assert result.status == "completed"


async def test_budget_interrupts_at_the_tool_call_limit(nats_url: str) -> None:
    harness = HarnessConfig().attach(Budget.accepted_hooks(), Budget(max_tool_calls=2))
    seen: list[dict[str, Any]] = []
    [result], records = await run(nats_url, harness, DemoTask([echo_tool(log=seen)]),
                                  [call(f"c{i}", "look", n=i) for i in range(5)])
    assert result.status == "interrupted" and result.reason == "budget: tool call limit of 2 reached (2 used)"
    assert seen == [{"n": 0}, {"n": 1}]
    assert triggers(records, "budget")[-1].action == "interrupted"


async def test_budget_interrupts_before_a_model_call_over_the_token_limit(nats_url: str) -> None:
    big = "x" * 4000  # about 1000 tokens per observation
    harness = HarnessConfig().attach(Budget.accepted_hooks(), Budget(max_tokens=2500))
    [result], records = await run(nats_url, harness, DemoTask([echo_tool(output=big)]),
                                  [call(f"c{i}", "look", n=i) for i in range(6)])
    assert result.status == "interrupted" and result.reason.startswith("budget: token limit of 2500 reached")
    # the first prompt is tiny, the second carries one big observation: the third would pass the limit
    assert len(events(records, ModelRequest)) == 2 and result.steps == 3
    calls = HarnessConfig().attach(Budget.accepted_hooks(), Budget(max_model_calls=1))
    [result], _ = await run(nats_url, calls, DemoTask([echo_tool()]), [call("a", "look"), answer("x")])
    assert result.reason == "budget: model call limit of 1 reached (1 used)"


USAGE = {"input_tokens": 100, "output_tokens": 20, "cost_usd": 0.01}


async def test_budget_cost_limit_uses_the_providers_usage(nats_url: str) -> None:
    budget = Budget(max_cost_usd=0.015, max_tokens=1000)
    harness = HarnessConfig().attach(Budget.accepted_hooks(), budget)
    script = [{**call(f"c{i}", "look"), "usage": USAGE} for i in range(5)]
    [result], records = await run(nats_url, harness, DemoTask([echo_tool()]), script)
    assert (result.status, result.reason) == ("interrupted", "budget: cost (USD) limit of 0.015 reached (0.02 used)")
    assert len(events(records, ModelRequest)) == 2


async def test_risky_tool_approval_refuses_destructive_calls(nats_url: str) -> None:
    ran: list[dict[str, Any]] = []
    policy = RiskyToolApproval(allow=(r"^rm -rf \./build$",), risky_tools=("drop_*",))
    harness = HarnessConfig().attach(RiskyToolApproval.accepted_hooks(), policy)
    task = DemoTask([echo_tool("bash", "ok", log=ran), echo_tool("drop_db", "dropped", log=ran)])
    [result], records = await run(nats_url, harness, task, [
        call("a", "bash", cmd="rm -rf /home/user"),
        call("b", "bash", cmd="rm -rf ./build"),
        call("c", "drop_db", database="prod"),
        call("d", "bash", cmd="ls -la"),
        answer("done"),
    ])
    assert result.status == "completed"
    assert ran == [{"cmd": "rm -rf ./build"}, {"cmd": "ls -la"}]
    tool_messages = {m.tool_call_id: m.content for m in events(records, ModelRequest)[-1].messages if m.role == "tool"}
    assert tool_messages["a"].startswith(f"{BLOCKED}: refused by the approval policy: its input matches")
    assert "tool 'drop_db' is marked risky" in tool_messages["c"]
    assert tool_messages["b"] == tool_messages["d"] == "ok"
    refused = [t for t in triggers(records, "risky_tool_approval") if t.hook == "before_tool"]
    assert [t.fields for t in refused] == [("approved",), ("approved",)]


# --- D8: OpenTelemetry spans and structured log lines -----------------------------------------------------------


@pytest.fixture(scope="module")
def span_exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the global tracer provider (set once per process)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        pytest.skip("another global tracer provider is installed")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def test_otel_spans_follow_the_genai_conventions(nats_url: str, span_exporter: InMemorySpanExporter) -> None:
    span_exporter.clear()
    harness = HarnessConfig().attach(OtelSpanEmitter.accepted_hooks(), OtelSpanEmitter(agent_name="demo-agent"))
    [result], _ = await run(nats_url, harness, DemoTask([add_tool()], expected="3"),
                            [{**call("c1", "add", a=1, b=2), "usage": USAGE}, answer("3")])
    assert result.passed
    spans = {s.name: s for s in span_exporter.get_finished_spans()}
    assert sorted(s.name for s in span_exporter.get_finished_spans()) == [
        "chat demo", "chat demo", "execute_tool add", "invoke_agent demo-agent"]
    agent, tool = spans["invoke_agent demo-agent"], spans["execute_tool add"]
    chats = [s for s in span_exporter.get_finished_spans() if s.name == "chat demo"]
    assert agent.parent is None and agent.attributes is not None
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == "demo-agent"
    assert (agent.attributes["hx.task.id"], agent.attributes["hx.passed"]) == ("demo:1", True)
    assert agent.status.status_code != StatusCode.ERROR
    for child in [*chats, tool]:
        assert child.parent is not None and child.parent.span_id == _ctx(agent).span_id
        assert _ctx(child).trace_id == _ctx(agent).trace_id
    first = dict(chats[0].attributes or {})
    assert first["gen_ai.operation.name"] == "chat"
    assert (first["gen_ai.provider.name"], first["gen_ai.request.model"], first["gen_ai.response.model"]) == (
        "script", "demo", "demo")
    assert chats[1].attributes is not None and chats[1].attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (100, 20)
    attrs = dict(tool.attributes or {})
    assert (attrs["gen_ai.operation.name"], attrs["gen_ai.tool.name"], attrs["gen_ai.tool.call.id"]) == (
        "execute_tool", "add", "c1")
    assert chats[0].end_time is not None and tool.start_time is not None and chats[0].end_time <= tool.start_time


def _ctx(span: ReadableSpan) -> Any:
    context = span.get_span_context()
    assert context is not None
    return context


async def test_otel_spans_mark_an_interrupted_attempt(nats_url: str, span_exporter: InMemorySpanExporter) -> None:
    span_exporter.clear()
    harness = (HarnessConfig().attach(OtelSpanEmitter.accepted_hooks(), OtelSpanEmitter())
               .attach(Budget.accepted_hooks(), Budget(max_tool_calls=1)))
    [result], _ = await run(nats_url, harness, DemoTask([echo_tool()]), [call("a", "look"), call("b", "look")])
    assert result.status == "interrupted"
    spans = {s.name: s for s in span_exporter.get_finished_spans()}
    assert spans["invoke_agent hx"].status.status_code == StatusCode.ERROR
    failing = [s for s in span_exporter.get_finished_spans() if s.name == "execute_tool look"]
    assert len(failing) == 2 and failing[1].status.status_code == StatusCode.ERROR  # never reached after_tool


async def rebuilt_spans(nats_url: str, run_id: str, content: bool) -> list[ReadableSpan]:
    """The otel projection's spans of one run, folded from the log into an in-memory exporter."""
    exporter = InMemorySpanExporter()
    async with connect(NatsSettings(url=nats_url)) as conn:
        runner = SpanExportRunner(conn.log, OtelSpans(content=content), exporter)
        await runner.catch_up(checkpoint=False)
        runner.flush()
    return [s for s in exporter.get_finished_spans() if dict(s.attributes or {}).get("session.id") == run_id]


def span_shape(spans: Sequence[ReadableSpan]) -> list[tuple[Any, ...]]:
    """Each span's name, kind, status, attributes and its parent's name, in start order."""
    by_id = {_ctx(s).span_id: s.name for s in spans}
    return [(s.name, s.kind, s.status.status_code, s.status.description, dict(s.attributes or {}),
             by_id.get(s.parent.span_id) if s.parent is not None else None)
            for s in sorted(spans, key=lambda s: (s.start_time or 0, s.name))]


async def test_live_and_rebuilt_spans_are_the_same_spans(nats_url: str, span_exporter: InMemorySpanExporter) -> None:
    """One attempt's spans from the live processor and from the otel projection over its log agree (with content)."""
    span_exporter.clear()
    secret = "sk-otel-content-secret-0123456789"
    register(secret)  # as hx registers an API key given as an option
    harness = HarnessConfig().attach(OtelSpanEmitter.accepted_hooks(), OtelSpanEmitter(content=True))
    task = DemoTask([add_tool()], expected="4", instruction=f"Add 1 and 2; the key is {secret}.")
    [result], records = await run(nats_url, harness, task, [{**call("c1", "add", a=1, b=2), "usage": USAGE},
                                                            answer(f"3 {secret}")], run_id="live-vs-log")
    assert not result.passed and result.status == "completed"
    live = list(span_exporter.get_finished_spans())
    rebuilt = await rebuilt_spans(nats_url, "live-vs-log", content=True)
    assert span_shape(live) == span_shape(rebuilt)
    root = next(s for s in rebuilt if s.parent is None)
    assert root.status.status_code == StatusCode.ERROR and root.status.description == "failed: score 0"
    for spans in (live, rebuilt):
        assert [s.name for s in spans if s.parent is None] == ["invoke_agent hx"]
        assert all(s.end_time is not None and s.start_time is not None and s.end_time > s.start_time
                   for s in spans)  # true durations, not a frame's one time
        assert {dict(s.attributes or {})["session.id"] for s in spans} == {"live-vs-log"}
        text = repr([(dict(s.attributes or {}), s.status.description) for s in spans])
        assert secret not in text and "Add 1 and 2; the key is ***." in text and "3 ***" in text
    chat = dict(next(s for s in rebuilt if s.name == "chat demo").attributes or {})
    assert (chat["gen_ai.response.model"], chat["llm.input_messages.0.message.role"]) == ("demo", "user")
    tool = dict(next(s for s in rebuilt if s.name == "execute_tool add").attributes or {})
    assert (tool["input.value"], tool["output.value"]) == ('{"a": 1, "b": 2}', "3")
    assert any(isinstance(r.event, ModelRequest) for r in records)


async def test_structlog_events_log_every_hook(nats_url: str) -> None:
    harness = HarnessConfig().attach(StructlogEvents.accepted_hooks(), StructlogEvents(level="debug"))
    with structlog.testing.capture_logs() as logs:
        [result], _ = await run(nats_url, harness, DemoTask([add_tool()]), [call("c1", "add", a=1, b=2),
                                                                          answer("3")])
    assert result.status == "completed"
    hooks = [line["hook"] for line in logs if line.get("event") == "hook"]
    assert hooks == ["task_start", "step_start", "before_model", "after_model", "before_tool", "after_tool",
                     "step_end", "step_start", "before_model", "after_model", "step_end", "task_end"]
    tool_line = next(line for line in logs if line.get("hook") == "after_tool")
    assert (tool_line["tool"], tool_line["call_id"], tool_line["output_chars"], tool_line["log_level"]) == (
        "add", "c1", 1, "debug")
    assert logs[-1]["passed"] is True and "content" not in logs[3]  # lengths, not text, unless asked


# --- D9: the training bridge over the log, and the JSONL exporters ----------------------------------------------

LOGPROBS = [{"token": "3", "logprob": -0.25}]


async def test_training_bridge_builds_rl_records_from_the_log(nats_url: str) -> None:
    harness = HarnessConfig().attach(SelfCheck.accepted_hooks(), SelfCheck())
    script = [{**call("c1", "add", a=1, b=2), "logprobs": [{"token": "<call>", "logprob": -0.5}]},
              answer("3", logprobs=LOGPROBS), answer("3", logprobs=LOGPROBS)]
    [result], records = await run(nats_url, harness, DemoTask([add_tool()], expected="3"), script,
                                  run_id="t")
    assert result.passed and result.steps == 3
    rl = attempt_to_rl_records(records)
    assert [r.turn for r in rl] == [0, 1, 2] and [r.step for r in rl] == [1, 2, 3]
    requests = events(records, ModelRequest)
    responses = events(records, ModelResponse)
    for rec, req, resp in zip(rl, requests, responses, strict=True):
        assert rec.prompt == req.messages and rec.tools == req.tools
        assert rec.completion.content == resp.content and rec.logprobs == resp.logprobs
        assert (rec.group, rec.task_id, rec.run_id, rec.attempt) == ("demo:1", "demo:1", "t", 0)
        assert rec.model == "script:demo" and rec.harness_digest == harness.digest
        assert (rec.reward, rec.passed, rec.status, rec.source) == (1.0, True, "completed", "log")
    assert [r.on_policy for r in rl] == [True, False, True]  # self_check changed the second completion
    assert rl[1].logprobs[0].logprob == -0.25


async def test_group_advantages_compare_attempts_of_one_task(nats_url: str) -> None:
    task = DemoTask([add_tool()], expected="3")
    script = [call("c1", "add", a=1, b=2), answer("3")]
    _, good = await run(nats_url, HarnessConfig(), task, script, run_id="good")
    _, bad = await run(nats_url, HarnessConfig(), task, [answer("4")], run_id="bad")
    records = good + bad
    rl = attempt_to_rl_records(records, reward="reward")
    assert [(r.run_id, r.reward) for r in rl] == [("good", 1.0), ("good", 1.0), ("bad", -1.0)]
    scored = group_advantages(rl)
    by_reward = {r.reward: round(r.advantage, 4) for r in scored}
    assert by_reward == {1.0: 1.0, -1.0: -1.0}
    assert len(scored) == 3  # two turns of the good attempt share its advantage
    assert group_advantages([RLRecord(group="g", task_id="g", turn=0, step=1,
                                      completion=scored[0].completion)])[0].advantage == 0.0


async def test_interrupted_attempts_get_no_reward(nats_url: str) -> None:
    harness = HarnessConfig().attach(Budget.accepted_hooks(), Budget(max_model_calls=1))
    _, records = await run(nats_url, harness, DemoTask([add_tool()]), [call("c1", "add", a=1, b=2), answer("3")])
    [rec] = attempt_to_rl_records(records)
    assert (rec.status, rec.reward, rec.passed) == ("interrupted", 0.0, False)


async def test_rl_records_processor_writes_the_same_turns(nats_url: str, tmp_path: Path) -> None:
    path = tmp_path / "out" / "rl.jsonl"
    harness = HarnessConfig().attach(RlRecords.accepted_hooks(), RlRecords(path=str(path)))
    script = [call("c1", "add", a=1, b=2), answer("3")]
    task = DemoTask([add_tool()], expected="3")
    results, records = await run(nats_url, harness, task, script, attempts=2)
    assert [r.passed for r in results] == [True, True]
    written = read_rl_records(path)
    from_log = attempt_to_rl_records(records)
    assert len(written) == len(from_log) == 4
    for mine, truth in zip(written, from_log, strict=True):
        assert (mine.prompt, mine.completion, mine.step, mine.model) == (
            truth.prompt, truth.completion, truth.step, truth.model)
        assert (mine.reward, mine.passed, mine.group, mine.source) == (1.0, True, "demo:1", "hooks")


async def test_rl_records_can_keep_only_passed_attempts(nats_url: str, tmp_path: Path) -> None:
    path = tmp_path / "rl.jsonl"
    harness = HarnessConfig().attach(RlRecords.accepted_hooks(), RlRecords(path=str(path), only_passed=True))
    [result], _ = await run(nats_url, harness, DemoTask(expected="yes"), [answer("no")])
    assert not result.passed and not path.exists()


async def test_sft_trajectories_exports_passed_conversations(nats_url: str, tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    harness = HarnessConfig().attach(SftTrajectories.accepted_hooks(), SftTrajectories(path=str(path)))
    task = DemoTask([add_tool()], expected="3", instruction="What is 1 + 2?")
    await run(nats_url, harness, task, [call("c1", "add", a=1, b=2), answer("3")])
    await run(nats_url, harness, DemoTask([add_tool()], expected="3"), [answer("5")])  # failed: not exported
    [line] = [json.loads(x) for x in path.read_text().splitlines()]
    assert [m["role"] for m in line["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert line["messages"][1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a":1,"b":2}'}
    assert line["messages"][2] == {"role": "tool", "content": "3", "tool_call_id": "c1"}
    assert line["tools"][0]["function"]["name"] == "add" and line["passed"] is True


# --- hooks compose: the same processors in one harness ----------------------------------------------------------


async def test_processors_compose_in_one_harness(nats_url: str, tmp_path: Path,
                                                 span_exporter: InMemorySpanExporter) -> None:
    harness = HarnessConfig()
    for hooks, proc in [
        (["task_start", "task_end"], AttemptWorkspace(root=str(tmp_path / "ws"))),
        (SubprocessSandbox.accepted_hooks(), SubprocessSandbox()),
        (RiskyToolApproval.accepted_hooks(), RiskyToolApproval()),
        (LoopDetector.accepted_hooks(), LoopDetector()),
        (Budget.accepted_hooks(), Budget(max_model_calls=10)),
        (SelfCheck.accepted_hooks(), SelfCheck()),
        (OtelSpanEmitter.accepted_hooks(), OtelSpanEmitter()),
        (StructlogEvents.accepted_hooks(), StructlogEvents()),
        (RlRecords.accepted_hooks(), RlRecords(path=str(tmp_path / "rl.jsonl"))),
    ]:
        harness = harness.attach(hooks, proc)
    rebuilt = HarnessConfig.loads(harness.dumps("yaml"))
    assert rebuilt == harness  # the whole library serialises and rebuilds by registry name
    task = DemoTask([PythonSandboxTool(limits=LIMITS)], expected="6")
    [result], records = await run(nats_url, rebuilt, task, [
        call("c1", "run_python", code="print(2 * 3)"), answer("6"), answer("6")])
    assert (result.passed, result.steps) == (True, 3)
    assert tool_returned(records, "c1").output == "6"
    assert len(read_rl_records(tmp_path / "rl.jsonl")) == 3
    assert list((tmp_path / "ws").iterdir()) == []


def test_contracts_hold_for_direct_transforms() -> None:
    """The transforms the processors make are inside their hooks' whitelists."""
    event = AfterModel(step=1, content="x", model="script:demo")
    out = SelfCheck()._calls.add(event, "check", {"draft": "x"})
    assert check_contract("self_check", "after_model", event, out) == ["tool_calls"]
    before = BeforeTool(step=1, call=ToolCall(id="a", name="bash", input={"cmd": "rm -rf /"}))
    refused = RiskyToolApproval()._refusals.refuse(before, "no")
    assert check_contract("risky_tool_approval", "before_tool", before, refused) == ["approved"]
    start = TaskStart(task=TaskSpec(id="x", instruction="y"))
    assert check_contract("attempt_workspace", "task_start", start, start) == []
