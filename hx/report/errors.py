"""Errors of the report layer: reports and exports of a run's record."""

from __future__ import annotations

from schemas.errors import HxError


class ReportError(HxError):
    """A report or export cannot be made: no such run, a ledger that does not fold, an unwritable directory."""
