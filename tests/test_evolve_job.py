"""The evolution job as a typed value: recorded nested, and a job recorded flat before issue 34 read back the same.

``tests/data/pre34_jobs.json`` holds ``LedgerOpened.settings`` exactly as the code before issue 34
wrote it: three read from real ledgers (an evolution, a run that shipped, a co-evolution) and two
built by that code's ``new_job`` with every setting off its default.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import toyworld  # also registers the toy benchmark with the in-process command
from hx_cli import hx, ok
from ledger_forger import ledger_of

from hx.aegis.job import EvolveJob, EvolveRequest, TaskChoice
from hx.aegis.ledger import Ledger
from hx.aegis.session import new_job, recorded_job
from hx.aegis.settings import EvolveSettings, GateSettings
from hx.environments.rollout import RolloutSettings
from hx.environments.splits import Splits
from hx.gate.sequential import SequentialRule
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.replay.ledger_checks import gate_rule
from schemas.job import ROLLOUT_FIELDS
from schemas.ledger import LedgerOpened
from streams.config import NatsSettings
from streams.connection import connect
from streams.signing import LedgerKey

PRE34 = json.loads((Path(__file__).parent / "data" / "pre34_jobs.json").read_text())
FLAT = {f"{source}:{name}": job for source in ("recorded", "made") for name, job in PRE34[source].items()}
TOP = ("run_id", "benches", "adaptation", "heldout", "model", "harness", "harness_source", "evolver", "meta_model")


def as_json(value: object) -> Any:
    """``value`` as the ledger's JSON gives it back (tuples as lists)."""
    return json.loads(msgspec.json.encode(value))


def algorithm_named(coevolve: dict[str, Any]) -> dict[str, Any]:
    """Old co-evolution settings as they read back since learner algorithms were named: ``grpo`` is the algorithm."""
    learner = dict(coevolve["learner"])
    learner["algorithm"] = {"name": "grpo", **learner.pop("grpo")}
    return {**coevolve, "learner": learner}


@pytest.mark.parametrize("name", sorted(FLAT))
def test_a_job_recorded_flat_before_issue_34_loads_as_the_same_job(name: str) -> None:
    """Every field of the flat record lands where the nested job keeps it, the co-evolution's settings typed."""
    flat = FLAT[name]
    job = recorded_job(flat)
    assert {k: as_json(getattr(job, k)) for k in TOP} == {k: flat[k] for k in TOP}
    assert {k: getattr(job.rollout, k) for k in ROLLOUT_FIELDS} == {k: flat[k] for k in ROLLOUT_FIELDS}
    assert job.loop == EvolveSettings(**flat["settings"], gate=GateSettings())  # the retry rule it ran with
    assert job.coevolving == bool(flat["coevolve"])
    if flat["coevolve"]:
        assert as_json(job.coevolve) == algorithm_named(flat["coevolve"])  # type: ignore[attr-defined]
    else:
        assert type(job) is EvolveJob


def test_the_made_pre34_jobs_read_back_with_the_values_they_were_made_with() -> None:
    """The two jobs the old ``new_job`` made, compared with the values it was given (not with themselves)."""
    job = recorded_job(PRE34["made"]["evolve"])
    assert job.rollout == RolloutSettings(attempts=3, concurrency=5, max_steps=40, seed=7, timeout_s=12.5)
    assert job.loop == EvolveSettings(rounds=5, patience=2, alpha=0.1, candidates=4, strategy="global",
                                      max_variants=2, heldout_every=2, risk_threshold=0.6, gate=GateSettings())
    assert (job.evolver, job.meta_model, job.model) == ("llm", "anthropic:claude-sonnet-4-6",
                                                        "openai:gpt-x@http://***@h/v1")
    assert job.heldout == ("toyworld:rooms:train:0", "toyworld:bell:train:0")
    assert HarnessConfig.from_spec(job.harness).digest == starter_harness("textworld").digest
    co = recorded_job(PRE34["made"]["coevolve"])
    assert co.coevolving and co.rollout == job.rollout and co.loop == job.loop
    settings: Any = co.coevolve  # type: ignore[attr-defined]
    assert (settings.mode, settings.budget, settings.policy_gate, settings.rest_barren) == ("model", 900, True, 2)
    assert (settings.learner.kind, settings.learner.config, settings.learner.window) == ("lm", {"layers": 2}, 3)
    assert (settings.learner.algorithm.learning_rate, settings.learner.algorithm.epochs) == (0.02, 2)


def test_a_new_job_is_recorded_nested_and_reads_back_equal() -> None:
    """``new_job`` from a request: recorded as nested plain data (no flat keys), read back to the same value."""
    request = EvolveRequest(TaskChoice(("toyworld:rooms",), adaptation=2, heldout=1),
                            loop=EvolveSettings(rounds=2, alpha=0.2), model="random:",
                            rollout=RolloutSettings(attempts=1, max_steps=9, seed=4, timeout_s=3.0))
    job = new_job("r", [toyworld.ToyWorld()], request, harness=starter_harness("textworld"), harness_source="s")
    data = msgspec.to_builtins(job.public())
    assert data["rollout"] == {"attempts": 1, "concurrency": 4, "max_steps": 9, "seed": 4, "timeout_s": 3.0}
    assert data["loop"]["rounds"] == 2 and data["loop"]["alpha"] == 0.2
    assert not {*ROLLOUT_FIELDS, "settings", "coevolve"} & set(data)
    assert msgspec.structs.replace(recorded_job(data), harness=job.harness) == job and not job.coevolving
    back = recorded_job(as_json(data))  # as the ledger's JSON gives it back: the harness's tuples as lists
    assert msgspec.structs.replace(back, harness=job.harness) == job
    assert HarnessConfig.from_spec(back.harness).digest == HarnessConfig.from_spec(job.harness).digest


def test_a_ledger_opened_flat_resumes_and_verifies(nats_url: str, tmp_path: Path) -> None:
    """A ledger whose ``LedgerOpened`` holds the pre-34 flat job: ``hx evolve --resume`` runs it with the recorded
    settings (its rounds, attempts, step cap), and ``hx audit verify`` passes."""
    data = tmp_path / "data"
    base = ("--nats-url", nats_url, "--data-dir", str(data))
    flat = {**PRE34["made"]["evolve"], "run_id": "pre34-flat", "model": "random:", "evolver": "offline",
            "meta_model": "", "timeout_s": None,
            "settings": {**PRE34["made"]["evolve"]["settings"], "rounds": 1, "patience": 1, "heldout_every": 0}}
    harness = HarnessConfig.from_dict(flat["harness"])
    heldout_digest = Splits.of(flat["adaptation"], flat["heldout"]).heldout_digest

    async def open_flat() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            ledger = Ledger(conn, "pre34-flat", LedgerKey.of(data))
            try:
                await ledger.start(LedgerOpened(run_id="pre34-flat", strategy=flat["settings"]["strategy"],
                                                harness=harness.spec(), digest=harness.digest, settings=flat,
                                                heldout_digest=heldout_digest))
            finally:
                await ledger.close()
    asyncio.run(open_flat())
    result = hx(*base, "evolve", "--resume", "pre34-flat", "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    report = json.loads(result.stdout)
    assert [r["round"] for r in report["rounds"]] == [0]  # rounds=1, from the flat record's settings
    ledger = asyncio.run(ledger_of(nats_url, "pre34-flat"))
    assert ledger.opened is not None and ledger.opened.settings == flat  # never re-encoded
    assert report["rounds"][0]["rollouts"] == 3 * len(flat["adaptation"])  # attempts=3 per task
    verify = hx(*base, "audit", "verify", "pre34-flat")
    assert verify.exit_code == 0, (verify.output, verify.exception)


def test_a_new_job_records_the_sequential_rules_numbers_even_at_their_defaults(nats_url: str,
                                                                                tmp_path: Path) -> None:
    """``hx evolve`` at the defaults: its ``LedgerOpened`` holds the gate's drop, alpha and waves, so the audit reads
    what the gate ran with, not a later hx's defaults; a retry job records no numbers it does not use."""
    ok(hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "evolve", "--bench", "toyworld:rooms", "--tasks", "2",
          "--heldout-tasks", "1", "--rounds", "1", "--max-steps", "8", "--run-id", "gate-numbers"))
    ledger = asyncio.run(ledger_of(nats_url, "gate-numbers"))
    assert ledger.opened is not None
    assert ledger.opened.settings["loop"]["gate"] == {"seesaw": "sequential", "drop": 0.25, "alpha": 0.05, "waves": 3}
    assert gate_rule(ledger) == SequentialRule(0.25, 0.05, 3)
    assert GateSettings.of("off", seesaw="retry").recorded() == {}
    assert GateSettings.of("keep", drop=0.5).recorded() == {"seesaw": "sequential", "drop": 0.5, "alpha": 0.05,
                                                            "waves": 3, "interval": "keep"}
