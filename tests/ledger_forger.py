"""A forger with the writer's stream access: appends to a run's ledger as a raw NATS client would, hx bypassed.

``append`` publishes a ledger event on the subject of the run's next position (or any position),
chained to the head (or to any ``prev``), with the envelope headers hx's own ledger writes carry,
so it reads back as a ledger event; signed only when the forger also holds the key. It is what a
process holding the data dir's credentials but not its signing key can do, and, with the key,
what is out of scope but still caught where it does not add up with the trace.
"""

from __future__ import annotations

import time

import msgspec
import nats

from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from schemas.envelope import HX_SCHEMA_VERSION, HX_TIME, HX_TYPE, encode_body
from schemas.event import Event
from schemas.ledger import LedgerEvent, ledger_digest
from streams.config import NatsSettings
from streams.connection import connect
from streams.edit_ledger import ledger_filter
from streams.eventsourcing.layout import HEADER_TOPIC, topic_header
from streams.signing import LedgerKey


async def ledger_of(url: str, run_id: str) -> RunLedger:
    """The run's ledger as it is on the log (folded, faults and all)."""
    async with connect(NatsSettings(url=url)) as conn:
        ledger = await read_run_ledger(conn.log, run_id)
    assert ledger is not None, run_id
    return ledger


async def append(url: str, run_id: str, event: Event, *, key: LedgerKey | None = None, position: int | None = None,
                 prev: str | None = None) -> int:
    """Publish ``event`` on the run's ledger subject at ``position`` (default: the next), chained to the head (or
    ``prev``) and signed with ``key`` if given; return the position."""
    ledger = await ledger_of(url, run_id)
    at = position if position is not None else ledger.last_position + 1
    if isinstance(event, LedgerEvent):
        event = msgspec.structs.replace(event, prev=ledger.head if prev is None else prev, signature="")
        if key is not None:
            event = msgspec.structs.replace(event, signature=key.sign(ledger_digest(event)))
    cls = type(event)
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(f"{ledger_filter(run_id)[:-1]}{at}", encode_body(event), headers={
            HEADER_TOPIC: topic_header(cls.TYPE), HX_TYPE: cls.TYPE, HX_SCHEMA_VERSION: str(cls.VERSION),
            HX_TIME: str(time.time_ns())})
    finally:
        await nc.close()
    return at
