"""Where the ``eventsourcing`` records live on JetStream: streams, subjects and tokens.

Subjects (``<app>`` and ids are made subject-safe by ``name_token``/``oid_token``)::

    stream HX_ES_<app>             hx.es.<app>.events.<originator_id>.<version>     one message per event
                                   hx.es.<app>.tracking.<upstream_app>              one message per tracking record
    stream HX_ES_<app>_<purpose>   hx.es.<app>.<purpose>.<originator_id>.<version>  e.g. snapshots

A subject per (originator_id, version) published with ``Nats-Expected-Last-Subject-Sequence: 0``
makes the server enforce the uniqueness a SQL primary key would, with no read first. The
price is one subject per event in the server's subject index, which is fine for domain
aggregates (the bulk trace data of hx goes to its own streams, not through here).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from urllib.parse import quote
from uuid import UUID

from eventsourcing.persistence import ProgrammingError
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

SUBJECT_ROOT = "hx.es"
STREAM_ROOT = "HX_ES"
LEDGER_STREAM = "HX_LEDGER"
LEDGER_ROOT = "hx.ledger"
HEADER_TOPIC = "Hx-Es-Topic"
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"

_SAFE = re.compile(r"[A-Za-z0-9_-]+")
_ENCODED = "b64_"
_STR_ID = "s_"


def name_token(name: str) -> str:
    """Return a subject token and stream-name part for ``name``; distinct names stay distinct."""
    if _SAFE.fullmatch(name) and not name.startswith(_ENCODED):
        return name
    return _ENCODED + base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def name_from_token(token: str) -> str:
    """Invert ``name_token``."""
    if not token.startswith(_ENCODED):
        return token
    raw = token[len(_ENCODED):]
    return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()


def topic_header(topic: str) -> str:
    """The ``Hx-Es-Topic`` header value for a topic: readable, yet exact for any string
    (header parsing would strip edge whitespace, and values must stay on one line).
    ``streams.topology.token_value`` inverts it (both are percent-escapes)."""
    return quote(topic, safe=":<>[],")


def oid_token(originator_id: UUID | str) -> str:
    """Subject token for an originator id; UUIDs and strings never share a token."""
    if isinstance(originator_id, UUID):
        return str(originator_id)
    return _STR_ID + name_token(originator_id)


def oid_from_token(token: str) -> UUID | str:
    """Invert ``oid_token``, giving back a UUID or a str as it was recorded."""
    if token.startswith(_STR_ID):
        return name_from_token(token[len(_STR_ID):])
    return UUID(token)


@dataclass(frozen=True)
class OutMsg:
    """A message to publish: subject, body and headers."""

    subject: str
    data: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class StoredMsg:
    """A message read back from a stream, with its stream sequence."""

    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes


@dataclass(frozen=True)
class StreamLayout:
    """Where one recorder's records live: the stream and the subject subtree of its events."""

    stream: str
    prefix: str
    kind: str = "events"
    replicas: int = 1
    envelope: bool = False
    """Events are hx events (topic = hx type name, state = its msgpack body): the messages get hx's
    envelope headers too, so hx's own readers (``EventLog``) decode them like any other event."""
    managed: bool = False
    """The stream belongs to hx's topology (``streams.topology``): checked, never created, here."""

    @classmethod
    def for_app(cls, app_name: str, purpose: str = "events", replicas: int = 1) -> StreamLayout:
        """The layout for an application's events (``purpose="events"``) or another purpose."""
        app = name_token(app_name or "default")
        kind = name_token(purpose)
        if kind == "tracking":
            raise ProgrammingError("'tracking' is reserved; choose another recorder purpose")
        # App "X_snapshots" and app "X"'s snapshots would share a stream name; their
        # subjects differ, so ensure_stream refuses the second instead of mixing them.
        stream = f"{STREAM_ROOT}_{app}" if kind == "events" else f"{STREAM_ROOT}_{app}_{kind}"
        return cls(stream=stream, prefix=f"{SUBJECT_ROOT}.{app}", kind=kind, replicas=replicas)

    @classmethod
    def on_ledger(cls, app_name: str) -> StreamLayout:
        """The layout of an application whose aggregates live on hx's edit ledger (``HX_LEDGER``)."""
        return cls(stream=LEDGER_STREAM, prefix=f"{LEDGER_ROOT}.{name_token(app_name or 'default')}",
                   envelope=True, managed=True)

    @property
    def holds_tracking(self) -> bool:
        """True for the events stream, which also holds tracking records (for atomic inserts)."""
        return self.kind == "events"

    @property
    def events_filter(self) -> str:
        """Subject filter matching every event of this layout (and no tracking record)."""
        return f"{self.prefix}.{self.kind}.>"

    def event_subject(self, originator_id: UUID | str, version: int) -> str:
        """The subject of one event."""
        return f"{self.prefix}.{self.kind}.{oid_token(originator_id)}.{version}"

    def aggregate_filter(self, originator_id: UUID | str) -> str:
        """Subject filter matching every event of one aggregate."""
        return f"{self.prefix}.{self.kind}.{oid_token(originator_id)}.*"

    def tracking_subject(self, application_name: str) -> str:
        """The subject holding the tracking records of one upstream application."""
        return f"{self.prefix}.tracking.{name_token(application_name)}"

    @staticmethod
    def parse_event_subject(subject: str) -> tuple[UUID | str, int]:
        """The (originator_id, originator_version) an event subject names."""
        _, token, version = subject.rsplit(".", 2)
        return oid_from_token(token), int(version)

    def stream_config(self) -> StreamConfig:
        """The stream configuration this layout needs."""
        subjects = [self.events_filter]
        if self.holds_tracking:
            subjects.append(f"{self.prefix}.tracking.>")
        return StreamConfig(
            name=self.stream,
            subjects=subjects,
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            allow_atomic=True,  # all-or-nothing multi-event inserts
            allow_direct=True,  # reads without creating consumers
            # The event log is the source of truth: immutable. Snapshots are derived data.
            deny_delete=self.holds_tracking,
            deny_purge=self.holds_tracking,
        )
