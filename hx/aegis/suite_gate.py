"""The suite check's eval runs: the variant's harness and the candidate's each play the gate's suite.

Both arms play in full mode with the run's model and seed and the suite's attempts and step cap;
the harness under judgement plays the suite tasks of the family the run evolves on, and every
other family's tasks are played by that family's starter harness, the same in both arms. The
base's eval is played once per variant harness per round and reused for every candidate on it.
The figures (``hx.gate.suite``) come from ``hx.eval.score.compare`` on the two evals' task
scores, as the audit computes them again from the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hx.aegis.errors import GateSettingsInvalid
from hx.aegis.settings import GateSettings, gate_suite
from hx.aegis.trials import Trials
from hx.eval.runner import EvalOutcome, EvalRunner, PlaySettings, new_eval_id, plan
from hx.eval.score import compare, interval
from hx.eval.suite import suite_digest
from hx.gate.suite import SCORE_SEED, SuiteFigures, harness_source
from hx.harness.config import HarnessConfig
from schemas.ledger import CandidateProposed
from schemas.suite import Suite
from streams.connection import Connection


@dataclass
class SuiteGate:
    """Plays the suite for the gate's ``suite`` check; ``bases`` keeps each round's base eval per harness."""

    conn: Connection
    suite: Suite
    trials: Trials
    bases: dict[tuple[int, str], EvalOutcome] = field(default_factory=dict)
    evals: int = 0
    """Eval runs played (for the cost the docs state)."""

    @classmethod
    def of(cls, conn: Connection, trials: Trials, settings: GateSettings) -> SuiteGate | None:
        """The check a run's gate settings ask for (None: off); ``GateSettingsInvalid`` when the suite changed."""
        if not settings.suite:
            return None
        suite = gate_suite(settings.suite)
        if suite_digest(suite) != settings.suite_digest:
            raise GateSettingsInvalid(f"the gate's suite {settings.suite!r} is no longer the one the run recorded "
                                      f"(digest {suite_digest(suite)[:19]}, recorded {settings.suite_digest[:19]})")
        return cls(conn, suite, trials)

    async def __call__(self, base: HarnessConfig, candidate: HarnessConfig,
                       proposal: CandidateProposed) -> SuiteFigures:
        """Both arms' evals (the base's reused within the round) and the keep rule on their difference."""
        key = (self.trials.stage_round, base.digest)
        before = self.bases.get(key)
        if before is None:
            # an earlier round's base evals are never asked for again: keep only this round's
            self.bases = {k: v for k, v in self.bases.items() if k[0] == key[0]}
            before = self.bases[key] = await self.play(base, harness_source(proposal.variant, base.digest))
        after = await self.play(candidate, harness_source(proposal.candidate, candidate.digest))
        c = compare({t.suite_task: t for t in before.tasks}, {t.suite_task: t for t in after.tasks}, seed=SCORE_SEED)
        return SuiteFigures(before.run_id, after.run_id, str(interval(before.suite.composite)),
                            str(interval(after.suite.composite)), str(interval(c.difference)), c.verdict, c.flipped)

    async def play(self, harness: HarnessConfig, source: str) -> EvalOutcome:
        """One full-mode eval of the suite with ``harness`` on the run's family."""
        family = self.trials.benchmarks[0].family
        play = PlaySettings(model=self.trials.models.main, families={family: (harness, source)},
                            seed=self.trials.settings.seed, concurrency=self.trials.settings.concurrency)
        self.evals += 1
        runner = EvalRunner(self.conn, self.suite, plan(self.suite), seed=SCORE_SEED)
        return await runner.full(new_eval_id(), play)
