"""Errors of the log layer: NATS failures translated where they enter hx."""

from __future__ import annotations

from schemas.errors import HxError


class LogError(HxError):
    """The event log could not do what was asked."""


class ServerError(LogError):
    """The embedded nats-server could not be started, joined or stopped."""


class InvalidRunId(LogError, ValueError):
    """A run id that cannot name subjects and files (see ``streams.topology.check_run_id``)."""


class ServerGone(LogError):
    """The embedded nats-server exited under a running command: nothing more can be appended or read."""


class TopologyMismatch(LogError):
    """A stream or bucket exists with a configuration other than the declared one."""


class TopologyMissing(LogError):
    """A stream hx relies on does not exist, and a read-only connection may not create it."""


class AppendTimeout(LogError):
    """An append was not acknowledged in time; it may or may not be stored."""


class ConcurrencyConflict(LogError):
    """A conditional append lost the race: the subject moved past the expected sequence."""

    def __init__(self, subject: str, expected: int) -> None:
        self.subject = subject
        self.expected = expected
        super().__init__(f"subject {subject!r} is no longer at sequence {expected}")


class UnacknowledgedAppends(LogError):
    """Some appends of a batch were never acknowledged, even after retries."""

    def __init__(self, keys: list[str], reason: str) -> None:
        self.keys = keys
        super().__init__(f"{len(keys)} append(s) unacknowledged after retries: {reason}")


class PermissionDenied(LogError):
    """The NATS server refused this connection's user a publish or subscribe (``streams.permissions``)."""


class SigningError(LogError):
    """The ledger signing key cannot be made, read or used."""


class StreamLoss(LogError):
    """A stream lost events, vanished or was replaced: hx will not read or append to it until told to."""


class UnsafePath(LogError):
    """A private file or directory is owned by another user, or others could change (or read) it."""
