"""Logs and ledgers written before issue 34 (hx at d5fa154) still decode, re-encode and verify.

The fixture (``tests/data/pre34``, made by ``tests/data/pre34/export.py`` from a data directory the
old code wrote) holds every stored message of ``HX_LEDGER`` and ``HX_LEARN`` for three runs (an
evolution with no ship, one that shipped a harness, a co-evolution with policy versions), the
messages of ``HX_TRACE`` that cover every event type it held, and the old ``hx log dump`` of the
ledger. A typed field that encodes differently from the value it replaced changes a ledger digest:
these tests then fail.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hx_cli import hx, ok

from hx.cli.audit import EXIT_NOT_VERIFIED
from schemas.envelope import (
    FRAME_TYPE,
    HX_ENCODING,
    HX_TYPE,
    Record,
    _frame_decoder,
    decode_message,
    encode_body,
    inflate,
)
from schemas.ledger import HarnessShipped, LedgerEvent, LedgerOpened, ModelChanged, ledger_digest
from streams.config import NatsSettings
from streams.connection import connect
from streams.signing import verify

DATA = Path(__file__).parent / "data" / "pre34"
RUNS = ("pre34-evolve", "pre34-ship", "pre34-coevolve")


def _rows(stream: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / f"{stream}.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def _stored_bodies(row: dict[str, Any]) -> list[bytes]:
    """The event bodies a stored message holds, exactly as written (inflated, unframed)."""
    headers, body = row["headers"], base64.b64decode(row["data"])
    if HX_ENCODING in headers:
        body = inflate(headers[HX_ENCODING], body)
    if headers[HX_TYPE] == FRAME_TYPE:
        return [bytes(item.body) for item in _frame_decoder.decode(body)]
    return [body]


def _records(stream: str) -> list[tuple[Record, bytes]]:
    out: list[tuple[Record, bytes]] = []
    for row in _rows(stream):
        records = decode_message(row["subject"], row["seq"], row["headers"], base64.b64decode(row["data"]))
        bodies = _stored_bodies(row)
        assert len(records) == len(bodies)
        out += zip(records, bodies, strict=True)
    return out


def _ledgers() -> dict[str, list[LedgerEvent]]:
    runs: dict[str, list[LedgerEvent]] = defaultdict(list)
    for record, _ in _records("HX_LEDGER"):
        assert isinstance(record.event, LedgerEvent)
        runs[record.event.run_id].append(record.event)
    return runs


@pytest.mark.parametrize("stream", ["HX_LEDGER", "HX_LEARN", "HX_TRACE"])
def test_every_old_event_decodes_and_encodes_to_the_bytes_stored(stream: str) -> None:
    records = _records(stream)
    assert records
    for record, stored in records:
        assert _as_stored(record) == stored, (stream, record.seq, record.index, record.type)


def _as_stored(record: Record) -> bytes:
    """The event encoded again, less the fields added since its stored version (the ledger's ``at_ns``, empty)."""
    body = encode_body(record.event)
    if isinstance(record.event, LedgerEvent) and record.version < 3:
        fields = msgspec.msgpack.decode(body)
        assert fields.pop("at_ns") == 0
        return msgspec.msgpack.encode(fields)
    return body


def test_the_fixture_holds_what_it_is_for() -> None:
    types = {r.type for r, _ in _records("HX_LEDGER")}
    assert {LedgerOpened.TYPE, HarnessShipped.TYPE, ModelChanged.TYPE} <= types
    assert sorted(_ledgers()) == sorted(RUNS)
    assert {r.type for r, _ in _records("HX_LEARN")} >= {"learn.policy_initialised", "learn.policy_updated"}


def test_every_old_ledger_event_redigests_to_its_successors_prev_and_its_signature_verifies() -> None:
    for run_id, events in _ledgers().items():
        opened = events[0]
        assert isinstance(opened, LedgerOpened) and opened.public_key, run_id
        assert opened.prev == ""
        for event, successor in pairwise(events):
            assert successor.prev == ledger_digest(event), (run_id, type(event).TYPE)
        for event in events:
            assert verify(opened.public_key, ledger_digest(event), event.signature) == "", (run_id, type(event).TYPE)


@pytest.mark.parametrize("run_id", RUNS)
def test_hx_audit_verify_accepts_the_old_codes_ledger_dump(run_id: str, tmp_path: Path) -> None:
    dump = tmp_path / "ledger.jsonl"
    dump.write_bytes(gzip.decompress((DATA / "HX_LEDGER.dump.jsonl.gz").read_bytes()))
    result = ok(hx("--data-dir", str(tmp_path / "hx"), "audit", "verify", run_id, "--file", str(dump)))
    assert result.stdout.startswith("verified: "), result.stdout


async def _republish(url: str, stream: str) -> None:
    """The stream's fixture messages stored again, in order, headers and bytes as they were (batches as batches)."""
    async with connect(NatsSettings(url=url)) as conn:  # the writer: hx's topology is applied first
        for row in _rows(stream):
            body, headers = base64.b64decode(row["data"]), row["headers"]
            if "Nats-Batch-Id" in headers and "Nats-Batch-Commit" not in headers:
                await conn.nc.publish(row["subject"], body, headers=headers)  # a batch's member gets no ack
                continue
            ack = await conn.js.publish(row["subject"], body, headers=headers)
            assert ack.seq == row["seq"], (stream, ack.seq, row["seq"])


@pytest.mark.parametrize("run_id", RUNS)
def test_hx_audit_verify_on_a_log_holding_the_old_messages_finds_chain_and_signatures_intact(
        run_id: str, nats_url: str, tmp_path: Path) -> None:
    asyncio.run(_republish(nats_url, "HX_LEDGER"))
    asyncio.run(_republish(nats_url, "HX_LEARN"))
    result = hx("--nats-url", nats_url, "--data-dir", str(tmp_path / "hx"), "audit", "verify", run_id)
    # The fixture keeps a sample of the trace (the whole is megabytes), so the trace rounds and evidence anchors the
    # ledger cites are missing: those are the only problems, and every event still chains and verifies.
    assert result.exit_code == EXIT_NOT_VERIFIED, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("not verified: ") and lines[0].endswith(" (input) in " + lines[0].split(" in ")[-1])
    events = len(_ledgers()[run_id])
    assert f"signed: {events} of {events} events" in result.stdout
    problems = [line for line in lines[3:] if line.startswith("  event ")]
    assert problems and all("HX_TRACE" in line for line in problems), problems
