"""Errors of the replay layer: replay, time travel and ledger audits."""

from __future__ import annotations

from schemas.errors import HxError


class ReplayError(HxError):
    """The replay layer (replay, time travel, audit) cannot do what was asked."""


class AuditError(ReplayError):
    """A ledger or trace position that an audit command was asked about does not exist or cannot be read."""


class LedgerRefused(ReplayError):
    """A ledger that does not fold or verify, asked to be acted on: nothing is done, the first problem named."""


class TimeTravelError(ReplayError):
    """A position, round, run or task that time travel cannot find on the log."""


class HarnessMissing(ReplayError):
    """The harness a round ran cannot be rebuilt: its ledger does not hold it, nor does its recorded source."""


class NotOnLog(ReplayError):
    """The run, round, task or attempt asked for is not on the log."""
