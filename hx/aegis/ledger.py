"""The edit ledger of one run as an ``eventsourcing`` aggregate on ``HX_LEDGER``.

``EvolutionLedger`` is the run's aggregate: its events are the run's ledger events
(``schemas.ledger``), each chained to the one before by ``prev``. It is stored through
hx's persistence module (``streams.eventsourcing``, ``HX_ES_LEDGER=yes``) with
``LedgerMapper``, which stores each event as the hx event it carries (type name as topic,
msgpack body), so the ledger is at once an aggregate the library loads and saves with its
optimistic concurrency, and ordinary hx events that ``EventLog`` readers and projections
fold. Two evolvers on one run load the same version; the first to save wins and the
second gets ``LedgerConflict`` with nothing written.

Every event is signed (``streams.signing``) with the data directory's key, whose public half
``ledger.opened`` records: a ledger is appended to only with the key it was opened with.

``Ledger`` is the asynchronous face the loop uses: the library is synchronous, so its
calls run in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import msgspec
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError, Mapper, PersistenceError, StoredEvent
from eventsourcing.utils import get_topic

from hx.aegis.errors import LedgerConflict, LedgerError
from schemas.envelope import decode_body, encode_body
from schemas.errors import HxError
from schemas.event import event_type
from schemas.ledger import LedgerEvent, LedgerOpened, chained, ledger_digest
from streams.connection import Connection
from streams.edit_ledger import APP_NAME, ledger_id
from streams.redaction import scrub_event
from streams.signing import LedgerKey, fingerprint
from streams.topology import LEDGER

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


E = TypeVar("E", bound=LedgerEvent)


def timed(event: E) -> E:
    """``event`` with the time it is recorded (``at_ns``, now) unless it has one: signed with the rest of its body."""
    return event if event.at_ns else msgspec.structs.replace(event, at_ns=time.time_ns())


def signed(event: LedgerEvent, key: LedgerKey | None) -> LedgerEvent:
    """``event`` signed with ``key`` (as it is, with no key: an unsigned ledger stays unsigned)."""
    return msgspec.structs.replace(event, signature=key.sign(ledger_digest(event))) if key is not None else event


class EvolutionLedger(Aggregate):
    """A run's ledger: the chained sequence of its ledger events (the run's consistency boundary)."""

    class Recorded(Aggregate.Event):
        """One ledger event appended (the hx event itself is ``record``)."""

        record: LedgerEvent

        def apply(self, aggregate: Aggregate) -> None:
            """Add the record to the ledger."""
            cast(EvolutionLedger, aggregate).fold(self.record)

    @classmethod
    def create_id(cls, opened: LedgerOpened) -> uuid.UUID:
        """One ledger per run."""
        return ledger_id(opened.run_id)

    def __init__(self, opened: LedgerOpened) -> None:
        self.records: list[LedgerEvent] = []
        self.head = ""
        self.fold(opened)

    def fold(self, record: LedgerEvent) -> None:
        """Append a record that arrived chained (a load, or ``record``); refuse a broken chain."""
        if record.prev != self.head:
            raise LedgerError(f"ledger of run {record.run_id!r}: {type(record).TYPE} at position "
                              f"{len(self.records) + 1} chains to {record.prev[:19]!r}, not to the head "
                              f"{self.head[:19]!r}")
        self.records.append(record)
        self.head = ledger_digest(record)

    def record(self, event: LedgerEvent, key: LedgerKey | None = None) -> LedgerEvent:
        """Append ``event`` chained to the head (and signed with ``key``); return it as recorded."""
        link = signed(chained(timed(event), self.head), key)
        self.trigger_event(self.Recorded, record=link)
        return link

    @property
    def opened(self) -> LedgerOpened:
        """The run's first ledger event."""
        first = self.records[0]
        assert isinstance(first, LedgerOpened)
        return first


class LedgerMapper(Mapper[uuid.UUID]):
    """Stores a ledger aggregate's events as the hx events they carry (topic: hx type; state: msgpack)."""

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """The hx event inside ``domain_event`` as a stored event."""
        record = domain_event.__dict__.get("opened") or domain_event.record  # the Created event carries ``opened``
        return StoredEvent(originator_id=domain_event.originator_id,
                           originator_version=domain_event.originator_version,
                           topic=type(record).TYPE, state=encode_body(record))

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """The aggregate event carrying the stored hx event."""
        try:
            cls = event_type(stored_event.topic)
            record = decode_body(stored_event.topic, cls.VERSION, stored_event.state)
        except HxError as exc:
            raise LedgerError(f"ledger event {stored_event.originator_id} v{stored_event.originator_version}: "
                              f"{exc}") from None
        state: dict[str, Any] = {"originator_id": stored_event.originator_id,
                                 "originator_version": stored_event.originator_version, "timestamp": _EPOCH}
        if stored_event.originator_version == Aggregate.INITIAL_VERSION:
            state |= {"originator_topic": get_topic(EvolutionLedger), "opened": record}
            event_cls: type[Any] = EvolutionLedger.Created
        else:
            state["record"] = record
            event_cls = EvolutionLedger.Recorded
        domain_event = object.__new__(event_cls)
        object.__setattr__(domain_event, "__dict__", state)
        return domain_event


class LedgerApplication(Application[uuid.UUID]):
    """The ``eventsourcing`` application holding every run's ledger on ``HX_LEDGER``."""

    name = APP_NAME

    def construct_mapper(self) -> Mapper[uuid.UUID]:
        """``LedgerMapper``: the ledger's events are hx events."""
        return LedgerMapper(self.construct_transcoder())


class Ledger:
    """One run's ledger, for the asynchronous loop: start or load, append (chained, signed, conflict-checked), read.

    ``key`` signs what this process appends (None: nothing is signed, for readers and tests of
    unsigned ledgers). A ledger opened with another key refuses to load for appending.
    """

    def __init__(self, conn: Connection, run_id: str, key: LedgerKey | None = None) -> None:
        self.conn = conn
        self.run_id = run_id
        self.key = key
        env = {"PERSISTENCE_MODULE": "streams.eventsourcing", "HX_ES_LEDGER": "yes", "HX_NATS_URL": conn.url}
        self._app = LedgerApplication(env=env)
        self._aggregate: EvolutionLedger | None = None

    async def close(self) -> None:
        """Close the application's connection."""
        await asyncio.to_thread(self._app.close)

    @property
    def aggregate(self) -> EvolutionLedger:
        """The loaded aggregate (``start`` or ``load`` first)."""
        if self._aggregate is None:
            raise LedgerError(f"the ledger of run {self.run_id!r} is not loaded")
        return self._aggregate

    @property
    def records(self) -> list[LedgerEvent]:
        """Every ledger event of the run so far, in order."""
        return self.aggregate.records

    async def load(self) -> EvolutionLedger | None:
        """Load the run's ledger (None when the run has none yet)."""
        def get() -> EvolutionLedger | None:
            try:
                return cast(EvolutionLedger, self._app.repository.get(ledger_id(self.run_id)))
            except AggregateNotFoundError:
                return None
        self._aggregate = await asyncio.to_thread(get)
        if self._aggregate is not None:
            self._check_key(self._aggregate.opened)
        return self._aggregate

    def _check_key(self, opened: LedgerOpened) -> None:
        """Refuse to append with a key other than the one the run's ledger was opened with."""
        if self.key is None or not opened.public_key:
            self.key = None  # an unsigned ledger (written before hx signed its ledgers) stays unsigned
            return
        if opened.public_key != self.key.public_key:
            raise LedgerError(f"the ledger of run {self.run_id!r} is signed with key {fingerprint(opened.public_key)}; "
                              f"this data directory's key is {fingerprint(self.key.public_key)}: append to it "
                              "from the data directory that started the run")

    async def start(self, opened: LedgerOpened) -> EvolutionLedger:
        """Open the run's ledger (masked, its key recorded, signed); ``LedgerConflict`` if it already has one."""
        opened = timed(scrub_event(opened))  # masked before it is signed and chained: the digest covers what is stored
        if self.key is not None:
            opened = cast(LedgerOpened, signed(msgspec.structs.replace(opened, public_key=self.key.public_key,
                                                                       prev=""), self.key))
        aggregate = EvolutionLedger(opened)
        await self._save(aggregate, f"run {self.run_id!r} already has a ledger; resume it or use another run id")
        self._aggregate = aggregate
        return aggregate

    async def append(self, *events: LedgerEvent) -> list[LedgerEvent]:
        """Append events atomically after the head; ``LedgerConflict`` when another writer got there first."""
        aggregate = self.aggregate
        mark = len(aggregate.records)
        # Masked before chaining and signing (the digest covers what is stored): this stream refuses delete and purge.
        recorded = [aggregate.record(scrub_event(event), self.key) for event in events]
        try:
            await self._save(aggregate, f"the ledger of run {self.run_id!r} moved on while this evolver worked "
                                        f"(another evolver wrote version {aggregate.version - len(events) + 1})")
        except LedgerError:
            self._aggregate = None  # our copy holds events that were not stored: reload before going on
            del aggregate.records[mark:]
            raise
        return recorded

    async def _save(self, aggregate: EvolutionLedger, conflict: str) -> None:
        try:
            await asyncio.to_thread(self._app.save, aggregate)
        except IntegrityError:
            raise LedgerConflict(conflict) from None
        except PersistenceError as exc:
            raise LedgerError(f"cannot write the ledger of run {self.run_id!r}: {exc}") from None
        if self.conn.heads is not None:  # the ledger's head, kept where deleting the ledger cannot reach
            await self.conn.heads.record([await self.conn.js.stream_info(LEDGER.name)])


async def read_records(conn: Connection, run_id: str) -> list[LedgerEvent] | None:
    """Every ledger event of a run, in order (None when the run has no ledger): a load that writes nothing."""
    ledger = Ledger(conn, run_id)
    try:
        return list(ledger.records) if await ledger.load() is not None else None
    finally:
        await ledger.close()
