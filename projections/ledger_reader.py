"""A run's edit ledger read off ``HX_LEDGER`` and folded, and the fold of every run as a projection.

``read_run_ledger`` reads one run's ledger with the subject filter of its aggregate, so it
costs that run's ledger and nothing else, and accounts for every message on that subject: one
that is no ledger event, or that this hx cannot decode, is a fault of the fold, never skipped
in silence. ``EditLedger`` folds the whole stream, every run, for ``hx projections`` and time
travel; its checkpoint keeps the events (which carry no type tag) and folds them again.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

import msgspec

from projections.base import Projection
from projections.ledger import RunLedger
from projections.ledger_records import Fault
from schemas.envelope import Record, decode_body, encode_body
from schemas.errors import HxError
from schemas.ledger import LedgerEvent
from streams.edit_ledger import LAYOUT, ledger_filter, ledger_id, position_of
from streams.log import EventLog
from streams.topology import LEDGER


async def read_run_ledger(log: EventLog, run_id: str) -> RunLedger | None:
    """One run's ledger read off ``HX_LEDGER`` with its subject filter and folded (None: the run has none).

    Every message on the run's subject is accounted for: one that is no ledger event, or that this
    hx cannot decode, is a ``Fault`` of the fold, never skipped in silence.
    """
    run = RunLedger(run_id=run_id)
    skipped = log.quarantine.count
    seen = 0
    async for record in log.read(LEDGER.name, subjects=[ledger_filter(run_id)]):
        seen += 1
        fold_record(run, record)
    new = log.quarantine.count - skipped
    bad = list(log.quarantine.records)[-new:] if new else []
    for q in bad:
        run.foreign(position_of(q.subject), q.seq, q.type or "no type", f"message {q.seq} cannot be decoded by this "
                    f"hx: {q.reason}")
    if not seen and not bad:
        return None
    run.faults.sort(key=lambda f: (f.position, f.seq))
    return run


def fold_record(run: RunLedger, record: Record) -> None:
    """Fold one record read from the run's ledger subject (a non-ledger event there is a fault)."""
    position = position_of(record.subject)
    if isinstance(record.event, LedgerEvent):
        run.fold(record.event, position, record.seq)
    else:
        run.foreign(position, record.seq, record.type, f"message {record.seq} is a {record.type}, not a ledger event: "
                                                        "only ledger events belong on a run's ledger")


# --- the projection of every run ---------------------------------------------------------------


class _Stored(msgspec.Struct, array_like=True):
    """One ledger event as a checkpoint keeps it: the fold is rebuilt from these (events carry no tag)."""

    position: int
    seq: int
    type: str
    version: int
    body: bytes


class _StoredRun(msgspec.Struct):
    """One run as a checkpoint keeps it: its events, and every fault of its fold (some are of no event taken)."""

    entries: list[_Stored]
    faults: list[Fault]
    last_position: int


class EditLedger(Projection[dict[str, RunLedger]]):
    """Every run's ledger, folded: the read model of ``HX_LEDGER`` (``hx projections``, ``hx state``)."""

    name: ClassVar[str] = "edit_ledger"
    stream: ClassVar[str] = LEDGER.name
    subjects: ClassVar[tuple[str, ...]] = (LAYOUT.events_filter,)
    state_type = dict[str, _StoredRun]

    def initial(self) -> dict[str, RunLedger]:
        """No runs yet."""
        return {}

    def fold(self, state: dict[str, RunLedger], record: Record) -> dict[str, RunLedger]:
        """Fold one ledger event into its run (a message of another type is a fault of the run it sits on)."""
        if isinstance(record.event, LedgerEvent):
            run_id = record.event.run_id
        else:  # the subject names the run's ledger id, not its run id: find the run whose ledger it is
            oid = str(LAYOUT.parse_event_subject(record.subject)[0])
            run_id = next((r for r in state if str(ledger_id(r)) == oid), "")
        run = state.get(run_id)
        if run is None:
            run = state[run_id] = RunLedger(run_id=run_id)
        fold_record(run, record)
        return state

    def encode(self, state: dict[str, RunLedger]) -> bytes:
        """The events of every run (the fold's own structures are rebuilt from them)."""
        stored = {run_id: _StoredRun([_Stored(e.position, e.seq, e.type, type(e.event).VERSION, encode_body(e.event))
                                      for e in run.entries], run.faults, run.last_position)
                  for run_id, run in state.items()}
        return msgspec.msgpack.encode(stored)

    def decode(self, data: bytes) -> dict[str, RunLedger]:
        """Fold the checkpointed events again (``msgspec.DecodeError`` for a snapshot that is not one)."""
        stored = msgspec.msgpack.decode(data, type=dict[str, _StoredRun])
        out: dict[str, RunLedger] = {}
        for run_id, kept in stored.items():
            run = out[run_id] = RunLedger(run_id=run_id)
            for s in kept.entries:
                try:
                    event = decode_body(s.type, s.version, s.body)
                except HxError as exc:
                    raise msgspec.DecodeError(f"a snapshot event of run {run_id!r}: {exc}") from None
                if not isinstance(event, LedgerEvent):
                    raise msgspec.DecodeError(f"a snapshot event of run {run_id!r} is a {s.type}")
                run.fold(event, s.position, s.seq)
            run.faults, run.last_position = kept.faults, kept.last_position
        return out

    def digest(self, state: dict[str, RunLedger]) -> str:
        """sha256 of ``encode``: the events in fold order, which a rebuilt and a live state share."""
        return hashlib.sha256(self.encode(state)).hexdigest()
