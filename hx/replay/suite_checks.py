"""The audit's re-decision of the gate's ``suite`` check from the two eval runs its detail names.

For every recorded ``suite`` check: both eval runs must be scored on the log (their
``SuiteScored`` and ``TaskScored``, read through the ``eval_scores`` scoreboard) with the suite
the run's job recorded, and each must have played the harness it stands for (the variant's, the
candidate's); ``hx.eval.score.compare`` on their task scores must give the verdict, the
difference and the flipped tasks the detail states, and the check must pass exactly when that
verdict is not DISCARD.
"""

from __future__ import annotations

from collections.abc import Mapping

from hx.eval.score import compare, interval
from hx.gate.suite import SCORE_SEED, SuiteFigures, harness_source, parse_detail, suite_passes
from projections.eval_scores import EvalScore, EvalScores
from projections.ledger_records import CandidateRecord
from projections.runner import ProjectionRunner
from streams.log import EventLog


async def scoreboard(log: EventLog) -> dict[str, EvalScore]:
    """The eval runs' scores on the log (the ``eval_scores`` projection, caught up)."""
    runner: ProjectionRunner[dict[str, EvalScore]] = ProjectionRunner(log, EvalScores())
    await runner.load()
    await runner.catch_up(checkpoint=False)
    return runner.state


def suite_checked(cand: CandidateRecord) -> bool:
    """True when the candidate's recorded verdict has a ``suite`` check."""
    return cand.gate is not None and any(c.name == "suite" for c in cand.gate.checks)


def recheck_suite(cand: CandidateRecord, digest: str, scores: Mapping[str, EvalScore]) -> str:
    """Why the recorded ``suite`` check does not follow from the eval runs it names ("" when it does)."""
    assert cand.gate is not None
    check = next(c for c in cand.gate.checks if c.name == "suite")
    said = parse_detail(check.detail)
    if said is None:
        return f"its suite check's detail does not state the gate's figures: {check.detail!r}"
    arms = ((said.base_eval, "variant", harness_source(cand.gate.variant, cand.proposal.base_digest)),
            (said.candidate_eval, "candidate", harness_source(cand.id, cand.proposal.digest)))
    for run, who, source in arms:
        score = scores.get(run)
        if score is None or score.suite is None:
            return f"its suite check names the {who}'s eval run {run!r}, which is not scored on the log"
        if score.suite.suite_digest != digest:
            return (f"its suite check's {who} eval {run} played suite {score.suite.suite_digest[:19]}, not the run's "
                    f"{digest[:19]}")
        played = score.suite.config.get("families")
        if not isinstance(played, dict) or source not in played.values():
            return f"its suite check's {who} eval {run} did not play the {who}'s harness ({source[:60]})"
    base, this = scores[said.base_eval], scores[said.candidate_eval]
    c = compare(base.tasks, this.tasks, seed=SCORE_SEED)
    again = SuiteFigures(said.base_eval, said.candidate_eval, str(interval(base.suite.composite)),  # type: ignore[union-attr]
                         str(interval(this.suite.composite)), str(interval(c.difference)), c.verdict,  # type: ignore[union-attr]
                         c.flipped)
    if again != said:
        field = next(f for f in ("verdict", "difference", "base", "candidate", "flipped")
                     if getattr(again, f) != getattr(said, f))
        return (f"its suite check states {field} {getattr(said, field)!r}; the eval runs it names give "
                f"{getattr(again, field)!r}")
    if check.passed != suite_passes(c.verdict):
        return (f"its suite check {'passed' if check.passed else 'failed'} on the verdict {c.verdict!r}: the gate "
                f"{'rejects' if c.verdict == 'discard' else 'passes'} it")
    return ""

