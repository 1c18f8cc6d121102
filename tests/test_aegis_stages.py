"""The stages of an AEGIS round (``hx.aegis.stage``): a stage added through the public API, the progress each
stage shows, a pipeline that cannot decide, and a run killed at every stage resuming to the result of one never
killed."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import structlog
from evolve_worker import job
from test_aegis_loop import evolve, killed_mid_round, of, worker
from toyworld import ToyWorld

from hx.aegis.errors import PipelineError
from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.gate import Forbidden
from hx.aegis.ledger import Ledger
from hx.aegis.loop import Evolution
from hx.aegis.settings import EvolveSettings, Progress
from hx.aegis.stage import RoundContext
from hx.aegis.stages import pipeline
from hx.aegis.stages.decide import Decide
from hx.aegis.stages.round_log import RoundLog
from hx.aegis.trials import Trials
from hx.environments.rollout import RolloutSettings
from hx.environments.splits import Splits
from hx.harnesses import starter_harness
from hx.replay.ledger_view import headline
from hx.runtime.models import ModelConfig
from schemas.ledger import CriticJudged, LedgerEvent, LedgerOpened, RoundDecided, RoundDigested
from streams.config import NatsSettings
from streams.connection import Connection, connect


async def test_a_round_log_stage_logs_each_decided_round_and_appends_nothing(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        plain = await evolve(conn, "stages-plain", rounds=2)
        with structlog.testing.capture_logs() as logs:
            logged = await evolve(conn, "stages-logged", rounds=2, stages=(RoundLog(),))
    lines = [line for line in logs if line.get("event") == "round decided"]
    decisions, digests = of(logged, RoundDecided), of(logged, RoundDigested)
    assert [line["round"] for line in lines] == [d.round for d in decisions] == [0, 1]
    for line, decision, digested in zip(lines, decisions, digests, strict=True):
        assert line["run_id"] == "stages-logged" and line["outcome"] == decision.outcome
        assert line["shipped"] == len(decision.shipped) and line["rollouts"] == decision.metrics.rollouts > 0
        assert line["tasks"] == len(digested.digests) and line["solved"] == sum(d.solved for d in digested.digests)
    assert [type(r) for r in logged] == [type(r) for r in plain]  # the same ledger, event for event
    assert [d.outcome for d in decisions] == [d.outcome for d in of(plain, RoundDecided)]


async def test_each_stage_shows_its_output_on_the_progress_line(nats_url: str) -> None:
    shown: list[tuple[int, str, str]] = []
    started: list[tuple[int, str]] = []
    progress = Progress(stage=lambda t, what: started.append((t, what)),
                        shown=lambda t, stage, line: shown.append((t, stage, line)))
    async with connect(NatsSettings(url=nats_url)) as conn:
        records = await evolve(conn, "stages-shown", rounds=1, progress=progress)
    [digested] = of(records, RoundDigested)
    [decision] = of(records, RoundDecided)
    assert [s for _, s, _ in shown] == [s for _, s in started] == ["rollouts", "digest", "plan", "propose",
                                                                  "criticise", "gate"]
    lines = {stage: line for _, stage, line in shown}
    solved = sum(d.solved for d in digested.digests)
    assert lines["digest"] == f"{solved}/{len(digested.digests)} task(s) solved, actionability " \
                              f"{digested.actionability:.2f}"
    assert lines["rollouts"] == "1 trace round(s)" and lines["gate"].startswith(decision.outcome)
    assert lines["criticise"] == headline(of(records, CriticJudged)[0])  # as ``hx ledger`` shows the verdict


@dataclass
class Veto:
    """A stage that ends every round after its plan: only ``Decide`` runs after it."""

    name: str = "veto"
    after_end: bool = False

    async def recorded(self, ctx: RoundContext) -> str | None:
        return None

    async def run(self, ctx: RoundContext) -> str:
        assert ctx.landscape is not None and ctx.digested is not None and not ctx.candidates
        return "vetoed after the plan"

    def take(self, ctx: RoundContext, output: str) -> None:
        ctx.end("no_candidate", output)

    def show(self, output: str) -> str:
        return output


async def evolution(conn: Connection, run_id: str, stages: list[Any]) -> Evolution:
    """An ``Evolution`` of the test job with ``stages``, its ledger opened."""
    bench = ToyWorld()
    the_job = job(run_id, bench, rounds=1)
    ledger = Ledger(conn, run_id)
    await ledger.start(LedgerOpened(run_id=run_id, strategy="ensemble", harness=starter_harness("textworld").spec(),
                                    digest=starter_harness("textworld").digest,
                                    settings=msgspec.to_builtins(the_job.public()),
                                    heldout_digest=Splits.of(the_job.adaptation, the_job.heldout).heldout_digest))
    trials = Trials(conn.log, run_id, [bench], ModelConfig(main="random:"),
                    RolloutSettings(attempts=2, concurrency=4, max_steps=30, seed=3),
                    Splits.of(the_job.adaptation, the_job.heldout), next_round=0)
    return Evolution(ledger, trials, OfflineEvolver(), EvolveSettings(rounds=1), Forbidden(()), stages=stages)


async def test_a_stage_inserted_in_the_pipeline_ends_the_round_it_decides(nats_url: str) -> None:
    stages = pipeline()
    at = next(i for i, s in enumerate(stages) if s.name == "plan") + 1
    async with connect(NatsSettings(url=nats_url)) as conn:
        run = await evolution(conn, "stages-veto", [*stages[:at], Veto(), *stages[at:]])
        try:
            decision = await run.round(0)
        finally:
            await run.ledger.close()
    assert (decision.outcome, decision.reason) == ("no_candidate", "vetoed after the plan")
    assert [type(r).__name__ for r in run.ledger.records] == ["LedgerOpened", "RoundDigested", "LandscapePlanned",
                                                              "RoundDecided"]


async def test_a_pipeline_without_a_decision_is_refused(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        run = await evolution(conn, "stages-undecided", [s for s in pipeline() if not isinstance(s, Decide)])
        try:
            with pytest.raises(PipelineError, match="round 0: no stage decided it"):
                await run.round(0)
        finally:
            await run.ledger.close()


@pytest.mark.slow
def test_a_run_killed_at_every_stage_in_turn_resumes_to_the_result_of_one_never_killed(nats_url: str) -> None:
    whole = worker(nats_url, "stages-whole")
    out, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, err
    reference = json.loads(out.strip().splitlines()[-1])
    # Each kill lands as a stage starts: what the stages before it recorded is used, the stage itself runs again.
    for i, at in enumerate(["0:digest", "0:plan", "0:propose", "0:criticise", "0:gate", "1:digest"]):
        killed_mid_round(nats_url, "stages-killed", at, *(["--resume"] if i else []))
    resumed = worker(nats_url, "stages-killed", "--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["rounds"] == reference["rounds"] and result["variants"] == reference["variants"]
    assert result["heldout"] == reference["heldout"] and result["routing"] == reference["routing"]
    assert result["rollouts"] == reference["rollouts"]
    whole_ledger, killed_ledger = asyncio.run(ledgers(nats_url, "stages-whole", "stages-killed"))
    # every stage appended its events once: none lost to a kill, none repeated by a resume
    assert [type(r) for r in killed_ledger] == [type(r) for r in whole_ledger]


async def ledgers(nats_url: str, *run_ids: str) -> list[list[LedgerEvent]]:
    """The ledgers of ``run_ids``."""
    out = []
    async with connect(NatsSettings(url=nats_url)) as conn:
        for run_id in run_ids:
            ledger = Ledger(conn, run_id)
            await ledger.load()
            await ledger.close()
            out.append(list(ledger.records))
    return out
