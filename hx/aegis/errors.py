"""Errors of the AEGIS layer: evolvers, the edit ledger and the held-out guard."""

from __future__ import annotations

from hx.environments.errors import SplitViolation
from schemas.errors import HxError


class EvolverError(HxError):
    """An evolver cannot be built or used as configured."""


class EvolverReplyError(EvolverError):
    """A meta-model's reply does not parse; the message names the problem and its place."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class LedgerError(HxError):
    """The ledger cannot do what was asked."""


class LedgerConflict(LedgerError):
    """Another writer saved to this run's ledger first; nothing of ours was written."""


class PipelineError(HxError):
    """A round's stages cannot make a round (no stage decided it)."""


class HeldoutAccess(SplitViolation):
    """A stage asked for a trace round that is not an adaptation round of the run."""


class InductionSettingsInvalid(HxError):
    """The induced evolver's thresholds are out of range."""


class GateSettingsInvalid(HxError):
    """The gate's settings name a check mode the gate does not have."""
