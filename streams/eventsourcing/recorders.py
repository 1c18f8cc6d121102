"""``eventsourcing`` recorders on JetStream: aggregate, application, tracking and process.

Notification ids are stream sequence numbers. Inserts are one atomic batch: every event on
its own ``<...>.<originator_id>.<version>`` subject expecting last-subject-sequence 0 (so a
recorded position rejects the whole batch, like a unique key), and for a process recorder
the tracking record in the same batch, expecting the sequence of the upstream
application's previous tracking record (so a concurrent or lower one is rejected too).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import msgspec
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    IntegrityError,
    ListenNotifySubscription,
    Notification,
    PersistenceError,
    ProcessRecorder,
    ProgrammingError,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)

from schemas.envelope import HX_MONO, HX_SCHEMA_VERSION, HX_TIME, HX_TYPE, Stamp
from schemas.errors import SchemaError
from schemas.event import event_type
from streams.eventsourcing.layout import (
    HEADER_TOPIC,
    OutMsg,
    StoredMsg,
    StreamLayout,
    topic_header,
)
from streams.eventsourcing.store import JetStreamDatastore, Watch
from streams.log import EXPECTED_LAST_SUBJECT_SEQ
from streams.topology import token_value


class _TrackingBody(msgspec.Struct, frozen=True):
    """The body of a tracking record message."""

    application_name: str
    notification_id: int


def envelope_headers(topic: str) -> dict[str, str]:
    """hx's envelope headers for an event stored under an hx type name (``StreamLayout.envelope``)."""
    try:
        cls = event_type(topic)
    except SchemaError as e:
        raise ProgrammingError(f"a ledger event's topic must be an hx event type: {e}") from None
    stamp = Stamp.now()
    return {HX_TYPE: cls.TYPE, HX_SCHEMA_VERSION: str(cls.VERSION), HX_TIME: str(stamp.wall_ns),
            HX_MONO: str(stamp.mono_ns)}


class JetStreamRecorder:
    """What every recorder here holds: the shared datastore and its stream layout."""

    def __init__(self, datastore: JetStreamDatastore, layout: StreamLayout) -> None:
        self.datastore = datastore
        self.layout = layout

    def create_streams(self) -> None:
        """Create the stream this recorder uses, if it does not exist yet."""
        self.datastore.ensure_stream(self.layout)


class JetStreamAggregateRecorder(JetStreamRecorder, AggregateRecorder):
    """Stores and selects the events of aggregates."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Store the events all-or-nothing; ``IntegrityError`` if a position is taken."""
        self._insert(stored_events, None)
        return None

    def _event_messages(self, stored_events: Sequence[StoredEvent]) -> list[OutMsg]:
        seen: set[tuple[UUID | str, int]] = set()
        msgs = []
        for event in stored_events:
            key = (event.originator_id, event.originator_version)
            if key in seen:
                # The server would reject it too (err 10164); say why without a round trip.
                raise IntegrityError(
                    f"originator {event.originator_id} version {event.originator_version} "
                    "appears twice in one insert"
                )
            seen.add(key)
            headers = {HEADER_TOPIC: topic_header(event.topic), EXPECTED_LAST_SUBJECT_SEQ: "0"}
            if self.layout.envelope:
                headers |= envelope_headers(event.topic)
            msgs.append(OutMsg(
                subject=self.layout.event_subject(event.originator_id, event.originator_version),
                data=event.state,
                headers=headers,
            ))
        return msgs

    def _insert(self, stored_events: Sequence[StoredEvent], tracking: OutMsg | None) -> list[int]:
        msgs = self._event_messages(stored_events)
        if tracking is not None:
            msgs.append(tracking)
        if not msgs:
            return []
        what = f"insert {len(stored_events)} event(s) into {self.layout.stream}"
        last_seq, count = self.datastore.publish(msgs, what)
        # An atomic batch takes consecutive sequences; the events come first in it.
        first = last_seq - count + 1
        return list(range(first, first + len(stored_events)))

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The aggregate's events with ``gt < version <= lte``, by version, at most ``limit``."""
        msgs = self.datastore.read(
            self.layout.stream, self.layout.aggregate_filter(originator_id), 1, None, None, None,
            f"select events of {originator_id}",
        )
        events = []
        for msg in msgs:
            version = int(msg.subject.rsplit(".", 1)[1])
            if (gt is not None and version <= gt) or (lte is not None and version > lte):
                continue
            events.append(StoredEvent(
                originator_id=originator_id, originator_version=version,
                topic=token_value(msg.headers[HEADER_TOPIC]), state=msg.data,
            ))
        # Sequence order is version order for aggregates, but sort in case a caller
        # inserted versions out of order (a snapshot of an older version, say).
        events.sort(key=lambda event: event.originator_version, reverse=desc)
        return events if limit is None else events[:limit]


class JetStreamApplicationRecorder(JetStreamAggregateRecorder, ApplicationRecorder):
    """Stores events and serves them as the application's notification log."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Store the events all-or-nothing; return their notification ids."""
        return self._insert(stored_events, None)

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Notifications from ``start`` (or after it) up to ``stop``, at most ``limit``."""
        first = 1 if start is None else (start if inclusive_of_start else start + 1)
        first = max(first, 1)
        if limit <= 0 or (stop is not None and first > stop):
            return []
        wanted = frozenset(topic_header(topic) for topic in topics)

        def accept(msg: StoredMsg) -> bool:
            return msg.headers.get(HEADER_TOPIC) in wanted

        msgs = self.datastore.read(
            self.layout.stream, self.layout.events_filter, first, limit, stop,
            accept if wanted else None, f"select notifications of {self.layout.stream}",
        )
        notifications = []
        for msg in msgs:
            originator_id, version = StreamLayout.parse_event_subject(msg.subject)
            notifications.append(Notification(
                id=msg.seq, originator_id=originator_id, originator_version=version,
                topic=token_value(msg.headers[HEADER_TOPIC]), state=msg.data,
            ))
        return notifications

    def max_notification_id(self) -> int | None:
        """The last notification id, or None when no event is recorded."""
        msg = self.datastore.last(
            self.layout.stream, self.layout.events_filter, f"max notification id of {self.layout.stream}"
        )
        return None if msg is None else msg.seq

    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()) -> Subscription[ApplicationRecorder]:
        """An iterator of notifications after ``gt`` that blocks for new ones until stopped."""
        return JetStreamSubscription(self, gt=gt, topics=topics)


class JetStreamSubscription(ListenNotifySubscription[JetStreamApplicationRecorder]):
    """Pulls notifications with ``select_notifications``, woken by a JetStream consumer."""

    def __init__(
        self, recorder: JetStreamApplicationRecorder, gt: int | None = None, topics: Sequence[str] = ()
    ) -> None:
        self._watch_lock = threading.Lock()
        # Watch before the base class starts its first pull: whatever is stored after
        # the watch starts wakes a pull, and whatever was stored before, the first pull reads.
        self._watch: Watch | None = recorder.datastore.watch(
            recorder.layout.stream, recorder.layout.events_filter, self._wake
        )
        try:
            super().__init__(recorder=recorder, gt=gt, topics=topics)
        except BaseException:
            self._close_watch()
            raise
        recorder.datastore.track(self)

    def _wake(self) -> None:
        # Runs on the loop thread; before the base class made the event, nothing waits yet.
        event = getattr(self, "_has_been_notified", None)
        if event is not None:
            event.set()

    def _pull(self) -> None:
        try:
            super()._pull()
        except PersistenceError:
            # A pull cut short by close() after stop() is the end, not an error to
            # re-raise from the iterator.
            if not self._has_been_stopped:
                raise

    def stop(self) -> None:
        """Stop the subscription and delete its consumer."""
        super().stop()
        self._close_watch()

    def _close_watch(self) -> None:
        with self._watch_lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(PersistenceError):
                watch.close()


class JetStreamTrackingRecorder(JetStreamRecorder, TrackingRecorder):
    """Records which notifications of upstream applications have been processed."""

    def insert_tracking(self, tracking: Tracking) -> None:
        """Record ``tracking``; ``IntegrityError`` unless it is above the current maximum."""
        self.datastore.publish(
            [self._tracking_message(tracking)], f"insert tracking {tracking.application_name}"
        )

    def max_tracking_id(self, application_name: str) -> int | None:
        """The highest notification id tracked for ``application_name``, or None."""
        last = self._last_tracking(application_name)
        return None if last is None else last[1]

    def _last_tracking(self, application_name: str) -> tuple[int, int] | None:
        msg = self.datastore.last(
            self.layout.stream, self.layout.tracking_subject(application_name),
            f"max tracking id of {application_name}",
        )
        if msg is None:
            return None
        return msg.seq, msgspec.json.decode(msg.data, type=_TrackingBody).notification_id

    def _tracking_message(self, tracking: Tracking) -> OutMsg:
        last = self._last_tracking(tracking.application_name)
        if last is not None and tracking.notification_id <= last[1]:
            raise IntegrityError(
                f"tracking {tracking.application_name} {tracking.notification_id} is not above "
                f"the recorded maximum {last[1]}"
            )
        # Expecting the subject's current last sequence turns a concurrent insert into a
        # rejected batch instead of two records (and a lower one slipping in after).
        body = _TrackingBody(tracking.application_name, tracking.notification_id)
        return OutMsg(
            subject=self.layout.tracking_subject(tracking.application_name),
            data=msgspec.json.encode(body),
            headers={EXPECTED_LAST_SUBJECT_SEQ: str(0 if last is None else last[0])},
        )


class JetStreamProcessRecorder(JetStreamTrackingRecorder, JetStreamApplicationRecorder, ProcessRecorder):
    """Application recorder whose inserts may carry a tracking record, stored atomically."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Store the events and the optional ``tracking=`` record all-or-nothing."""
        tracking: Tracking | None = kwargs.get("tracking")
        return self._insert(stored_events, None if tracking is None else self._tracking_message(tracking))
