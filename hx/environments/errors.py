"""Errors of the environments layer: benchmarks, splits, rollouts, results files."""

from __future__ import annotations

from schemas.errors import HxError


class BenchmarkError(HxError):
    """A benchmark, game, split or task id is unknown or malformed."""


class EnvironmentCrashed(BenchmarkError):
    """The environment's JVM died or stopped answering; the attempt is an infrastructure failure."""


class ResultsError(HxError):
    """A results file cannot be claimed or written."""


class RolloutError(HxError):
    """A rollout cannot run as asked."""


class ReportMismatch(RolloutError):
    """The verdicts folded from the log disagree with the attempts' own results."""


class RunExists(RolloutError):
    """The run or round already has events on the log (its message ids would be deduplicated away)."""


class SplitViolation(HxError):
    """Adaptation and held-out task ids overlap, or a round mixes them."""
