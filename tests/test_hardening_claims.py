"""Claims: of two runs (or rounds, or results files) with the same name, exactly one wins, the other writes nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from toybench import RANDOM, ToyBench, ids
from toyworld import ToyWorld

from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.job import EvolveRequest, TaskChoice
from hx.aegis.session import Parts, new_job, run_evolution
from hx.aegis.settings import EvolveSettings
from hx.environments.errors import ResultsError, RunExists
from hx.environments.results import ResultsClaim, from_json, summarise
from hx.environments.rollout import Rollout, RolloutSettings
from hx.harnesses import starter_harness
from schemas.envelope import Record
from schemas.ledger import EvolutionFinished, LedgerEvent, LedgerOpened
from schemas.lifecycle import AttemptFinished, RoundStarted, RunFinished, RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.errors import ConcurrencyConflict
from streams.log import EventLog
from streams.topology import LEDGER, TRACE, trace_filter, trace_subject


def rollout(log: EventLog) -> Rollout:
    return Rollout(ToyBench(), RANDOM, starter_harness("textworld"), log=log,
                   settings=RolloutSettings(attempts=2, concurrency=2, max_steps=12))


async def run_records(log: EventLog, run_id: str) -> list[Record]:
    return [r async for r in log.read(TRACE.name, subjects=[trace_filter(run_id)])]


async def test_two_runs_with_one_id_at_once_one_wins_and_the_other_writes_nothing(nats_url: str) -> None:
    tasks = ids("walk", 4)
    settings = NatsSettings(url=nats_url)
    async with connect(settings) as one, connect(settings) as two:  # two processes' worth of connections
        results = await asyncio.gather(rollout(one.log).rollout("same", tasks), rollout(two.log).rollout("same", tasks),
                                       return_exceptions=True)
        recs = await run_records(one.log, "same")
    wins = [r for r in results if not isinstance(r, BaseException)]
    losses = [r for r in results if isinstance(r, BaseException)]
    assert len(wins) == 1 and len(losses) == 1, results
    assert isinstance(losses[0], RunExists) and "run 'same' is already on the log" in str(losses[0])
    types = Counter(r.type for r in recs)
    assert types[RunStarted.TYPE] == 1 and types[RunFinished.TYPE] == 1 and types[RoundStarted.TYPE] == 1
    [finished] = [r.event for r in recs if isinstance(r.event, RunFinished)]
    assert finished.status == "completed"  # the loser never wrote a 'failed' over the winner's run
    verdicts = Counter((r.event.task_id, r.event.attempt) for r in recs if isinstance(r.event, AttemptFinished))
    assert set(verdicts.values()) == {1} and len(verdicts) == len(tasks) * 2  # no attempt of the loser


async def test_two_evolvers_with_one_run_id_at_once_one_wins_and_the_other_writes_nothing(nats_url: str) -> None:
    """``hx evolve``'s own claim on the trace: the second evolver is refused before it writes a thing."""
    bench = ToyWorld()
    request = EvolveRequest(TaskChoice(("toyworld:rooms",), adaptation=4, heldout=2), model="random:",
                            rollout=RolloutSettings(attempts=1, concurrency=2, max_steps=12, seed=3),
                            loop=EvolveSettings(rounds=1, patience=1))
    job = new_job("evo-same", [bench], request, harness=starter_harness("textworld"),
                  harness_source="starter:textworld")
    settings = NatsSettings(url=nats_url)
    async with connect(settings) as one, connect(settings) as two:  # two processes' worth of connections
        results = await asyncio.gather(*(run_evolution(conn, [bench], job, Parts(OfflineEvolver()), resume=False)
                                         for conn in (one, two)), return_exceptions=True)
        trace = await run_records(one.log, "evo-same")
        ledger = [r async for r in one.log.read(LEDGER.name)]
    losses = [r for r in results if isinstance(r, BaseException)]
    assert len(losses) == 1 and isinstance(losses[0], RunExists), results
    assert "run 'evo-same' is already on the log; use another run id or --resume it" in str(losses[0])
    types = Counter(r.type for r in trace)
    assert types[RunStarted.TYPE] == 1 and types[RunFinished.TYPE] == 1  # the winner's claim and end, no other
    rounds = Counter(r.event.round for r in trace if isinstance(r.event, RoundStarted))
    assert rounds and set(rounds.values()) == {1}  # every round once: the loser ran none
    assert [r.type for r in ledger].count(LedgerOpened.TYPE) == 1
    assert {r.event.run_id for r in ledger if isinstance(r.event, LedgerEvent)} == {"evo-same"}
    assert isinstance(ledger[-1].event, EvolutionFinished)  # the winner's run, to its end


async def test_two_rounds_with_one_number_at_once_one_wins(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        first, second = rollout(conn.log), rollout(conn.log)
        await first.start("rounds")
        results = await asyncio.gather(first.run_round("rounds", 3, ids("easy", 2)),
                                       second.run_round("rounds", 3, ids("walk", 2)), return_exceptions=True)
        recs = await run_records(conn.log, "rounds")
    assert sum(isinstance(r, RunExists) for r in results) == 1
    [loss] = [r for r in results if isinstance(r, RunExists)]
    assert "round 3 of run 'rounds' is already on the log" in str(loss)
    [started] = [r.event for r in recs if isinstance(r.event, RoundStarted)]
    winner_tasks = set(started.task_ids)
    assert {r.event.task_id for r in recs if isinstance(r.event, AttemptFinished)} == winner_tasks


async def test_a_second_claim_is_refused_even_from_the_same_rollout(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        ro = rollout(conn.log)
        await ro.start("twice")
        with pytest.raises(RunExists, match="run 'twice' is already on the log"):
            await ro.start("twice")
        subject = trace_subject("twice")
        assert len([r async for r in conn.log.read(TRACE.name, subjects=[subject])]) == 1


def test_a_results_file_is_claimed_by_one_run(tmp_path: Path) -> None:
    path = tmp_path / "results" / "r.json"
    mine = ResultsClaim(path)
    assert path.exists() and path.with_suffix(".md").exists() and path.read_text() == ""
    with pytest.raises(ResultsError, match=r"results file .*r\.json already exists"):
        ResultsClaim(path)
    mine.release()  # never written: given back
    assert not path.exists() and not path.with_suffix(".md").exists()
    again = ResultsClaim(path)
    with pytest.raises(ResultsError):
        ResultsClaim(tmp_path / "results" / "r.json")
    assert again.path == path


def test_a_results_file_written_by_its_run_is_kept_on_release(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    claim = ResultsClaim(path)
    report = summarise([], attempts=1, run_id="kept")
    claim.save(report)
    claim.release()
    assert from_json(path.read_text()).run_id == "kept"


@pytest.mark.slow
def test_two_hx_run_processes_with_one_run_id(tmp_path: Path, nats_url: str) -> None:
    """Two real ``hx run`` processes race for one run id: one runs, the other stops with a clear error."""
    env = {**os.environ, "HX_NATS_URL": nats_url, "HX_DATA_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "hx", "run", "--tasks", "2", "--attempts", "1", "--run-id", "raced"]
    procs = [subprocess.Popen([*command, "--out", str(tmp_path / f"r{i}.json")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    loser = outs[[p.returncode for p in procs].index(1)]
    assert loser[1].strip().splitlines()[-1] == "error: run 'raced' is already on the log; use another run id"
    assert "Traceback" not in loser[1]
    reports = [from_json(p.read_text()) for p in tmp_path.glob("r*.json")]
    assert len(reports) == 1 and reports[0].run_id == "raced"  # the loser gave its results file back


async def test_a_conditional_append_sent_again_is_recognised_as_stored(nats_url: str) -> None:
    """The server checks the expected sequence before the message id: a resend must still count as ours."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        subject = trace_subject("resent")
        event = RunStarted(run_id="resent")
        first = await conn.log.append(subject, event, key="mine", expected_last_seq=0)
        again = await conn.log.append(subject, event, key="mine", expected_last_seq=0)
        assert (again.seq, again.duplicate) == (first.seq, True)
        with pytest.raises(ConcurrencyConflict):
            await conn.log.append(subject, event, key="theirs", expected_last_seq=0)
