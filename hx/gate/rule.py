"""The gate's rule, pure: its checks in order, first failure wins, and the seesaw over a candidate's fresh attempts.

AEGIS's gate (``hx.aegis.gate``) runs the checks, and the trials they need, and decides with
this rule; the audit (``hx.replay.audit``) decides again with the same rule from what the
ledger and the trace recorded, and names any verdict that does not follow from it.

1. ``manifest``, 2. ``config``, 3. ``smoke``, 4. ``leakage``, 5. ``counterfactual`` (see
   ``hx.aegis.gate``), then
6. ``seesaw`` (k-aware, per variant): the candidate runs the variant's solved tasks and its
   predicted flips with the seeds of the variant's own rollout (``k`` paired attempts each).
   Whether a solved task *regresses* is decided by the run's seesaw rule (``hx.gate.sequential``):
   ``sequential`` plays a task the candidate trails on more waves of fresh paired seeds, base and
   candidate alike, and calls a regression by an exact test with a stated error rate; ``retry``
   (runs before it) retries a task that failed all ``k`` on fresh seeds, up to ``2k`` times, and
   holds it at the first pass. No solved task may regress, and the tasks lost on the paired seeds
   may not outnumber those gained.
   Optionally (a run's ``gate.interval``: ``no_discard`` or ``keep``), then ``interval``: the
   paired attempts of candidate and variant on the same tasks and seeds, by the keep rule
   (``hx.gate.interval``).
   Optionally (a run's ``gate.suite``), then ``suite``: the variant's harness and the candidate's
   play the eval suite; a DISCARD by the keep rule on their composites rejects (``hx.gate.suite``).
7. ``effect``: at least one predicted flip passes.

A candidate that fails only the seesaw yet, in some clusters, gains at least ``FORK_MARGIN``
more tasks than it loses and regresses none becomes a variant of its own under the ensemble
strategy (``fork``); otherwise the first failing check rejects it.

>>> v = seesaw(Verdict(), Fresh(solved={"b:g:dev:1": Tries(2, 2)}, flips={"b:g:dev:2": Tries(2, 1)}), allow_fork=True)
>>> v.outcome, v.first_failure, [c.name for c in v.checks]
('ship', '', ['seesaw', 'effect'])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from hx.environments.results import game_of
from hx.gate.interval import IntervalMode, interval_detail, interval_figures, interval_passes
from hx.gate.sequential import SequentialRule, Tries, decide
from schemas.ledger import GateCheck, GateJudged, TaskFlip

Outcome = Literal["ship", "fork", "reject"]
CHECKS = ("manifest", "config", "smoke", "leakage", "counterfactual", "seesaw", "effect")
"""The gate's checks, in order, with the interval check off (the default)."""
FORK_MARGIN = 2
"""A fork must gain at least this many more tasks than it loses in a cluster it takes over."""


def checks_of(interval: IntervalMode = "off", suite: bool = False) -> tuple[str, ...]:
    """The gate's checks in order: ``interval`` (unless off), then ``suite`` (when on), between ``seesaw`` and
    ``effect``."""
    optional = ("interval",) * (interval != "off") + ("suite",) * suite
    return (*CHECKS[:-1], *optional, CHECKS[-1])


def cluster_of(task_id: str) -> str:
    """The cluster a task is routed by: its game, as the reports group it (``benchmark:game``)."""
    return game_of(task_id)


@dataclass(frozen=True)
class Fresh:
    """The candidate's attempts: on the variant's solved tasks and predicted flips, and the retries of losses."""

    solved: dict[str, Tries]
    """Solved tasks, with the seeds of the variant's own rollout (paired)."""
    flips: dict[str, Tries]
    """Predicted flips, with the same seeds."""
    retries: dict[str, Tries] = field(default_factory=dict)
    """``retry`` rule: solved tasks that failed every paired attempt, retried on fresh seeds (to the first pass)."""
    waves: dict[str, tuple[Tries, Tries, int]] = field(default_factory=dict)
    """``sequential`` rule: solved tasks that trailed, with (base, candidate) attempts on the fresh paired seeds of
    the waves after the first, and how many waves they played in all."""
    trace_rounds: tuple[int, ...] = ()
    base: dict[str, Tries] = field(default_factory=dict)
    """The variant's own attempts of the same tasks (its main rollout, the same seeds): the interval check's base."""


def outcomes(tries: Mapping[str, Tries]) -> dict[str, list[float]]:
    """Each task's attempts as 0/1 outcomes (attempts are exchangeable in a pass rate: their order is no figure)."""
    return {t: [1.0] * v.passes + [0.0] * (v.attempts - v.passes) for t, v in tries.items()}


@dataclass
class Verdict:
    """The gate's verdict on one candidate."""

    checks: list[GateCheck] = field(default_factory=list)
    flips: list[TaskFlip] = field(default_factory=list)
    outcome: Outcome = "reject"
    clusters: tuple[str, ...] = ()
    """For a fork: the clusters the new variant serves."""
    trace_rounds: tuple[int, ...] = ()

    @classmethod
    def of(cls, judged: GateJudged) -> Verdict:
        """The verdict a ``GateJudged`` recorded (a resumed round, an approval answered later)."""
        return cls(list(judged.checks), list(judged.flips), judged.outcome, judged.clusters, judged.trace_rounds)

    @property
    def passed(self) -> bool:
        """True when the candidate ships or forks."""
        return self.outcome != "reject"

    @property
    def first_failure(self) -> str:
        """The name of the first failing check ("" when all passed)."""
        return next((c.name for c in self.checks if not c.passed), "")

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        """Record a check; return whether it passed."""
        self.checks.append(GateCheck(name=name, passed=passed, detail=detail))
        return passed


def seesaw(v: Verdict, fresh: Fresh, *, allow_fork: bool, interval: IntervalMode = "off",
           suite: GateCheck | None = None, rule: SequentialRule | None = None) -> Verdict:
    """The ``seesaw``, ``interval`` (unless off), ``suite`` (the given, decided check) and ``effect`` checks (or a
    fork) from the fresh attempts: pure. ``rule`` None is the ``retry`` rule."""
    if not paired(v, fresh, allow_fork=allow_fork, interval=interval, rule=rule):
        return v
    if suite is not None and not v.add(suite.name, suite.passed, suite.detail):
        return v
    return effect(v, fresh)


def decisions(fresh: Fresh, rule: SequentialRule) -> dict[str, tuple[Tries, Tries, str]]:
    """Each solved task's (base, candidate) attempts on the paired seeds of every wave, and the rule's decision.

    A task still undecided where the recorded waves end counts as regressed: the gate plays every
    task to a decision, so only a verdict cut short leaves one, and it may not ship on that.
    """
    out: dict[str, tuple[Tries, Tries, str]] = {}
    for t, first in sorted(fresh.solved.items()):
        more_base, more, waves = fresh.waves.get(t, (Tries(0, 0), Tries(0, 0), 1))
        base, cand = fresh.base.get(t, Tries(0, 0)) + more_base, first + more
        decision = decide(rule, base, cand, waves=waves)
        out[t] = (base, cand, "regressed" if decision == "continue" else decision)
    return out


def paired(v: Verdict, fresh: Fresh, *, allow_fork: bool, interval: IntervalMode = "off",
           rule: SequentialRule | None = None) -> bool:
    """The ``seesaw`` and ``interval`` (unless off) checks, with the flips (or a fork); whether the gate goes on."""
    lost = sorted(t for t, tries in fresh.solved.items() if tries.passes == 0)
    won = sorted(t for t, tries in fresh.flips.items() if tries.passes > 0)
    if rule is None:
        regressed = [t for t in lost if fresh.retries.get(t, Tries(0, 0)).passes == 0]
        for t, tries in sorted(fresh.solved.items()):
            more = fresh.retries.get(t, Tries(0, 0))
            v.flips.append(TaskFlip(task=t, before=True, after=tries.passes + more.passes > 0,
                                    attempts=tries.attempts + more.attempts, passes=tries.passes + more.passes))
        v.flips += [TaskFlip(task=t, before=False, after=tries.passes > 0, attempts=tries.attempts,
                             passes=tries.passes) for t, tries in sorted(fresh.flips.items())]
        holds_note = f"({len(lost)} only on retries)"
        worst = (f"{len(regressed)} solved task(s) failed every paired attempt and every retry, e.g. "
                 f"{regressed[0]!r}") if regressed else ""
    else:
        decided = decisions(fresh, rule)
        regressed = [t for t, (_, _, d) in decided.items() if d == "regressed"]
        v.flips += [TaskFlip(task=t, before=True, after=d == "held", attempts=c.attempts, passes=c.passes,
                             base_attempts=b.attempts, base_passes=b.passes, decision=d)
                    for t, (b, c, d) in decided.items()]
        for t, tries in sorted(fresh.flips.items()):
            b = fresh.base.get(t, Tries(0, 0))
            v.flips.append(TaskFlip(task=t, before=False, after=tries.passes > 0, attempts=tries.attempts,
                                    passes=tries.passes, base_attempts=b.attempts, base_passes=b.passes,
                                    decision="gained" if tries.passes > 0 else "missed"))
        holds_note = f"({len(fresh.waves)} after more waves)"
        worst = ""
        if regressed:
            b, c, _ = decided[regressed[0]]
            worst = (f"{len(regressed)} solved task(s) regressed (a drop of at least {rule.drop:g} at p <= "
                     f"{rule.alpha:g} over {rule.waves} wave(s)), e.g. {regressed[0]!r}: {c.passes}/{c.attempts} "
                     f"against the variant's {b.passes}/{b.attempts}")
    holds = not regressed and len(won) >= len(lost)
    detail = worst or (f"{len(lost)} solved task(s) lost on the paired seeds against {len(won)} gained"
                       if len(won) < len(lost) else
                       f"{len(fresh.solved)} solved task(s) hold {holds_note}, {len(won)} gained")
    if not v.add("seesaw", holds, detail):
        # Isolation is for conflicting clusters: the fork takes only clusters where it gains clearly and
        # no solved task regressed, so the variant it leaves behind keeps every regressed task solved.
        gains, losses = Counter(cluster_of(t) for t in won), Counter(cluster_of(t) for t in lost)
        hurt = {cluster_of(t) for t in regressed}
        clusters = tuple(sorted(c for c in gains if gains[c] - losses[c] >= FORK_MARGIN and c not in hurt))
        if allow_fork and clusters:
            v.outcome, v.clusters = "fork", clusters
        return False
    if interval != "off":
        # The paired seeds only: retries and later waves ran on other seeds, which the variant's main rollout
        # never played.
        figures = interval_figures(outcomes(fresh.base), outcomes({**fresh.solved, **fresh.flips}))
        return v.add("interval", interval_passes(interval, figures.verdict), interval_detail(interval, figures))
    return True


def effect(v: Verdict, fresh: Fresh) -> Verdict:
    """The ``effect`` check, last: at least one predicted flip passes; the candidate ships when it does."""
    won = sorted(t for t, tries in fresh.flips.items() if tries.passes > 0)
    if v.add("effect", bool(won), f"{len(won)} of {len(fresh.flips)} predicted flip(s) realised"):
        v.outcome = "ship"
    return v


def disagreement(judged: GateJudged, *, allow_fork: bool, interval: IntervalMode = "off", suite: bool = False) -> str:
    """Why a recorded verdict does not follow from its own checks by this rule ("" when it does).

    The checks must be the rule's, in its order, each before the first failure passed and none
    after it; ``first_failure`` must name that failure; the outcome must be ``ship`` when all
    checks passed (seven; eight with the ``interval`` check of a run that asks for it), ``fork``
    only for a seesaw failure with clusters (under the ensemble strategy), else ``reject``;
    and ``passed`` must say whether it shipped or forked.
    """
    checks = checks_of(interval, suite)
    names = [c.name for c in judged.checks]
    if names != list(checks[:len(names)]):
        return f"its checks {', '.join(names) or '(none)'} are not the gate's, in its order ({', '.join(checks)})"
    failed = [c.name for c in judged.checks if not c.passed]
    if failed and names[-1] != failed[0]:
        return f"it records checks after its first failure {failed[0]!r}: the gate stops there"
    first = failed[0] if failed else ""
    if judged.first_failure != first:
        return (f"its first_failure is {judged.first_failure or '(none)'!r}, but its first failing check is "
                f"{first or '(none)'!r}")
    if not failed and len(names) < len(checks):
        return (f"it stops after {names[-1] if names else 'nothing'} with no check failed: the gate runs all "
                + {7: "seven", 8: "eight"}.get(len(checks), "nine"))
    forks = allow_fork and first == "seesaw" and bool(judged.clusters)
    expected: Outcome = "ship" if not failed else "fork" if forks else "reject"
    if judged.outcome != expected:
        why = "every check passed" if not failed else f"it failed {first!r}" + (
            " with clusters to fork" if forks else " (no fork: " + ("the strategy is global)" if not allow_fork
                                                                   else "no cluster)" if first == "seesaw"
                                                                   else "only a seesaw failure may fork)"))
        return f"its outcome is {judged.outcome!r}, but {why}: the gate's outcome is {expected!r}"
    if judged.passed != (expected != "reject"):
        return f"it says passed={judged.passed}, but its outcome is {judged.outcome!r}"
    if judged.outcome != "fork" and judged.clusters:
        return f"it names clusters {', '.join(judged.clusters)} without forking"
    return ""
