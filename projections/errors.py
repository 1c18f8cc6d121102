"""Errors of the projections layer: plugins, folds, time travel and span export."""

from __future__ import annotations

from schemas.errors import HxError


class AsOfError(HxError):
    """A time-travel position that is not on the projection's stream."""


class ExportFailed(HxError):
    """The span exporter refused or could not reach its endpoint; nothing after the last checkpoint is lost."""


class PluginError(HxError):
    """A projection plugin cannot be loaded or is not a usable projection."""


class ProjectionFailed(HxError):
    """A projection's own code failed on the log: its fold raised or exited, or its state cannot be encoded."""


class UnreadableRules(HxError):
    """A harness recorded on the ledger holds a rule program this hx cannot decode."""
