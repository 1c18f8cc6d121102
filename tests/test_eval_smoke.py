"""The memory smoke on a real log: a healthy one passes and is left as it was; a broken ledger chain, a forged
signature, a stored projection that disagrees with its rebuild and a changed stream each fail their check."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from audit_kit import EvolvedRun, evolved_run
from ledger_forger import append, ledger_of
from ledger_run import LedgerRun
from ledger_run import task as ledger_task

from hx.eval.criteria import build, judge
from hx.eval.smoke import SmokeResult, memory_smoke
from projections.runner import ProjectionRunner
from projections.task_history import TaskHistory
from schemas.envelope import HX_SCHEMA_VERSION, HX_TIME, HX_TYPE, encode_body
from schemas.ledger import LedgerEvent, LedgerOpened, RoundDigested, ledger_digest
from streams.config import NatsSettings
from streams.connection import connect
from streams.edit_ledger import ledger_filter
from streams.eventsourcing.layout import HEADER_TOPIC, topic_header
from streams.server import NatsProcess
from streams.signing import LedgerKey
from streams.topology import TRACE

RUN = "smoke-evolved"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding a real two-round evolution and a stored ``task_history`` checkpoint (server stopped)."""
    root = tmp_path_factory.mktemp("smoke")
    with evolved_run(root, RUN) as run:
        _run_projection(run)
    return root / "nats"


def _run_projection(run: EvolvedRun) -> None:
    result = run.hx("projections", "run", "task_history", "--once")
    assert result.exit_code == 0, result.output


@pytest.fixture
def server(template: Path, tmp_path: Path) -> Iterator[NatsProcess]:
    """A server on this test's own copy of the template store."""
    store = tmp_path / "nats"
    shutil.copytree(template, store)
    proc = NatsProcess(store)
    proc.start(detach=False)
    try:
        yield proc
    finally:
        proc.stop()


async def smoke(url: str, *, apply: bool = True) -> SmokeResult:
    async with connect(NatsSettings(url=url), apply=apply) as conn:
        return await memory_smoke(conn)


def check(result: SmokeResult, name: str) -> tuple[bool, str]:
    [found] = [c for c in result.checks if c.name == name]
    return found.passed, found.detail


async def streams_state(url: str) -> dict[str, tuple[int, int]]:
    nc = await nats.connect(url)
    try:
        infos = await nc.jetstream().streams_info()
        return {i.config.name or "": (i.state.messages, i.state.last_seq) for i in infos}
    finally:
        await nc.close()


async def test_a_healthy_log_passes_and_is_left_as_it_was(server: NatsProcess) -> None:
    before = await streams_state(server.url)
    result = await smoke(server.url)
    assert result.passed, result.detail
    assert [c.name for c in result.checks] == ["topology", "ledgers", "projection task_history"]
    assert check(result, "ledgers")[1].startswith("1 ledger(s), ") and "1 signed ledger(s) verified" in result.detail
    assert "equals the stored checkpoint" in check(result, "projection task_history")[1]
    assert await streams_state(server.url) == before  # read only: not a message, checkpoint or head written
    out = result.output("eval-x", 0, "memory", 0)
    assert (out.finished, out.passed, out.steps, out.score) == (True, True, 3, 1.0)
    assert judge(build("task_verdict", {}, where="test"), out)[0]


async def test_an_empty_log_passes_with_nothing_to_compare(nats_url: str) -> None:
    result = await smoke(nats_url)
    assert result.passed, result.detail
    assert check(result, "ledgers")[1].startswith("0 ledger(s)")
    assert check(result, "projection task_history")[1].startswith("no stored checkpoint; rebuilt to 0")


async def write_ledger(url: str, run_id: str, events: list[LedgerEvent], prevs: dict[int, str] | None = None,
                       key: LedgerKey | None = None, unsigned: tuple[int, ...] = ()) -> None:
    """Publish ``events`` as the run's ledger, positions 1, 2, ..., chained (but where ``prevs`` says otherwise),
    opened with ``key`` and signed by it (but at the ``unsigned`` positions), as a raw client would."""
    head = ""
    nc = await nats.connect(url)
    try:
        for position, event in enumerate(events, start=1):
            event = msgspec.structs.replace(event, run_id=run_id)
            if key is not None and isinstance(event, LedgerOpened):
                event = msgspec.structs.replace(event, public_key=key.public_key)
            chained = msgspec.structs.replace(event, prev=(prevs or {}).get(position, head))
            head = ledger_digest(chained)
            if key is not None and position not in unsigned:
                chained = msgspec.structs.replace(chained, signature=key.sign(head))
            await nc.jetstream().publish(f"{ledger_filter(run_id)[:-1]}{position}", encode_body(chained), headers={
                HEADER_TOPIC: topic_header(chained.TYPE), HX_TYPE: chained.TYPE,
                HX_SCHEMA_VERSION: str(chained.VERSION), HX_TIME: str(time.time_ns())})
    finally:
        await nc.close()


async def test_a_broken_chain_fails_the_ledgers_check(nats_url: str) -> None:
    run = LedgerRun(run_id="chained")
    run.digested(0, [ledger_task("twx:coin:dev:0")])
    run.digested(1, [ledger_task("twx:coin:dev:1")])
    assert (await smoke(nats_url)).passed  # an hx connection makes the streams
    await write_ledger(nats_url, "chained", run.records)
    assert (await smoke(nats_url)).passed
    # the last digest chained to a digest no event has
    await write_ledger(nats_url, "broken", run.records, {3: "sha256:" + "0" * 64})
    result = await smoke(nats_url)
    passed, detail = check(result, "ledgers")
    assert not passed and not result.passed
    assert detail.startswith("run 'broken': event 3 (ledger.round_digested): prev sha256:0000") and \
        "is not the digest of event 2" in detail, detail
    assert result.output("eval-x", 0, "memory", 0).reason == "failed: ledgers"
    assert check(result, "topology")[0] and check(result, "projection task_history")[0]


async def test_an_event_after_the_end_fails_the_ledgers_check(server: NatsProcess) -> None:
    ledger = await ledger_of(server.url, RUN)
    await append(server.url, RUN, RoundDigested(run_id=RUN, round=9, actionability=0.5))
    passed, detail = check(await smoke(server.url), "ledgers")
    assert not passed
    assert detail.startswith(f"run {RUN!r}: event {ledger.last_position + 1} (ledger.round_digested): follows "
                             "ledger.evolution_finished"), detail


async def test_an_unsigned_event_in_a_signed_ledger_fails(nats_url: str) -> None:
    run = LedgerRun()
    run.digested(0, [ledger_task("twx:coin:dev:0")])
    run.digested(1, [ledger_task("twx:coin:dev:1")])
    key = LedgerKey.generate()
    assert (await smoke(nats_url)).passed  # an hx connection makes the streams
    await write_ledger(nats_url, "signed", run.records, key=key)
    result = await smoke(nats_url)
    assert result.passed and "1 signed ledger(s) verified" in result.detail, result.detail
    # chained as it should be, but written by someone without the run's key
    await write_ledger(nats_url, "forged", run.records, key=key, unsigned=(2,))
    passed, detail = check(await smoke(nats_url), "ledgers")
    assert not passed
    assert detail == "run 'forged': event 2 (ledger.round_digested): it is not signed, though the run's ledger is"


async def test_a_stored_checkpoint_that_disagrees_with_the_rebuild_fails(server: NatsProcess) -> None:
    async with connect(NatsSettings(url=server.url)) as conn:
        runner = ProjectionRunner(conn.log, TaskHistory())
        await runner.load()
        state: dict[str, Any] = runner.state
        state.pop(sorted(state)[0])  # a checkpoint that lost a task's history
        await runner.checkpoint()
    passed, detail = check(await smoke(server.url), "projection task_history")
    assert not passed and "rebuilt from scratch to" in detail and "stored checkpoint" in detail, detail


async def test_a_stream_changed_under_the_log_fails_the_topology_check(server: NatsProcess) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        config = (await js.stream_info(TRACE.name)).config
        await js.update_stream(replace(config, max_msgs=10_000_000))  # a limit that could drop events
    finally:
        await nc.close()
    result = await smoke(server.url, apply=False)  # a writer's connection would refuse it before the smoke
    passed, detail = check(result, "topology")
    assert not passed and TRACE.name in detail, detail
