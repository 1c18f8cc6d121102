"""Stream integrity: events already lost, and heads that outlive the deletion of a stream.

hx never deletes an event, so a stream whose last sequence exceeds its message count has
lost events (evicted by a limit, deleted, purged), and a stream that is gone or younger
than hx remembers has been deleted (and perhaps recreated). ``apply_topology`` refuses to
start on either, naming the stream and what was found, instead of recreating an empty
ledger.

What hx remembers is each stream's *head*: its creation time, last sequence and message
count when hx last saw it whole. Heads are kept in two places a single deletion cannot
both reach: the KV bucket ``hx_heads`` on the server (a stream of its own) and, for the
embedded server, ``<data_dir>/heads.json`` beside (not inside) the server's store. They are recorded when a connection
opens and closes and after every ledger append. Heads only move forward (a compare-and-set
on the KV entry, a merge under a file lock for the copy); ``accept_loss`` is the one
deliberate way back, and it is written to the ledger.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType, StreamInfo
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from streams.config import NatsSettings
from streams.errors import LogError, StreamLoss

HEADS_BUCKET = "hx_heads"
_CAS_TRIES = 20
_SHOWN_MAX = 1000
"""Unreadable sequences listed at most (a damaged block can hold many)."""


class StreamHead(msgspec.Struct, frozen=True, kw_only=True):
    """What hx last saw of one stream."""

    stream: str
    created: str = ""
    """The server's creation time of the stream (ISO 8601): a deleted and recreated stream has another."""
    last_seq: int = 0
    messages: int = 0
    accepted_missing: int = 0
    """Messages known to be missing and accepted (``hx log accept-loss``); more than these is a loss."""


def head_of(info: StreamInfo, accepted_missing: int = 0) -> StreamHead:
    """The head of a stream as the server describes it now."""
    state = info.state
    return StreamHead(stream=info.config.name or "", created=info.created.isoformat() if info.created else "",
                      last_seq=int(state.last_seq or 0), messages=int(state.messages or 0),
                      accepted_missing=accepted_missing)


def missing_events(info: StreamInfo) -> int:
    """Messages the stream once held and holds no more (hx deletes none, so each is a loss)."""
    state = info.state
    return max(0, int(state.last_seq or 0) - int(state.messages or 0))


def problems(name: str, info: StreamInfo | None, head: StreamHead | None, where: str) -> list[str]:
    """What is wrong with stream ``name`` (None: absent) against the head remembered in ``where``."""
    remembered = head is not None and head.last_seq > 0
    if info is None:
        if remembered:
            assert head is not None
            return [f"stream {name} is gone, but held {head.messages:,} events (up to sequence {head.last_seq:,}) "
                    f"when hx last saw it ({where})"]
        return []
    found: list[str] = []
    current = head_of(info)
    if remembered:
        assert head is not None
        if head.created and current.created != head.created:
            found.append(f"stream {name} was deleted and recreated: created {current.created}, but hx saw one created "
                         f"{head.created} holding {head.messages:,} events ({where})")
        elif current.last_seq < head.last_seq:
            found.append(f"stream {name} was truncated: its last sequence is {current.last_seq:,}, but hx saw "
                         f"{head.last_seq:,} ({where})")
    accepted = head.accepted_missing if head is not None else 0
    missing = missing_events(info)
    if missing > accepted:
        found.append(f"stream {name} lost {missing - accepted:,} events: it holds {current.messages:,} of the "
                     f"{current.last_seq:,} ever appended (evicted by a limit, deleted or purged)")
    lost = info.state.lost
    if lost is not None and lost.msgs:
        found.append(f"stream {name}: the server reports {len(lost.msgs):,} messages lost from its store")
    return found


_heads_decoder = msgspec.json.Decoder(dict[str, StreamHead])


@dataclass
class HeadMirror:
    """The local copy of the heads, one JSON file per server, merged under a file lock."""

    path: Path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def load(self) -> dict[str, StreamHead]:
        """The heads recorded here (none when the file is missing)."""
        try:
            return _heads_decoder.decode(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, msgspec.DecodeError) as exc:
            raise StreamLoss(f"cannot read the stream heads in {self.path}: {exc}") from None

    def record(self, heads: Iterable[StreamHead], *, replace: bool = False) -> None:
        """Merge ``heads`` in: a head moves forward only, unless ``replace`` (an accepted loss)."""
        try:
            with self._locked():
                known = self.load()
                for head in heads:
                    old = known.get(head.stream)
                    if replace or old is None or old.created != head.created or head.last_seq >= old.last_seq:
                        known[head.stream] = head
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                tmp.write_bytes(json.dumps(msgspec.to_builtins(known), indent=1, sort_keys=True).encode())
                tmp.replace(self.path)
        except OSError as exc:
            raise LogError(f"cannot record stream heads in {self.path}: {exc.strerror or exc}") from None


def local_heads(settings: NatsSettings) -> HeadMirror | None:
    """The local copy of the embedded server's heads, kept beside its store (not inside it).

    An external server has no identity that outlives it (a URL is reused by a fresh server),
    so its heads are kept on the server only: None.
    """
    return HeadMirror(Path(settings.data_dir).resolve() / "heads.json") if settings.embedded else None



@dataclass
class Heads:
    """Stream heads on the server (KV bucket ``hx_heads``) and, when given, in a local ``HeadMirror``."""

    js: JetStreamContext
    mirror: HeadMirror | None = None
    read_only: bool = False
    """An auditor's heads: read and verified, never created or recorded (it may not write)."""
    _kv: KeyValue | None = field(default=None, repr=False)

    async def bucket(self) -> KeyValue:
        """The heads bucket, created on first use (read only: ``NotFoundError`` when there is none)."""
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(HEADS_BUCKET)
            except NotFoundError:
                if self.read_only:
                    raise
                self._kv = await self.js.create_key_value(KeyValueConfig(bucket=HEADS_BUCKET, history=5,
                                                                         storage=StorageType.FILE))
        return self._kv

    async def server_heads(self, names: Iterable[str]) -> dict[str, tuple[StreamHead, int]]:
        """The server's head of each stream that has one, with the KV revision it is at."""
        try:
            kv = await self.bucket()
        except NotFoundError:  # read only, and no hx process recorded a head here yet
            return {}
        out: dict[str, tuple[StreamHead, int]] = {}
        for name in names:
            try:
                entry = await kv.get(name)
            except KeyNotFoundError:
                continue
            if entry.value:
                out[name] = (msgspec.json.decode(entry.value, type=StreamHead), int(entry.revision or 0))
        return out

    async def verify(self, infos: dict[str, StreamInfo | None]) -> None:
        """Raise ``StreamLoss`` listing every stream that lost events, vanished or was replaced."""
        server = await self.server_heads(infos)
        local = self.mirror.load() if self.mirror is not None else {}
        found: list[str] = []
        for name, info in infos.items():
            seen: list[tuple[StreamHead, str]] = []
            if name in server:
                seen.append((server[name][0], f"head on the server, bucket {HEADS_BUCKET}"))
            if name in local and self.mirror is not None:
                seen.append((local[name], f"head kept in {self.mirror.path}"))
            results = [problems(name, info, head, where) for head, where in seen] or [problems(name, info, None, "")]
            found += next((r for r in results if r), [])
        if found:
            raise StreamLoss("; ".join(found) + ". hx refuses to use a stream that lost events: restore it, or "
                             "accept the loss with 'hx log accept-loss STREAM' (recorded on the ledger)")

    async def record(self, infos: Iterable[StreamInfo], *, replace: bool = False) -> list[StreamHead]:
        """Move each stream's head forward to ``infos`` (on the server, then in the mirror); return the heads."""
        if self.read_only:
            raise LogError("read-only heads are never recorded (an auditor's connection may not write)")
        kv = await self.bucket()
        written: list[StreamHead] = []
        for info in infos:
            name = info.config.name or ""
            for _ in range(_CAS_TRIES):
                old = (await self.server_heads([name])).get(name)
                accepted = old[0].accepted_missing if old is not None else 0
                head = head_of(info, accepted_missing=accepted if not replace else missing_events(info))
                if old is not None and not replace and old[0].created == head.created and \
                        old[0].last_seq >= head.last_seq:
                    head = old[0]  # another process saw more: keep it
                    break
                try:
                    data = msgspec.json.encode(head)
                    if old is None:
                        await kv.create(name, data)
                    else:
                        await kv.update(name, data, last=old[1])
                    break
                except KeyWrongLastSequenceError:
                    continue  # another process moved it meanwhile: read again
            written.append(head)
        if self.mirror is not None:
            self.mirror.record(written, replace=replace)
        return written

    async def forget(self, name: str) -> None:
        """Record that stream ``name`` is absent on purpose (an accepted loss of a whole stream)."""
        if self.read_only:
            raise LogError("read-only heads are never recorded (an auditor's connection may not write)")
        kv = await self.bucket()
        await kv.put(name, msgspec.json.encode(StreamHead(stream=name)))
        if self.mirror is not None:
            self.mirror.record([StreamHead(stream=name)], replace=True)


async def unreadable(js: JetStreamContext, info: StreamInfo, *, batch: int = 1000) -> tuple[int, list[int]]:
    """(messages the stream says it holds and will not serve, some of their sequences): a damaged stored copy.

    The server checks a message's checksum as it loads it and serves none that fails, without
    counting it as lost; so a byte edited in a ``.blk`` file leaves the stream's state whole and
    the message gone from every read. One headers-only pass over the stream (no body is sent)
    counts what it serves; the sequences it skips are listed when the stream deleted none.
    """
    state = info.state
    first, last = int(state.first_seq or 0), int(state.last_seq or 0)
    if not state.messages or last < first:
        return 0, []
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, headers_only=True,
                            inactive_threshold=60.0, mem_storage=True, num_replicas=1, max_waiting=1)
    sub = await js.pull_subscribe("", stream=info.config.name, config=config)
    served: set[int] = set()
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=2.0)
            except TimeoutError:
                if ((await sub.consumer_info()).num_pending or 0) > 0:
                    continue
                break
            served.update(m.metadata.sequence.stream for m in msgs)
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(nats.errors.Error):  # an ephemeral consumer that outlives us times out on its own
            await sub.unsubscribe()
    damaged = int(state.messages) - len(served)
    if damaged <= 0:
        return 0, []
    skipped = [seq for seq in range(first, last + 1) if seq not in served] if not state.num_deleted else []
    return damaged, skipped[:_SHOWN_MAX]
