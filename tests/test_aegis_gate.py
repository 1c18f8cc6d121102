"""The gate, the critic and the counterfactual replay on their own.

The gate's checks run in a fixed order and the first failure decides: a candidate failing an early
check is rejected with that check named, and nothing after it runs (no replay, no rollout). The
seesaw and effect decisions need fresh attempts, so those tests run the real ``Trials`` on the toy
world against the test's own nats-server (a fraction of a second each). The critic and the replay
are pure: they are fed ledger records and hook records built here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from ledger_run import attach
from toyworld import ToyWorld

import hx.harness.processor as processor_module
from hx.aegis.counterfactual import replay
from hx.aegis.critic import LOW_HIT_RATE, STREAK, audit, review, supported
from hx.aegis.digester import digest_round
from hx.aegis.evidence import Evidence
from hx.aegis.gate import Forbidden, judge
from hx.aegis.operations import buckets_of
from hx.aegis.smoke import SandboxCodeCheck
from hx.aegis.state import RunState
from hx.aegis.trials import RETRIES, Trials
from hx.environments.rollout import RolloutSettings
from hx.environments.splits import Splits
from hx.gate.rule import CHECKS, FORK_MARGIN, Fresh, Verdict, cluster_of, seesaw
from hx.gate.sequential import Tries
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from hx.harness.processor import build, processor_type
from hx.harnesses import starter_harness
from hx.runtime.code import CodeStore
from hx.runtime.models import ModelConfig
from hx.runtime.pipeline import HookPipeline
from schemas.edits import Anchor, AnyEditOp, Attach, Manifest, Remove, Reparam
from schemas.envelope import Record
from schemas.event import Event
from schemas.hooks import (
    HOOK_OF,
    AfterModel,
    AfterTool,
    BeforeModel,
    BeforeTool,
    HookPayload,
    StepEnd,
    StepStart,
    TaskEnd,
    TaskStart,
)
from schemas.landscape import TaskDigest
from schemas.ledger import CandidateProposed, HarnessShipped, LedgerEvent, LedgerOpened, RoundDigested
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema
from streams.config import NatsSettings
from streams.connection import Connection, connect

BASE = starter_harness("textworld")
K = 2
NOTE = (Path(__file__).parent / "fixtures" / "aegis" / "step_note.py.txt").read_text()


@pytest.fixture
async def conn(nats_url: str) -> AsyncIterator[Connection]:
    """A connection to the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as c:
        yield c


def toy_tasks(per_game: int) -> list[str]:
    """The first dev tasks of both toy games."""
    bench = ToyWorld()
    return [str(t) for g in bench.games() for t in bench.task_ids(g, "dev", limit=per_game)]


def trials_on(conn: Connection, run: str, tasks: Sequence[str]) -> Trials:
    """The real rollout runner of an evolution run on the toy world (k = ``K`` paired attempts)."""
    return Trials(conn.log, run, [ToyWorld()], ModelConfig(), RolloutSettings(attempts=K, max_steps=30, seed=3),
                  Splits.of(tasks), next_round=0)


async def main_round(trials: Trials, harness: HarnessConfig, tasks: Sequence[str]) -> tuple[TaskDigest, ...]:
    """The variant's main rollout, digested from the log, set as the gate's reference."""
    trace_round = await trials.main("v0", harness, tasks)
    digests = digest_round(await Evidence(trials.log, trials.run_id).attempts([trace_round]), {}, {})
    trials.digests = {"v0": digests}
    return digests


def manifest(flips: Sequence[str] = ("toyworld:rooms:dev:0",), **fields: object) -> Manifest:
    """A complete manifest predicting ``flips``."""
    values: dict[str, object] = {"intended_effect": "let the attempts run longer", "categories": ("interrupted",),
                                 "predicted_flips": tuple(flips), "evidence": (Anchor(seq=7, note="interrupted"),),
                                 "attribution": "budget"}
    values.update(fields)
    return Manifest(**values)  # type: ignore[arg-type]


def candidate(ops: tuple[AnyEditOp, ...], base: HarnessConfig = BASE, m: Manifest | None = None,
              **fields: object) -> CandidateProposed:
    """A proposed candidate on ``base`` whose digest is that of its operations (unless given)."""
    values: dict[str, object] = {"run_id": "gate-run", "round": 0, "candidate": "C-R0-01", "variant": "v0",
                                 "evolver": "test", "operations": ops, "buckets": buckets_of(ops),
                                 "manifest": m or manifest(), "base_digest": base.digest}
    if "digest" not in fields:
        try:
            values["digest"] = apply(base, ops).digest
        except CompositionError:  # a candidate that does not build has no digest
            values["digest"] = ""
    values.update(fields)
    return CandidateProposed(**values)  # type: ignore[arg-type]


async def gate(cand: CandidateProposed, trials: Trials, base: HarnessConfig = BASE,
               forbidden: Forbidden | None = None, *, allow_fork: bool = False, **kw: object) -> Verdict:
    """The gate's verdict on ``cand``, built from its operations on ``base``."""
    return await judge(cand, lambda: apply(base, cand.operations), base, trials,
                       forbidden or Forbidden.of([], [], []), allow_fork=allow_fork, **kw)  # type: ignore[arg-type]


def names(verdict: Verdict) -> list[str]:
    """The checks the gate ran, in order."""
    return [c.name for c in verdict.checks]


def untouched(trials: Trials) -> bool:
    """True when the gate ran no rollout and claimed no trace round."""
    return trials.next_round == 0 and trials.rollouts == 0


RELAX = (Reparam(group="budget", params={"max_tokens": 2_000_000}),)


# --- the leakage list -------------------------------------------------------------------------------


def test_forbidden_texts_are_task_ids_gold_pairs_and_answers() -> None:
    """Task ids, two consecutive gold actions in the usual joinings, and answers of four characters or more."""
    f = Forbidden.of(["TWX:Coin:dev:3"], [["open door to east", "move east", "take coin"]], ["4711", "no", "Paris"])
    assert "twx:coin:dev:3" in f.texts
    for joined in ("open door to east, move east", "move east then take coin", "open door to east\nmove east",
                   "move east; take coin", "move east and take coin"):
        assert joined in f.texts
    assert "open door to east, take coin" not in f.texts  # not consecutive
    assert {"4711", "paris"} <= set(f.texts) and "no" not in f.texts
    assert "take coin" not in f.texts  # one gold action alone is no leak


def test_forbidden_texts_are_found_whatever_their_case_and_wherever_they_sit() -> None:
    """The scan is case-insensitive and looks into every asset; a clean candidate yields ""."""
    f = Forbidden.of(["toyworld:rooms:dev:3"], [["open door to east", "move east"]], ["brass key"])
    assert f.found(["Be careful.", "First OPEN DOOR TO EAST, then Move East."]) == ""  # ", then " is not a joining
    assert f.found(["Be careful.", "First OPEN DOOR TO EAST, Move East."]) == "open door to east, move east"
    assert f.found(["The Brass Key opens it."]) == "brass key"
    assert f.found(["see Toyworld:Rooms:Dev:3"]) == "toyworld:rooms:dev:3"
    assert f.found(["Explore every room; open doors before moving."]) == ""
    assert Forbidden.of([], [], []).found(["anything at all"]) == ""


def test_the_leak_the_gate_names_does_not_depend_on_the_process() -> None:
    """An asset holding several forbidden texts is reported the same way in every process."""
    code = ("from hx.aegis.gate import Forbidden\n"
            "f = Forbidden.of(['toyworld:rooms:dev:1', 'toyworld:rooms:dev:10'], [['open door to east', 'move east',"
            " 'take coin']], [])\n"
            "print(f.found(['go to toyworld:rooms:dev:10: open door to east, move east, take coin']))\n")
    seen = set()
    for seed in ("1", "2", "3", "4", "5", "6"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        seen.add(out.stdout.strip())
    assert len(seen) == 1, seen


# --- the order of the checks ------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["intended_effect", "predicted_flips", "evidence", "attribution"])
async def test_an_incomplete_manifest_is_rejected_first(conn: Connection, missing: str) -> None:
    """A manifest lacking what it does, which tasks flip, its evidence or its attribution stops at ``manifest``."""
    trials = trials_on(conn, "gate-manifest", toy_tasks(2))
    empty = {"intended_effect": "", "predicted_flips": (), "evidence": (), "attribution": ""}[missing]
    verdict = await gate(candidate(RELAX, m=manifest(**{missing: empty})), trials)
    assert names(verdict) == ["manifest"] and verdict.first_failure == "manifest"
    assert verdict.checks[0].detail == f"missing: {missing.replace('_', ' ')}"
    assert verdict.outcome == "reject" and not verdict.passed and untouched(trials)
    bare = await gate(candidate(RELAX, m=Manifest()), trials)
    assert bare.checks[0].detail == "missing: intended effect, predicted flips, evidence, attribution"


async def test_a_candidate_that_does_not_build_stops_at_config(conn: Connection) -> None:
    """Operations that do not compose fail ``config`` with the builder's reason (or the recorded build error)."""
    trials = trials_on(conn, "gate-config", toy_tasks(2))
    bad = (Attach(processor="memory_palace", hooks=("before_model",)),)
    verdict = await gate(candidate(bad), trials)
    assert names(verdict) == ["manifest", "config"] and verdict.first_failure == "config"
    assert "unknown processor 'memory_palace'" in verdict.checks[1].detail
    recorded = await gate(candidate(bad, build_error="operation 1 (attach memory_palace): unknown"), trials)
    assert recorded.checks[1].detail == "operation 1 (attach memory_palace): unknown"
    assert untouched(trials)


async def test_a_no_op_or_a_mislabelled_candidate_stops_at_config(conn: Connection) -> None:
    """An edit that changes nothing, or whose harness is not the one proposed, fails ``config``."""
    trials = trials_on(conn, "gate-noop", toy_tasks(2))
    current = next(a for a in BASE.attachments if a.group() == "budget").params
    same = (Reparam(group="budget", params=dict(current)),)
    noop = await gate(candidate(same), trials)
    assert names(noop) == ["manifest", "config"] and "changes nothing" in noop.checks[1].detail
    other = apply(BASE, (Remove(group="budget"),)).digest
    wrong = await gate(candidate(RELAX, digest=other), trials)
    assert names(wrong) == ["manifest", "config"]
    assert f"differs from the proposed {other[:19]}" in wrong.checks[1].detail
    assert untouched(trials)


async def test_new_code_without_a_sandbox_stops_at_config(conn: Connection, tmp_path: Path) -> None:
    """A candidate bringing code is never built in the main process unless a sandbox vouched for it."""
    trials = trials_on(conn, "gate-code", toy_tasks(2))
    store = CodeStore(conn.log, tmp_path / "plugins")
    asset = await store.put("note.py", NOTE)
    cand = candidate((Attach(processor=asset.processor, hooks=("before_model",)),), code=(asset,), digest="")
    verdict = await gate(cand, trials)
    assert names(verdict) == ["manifest", "config"]
    assert "no sandbox is configured" in verdict.checks[1].detail
    assert asset.processor.partition(":")[0] not in sys.modules and untouched(trials)


async def test_new_code_that_breaks_when_run_stops_at_smoke(conn: Connection, tmp_path: Path) -> None:
    """Code that builds but raises when a hook event reaches it passes ``config`` and fails ``smoke``."""
    trials = trials_on(conn, "gate-smoke", toy_tasks(2))
    store = CodeStore(conn.log, tmp_path / "plugins")
    source = NOTE.replace("note = Message(", "raise ValueError('broken in process')\n        note = Message(")
    asset = await store.put("note.py", source)
    ops = (Attach(processor=asset.processor, hooks=("before_model",)),)
    checker = SandboxCodeCheck(store)
    digest, config_error, _ = await checker(BASE, candidate(ops, code=(asset,), digest=""))  # as the loop proposes
    assert digest.startswith("sha256:") and config_error == ""
    cand = candidate(ops, code=(asset,), digest=digest)
    verdict = await judge(cand, lambda: pytest.fail("the main process must not build unproven code"), BASE, trials,
                          Forbidden.of([], [], []), allow_fork=False, code_check=checker)
    assert names(verdict) == ["manifest", "config", "smoke"]
    assert verdict.checks[1].passed and not verdict.checks[2].passed
    assert "broken in process" in verdict.checks[2].detail
    assert not store.path_of(asset).exists() and asset.processor.partition(":")[0] not in sys.modules
    assert untouched(trials)


@pytest.mark.parametrize(("template", "leak"), [
    ("You play a game. Remember toyworld:rooms:dev:3 well. $instruction", "toyworld:rooms:dev:3"),
    ("You play a game. $instruction\nHint: Open door to east; move east.", "open door to east; move east"),
    ("You play a game. $instruction The code is BRASS-4711.", "brass-4711"),
])
async def test_a_candidate_holding_a_forbidden_text_stops_at_leakage(conn: Connection, template: str,
                                                                      leak: str) -> None:
    """Task ids, gold action pairs and answers in a candidate's parameters are caught before any replay or rollout."""
    trials = trials_on(conn, "gate-leak", toy_tasks(2))
    forbidden = Forbidden.of(["toyworld:rooms:dev:3"], [["open door to east", "move east"]], ["brass-4711"])
    ops = (Reparam(group="system_prompt_template", params={"template": template}),)
    verdict = await gate(candidate(ops), trials, forbidden=forbidden)
    assert names(verdict) == ["manifest", "config", "smoke", "leakage"]
    assert verdict.checks[3].detail == f"an asset holds {leak!r}" and verdict.first_failure == "leakage"
    assert untouched(trials)


async def test_a_candidate_that_changes_what_happens_on_solved_attempts_stops_at_counterfactual(
        conn: Connection) -> None:
    """A tighter budget replayed over the main rollout's solved attempts would interrupt them: no rollout runs."""
    tasks = toy_tasks(4)
    trials = trials_on(conn, "gate-cf", tasks)
    digests = await main_round(trials, BASE, tasks)
    assert any(d.solved for d in digests)
    tight = (Reparam(group="budget", params={"max_model_calls": 1}),)
    before = (trials.next_round, trials.rollouts)
    verdict = await gate(candidate(tight, m=manifest([d.task for d in digests if not d.solved])), trials)
    assert names(verdict) == ["manifest", "config", "smoke", "leakage", "counterfactual"]
    assert verdict.first_failure == "counterfactual" and "the candidate interrupts the attempt" in \
        verdict.checks[-1].detail
    assert (trials.next_round, trials.rollouts) == before and verdict.flips == []


# --- seesaw and effect, on fresh attempts --------------------------------------------------------------


async def test_relaxing_a_budget_that_cut_attempts_short_ships(conn: Connection) -> None:
    """Every check passes in order: solved tasks hold on their paired seeds and some predicted flips pass."""
    tasks = toy_tasks(5)
    trials = trials_on(conn, "gate-ship", tasks)
    tight = apply(BASE, (Reparam(group="budget", params={"max_model_calls": 3}),))
    digests = await main_round(trials, tight, tasks)
    flips = [d.task for d in digests if not d.solved]
    assert flips and {d.category for d in digests if not d.solved} >= {"interrupted"}
    relax = (Reparam(group="budget", params={"max_model_calls": 0}),)
    verdict = await gate(candidate(relax, base=tight, m=manifest(flips)), trials, base=tight)
    assert names(verdict) == list(CHECKS) and all(c.passed for c in verdict.checks)
    assert verdict.outcome == "ship" and verdict.passed and verdict.first_failure == ""
    by = {f.task: f for f in verdict.flips}
    assert set(by) == {d.task for d in digests if d.solved} | set(flips)
    assert all(f.after for f in verdict.flips if f.before)  # no solved task lost
    assert any(by[t].after for t in flips)
    assert all(f.attempts == K and f.after == (f.passes > 0) for f in verdict.flips)
    assert verdict.trace_rounds and trials.next_round == 1 + len(verdict.trace_rounds)


async def test_an_edit_that_changes_nothing_in_practice_fails_effect(conn: Connection) -> None:
    """A harmless edit keeps every solved task but realises no predicted flip: rejected at ``effect``."""
    tasks = toy_tasks(4)
    trials = trials_on(conn, "gate-effect", tasks)
    digests = await main_round(trials, BASE, tasks)
    limit = next(a for a in BASE.attachments if a.group() == "observation_trim").params["max_chars"]
    ops = (Reparam(group="observation_trim", params={"max_chars": limit + 1}),)  # no toy observation is that long
    flips = [d.task for d in digests if not d.solved]
    verdict = await gate(candidate(ops, m=manifest(flips)), trials)
    assert names(verdict) == list(CHECKS) and verdict.first_failure == "effect"
    assert [c.passed for c in verdict.checks] == [True] * 6 + [False]
    assert verdict.checks[-1].detail == f"0 of {len(flips)} predicted flip(s) realised"
    assert all(f.after == f.before for f in verdict.flips)  # the same seeds, the same outcomes
    assert verdict.outcome == "reject"


async def test_an_edit_that_breaks_solved_tasks_fails_the_seesaw_or_forks(conn: Connection) -> None:
    """Solved tasks lost on every paired seed and every retry regress: reject, or fork where it gains enough."""
    tasks = toy_tasks(8)
    trials = trials_on(conn, "gate-seesaw", tasks)
    digests = await main_round(trials, BASE, tasks)
    op = Attach(processor="task_objects", hooks=processor_type("task_objects").accepted_hooks())
    m = manifest([d.task for d in digests if not d.solved], attribution="task_objects")
    closing = await gate(candidate((op,), m=m), trials, allow_fork=True)  # it rings the bell: a winning path closed
    assert closing.first_failure == "counterfactual" and closing.outcome == "reject"
    assert "toyworld:bell:" in closing.checks[-1].detail
    assert "'move east' no longer offered (by task_objects)" in closing.checks[-1].detail  # the one that did it
    trials.main_rounds.clear()  # no recorded attempt to replay (nothing closes a path): the fresh attempts decide
    rejected = await gate(candidate((op,), m=m), trials, allow_fork=False)
    assert names(rejected) == list(CHECKS[:-1]) and rejected.first_failure == "seesaw"  # no effect check
    regressed = [f for f in rejected.flips if f.before and not f.after]
    assert regressed and rejected.outcome == "reject" and rejected.clusters == ()
    assert all(f.attempts == K * (1 + RETRIES) and f.passes == 0 for f in regressed)
    assert f"e.g. {regressed[0].task!r}" in rejected.checks[-1].detail
    forked = await gate(candidate((op,), m=m), trials, allow_fork=True)
    assert forked.flips == rejected.flips  # the same paired seeds and retries: the same attempts
    assert forked.first_failure == "seesaw" and forked.outcome == "fork" and forked.passed
    gains = Counter(cluster_of(f.task) for f in forked.flips if not f.before and f.after)
    losses = Counter(cluster_of(f.task) for f in forked.flips if f.before and f.attempts > K)  # retried: lost
    hurt = {cluster_of(f.task) for f in regressed}
    assert forked.clusters and forked.clusters == tuple(sorted(c for c in gains
                                                               if gains[c] - losses[c] >= FORK_MARGIN
                                                               and c not in hurt))
    assert not hurt & set(forked.clusters)  # a fork never serves a cluster where a solved task regressed


# --- the critic ---------------------------------------------------------------------------------------


def digest(task: str, *, passes: int = 0, category: str = "loop", evidence: int = 1) -> TaskDigest:
    """One task of the round."""
    return TaskDigest(task=task, cluster=":".join(task.split(":")[:2]), attempts=2, passes=passes,
                      category="" if passes else category, evidence=(Anchor(seq=evidence),))


ROUND = (digest("b:g:dev:1"), digest("b:g:dev:2"), digest("b:g:dev:3", category="stagnation"),
         digest("b:g:dev:4", passes=1), digest("b:g:dev:5", category="premature_answer"))


def proposal(cid: str, ops: tuple[AnyEditOp, ...], flips: Sequence[str], categories: Sequence[str],
             *, evidence: bool = True, build_error: str = "") -> CandidateProposed:
    """A candidate with a manifest claiming ``categories`` and predicting ``flips``."""
    m = Manifest(intended_effect="x", categories=tuple(categories), predicted_flips=tuple(flips),
                 evidence=(Anchor(seq=1),) if evidence else (), attribution="x")
    return candidate(ops, m=m, candidate=cid, build_error=build_error,
                     digest="" if build_error else apply(BASE, ops).digest)


def opened() -> LedgerOpened:
    """The first record of a run on the starter harness."""
    return LedgerOpened(run_id="gate-run", strategy="ensemble", harness=BASE.spec(), digest=BASE.digest)


def test_a_prediction_is_supported_by_a_failing_task_of_a_claimed_category() -> None:
    """Backed: failing this round, in a category the manifest claims; a revert's flips need only be failing."""
    cand = proposal("C1", (attach("visited_states"),), ["b:g:dev:1", "b:g:dev:3", "b:g:dev:4", "b:g:dev:5",
                                                         "b:g:dev:99"], ["loop"])
    assert supported(cand, ROUND) == ("b:g:dev:1",)
    wider = proposal("C2", (attach("visited_states"),), ["b:g:dev:1", "b:g:dev:3"], ["loop", "stagnation"])
    assert supported(wider, ROUND) == ("b:g:dev:1", "b:g:dev:3")
    revert = proposal("C3", (Remove(group="loop_detector"),), ["b:g:dev:5", "b:g:dev:4", "b:g:dev:99"], [])
    assert supported(revert, ROUND) == ("b:g:dev:5",)


def test_the_critic_asks_once_for_a_revision_where_the_manifest_overreaches() -> None:
    """First pass: unbacked predictions or no evidence ask for a revision; the second pass asks nothing."""
    state = RunState.of([opened()])
    cands = [proposal("C1", (attach("visited_states"),), ["b:g:dev:1", "b:g:dev:5"], ["loop"]),
             proposal("C2", (attach("undo_guard"),), ["b:g:dev:2"], ["loop"], evidence=False),
             proposal("C3", (attach("explore_untried"),), ["b:g:dev:1", "b:g:dev:2"], ["loop"])]
    first = review(state, 0, cands, ROUND, revised=False)
    assert set(first.revisions) == {"C1", "C2"}
    assert "1 predicted flip(s) not backed" in first.revisions["C1"] and "'b:g:dev:5'" in first.revisions["C1"]
    assert first.revisions["C2"] == "no evidence anchor"
    assert first.concerns["C3"] == [] and [c.candidate for c in first.concern_list()] == ["C1", "C2"]
    second = review(state, 0, cands, ROUND, revised=True)
    assert second.revisions == {} and second.concerns == first.concerns


def test_the_ship_ranking_orders_supported_flips_and_leaves_out_the_unsupported() -> None:
    """Most supported flips first (ties by id); no backed flip or a build error: not ranked; none left: no-op."""
    state = RunState.of([opened()])
    cands = [proposal("C1", (attach("visited_states"),), ["b:g:dev:1"], ["loop"]),
             proposal("C2", (attach("undo_guard"),), ["b:g:dev:1", "b:g:dev:2"], ["loop"]),
             proposal("C0", (attach("explore_untried"),), ["b:g:dev:2"], ["loop"]),
             proposal("C3", (attach("self_check"),), ["b:g:dev:4"], ["premature_answer"]),
             proposal("C4", (Attach(processor="memory_palace", hooks=("after_tool",)),), ["b:g:dev:1"], ["loop"],
                      build_error="unknown processor 'memory_palace'")]
    got = review(state, 0, cands, ROUND, revised=False)
    assert got.ranking == ("C2", "C0", "C1") and not got.no_op
    assert "C4" not in got.revisions and got.concerns["C4"][0].startswith("does not build")
    assert review(state, 0, cands[3:], ROUND, revised=True).no_op


class Ledger:
    """A run's ledger of ships with their predictions and the next rounds' outcomes."""

    def __init__(self) -> None:
        self.records: list[LedgerEvent] = [opened()]
        self.harness = BASE

    def ship(self, round: int, cid: str, ops: tuple[AnyEditOp, ...], flips: Sequence[str]) -> None:
        """Record a candidate and its ship."""
        after = apply(self.harness, ops)
        self.records.append(candidate(ops, base=self.harness, m=manifest(flips), candidate=cid, round=round))
        self.records.append(HarnessShipped(run_id="gate-run", round=round, variant="v0", candidates=(cid,),
                                           digest_before=self.harness.digest, digest_after=after.digest,
                                           operations=ops, harness=after.spec()))
        self.harness = after

    def outcome(self, round: int, passed: Sequence[str], failed: Sequence[str]) -> None:
        """Record a round's digests."""
        digests = [digest(t, passes=1) for t in passed] + [digest(t) for t in failed]
        self.records.append(RoundDigested(run_id="gate-run", round=round, actionability=1.0, digests=tuple(digests)))

    @property
    def state(self) -> RunState:
        """The run's state."""
        return RunState.of(self.records)


def test_the_audit_raises_a_concern_after_a_streak_in_one_bucket() -> None:
    """``STREAK`` ships in a row that all edit one bucket raise a strategy concern naming it; fewer do not."""
    ledger = Ledger()
    for i, name in enumerate(("visited_states", "undo_guard", "explore_untried")[:STREAK]):
        ledger.ship(i, f"C-R{i}-01", (attach(name),), [])
        concern, banned = audit(ledger.state, i)
        assert bool(concern) is (i == STREAK - 1) and banned == ()
    assert "processor bucket" in concern
    ledger.ship(STREAK, "C-R3-01", (attach("task_notes"),), [])
    assert audit(ledger.state, STREAK) == ("", ())  # the last STREAK ships share no bucket any more


def test_the_audit_bans_a_lever_that_keeps_missing_its_predictions() -> None:
    """A lever realising under ``LOW_HIT_RATE`` of its flips in two of its last three rounds is banned."""
    ledger = Ledger()
    ledger.outcome(0, [], ["b:g:dev:1", "b:g:dev:2", "b:g:dev:3"])
    ledger.ship(0, "C-R0-01", (attach("visited_states"),), ["b:g:dev:1", "b:g:dev:2", "b:g:dev:3"])
    ledger.ship(0, "C-R0-02", (attach("task_notes"),), ["b:g:dev:3"])
    ledger.outcome(1, ["b:g:dev:3"], ["b:g:dev:1", "b:g:dev:2"])  # visited_states 1/3, task_notes 1/1
    assert LOW_HIT_RATE > 1 / 3
    ledger.ship(1, "C-R1-01", (Remove(group="visited_states"),), [])
    ledger.ship(1, "C-R1-02", (attach("visited_states"),), ["b:g:dev:1", "b:g:dev:2"])
    assert audit(ledger.state, 1)[1] == ()  # one bad round is not a pattern
    ledger.outcome(2, [], ["b:g:dev:1", "b:g:dev:2"])  # visited_states 0/2
    concern, banned = audit(ledger.state, 2)
    assert banned == ("visited_states",)
    assert "lever visited_states realised under 40%" in concern
    assert review(ledger.state, 2, [], ROUND, revised=False).banned == banned
    ledger.outcome(3, [], ["b:g:dev:1", "b:g:dev:2"])  # banned, it shipped nothing: no news about it
    assert audit(ledger.state, 3) == ("", ())  # the ban lapses after its round


# --- counterfactual replay ------------------------------------------------------------------------------


ACT = ToolSchema(name="act", description="Take one action.", input_schema={
    "type": "object", "required": ["action"],
    "properties": {"action": {"type": "string", "enum": ["go north", "go south", "look"]}}})


def attempt_events(calls: Sequence[str], outputs: Sequence[str], answer: str = "") -> list[HookPayload]:
    """The hook events of a small text-game attempt, in run order: one tool call per step, then the end."""
    task = TaskSpec(id="toyworld:rooms:dev:0", instruction="Find the coin.")
    events: list[HookPayload] = [TaskStart(task=task, system_prompt="You play.", tools=(ACT,))]
    messages: tuple[Message, ...] = (Message(role="system", content="You play."),
                                     Message(role="user", content="Find the coin."))
    step = 0
    for step, (action, output) in enumerate(zip(calls, outputs, strict=True), 1):
        call = ToolCall(id=f"c{step}", name="act", input={"action": action})
        events += [StepStart(step=step, messages=messages), BeforeModel(step=step, messages=messages, tools=(ACT,)),
                   AfterModel(step=step, tool_calls=(call,)), BeforeTool(step=step, call=call, offered=("act",)),
                   AfterTool(step=step, call=call, result=ToolResult(call_id=call.id, name="act", output=output))]
        messages = (*messages, Message(role="assistant", tool_calls=(call,)),
                    Message(role="tool", content=output, tool_call_id=call.id, name="act"))
        events.append(StepEnd(step=step, messages=messages, done=step == len(calls) and not answer))
    if answer:
        step += 1
        events += [StepStart(step=step, messages=messages), BeforeModel(step=step, messages=messages, tools=(ACT,)),
                   AfterModel(step=step, content=answer), StepEnd(step=step, messages=messages, done=True)]
    events.append(TaskEnd(task_id=task.id, passed=True, score=1.0, steps=step))
    return events


async def recorded(harness: HarnessConfig, events: Sequence[HookPayload]) -> list[Record]:
    """What the run loop's pipelines log for ``events`` under ``harness``, as log records."""
    out: list[Event] = []
    pipes = {hook: HookPipeline(hook, procs, out.append) for hook, procs in harness.instantiate().items()}
    for event in events:
        await pipes[HOOK_OF[type(event)]].run(event, getattr(event, "step", 0))
    return [Record(seq=i, index=0, subject="hx.trace.gate-run.0.toyworld:rooms:dev:0.0", type=type(e).TYPE,
                   version=type(e).VERSION, time_ns=0, event=e) for i, e in enumerate(out, 1)]


EVENTS = attempt_events([" Go North", "look", "go south"], ["You are in the hall.", "x" * 500, "You win."])


def with_processor(base: HarnessConfig, name: str, **params: object) -> HarnessConfig:
    """``base`` with a library processor attached at every hook it serves."""
    return base.attach(processor_type(name).accepted_hooks(), build(name, dict(params)))


async def test_replaying_under_the_recorded_harness_changes_nothing() -> None:
    """The recorded harness, or one adding a pure observer, returns at every hook what it returned before."""
    for harness in (HarnessConfig(), BASE):
        records = await recorded(harness, EVENTS)
        assert await replay(harness, records) == ("same", "every hook returned what it did before")
    records = await recorded(HarnessConfig(), EVENTS)
    assert (await replay(with_processor(HarnessConfig(), "loop_detector"), records))[0] == "same"


async def test_changing_what_the_model_sees_diverges_and_concludes_nothing() -> None:
    """A trimmed observation or a shorter history changes the model's input: the replay stops there, ``diverged``."""
    records = await recorded(HarnessConfig(), EVENTS)
    trimmed = await replay(with_processor(HarnessConfig(), "observation_trim", max_chars=100), records)
    assert trimmed == ("diverged", "step 2 after_tool: the model's input changes")
    window = await replay(with_processor(HarnessConfig(), "history_window", keep_last=1), records)
    assert window[0] == "diverged" and window[1].endswith("step_start: the model's input changes")
    removed = await replay(HarnessConfig(), await recorded(with_processor(HarnessConfig(), "observation_trim",
                                                                          max_chars=100), EVENTS))
    assert removed[0] == "diverged"  # taking a processor away changes what it used to return, too


async def test_changing_what_happens_with_the_same_input_is_a_change() -> None:
    """Correcting a tool call or interrupting the attempt, while the model saw the same input: ``changed``."""
    records = await recorded(HarnessConfig(), EVENTS)
    corrected = await replay(with_processor(HarnessConfig(), "tool_call_corrector"), records)
    assert corrected == ("changed", "step 1 before_tool: the candidate changes what happens with the same model input")
    budget = await replay(with_processor(HarnessConfig(), "budget", max_tool_calls=2), records)
    assert budget == ("changed", "step 3 before_tool: the candidate interrupts the attempt")


async def test_the_first_difference_decides() -> None:
    """A divergence before a change: once the model's input differs, later hooks are no evidence either way."""
    records = await recorded(HarnessConfig(), EVENTS)
    both = with_processor(with_processor(HarnessConfig(), "observation_trim", max_chars=100), "budget",
                          max_tool_calls=2)
    assert await replay(both, records) == ("diverged", "step 2 after_tool: the model's input changes")
    early = with_processor(with_processor(HarnessConfig(), "tool_call_corrector"), "observation_trim",
                           max_chars=100)
    assert (await replay(early, records))[0] == "changed"


async def test_a_processor_that_cannot_run_outside_an_attempt_diverges(monkeypatch: pytest.MonkeyPatch) -> None:
    """A processor failing for want of its services in the replay is no evidence: ``diverged``, naming it."""
    monkeypatch.setattr(processor_module, "_REGISTRY", dict(processor_module._REGISTRY))

    class NeedsServices(processor_module.Processor, kw_only=True, dict=True, forbid_unknown_fields=True):
        """Asks a service only a live attempt has."""

        name = "test_needs_services"
        dimension = "D6"

        async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
            """Fail as a processor without its services does."""
            raise RuntimeError("no model router in this context")
            yield event

    records = await recorded(HarnessConfig(), EVENTS)
    verdict, where = await replay(HarnessConfig().attach("after_model", NeedsServices()), records)
    assert verdict == "diverged"
    assert where.startswith("step 1 after_model: a processor could not run without its services")
    assert "no model router in this context" in where


async def test_a_processor_that_calls_a_model_is_never_run_in_a_replay() -> None:
    """A judge with its own model would call it: the replay refuses to (``diverged``) and makes no request."""
    records = await recorded(HarnessConfig(), attempt_events(["look"], ["A hall."], answer="done"))
    # Port 9 (discard) on loopback: a call would fail or hang, never answer; the verdict must not depend on it.
    judge = with_processor(HarnessConfig(), "llm_judge", model="openai:judge@http://127.0.0.1:9/v1", fail_open=False)
    verdict, where = await replay(judge, records)
    assert verdict == "diverged" and where == "llm_judge calls a model, which a replay may not"


# --- the seesaw decision, from given attempts -----------------------------------------------------------

def tries(*outcomes: tuple[str, int, int]) -> dict[str, Tries]:
    """Task -> (attempts, passes)."""
    return {task: Tries(attempts, passes) for task, attempts, passes in outcomes}


def test_a_task_lost_on_the_paired_seeds_but_passing_a_retry_does_not_regress() -> None:
    """k-aware: a solved task that fails both paired attempts yet passes on a fresh seed still holds."""
    fresh = Fresh(solved=tries(("b:a:dev:1", 2, 0), ("b:a:dev:2", 2, 1)), flips=tries(("b:a:dev:3", 2, 1)),
                  retries=tries(("b:a:dev:1", 3, 1)))
    v = seesaw(Verdict(), fresh, allow_fork=False)
    assert v.outcome == "ship" and [c.name for c in v.checks] == ["seesaw", "effect"]
    assert v.checks[0].detail == "2 solved task(s) hold (1 only on retries), 1 gained"
    [one] = [f for f in v.flips if f.task == "b:a:dev:1"]
    assert (one.before, one.after, one.attempts, one.passes) == (True, True, 5, 1)


def test_losses_on_paired_seeds_may_not_outnumber_gains() -> None:
    """Two solved tasks lost on the paired seeds (rescued only by retries) against one gain: rejected."""
    fresh = Fresh(solved=tries(("b:a:dev:1", 2, 0), ("b:a:dev:2", 2, 0)), flips=tries(("b:a:dev:3", 2, 2)),
                  retries=tries(("b:a:dev:1", 1, 1), ("b:a:dev:2", 1, 1)))
    v = seesaw(Verdict(), fresh, allow_fork=True)
    assert v.outcome == "reject" and v.first_failure == "seesaw"
    assert v.checks[0].detail == "2 solved task(s) lost on the paired seeds against 1 gained"


def test_a_fork_serves_only_clusters_that_gain_clearly_and_regress_nothing() -> None:
    """Gains in b:x and b:y, a regression in b:y: the fork takes b:x alone; without b:x, nothing forks."""
    solved = tries(("b:y:dev:1", 2, 0), ("b:z:dev:1", 2, 2))
    retries = tries(("b:y:dev:1", 4, 0))
    gains = [(f"b:{c}:dev:{i}", 2, 1) for c in ("x", "y") for i in range(2, 6)]
    v = seesaw(Verdict(), Fresh(solved=solved, flips=tries(*gains), retries=retries), allow_fork=True)
    assert v.first_failure == "seesaw" and v.outcome == "fork" and v.clusters == ("b:x",)
    only_y = [g for g in gains if g[0].startswith("b:y")]
    v = seesaw(Verdict(), Fresh(solved=solved, flips=tries(*only_y), retries=retries), allow_fork=True)
    assert v.outcome == "reject" and v.clusters == ()  # it would be a ship that regresses b:y by another name
    v = seesaw(Verdict(), Fresh(solved=solved, flips=tries(*gains), retries=retries), allow_fork=False)
    assert v.outcome == "reject" and v.clusters == ()  # the global strategy never forks


def test_a_fork_needs_a_margin_over_its_losses_in_the_cluster() -> None:
    """One more gain than loss in a cluster is noise, not a reason for a variant (``FORK_MARGIN``)."""
    solved = tries(("b:x:dev:1", 2, 0), ("b:w:dev:1", 2, 0))
    retries = tries(("b:x:dev:1", 1, 1), ("b:w:dev:1", 4, 0))
    flips = tries(*[(f"b:x:dev:{i}", 2, 1) for i in range(2, 2 + FORK_MARGIN)])  # gains - losses = margin - 1
    v = seesaw(Verdict(), Fresh(solved=solved, flips=flips, retries=retries), allow_fork=True)
    assert v.outcome == "reject"
    flips = tries(*[(f"b:x:dev:{i}", 2, 1) for i in range(2, 3 + FORK_MARGIN)])
    v = seesaw(Verdict(), Fresh(solved=solved, flips=flips, retries=retries), allow_fork=True)
    assert v.outcome == "fork" and v.clusters == ("b:x",)
