"""The LLM stages of AEGIS against real parts: a nats-server, a loopback model server playing recorded
chat-completions responses (tests/fixtures/aegis), the object store and the subprocess sandbox."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from evolve_worker import job
from model_server import replaying
from toyworld import ToyWorld

import hx.harness.processor as processor_module
from hx.aegis.errors import EvolverError, EvolverReplyError
from hx.aegis.evolvers import EVOLVERS, make_evolver
from hx.aegis.evolvers.base import Context
from hx.aegis.evolvers.llm import LlmEvolver
from hx.aegis.ledger import Ledger
from hx.aegis.llm_stages import LlmCritic, llm_prose
from hx.aegis.meta import MetaAgent
from hx.aegis.planner import plan
from hx.aegis.session import Parts, run_evolution
from hx.aegis.smoke import SandboxCodeCheck, check, check_candidate
from hx.aegis.state import RunState
from hx.harness.edits import apply
from hx.harnesses import starter_harness
from hx.processors.sandbox import SandboxLimits
from hx.runtime.code import CodeStore, declared_processor, module_name, source_digest
from hx.runtime.errors import CodeError
from hx.runtime.models import ModelConfig
from schemas.edits import Anchor, Attach, Manifest
from schemas.landscape import TaskDigest
from schemas.ledger import CandidateProposed, EvolutionFinished, LedgerEvent, LedgerOpened, RoundDecided
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.topology import BLOB_STORE, trace_subject

FIXTURES = Path(__file__).parent / "fixtures" / "aegis"
RUN = "llm-run"
HARNESS = starter_harness("textworld")
NOTE = (FIXTURES / "step_note.py.txt").read_text()
DIGESTS = (
    TaskDigest(task="bench:alpha:dev:1", cluster="bench:alpha", attempts=2, passes=0, category="partial_progress",
               implicated=("observation_trim",), evidence=(Anchor(seq=101, note="a fact scrolled away"),),
               continuity="persistent_failure", features={"steps": 30.0}),
    TaskDigest(task="bench:alpha:dev:2", cluster="bench:alpha", attempts=2, passes=0, category="partial_progress",
               evidence=(Anchor(seq=202, index=1),)),
    TaskDigest(task="bench:beta:dev:3", cluster="bench:beta", attempts=2, passes=0, category="loop",
               implicated=("loop_detector",), evidence=(Anchor(seq=303),), features={"repeat_rate": 0.6}),
    TaskDigest(task="bench:beta:dev:4", cluster="bench:beta", attempts=2, passes=2),
)


# --- a model server playing recorded responses ---------------------------------------------------

@dataclass
class RecordedModel:
    """A loopback chat-completions server answering each request with the next recorded fixture."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    queue: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def play(self, *names: str) -> None:
        with self.lock:
            self.queue.extend(json.loads((FIXTURES / f"{n}.json").read_text()) for n in names)

    def next(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append(body)
            if not self.queue:
                return {"status": 500, "headers": {"content-type": "application/json"},
                        "body": {"error": {"message": "test server: no recorded response left"}}}
            return self.queue.pop(0)


@pytest.fixture
def model() -> Iterator[RecordedModel]:
    recorded = RecordedModel()
    with replaying(recorded):
        yield recorded


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    async with connect(NatsSettings(url=nats_url)) as connection:
        yield connection


@pytest.fixture
async def meta(conn: Connection, model: RecordedModel) -> AsyncIterator[MetaAgent]:
    agent = MetaAgent(ModelConfig(main=f"openai:meta-model@{model.url}/v1", retries=0), conn.log, RUN)
    yield agent
    await agent.aclose()


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Plugins a test materializes and imports leave no trace: sys.path, the registry, sys.modules."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(processor_module, "_REGISTRY", dict(processor_module._REGISTRY))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("hx_plugin_"):
            del sys.modules[name]


def context(round: int = 1, *records: LedgerEvent) -> Context:
    state = RunState.of([LedgerOpened(run_id=RUN, strategy="global", harness=HARNESS.spec(),
                                      digest=HARNESS.digest), *records])
    return Context(round, state, plan(state, round, DIGESTS), DIGESTS)


async def trace_types(conn: Connection, stage: str, n: int, round: int = 1) -> list[str]:
    return [r.event.TYPE async for r in conn.log.read(subjects=[trace_subject(RUN, round, f"aegis:{stage}", n)])]


# --- the evolver ------------------------------------------------------------------------------------

async def test_library_attach_becomes_a_grounded_proposal(conn: Connection, model: RecordedModel,
                                                          meta: MetaAgent) -> None:
    model.play("evolver_attach")
    evolver = LlmEvolver(meta, CodeStore(conn.log, Path("unused")))
    (proposal,) = await evolver.propose(context(), 3)
    assert proposal.variant == "v0"
    assert proposal.operations == (Attach(processor="task_notes", hooks=("after_tool", "before_model"),
                                          params={"max_notes": 8}),)
    m = proposal.manifest
    assert m.predicted_flips == ("bench:alpha:dev:1", "bench:alpha:dev:2")
    assert m.evidence == (Anchor(seq=101, note="a fact scrolled away"), Anchor(seq=202, index=1))
    assert (m.attribution, m.categories, m.at_risk) == ("task_notes", ("partial_progress",), ("bench:beta:dev:4",))
    assert proposal.code == ()
    assert len(evolver.notes) == 2
    assert evolver.notes[0].startswith("candidates[1]: operations[0]: unknown processor 'memory_palace'")
    assert evolver.notes[1].startswith("candidates[2]: unknown variant 'v7'")
    # The prompt carried the evidence and the catalog; the model's call and answer are on the log.
    prompt = model.requests[0]["messages"][1]["content"]
    assert "bench:alpha:dev:1" in prompt and "- task_notes [D3" in prompt and "```yaml" in prompt
    assert await trace_types(conn, "evolver", 0) == ["model.request", "model.response"]


async def test_new_code_is_stored_smoke_tested_then_materialized(conn: Connection, model: RecordedModel,
                                                                 meta: MetaAgent, tmp_path: Path,
                                                                 isolated_imports: None) -> None:
    model.play("evolver_code")
    store = CodeStore(conn.log, tmp_path / "plugins")
    (proposal,) = await LlmEvolver(meta, store).propose(context(), 2)
    (asset,) = proposal.code
    module = module_name(asset.digest)
    stable = f"{module}:StepNote"
    assert (asset.name, asset.digest, asset.size, asset.processor) == (
        "step_note.py", source_digest(NOTE), len(NOTE.encode()), stable)
    assert proposal.operations == (Attach(processor=stable, hooks=("before_model",)),)
    assert proposal.manifest.attribution == stable
    assert proposal.manifest.evidence == (Anchor(seq=303),)
    obj = await (await conn.js.object_store(BLOB_STORE)).get(f"code/{asset.digest}")
    assert "sha256:" + hashlib.sha256(obj.data or b"").hexdigest() == asset.digest
    assert await store.get(asset) == NOTE

    report = await check_candidate(store, HARNESS, proposal.operations, proposal.code)
    assert report.config_ok and report.smoke_ok, report
    assert report.digest.startswith("sha256:") and report.digest != HARNESS.digest
    assert report.effect.startswith("appends a user message 'Reminder: prefer an action")
    assert stable in report.effect
    assert module not in sys.modules  # the sandbox imported it, this process did not

    assert await store.materialize(asset) == module
    assert await store.materialize(asset) == module  # idempotent
    assert store.path_of(asset).read_text() == NOTE
    assert module not in sys.modules  # materializing writes a file, it imports nothing
    assert apply(HARNESS, proposal.operations).digest == report.digest  # built here, from proven code


async def test_the_gate_code_check_materializes_only_passing_code(conn: Connection, tmp_path: Path,
                                                                  isolated_imports: None) -> None:
    store = CodeStore(conn.log, tmp_path / "plugins")
    good, bad = await store.put("note.py", NOTE), await store.put("bad.py", NOTE + "\nraise SystemExit(3)\n")
    checker = SandboxCodeCheck(store)
    verdicts = {}
    for asset in (bad, good):
        cand = CandidateProposed(run_id=RUN, round=1, candidate=asset.name, variant="v0", evolver="llm",
                                 operations=(Attach(processor=asset.processor, hooks=("before_model",)),),
                                 buckets=("processor",), manifest=Manifest(), base_digest=HARNESS.digest, digest="",
                                 code=(asset,))
        verdicts[asset.name] = await checker(HARNESS, cand)
        assert await checker.sources(cand) == [await store.get(asset)]
    digest, config_error, smoke_error = verdicts["bad.py"]
    assert (digest, config_error, smoke_error) == ("", "not checked: bad.py: import failed: SystemExit: 3",
                                                   "bad.py: import failed: SystemExit: 3")
    assert not store.path_of(bad).exists()
    digest, config_error, smoke_error = verdicts["note.py"]
    assert digest.startswith("sha256:") and (config_error, smoke_error) == ("", "")
    assert store.path_of(good).read_text() == NOTE
    assert checker.reports["note.py"].effect.startswith("appends a user message")


def _broken(kind: str) -> str:
    if kind == "import":
        return NOTE + "\nraise RuntimeError('broken at import')\n"
    body = "raise ValueError('broken in process')" if kind == "process" else "while True:\n            pass"
    return NOTE.replace("note = Message(", f"{body}\n        note = Message(")


@pytest.mark.parametrize(("kind", "reason"), [
    ("import", "step_note.py: import failed: RuntimeError: broken at import"),
    ("process", "raised ValueError: broken in process"),
    ("forever", "while running the contract kit on hx_plugin_"),
])
async def test_broken_code_fails_the_smoke_test_and_is_never_imported(kind: str, reason: str) -> None:
    source = _broken(kind)
    module = module_name(source_digest(source))
    name = declared_processor(source, module).name
    ops = [{"op": "attach", "processor": name, "hooks": ["before_model"]}]
    report = await check(HARNESS.to_dict(), ops, [("step_note.py", source)],
                         limits=SandboxLimits(timeout_s=3, memory_mb=512))
    assert not report.smoke_ok
    assert reason in report.smoke_error
    assert report.smoke_error.startswith("timed out") is (kind == "forever")  # wall clock or CPU limit, first wins
    assert report.config_ok is (kind != "import")
    assert module not in sys.modules


async def test_a_library_edit_reports_its_effect_on_the_model_input() -> None:
    ops = [{"op": "remove", "group": "loop_detector"}, {"op": "remove", "group": "budget"}]
    report = await check(HARNESS.to_dict(), ops, [])
    assert report.config_ok and report.smoke_ok and report.effect == "no change"
    bad = await check(HARNESS.to_dict(), [{"op": "remove", "group": "no_such_group"}], [])
    assert not bad.config_ok and "no processor in singleton group 'no_such_group'" in bad.config_error


async def test_the_store_refuses_code_it_cannot_name_or_that_was_tampered_with(conn: Connection,
                                                                                tmp_path: Path) -> None:
    store = CodeStore(conn.log, tmp_path)
    with pytest.raises(CodeError, match=r"x\.py: no class subclassing Processor"):
        await store.put("x.py", "def process(event):\n    return event\n")
    with pytest.raises(CodeError, match=r"y\.py: syntax error at line 1"):
        await store.put("y.py", "class (:\n")
    asset = await store.put("note.py", NOTE)
    await (await conn.js.object_store(BLOB_STORE)).put(f"code/{asset.digest}", NOTE.replace("D2", "D3").encode())
    with pytest.raises(CodeError, match="does not match its digest"):
        await store.get(asset)


@pytest.mark.parametrize(("fixture", "where"), [
    ("evolver_not_json", "reply: not a JSON object"),
    ("evolver_wrong_shape", "candidates[0].manifest.predicted_flips: expected `array`, got `str`"),
    ("evolver_unknown_op", "candidates[1].operations[0]: unknown op 'append'"),
])
async def test_a_reply_that_does_not_parse_names_the_place(model: RecordedModel, meta: MetaAgent, fixture: str,
                                                           where: str) -> None:
    model.play(fixture)
    with pytest.raises(EvolverReplyError) as info:
        await LlmEvolver(meta).propose(context(), 2)
    assert str(info.value).startswith(where)


async def test_an_unreachable_meta_model_is_an_evolver_error(conn: Connection) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = int(server.server_address[1])
    server.server_close()
    agent = MetaAgent(ModelConfig(main=f"openai:meta-model@http://127.0.0.1:{port}/v1", retries=0), conn.log, RUN)
    try:
        with pytest.raises(EvolverError, match=f"the meta-model failed: .*127.0.0.1:{port}") as info:
            await LlmEvolver(agent).propose(context(), 2)
    finally:
        await agent.aclose()
    assert not isinstance(info.value, EvolverReplyError)
    assert await trace_types(conn, "evolver", 0) == ["model.request", "model.error"]


async def test_revise_asks_once_and_every_call_is_on_the_log(conn: Connection, model: RecordedModel,
                                                            meta: MetaAgent) -> None:
    model.play("evolver_attach", "evolver_revise", "evolver_attach")
    evolver = LlmEvolver(meta)
    (proposal,) = await evolver.propose(context(2), 1)
    recorded = CandidateProposed(run_id=RUN, round=2, candidate="c-2-1", variant="v0", evolver="llm",
                                 operations=proposal.operations, buckets=("prompt",), manifest=proposal.manifest,
                                 base_digest=HARNESS.digest, digest=apply(HARNESS, proposal.operations).digest)
    ctx = context(2, recorded)
    revised = await evolver.revise(ctx, proposal, "1 predicted flip not backed", ["bench:alpha:dev:1"])
    assert revised is not None and revised.operations == proposal.operations  # a revision may keep its operations
    assert revised.manifest.predicted_flips == ("bench:alpha:dev:1",)
    assert revised.manifest.evidence == (Anchor(seq=101, note="a fact scrolled away"),)
    assert "1 predicted flip not backed" in model.requests[1]["messages"][1]["content"]
    assert await evolver.propose(ctx, 1) == []  # a new proposal may not repeat a candidate judged on this harness
    assert evolver.notes[0] == "candidates[0]: the same operations were already judged on this harness under this model"
    assert await trace_types(conn, "evolver", 0, round=2) == ["model.request", "model.response"]
    assert await trace_types(conn, "revise", 0, round=2) == ["model.request", "model.response"]
    assert await trace_types(conn, "evolver", 1, round=2) == ["model.request", "model.response"]


def test_the_registry_names_the_evolvers() -> None:
    assert EVOLVERS.names() == ("frozen", "induced", "llm", "offline", "offline+induced")
    assert make_evolver("offline", meta=None, store=None).name == "offline"
    assert make_evolver("frozen", meta=None, store=None).name == "frozen"
    known = "frozen, induced, llm, offline, offline+induced"
    with pytest.raises(EvolverError, match=re.escape(f"unknown evolver 'x'; known: {known}")):
        make_evolver("x", meta=None, store=None)
    with pytest.raises(EvolverError, match="the llm evolver needs --meta-model"):
        make_evolver("llm", meta=None, store=None)


# --- critic and prose -------------------------------------------------------------------------------

def _candidate(cid: str, processor: str, flips: tuple[str, ...], category: str) -> CandidateProposed:
    op = Attach(processor=processor, hooks=("after_tool", "before_model"))
    return CandidateProposed(run_id=RUN, round=1, candidate=cid, variant="v0", evolver="llm", operations=(op,),
                             buckets=("processor",), base_digest=HARNESS.digest, digest=apply(HARNESS, (op,)).digest,
                             manifest=Manifest(intended_effect="x", categories=(category,), predicted_flips=flips,
                                               evidence=(Anchor(seq=1),), attribution=processor))


CANDIDATES = (_candidate("c-1", "task_notes", ("bench:alpha:dev:1", "bench:alpha:dev:2"), "partial_progress"),
              _candidate("c-2", "visited_states", ("bench:beta:dev:3",), "loop"),
              _candidate("c-3", "undo_guard", ("bench:beta:dev:4",), "loop"))


async def test_the_llm_critic_reranks_survivors_and_falls_back_on_garbage(conn: Connection, model: RecordedModel,
                                                                         meta: MetaAgent) -> None:
    state = context().state
    model.play("critic_rerank", "critic_garbage")
    critic = LlmCritic(meta)
    reranked = await critic.review(state, 1, CANDIDATES, DIGESTS, revised=True)
    assert reranked.ranking == ("c-2", "c-1")  # c-3 predicts a flip on a solved task: the deterministic verdict stands
    assert "critic model: notes may repeat what the trimmed observation already shows" in reranked.concerns["c-1"]
    assert "not ranked by the critic model; kept after the ranked ones" in reranked.concerns["c-1"]
    fallback = await critic.review(state, 1, CANDIDATES, DIGESTS, revised=True)
    assert fallback.ranking == ("c-1", "c-2")
    assert any(c.startswith("LLM critic unusable (reply: not a JSON object") for c in fallback.concerns["c-2"])
    assert await trace_types(conn, "critic", 0) == ["model.request", "model.response"]
    assert await trace_types(conn, "critic", 1) == ["model.request", "model.response"]


async def test_the_prose_pass_summarises_failing_tasks_only(conn: Connection, model: RecordedModel,
                                                            meta: MetaAgent) -> None:
    model.play("prose")
    prose = llm_prose(meta, cap=2)
    summaries = await prose(DIGESTS, 1)
    assert list(summaries) == ["bench:alpha:dev:1"]
    assert summaries["bench:alpha:dev:1"].startswith("The agent found the needed fact early")
    asked = model.requests[0]["messages"][1]["content"]
    assert "bench:alpha:dev:2" in asked and "bench:beta:dev:3" not in asked  # capped at two
    assert await trace_types(conn, "digester", 0) == ["model.request", "model.response"]
    assert await prose((), 1) == {}



# --- the LLM evolver inside the loop -------------------------------------------------------------

async def test_a_garbage_reply_makes_a_recorded_no_candidate_round(conn: Connection, model: RecordedModel) -> None:
    """A meta-model reply that does not parse ends the round as no_candidate, the place named, the run intact."""
    model.play("evolver_not_json")
    bench = ToyWorld()
    agent = MetaAgent(ModelConfig(main=f"openai:meta-model@{model.url}/v1", retries=0), conn.log, "llm-loop")
    try:
        await run_evolution(conn, [bench], job("llm-loop", bench, rounds=1), Parts(LlmEvolver(agent)),
                            resume=False)
    finally:
        await agent.aclose()
    ledger = Ledger(conn, "llm-loop")
    try:
        await ledger.load()
        records = list(ledger.records)
    finally:
        await ledger.close()
    [decision] = [r for r in records if isinstance(r, RoundDecided)]
    assert decision.outcome == "no_candidate" and "reply: not a JSON object" in decision.reason
    assert isinstance(records[-1], EvolutionFinished)
    assert len(model.requests) == 1  # asked once; a reply that does not parse is not retried blindly
    calls = [r.event.TYPE async for r in conn.log.read(subjects=[trace_subject("llm-loop", 0, "aegis:evolver", 0)])]
    assert calls == ["model.request", "model.response"]  # the garbage itself is on the log, for the auditor
