"""Trials: every rollout of an evolution run, through the same rollout code as ``hx run``, labelled on the log.

Each rollout is a trace round of its own (numbered in order of need), and its
``RoundStarted`` says what it is for: ``main`` (a round's adaptation rollouts of one
variant), ``gate`` (a candidate's attempts), ``counterfactual`` (a candidate replayed over
recorded responses) or ``heldout``. Main and gate rollouts use the same attempt seeds
(attempts ``0 .. k-1`` of each task): a candidate is compared with its variant on equal
terms, and the next round's main rollout of a shipped candidate repeats exactly what its
gate saw, so a variant's solved tasks stay solved (the adaptation curve cannot fall).
Held-out rollouts run the frozen split and hand back aggregates only. The counterfactual
check reads recorded attempts and replays them without a model or an environment
(``hx.aegis.counterfactual``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hx.aegis.counterfactual import Replayed, paths, replay
from hx.aegis.errors import LedgerConflict
from hx.aegis.winning import WinningStep, corroborated, winning_steps
from hx.environments.errors import RunExists
from hx.environments.registry import Benchmark
from hx.environments.results import AttemptOutcome, summarise
from hx.environments.rollout import PlayedRound, Rollout, RolloutSettings, RoundLabel
from hx.environments.splits import SplitRole, Splits
from hx.gate.rule import Fresh
from hx.gate.sequential import SequentialRule, Tries, decide
from hx.harness.config import HarnessConfig
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from hx.runtime.providers.resources import ProviderResources
from schemas.envelope import Record
from schemas.landscape import TaskDigest
from schemas.ledger import GameScore
from schemas.lifecycle import AttemptFinished
from streams.log import EventLog
from streams.topology import TRACE, trace_subject

RETRIES = 2
"""A solved task lost on the paired seeds is retried up to ``RETRIES * k`` times on fresh seeds."""
RETRY_BASE = 1000
"""Attempt numbers of retries and sequential waves start here, far from any main rollout's ``0 .. k-1``."""
MAX_REPLAYED = 8
"""Solved tasks a counterfactual check replays (each with all its attempts)."""


@dataclass
class Trials:
    """Runs the rollouts of one evolution run and keeps count of them."""

    log: EventLog
    run_id: str
    benchmarks: Sequence[Benchmark]
    models: ModelConfig
    settings: RolloutSettings
    splits: Splits
    next_round: int
    """The next free trace round of the run."""
    on_attempt: Callable[[AttemptResult], None] | None = None
    rollouts: int = 0
    """Attempts run since the counter was last reset."""
    stage_round: int = 0
    digests: dict[str, tuple[TaskDigest, ...]] = field(default_factory=dict)
    """Variant -> its digests of the current round (the gate's reference)."""
    main_rounds: dict[str, int] = field(default_factory=dict)
    """Variant -> the trace round of its main rollout in the current round."""
    resources: ProviderResources = field(default_factory=ProviderResources)
    """Lent to the providers of every rollout of the run (co-evolution's policy store, shared with its learner)."""

    async def run(self, harness: HarnessConfig, tasks: Sequence[str], *, role: SplitRole, label: RoundLabel,
                  models: ModelConfig | None = None,
                  settings: RolloutSettings | None = None) -> tuple[int, PlayedRound]:
        """One labelled trace round of ``tasks`` under ``harness``; its number and outcome."""
        trace_round = self.next_round
        self.next_round += 1
        rollout = Rollout(self.benchmarks, models or self.models, harness, log=self.log,
                          settings=settings or self.settings, splits=self.splits,
                          harness_source=label.variant or "evolve", resources=self.resources)
        try:
            outcome = await rollout.run_round(self.run_id, trace_round, tasks, role=role, label=label,
                                              progress=self.on_attempt)
        except RunExists:
            raise LedgerConflict(f"another evolver works on run {self.run_id!r}: it claimed trace round {trace_round} "
                                 "first") from None
        self.rollouts += len(outcome.results)
        return trace_round, outcome

    async def main(self, variant: str, harness: HarnessConfig, tasks: Sequence[str]) -> int:
        """The round's adaptation rollout of one variant; its trace round."""
        trace_round, _ = await self.run(harness, tasks, role="adaptation",
                                        label=RoundLabel(purpose="main", variant=variant, stage_round=self.stage_round))
        self.main_rounds[variant] = trace_round
        return trace_round

    # --- what the gate asks for -----------------------------------------------------------

    def solved(self, variant: str) -> list[str]:
        """The variant's tasks solved in the current round's main rollout."""
        return [d.task for d in self.digests.get(variant, ()) if d.solved]

    async def counterfactual(self, harness: HarnessConfig, variant: str) -> list[Replayed]:
        """Solved attempts of the variant's main rollout replayed under ``harness``: verdicts and winning paths."""
        source = self.main_rounds.get(variant)
        if source is None:
            return []
        attempts = {trace_subject(self.run_id, source, task, attempt): f"{task}#{attempt}"
                    for task in self.solved(variant)[:MAX_REPLAYED] for attempt in range(self.settings.attempts)}
        if not attempts:
            return []
        records: dict[str, list[Record]] = {subject: [] for subject in attempts}
        async for record in self.log.read(TRACE.name, subjects=list(attempts)):  # one read for every attempt
            records[record.subject].append(record)
        passing = [s for s in attempts if any(isinstance(r.event, AttemptFinished) and r.event.passed
                                              for r in records[s])]
        winning: dict[str, tuple[WinningStep, ...]] = {}
        for task in dict.fromkeys(attempts[s].rsplit("#", 1)[0] for s in passing):  # per task: its attempts agree
            mine = [s for s in passing if attempts[s].rsplit("#", 1)[0] == task]
            winning.update(zip(mine, corroborated([winning_steps(records[s]) for s in mine]), strict=True))
        out: list[Replayed] = []
        for subject in passing:
            verdict, where = await replay(harness, records[subject])
            out.append(Replayed(attempts[subject], verdict, where,
                                await paths(harness, records[subject], winning[subject])))
        return out

    async def fresh(self, harness: HarnessConfig, variant: str, candidate: str, flips: Sequence[str], *,
                    base_harness: HarnessConfig | None = None, rule: SequentialRule | None = None) -> Fresh:
        """The candidate on the variant's solved tasks and predicted flips (paired seeds), then, by the seesaw rule,
        the retries of losses (``rule`` None) or the sequential waves of the tasks it trails (base and candidate)."""
        solved = self.solved(variant)
        failing = {d.task for d in self.digests.get(variant, ()) if not d.solved}
        wanted = [*solved, *(t for t in flips if t in failing and t not in solved)]
        if not wanted:
            return Fresh(solved={}, flips={})
        label = RoundLabel(purpose="gate", variant=variant, candidate=candidate, stage_round=self.stage_round)
        trace_round, outcome = await self.run(harness, wanted, role="adaptation", label=label)
        rounds = [trace_round]
        tries = _tries(outcome.results)
        keep = set(solved)
        base = {d.task: Tries(d.attempts, d.passes) for d in self.digests.get(variant, ()) if d.task in tries}
        paired = {t: v for t, v in tries.items() if t in keep}
        retries: dict[str, Tries] = {}
        waves: dict[str, tuple[Tries, Tries, int]] = {}
        if rule is None:
            lost = [t for t in solved if tries[t].passes == 0]
            _, retries, more = await self._until_pass(harness, lost, label, firsts=self._fresh_attempts())
            rounds += more
        else:
            waves, more = await self._waves(harness, base_harness, rule, paired, base, label)
            rounds += more
        return Fresh(solved=paired, flips={t: v for t, v in tries.items() if t not in keep}, retries=retries,
                     waves=waves, trace_rounds=tuple(rounds), base=base)

    async def _waves(self, harness: HarnessConfig, base_harness: HarnessConfig | None, rule: SequentialRule,
                     paired: Mapping[str, Tries], base: Mapping[str, Tries],
                     label: RoundLabel) -> tuple[dict[str, tuple[Tries, Tries, int]], list[int]]:
        """The sequential rule's waves: each solved task the candidate trails plays ``k`` more fresh paired seeds
        under the base's harness and the candidate's, until the rule decides it or ``rule.waves`` waves ran.

        Each wave is two trace rounds, the base's then the candidate's, on the same tasks and seeds.
        """
        if base_harness is None:
            raise ValueError("the sequential seesaw needs the variant's harness to play its waves")
        k = self.settings.attempts
        extra: dict[str, tuple[Tries, Tries, int]] = {}
        rounds: list[int] = []
        going = [t for t in sorted(paired) if decide(rule, base.get(t, Tries(0, 0)), paired[t], waves=1) == "continue"]
        for wave in range(2, rule.waves + 1):
            if not going:
                break
            seeds = dataclasses.replace(label, first_attempt=RETRY_BASE + (wave - 2) * k)
            base_round, base_out = await self.run(base_harness, going, role="adaptation", label=seeds)
            cand_round, cand_out = await self.run(harness, going, role="adaptation", label=seeds)
            rounds += [base_round, cand_round]
            more_base, more = _tries(base_out.results), _tries(cand_out.results)
            for t in going:
                b0, c0, _ = extra.get(t, (Tries(0, 0), Tries(0, 0), 1))
                extra[t] = (b0 + more_base.get(t, Tries(0, 0)), c0 + more.get(t, Tries(0, 0)), wave)
            going = [t for t in going if decide(rule, base.get(t, Tries(0, 0)) + extra[t][0], paired[t] + extra[t][1],
                                                waves=wave) == "continue"]
        return extra, rounds

    async def kept(self, harness: HarnessConfig, variant: str, tasks: Sequence[str], models: ModelConfig,
                   candidate: str) -> tuple[list[str], tuple[int, ...]]:
        """Co-evolution's policy gate: which of ``tasks`` the policy in ``models`` fails to solve again; its rounds.

        One attempt per task and wave, stopping at a task's first pass: first the main
        rollouts' seeds (attempts ``0 .. k-1``, paired), then ``RETRIES * k`` fresh seeds, as the
        harness gate retries a loss. What still has no pass after all of them is lost.
        """
        label = RoundLabel(purpose="policy_gate", variant=variant, candidate=candidate, stage_round=self.stage_round)
        firsts = [*range(self.settings.attempts), *self._fresh_attempts()]
        lost, _, rounds = await self._until_pass(harness, tasks, label, firsts=firsts, models=models)
        return lost, tuple(rounds)

    def _fresh_attempts(self) -> list[int]:
        """Attempt numbers of the retries of a loss: ``RETRIES * k`` fresh seeds, numbers no main rollout uses."""
        return [RETRY_BASE + wave for wave in range(RETRIES * self.settings.attempts)]

    async def _until_pass(self, harness: HarnessConfig, tasks: Sequence[str], label: RoundLabel, *,
                          firsts: Sequence[int],
                          models: ModelConfig | None = None) -> tuple[list[str], dict[str, Tries], list[int]]:
        """One attempt per task and wave (attempt number ``firsts[i]`` in wave ``i``), each task until its first pass.

        What is still unsolved after the last wave, the tries per task, and the trace rounds.
        """
        lost, rounds = list(tasks), []
        tries: dict[str, Tries] = {}
        one = RolloutSettings(attempts=1, concurrency=self.settings.concurrency, max_steps=self.settings.max_steps,
                              seed=self.settings.seed, timeout_s=self.settings.timeout_s)
        for first in firsts:
            if not lost:
                break
            trace_round, outcome = await self.run(harness, lost, role="adaptation", settings=one, models=models,
                                                  label=dataclasses.replace(label, first_attempt=first))
            rounds.append(trace_round)
            tries = _tries(outcome.results, tries)
            lost = [t for t in lost if tries[t].passes == 0]
        return lost, tries, rounds

    # --- the held-out split --------------------------------------------------------------

    async def heldout(self, routes: dict[str, tuple[HarnessConfig, list[str]]]) -> tuple[int, int,
                                                                                        list[AttemptOutcome]]:
        """Every held-out task under the variant its cluster routes to; (first trace round, tasks, outcomes)."""
        first = self.next_round
        outcomes: list[AttemptOutcome] = []
        for variant, (harness, tasks) in sorted(routes.items()):
            _, outcome = await self.run(harness, tasks, role="heldout", label=RoundLabel(
                purpose="heldout", variant=variant, stage_round=self.stage_round))
            outcomes += [AttemptOutcome(task_id=r.task_id, attempt=r.attempt, passed=r.passed, score=r.score,
                                        steps=r.steps, status=r.status) for r in outcome.results]
        return first, sum(len(t) for _, t in routes.values()), outcomes


def _tries(results: Sequence[AttemptResult], before: Mapping[str, Tries] | None = None) -> dict[str, Tries]:
    """Attempts and passes per task, added to ``before``."""
    out = dict(before or {})
    for r in results:
        old = out.get(r.task_id, Tries(0, 0))
        out[r.task_id] = Tries(old.attempts + 1, old.passes + int(r.passed))
    return out


def game_scores(outcomes: Sequence[AttemptOutcome], attempts: int) -> tuple[float | None, float | None,
                                                                            tuple[GameScore, ...]]:
    """Aggregate held-out figures: pass@1 and pass@2 overall and per game, no per-task verdict."""
    report = summarise(outcomes, attempts=attempts)
    games = tuple(GameScore(game=g.game, tasks=g.tasks, pass_at_1=g.pass_at_1, pass_at_2=g.pass_at_2)
                  for g in report.games)
    return report.overall.pass_at_1, report.overall.pass_at_2, games

