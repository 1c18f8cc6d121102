"""Time travel on a real small run: ``hx state --as-of``, ``--as-of`` rebuilds, regressions, diff, bisect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import timetravel_kit as kit
from hx_cli import error_line, hx, ok

from hx.harness.edits import describe
from hx.replay.bisect import Bisection, Edit, Trial, rerun_model
from hx.replay.errors import TimeTravelError
from hx.replay.regressions import AttemptEvidence
from hx.replay.timetravel import AsOf, parse_as_of, run_marks
from projections.base import Projection
from projections.ledger_reader import EditLedger
from projections.runner import ProjectionRunner
from projections.snapshots import Snapshots
from projections.task_history import TaskHistory
from projections.trace_store import TraceStore
from schemas.ledger import HarnessShipped
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import LEDGER, TRACE, trace_filter, trace_subject


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, kit.BuiltRun]]:
    """One nats-server and one built run for the module (the run is only read, except by bisect's scratch run)."""
    proc = NatsProcess(tmp_path_factory.mktemp("tt") / "nats" / "store")
    proc.start(detach=False)
    try:
        yield proc.url, asyncio.run(kit.build_run(proc.url))
    finally:
        proc.stop()


def cli_json(url: str, *args: str) -> Any:
    return json.loads(ok(hx("--nats-url", url, *args, "--json")).stdout)


async def run_messages(url: str) -> tuple[int, int]:
    """How many messages the run has on the trace and on the ledger (what a read-only command must not change)."""
    async with connect(NatsSettings(url=url)) as conn:
        marks = await run_marks(conn.log, kit.RUN)
        trace = [r async for r in conn.log.read(TRACE.name, subjects=[trace_filter(kit.RUN)])]
        return len({r.seq for r in trace}), len(marks.ledger)


def test_the_run_holds_the_regression_the_kit_promises(world: tuple[str, kit.BuiltRun]) -> None:
    _, built = world
    before = {d.task: d for d in built.digests[0]}
    after = {d.task: d for d in built.digests[1]}
    assert before[kit.REGRESSED].solved and not after[kit.REGRESSED].solved
    assert [t for t in kit.TASKS if before[t].solved and not after[t].solved] == [kit.REGRESSED]


def test_state_as_of_round_0_and_the_last_round_differ_as_the_ledger_says(world: tuple[str, kit.BuiltRun]) -> None:
    url, built = world
    h0, _, h2 = built.harnesses
    first, last = cli_json(url, "state", kit.RUN, "--as-of", "r0"), cli_json(url, "state", kit.RUN, "--as-of", "r1")
    # Round 0 ran the starter harness and shipped two edits; round 1 ran what they made.
    assert first["round"] == 0 and first["ran"] == {"v0": h0.digest}
    assert last["round"] == 1 and last["ran"] == {"v0": h2.digest}
    assert first["harness"]["v0"]["digest"] == last["harness"]["v0"]["digest"] == h2.digest
    assert {"visited_states", "task_objects"} <= set(last["harness"]["v0"]["processors"])
    assert "task_objects" not in {a.type for a in h0.attachments}
    # The scoreboard grows by a round; its pass@k is the ledger's own.
    assert [(r["round"], r["outcome"], r["shipped"]) for r in first["scoreboard"]] == [
        (0, "shipped", ["C-R0-01", "C-R0-02"])]
    assert [r["round"] for r in last["scoreboard"]] == [0, 1]
    for rnd, row in enumerate(last["scoreboard"]):
        digests = built.digests[rnd]
        assert row["pass_at_k"] == sum(d.solved for d in digests) / len(digests)
    # The task history is the trace's verdicts, round by round, consistent with the ledger's digests.
    assert all(set(t["rounds"]) == {"0"} for t in first["tasks"])
    for t in last["tasks"]:
        for rnd in (0, 1):
            d = next(d for d in built.digests[rnd] if d.task == t["task"])
            assert t["rounds"][str(rnd)] == {"attempts": d.attempts, "passes": d.passes}
    regressed = next(t for t in last["tasks"] if t["task"] == kit.REGRESSED)
    assert regressed["pass_at_k"] == 0.0
    assert next(t for t in first["tasks"] if t["task"] == kit.REGRESSED)["pass_at_k"] == 1.0
    text = ok(hx("--nats-url", url, "state", kit.RUN, "--as-of", "r1")).stdout
    assert "scoreboard" in text and kit.REGRESSED in text and h2.digest[:19] in text


def test_state_as_of_a_ledger_position_before_the_first_ship(world: tuple[str, kit.BuiltRun]) -> None:
    url, built = world

    async def first_ship() -> int:
        async with connect(NatsSettings(url=url)) as conn:
            marks = await run_marks(conn.log, kit.RUN)
            return next(r.seq for r in marks.ledger if isinstance(r.event, HarnessShipped))

    seq = asyncio.run(first_ship())
    before = cli_json(url, "state", kit.RUN, "--as-of", str(seq - 1))
    assert before["harness"]["v0"]["digest"] == built.harnesses[0].digest and before["scoreboard"] == []
    assert before["round"] is None and all(set(t["rounds"]) == {"0"} for t in before["tasks"])
    at = cli_json(url, "state", kit.RUN, "--as-of", str(seq))
    assert at["harness"]["v0"]["digest"] == built.harnesses[1].digest


@pytest.mark.parametrize("projection", [TaskHistory, TraceStore, EditLedger])
def test_as_of_equals_a_rebuild_stopped_there_and_reuses_snapshots(world: tuple[str, kit.BuiltRun],
                                                                   projection: type[Projection[Any]]) -> None:
    url, _ = world

    async def check() -> None:
        async with connect(NatsSettings(url=url)) as conn:
            proj = projection()
            last = await conn.log.last_seq(proj.stream)
            middle = last // 2 + 1
            await Snapshots(conn.log, proj).clear()
            stopped: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj)
            await stopped.catch_up(stop=middle, checkpoint=False)
            every = max(1, middle // 3)
            travel: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj, snapshot_every=every)
            cold = await travel.fold_as_of(middle)
            assert cold.digest == stopped.digest and cold.start_kind == "start" and cold.written == 1
            warm = await travel.fold_as_of(middle)
            assert warm.digest == stopped.digest and warm.start_kind == "snapshot" and warm.written == 0
            assert warm.start == middle // every * every and warm.folded <= cold.folded
            full: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj)
            await full.catch_up(checkpoint=False)
            assert (await travel.fold_as_of(last)).digest == full.digest
            assert await ProjectionRunner(conn.log, proj).status() is None  # no checkpoint was written

    asyncio.run(check())


def test_a_torn_snapshot_is_skipped(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world

    async def check() -> None:
        async with connect(NatsSettings(url=url)) as conn:
            proj = TaskHistory()
            last = await conn.log.last_seq(TRACE.name)
            expected: ProjectionRunner[Any] = ProjectionRunner(conn.log, proj)
            await expected.catch_up(stop=last, checkpoint=False)
            snaps = Snapshots(conn.log, proj)
            await snaps.store(last - 1, 0, proj.initial())  # a snapshot whose state is wrong for its position...
            refs = await snaps.index()
            store = await conn.log.js.object_store("hx_blobs")
            await store.put(f"asof/{proj.name}/v{proj.version}/{last - 1}", b"\x00torn")  # ...then torn
            assert any(r.seq == last - 1 for r in refs)
            fold = await ProjectionRunner(conn.log, proj, snapshot_every=10**9).fold_as_of(last)
            assert fold.digest == expected.digest and fold.start != last - 1

    asyncio.run(check())


def test_projections_rebuild_as_of_a_round_matches_the_state_at_that_round(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    out = ok(hx("--nats-url", url, "projections", "rebuild", "task_history", "--as-of", "r0", "--run", kit.RUN)).stdout

    async def expected() -> tuple[int, str]:
        async with connect(NatsSettings(url=url)) as conn:
            seq = (await run_marks(conn.log, kit.RUN)).position(AsOf(round=0), TRACE.name)
            runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, TaskHistory())
            await runner.catch_up(stop=seq, checkpoint=False)
            return seq, runner.digest

    seq, digest = asyncio.run(expected())
    assert f"as of r0 (HX_TRACE {seq})" in out and digest in out
    ledger = ok(hx("--nats-url", url, "projections", "rebuild", "edit_ledger", "--as-of", "r1", "--run",
                   kit.RUN)).stdout
    assert "HX_LEDGER" in ledger

    async def whole_ledger() -> tuple[int, str]:
        async with connect(NatsSettings(url=url)) as conn:
            runner: ProjectionRunner[Any] = ProjectionRunner(conn.log, EditLedger())
            await runner.catch_up(checkpoint=False)
            return await conn.log.last_seq(LEDGER.name), runner.digest

    last, full = asyncio.run(whole_ledger())
    at_seq = ok(hx("--nats-url", url, "projections", "rebuild", "edit_ledger", "--as-of", str(last))).stdout
    assert f"as of {last} (HX_LEDGER {last})" in at_seq and full in at_seq


def test_regressions_name_the_task_the_ships_between_and_the_evidence(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    before = asyncio.run(run_messages(url))
    found = cli_json(url, "regressions", kit.RUN, "--round", "1")
    assert found["tasks"] == len(kit.TASKS)
    [reg] = found["regressions"]
    assert reg["task"] == kit.REGRESSED and reg["before"] == "2/2" and reg["after"] == "0/2"
    assert reg["suspects"] == ["C-R0-01", "C-R0-02"]
    assert [(a["attempt"], a["passed"], a["status"]) for a in reg["attempts_after"]] == [
        (0, False, "completed"), (1, False, "completed")]
    assert all(a["passed"] for a in reg["attempts_before"]) and len(reg["attempts_before"]) == 2
    assert {a["model"] for a in reg["attempts_after"]} == {"random:"}
    assert [[c["candidate"] for c in s["candidates"]] for s in found["ships"]] == [["C-R0-01"], ["C-R0-02"]]
    assert found["ships"][1]["operations"] == [describe(op) for op in kit.EDIT_2]
    assert found["ships"][1]["candidates"][0]["levers"] == ["task_objects"]
    assert [(u["parent"], u["version"]) for u in found["learner_updates"]] == [("policy-0", "policy-1")]
    assert found["policy_gates"] == [{"candidate": "policy-1", "adopted": False, "lost": [kit.REGRESSED]}]
    text = ok(hx("--nats-url", url, "regressions", kit.RUN, "--round", "1")).stdout
    assert "1 of 4 task(s) regressed" in text and "attach task_objects" in text and "1 update(s) between" in text
    assert f"policy gate: policy-1 rejected (lost {kit.REGRESSED})" in text
    assert asyncio.run(run_messages(url)) == before  # reading wrote nothing to the run


def test_diff_names_the_operations_and_the_first_diverging_step(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    d = cli_json(url, "diff", kit.RUN, kit.REGRESSED, "--rounds", "0", "1")
    assert [line.split(" at ")[0] for line in d["operations"]] == ["attach visited_states", "attach task_objects"]
    assert d["reproduces"] and d["outcomes"] == [True, False]
    assert [s["operations"] for s in d["ships"]] == [[describe(op) for op in kit.EDIT_1],
                                                     [describe(op) for op in kit.EDIT_2]]
    div = d["divergence"]
    assert div["step"] == 1 and div["what"] == "action"
    assert div["b"]["action"] == 'act({"action": "ring bell"})' and "bell rings" in div["b"]["observation"]
    assert div["a"]["action"] != div["b"]["action"] and div["a"]["seq"] < div["b"]["seq"]
    same = cli_json(url, "diff", kit.RUN, kit.REGRESSED, "--rounds", "0", "0")
    assert same["operations"] == [] and same["divergence"]["step"] is None
    assert "first divergence at step 1" in ok(hx("--nats-url", url, "diff", kit.RUN, kit.REGRESSED, "--rounds", "0",
                                                 "1")).stdout


def test_bisect_names_the_edit_that_flips_the_task_and_writes_only_its_scratch_run(
        world: tuple[str, kit.BuiltRun]) -> None:
    url, built = world
    before = asyncio.run(run_messages(url))
    b = cli_json(url, "bisect", kit.RUN, kit.REGRESSED, "--from", "0", "--to", "1", "--scratch-run", "tt-bisect")
    assert [e["candidates"] for e in b["edits"]] == [["C-R0-01"], ["C-R0-02"]]
    assert [t["digest"] for t in b["trials"]] == [h.digest for h in built.harnesses]
    assert [t["solved"] for t in b["trials"]] == [True, True, False]
    assert b["flip"]["candidates"] == ["C-R0-02"] and b["reproduced"] and b["reaches"]
    assert b["logged"] == [True, False] and b["scratch_run"] == "tt-bisect"
    assert asyncio.run(run_messages(url)) == before  # the run bisected is as it was

    async def scratch_rounds() -> list[int]:
        async with connect(NatsSettings(url=url)) as conn:
            return sorted((await run_marks(conn.log, "tt-bisect")).trace)

    assert asyncio.run(scratch_rounds()) == [0, 1, 2]
    again = error_line(hx("--nats-url", url, "bisect", kit.RUN, kit.REGRESSED, "--from", "0", "--to", "1",
                          "--scratch-run", "tt-bisect"))
    assert "already on the log" in again
    # The scratch run is a plain run: no ledger, so no state, regressions or bisect of its own.
    assert "has no ledger" in error_line(hx("--nats-url", url, "state", "tt-bisect", "--as-of", "r0"))
    assert "the scratch run must not be the run" in error_line(hx(
        "--nats-url", url, "bisect", kit.RUN, kit.REGRESSED, "--from", "0", "--to", "1", "--scratch-run", kit.RUN))


def test_as_of_syntax() -> None:
    assert parse_as_of("r3") == AsOf(round=3) and parse_as_of("R0") == AsOf(round=0)
    assert parse_as_of(" 42 ") == AsOf(seq=42) and str(AsOf(round=2)) == "r2"
    for bad in ("x1", "r", "-3", "0", "r1.5", ""):
        with pytest.raises(TimeTravelError):
            parse_as_of(bad)


def test_bad_input_is_one_line_and_writes_nothing(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    before = asyncio.run(run_messages(url))
    cases = [
        (("state", "nope", "--as-of", "r0"), "run 'nope' is not on the log"),
        (("state", kit.RUN, "--as-of", "r9"), "has no round 9 (rounds 0..1)"),
        (("state", kit.RUN, "--as-of", "x1"), "neither a round"),
        (("state", kit.RUN, "--as-of", "999999"), "position 999999 is not on HX_LEDGER"),
        (("regressions", kit.RUN, "--round", "0"), "no round before it"),
        (("regressions", kit.RUN, "--round", "7"), "has no round 7"),
        (("regressions", "nope", "--round", "1"), "not on the log"),
        (("diff", kit.RUN, "toyworld:bell:dev:99", "--rounds", "0", "1"), "did not run in round 0"),
        (("diff", kit.RUN, kit.REGRESSED, "--rounds", "0", "5"), "has no round 5"),
        (("diff", kit.RUN, kit.REGRESSED, "--rounds", "0", "1", "--attempt", "7"), "has no attempt 7"),
        (("bisect", kit.RUN, kit.REGRESSED, "--from", "1", "--to", "0"), "must be an earlier round"),
        (("bisect", kit.RUN, "toyworld:rooms:dev:9", "--from", "0", "--to", "1"), "did not run in round 0"),
        (("projections", "rebuild", "task_history", "--as-of", "r0"), "say whose with --run"),
        (("projections", "rebuild", "task_history", "--as-of", "r4", "--run", kit.RUN), "has no round 4"),
        (("projections", "rebuild", "task_history", "--as-of", "999999"), "position 999999 is not on HX_TRACE"),
    ]
    for args, expected in cases:
        assert expected in error_line(hx("--nats-url", url, *args)), args
    assert asyncio.run(run_messages(url)) == before


def test_state_calls_the_starting_harness_initial(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    text = ok(hx("--nats-url", url, "state", kit.RUN, "--as-of", "1")).stdout
    assert "  initial" in text and "since round -1" not in text
    assert "since round 0" in ok(hx("--nats-url", url, "state", kit.RUN, "--as-of", "r1")).stdout


def test_diff_counts_steps_as_the_attempt_reports_them(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    found = cli_json(url, "regressions", kit.RUN, "--round", "1")
    [reg] = found["regressions"]
    reported = [next(a["steps"] for a in reg[f"attempts_{w}"] if a["attempt"] == 0) for w in ("before", "after")]
    d = cli_json(url, "diff", kit.RUN, kit.REGRESSED, "--rounds", "0", "1")
    assert d["steps"] == reported
    text = ok(hx("--nats-url", url, "diff", kit.RUN, kit.REGRESSED, "--rounds", "0", "1")).stdout
    assert f"trajectories: {reported[0]} step(s), passed -> {reported[1]} step(s), failed" in text


def test_a_partial_loss_is_listed_as_worsened_and_bisect_without_edits_runs_nothing(
        world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    run, lost, worse, same = "tt-worse", "toyworld:bell:dev:0", "toyworld:bell:dev:1", "toyworld:rooms:dev:0"
    asyncio.run(kit.build_ledger_run(url, run, {lost: (1, 2), worse: (2, 2), same: (1, 2)},
                                     {lost: (0, 2), worse: (1, 2), same: (1, 2)}))
    found = cli_json(url, "regressions", run, "--round", "1")
    assert [(r["task"], r["before"], r["after"]) for r in found["regressions"]] == [(lost, "1/2", "0/2")]
    assert [(r["task"], r["before"], r["after"]) for r in found["worsened"]] == [(worse, "2/2", "1/2")]
    text = ok(hx("--nats-url", url, "regressions", run, "--round", "1")).stdout
    assert "1 of 3 task(s) regressed, 1 worsened" in text
    assert text.index(f"{lost} (v0): lost: 1/2 -> 0/2") < text.index(f"{worse} (v0): worsened: 2/2 -> 1/2")
    assert same not in text
    line = error_line(hx("--nats-url", url, "bisect", run, worse, "--from", "0", "--to", "1"))
    assert "no edit was shipped" in line and "nothing to bisect" in line

    async def runs() -> list[str]:
        async with connect(NatsSettings(url=url)) as conn:
            return [r.subject async for r in conn.log.read(TRACE.name, subjects=[f"hx.trace.{run}*.>"])]

    assert asyncio.run(runs()) == []  # no scratch run was started


def test_bisect_names_the_first_pass_count_change_when_nothing_flips() -> None:
    edits = [Edit(0, "ship", "v0", (f"C-{i}",), ()) for i in range(3)]
    b = Bisection("r", "t", (0, 1), "s", edits, [Trial(0, "d0", 0, 2, 2), Trial(1, "d1", 1, 2, 2),
                                                 Trial(2, "d2", 2, 2, 1), Trial(3, "d3", 3, 2, 1)])
    assert b.flip is None and b.shift is edits[1]
    flipped = Bisection("r", "t", (0, 1), "s", edits, [Trial(0, "d0", 0, 2, 2), Trial(1, "d1", 1, 2, 0)])
    assert flipped.flip is edits[0] and flipped.shift is None


def test_bisect_reruns_a_coevolution_run_with_round_a_s_policy() -> None:
    def attempts(model: str, *versions: str) -> list[AttemptEvidence]:
        return [AttemptEvidence(0, i, model=model, versions={v}) for i, v in enumerate(versions)]

    spec, note = rerun_model("policy:scorer", attempts("policy:abc", "abc", "abc"), attempts("policy:def", "def"))
    assert spec == "policy:abc" and "co-evolution" in note and "abc" in note and "def" in note
    assert rerun_model("policy:scorer", attempts("policy:abc", "abc"), attempts("policy:abc", "abc"))[0] == (
        "policy:scorer")
    # another provider's version moving is not a checkpoint to load
    assert rerun_model("openai:gpt", attempts("openai:gpt", "v1"), attempts("openai:gpt", "v2"))[0] == "openai:gpt"


def test_bisect_prints_the_model_it_reran_with(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    text = ok(hx("--nats-url", url, "bisect", kit.RUN, kit.REGRESSED, "--from", "0", "--to", "1",
                 "--scratch-run", "tt-bisect-model")).stdout
    assert "model random: (the run's model spec)" in text and "first edit that flips it: C-R0-02" in text


def test_an_undecodable_message_is_an_error_not_a_skip(world: tuple[str, kit.BuiltRun]) -> None:
    url, _ = world
    run = "tt-newer"
    asyncio.run(kit.build_run(url, run))
    subject = trace_subject(run, 1, kit.REGRESSED, 0)

    async def publish() -> None:
        async with connect(NatsSettings(url=url)) as conn:  # as a writer of a newer hx would
            await conn.js.publish(subject, b"\x80", headers={"Hx-Type": "tool.returned", "Hx-Schema-Version": "9"})

    asyncio.run(publish())
    # hx regressions, state and bisect read only the attempts' outcomes (their own channels): they never meet
    # the bad body, as no read decodes a body of a type it does not read; hx diff reads the attempts whole.
    assert "regressed" in ok(hx("--nats-url", url, "regressions", run, "--round", "1")).output
    assert "task history" in ok(hx("--nats-url", url, "state", run, "--as-of", "r1")).output
    assert "first edit that flips it" in ok(hx("--nats-url", url, "bisect", run, kit.REGRESSED, "--from", "0",
                                               "--to", "1")).output
    for args in (("diff", run, kit.REGRESSED, "--rounds", "0", "1"),):
        line = error_line(hx("--nats-url", url, *args))
        assert "this hx cannot decode HX_TRACE message " in line and f" on {subject} (" in line, args
        assert "schema version '9'" in line, args
