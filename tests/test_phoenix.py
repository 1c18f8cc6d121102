"""A run's traces in a real Arize Phoenix: exported by the otel projection over OTLP/HTTP, read with Phoenix's client.

One run against a model server that answers ``LATENCY_S`` late (two twx tasks, one attempt
each, three steps: both attempts run out of steps and fail), exported with ``hx projections
run otel --project PROJECT`` into a Phoenix started from its own venv (tests/phoenix_kit.py).
What Phoenix stored is then checked as Phoenix shows it: trace and span counts against the
log, Phoenix's own span kinds, durations and nesting, the project, the run as one session,
and a failed attempt's root in error.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from itertools import pairwise

import pytest
from hx_cli import hx, ok
from model_server import model_server
from phoenix_kit import Stored, StoredSpan, phoenix_server

from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished
from schemas.model import ModelResponse
from schemas.tools import ToolReturned
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import TRACE, trace_filter

# Phoenix takes tens of seconds to start (the module's first test pays for it), and on a clean clone
# .ci/phoenix-venv first installs it: minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LATENCY_S = 0.05
RUN = "phoenix-run"
PROJECT = "hx-phoenix-test"
ATTEMPTS = 2


async def _records(nats_url: str) -> list[Record]:
    async with connect(NatsSettings(url=nats_url)) as conn:
        return [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter(RUN)])]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Record], Stored]]:
    """The run's log records, and what Phoenix holds for the project once every span has arrived."""
    tmp = tmp_path_factory.mktemp("phoenix")
    nats = NatsProcess(tmp / "nats" / "store")
    nats.start(detach=False)
    try:
        with phoenix_server(tmp / "phoenix") as phoenix:
            with model_server("play", latency_s=LATENCY_S) as server:
                ok(hx("--nats-url", nats.url, "--data-dir", str(tmp), "run", "--tasks", "2", "--attempts", "1",
                      "--max-steps", "3", "--model", f"openai:m@http://{server.url}/v1", "--run-id", RUN))
            records = asyncio.run(_records(nats.url))
            ok(hx("--nats-url", nats.url, "--data-dir", str(tmp), "projections", "run", "otel", "--from-start",
                  "--once", "--otlp-endpoint", phoenix.url, "--project", PROJECT))
            calls = sum(isinstance(r.event, ModelResponse | ToolReturned) for r in records)
            yield records, phoenix.wait_for_spans(PROJECT, ATTEMPTS + calls)
    finally:
        nats.stop()


def _by_trace(spans: list[StoredSpan]) -> dict[str, list[StoredSpan]]:
    out: dict[str, list[StoredSpan]] = defaultdict(list)
    for span in spans:
        out[span.trace_id].append(span)
    return out


def _root(trace: list[StoredSpan]) -> StoredSpan:
    roots = [s for s in trace if not s.parent_id]
    assert len(roots) == 1, [s.name for s in roots]
    return roots[0]


def test_one_trace_per_attempt_and_one_span_per_model_and_tool_call(exported: tuple[list[Record], Stored]) -> None:
    records, stored = exported
    finished = [r for r in records if isinstance(r.event, AttemptFinished)]
    responses = sum(isinstance(r.event, ModelResponse) for r in records)
    returned = sum(isinstance(r.event, ToolReturned) for r in records)
    assert len(finished) == ATTEMPTS and responses >= ATTEMPTS and returned >= ATTEMPTS
    assert len(_by_trace(stored.spans)) == ATTEMPTS
    assert len(stored.spans) == ATTEMPTS + responses + returned
    names = sorted({s.name for s in stored.spans})
    assert names == ["chat m", "execute_tool act", "invoke_agent hx"], names


def test_phoenix_classifies_agent_llm_and_tool_spans(exported: tuple[list[Record], Stored]) -> None:
    _, stored = exported
    kinds = {"invoke_agent hx": "AGENT", "chat m": "LLM", "execute_tool act": "TOOL"}
    assert {(s.name, s.span_kind) for s in stored.spans} == set(kinds.items())


def test_durations_are_the_calls_own_and_children_nest_in_step_order(exported: tuple[list[Record], Stored]) -> None:
    _, stored = exported
    assert all(s.duration_s > 0 for s in stored.spans), [(s.name, s.start, s.end) for s in stored.spans]
    chats = [s for s in stored.spans if s.name.startswith("chat ")]
    assert chats and all(s.duration_s >= LATENCY_S for s in chats), [s.duration_s for s in chats]
    for trace in _by_trace(stored.spans).values():
        root = _root(trace)
        children = sorted((s for s in trace if s.parent_id), key=lambda s: s.start)
        assert children and all(s.parent_id == root.span_id for s in children)
        assert all(root.start <= s.start and s.end <= root.end for s in children)
        # One agent loop: each call starts after the one before it ended, model call then tool call, step by step.
        assert all(a.end <= b.start for a, b in pairwise(children))
        assert [(s.attributes["hx.step"], s.name) for s in children] == [
            (step, name) for step in range(1, len(children) // 2 + 1) for name in ("chat m", "execute_tool act")]


def test_the_run_is_one_session_in_its_project(exported: tuple[list[Record], Stored]) -> None:
    _, stored = exported
    assert PROJECT in stored.projects and stored.spans  # spans were read from PROJECT
    assert {s.attributes.get("session.id") for s in stored.spans} == {RUN}
    assert stored.sessions == {RUN: sorted(_by_trace(stored.spans))}


def test_a_failed_attempts_root_is_an_error_and_its_calls_are_not(exported: tuple[list[Record], Stored]) -> None:
    records, stored = exported
    failed = [r for r in records if isinstance(r.event, AttemptFinished) and not r.event.passed]
    assert failed  # three steps never win a coin game
    for trace in _by_trace(stored.spans).values():
        root = _root(trace)
        expected = ("OK", "UNSET") if root.attributes["hx.passed"] else ("ERROR",)
        assert root.status_code in expected, (root.status_code, root.attributes["hx.status"])
        assert all(s.status_code != "ERROR" for s in trace if s.parent_id)
