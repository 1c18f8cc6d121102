"""Events about the log itself: a loss of events someone accepted, on the record."""

from __future__ import annotations

from schemas.event import Event


class StreamLossAccepted(Event, frozen=True, kw_only=True):
    """Someone accepted that a stream lost events (``hx log accept-loss``); hx uses the stream again from here.

    Written to the ledger, which nobody can purge, so an auditor sees every accepted loss.
    """

    TYPE = "log.loss_accepted"

    stream: str
    problems: tuple[str, ...]
    """What hx found wrong, as it reported it."""
    reason: str
    """Why the loss was accepted, as given."""
    last_seq: int = 0
    """The stream's last sequence when the loss was accepted (0: the stream was gone)."""
    messages: int = 0
    accepted_missing: int = 0
    """Messages now known to be missing; more than these is a new loss."""
