"""The LLM panel against real parts: a nats-server and a loopback model server playing recorded persona replies
(tests/fixtures/panel), routed by the persona each request's system prompt names."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from model_server import replaying
from panel_log import write_experiment

from hx.experiment.llm_panel import LlmPanel, judge_reply, system_prompt
from hx.experiment.panel import PERSONAS, TITLES, append_review, load_record
from hx.experiment.spec import parse_spec
from hx.runtime.models import ModelConfig
from schemas.experiment import ExperimentSpec
from schemas.panel import PanelReviewed
from streams.config import NatsSettings
from streams.connection import Connection, connect
from streams.topology import trace_subject

FIXTURES = Path(__file__).parent / "fixtures" / "panel"
RUN = "exp-llm-panel"
SECRET = "pw-5ecret-panel"


@dataclass
class PanelModel:
    """A chat-completions server answering each persona with its next recorded reply."""

    url: str = ""
    queues: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    asked: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def play(self, persona: str, name: str) -> None:
        with self.lock:
            self.queues.setdefault(persona, []).append(json.loads((FIXTURES / f"{name}.json").read_text()))

    def next(self, body: dict[str, Any]) -> dict[str, Any]:
        system = body["messages"][0]["content"]
        persona = next(p for p in PERSONAS if system.startswith(f"You are the {TITLES[p]} "))
        with self.lock:
            self.asked.setdefault(persona, []).append(body)
            queue = self.queues.get(persona, [])
            if not queue:
                return {"status": 500, "headers": {"content-type": "application/json"},
                        "body": {"error": {"message": f"test server: no reply left for {persona}"}}}
            return queue.pop(0)


@pytest.fixture
def model() -> Iterator[PanelModel]:
    recorded = PanelModel()
    with replaying(recorded):
        yield recorded


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    async with connect(NatsSettings(url=nats_url)) as connection:
        yield connection


async def review(conn: Connection, model: PanelModel) -> PanelReviewed:
    """Write the experiment, ask the panel through a spec carrying credentials, append the review."""
    await write_experiment(conn.log, RUN)
    spec = f"openai:panel-model@{model.url.replace('http://', f'http://panel:{SECRET}@')}/v1"
    panel = LlmPanel(ModelConfig(main=spec, retries=0), conn.log)
    try:
        reviewed = await panel.review(await load_record(conn.log, RUN))
    finally:
        await panel.aclose()
    await append_review(conn.log, reviewed)
    return reviewed


async def call_types(conn: Connection, persona: str, n: int = 0) -> list[str]:
    return [r.event.TYPE async for r in conn.log.read(subjects=[trace_subject(RUN, 0, f"panel:{persona}", n)])]


async def logged_reviews(conn: Connection) -> list[PanelReviewed]:
    return [r.event async for r in conn.log.read(subjects=[trace_subject(RUN)], types=[PanelReviewed.TYPE])
            if isinstance(r.event, PanelReviewed)]


async def test_three_personas_agree_and_every_call_is_on_the_log(conn: Connection, model: PanelModel) -> None:
    model.play("methodologist", "methodologist_sound")
    model.play("auditor", "auditor_valid")  # inside a ```json fence
    model.play("optimizer", "optimizer_advance")
    reviewed = await review(conn, model)
    assert [(v.persona, v.verdict) for v in reviewed.verdicts] == [
        ("methodologist", "SOUND"), ("auditor", "VALID"), ("optimizer", "ADVANCE")]
    assert reviewed.decision == "KEEP" and reviewed.rejections == ()
    assert reviewed.verdicts[1].reasons == ("the difference's interval lies above 0, as the hypothesis claims",)
    proposal = parse_spec(reviewed.proposal, where="proposal")  # as hx experiment run loads it
    assert proposal.tasks == ("twx:coin:dev:2", "twx:coin:dev:3") and proposal.replications == 4
    # the reviewer is named with its credentials masked; the secret is nowhere on the log
    assert reviewed.reviewer.startswith("openai:panel-model@") and SECRET not in reviewed.reviewer
    for persona in PERSONAS:
        assert await call_types(conn, persona) == ["model.request", "model.response"]
        (asked,) = model.asked[persona]
        assert asked["messages"][0]["content"] == system_prompt(persona)
        shown = json.loads(asked["messages"][1]["content"])
        assert shown["run"] == RUN and shown["order"]["is_the_seeded_shuffle"] is True
        assert shown["arms"][1]["models"] == ["random:"] and shown["conclusion"]["falsified"] == "not_falsified"
    [logged] = await logged_reviews(conn)
    assert logged == reviewed
    everything = [r async for r in conn.log.read(subjects=[f"hx.trace.{RUN}.>"])]
    assert SECRET not in str([msgspec.to_builtins(r.event) for r in everything])


async def test_unparsed_and_off_scale_replies_are_logged_rejections(conn: Connection, model: PanelModel) -> None:
    model.play("methodologist", "methodologist_prose")
    model.play("auditor", "auditor_off_scale")
    model.play("optimizer", "optimizer_revise")
    reviewed = await review(conn, model)
    # a rejected persona counts as its scale's worst; the methodologist's veto then decides
    assert [v.verdict for v in reviewed.verdicts] == ["UNSOUND", "INVALID", "REVISE"]
    assert reviewed.decision == "REDESIGN"
    rejected = {r.persona: r for r in reviewed.rejections}
    assert set(rejected) == {"methodologist", "auditor"}
    assert rejected["methodologist"].reason.startswith("reply: not a JSON object")
    assert rejected["methodologist"].reply.startswith("The design looks sound to me")
    assert rejected["auditor"].reason == ("verdict: 'PLAUSIBLE' is not on the Knowledge Auditor's scale "
                                          "(VALID, INCONCLUSIVE, INVALID)")
    assert reviewed.verdicts[0].reasons[0].startswith("reply rejected: reply: not a JSON object")
    assert parse_spec(reviewed.proposal).replications == 4  # the optimizer's own proposal stands
    for persona in PERSONAS:  # the rejected calls are on the log like the others
        assert await call_types(conn, persona) == ["model.request", "model.response"]
    assert await logged_reviews(conn) == [reviewed]


async def test_a_proposal_the_runner_refuses_is_rejected_and_the_offline_one_used(conn: Connection,
                                                                                  model: PanelModel) -> None:
    model.play("methodologist", "methodologist_sound")
    model.play("auditor", "auditor_valid")
    model.play("optimizer", "optimizer_two_things")
    reviewed = await review(conn, model)
    (rejection,) = reviewed.rejections
    assert rejection.persona == "optimizer"
    assert rejection.reason == ("proposal: factors: 2 factors change 2 things; declare design: factorial to run "
                                "every combination, or split into one spec per factor")
    assert reviewed.verdicts[2].verdict == "REDESIGN" and reviewed.decision == "REDESIGN"
    assert reviewed.verdicts[2].reasons[-1] == "proposal: the offline panel's"
    assert parse_spec(reviewed.proposal).tasks == ("twx:coin:dev:2", "twx:coin:dev:3")  # offline: fresh tasks


async def test_an_unreachable_model_is_a_rejection_per_persona(conn: Connection, model: PanelModel) -> None:
    reviewed = await review(conn, model)  # nothing recorded: the server answers 500 to every persona
    assert [v.verdict for v in reviewed.verdicts] == ["UNSOUND", "INVALID", "REDESIGN"]
    assert [r.persona for r in reviewed.rejections] == list(PERSONAS)
    assert all(r.reason.startswith("model unreachable: ") and r.reply == "" for r in reviewed.rejections)
    assert msgspec.convert(reviewed.proposal, ExperimentSpec).title.startswith("task notes on coin")
    for persona in PERSONAS:
        assert "model.error" in await call_types(conn, persona)


def test_replies_are_judged_against_the_persona_scale() -> None:
    verdict, proposal = judge_reply("auditor", '{"verdict": "INCONCLUSIVE", "reasons": ["wide"], "extra": 1}')
    assert (verdict.verdict, verdict.reasons, proposal) == ("INCONCLUSIVE", ("wide",), None)
    with pytest.raises(Exception, match="'SOUND' is not on the Loop Optimizer's scale"):
        judge_reply("optimizer", '{"verdict": "SOUND"}')
    with pytest.raises(Exception, match="proposal: missing"):
        judge_reply("optimizer", '{"verdict": "ADVANCE", "reasons": []}')
    with pytest.raises(Exception, match="reply: Expected `array`"):
        judge_reply("methodologist", '{"verdict": "SOUND", "reasons": "fine"}')
