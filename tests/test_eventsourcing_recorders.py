"""The ``streams.eventsourcing`` persistence module against a real nats-server.

The library's own test kits (``eventsourcing.tests.persistence``) run unchanged; each test
gets a fresh nats-server so the kits see the empty store they expect. The kits are imported
as modules: a kit class in this namespace would itself be collected by pytest.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from functools import singledispatchmethod
from pathlib import Path
from typing import Any
from unittest import TestCase, mock
from uuid import UUID, uuid4

import nats
import pytest
from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.domain import Aggregate, DomainEventProtocol, event
from eventsourcing.persistence import (
    DataError,
    DatetimeAsISO,
    DecimalAsStr,
    InfrastructureFactory,
    IntegrityError,
    InterfaceError,
    JSONTranscoder,
    OperationalError,
    StoredEvent,
    Tracking,
    Transcoding,
    UUIDAsHex,
)
from eventsourcing.projection import EventSourcedProjection, EventSourcedProjectionRunner
from eventsourcing.tests import application as app_kits
from eventsourcing.tests import persistence as kits
from eventsourcing.utils import Environment, get_topic

from streams.eventsourcing import (
    JetStreamAggregateRecorder,
    JetStreamApplicationRecorder,
    JetStreamFactory,
    JetStreamProcessRecorder,
    JetStreamTrackingRecorder,
    MsgspecTranscoder,
)
from streams.eventsourcing.layout import name_from_token, name_token, oid_from_token, oid_token
from streams.processes import free_port
from streams.server import NatsProcess

MODULE = "streams.eventsourcing"


def start_nats(case: TestCase) -> str:
    """Start a nats-server for one unittest test (stopped by a cleanup); return its URL."""
    tmp = tempfile.TemporaryDirectory()
    case.addCleanup(tmp.cleanup)
    server = NatsProcess(Path(tmp.name) / "nats" / "store")
    server.start(detach=False)
    case.addCleanup(server.stop)
    return server.url


class NatsTestCase(TestCase):
    """Gives each test its own nats-server and closes the factories the test made."""

    nats_url: str

    def setUp(self) -> None:
        """Start the server, then run the kit's own setUp."""
        self.nats_url = start_nats(self)
        self.nats_started()
        super().setUp()

    def nats_started(self) -> None:
        """Hook run once the server is up, before the kit's setUp."""

    def make_factory(self, name: str = "TestApp", **env: str) -> JetStreamFactory:
        """A factory for application ``name`` on this test's server, closed after the test."""
        settings = {"PERSISTENCE_MODULE": MODULE, "HX_NATS_URL": self.nats_url, **env}
        factory = InfrastructureFactory.construct(Environment(name, settings))
        self.addCleanup(factory.close)
        assert isinstance(factory, JetStreamFactory)
        return factory


class TestAggregateRecorder(NatsTestCase, kits.AggregateRecorderTestCase):
    """The library's aggregate recorder kit."""

    def create_recorder(self) -> JetStreamAggregateRecorder:
        """An events-purpose aggregate recorder."""
        recorder = self.make_factory().aggregate_recorder()
        assert isinstance(recorder, JetStreamAggregateRecorder)
        return recorder


class TestSnapshotRecorder(NatsTestCase, kits.AggregateRecorderTestCase):
    """The aggregate recorder kit on the snapshots stream."""

    def create_recorder(self) -> JetStreamAggregateRecorder:
        """A snapshots-purpose aggregate recorder."""
        recorder = self.make_factory().aggregate_recorder(purpose="snapshots")
        assert isinstance(recorder, JetStreamAggregateRecorder)
        assert recorder.layout.stream == "HX_ES_TestApp_snapshots"
        return recorder


class TestApplicationRecorder(NatsTestCase, kits.ApplicationRecorderTestCase[JetStreamApplicationRecorder]):
    """The library's application recorder kit, subscriptions included."""

    def create_recorder(self) -> JetStreamApplicationRecorder:
        """An application recorder."""
        recorder = self.make_factory().application_recorder()
        assert isinstance(recorder, JetStreamApplicationRecorder)
        return recorder

    def test_insert_subscribe(self) -> None:
        """The kit's optional subscription test."""
        self.optional_test_insert_subscribe()


class TestApplicationRecorderStrIds(TestApplicationRecorder):
    """The same kit with str originator ids, dots and all."""

    def new_originator_id(self) -> UUID | str:
        """A str id that needs escaping to be a subject token."""
        return f"run.{uuid4()}*>"


class TestNonInterleavingNotificationIDs(NatsTestCase, kits.NonInterleavingNotificationIDsBaseCase):
    """Two racing 1000-event inserts get contiguous notification id ranges."""

    def create_recorder(self) -> JetStreamApplicationRecorder:
        """An application recorder."""
        recorder = self.make_factory().application_recorder()
        assert isinstance(recorder, JetStreamApplicationRecorder)
        return recorder


class TestTrackingRecorder(NatsTestCase, kits.TrackingRecorderTestCase):
    """The library's tracking recorder kit."""

    def create_recorder(self) -> JetStreamTrackingRecorder:
        """A tracking recorder."""
        return self.make_factory().tracking_recorder()


class TestProcessRecorder(NatsTestCase, kits.ProcessRecorderTestCase):
    """The library's process recorder kit."""

    def create_recorder(self) -> JetStreamProcessRecorder:
        """A process recorder."""
        recorder = self.make_factory().process_recorder()
        assert isinstance(recorder, JetStreamProcessRecorder)
        return recorder


class MyTrackingRecorder(JetStreamTrackingRecorder):
    """A tracking recorder subclass, as a materialised view would be."""


class TestInfrastructureFactory(NatsTestCase, kits.InfrastructureFactoryTestCase[JetStreamFactory]):
    """The library's infrastructure factory kit."""

    def nats_started(self) -> None:
        """The kit's setUp constructs the factory from ``self.env``."""
        self.env = Environment("TestApp", {"PERSISTENCE_MODULE": MODULE, "HX_NATS_URL": self.nats_url})

    def expected_factory_class(self) -> type[JetStreamFactory]:
        """The factory class."""
        return JetStreamFactory

    def expected_aggregate_recorder_class(self) -> type[JetStreamAggregateRecorder]:
        """The aggregate recorder class."""
        return JetStreamAggregateRecorder

    def expected_application_recorder_class(self) -> type[JetStreamApplicationRecorder]:
        """The application recorder class."""
        return JetStreamApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[JetStreamTrackingRecorder]:
        """The tracking recorder class."""
        return JetStreamTrackingRecorder

    def tracking_recorder_subclass(self) -> type[JetStreamTrackingRecorder]:
        """A subclass the factory must construct when asked to."""
        return MyTrackingRecorder

    def expected_process_recorder_class(self) -> type[JetStreamProcessRecorder]:
        """The process recorder class."""
        return JetStreamProcessRecorder


class TestExampleApplication(NatsTestCase, app_kits.ExampleApplicationTestCase):
    """The library's example application (with snapshots) through ``PERSISTENCE_MODULE``."""

    expected_factory_topic = "streams.eventsourcing:JetStreamFactory"

    def nats_started(self) -> None:
        """The kit's application reads its persistence settings from ``os.environ``."""
        patcher = mock.patch.dict(os.environ, {"PERSISTENCE_MODULE": MODULE, "HX_NATS_URL": self.nats_url})
        patcher.start()
        self.addCleanup(patcher.stop)


# -- the msgspec transcoder -----------------------------------------------------------------


class TupleAsList(Transcoding):
    """Tuples keep their type."""

    type = tuple
    name = "tuple_as_list"

    def encode(self, obj: tuple[Any, ...]) -> list[Any]:
        """As a list."""
        return list(obj)

    def decode(self, data: list[Any]) -> tuple[Any, ...]:
        """Back to a tuple."""
        return tuple(data)


class MydictAsDict(Transcoding):
    """The kit's dict subclass keeps its type."""

    type = kits.Mydict
    name = "mydict"

    def encode(self, obj: dict[Any, Any]) -> dict[Any, Any]:
        """As a plain dict."""
        return dict(obj)

    def decode(self, data: dict[Any, Any]) -> Any:
        """Back to the subclass."""
        return kits.Mydict(data)


class MyListAsList(Transcoding):
    """The kit's list subclass keeps its type."""

    type = kits.MyList
    name = "mylist"

    def encode(self, obj: list[Any]) -> list[Any]:
        """As a plain list."""
        return list(obj)

    def decode(self, data: list[Any]) -> Any:
        """Back to the subclass."""
        return kits.MyList(data)


class MyStrAsStr(Transcoding):
    """The kit's str subclass keeps its type."""

    type = kits.MyStr
    name = "mystr"

    def encode(self, obj: str) -> str:
        """As a plain str."""
        return str(obj)

    def decode(self, data: str) -> Any:
        """Back to the subclass."""
        return kits.MyStr(data)


class MyIntAsInt(Transcoding):
    """The kit's int subclass keeps its type."""

    type = kits.MyInt
    name = "myint"

    def encode(self, obj: int) -> int:
        """As a plain int."""
        return int(obj)

    def decode(self, data: int) -> Any:
        """Back to the subclass."""
        return kits.MyInt(data)


class TestMsgspecTranscoder(kits.TranscoderTestCase):
    """The library's transcoder kit, including the tests ``JSONTranscoder`` has to skip."""

    def construct_transcoder(self) -> MsgspecTranscoder:
        """The transcoder with the kit's custom types (and the subclass ones) registered."""
        transcoder = MsgspecTranscoder()
        for transcoding in (
            kits.CustomType1AsDict(), kits.CustomType2AsDict(), UUIDAsHex(), TupleAsList(),
            MydictAsDict(), MyListAsList(), MyStrAsStr(), MyIntAsInt(),
        ):
            transcoder.register(transcoding)
        return transcoder


def test_msgspec_transcoder_reads_and_writes_json_transcoder_data() -> None:
    """Both transcoders read each other's bytes, standard types included."""
    ours = MsgspecTranscoder()
    theirs = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        theirs.register(transcoding)
    state = {
        "id": uuid4(), "at": datetime(2026, 1, 2, 3, 4, 5), "amount": Decimal("1.50"),
        "nested": [{"x": 1.5, "ok": True, "none": None, "ids": [uuid4()]}], "text": "🐈 \"q\" \\u",
    }
    assert theirs.decode(ours.encode(state)) == state
    assert ours.decode(theirs.encode(state)) == state
    assert ours.encode(state) == theirs.encode(state)


def test_msgspec_transcoder_rejects_what_json_cannot_hold() -> None:
    """Non-finite floats and unregistered types raise instead of being silently changed."""
    transcoder = MsgspecTranscoder()
    with pytest.raises(ValueError, match="not JSON compliant"):
        transcoder.encode({"x": float("nan")})
    with pytest.raises(TypeError, match="not serializable"):
        transcoder.encode({"x": object()})
    with pytest.raises(ValueError, match="invalid JSON"):
        transcoder.decode(b"{")


# -- tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["App", "my app", "b64_x", "a.b.*>", "ünï"])
def test_name_tokens_round_trip_and_are_subject_safe(name: str) -> None:
    """Every name maps to a safe token and back."""
    token = name_token(name)
    assert name_from_token(token) == name
    assert all(c.isalnum() or c in "_-" for c in token)


def test_oid_tokens_keep_uuid_and_str_apart() -> None:
    """A str that looks like a UUID is still a str after the round trip."""
    uid = uuid4()
    assert oid_from_token(oid_token(uid)) == uid
    assert oid_from_token(oid_token(str(uid))) == str(uid)
    assert oid_token(uid) != oid_token(str(uid))


# -- the factory, errors and lifecycle --------------------------------------------------------


@pytest.fixture
def factory(nats_url: str) -> Iterator[JetStreamFactory]:
    """A factory on the test's own nats-server."""
    made = InfrastructureFactory.construct(
        Environment("Shop", {"PERSISTENCE_MODULE": MODULE, "HX_NATS_URL": nats_url})
    )
    assert isinstance(made, JetStreamFactory)
    try:
        yield made
    finally:
        made.close()


def _events(originator_id: UUID, versions: range) -> list[StoredEvent]:
    return [StoredEvent(originator_id, v, "topic", b"{}") for v in versions]


def test_a_stale_version_rejects_the_whole_multi_aggregate_insert(factory: JetStreamFactory) -> None:
    """All-or-nothing across aggregates: one taken position stores none of the events."""
    recorder = factory.application_recorder()
    first, second = uuid4(), uuid4()
    assert recorder.insert_events(_events(first, range(1, 3))) == [1, 2]
    with pytest.raises(IntegrityError):
        recorder.insert_events(_events(second, range(1, 4)) + _events(first, range(2, 3)))
    assert recorder.select_events(second) == []
    assert recorder.max_notification_id() == 2
    assert recorder.insert_events(_events(second, range(1, 4))) == [3, 4, 5]


def test_an_insert_above_the_atomic_batch_limit_is_a_data_error(factory: JetStreamFactory) -> None:
    """The server caps atomic batches (1000 by default); nothing of a larger insert is stored."""
    recorder = factory.application_recorder()
    with pytest.raises(DataError):
        recorder.insert_events(_events(uuid4(), range(1001)))
    assert recorder.max_notification_id() is None


def test_process_recorder_tracking_gaps_leave_notifications_consistent(factory: JetStreamFactory) -> None:
    """Tracking records share the stream (for atomicity) but never show as notifications."""
    recorder = factory.process_recorder()
    oid = uuid4()
    assert recorder.insert_events(_events(oid, range(1, 3)), tracking=Tracking("up", 7)) == [1, 2]
    assert recorder.insert_events(_events(oid, range(3, 4))) == [4]
    assert [n.id for n in recorder.select_notifications(None, 10)] == [1, 2, 4]
    assert [n.id for n in recorder.select_notifications(3, 10)] == [4]
    assert recorder.max_notification_id() == 4
    with pytest.raises(IntegrityError):
        recorder.insert_events(_events(oid, range(4, 5)), tracking=Tracking("up", 7))
    assert recorder.select_events(oid, desc=True, limit=1)[0].originator_version == 3


def test_select_notifications_with_topics_reads_past_one_batch(factory: JetStreamFactory) -> None:
    """A topic filter keeps reading batches until ``limit`` matches are found."""
    recorder = factory.application_recorder()
    oid = uuid4()
    events = [StoredEvent(oid, v, "rare" if v % 700 == 0 else "common", b"") for v in range(1, 1001)]
    recorder.insert_events(events[:500])
    recorder.insert_events(events[500:])
    rare = recorder.select_notifications(None, 10, topics=["rare"])
    assert [n.originator_version for n in rare] == [700]
    assert len(recorder.select_notifications(None, 1000)) == 1000
    assert [n.id for n in recorder.select_notifications(990, 100, stop=995)] == list(range(990, 996))


def test_any_topic_string_round_trips(factory: JetStreamFactory) -> None:
    """Topics travel in a header; edge whitespace, non-ASCII and '%' survive, and filter."""
    recorder = factory.application_recorder()
    oid = uuid4()
    topics = ["módulo:Clase.Évent", " lead", "trail ", "a%20b", "x:f.<locals>.E", "tab\there"]
    recorder.insert_events([StoredEvent(oid, v, t, b"{}") for v, t in enumerate(topics)])
    assert [n.topic for n in recorder.select_notifications(None, 10)] == topics
    assert [e.topic for e in recorder.select_events(oid)] == topics
    assert [n.originator_version for n in recorder.select_notifications(None, 10, topics=["a%20b"])] == [3]


def test_an_event_above_max_payload_is_a_data_error_and_sends_nothing(factory: JetStreamFactory) -> None:
    """An oversized event is refused before any message of its batch leaves."""
    recorder = factory.application_recorder()
    oid = uuid4()
    big = StoredEvent(oid, 2, "topic", b"x" * (2 * 1024 * 1024))
    with pytest.raises(DataError):
        recorder.insert_events([*_events(oid, range(1, 2)), big])
    assert recorder.insert_events(_events(oid, range(1, 3))) == [1, 2]


def test_without_a_url_the_embedded_server_is_used_and_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No HX_NATS_URL: the factory joins or starts the embedded server and releases it on close."""
    from streams.server import EmbeddedServer

    monkeypatch.delenv("HX_NATS_URL", raising=False)
    env = {"PERSISTENCE_MODULE": MODULE, "HX_DATA_DIR": str(tmp_path)}
    made = InfrastructureFactory.construct(Environment("Shop", env))
    try:
        assert EmbeddedServer(tmp_path).record() is not None
        assert made.application_recorder().insert_events(_events(uuid4(), range(1, 2))) == [1]
    finally:
        made.close()
    assert EmbeddedServer(tmp_path).record() is None


def test_close_ends_an_open_subscription_and_leaves_no_threads(nats_url: str) -> None:
    """``close`` stops a subscription blocked in iteration and joins every thread it started."""
    before = set(threading.enumerate())
    made = InfrastructureFactory.construct(
        Environment("Shop", {"PERSISTENCE_MODULE": MODULE, "HX_NATS_URL": nats_url})
    )
    recorder = made.application_recorder()
    subscription = recorder.subscribe()
    received: list[int] = []
    reader = threading.Thread(target=lambda: received.extend(n.id for n in subscription))
    reader.start()
    recorder.insert_events(_events(uuid4(), range(1, 2)))
    made.close()
    reader.join(10)
    assert not reader.is_alive()
    subscription.__enter__()
    subscription.__exit__(None, None, None)  # joins the pull thread
    assert set(threading.enumerate()) <= before
    with pytest.raises(InterfaceError):
        recorder.max_notification_id()
    made.close()  # idempotent


def test_an_unreachable_server_is_an_operational_error_without_secrets() -> None:
    """Connection failures surface fast, as OperationalError, with credentials redacted."""
    url = f"nats://alice:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(OperationalError) as caught:
        InfrastructureFactory.construct(Environment("Shop", {"PERSISTENCE_MODULE": MODULE, "HX_NATS_URL": url}))
    assert "s3cret" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)


def test_create_table_false_without_streams_is_a_programming_error(nats_url: str) -> None:
    """With stream creation off and no stream, the failure names the cause."""
    from eventsourcing.persistence import ProgrammingError

    made = InfrastructureFactory.construct(
        Environment("Shop", {"PERSISTENCE_MODULE": MODULE, "HX_NATS_URL": nats_url, "CREATE_TABLE": "no"})
    )
    try:
        recorder = made.application_recorder()
        with pytest.raises(ProgrammingError):
            recorder.insert_events(_events(uuid4(), range(1, 2)))
    finally:
        made.close()


# -- a real Application ---------------------------------------------------------------------


class Dog(Aggregate):
    """A dog that learns tricks."""

    @event("Registered")
    def __init__(self, name: str, born: datetime) -> None:
        self.name = name
        self.born = born
        self.tricks: list[str] = []

    class TrickAdded(Aggregate.Event):
        """A trick was learned."""

        trick: str

    @event(TrickAdded)
    def add_trick(self, trick: str) -> None:
        """Learn a trick."""
        self.tricks.append(trick)


class DogSchool(Application[UUID]):
    """Registers dogs and teaches them tricks."""

    def register_dog(self, name: str) -> UUID:
        """Register a dog; return its id."""
        dog = Dog(name, datetime(2020, 5, 17, 12, 0))
        self.save(dog)
        return dog.id

    def add_trick(self, dog_id: UUID, trick: str) -> None:
        """Teach a dog a trick."""
        dog: Dog = self.repository.get(dog_id)
        dog.add_trick(trick)
        self.save(dog)


COUNTER_ID = UUID("00000000-0000-4000-8000-000000000001")


class TrickCount(Aggregate):
    """How many tricks have been taught, counted by a projection."""

    @staticmethod
    def create_id() -> UUID:
        """There is one counter."""
        return COUNTER_ID

    def __init__(self) -> None:
        self.count = 0

    @event("Counted")
    def increment(self) -> None:
        """Count one more trick."""
        self.count += 1


class TrickCounter(EventSourcedProjection[UUID]):
    """Counts tricks from DogSchool's notifications, tracking them atomically."""

    topics = (get_topic(Dog.TrickAdded),)

    @singledispatchmethod
    def policy(self, domain_event: DomainEventProtocol[UUID], processing_event: ProcessingEvent[UUID]) -> None:
        """Ignore what is not a trick."""

    @policy.register
    def _(self, domain_event: Dog.TrickAdded, processing_event: ProcessingEvent[UUID]) -> None:
        try:
            counter: TrickCount = self.repository.get(COUNTER_ID)
        except AggregateNotFoundError:
            counter = TrickCount()
        counter.increment()
        processing_event.collect_events(counter)


@pytest.fixture
def nats_env(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Select this persistence module through the environment, as a deployment would."""
    monkeypatch.setenv("PERSISTENCE_MODULE", MODULE)
    monkeypatch.setenv("HX_NATS_URL", nats_url)
    return nats_url


def test_application_saves_and_reloads_through_jetstream(nats_env: str) -> None:
    """Aggregates round-trip through a fresh application; the events are on NATS subjects."""
    with DogSchool() as school:
        assert isinstance(school.factory, JetStreamFactory)
        assert isinstance(school.mapper.transcoder, MsgspecTranscoder)
        dog_id = school.register_dog("Fido")
        school.add_trick(dog_id, "roll over")
        school.add_trick(dog_id, "play dead")

    with DogSchool() as reopened:
        dog: Dog = reopened.repository.get(dog_id)
        assert (dog.name, dog.tricks, dog.version) == ("Fido", ["roll over", "play dead"], 3)
        assert dog.born == datetime(2020, 5, 17, 12, 0)
        assert len(reopened.notification_log.select(start=1, limit=10)) == 3

    async def subjects() -> list[str]:
        nc = await nats.connect(nats_env)
        try:
            js = nc.jetstream()
            return [(await js.get_msg("HX_ES_DogSchool", seq)).subject or "" for seq in (1, 2, 3)]
        finally:
            await nc.close()

    assert asyncio.run(subjects()) == [f"hx.es.DogSchool.events.{dog_id}.{v}" for v in (1, 2, 3)]


def test_concurrent_saves_of_one_aggregate_conflict(nats_env: str) -> None:
    """Two applications editing the same version: the second save is an IntegrityError."""
    with DogSchool() as first, DogSchool() as second:
        dog_id = first.register_dog("Rex")
        dog_a: Dog = first.repository.get(dog_id)
        dog_b: Dog = second.repository.get(dog_id)
        dog_a.add_trick("sit")
        dog_b.add_trick("stay")
        first.save(dog_a)
        with pytest.raises(IntegrityError):
            second.save(dog_b)
        assert second.repository.get(dog_id).tricks == ["sit"]


def test_projection_follows_the_application_through_subscribe(nats_env: str) -> None:
    """An event-sourced projection subscribes, processes and tracks atomically."""
    with EventSourcedProjectionRunner(application_class=DogSchool, projection_class=TrickCounter) as runner:
        school = runner.app
        dog_id = school.register_dog("Lassie")
        for trick in ("fetch", "sit", "beg"):
            school.add_trick(dog_id, trick)
        last = school.recorder.max_notification_id()
        runner.wait(last, timeout=10)
        counter: TrickCount = runner.projection.repository.get(COUNTER_ID)
        assert counter.count == 3
        assert runner.projection.recorder.max_tracking_id("DogSchool") == last
