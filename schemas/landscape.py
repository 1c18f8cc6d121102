"""A round as the digester and planner see it: task digests, regressions, failure groups, levers, the landscape."""

from __future__ import annotations

from typing import Literal

from schemas.edits import Anchor, Bucket
from schemas.event import Payload

FailureCategory = Literal["infrastructure", "interrupted", "premature_answer", "env_failure", "loop",
                          "invalid_action", "stagnation", "no_progress", "partial_progress"]
FAILURE_CATEGORIES: tuple[FailureCategory, ...] = (
    "infrastructure", "interrupted", "premature_answer", "env_failure", "loop", "invalid_action", "stagnation",
    "no_progress", "partial_progress")
"""The digester's taxonomy, in the order a failure is classified (the first that applies wins)."""
Continuity = Literal["new", "solved", "persistent_failure", "newly_failing", "recovered", "flaky"]


class TaskDigest(Payload, frozen=True, kw_only=True):
    """One task of one round, compressed: outcome, failure category, implicated processors, evidence."""

    task: str
    cluster: str
    """The group the task is routed by (``benchmark:game``)."""
    variant: str = "v0"
    attempts: int
    passes: int
    category: str = ""
    """The failure category (``FAILURE_CATEGORIES``) of its failing attempts; empty when it passed."""
    implicated: tuple[str, ...] = ()
    """Singleton groups that triggered on its attempts (changed, intercepted or interrupted events)."""
    evidence: tuple[Anchor, ...] = ()
    continuity: Continuity = "new"
    features: dict[str, float] = {}
    """The trace features the category was computed from (per-attempt means)."""
    summary: str = ""
    """Prose from an LLM digester, when one is configured."""

    @property
    def solved(self) -> bool:
        """True when an attempt passed (pass@k state)."""
        return self.passes > 0


class Regression(Payload, frozen=True, kw_only=True):
    """A task whose pass state worsened against the previous round, and the ships between."""

    task: str
    variant: str
    since_round: int
    suspects: tuple[str, ...] = ()
    """Candidates shipped to the task's variant since it last passed."""


class FailureGroup(Payload, frozen=True, kw_only=True):
    """Persistent or new failures sharing a category."""

    category: str
    tasks: tuple[str, ...]
    implicated: tuple[str, ...] = ()


class Lever(Payload, frozen=True, kw_only=True):
    """An edit the evolvers can make (a library processor), with its record on this run."""

    name: str
    bucket: Bucket
    dimension: str = ""
    addresses: tuple[str, ...] = ()
    proposed: int = 0
    shipped: int = 0
    predicted: int = 0
    realised: int = 0
    banned: bool = False

    @property
    def hit_rate(self) -> float | None:
        """Predicted flips that happened, over predicted (None before any prediction was tested)."""
        return self.realised / self.predicted if self.predicted else None


class Landscape(Payload, frozen=True, kw_only=True):
    """The planner's map of the round: what fails, what was tried, what is left, what to beware."""

    regressions: tuple[Regression, ...] = ()
    failures: tuple[FailureGroup, ...] = ()
    tried_buckets: tuple[str, ...] = ()
    untried_buckets: tuple[str, ...] = ()
    tried_dimensions: tuple[str, ...] = ()
    untried_dimensions: tuple[str, ...] = ()
    levers: tuple[Lever, ...] = ()
    concern: str = ""
    """The last critic's strategy concern, relayed."""
    banned: tuple[str, ...] = ()
    """Levers not to use this round (a strategy concern's ban)."""

    @property
    def empty(self) -> bool:
        """Nothing to act on: no regression and no failure group."""
        return not self.regressions and not self.failures
