"""Forged ledger events, appended as a process with the writer's stream access would: caught, and acted on by none.

A forger who holds the data dir's NATS credentials but not its signing key is caught by the
signature alone; one who holds the key too (out of the threat model) is still caught wherever
the forgery does not add up: a verdict that does not follow from its own checks, or from the
trace rounds it cites, a ship no passing verdict allows, anything after the run's end. Every
command that acts on a run (``evolve --resume``, ``approve``, ``export``, ``report``) refuses such
a ledger with one line naming the event, and writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import toyworld  # noqa: F401 - registers the toyworld benchmark the runs evolve on
from audit_kit import evolved_run
from hx_cli import error_line, hx, ok
from ledger_forger import append, ledger_of

from projections.ledger import RunLedger
from schemas.event import event_type
from schemas.ledger import GateCheck, GateJudged, HarnessShipped, LedgerEvent, ledger_digest
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import EmbeddedServer
from streams.signing import KEY_FILE, LedgerKey
from streams.topology import SPECS

WORKER = Path(__file__).with_name("evolve_worker.py")
EXIT_NOT_VERIFIED = 3
ALL_PASSED = tuple(GateCheck(name=n, passed=True, detail="forged") for n in (
    "manifest", "config", "smoke", "leakage", "counterfactual", "seesaw", "effect"))


def last_seqs(url: str) -> dict[str, int]:
    """Every stream's last sequence: what a command that writes nothing leaves as it was."""
    async def read() -> dict[str, int]:
        async with connect(NatsSettings(url=url), apply=False) as conn:
            return {name: await conn.log.last_seq(name) for name in SPECS}
    return asyncio.run(read())


@pytest.fixture
def paused(nats_url: str, tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """A signed run whose evolver died as round 0 reached its gate: critic judged, nothing gated yet."""
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(WORKER), nats_url, "evo-paused", "--pause-at", "0:gate",
                             "--data-dir", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert json.loads(line) == {"paused": [0, "gate"]}, err
    yield nats_url, data, "evo-paused"


def cli(url: str, data: Path, *args: str) -> Any:
    """``hx`` on the test's server and data dir."""
    return hx("--nats-url", url, "--data-dir", str(data), *args)


def refused_by_every_command(url: str, data: Path, run_id: str, at: int, tmp_path: Path) -> None:
    """Resume, approve, export and report each refuse with one line naming event ``at``; nothing is written."""
    before = last_seqs(url)
    ledger = asyncio.run(ledger_of(url, run_id))
    candidate = next(iter(ledger.candidates))
    for command in (("evolve", "--resume", run_id), ("approve", run_id, candidate),
                    ("export", run_id, str(tmp_path / "export")),
                    ("report", run_id, "--out", str(tmp_path / "report"))):
        line = error_line(cli(url, data, *command))
        assert f"the ledger of run '{run_id}' does not verify: event {at} (" in line, (command, line)
    assert last_seqs(url) == before
    assert not (tmp_path / "export").exists() and not (tmp_path / "report").exists()


def audit(url: str, data: Path, run_id: str) -> str:
    """``hx audit verify``: exit 3, the report on one line."""
    result = cli(url, data, "audit", "verify", run_id)
    assert result.exit_code == EXIT_NOT_VERIFIED, result.output
    return " ".join(result.stdout.split())


def ranked_first(url: str, run_id: str) -> tuple[RunLedger, str]:
    """The paused run's ledger and the candidate its critic ranked first (not gated yet)."""
    ledger = asyncio.run(ledger_of(url, run_id))
    critic = ledger.rounds[0].critic
    assert critic is not None and critic.ranking
    return ledger, critic.ranking[0]


@pytest.mark.slow
@pytest.mark.parametrize("with_key", [False, True], ids=["forger", "forger-with-key"])
def test_a_forged_passing_verdict_is_caught_and_the_resumed_run_does_not_ship_it(
        paused: tuple[str, Path, str], tmp_path: Path, with_key: bool) -> None:
    url, data, run_id = paused
    ledger, cid = ranked_first(url, run_id)
    digested = ledger.rounds[0].digested
    assert digested is not None
    main = digested.trace_rounds[0]
    forged = GateJudged(run_id=run_id, round=0, candidate=cid, variant=ledger.candidates[cid].proposal.variant,
                        passed=True, outcome="ship", checks=ALL_PASSED, trace_rounds=(main,))
    at = asyncio.run(append(url, run_id, forged, key=LedgerKey.of(data) if with_key else None))
    report = audit(url, data, run_id)
    if with_key:
        assert "(signature" not in report and "signature)" not in report
        assert (f"event {at} (ledger.gate_judged): cites trace round {main} as a gate round of round 0 for {cid}"
                in report)
    else:
        assert f"event {at} (ledger.gate_judged): it is not signed, though the run's ledger is" in report
    refused_by_every_command(url, data, run_id, at, tmp_path)


@pytest.mark.slow
def test_a_verdict_that_contradicts_its_own_checks_is_caught(paused: tuple[str, Path, str], tmp_path: Path) -> None:
    url, data, run_id = paused
    ledger, cid = ranked_first(url, run_id)
    checks = (*ALL_PASSED[:-1], GateCheck(name="effect", passed=False, detail="0 of 1 predicted flip(s) realised"))
    forged = GateJudged(run_id=run_id, round=0, candidate=cid, variant=ledger.candidates[cid].proposal.variant,
                        passed=True, outcome="ship", checks=checks, first_failure="effect")
    at = asyncio.run(append(url, run_id, forged, key=LedgerKey.of(data)))  # even signed with the writer's key
    report = audit(url, data, run_id)
    assert (f"event {at} (ledger.gate_judged): the verdict on {cid} does not follow from its own checks: its "
            "outcome is 'ship', but it failed 'effect'") in report
    refused_by_every_command(url, data, run_id, at, tmp_path)


@pytest.mark.slow
def test_a_ship_no_verdict_allows_is_caught(paused: tuple[str, Path, str], tmp_path: Path) -> None:
    url, data, run_id = paused
    ledger, cid = ranked_first(url, run_id)
    cand = ledger.candidates[cid].proposal
    current = ledger.variants[cand.variant].current
    forged = HarnessShipped(run_id=run_id, round=0, variant=cand.variant, candidates=(cid,),
                            digest_before=current.digest, digest_after=cand.digest, operations=cand.operations,
                            harness=current.harness)
    at = asyncio.run(append(url, run_id, forged, key=LedgerKey.of(data)))
    report = audit(url, data, run_id)
    assert f"event {at} (ledger.harness_shipped): ships candidate {cid}, which no earlier gate_judged judged" in report
    assert f"event {at} (ledger.harness_shipped): its recorded harness hashes to" in report
    refused_by_every_command(url, data, run_id, at, tmp_path)


@pytest.mark.slow
def test_an_event_after_the_runs_end_is_caught(tmp_path: Path) -> None:
    with evolved_run(tmp_path / "run", "evo-ended") as run:
        ledger = asyncio.run(ledger_of(run.url, run.run_id))
        ship = ledger.shipments[-1].event
        at = asyncio.run(append(run.url, run.run_id, ship, key=LedgerKey.of(run.data_dir)))
        report = audit(run.url, run.data_dir, run.run_id)
        assert (f"event {at} (ledger.harness_shipped): follows ledger.evolution_finished (event {at - 1}): nothing is "
                "recorded after a run's end") in report
        refused_by_every_command(run.url, run.data_dir, run.run_id, at, tmp_path)


@pytest.mark.slow
def test_signatures_heads_and_keys(tmp_path: Path) -> None:
    with evolved_run(tmp_path / "run", "evo-signed") as run:
        key_file = run.data_dir / KEY_FILE
        assert key_file.stat().st_mode & 0o777 == 0o600 and key_file.parent.stat().st_mode & 0o777 == 0o700
        ledger = asyncio.run(ledger_of(run.url, run.run_id))
        key = LedgerKey.of(run.data_dir)
        assert ledger.opened is not None and ledger.opened.public_key == key.public_key
        verified = ok(run.hx("audit", "verify", run.run_id)).stdout
        events = len(ledger.entries)
        assert f"signed: {events} of {events} events by key" in verified

        head = ok(run.hx("audit", "head", run.run_id)).stdout.strip()
        kept = json.loads(head)
        assert kept["position"] == events and kept["digest"] == ledger.head and kept["key"] == key.public_key
        assert "reaches the kept head" in ok(run.hx("audit", "verify", run.run_id, "--head", head)).stdout
        (tmp_path / "head.json").write_text(head + "\n")
        copy = [json.loads(line) for line in (run.export / "audit.jsonl").read_text().splitlines()]

        cut = tmp_path / "cut.jsonl"
        cut.write_text("".join(json.dumps(line) + "\n" for line in copy[:-3]))
        out = " ".join(cli(run.url, run.data_dir, "audit", "verify", "--file", str(cut), "--head",
                           str(tmp_path / "head.json")).stdout.split())
        assert f"the ledger ends at event {events - 3}, before the kept head (event {events}" in out

        # Rewritten from the first event on, re-chained and re-signed with the very key: it holds, yet not the head.
        rewritten = tmp_path / "rewritten.jsonl"
        rewritten.write_text("".join(json.dumps(line) + "\n" for line in _resigned(copy, key, reason="rewritten")))
        result = cli(run.url, run.data_dir, "audit", "verify", "--file", str(rewritten), "--head", head)
        assert result.exit_code == EXIT_NOT_VERIFIED
        assert f"event {events} (ledger.evolution_finished) hashes to" in result.stdout
        assert "the ledger was rewritten up to there" in result.stdout

        other = tmp_path / "other-data"  # another data dir holds another key: it may not append to this run
        line = error_line(hx("--nats-url", run.url, "--data-dir", str(other), "evolve", "--resume", run.run_id))
        assert f"is signed with key {kept['fingerprint']}; this data directory's key is" in line
        foreign = msgspec.json.encode({**kept, "key": LedgerKey.of(other).public_key}).decode()
        assert "another writer's ledger" in cli(run.url, run.data_dir, "audit", "verify", run.run_id, "--head",
                                                foreign).stdout


def _resigned(lines: list[dict[str, Any]], key: LedgerKey, *, reason: str) -> list[dict[str, Any]]:
    """``audit.jsonl`` lines with the last event's reason changed, chained and signed anew with ``key``."""
    out = []
    prev = ""
    for i, line in enumerate(lines):
        body = dict(line["event"], prev=prev, signature="")
        if i == len(lines) - 1:
            body["reason"] = reason
        event = msgspec.convert(body, event_type(line["type"]))
        assert isinstance(event, LedgerEvent)
        event = msgspec.structs.replace(event, signature=key.sign(ledger_digest(event)))
        prev = ledger_digest(event)
        out.append(dict(line, event=msgspec.to_builtins(event), prev=event.prev, digest=prev))
    return out


@pytest.mark.slow
def test_the_writers_own_credentials_can_append_but_not_past_the_audit(tmp_path: Path) -> None:
    """On the embedded server, as a process holding the data dir's writer credentials (not its signing key): an
    append goes through, and every command that acts on the run refuses it, naming it."""
    data = tmp_path / "data"
    base = ("--data-dir", str(data))
    ok(hx(*base, "evolve", "--bench", "toyworld:rooms", "--tasks", "4", "--heldout-tasks", "2", "--rounds", "1",
          "--max-steps", "20", "--seed", "3", "--run-id", "evo-embedded"))
    server = EmbeddedServer(data)
    url = server.acquire()  # the writer's URL, credentials included, as any process reading credentials.json gets
    try:
        ledger = asyncio.run(ledger_of(url, "evo-embedded"))
        cand = next(iter(ledger.candidates.values())).proposal
        forged = GateJudged(run_id="evo-embedded", round=0, candidate=cand.candidate, variant=cand.variant,
                            passed=True, outcome="ship", checks=ALL_PASSED)
        at = asyncio.run(append(url, "evo-embedded", forged))
        assert asyncio.run(ledger_of(url, "evo-embedded")).last_position == at  # the server took it
    finally:
        server.release()
    result = hx(*base, "audit", "verify", "evo-embedded")
    assert result.exit_code == EXIT_NOT_VERIFIED
    report = " ".join(result.stdout.split())
    assert f"event {at} (ledger.gate_judged): it is not signed, though the run's ledger is" in report
    assert f"event {at} (ledger.gate_judged): follows ledger.evolution_finished" in report
    for command in (("evolve", "--resume", "evo-embedded"), ("export", "evo-embedded", str(tmp_path / "x"))):
        line = error_line(hx(*base, *command))
        assert f"the ledger of run 'evo-embedded' does not verify: event {at} (" in line
