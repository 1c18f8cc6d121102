"""The AEGIS loop (Algorithm 1): run, digest, plan, propose, criticise, gate, ship; every step on the ledger.

Each round runs every variant on its tasks, digests the attempts (``alpha`` below which
the round is a no-op), plans the landscape (empty: no-op), asks the evolver for up to
``candidates`` candidates (none: no-op), lets the critic rank them (one revision at most;
no-op possible), and gates them in ranking order: per variant the first that passes ships
(bucket-disjoint ones with it), a split edit forks under ``ensemble``, a risky one waits
for a human. ``patience`` rounds in a row without a ship end the run early. The frozen
held-out split is evaluated before the first round and after the last (and every
``heldout_every`` rounds), never shown to a stage.

Resuming is folding: the run's ledger says which rounds are decided and what the
undecided one already recorded (digests, landscape, candidates, verdicts); those are used
as recorded, and only what is missing runs. Rollouts are seeded per task and attempt, so
a rollout redone after a kill has the outcome the first would have had.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hx.aegis import critic as deterministic_critic
from hx.aegis.candidates import candidate_of
from hx.aegis.digester import ProseWriter, actionability, digest_round, with_prose
from hx.aegis.evidence import Evidence
from hx.aegis.evolvers.base import Context, Evolver, EvolverError, Proposal
from hx.aegis.gate import CodeCheck, Forbidden, judge
from hx.aegis.ledger import Ledger, LedgerConflict
from hx.aegis.metrics import metrics
from hx.aegis.planner import plan
from hx.aegis.settings import EvolveSettings, Progress
from hx.aegis.shipping import fork, ship, ship_approved
from hx.aegis.state import RunState
from hx.aegis.trials import Trials, game_scores
from hx.aegis.variants import route
from hx.environments.splits import round_roles
from hx.gate.rule import Verdict
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.replay.trace_rounds import trace_marks
from hx.runtime.cancel import stop_if_cancelled
from projections.ledger import RunLedger
from projections.ledger_records import RoundRecords, revised
from schemas.landscape import TaskDigest
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    EvolutionFinished,
    GateJudged,
    HeldoutScored,
    LandscapePlanned,
    LedgerEvent,
    ModelChanged,
    RoundDecided,
    RoundDigested,
    RoundOutcome,
)

Review = deterministic_critic.Review
CriticFn = Callable[[RunState, int, Sequence[CandidateProposed], Sequence[TaskDigest], bool], Awaitable[Review]]
Approver = Callable[[CandidateProposed, Verdict], Awaitable[bool]]


@dataclass
class Evolution:
    """One evolution run: its ledger, its trials, its evolver and critic."""

    ledger: Ledger
    trials: Trials
    evolver: Evolver
    settings: EvolveSettings
    forbidden: Forbidden
    critic: CriticFn | None = None
    code_check: CodeCheck | None = None
    code_source: Callable[[CandidateProposed], Awaitable[Sequence[str]]] | None = None
    prose: ProseWriter | None = None
    approver: Approver | None = None
    after_round: Callable[[RoundDecided], Awaitable[str]] | None = None
    """Called after each decided round (co-evolution's learner update); a non-empty answer ends the run, as reason."""
    spent: Callable[[], str] | None = None
    """Checked before a round starts (a resumed run's spent rollout budget); a non-empty answer ends the run."""
    resting: Callable[[RunState, int], frozenset[str]] | None = None
    """The adaptation tasks that sit out round t (co-evolution's barren tasks); None: every task plays."""
    progress: Progress = field(default_factory=Progress)
    seconds: dict[int, float] = field(default_factory=dict)
    _folded: tuple[int, LedgerEvent, RunState] | None = field(default=None, init=False, repr=False)
    _built: dict[str, HarnessConfig] = field(default_factory=dict, init=False, repr=False)
    """Harnesses built from the ledger, by digest: every fold of the run shares them."""

    @property
    def run_id(self) -> str:
        """The run."""
        return self.ledger.run_id

    def state(self) -> RunState:
        """The run's state as its ledger has it now (folded again only when the ledger changed)."""
        records = self.ledger.records
        key = (len(records), records[-1])
        if self._folded is None or self._folded[0] != key[0] or self._folded[1] is not key[1]:
            # A fresh fold (a stage holding an earlier state keeps what it saw), sharing the built harnesses.
            state = RunState(RunLedger(), self._built)
            for record in records:
                state.fold(record)
            self._folded = (key[0], key[1], state)  # the record itself, not its id: never reused
        return self._folded[2]

    async def append(self, *events: LedgerEvent) -> None:
        """Append to the ledger; an approval answered meanwhile is folded in, any other writer is a conflict."""
        stop_if_cancelled()  # a stopped run appends nothing more, even when its cancellation was dropped
        known = len(self.ledger.records)
        try:
            await self.ledger.append(*events)
        except LedgerConflict:
            await self.ledger.load()
            news = self.ledger.records[known:]
            if not news or not all(isinstance(r, ApprovalGiven) for r in news):
                raise
            await self.ledger.append(*events)

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run (or finish) the loop: held-out first, then rounds until T or patience, then held-out again."""
        if self.state().ledger.finished is not None:
            return
        if not any(h.round == -1 for h in self.state().ledger.heldout):
            await self.heldout(-1)
        status: Literal["completed", "patience"] = "completed"
        reason = f"ran {self.settings.rounds} round(s)"
        while (t := self.state().next_round) < self.settings.rounds:
            stop_if_cancelled()
            if self.spent is not None and (stop := self.spent()):
                reason = stop  # a run resumed after its last round spent the budget starts no new round
                break
            self.progress.round(t)
            began = time.perf_counter()
            decision = await self.round(t)
            self.seconds[t] = time.perf_counter() - began
            self.progress.decided(decision)
            stop = await self.after_round(decision) if self.after_round is not None else ""
            every = self.settings.heldout_every
            if every and (t + 1) % every == 0 and t + 1 < self.settings.rounds:
                await self.heldout(t)
            if stop:
                reason = stop
                break
            if decision.idle >= self.settings.patience:
                status, reason = "patience", f"{decision.idle} round(s) in a row without a ship"
                break
        last = self.state().next_round - 1
        if not any(h.round == last for h in self.state().ledger.heldout):
            await self.heldout(last)
        await self.append(EvolutionFinished(run_id=self.run_id, rounds=last + 1, status=status, reason=reason))

    async def heldout(self, after: int) -> HeldoutScored:
        """Evaluate the frozen held-out split under the current routing; aggregates go on the ledger."""
        state = self.state()
        self.trials.stage_round = max(after, 0)
        routes = {v: (state.variants[v].harness, tasks)
                  for v, tasks in route(state, self.trials.splits.heldout).items()}
        first, tasks, outcomes = await self.trials.heldout(routes)
        p1, p2, games = game_scores(outcomes, self.trials.settings.attempts)
        scored = HeldoutScored(run_id=self.run_id, round=after, trace_round=first,
                               heldout_digest=self.trials.splits.heldout_digest, tasks=tasks, pass_at_1=p1,
                               pass_at_2=p2, games=games)
        await self.append(scored)
        self.progress.heldout(scored)
        return scored

    # --- one round --------------------------------------------------------------------------

    async def round(self, t: int) -> RoundDecided:
        """Run round ``t`` (or finish it, on resume) and record its decision."""
        trials = self.trials
        trials.stage_round, trials.rollouts = t, 0
        await ship_approved(self, t, max_variants=self.settings.max_variants, digests=trials.digests)
        await self._model_in_force(t)
        digested = await self._digest(t)
        digests = digested.digests
        trials.digests = {v: tuple(d for d in digests if d.variant == v) for v in {d.variant for d in digests}}
        if digested.actionability < self.settings.alpha:
            return await self._decide(t, "below_actionability", f"actionability {digested.actionability:.2f} < "
                                                                f"alpha {self.settings.alpha:.2f}")
        landscape = self._recorded(t).landscape
        if landscape is None:
            self.progress.stage(t, "plan")
            landscape = LandscapePlanned(run_id=self.run_id, round=t, landscape=plan(self.state(), t, digests))
            await self.append(landscape)
        if landscape.landscape.empty:
            return await self._decide(t, "empty_landscape", "no regression and no categorised failure")
        candidates, notes = await self._propose(t, landscape, digests)
        if not candidates:
            return await self._decide(t, "no_candidate", "; ".join(notes) or "the evolver found no applicable edit")
        verdict = await self._criticise(t, candidates, landscape, digests)
        if verdict.no_op:
            return await self._decide(t, "all_rejected", "the critic found no candidate backed by evidence")
        return await self._gate_and_ship(t, verdict)

    async def _model_in_force(self, t: int) -> None:
        """Record the task agent's model before the round's rollouts when it changed (co-evolution's policy)."""
        model, state = self.trials.models.public().main, self.state()  # the ledger records specs masked
        if model != state.model and self._recorded(t).digested is None:
            await self.append(ModelChanged(run_id=self.run_id, round=t, model=model, previous=state.model))

    async def _digest(self, t: int) -> RoundDigested:
        recorded = self._recorded(t).digested
        if recorded is not None:
            roles = await round_roles(self.trials.log, self.run_id)
            self.trials.main_rounds = {roles[r].variant: r for r in recorded.trace_rounds if r in roles}
            return recorded
        self.progress.stage(t, "rollouts")
        state = self.state()
        rested = self.resting(state, t) if self.resting is not None else frozenset()
        variants: dict[str, str] = {}
        trace_rounds = []
        playing = [task for task in self.trials.splits.adaptation if task not in rested]
        for variant, tasks in route(state, playing).items():
            trace_rounds.append(await self.trials.main(variant, state.variants[variant].harness, tasks))
            variants.update(dict.fromkeys(tasks, variant))
        self.progress.stage(t, "digest")
        facts = await Evidence(self.trials.log, self.run_id).attempts(trace_rounds)
        digests = digest_round(facts, variants, state.task_history(t))
        if self.prose is not None:
            digests = with_prose(digests, await self.prose(digests, t))
        digested = RoundDigested(run_id=self.run_id, round=t, actionability=round(actionability(digests), 4),
                                 digests=digests, trace_rounds=tuple(trace_rounds), rested=tuple(sorted(rested)))
        await self.append(digested)
        return digested

    def _recorded(self, t: int) -> RoundRecords:
        """What the ledger already recorded for round ``t`` (on a resume; empty otherwise)."""
        return self.state().ledger.rounds.get(t) or RoundRecords(t)

    async def _propose(self, t: int, landscape: LandscapePlanned,
                       digests: Sequence[TaskDigest]) -> tuple[list[CandidateProposed], list[str]]:
        recorded = self._recorded(t).proposed
        if recorded:
            return list(recorded), []
        self.progress.stage(t, "propose")
        context = Context(t, self.state(), landscape.landscape, tuple(digests))
        try:
            proposals = await self.evolver.propose(context, self.settings.candidates)
        except EvolverError as exc:
            return [], [f"evolver {self.evolver.name}: {exc}"]
        except Exception as exc:  # noqa: BLE001 - a broken evolver makes a no-op round, recorded with its reason
            return [], [f"evolver {self.evolver.name} failed: {type(exc).__name__}: {exc}"]
        notes = list(getattr(self.evolver, "notes", []))
        out = []
        for i, proposal in enumerate(proposals[: self.settings.candidates], 1):
            out.append(await self._candidate(t, f"C-R{t}-{i:02d}", proposal, context.state))
        await self.append(*out)
        return out, notes

    async def _candidate(self, t: int, cid: str, proposal: Proposal, state: RunState) -> CandidateProposed:
        return await candidate_of(proposal, state.variants[proposal.variant].harness, run_id=self.run_id,
                                  round=t, candidate=cid, evolver=self.evolver.name, code_check=self.code_check)

    async def _criticise(self, t: int, candidates: list[CandidateProposed], landscape: LandscapePlanned,
                         digests: Sequence[TaskDigest]) -> CriticJudged:
        recorded = self._recorded(t).critic
        if recorded is not None:
            return recorded
        self.progress.stage(t, "criticise")
        first = await self._review(t, candidates, digests, revised=False)
        context = Context(t, self.state(), landscape.landscape, tuple(digests))
        current = {c.candidate: c for c in candidates}
        for cid, request in first.revisions.items():
            cand = current[cid]
            backed = deterministic_critic.supported(cand, digests)
            try:
                proposal = await self.evolver.revise(context, Proposal(cand.variant, cand.operations, cand.manifest,
                                                                       cand.code), request, backed)
            except EvolverError:
                proposal = None
            if proposal is None:
                continue
            rebuilt = await self._candidate(t, cid, proposal, context.state)
            revision = CandidateRevised(run_id=self.run_id, round=t, candidate=cid, reason=request,
                                        operations=rebuilt.operations, manifest=rebuilt.manifest,
                                        digest=rebuilt.digest, build_error=rebuilt.build_error)
            await self.append(revision)
            current[cid] = revised(cand, revision)
        final = await self._review(t, list(current.values()), digests, revised=True)
        judged = CriticJudged(run_id=self.run_id, round=t, ranking=final.ranking, no_op=final.no_op,
                              concerns=final.concern_list(), revisions=tuple(first.revisions),
                              strategy_concern=final.strategy_concern, banned=final.banned,
                              critic="llm" if self.critic else "deterministic")
        await self.append(judged)
        return judged

    async def _review(self, t: int, candidates: Sequence[CandidateProposed], digests: Sequence[TaskDigest], *,
                      revised: bool) -> Review:
        if self.critic is not None:
            return await self.critic(self.state(), t, candidates, digests, revised)
        return deterministic_critic.review(self.state(), t, candidates, digests, revised=revised)

    # --- gate and ship ----------------------------------------------------------------------

    async def _gate_and_ship(self, t: int, judged: CriticJudged) -> RoundDecided:
        self.progress.stage(t, "gate")
        state = self.state()
        shipped: dict[str, list[CandidateProposed]] = {}
        forked = waiting = False
        rejected: list[str] = []
        for cid in judged.ranking:
            cand = state.candidates[cid].proposal
            variant = cand.variant
            taken = {b for c in shipped.get(variant, []) for b in c.buckets}
            if variant not in state.live() or (variant in shipped and taken & set(cand.buckets)) or (
                    forked and variant not in shipped):
                continue
            verdict, gate = await self._gate(t, cand, state)
            if not verdict.passed:
                rejected.append(f"{cid}: {gate.first_failure}")
                continue
            if cand.risk > self.settings.risk_threshold and not await self._approved(t, cand, verdict):
                waiting = waiting or self.state().candidates[cid].waiting
                continue
            if verdict.outcome == "fork":
                if not forked and self.settings.strategy == "ensemble":
                    await fork(self, t, cand, verdict, state, max_variants=self.settings.max_variants,
                               digests=self.trials.digests)
                    forked = True
                continue
            shipped.setdefault(variant, []).append(cand)
        for variant, cands in shipped.items():
            await ship(self, t, variant, cands)
        ids = tuple(c.candidate for cs in shipped.values() for c in cs)
        if ids or forked:
            done = [f"{len(cs)} edit(s) to {v}" for v, cs in shipped.items()] + ["a variant forked"] * forked
            why = ", ".join(done) + (f"; rejected {'; '.join(rejected)}" if rejected else "")
            return await self._decide(t, "shipped", why, shipped=ids)
        if waiting:
            return await self._decide(t, "waiting", "a candidate that passed the gate waits for approval")
        return await self._decide(t, "all_rejected", "; ".join(rejected) or "no candidate reached the gate")

    async def _gate(self, t: int, cand: CandidateProposed, state: RunState) -> tuple[Verdict, GateJudged]:
        recorded = state.candidates[cand.candidate].gate
        if recorded is not None:
            return Verdict.of(recorded), recorded
        base = state.variants[cand.variant].harness
        sources = await self.code_source(cand) if (cand.code and self.code_source) else ()
        verdict = await judge(cand, lambda: apply(base, cand.operations), base, self.trials, self.forbidden,
                              allow_fork=self.settings.strategy == "ensemble", code_check=self.code_check,
                              sources=sources)
        gate = GateJudged(run_id=self.run_id, round=t, candidate=cand.candidate, variant=cand.variant,
                          passed=verdict.passed, checks=tuple(verdict.checks), first_failure=verdict.first_failure,
                          flips=tuple(verdict.flips), outcome=verdict.outcome, clusters=verdict.clusters,
                          trace_rounds=verdict.trace_rounds)
        await self.append(gate)
        return verdict, gate

    async def _approved(self, t: int, cand: CandidateProposed, verdict: Verdict) -> bool:
        record = self.state().candidates[cand.candidate]
        if record.approval is not None:
            return record.approval
        if not record.waiting:
            await self.append(ApprovalRequested(run_id=self.run_id, round=t, candidate=cand.candidate,
                                                risk=cand.risk, reason=f"risk {cand.risk:.2f} > threshold "
                                                                       f"{self.settings.risk_threshold:.2f}"))
        if self.approver is None:
            return False
        answer = await self.approver(cand, verdict)
        await self.append(ApprovalGiven(run_id=self.run_id, candidate=cand.candidate, approved=answer, by="prompt"))
        return answer

    async def _decide(self, t: int, outcome: RoundOutcome, reason: str, shipped: tuple[str, ...] = ()) -> RoundDecided:
        state = self.state()
        idle = 0 if outcome == "shipped" else state.idle + 1
        decision = RoundDecided(run_id=self.run_id, round=t, outcome=outcome, reason=reason, shipped=shipped,
                                metrics=metrics(state, t, await self._rollouts(t)), idle=idle)
        await self.append(decision)
        return decision

    async def _rollouts(self, t: int) -> int:
        """The attempts round ``t`` ran, counted on the log: those of the trace rounds its digest and its gate
        verdicts cite. A round resumed after a kill counts what it used, as an uninterrupted one does."""
        rnd = self.state().ledger.rounds.get(t)
        if rnd is None:
            return 0
        cited = {*(rnd.digested.trace_rounds if rnd.digested else ()), *(r for g in rnd.gates.values()
                                                                         for r in g.trace_rounds)}
        marks = await trace_marks(self.trials.log, self.run_id) if cited else {}
        return sum(tr.finished.attempts for r in cited if (tr := marks.get(r)) and tr.finished is not None)
