"""Rollouts against a real nats-server, on a tiny benchmark of our own: attempts, subjects, pass@k, splits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from toybench import RANDOM, ToyBench, ids

from hx.environments import rollout as rollout_module
from hx.environments.errors import BenchmarkError, ReportMismatch, RunExists, SplitViolation
from hx.environments.heldout import evaluate_heldout
from hx.environments.results import AttemptOutcome, ResultsClaim, from_json, markdown_table, to_json
from hx.environments.rollout import Rollout, RolloutSettings, attempt_seed, cross_check, round_outcomes
from hx.environments.splits import Splits, adaptation_history
from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError
from hx.harnesses import families, starter_harness, starter_harness_text
from hx.replay.trace_rounds import outcomes, trace_marks
from hx.runtime.loop import AttemptResult
from hx.runtime.tracer import NullWriter
from projections.task_history import pass_at_k
from schemas.envelope import DEFLATE, HX_ENCODING, Record, deflate, encoded, inflate
from schemas.hooks import HookRecord
from schemas.lifecycle import AttemptFinished, AttemptStarted, RoundFinished, RoundStarted, RunFinished, RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.outgoing import COMPRESS_MIN_BYTES
from streams.redaction import public
from streams.topology import TRACE, trace_filter, trace_subject


async def records(log: EventLog, run_id: str) -> list[Record]:
    return [r async for r in log.read(TRACE.name, subjects=[trace_filter(run_id)])]


def rollout(log: EventLog, bench: ToyBench | None = None, **settings: int) -> Rollout:
    return Rollout(bench or ToyBench(), RANDOM, starter_harness("textworld"), log=log,
                   settings=RolloutSettings(**{"attempts": 2, "concurrency": 3, "max_steps": 20, **settings}),
                   harness_source="starter:textworld")


async def test_a_round_runs_k_attempts_per_task_each_on_its_own_subject(nats_url: str) -> None:
    bench = ToyBench(gate=3)
    tasks = ids("walk", 4)
    async with connect(NatsSettings(url=nats_url)) as conn:
        ro = rollout(conn.log, bench, attempts=3, concurrency=3)
        seen: list[tuple[str, int]] = []
        outcome = await asyncio.wait_for(ro.rollout("r1", tasks, progress=lambda r: seen.append((r.task_id,
                                                                                                  r.attempt))), 60)
        recs = await records(conn.log, "r1")
    expected = {(t, a) for t in tasks for a in range(3)}
    assert {(r.task_id, r.attempt) for r in outcome.results} == expected and sorted(seen) == sorted(expected)
    assert bench.built == 12 and bench.max_active == 3 and bench.active == 0  # a fresh task per attempt
    attempt_subjects = {r.subject for r in recs if r.subject.count(".") == 5 and not r.subject.endswith("._._")}
    assert attempt_subjects == {trace_subject("r1", 0, t, a) for t, a in expected}
    [run_started] = [r.event for r in recs if isinstance(r.event, RunStarted)]
    [round_started] = [r.event for r in recs if isinstance(r.event, RoundStarted)]
    [round_finished] = [r.event for r in recs if isinstance(r.event, RoundFinished)]
    [run_finished] = [r.event for r in recs if isinstance(r.event, RunFinished)]
    assert run_started.config["harness_digest"] == starter_harness("textworld").digest
    assert run_started.config["attempts"] == 3 and run_started.config["model"]["main"] == "random:"
    assert round_started.task_ids == tuple(tasks) and round_started.split == "adaptation"
    assert round_started.attempts_per_task == 3 and round_started.harness_digest == ro.harness.digest
    assert round_finished.attempts == 12 and round_finished.passed == sum(r.passed for r in outcome.results)
    # ... and every attempt's verdict, so a reader of the round's outcomes opens no attempt frame.
    assert {(m.task_id, m.attempt): m.passed for m in round_finished.outcomes} == {
        (r.task_id, r.attempt): r.passed for r in outcome.results}
    assert run_finished.status == "completed" and run_finished.rounds == 1
    assert outcome.report.tasks[0].attempts == 3 and outcome.report.source == "log"


async def test_pass_at_k_from_the_log_equals_the_estimator_on_the_attempts(nats_url: str) -> None:
    tasks = ids("walk", 6) + ids("easy", 3)
    async with connect(NatsSettings(url=nats_url)) as conn:
        outcome = await rollout(conn.log, attempts=4, max_steps=6).rollout("r2", tasks)
        logged = await round_outcomes(conn.log, "r2", 0)
    report = outcome.report
    assert {(o.task_id, o.attempt, o.passed) for o in logged} == {(r.task_id, r.attempt, r.passed)
                                                                  for r in outcome.results}
    for ts in report.tasks:
        mine = [r for r in outcome.results if r.task_id == ts.task_id]
        n, c = len(mine), sum(r.passed for r in mine)
        assert (ts.attempts, ts.passes) == (n, c)
        assert ts.pass_at_1 == pytest.approx(pass_at_k(n, c, 1)) and ts.pass_at_2 == pytest.approx(pass_at_k(n, c, 2))
        assert ts.steps == tuple(r.steps for r in sorted(mine, key=lambda r: r.attempt))
    games = {g.game: g for g in report.games}
    assert set(games) == {"toy:walk", "toy:easy"} and games["toy:walk"].tasks == 6
    walk = [t for t in report.tasks if t.game == "toy:walk"]
    assert games["toy:walk"].pass_at_2 == pytest.approx(sum(t.pass_at_2 or 0 for t in walk) / 6)
    assert report.overall.attempts == 36 and report.overall.passes == sum(r.passed for r in outcome.results)
    assert 0 < report.overall.passes < 36  # a random walk sometimes finds the coin in 6 steps, sometimes not
    assert report.overall.mean_steps == pytest.approx(sum(r.steps for r in outcome.results) / 36)


async def test_infrastructure_failures_count_as_failed_attempts(nats_url: str) -> None:
    tasks = ids("broken", 2) + ids("crashy", 2) + ids("easy", 2)
    async with connect(NatsSettings(url=nats_url)) as conn:
        outcome = await rollout(conn.log, attempts=2, max_steps=30).rollout("r3", tasks)
        recs = await records(conn.log, "r3")
    infra = [r for r in outcome.results if r.status == "infra_failure"]
    assert len(infra) == 8 and not any(r.passed for r in infra)
    assert any("no JVM available" in r.reason for r in infra) and any("process died" in r.reason for r in infra)
    finished = [r.event for r in recs if isinstance(r.event, AttemptFinished)]
    assert sum(e.status == "infra_failure" for e in finished) == 8  # every failure is an attempt on the log
    games = {g.game: g for g in outcome.report.games}
    for game in ("toy:broken", "toy:crashy"):
        assert games[game].infra_failures == 4 and games[game].pass_at_1 == 0.0 and games[game].pass_at_2 == 0.0
    assert outcome.report.overall.infra_failures == 8 and outcome.report.overall.attempts == 12
    assert outcome.report.overall.pass_at_1 == pytest.approx((games["toy:easy"].pass_at_1 or 0) / 3)


async def test_agent_seeds_differ_across_attempts_and_reproduce_across_runs(nats_url: str) -> None:
    tasks = ids("walk", 5)
    async with connect(NatsSettings(url=nats_url)) as conn:
        first = await rollout(conn.log, attempts=3, max_steps=8).rollout("seed-a", tasks)
        second = await rollout(conn.log, attempts=3, max_steps=8, concurrency=1).rollout("seed-b", tasks)
        other = await rollout(conn.log, attempts=3, max_steps=8, seed=1).rollout("seed-c", tasks)

    def key(results: Sequence[AttemptResult]) -> list[tuple[str, int, bool, int]]:
        return [(r.task_id, r.attempt, r.passed, r.steps) for r in results]
    assert key(first.results) == key(second.results)  # same seed, another run id and concurrency
    assert key(first.results) != key(other.results)
    assert len({attempt_seed(0, tasks[0], a) for a in range(3)}) == 3
    assert attempt_seed(0, tasks[0], 0) != attempt_seed(0, tasks[1], 0) != attempt_seed(1, tasks[1], 0)


async def test_a_run_or_round_already_on_the_log_is_refused(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        ro = rollout(conn.log, attempts=1)
        await ro.rollout("again", ids("easy", 1))
        with pytest.raises(RunExists, match="run 'again' is already on the log"):
            await ro.rollout("again", ids("easy", 1))
        with pytest.raises(RunExists, match="round 0 of run 'again'"):
            await ro.run_round("again", 0, ids("easy", 1))
        with pytest.raises(BenchmarkError, match="no game 'maze'"):
            await ro.run_round("again", 1, ["toy:maze:dev:1"])
        with pytest.raises(BenchmarkError, match="benchmark 'twx' is not part of this rollout"):
            await ro.run_round("again", 1, ["twx:coin:dev:1"])


def test_splits_must_be_disjoint() -> None:
    with pytest.raises(SplitViolation, match="both the adaptation and the held-out split"):
        Splits.of(ids("walk", 3), ids("walk", 5)[2:])
    with pytest.raises(SplitViolation, match="more than once"):
        Splits.of(ids("walk", 2) * 2)
    splits = Splits.of(ids("walk", 3), ids("walk", 3, "test"))
    assert splits.role_of(ids("walk", 1)[0]) == "adaptation" and splits.role_of("toy:walk:test:200") == "heldout"
    assert splits.role_of("toy:walk:train:0") is None
    assert splits.heldout_digest == Splits.of((), reversed(ids("walk", 3, "test"))).heldout_digest


async def test_a_round_may_not_mix_in_tasks_of_the_other_split(nats_url: str) -> None:
    splits = Splits.of(ids("walk", 3), ids("walk", 3, "test"))
    async with connect(NatsSettings(url=nats_url)) as conn:
        ro = Rollout(ToyBench(), RANDOM, HarnessConfig(), log=conn.log, splits=splits)
        await ro.start("mixed")
        with pytest.raises(SplitViolation, match="adaptation round may only run adaptation tasks"):
            await ro.run_round("mixed", 0, [*ids("walk", 3), "toy:walk:test:200"])
        with pytest.raises(SplitViolation, match="heldout round may only run heldout tasks"):
            await ro.run_round("mixed", 0, ids("walk", 1), role="heldout")
        assert await conn.log.last_subject_seq(trace_subject("mixed", 0)) == 0  # refused before any append
        assert ro.run_config()["splits"]["heldout_digest"] == splits.heldout_digest


async def test_heldout_is_evaluated_on_the_log_but_never_read_as_adaptation_history(nats_url: str) -> None:
    adaptation, heldout = ids("walk", 4), ids("walk", 3, "test")
    splits = Splits.of(adaptation, heldout)
    async with connect(NatsSettings(url=nats_url)) as conn:
        ro = Rollout(ToyBench(), RANDOM, starter_harness("textworld"), log=conn.log, splits=splits,
                     settings=RolloutSettings(attempts=2, max_steps=10))
        await ro.start("evo")
        await ro.run_round("evo", 0, adaptation)
        progress: list[tuple[int, int]] = []
        score = await evaluate_heldout(ro, "evo", 1, splits, progress=lambda done, total: progress.append((done,
                                                                                                            total)))
        # a careless adaptation round (no Splits guard) that lists a held-out task
        careless = Rollout(ToyBench(), RANDOM, HarnessConfig(), log=conn.log,
                           settings=RolloutSettings(attempts=1, max_steps=5))
        await careless.run_round("evo", 2, [adaptation[0], heldout[0]])
        history = await adaptation_history(conn.log, "evo")
        heldout_logged = [o async for o in _finished(conn.log, "evo", 1)]
    assert len(heldout_logged) == 6 and {e.task_id for e in heldout_logged} == set(heldout)
    assert progress[-1] == (6, 6) and len(progress) == 6
    assert score.overall.tasks == 3 and score.overall.attempts == 6 and score.heldout_digest == splits.heldout_digest
    assert not hasattr(score, "tasks")  # aggregates only: no per-task verdicts to leak
    assert {(tr.round, tr.task) for tr in history} == {(0, t) for t in adaptation} | {(2, adaptation[0])}
    assert all(tr.task not in heldout for tr in history) and all(tr.n == 2 for tr in history if tr.round == 0)


async def _finished(log: EventLog, run_id: str, round: int) -> AsyncIterator[AttemptFinished]:
    async for r in log.read(TRACE.name, subjects=[trace_filter(run_id, round)], types=[AttemptFinished.TYPE]):
        assert isinstance(r.event, AttemptFinished)
        yield r.event


async def test_with_the_trace_going_nowhere_the_report_comes_from_the_results(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        ro = Rollout(ToyBench(), RANDOM, HarnessConfig(), log=conn.log, writer=NullWriter(),
                     settings=RolloutSettings(attempts=2, max_steps=5))
        outcome = await ro.rollout("quiet", ids("easy", 2))
        recs = await records(conn.log, "quiet")
    assert outcome.report.source == "results" and outcome.report.overall.attempts == 4
    assert {type(r.event) for r in recs} == {RunStarted, RoundStarted, RoundFinished, RunFinished}


def test_cross_check_names_the_disagreement() -> None:
    a = AttemptOutcome(task_id="toy:walk:dev:1", attempt=0, passed=True)
    cross_check([a], [a])
    with pytest.raises(ReportMismatch, match="0 missing, 1 different"):
        cross_check([a], [AttemptOutcome(task_id=a.task_id, attempt=0, passed=False)])
    with pytest.raises(ReportMismatch, match="1 missing"):
        cross_check([a], [])


async def test_report_round_trips_through_json_and_renders_markdown(nats_url: str, tmp_path: Path) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        outcome = await rollout(conn.log, attempts=2, max_steps=6).rollout("json", ids("walk", 2) + ids("easy", 2))
    report = outcome.report
    assert from_json(to_json(report)) == report
    md = markdown_table(report)
    assert "| toy:walk | 2 |" in md and "| all | 4 |" in md and report.harness_digest in md
    assert ResultsClaim(tmp_path / "r.json").save(report) == (tmp_path / "r.json", tmp_path / "r.md")
    asked_md = ResultsClaim(tmp_path / "named.md").save(report)  # the table must not overwrite the JSON
    assert asked_md == (tmp_path / "named.md", tmp_path / "named.md.md")
    assert from_json(asked_md[0].read_text()) == report and asked_md[1].read_text() == md


def test_run_config_masks_secrets() -> None:
    config = public({"provider_options": {"openai:x": {"api_key": "sk-123", "base_url": "http://u:p@h:1/v1"}},
                     "params": {"main": {"max_tokens": 10}}, "token": "t"})
    assert config["provider_options"]["openai:x"] == {"api_key": "***", "base_url": "http://***@h:1/v1"}
    assert config["params"]["main"]["max_tokens"] == 10 and config["token"] == "***"


@pytest.mark.parametrize("family", ["textworld", "scienceworld", "qa"])
def test_starter_harnesses_load_and_validate(family: str) -> None:
    harness = starter_harness(family)
    assert family in families()
    assert {"system_prompt_template", "history_window", "loop_detector", "budget"} <= set(harness.groups())
    assert HarnessConfig.loads(starter_harness_text(family)) == harness.validate()
    assert HarnessConfig.loads(harness.dumps("json"), "json") == harness  # serialises and rebuilds the same
    for hook in ("task_start", "step_start", "before_model", "after_tool"):
        harness.at(hook)  # every processor builds from its parameters


def test_an_unknown_family_has_no_starter_harness() -> None:
    with pytest.raises(CompositionError, match="no starter harness for benchmark family 'chess'; known: qa"):
        starter_harness("chess")


async def test_attempt_frames_go_deflated_and_in_order(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        await rollout(conn.log, attempts=1, max_steps=40).rollout("wire", ids("walk", 3))
        recs = await records(conn.log, "wire")
        deflated = 0
        for seq in sorted({r.seq for r in recs}):
            msg = await conn.js.get_msg(TRACE.name, seq)
            if (msg.headers or {}).get(HX_ENCODING) == "deflate":
                deflated += 1
                assert len(inflate(DEFLATE, msg.data or b"")) >= COMPRESS_MIN_BYTES
            else:
                assert len(msg.data or b"") < COMPRESS_MIN_BYTES  # what is large goes deflated
    assert deflated >= 1
    for task in ids("walk", 3):
        events = [r.event for r in recs if r.subject == trace_subject("wire", 0, task, 0)]
        assert isinstance(events[0], AttemptStarted) and isinstance(events[-1], AttemptFinished)
        steps = [e.step for e in events if isinstance(e, HookRecord) and e.step]
        assert steps == sorted(steps)  # frames pipelined, yet stored in the attempt's order


async def test_a_frame_with_a_bad_encoding_is_quarantined(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        good = [encoded(RunFinished(run_id="q"))]
        await (await conn.log.send_frame("hx.trace.q._._._", good * 2000, key="q#0+2000")).result()
        headers = {"Hx-Type": "hx.frame", "Hx-Schema-Version": "1", "Hx-Count": "1", HX_ENCODING: "deflate"}
        await conn.js.publish("hx.trace.q._._._", b"not deflated", headers=headers)
        await conn.js.publish("hx.trace.q._._._", deflate(b"x"), headers={**headers, HX_ENCODING: "zstd"})
        got = [r async for r in conn.log.read(TRACE.name, subjects=["hx.trace.q.>"])]
    assert len(got) == 2000 and conn.log.quarantine.count == 2


async def test_reading_many_large_frames_does_not_overrun_the_connection(nats_url: str) -> None:
    # 120 frames of ~700 KiB: one fetch of them all would be ~80 MiB, past the server's
    # per-client outbound limit, and the server would drop the connection mid-read.
    payload = "x" * (700 * 1024)
    async with connect(NatsSettings(url=nats_url)) as conn:
        for i in range(120):
            await conn.log.append_frame("hx.trace.big._._._", [RunStarted(run_id="big", config={"pad": payload})],
                                        key=f"big#{i}")
        got = [r.seq async for r in conn.log.read(TRACE.name, subjects=["hx.trace.big.>"])]
    assert len(got) == 120


async def test_a_round_too_large_for_its_verdicts_in_one_message_is_read_from_its_attempts(
        nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``OUTCOMES_MAX`` attempts ``round.finished`` records no verdict (its message would outgrow the server's
    limit); the trace's readers then read the round's ``attempt.finished`` events and find the same verdicts."""
    monkeypatch.setattr(rollout_module, "OUTCOMES_MAX", 5)
    async with connect(NatsSettings(url=nats_url)) as conn:
        small = await rollout(conn.log).rollout("small", ids("walk", 2))  # 4 attempts: recorded
        large = await rollout(conn.log).rollout("large", ids("walk", 3))  # 6: not
        marks = {run: await trace_marks(conn.log, run) for run in ("small", "large")}
        read = {run: await outcomes(conn.log, run, marks[run].values()) for run in marks}
    finished = {run: marks[run][0].finished for run in marks}
    assert finished["small"] is not None and len(finished["small"].outcomes) == 4
    assert finished["large"] is not None and finished["large"].outcomes == () and finished["large"].attempts == 6
    for run, done in (("small", small), ("large", large)):
        assert read[run] == {0: {(r.task_id, r.attempt): r.passed for r in done.results}}

