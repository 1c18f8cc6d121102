"""Token accounting on real parts: an LLM-evolver round whose meta-model replies (recorded, with their usage) and
task agent (a loopback server answering 10 input and 5 output tokens a call) are known, and an offline round, on a
real nats-server: the ledger, ``hx export`` and ``hx report`` show each stage's and each task's tokens."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import toyworld  # noqa: F401 - registers the toy benchmark with the in-process command
from hx_cli import hx, ok
from model_server import model_server, replaying

from hx.aegis.ledger import read_records
from hx.aegis.meta import META_STAGES
from schemas.ledger import LedgerEvent, RoundDecided, RoundDigested, RoundMetrics, RoundTokens, ledger_digest
from schemas.messages import Usage
from schemas.model import ModelResponse
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import token_value, trace_filter

FIXTURES = Path(__file__).parent / "fixtures" / "aegis"
PROSE_REPLY = Usage(input_tokens=1200, output_tokens=90)
EVOLVER_REPLY = Usage(input_tokens=4200, output_tokens=380)
AGENT_CALL = Usage(input_tokens=10, output_tokens=5)
"""What ``model_server("play")`` answers a tool call with."""


@dataclass
class Recorded:
    """A chat-completions server playing recorded fixtures in order, each with the usage it is given."""

    replies: list[tuple[str, Usage]]
    url: str = ""
    requests: list[Any] = field(default_factory=list)

    def next(self, request: Any) -> dict[str, Any]:
        self.requests.append(request)
        if not self.replies:
            return {"status": 500, "headers": {"content-type": "application/json"},
                    "body": {"error": {"message": "test server: no recorded response left"}}}
        name, usage = self.replies.pop(0)
        answer: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
        answer["body"]["usage"] = {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens}
        return answer


def evolve(url: str, data: Path, run_id: str, *extra: str) -> None:
    """One round of the toy world: three tasks, one attempt each, four steps at most."""
    ok(hx("--nats-url", url, "--data-dir", str(data), "evolve", "--bench", "toyworld:rooms", "--tasks", "3",
          "--heldout-tasks", "1", "--rounds", "1", "--attempts", "1", "--max-steps", "4", "--concurrency", "2",
          "--seed", "3", "--run-id", run_id, *extra))


def decided(url: str, run_id: str) -> tuple[RoundDecided, RoundDigested, list[ModelResponse], list[str]]:
    """The run's one decision and digest, and every model response on its main rollouts (with its task)."""
    async def read() -> tuple[list[LedgerEvent], list[ModelResponse], list[str]]:
        async with connect(NatsSettings(url=url)) as conn:
            records = await read_records(conn, run_id) or []
            [digest] = [r for r in records if isinstance(r, RoundDigested)]
            responses, tasks = [], []
            async for r in conn.log.read(subjects=[trace_filter(run_id, n) for n in digest.trace_rounds],
                                         types=[ModelResponse.TYPE]):
                assert isinstance(r.event, ModelResponse)
                responses.append(r.event)
                tasks.append(token_value(r.subject.split(".")[4]))
            return records, responses, tasks
    records, responses, tasks = asyncio.run(read())
    [decision] = [r for r in records if isinstance(r, RoundDecided)]
    [digest] = [r for r in records if isinstance(r, RoundDigested)]
    return decision, digest, responses, tasks


def test_an_llm_round_records_each_stage_and_each_task_on_the_ledger_export_and_report(
        nats_url: str, tmp_path: Path) -> None:
    meta = Recorded([("prose", PROSE_REPLY), ("evolver_not_json", EVOLVER_REPLY)])
    with model_server("play") as agent, replaying(meta):
        evolve(nats_url, tmp_path / "data", "tokens-llm", "--model", f"openai:agent@http://{agent.url}/v1",
               "--evolver", "llm", "--meta-model", f"openai:meta-model@{meta.url}/v1")
    decision, digest, responses, tasks = decided(nats_url, "tokens-llm")
    assert decision.outcome == "no_candidate" and len(meta.requests) == 2
    tokens = decision.metrics.tokens
    assert tokens is not None
    assert tokens.meta == {**{s: Usage() for s in META_STAGES}, "digester": PROSE_REPLY, "evolver": EVOLVER_REPLY}
    # the task agent: every call of the round's rollouts answered 10 in, 5 out; held-out calls are not the round's
    calls = Counter(t for t, r in zip(tasks, responses, strict=True) if r.tool_calls)
    assert sum(calls.values()) == len(responses) > 0
    assert tokens.tasks == {t: Usage(input_tokens=10 * n, output_tokens=5 * n) for t, n in sorted(calls.items())}
    assert set(tokens.tasks) == {d.task for d in digest.digests}
    assert tokens.agent == Usage(input_tokens=10 * len(responses), output_tokens=5 * len(responses))
    assert len(agent.paths) > len(responses)  # the held-out round called the agent too, uncounted here

    out = tmp_path / "export"
    ok(hx("--nats-url", nats_url, "export", "tokens-llm", str(out)))
    rows = [json.loads(line) for line in (out / "data" / "tokens.jsonl").read_text().splitlines()]
    assert {r["stage"]: (r["input_tokens"], r["output_tokens"]) for r in rows if r["kind"] == "meta"} == {
        **{s: (0, 0) for s in META_STAGES}, "digester": (1200, 90), "evolver": (4200, 380)}
    per_task: dict[str | None, int] = {None: 10 * len(responses), **{t: 10 * n for t, n in calls.items()}}
    assert {r["task"]: r["input_tokens"] for r in rows if r["kind"] == "agent"} == per_task
    [curve] = json.loads((out / "curves.json").read_text())["rounds"]
    assert curve["tokens"]["meta"]["evolver"]["output_tokens"] == 380
    assert curve["tokens"]["agent"]["input_tokens"] == 10 * len(responses)
    assert "| meta-model tokens, evolver (in / out) | 4200 / 380 |" in (out / "R0" / "decision.md").read_text()

    report = tmp_path / "report"
    ok(hx("--nats-url", nats_url, "report", "tokens-llm", "--out", str(report)))
    html = (report / "report.html").read_text()
    table = html[html.index('<h2 id="tokens">'):]
    table = table[:table.index("</table>")]
    assert "<th>evolver in / out</th>" in table and "<td>4,200 / 380</td>" in table and "<td>1,200 / 90</td>" in table
    assert f"<td>{10 * len(responses):,} / {5 * len(responses):,}</td>" in table


def test_an_offline_round_records_zeros_not_blanks(nats_url: str, tmp_path: Path) -> None:
    evolve(nats_url, tmp_path / "data", "tokens-offline")  # random agent, offline evolver: nothing counts tokens
    decision, digest, responses, _ = decided(nats_url, "tokens-offline")
    assert responses and all(r.usage == Usage() for r in responses)
    assert decision.metrics.tokens == RoundTokens(meta={s: Usage() for s in META_STAGES}, agent=Usage(),
                                                  tasks={d.task: Usage() for d in sorted(digest.digests,
                                                                                         key=lambda d: d.task)})
    out = tmp_path / "export"
    ok(hx("--nats-url", nats_url, "export", "tokens-offline", str(out)))
    rows = [json.loads(line) for line in (out / "data" / "tokens.jsonl").read_text().splitlines()]
    assert len(rows) == len(META_STAGES) + 1 + len(digest.digests)
    assert all(r["input_tokens"] == 0 and r["output_tokens"] == 0 and r["cost_usd"] == 0.0 for r in rows)
    [curve] = json.loads((out / "curves.json").read_text())["rounds"]
    assert curve["tokens"]["agent"] == {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                                        "cost_usd": 0.0}
    report = tmp_path / "report"
    ok(hx("--nats-url", nats_url, "report", "tokens-offline", "--out", str(report)))
    html = (report / "report.html").read_text()
    assert "<td>0 / 0</td>" in html[html.index('<h2 id="tokens">'):]


def test_a_decision_recorded_before_tokens_keeps_its_digest() -> None:
    """A ledger written before hx counted tokens still chains: its body has no ``tokens`` key, and none is added."""
    new = RoundDecided(run_id="r", round=0, outcome="no_candidate", metrics=RoundMetrics(tasks=3, rollouts=3))
    body = msgspec.msgpack.decode(msgspec.msgpack.encode(new))
    del body["metrics"]["tokens"]  # what an older hx wrote
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(body), type=RoundDecided)
    assert old.metrics.tokens is None
    assert ledger_digest(old) == ledger_digest(new)
    signed = {k: v for k, v in body.items() if k not in ("signature", "at_ns")}  # as the older hx digested it
    assert ledger_digest(old) == "sha256:" + hashlib.sha256(b"ledger.round_decided\0"
                                                            + msgspec.msgpack.encode(signed)).hexdigest()
