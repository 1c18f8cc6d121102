"""What JetStream's replies mean to the ``eventsourcing`` recorders: acks, direct gets, errors.

The datastore (``streams.eventsourcing.store``) sends requests; this module reads what comes back:
a publish acknowledgement, a direct-get message or its ``Status`` header, and any NATS-side
failure, which ``translate`` maps to the ``eventsourcing.persistence`` error it means. That
is where NATS failures enter the library's world.
"""

from __future__ import annotations

import msgspec
import nats.errors
import nats.js.errors
from eventsourcing.persistence import (
    DataError,
    IntegrityError,
    InterfaceError,
    InternalError,
    OperationalError,
    PersistenceError,
    ProgrammingError,
)
from nats.aio.msg import Msg

from streams.eventsourcing.bridge import LoopClosedError
from streams.eventsourcing.layout import StoredMsg
from streams.log import WRONG_LAST_SEQUENCE

# JetStream API error codes the recorders react to.
ERR_BATCH_WRONG_LAST_SEQUENCE = 10164  # the same subject twice in one batch, each expecting 0
ERR_BATCH_TOO_LARGE = 10199
ERR_STREAM_NOT_FOUND = 10059
ERR_STREAM_NAME_IN_USE = 10058
CONFLICTS = frozenset({WRONG_LAST_SEQUENCE, ERR_BATCH_WRONG_LAST_SEQUENCE})


class _ApiError(msgspec.Struct):
    """The ``error`` object of a JetStream API reply."""

    code: int = 0
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    """A JetStream publish acknowledgement (or its error)."""

    seq: int = 0
    count: int = 1
    error: _ApiError | None = None


class JetStreamApiError(Exception):
    """An error reply from the JetStream API."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"{description} (code {code}, err_code {err_code})")


def parse_ack(data: bytes, sent: int) -> tuple[int, int]:
    """The (last stream sequence, message count) a publish ack reports for ``sent`` messages stored together."""
    ack = msgspec.json.decode(data, type=_Ack)
    if ack.error is not None:
        raise JetStreamApiError(ack.error.code, ack.error.err_code, ack.error.description)
    if ack.count != sent:
        raise OperationalError(f"JetStream stored {ack.count} of {sent} messages of an atomic batch")
    return ack.seq, ack.count


def stored_msg(msg: Msg) -> StoredMsg:
    """A direct-get reply as a ``StoredMsg``."""
    headers = msg.headers or {}
    return StoredMsg(
        seq=int(headers["Nats-Sequence"]), subject=headers["Nats-Subject"], headers=headers, data=msg.data,
    )


def direct_get_error(status: str, headers: dict[str, str]) -> JetStreamApiError:
    """The error a direct-get reply's ``Status`` header reports."""
    return JetStreamApiError(int(status), 0, str(headers.get("Description", "direct get failed")))


def translate(e: BaseException, what: str, timeout: float) -> PersistenceError:
    """Map a NATS-side failure to the ``eventsourcing.persistence`` error it means."""
    if isinstance(e, PersistenceError):
        return e
    if isinstance(e, LoopClosedError):
        return InterfaceError(f"{what}: the NATS connection is closed")
    if isinstance(e, nats.js.errors.APIError):
        e = JetStreamApiError(e.code or 0, e.err_code or 0, e.description or "")
    if isinstance(e, JetStreamApiError):
        if e.err_code in CONFLICTS:
            return IntegrityError(f"{what}: rejected, a record at that position already exists ({e})")
        if e.err_code == ERR_BATCH_TOO_LARGE:
            return DataError(f"{what}: more events than the server's atomic batch limit ({e})")
        if e.err_code == ERR_STREAM_NOT_FOUND:
            return ProgrammingError(f"{what}: stream not found ({e})")
        return OperationalError(f"{what}: JetStream error {e}")
    if isinstance(e, nats.errors.MaxPayloadError):
        return DataError(f"{what}: a message exceeds the server's max_payload")
    if isinstance(e, nats.errors.NoRespondersError):
        return ProgrammingError(f"{what}: no JetStream stream answers for the subject (not created?)")
    if isinstance(e, TimeoutError | nats.errors.TimeoutError):
        return OperationalError(f"{what}: no reply from NATS within {timeout}s (a write may or may not be stored)")
    if isinstance(e, nats.errors.Error | OSError):
        return OperationalError(f"{what}: NATS failure ({type(e).__name__})")
    # Unexpected: name the type only, its text might carry connection details.
    return InternalError(f"{what}: unexpected {type(e).__name__}")
