"""The gate's optional ``interval`` check: the candidate's paired attempts against its variant's, by the keep rule.

Between ``seesaw`` and ``effect``, when a run asks for it (``EvolveSettings.gate.interval``):
per task the variant's own attempts (its main rollout) and the candidate's fresh attempts on the
same seeds, the paired bootstrap difference candidate - base (``hx.intervals.paired_difference``)
and its verdict (``keep_rule``). Mode ``no_discard`` rejects a DISCARD, ``keep`` ships only a KEEP,
``off`` (the default) runs no such check. The seesaw counts tasks; this check weighs how often
each passes, so a candidate that keeps every solved task barely alive can still be turned down.

>>> same = {"b:g:dev:1": [1.0, 1.0], "b:g:dev:2": [0.0, 0.0]}
>>> interval_figures(same, same).verdict.value
'inconclusive'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from hx.intervals import Interval, Verdict, keep_rule, paired_difference

IntervalMode = Literal["off", "no_discard", "keep"]
INTERVAL_MODES: tuple[IntervalMode, ...] = ("off", "no_discard", "keep")
"""``off``: no check; ``no_discard``: reject when the keep rule says DISCARD; ``keep``: ship only on KEEP."""


@dataclass(frozen=True)
class IntervalFigures:
    """What the check computed: the tasks both arms played, the difference's interval and the keep rule's verdict."""

    tasks: int
    difference: Interval | None
    """None when the two arms share no task."""
    verdict: Verdict


def interval_figures(base: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]]) -> IntervalFigures:
    """The paired difference candidate - base over the tasks both played with attempts, and its verdict (seeded)."""
    b = {t: v for t, v in base.items() if len(v)}
    c = {t: v for t, v in candidate.items() if len(v)}
    common = sorted(set(b) & set(c))
    if not common:
        return IntervalFigures(0, None, Verdict.INCONCLUSIVE)
    difference = paired_difference({t: b[t] for t in common}, {t: c[t] for t in common})
    return IntervalFigures(len(common), difference, keep_rule(difference))


def interval_passes(mode: IntervalMode, verdict: Verdict) -> bool:
    """Whether the check passes in ``mode`` (``off`` always does: it is not run)."""
    return mode == "off" or (mode == "no_discard" and verdict != Verdict.DISCARD) or verdict == Verdict.KEEP


def interval_detail(mode: IntervalMode, figures: IntervalFigures) -> str:
    """The check's figures as the ledger records them (what the audit compares, to the third decimal)."""
    d = figures.difference
    if d is None:
        return f"{figures.verdict.value} (mode {mode}): no task played by both the variant and the candidate"
    return (f"{figures.verdict.value} (mode {mode}): candidate - base {d} over {figures.tasks} paired task(s), "
            f"{d.method}, {d.confidence:.0%}")
