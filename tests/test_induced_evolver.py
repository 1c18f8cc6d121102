"""The induction's traces and the induced evolvers on real ``hx evolve`` runs: ``read_traces`` against the log of a
small run; then, on a run of ``offline+induced``, rule candidates on the ledger with their support and evidence,
both evolvers in one round, no round without a candidate while rules are left to try, no rule judged twice on one
harness, and a rule suspected of a regression proposed for dropping.

Each run is made once per module; the unit-level tests read its trace through ``Evidence`` and build the run state
around it with ``LedgerRun``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import msgspec
import pytest
from hx_cli import hx, ok
from ledger_run import LedgerRun, attach
from textworld_express import TextWorldExpressEnv

from hx.aegis.errors import HeldoutAccess
from hx.aegis.evidence import Evidence
from hx.aegis.evolvers.base import Context, Proposal
from hx.aegis.evolvers.composite import CatalogAndInduced
from hx.aegis.evolvers.induced import InducedEvolver
from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.induction import InductionSettings, induce, read_traces
from hx.aegis.ledger import read_records
from hx.aegis.planner import plan
from hx.aegis.state import RunState
from hx.environments.twx import GAME_OPTIONS
from hx.harness.edits import apply, program_of
from hx.harnesses import starter_harness
from hx.replay.anchors import AnchorResolver
from schemas.edits import RULE_GROUP, AddRule, Attach, DropRule
from schemas.envelope import OpenedMessage
from schemas.landscape import Landscape, Regression, TaskDigest
from schemas.ledger import CandidateProposed, HeldoutScored, LedgerEvent, RoundDecided, RoundDigested
from schemas.rules import Rule, sentence
from schemas.tools import EnvObservation
from streams.channels import attempt_subject
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import TRACE, TraceAddress

RUN = "induced-run"
UNTRIED = re.compile(r"induced: (\d+) rule\(s\) from (\d+) attempt\(s\); (\d+) untried rule candidate\(s\) left")


@dataclass(frozen=True)
class Evolved:
    """Where the run is: its server."""

    url: str


@pytest.fixture(scope="module")
def evolved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evolved]:
    """Two rounds of ``offline+induced`` on eight arithmetic and eight sorting tasks (the tests only read it)."""
    root = tmp_path_factory.mktemp("induced")
    server = NatsProcess(root / "nats")
    server.start(detach=False)
    try:
        ok(hx("--nats-url", server.url, "--data-dir", str(root / "data"), "evolve", "--bench", "twx:arithmetic",
              "--bench", "twx:sorting", "--tasks", "8", "--heldout-tasks", "2", "--heldout-split", "train",
              "--rounds", "2", "--evolver", "offline+induced", "--run-id", RUN))
        yield Evolved(server.url)
    finally:
        server.stop()


@dataclass
class Seen:
    """The run as a test reads it: its ledger, its evidence, and round 0's digests and trace rounds."""

    records: list[LedgerEvent]
    evidence: Evidence
    digests: tuple[TaskDigest, ...]
    trace_rounds: tuple[int, ...]

    def proposed(self) -> list[CandidateProposed]:
        """Every candidate, in ledger order."""
        return [r for r in self.records if isinstance(r, CandidateProposed)]

    def context(self, run: LedgerRun, round: int = 0, digests: tuple[TaskDigest, ...] | None = None,
                landscape: Landscape | None = None) -> Context:
        """What an evolver sees in ``round`` of ``run``'s state, with this run's round-0 trace as the evidence."""
        digests = self.digests if digests is None else digests
        state = run.state
        return Context(round, state, landscape or plan(state, round, digests), digests, evidence=self.evidence,
                       trace_rounds=self.trace_rounds)


@asynccontextmanager
async def seen(evolved: Evolved) -> AsyncIterator[Seen]:
    """The run's ledger and evidence, on a connection open for the block."""
    async with connect(NatsSettings(url=evolved.url)) as conn:
        records = await read_records(conn, RUN)
        assert records is not None
        [digested] = [r for r in records if isinstance(r, RoundDigested) and r.round == 0]
        yield Seen(records, Evidence(conn.log, RUN), digested.digests, digested.trace_rounds)


def fresh_run() -> LedgerRun:
    """A ledger of the run's starting point (the textworld starter harness, on v0), nothing proposed yet."""
    return LedgerRun(starter_harness("textworld"), RUN)


def rules_of(proposals: list[Proposal]) -> list[AddRule]:
    """The rule additions among proposals."""
    return [op for p in proposals for op in p.operations if isinstance(op, AddRule)]


def untried(notes: list[str]) -> int:
    """How many rule candidates the induced evolver's notes say are left untried."""
    [match] = [m for m in map(UNTRIED.search, notes) if m]
    return int(match.group(3))


# --- read_traces on a small real run ------------------------------------------------------------------


@dataclass(frozen=True)
class SmallRun:
    """A small real ``hx evolve`` run on its own nats-server."""

    url: str
    run_id: str


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallRun]:
    """One round of the induced evolver on three arithmetic tasks, random agent (the tests only read it)."""
    root = tmp_path_factory.mktemp("induction-run")
    server = NatsProcess(root / "nats")
    server.start(detach=False)
    try:
        ok(hx("--nats-url", server.url, "--data-dir", str(root / "data"), "evolve", "--bench", "twx:arithmetic",
              "--tasks", "3", "--heldout-tasks", "1", "--heldout-split", "train", "--rounds", "1", "--max-steps",
              "15", "--evolver", "induced", "--run-id", "induction-traces"))
        yield SmallRun(server.url, "induction-traces")
    finally:
        server.stop()


def task_description(task: str) -> str:
    """What a real TextWorldExpress environment says the task ``twx:<game>:dev:<n>`` is."""
    _, game, split, n = task.split(":")
    env = TextWorldExpressEnv(envStepLimit=100)
    try:
        env.load(game, ",".join(f"{k}={v}" for k, v in GAME_OPTIONS[game].items()))
        _, info = env.reset(seed=10000 + int(n), gameFold=split)
        return str(info["taskDescription"])
    finally:
        env.close()


@pytest.mark.slow
async def test_read_traces_gives_every_adaptation_attempt_as_the_log_recorded_it(small_run: SmallRun) -> None:
    """Every attempt of the round's adaptation trace, each step's action, observation, offer and verdict as its
    ``env.observation`` event says, its anchor pointing at that event, and the task's text from step 0."""
    async with connect(NatsSettings(url=small_run.url)) as conn:
        records = await read_records(conn, small_run.run_id)
        assert records is not None
        [digested] = [r for r in records if isinstance(r, RoundDigested)]
        rounds = list(digested.trace_rounds)
        evidence = Evidence(conn.log, small_run.run_id)
        traces = await read_traces(evidence, rounds)
        facts = {(f.trace_round, f.task, f.attempt): f for f in await evidence.attempts(rounds)}
        assert sorted(t.key for t in traces) == sorted(facts) and len(traces) == 3 * 2

        descriptions = {task: task_description(task) for task in {t.task for t in traces}}
        for trace in traces:
            fact = facts[trace.key]
            assert trace.instruction == descriptions[trace.task] and trace.opening
            assert trace.passed == fact.passed and [s.action for s in trace.steps] == fact.actions
            assert trace.steps, trace.key
            assert [s.fatal for s in trace.steps] == [False] * (len(trace.steps) - 1) + [fact.env_failure]
            shown: list[EnvObservation] = []
            for s in trace.steps:
                msg = await conn.log.js.get_msg(TRACE.name, seq=s.anchor.seq)
                record = OpenedMessage(attempt_subject(msg.subject or ""), s.anchor.seq, msg.headers,
                                       msg.data or b"").record(s.anchor.index)
                event = record.event
                assert isinstance(event, EnvObservation), record.type
                address = TraceAddress.parse(record.subject)
                assert (address.round, address.task, address.attempt) == trace.key
                assert (event.info["action"], event.observation) == (s.action, s.observation)
                assert s.anchor.note == f"step {event.step}" and event.step == len(shown) + 1
                assert s.fatal == event.failure and s.rose == (event.score > (shown[-1].score if shown else 0.0)
                                                                or event.success)
                if shown:
                    assert s.offered == shown[-1].valid_actions  # what was on offer when the action was chosen
                shown.append(event)


@pytest.mark.slow
async def test_read_traces_refuses_a_heldout_round(small_run: SmallRun) -> None:
    """A held-out trace round, alone or among adaptation rounds, raises ``HeldoutAccess`` and reads nothing."""
    async with connect(NatsSettings(url=small_run.url)) as conn:
        records = await read_records(conn, small_run.run_id)
        assert records is not None
        heldout = [r.trace_round for r in records if isinstance(r, HeldoutScored)]
        [adaptation] = [r.trace_rounds for r in records if isinstance(r, RoundDigested)]
        evidence = Evidence(conn.log, small_run.run_id)
        assert heldout
        for asked in ([heldout[0]], [*adaptation, heldout[-1]]):
            with pytest.raises(HeldoutAccess, match="is a heldout round"):
                await read_traces(evidence, asked)
        assert await read_traces(evidence, []) == []


# --- the ledger of the offline+induced run ------------------------------------------------------------


@pytest.mark.slow
async def test_rule_candidates_carry_their_support_and_evidence_from_adaptation_steps(evolved: Evolved) -> None:
    """Each AddRule candidate holds the rule and its support (at least min_support tasks); its manifest says the
    rule as a sentence with that support, predicts flips on failing tasks only, and cites anchors that resolve to
    ``env.observation`` events of the round's adaptation trace."""
    async with seen(evolved) as run:
        by_round = {r.round: r for r in run.records if isinstance(r, RoundDigested)}
        with_rules = [c for c in run.proposed() if any(isinstance(op, AddRule) for op in c.operations)]
        assert with_rules and {c.round for c in with_rules} == {0, 1}, "both rounds propose rules"
        resolver = AnchorResolver(run.evidence.log, RUN)
        state = RunState.of(run.records[:1])
        for record in run.records[1:]:  # each candidate builds on its variant's harness of the moment
            if isinstance(record, CandidateProposed):
                base = state.variants[record.variant].harness
                assert record.base_digest == base.digest and apply(base, record.operations).digest == record.digest
            state.fold(record)
        for cand in with_rules:
            [op] = cand.operations
            assert isinstance(op, AddRule) and op.support is not None and op.group == RULE_GROUP
            assert op.support.tasks >= InductionSettings().min_support and op.support.attempts >= op.support.tasks
            assert cand.evolver == "offline+induced" and cand.manifest.attribution == RULE_GROUP
            assert cand.manifest.intended_effect == sentence(op.rule, op.support)
            assert [e.claim for e in cand.manifest.capability_evidence] == [sentence(op.rule)]
            digested = by_round[cand.round]
            failing = {d.task for d in digested.digests if not d.solved}
            assert cand.manifest.predicted_flips and set(cand.manifest.predicted_flips) <= failing
            assert 0 < len(cand.manifest.evidence) <= 8
            for anchor in await resolver.resolve_all(cand.manifest.evidence):
                assert anchor.resolved and anchor.type == EnvObservation.TYPE, anchor
                assert TraceAddress.parse(anchor.subject).round in digested.trace_rounds, anchor


@pytest.mark.slow
async def test_no_rule_is_proposed_twice_on_one_harness_and_no_round_lacks_a_candidate(evolved: Evolved) -> None:
    """Across the run's rounds, a rule judged on a variant's harness is not proposed on it again; every round had
    candidates (the catalog has none for these games: the induced evolver's), and a round without one would have
    had to say that no rule was left untried."""
    async with seen(evolved) as run:
        judged: set[tuple[str, str, str]] = set()
        for cand in run.proposed():
            for op in cand.operations:
                if isinstance(op, AddRule):
                    where = (cand.variant, cand.base_digest, sentence(op.rule))
                    assert where not in judged, where
                    judged.add(where)
        decided = [r for r in run.records if isinstance(r, RoundDecided)]
        assert [r.round for r in decided] == [0, 1]
        for r in decided:
            assert r.outcome != "no_candidate" or untried([r.reason]) == 0, r
        assert all(r.outcome != "no_candidate" for r in decided)


# --- the evolvers on the run's evidence ---------------------------------------------------------------


@pytest.mark.slow
async def test_both_evolvers_propose_in_one_round_taking_turns(evolved: Evolved) -> None:
    """Where the catalog has nothing for the failures, the composite's candidates are the induced evolver's; where
    both have some, they take turns (catalog, induced, catalog, ...), and the notes are both evolvers'."""
    async with seen(evolved) as run:
        ledger = fresh_run()
        context = run.context(ledger)
        assert await OfflineEvolver().propose(context, 4) == []  # these games' failures: no lever of the catalog
        composite = CatalogAndInduced()
        alone = await composite.propose(context, 4)
        assert alone == await InducedEvolver().propose(context, 4) and rules_of(alone)
        every = rules_of(await InducedEvolver().propose(context, 10_000))  # every new rule candidate of the round
        assert untried(composite.notes) == len(every) - len(rules_of(alone)) > 0

        # The same round where the failing tasks loop, a category library processors address.
        looping = tuple(d if d.solved else msgspec.structs.replace(d, category="loop") for d in run.digests)
        context = run.context(ledger, digests=looping)
        catalog, induced = await OfflineEvolver().propose(context, 4), await InducedEvolver().propose(context, 4)
        assert len(catalog) >= 2 and len(induced) >= 2
        both = await composite.propose(context, 4)
        assert [p.operations for p in both] == [p.operations for p in (catalog[0], induced[0], catalog[1], induced[1])]
        assert any(isinstance(op, Attach) for p in both for op in p.operations) and rules_of(both)
        # the induced evolver's notes say, counting only the rules this round takes (not all it offered)
        assert len(rules_of(induced)) > len(rules_of(both))
        assert untried(composite.notes) == len(rules_of(await InducedEvolver().propose(context, 10_000))) - len(
            rules_of(both))


@pytest.mark.slow
async def test_rules_are_proposed_round_after_round_until_none_is_left_and_never_twice(evolved: Evolved) -> None:
    """Recording each round's candidates as judged, the next round proposes rules while the notes said some were
    left, never one it proposed before, and runs out only with the notes saying none is left: by then it has
    proposed every induced rule that has a failing task to flip."""
    async with seen(evolved) as run:
        ledger = fresh_run()
        traces = await read_traces(run.evidence, list(run.trace_rounds))
        failing = {d.task for d in run.digests if not d.solved}
        expected = {f.rule for f in induce(traces) if set(f.tasks) & failing}
        evolver = CatalogAndInduced()
        tried: list[Rule] = []
        left = 0
        for round in range(60):
            proposals = await evolver.propose(run.context(ledger, round), 3)
            if left:  # the last round said rules were left untried: this one tries some
                assert rules_of(proposals), (round, left, evolver.notes)
            left = untried(evolver.notes)
            if not proposals:
                assert left == 0, evolver.notes
                break
            for i, p in enumerate(proposals, 1):
                ledger.proposed(round, f"C-R{round}-{i:02d}", p.operations)
            tried += [op.rule for op in rules_of(proposals)]
        else:
            pytest.fail("the evolvers never ran out of candidates")
        assert len(tried) == len(set(tried)) and set(tried) == expected and len(expected) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("support", ["same", "other"])
async def test_a_rule_judged_on_the_harness_is_not_proposed_again_whatever_its_support(evolved: Evolved,
                                                                                      support: str) -> None:
    """A rule judged on the variant's current harness is not proposed on it again, also when the evidence now
    counts it differently (a later round's attempts): its support does not change what the rule does."""
    async with seen(evolved) as run:
        ledger = fresh_run()
        [op] = rules_of(await InducedEvolver().propose(run.context(ledger), 1))
        assert op.support is not None
        judged = op if support == "same" else AddRule(rule=op.rule, support=msgspec.structs.replace(
            op.support, attempts=op.support.attempts + 1, steps=op.support.steps + 1))
        ledger.proposed(0, "C-R0-01", (judged,))
        again = await InducedEvolver().propose(run.context(ledger, 1), 100)
        assert rules_of(again) and op.rule not in [o.rule for o in rules_of(again)]


@pytest.mark.slow
async def test_a_shipped_rule_suspected_of_a_regression_is_proposed_for_dropping(evolved: Evolved) -> None:
    """A regression whose suspects shipped a rule and an attachment: the induced evolver proposes dropping the rule
    first (predicting the regressed task back), and nothing for the attachment, which is the catalog's to revert;
    the drop leaves the harness without the interpreter. A regression on another variant drops nothing."""
    async with seen(evolved) as run:
        ledger = fresh_run()
        [op] = rules_of(await InducedEvolver().propose(run.context(ledger), 1))
        ledger.ship(0, "C-R0-01", (op,), ())
        ledger.ship(0, "C-R0-02", (attach("explore_untried"),), ())
        harness = ledger.state.variants["v0"].harness
        assert program_of(harness, RULE_GROUP) == (op.rule,)
        task = run.digests[0].task
        regressed = Regression(task=task, variant="v0", since_round=0, suspects=("C-R0-01", "C-R0-02"))
        proposals = await InducedEvolver().propose(run.context(ledger, 1, landscape=Landscape(
            regressions=(regressed,))), 3)
        drop = proposals[0]
        assert drop.operations == (DropRule(rule=op.rule),) and drop.variant == "v0"
        assert drop.manifest.predicted_flips == (task,) and drop.manifest.attribution == RULE_GROUP
        assert "C-R0-01" in drop.manifest.intended_effect and sentence(op.rule) in drop.manifest.intended_effect
        assert [p for p in proposals if any(isinstance(o, DropRule) for o in p.operations)] == [drop]
        assert program_of(apply(harness, drop.operations), RULE_GROUP) == ()
        assert op.rule not in [o.rule for o in rules_of(proposals)]  # a rule the harness holds is not added again

        elsewhere = msgspec.structs.replace(regressed, variant="v1")
        others = await InducedEvolver().propose(run.context(ledger, 1, landscape=Landscape(
            regressions=(elsewhere,))), 3)
        assert not any(isinstance(o, DropRule) for p in others for o in p.operations)
