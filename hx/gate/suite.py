"""The gate's optional ``suite`` check: base and candidate play the eval suite, judged by the keep rule.

After ``interval`` and before ``effect``, when a run names a suite (``EvolveSettings.gate.suite``):
the variant's harness and the candidate's each play the suite as an eval run (``hx.eval``), and
the check fails when the keep rule's verdict on the paired difference of their composites
(candidate - base) is DISCARD: a regression in general capability. The detail records both
eval runs, so the audit can read their scores back and decide the check again.

>>> f = SuiteFigures("eval-a", "eval-b", "0.500 [0.400, 0.600]", "0.200 [0.100, 0.300]",
...                  "-0.300 [-0.400, -0.200]", "discard", ("t: 3/3 -> 0/3",))
>>> suite_passes(f.verdict), parse_detail(suite_detail(f)) == f
(False, True)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DISCARD = "discard"
SCORE_SEED = 0
"""The bootstrap seed of the suite check's eval scores and comparison (the gate's and the audit's)."""


@dataclass(frozen=True)
class SuiteFigures:
    """What the check found: the two eval runs, their composites, the difference, the verdict, the flipped tasks."""

    base_eval: str
    candidate_eval: str
    base: str
    """The base's suite composite with its interval, as ``hx.intervals.Interval`` prints it."""
    candidate: str
    difference: str
    """candidate - base, the paired bootstrap difference of composites."""
    verdict: str
    """The keep rule's verdict: ``keep``, ``discard`` or ``inconclusive``."""
    flipped: tuple[str, ...] = ()


def harness_source(who: str, digest: str) -> str:
    """How an eval run of the check records the harness it stands for: the variant or candidate, and its digest."""
    return f"{who}@{digest}"


def suite_passes(verdict: str) -> bool:
    """Whether the check passes: anything but DISCARD."""
    return verdict != DISCARD


_DETAIL = re.compile(r"^(?P<verdict>\w+): candidate eval (?P<candidate_eval>\S+) (?P<candidate>.+?\]) against base "
                     r"eval (?P<base_eval>\S+) (?P<base>.+?\]); candidate - base (?P<difference>.+?\]); flipped: "
                     r"(?P<flipped>.*)$")


def suite_detail(f: SuiteFigures) -> str:
    """The check's figures as the ledger records them (``parse_detail`` reads them back)."""
    return (f"{f.verdict}: candidate eval {f.candidate_eval} {f.candidate} against base eval {f.base_eval} "
            f"{f.base}; candidate - base {f.difference}; flipped: {'; '.join(f.flipped) or 'none'}")


def parse_detail(detail: str) -> SuiteFigures | None:
    """The figures a recorded detail states (None when it is not one ``suite_detail`` wrote)."""
    m = _DETAIL.match(detail)
    if m is None:
        return None
    flipped = () if m["flipped"] == "none" else tuple(m["flipped"].split("; "))
    return SuiteFigures(m["base_eval"], m["candidate_eval"], m["base"], m["candidate"], m["difference"],
                        m["verdict"], flipped)
