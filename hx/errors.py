"""Errors of hx's top-level modules: the entry-point registry, interval scores."""

from __future__ import annotations

from schemas.errors import HxError


class LoadFailed(HxError):
    """A registered entry point could not be imported or is not what its group holds."""


class UnknownName(HxError, KeyError):
    """No implementation is registered under a name; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class IntervalError(HxError, ValueError):
    """Outcomes an interval cannot be computed from (no attempts, no task in common, a rate outside 0..1)."""
