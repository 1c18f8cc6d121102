"""The root of hx's error tree, shared by every layer."""

from __future__ import annotations


class HxError(Exception):
    """Root of every error hx raises on purpose."""


class SchemaError(HxError):
    """An event or message does not match the log's vocabulary."""


class DecodeError(SchemaError):
    """A message on the log could not be decoded into a typed event."""

    def __init__(self, reason: str, *, subject: str | None = None, seq: int | None = None) -> None:
        self.reason = reason
        self.subject = subject
        self.seq = seq
        where = []
        if subject is not None:
            where.append(f"subject {subject!r}")
        if seq is not None:
            where.append(f"sequence {seq}")
        prefix = f"cannot decode message at {', '.join(where)}: " if where else "cannot decode message: "
        super().__init__(prefix + reason)

    def at(self, *, subject: str | None, seq: int | None) -> DecodeError:
        """Return the same error located at a subject and stream sequence."""
        return DecodeError(self.reason, subject=subject, seq=seq)


class HistoryGap(SchemaError):
    """A conversation delta cannot be resolved: its base was not read, or a span lies outside it."""


class FrozenValueError(HxError, TypeError):
    """Code tried to change a frozen value of a hook payload in place (see ``schemas.frozen``)."""

    def __init__(self, value: object, message: str) -> None:
        self.value = value
        """The frozen dict or list it tried to change (the pipeline finds its path in the event by identity)."""
        super().__init__(message)
